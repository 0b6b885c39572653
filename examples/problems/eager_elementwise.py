"""Planted problem: a tanh-GeLU and a residual written out in eager mode.

Each of the nine elementwise operations below is its own kernel, reading and writing the
whole tensor, where one pass would do. --fixed compiles the same function with torch.compile,
which fuses the chain into one kernel.
"""

import argparse
import math

import torch

from roofline.profiler import step as mark_step   # marks an iteration for `roofline profile --skip`; no-op otherwise

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()


def gelu_residual(x, bias, residual):
    h = x + bias   # planted: eager-elementwise-chain
    inner = math.sqrt(2 / math.pi) * (h + 0.044715 * h * h * h)
    return residual + 0.5 * h * (1 + torch.tanh(inner))


device = "cuda" if torch.cuda.is_available() else "cpu"
rows, cols = (16384, 8192) if device == "cuda" else (64, 256)
x = torch.randn(rows, cols, device=device)
bias = torch.randn(cols, device=device)
residual = torch.randn(rows, cols, device=device)
fn = torch.compile(gelu_residual) if args.fixed else gelu_residual

for _ in range(args.steps):
    out = fn(x, bias, residual)
    mark_step()
print(f"checksum {out.float().mean().item():.4f}")
