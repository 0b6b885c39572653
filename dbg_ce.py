import torch
from roofline.ops import cross_entropy
from roofline.ops.cross_entropy import cross_entropy_reference
torch.manual_seed(0)
logits = torch.randn(6, 50, device="cuda"); t = torch.randint(0, 50, (6,), device="cuda")
for backend in ("eager", "aot_eager", "inductor"):
    for red in ("mean", "none"):
        x = logits.clone().requires_grad_(); y = logits.clone().requires_grad_()
        f = torch.compile(lambda x, t: cross_entropy(x, t, backend="triton", reduction=red), fullgraph=True, backend=backend)
        (f(x, t) * 2).sum().backward(); (cross_entropy_reference(y, t, reduction=red) * 2).sum().backward()
        print(backend, red, "max grad err", (x.grad - y.grad).abs().max().item(), flush=True)
