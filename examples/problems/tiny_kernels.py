"""Planted problem: a deep, narrow network whose kernels are too small to keep the GPU busy.

Every layer launches a handful of microsecond kernels forward and backward; the host cannot
issue them as fast as the GPU finishes them, so the GPU waits on launches. --fixed captures
the whole training step (forward, backward, optimizer) once as a CUDA graph and replays it:
one launch per step.
"""

import argparse

import torch
from torch import nn

from roofline.profiler import step as mark_step   # marks an iteration for `roofline profile --skip`; no-op otherwise

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


def train_step():
    optimizer.zero_grad(set_to_none=True)
    loss = model(x).square().mean()   # planted: launch-bound
    loss.backward()
    optimizer.step()
    return loss


step, warmup = train_step, 0
if args.fixed and device == "cuda":
    # A capture needs a few eager steps first, on a side stream (the optimizer's state, cuBLAS workspaces).
    warmup = 3
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(warmup):
            train_step()
            if i < warmup - 1:
                mark_step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # gradients stay allocated in the graph's pool; each replay overwrites them
        static_loss = train_step()
    mark_step()                       # the last warm-up step ends with the capture

    def step():
        graph.replay()
        return static_loss

for _ in range(args.steps - warmup):
    loss = step()
    mark_step()
print(f"loss {loss.item():.4f}")
