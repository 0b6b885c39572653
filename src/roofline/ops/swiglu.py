"""SwiGLU's gate: reference, Triton kernels (forward and backward), registration and autograd, entry point.

    swiglu(gate, up) = silu(gate) * up = gate * sigmoid(gate) * up

The elementwise heart of the LLaMA-style MLP, down(swiglu(x @ W_gate, x @ W_up)). Memory-bound: read gate and
up once, write the product once (backward: read gate, up and dy, write both gradients). In eager PyTorch it
is two kernels and an intermediate tensor.

gate and up are often the two halves of one fused projection, `x @ W_gate_up` chunked along the last
dimension: views whose rows are strided. The kernels take a row stride for each input, so such views are
read in place; only views whose last dimension is itself strided are copied first.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roofline.ops._common import cdiv, choose_backend, elementwise_block, tl, triton
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp, torch_route

BACKENDS = ("torch", "triton", "compile")


# --------------------------------------------------------------------------- reference

def swiglu_reference(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _offsets(n, BLOCK: tl.constexpr):
        """The program's row and the column offsets it covers: programs walk each row in blocks of BLOCK."""
        blocks_per_row = tl.cdiv(n, BLOCK)
        pid = tl.program_id(0)
        row = (pid // blocks_per_row).to(tl.int64)
        cols = (pid % blocks_per_row) * BLOCK + tl.arange(0, BLOCK)
        return row, cols, cols < n

    @triton.jit
    def swiglu_forward_kernel(gate_ptr, up_ptr, y_ptr, n, gate_stride, up_stride, BLOCK: tl.constexpr):
        row, cols, mask = _offsets(n, BLOCK)
        a = tl.load(gate_ptr + row * gate_stride + cols, mask=mask).to(tl.float32)
        b = tl.load(up_ptr + row * up_stride + cols, mask=mask).to(tl.float32)
        y = a * tl.sigmoid(a) * b
        tl.store(y_ptr + row * n + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def swiglu_backward_kernel(gate_ptr, up_ptr, dy_ptr, dgate_ptr, dup_ptr, n, gate_stride, up_stride,
                               BLOCK: tl.constexpr):
        """d gate = dy * up * sigmoid(a) * (1 + a * (1 - sigmoid(a))),  d up = dy * silu(a)."""
        row, cols, mask = _offsets(n, BLOCK)
        a = tl.load(gate_ptr + row * gate_stride + cols, mask=mask).to(tl.float32)
        b = tl.load(up_ptr + row * up_stride + cols, mask=mask).to(tl.float32)
        g = tl.load(dy_ptr + row * n + cols, mask=mask).to(tl.float32)
        s = tl.sigmoid(a)
        silu = a * s
        tl.store(dgate_ptr + row * n + cols, (g * b * (s + silu * (1.0 - s))).to(dgate_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(dup_ptr + row * n + cols, (g * silu).to(dup_ptr.dtype.element_ty), mask=mask)


class SwigluPlan:
    """The launches for gate and up of one dtype on one device that are rows of n elements, gate_stride and
    up_stride apart (a contiguous last dimension). They may have any shape that describes that layout: the
    outputs take gate's shape, contiguous."""

    def __init__(self, rows: int, n: int, gate_stride: int, up_stride: int, element_size: int,
                 device: torch.device):
        self.rows, self.n, self.strides = rows, n, (gate_stride, up_stride)
        block = elementwise_block(element_size)
        grid = (rows * cdiv(n, block),)
        index = device.index if device.type == "cuda" else -1
        self.forward_launch = Launch(swiglu_forward_kernel, grid, index, BLOCK=block, num_warps=4)
        self.backward_launch = Launch(swiglu_backward_kernel, grid, index, BLOCK=block, num_warps=4)

    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(gate, memory_format=torch.contiguous_format)
        self.forward_launch.for_pointers(gate.data_ptr() | up.data_ptr())(gate, up, y, self.n, *self.strides)
        return y

    def backward(self, gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dgate = torch.empty_like(gate, memory_format=torch.contiguous_format)
        dup = torch.empty_like(gate, memory_format=torch.contiguous_format)
        self.backward_launch.for_pointers(gate.data_ptr() | up.data_ptr() | dy.data_ptr())(
            gate, up, dy, dgate, dup, self.n, *self.strides)
        return dgate, dup


@plan_cache("swiglu", key=lambda gate, up: (*gate.shape, gate.stride(0), up.stride(0), gate.dtype, gate.device))
def _plan(gate: torch.Tensor, up: torch.Tensor) -> SwigluPlan:
    """The plan for (rows, n) gate and up with contiguous last dimensions (views of the tensors a call gets)."""
    return SwigluPlan(*gate.shape, gate.stride(0), up.stride(0), gate.element_size(), gate.device)


# The registered ops take (rows, n) tensors whose last dimension is contiguous; their outputs are contiguous.

def _forward(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    gate, up = _as_rows(gate), _as_rows(up)   # a no-op unless a compiler handed over another layout
    return _plan(gate, up).forward(gate, up)


def _backward(gate: torch.Tensor, up: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gate, up = _as_rows(gate), _as_rows(up)
    return _plan(gate, up).backward(gate, up, dy)


def _save_inputs(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _backward_rule(ctx, run_backward, dy):
    gate, up = ctx.saved_tensors
    return run_backward(gate, up, dy)


_swiglu_rows = KernelOp(
    "swiglu_rows", forward=_forward, forward_fake=lambda gate, up: gate.new_empty(gate.shape),
    backward=_backward, backward_fake=lambda gate, up, dy: (gate.new_empty(gate.shape), gate.new_empty(gate.shape)),
    setup_context=_save_inputs, backward_rule=_backward_rule, plan=_plan, public_name=lambda args: "swiglu",
    signature=lambda gate, up, backend: (type(gate), tensor_key(gate), type(up), tensor_key(up), backend))


def _as_rows(t: torch.Tensor) -> torch.Tensor:
    """t as (rows, n) with a contiguous last dimension, without a copy where a view can do it."""
    if t.dim() == 0:
        t = t.reshape(1)
    if t.stride(-1) != 1:
        t = t.contiguous()
    try:
        return t.view(-1, t.shape[-1])
    except RuntimeError:   # leading dimensions that no single row stride describes
        return t.contiguous().view(-1, t.shape[-1])


# --------------------------------------------------------------------------- entry point

@replayed_entry
def swiglu(gate: torch.Tensor, up: torch.Tensor, *, backend: str | None = None) -> torch.Tensor:
    """silu(gate) * up, fused. gate and up must match in shape, dtype and device.

    backend: "triton" (the default on CUDA), "torch" (F.silu(gate) * up; the default on CPU), "compile".
    The result is contiguous, with gate's shape and dtype; the math runs in fp32.
    """
    key, plan = _swiglu_rows.seen(gate, up, backend)
    if plan is not None:
        return _run(plan, gate, up)
    backend = choose_backend("swiglu", gate, backend, BACKENDS, arg="gate")
    if not isinstance(up, torch.Tensor):
        raise TypeError(f"swiglu: up must be a torch.Tensor, got {type(up).__name__}")
    if up.shape != gate.shape or up.dtype != gate.dtype or up.device != gate.device:
        raise ValueError(f"swiglu: up must match gate in shape, dtype and device: gate is {list(gate.shape)} "
                         f"{gate.dtype} on {gate.device}, up {list(up.shape)} {up.dtype} on {up.device}")
    done = torch_route(backend, swiglu_reference, gate, up, nothing_to_launch=gate.numel() == 0)
    if done is not None:
        return done
    gate_rows, up_rows = _as_rows(gate), _as_rows(up)
    if torch.compiler.is_compiling():
        return _swiglu_rows(gate_rows, up_rows).view(gate.shape)
    plan = _plan(gate_rows, up_rows)
    if gate_rows.data_ptr() != gate.data_ptr() or up_rows.data_ptr() != up.data_ptr():   # copied
        return _run(plan, gate_rows, up_rows).view(gate.shape)
    # the inputs are rows as they are: the plan takes them so, and a later call with this signature too
    _swiglu_rows.keep(key, plan)
    return _run(plan, gate, up)


def _run(plan: SwigluPlan, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    grad = torch.is_grad_enabled() and (gate.requires_grad or up.requires_grad)
    return _swiglu_rows.eager(plan, grad, gate, up)
