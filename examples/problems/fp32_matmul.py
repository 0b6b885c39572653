"""Planted problem: fp32 matmuls with TF32 off, so the tensor cores sit unused.

On an H100, fp32 matmuls run at about 52 TFLOP/s, TF32 ones at about 360. --fixed allows TF32
(10 mantissa bits in the products, fp32 accumulation), which suits training.
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=10)
args = p.parse_args()

torch.backends.cuda.matmul.allow_tf32 = args.fixed
device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (4096, 8192) if device == "cuda" else (128, 64)
model = nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(), nn.Linear(4 * width, width)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(batch, width, device=device)

for _ in range(args.steps):
    loss = model(x).square().mean()   # planted: fp32-matmul-no-tf32
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
