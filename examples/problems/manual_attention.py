"""Planted problem: attention written as matmul, softmax, matmul.

The [seq x seq] score matrix is written to memory and read back three times, and the
softmax runs as its own kernel. --fixed calls F.scaled_dot_product_attention, which picks a
flash kernel that keeps the scores on chip.
"""

import argparse
import math

import torch
import torch.nn.functional as F

from roofline.profiler import step as mark_step   # marks an iteration for `roofline profile --skip`; no-op otherwise

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=10)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.bfloat16 if device == "cuda" else torch.float32
batch, heads, seq, dim = (8, 16, 2048, 64) if device == "cuda" else (1, 2, 64, 16)
q, k, v = (torch.randn(batch, heads, seq, dim, device=device, dtype=dtype, requires_grad=True) for _ in range(3))


def attention(q, k, v):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    return torch.softmax(scores, dim=-1) @ v   # planted: manual-attention


for _ in range(args.steps):
    out = F.scaled_dot_product_attention(q, k, v) if args.fixed else attention(q, k, v)
    out.sum().backward()
    mark_step()
print(f"checksum {out.float().mean().item():.4f}")
