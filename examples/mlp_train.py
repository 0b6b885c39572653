"""A small MLP training loop: stacked Linear + GeLU layers, forward, backward and an optimizer step.

The program GPU courses profile first. Run it plain, or under roofline:
    python examples/mlp_train.py
    roofline profile examples/mlp_train.py --steps 20
On a GPU it trains in bf16 autocast by default; on a CPU it picks sizes that finish in seconds.
"""

import argparse

import torch
from torch import nn


def build(width: int, depth: int) -> nn.Sequential:
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(width, width))


def main(argv=None):
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8192 if gpu else 256)
    p.add_argument("--width", type=int, default=2048 if gpu else 256)
    p.add_argument("--depth", type=int, default=4)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16" if gpu else "fp32",
                   help="bf16: matmuls under torch.autocast; fp32: everything in fp32")
    args = p.parse_args(argv)

    device = "cuda" if gpu else "cpu"
    torch.manual_seed(0)
    model = build(args.width, args.depth).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch, args.width, device=device)
    target = torch.randn(args.batch, args.width, device=device)
    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")

    for _ in range(args.steps):
        with autocast:
            loss = nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"final loss {loss.item():.4f} after {args.steps} steps")


if __name__ == "__main__":
    main()
