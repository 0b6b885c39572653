"""Train the GPT-2-small or Llama-style model of examples/models on random tokens, as a user's script does.

    python examples/train_lm.py --model gpt2 --steps 20
    roofline profile --skip 3 --steps 5 examples/train_lm.py --model gpt2 --steps 20
    python examples/train_lm.py --model llama --patch      # roofline.patch: fused norms, SwiGLU, RoPE where they win

bf16 autocast, fused AdamW, SDPA attention (the models' own): the configuration the profiler should find
little wrong with, so that what it says is about the program and not about planted mistakes. On a CPU it
trains a two-layer model of the same code in seconds.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from examples.models.llama import Llama, LlamaConfig  # noqa: E402

MODELS = {
    "gpt2": (GPT2, GPT2Config, dict(vocab_size=96, max_seq=64, n_layer=2, n_head=2, d_model=32)),
    "llama": (Llama, LlamaConfig, dict(vocab_size=96, max_seq=64, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                                       intermediate_size=96)),
}


def main(argv=None):
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8 if gpu else 2)
    p.add_argument("--seq", type=int, default=1024 if gpu else 16)
    p.add_argument("--patch", action="store_true", help="swap in roofline's fused ops where they are faster")
    args = p.parse_args(argv)

    device = "cuda" if gpu else "cpu"
    cls, config, tiny = MODELS[args.model]
    torch.manual_seed(0)
    with torch.device(device):
        model = cls(config() if gpu else config(**tiny))
    if args.patch:
        import roofline

        roofline.patch(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=gpu)
    vocab = model.config.vocab_size
    idx, targets = (torch.randint(0, vocab, (args.batch, args.seq), device=device) for _ in range(2))

    for _ in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
            _, loss = model(idx, targets=targets)
        loss.backward()
        optimizer.step()
    print(f"{args.model}: loss {loss.item():.4f} after {args.steps} steps")


if __name__ == "__main__":
    main()
