"""Does torch's cuDNN attention give right gradients after an earlier backward with another gradient layout?

torch 2.11 caches cuDNN attention's backward graph under q's, k's and v's shapes and strides only
(aten/src/ATen/native/cudnn/MHA.cpp, MHACacheKeyWrapper), while the graph is built for the gradient's strides too.
A program whose gradient arrives laid out as the output (y.transpose(1, 2).reshape(...) after attention, as model
code writes it) gets the graph built for whatever gradient came first with the same q, k, v layouts. patch's
router once measured with a contiguous gradient and so broke the gradients of the model it measured; it now
measures with the gradient layouts the program's own backward showed (roofline/routing.py).

Each case runs in a fresh process (the cache lives as long as the process): the program's call alone, after a
call with a contiguous gradient, and after one with a gradient laid out as the output. It prints the program's
dq, dk and dv errors against float64.  python benchmarks/sdpa_gradient_layout.py   (a CUDA GPU with cuDNN)
"""
import subprocess
import sys

import torch
import torch.nn.functional as F


def case(first: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    torch.manual_seed(0)
    B, T, H, KV, D = 4, 128, 8, 2, 64
    q, k, v = (torch.randn(B, T, h, D, device="cuda", dtype=torch.bfloat16).transpose(1, 2).requires_grad_()
               for h in (H, KV, KV))
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        if first != "none":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
            dy = torch.randn_like(y) if first == "like" else torch.randn(y.shape, device="cuda", dtype=y.dtype)
            torch.autograd.grad(y, (q, k, v), dy)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        dy = torch.randn(B, T, H, D, device="cuda", dtype=y.dtype).transpose(1, 2)   # as .transpose(1,2).reshape gives it
        grads = torch.autograd.grad(y, (q, k, v), dy)
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    ye = F.scaled_dot_product_attention(*exact, is_causal=True, enable_gqa=True)
    want = torch.autograd.grad(ye, exact, dy.double())
    errors = [round(((g.double() - w).norm() / w.norm()).item(), 4) for g, w in zip(grads, want)]
    print(f"first call's dO {first:>10}: program's dq, dk, dv relative errors {errors}; y strides {tuple(y.stride())}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        case(sys.argv[1])
    else:
        print(torch.__version__, "cuDNN", torch.backends.cudnn.version(), torch.cuda.get_device_name())
        for first in ("none", "contiguous", "like"):
            subprocess.run([sys.executable, __file__, first], check=True)
