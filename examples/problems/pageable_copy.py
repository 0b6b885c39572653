"""Planted problem: every batch is copied to the GPU from pageable host memory.

A copy from pageable memory goes through a staging buffer and blocks the host until it is
done, so copies and compute cannot overlap. --fixed pins the host batches and copies them
with non_blocking=True.
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (4096, 8192) if device == "cuda" else (128, 64)
model = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
host_batches = [torch.randn(batch, width) for _ in range(4)]
if args.fixed and device == "cuda":
    host_batches = [b.pin_memory() for b in host_batches]

for step in range(args.steps):
    x = host_batches[step % len(host_batches)].to(device, non_blocking=args.fixed)   # planted: pageable-copy
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = model(x).float().square().mean()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
