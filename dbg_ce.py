import torch
from roofline.ops import cross_entropy
from roofline.ops.cross_entropy import cross_entropy_reference
torch.manual_seed(0)
logits = torch.randn(6, 50, device="cuda"); t = torch.randint(0, 50, (6,), device="cuda")
x = logits.clone().requires_grad_(); (cross_entropy_reference(x * 2, t) * 2).backward(); ref = x.grad
for backend in ("eager", "aot_eager"):
    for mult in (1.0, 2.0):
        f = torch.compile(lambda x, t: cross_entropy(x * 2, t, backend="triton") * mult, fullgraph=True, backend=backend)
        x = logits.clone().requires_grad_()
        f(x, t).backward()
        print(backend, mult, "grad/ref(x2) first:", (x.grad / ref).flatten()[:3].tolist(), flush=True)
