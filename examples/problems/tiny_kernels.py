"""Planted problem: a deep, narrow network whose kernels are too small to keep the GPU busy.

Every layer launches a handful of microsecond kernels forward and backward; the host cannot
issue them as fast as the GPU finishes them, so the GPU waits on launches. --fixed captures
the forward and backward passes once as CUDA graphs and replays them (one launch per pass).
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

torch.backends.cuda.matmul.allow_tf32 = True
device = "cuda" if torch.cuda.is_available() else "cpu"
width, depth, batch = 64, 48, 32
layers = []
for _ in range(depth):
    layers += [nn.Linear(width, width), nn.LayerNorm(width), nn.SiLU()]
model = nn.Sequential(*layers).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, foreach=True)
x = torch.randn(batch, width, device=device)
if args.fixed and device == "cuda":
    model = torch.cuda.make_graphed_callables(model, (x,))

for _ in range(args.steps):
    loss = model(x).square().mean()   # planted: launch-bound
    optimizer.zero_grad(set_to_none=False)
    loss.backward()
    optimizer.step()
print(f"loss {loss.item():.4f}")
