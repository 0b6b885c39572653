"""Planted problem: `loss.item()` in the training loop makes the host wait for the GPU every step.

While the host waits, it queues no work, so the GPU idles at the start of every step.
--fixed keeps the losses on the GPU and reads them once, after the loop.
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
width, batch = (1024, 2048) if device == "cuda" else (128, 64)
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
data = torch.randn(args.steps, batch, width, device=device)
labels = torch.randint(0, 10, (args.steps, batch), device=device)

losses = []
for x, y in zip(data, labels):
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if args.fixed:
        losses.append(loss.detach())
    else:
        losses.append(loss.item())   # the planted sync
mean = torch.stack(losses).mean().item() if args.fixed else sum(losses) / len(losses)
print(f"mean loss {mean:.4f}")
