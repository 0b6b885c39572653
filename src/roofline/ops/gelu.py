"""GeLU: reference, Triton kernels, registration and autograd, CUDA C++ kernel, functional entry point.

    gelu(x)             = x * Phi(x)                          (approximate="none", erf)
    gelu(x, "tanh")     = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))

Elementwise and memory-bound: one read of x and one write of y is the whole
cost, so a kernel is as good as the bandwidth it reaches. The math runs in fp32
whatever the storage dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from roofline.ops._common import cdiv, choose_backend, elementwise_block, fast_exp, fast_reciprocal, tl, triton
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache
from roofline.ops._runtime import KernelOp, torch_route

APPROXIMATIONS = ("none", "tanh")
BACKENDS = ("torch", "triton", "compile", "cuda")
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# --------------------------------------------------------------------------- reference

def gelu_reference(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """Torch's own GeLU: the reference the kernels are checked against."""
    return F.gelu(x, approximate=approximate)


def gelu_tanh_by_hand(x: torch.Tensor) -> torch.Tensor:
    """The tanh formula written out in eager PyTorch: eight kernels, each a full pass over memory.

    This is the classic example of what fusion fixes; it is kept as a provider in the benchmark.
    """
    return 0.5 * x * (1.0 + torch.tanh(SQRT_2_OVER_PI * (x + 0.044715 * torch.pow(x, 3))))


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _normal_cdf(x):
        """Phi(x) = erfc(-x / sqrt(2)) / 2 for fp32 x, from the Chebyshev fit of erfc in Numerical Recipes (Press et
        al., 2nd ed., erfcc: fractional error below 1.2e-7 at every argument). About 20 instructions where
        libdevice's erf takes about 35, which counts in a GEMM's epilogue (an erf per output element, on the warps
        that drive the tensor cores); and accurate in the negative tail, where torch's 1 + erf(x / sqrt(2))
        cancels to nothing below about x = -5."""
        z = tl.abs(x) * 0.7071067811865476
        t = fast_reciprocal(1.0 + 0.5 * z)
        p = -0.82215223 + t * 0.17087277
        p = 1.48851587 + t * p
        p = -1.13520398 + t * p
        p = 0.27886807 + t * p
        p = -0.18628806 + t * p
        p = 0.09678418 + t * p
        p = 0.37409196 + t * p
        p = 1.00002368 + t * p
        p = -1.26551223 + t * p
        half_erfc = 0.5 * t * fast_exp(p - z * z)   # erfc(|x| / sqrt(2)) / 2 = Phi(-|x|)
        return tl.where(x >= 0, 1.0 - half_erfc, half_erfc)

    @triton.jit
    def _gelu_and_grad(x, APPROX_TANH: tl.constexpr):
        """GeLU of fp32 x and its derivative."""
        if APPROX_TANH:
            inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
            # tanh(v) = 2 sigmoid(2v) - 1, written with exp so it is exact at both infinities.
            s = fast_reciprocal(1.0 + fast_exp(-2.0 * inner))
            t = 2.0 * s - 1.0
            y = x * s
            dy = s + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x)
        else:
            cdf = _normal_cdf(x)
            y = x * cdf
            dy = cdf + x * 0.3989422804014327 * tl.exp(-0.5 * x * x)  # x * pdf(x)
        return y, dy

    @triton.jit
    def gelu_forward_kernel(x_ptr, y_ptr, n, APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
        y, _ = _gelu_and_grad(x, APPROX_TANH)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def gelu_backward_kernel(dy_ptr, x_ptr, dx_ptr, n, APPROX_TANH: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
        g = tl.load(dy_ptr + offsets, mask=mask).to(tl.float32)
        _, d = _gelu_and_grad(x, APPROX_TANH)
        tl.store(dx_ptr + offsets, (g * d).to(dx_ptr.dtype.element_ty), mask=mask)


class GeluPlan:
    """The launches for n contiguous elements of one dtype on one device, erf or tanh."""

    def __init__(self, n: int, element_size: int, approximate: str, device: torch.device):
        self.n = n
        block = elementwise_block(element_size)
        index = device.index if device.type == "cuda" else -1
        settings = dict(APPROX_TANH=approximate == "tanh", BLOCK=block, num_warps=4)
        self.forward_launch = Launch(gelu_forward_kernel, (cdiv(n, block),), index, **settings)
        self.backward_launch = Launch(gelu_backward_kernel, (cdiv(n, block),), index, **settings)

    def forward(self, x: torch.Tensor, approximate: str) -> torch.Tensor:
        y = torch.empty_like(x)
        self.forward_launch.for_pointers(x.data_ptr())(x, y, self.n)
        return y

    def backward(self, dy: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dx = torch.empty_like(x)
        self.backward_launch.for_pointers(dy.data_ptr() | x.data_ptr())(dy, x, dx, self.n)
        return dx


@plan_cache("gelu", key=lambda x, approximate: (x.numel(), x.dtype, x.device, approximate))
def _plan(x: torch.Tensor, approximate: str) -> GeluPlan:
    return GeluPlan(x.numel(), x.element_size(), approximate, x.device)


def _forward(x: torch.Tensor, approximate: str) -> torch.Tensor:
    return _plan(x, approximate).forward(x, approximate)


def _backward(dy: torch.Tensor, x: torch.Tensor, approximate: str) -> torch.Tensor:
    return _plan(x, approximate).backward(dy, x, approximate)


def _save_input(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.approximate = inputs[1]


def _backward_rule(ctx, run_backward, dy):
    (x,) = ctx.saved_tensors
    return run_backward(dy, x, ctx.approximate), None


_gelu = KernelOp("gelu", forward=_forward, forward_fake=lambda x, approximate: torch.empty_like(x),
                 backward=_backward, backward_fake=lambda dy, x, approximate: torch.empty_like(x),
                 setup_context=_save_input, backward_rule=_backward_rule, plan=_plan,
                 signature=lambda x, approximate, backend: (type(x), x.shape, x.stride(), x.dtype, x.device,
                                                            approximate, backend))


# --------------------------------------------------------------------------- CUDA C++

def _cuda_gelu(x: torch.Tensor, approximate: str) -> torch.Tensor:
    from roofline.ops import cuda

    cuda.refuse_gradients("gelu", x)
    return cuda.load("gelu", ("gelu_forward",)).gelu_forward(x, approximate == "tanh")


# --------------------------------------------------------------------------- functional entry point

def _check(x, approximate: str, backend: str | None) -> str:
    backend = choose_backend("gelu", x, backend, BACKENDS)
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"gelu: approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    return backend


@replayed_entry
def gelu(x: torch.Tensor, approximate: str = "none", *, backend: str | None = None) -> torch.Tensor:
    """GeLU with the signature of torch.nn.functional.gelu.

    backend: "triton" (the default on CUDA), "torch" (eager PyTorch; the default on CPU),
    "compile" (torch.compile of F.gelu) or "cuda" (CUDA C++, forward only).
    Non-contiguous inputs are made contiguous once before a kernel runs.
    """
    key, plan = _gelu.seen(x, approximate, backend)
    if plan is not None:
        return _gelu.eager(plan, x.requires_grad and torch.is_grad_enabled(), x, approximate)
    backend = _check(x, approximate, backend)
    done = torch_route(backend, gelu_reference, x, approximate, nothing_to_launch=x.numel() == 0)
    if done is not None:
        return done
    given, x = x, x.contiguous()
    if backend == "cuda":
        return _cuda_gelu(x, approximate)
    return _gelu.call(key, x is given, x.requires_grad and torch.is_grad_enabled(), x, approximate)
