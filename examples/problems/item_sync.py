"""Planted problem: `loss.item()` in the training loop makes the host wait for the GPU every step.

While the host waits, it queues no work, so the GPU idles at the start of every step.
--fixed adds the losses up on the GPU and reads the sum once, after the loop.
"""

import argparse

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--fixed", action="store_true")
p.add_argument("--steps", type=int, default=30)
args = p.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
# A batch large enough that the GPU, not the host, sets the pace (also under the profiler, which slows the
# host): then the queue the host built up drains at every sync, and the GPU waits for the next step's launches.
width, batch, classes = (4096, 16384, 1024) if device == "cuda" else (128, 64, 16)
model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                      nn.Linear(width, classes)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
data = torch.randn(4, batch, width, device=device, dtype=torch.bfloat16)
labels = torch.randint(0, classes, (4, batch), device=device)

losses, total = [], torch.zeros((), device=device)
for step in range(args.steps):
    x, y = data[step % 4], labels[step % 4]
    with torch.autocast(device, dtype=torch.bfloat16):
        loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    if args.fixed:
        total += loss.detach()       # stays on the GPU, queued like the rest
    else:
        losses.append(loss.item())   # planted: host-sync-in-loop
mean = total.item() / args.steps if args.fixed else sum(losses) / len(losses)
print(f"mean loss {mean:.4f}")
