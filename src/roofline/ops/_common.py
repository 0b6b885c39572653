"""What every op shares: the optional Triton import, the dtypes its kernels take, and the checks that pick a backend
and reject bad input with an error naming the argument, before anything is launched."""

from __future__ import annotations

import functools

import torch

from roofline.ops import _eager_node
from roofline.ops._state import capturing, interpreting  # noqa: F401  (the ops import them from here)

try:  # Triton ships with CUDA builds of torch; elsewhere it is optional.
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def choose_backend(op: str, x, backend: str | None, backends: tuple[str, ...], arg: str = "x") -> str:
    """The backend to run `op` on tensor `x` with: the one asked for, checked, or triton on CUDA and torch elsewhere."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(x).__name__}")
    if backend is None:
        backend = "triton" if x.is_cuda else "torch"
    if backend not in backends:
        raise ValueError(f"{op}: backend must be one of {backends} or None, got {backend!r}")
    if backend == "triton" and triton is None:
        raise RuntimeError(f"{op}: backend='triton' needs Triton, which is not installed (pip install triton)")
    if backend in ("triton", "cuda"):
        if x.dtype not in DTYPES:
            raise TypeError(f"{op}: backend={backend!r} takes {arg} of dtype float32, float16 or bfloat16, "
                            f"got {x.dtype}")
        if not x.is_cuda and not (backend == "triton" and interpreting()):
            raise ValueError(
                f"{op}: backend={backend!r} needs {arg} on a CUDA device, got {arg} on {x.device}"
                + (" (set TRITON_INTERPRET=1 to run Triton kernels on the CPU)" if backend == "triton" else ""))
    return backend


# Rows that fit in one block go several to a program, so that a program moves as much as a long row's would.
SHORT_ROW_ELEMENTS = 4096


def rows_per_program(rows: int, n: int, block: int, longest_packed: int | None = None) -> int:
    """How many rows of n elements (block: the power of two holding one) a program takes: several while a row
    fits one block (and is at most `longest_packed` wide), one otherwise."""
    if n > block or (longest_packed is not None and block > longest_packed):
        return 1
    return max(1, min(SHORT_ROW_ELEMENTS // block, next_power_of_2(rows)))


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for launch code. triton.cdiv and triton.next_power_of_2 are constexpr functions in Triton 3.6,
    which are slow to call from plain Python (on a slow host, more than a whole torch op's host time; measured:
    benchmarks/results/h100-ops.md, "Addendum 3")."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The least power of two >= n (1 for n <= 1), for launch code; see cdiv."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def sm_count(device: torch.device) -> int:
    """The device's multiprocessors, asked once per device (the query costs microseconds of host time a call)."""
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def hopper(device: torch.device) -> bool:
    """Whether device is a Hopper GPU (sm_90), where attention_sm90's Gluon kernels run."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


def resident_programs(rows: int, device: torch.device, per_sm: int = 1) -> int:
    """Programs of a persistent grid that walk `rows` rows: per_sm on each multiprocessor, so that the rows in
    flight are known (long rows read twice stay in L2 between the reads). Under the interpreter a few, so
    that the tests walk several rows a program."""
    if device.type != "cuda":
        return min(rows, 3)
    return min(rows, per_sm * sm_count(device))


if triton is not None:
    from triton.tools.tensor_descriptor import TensorDescriptor

    @triton.jit
    def as_stored(value, UPCAST: tl.constexpr):
        """fp32 values about to be stored. UPCAST (bf16 through Triton's interpreter, which converts fp32 to bf16
        by truncation, where the GPU rounds): rounded to bf16's precision, to nearest even, first, so that the
        CPU checks see the GPU's error."""
        if UPCAST:
            bits = value.to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536
            value = bits.to(tl.float32, bitcast=True)
        return value

    TRUNCATES_TO_BF16 = tl.constexpr(interpreting())

    @triton.jit
    def converted(value, dtype: tl.constexpr):
        """fp32 values in `dtype` as the GPU converts them (rounded to nearest even), under the interpreter too."""
        return as_stored(value, TRUNCATES_TO_BF16 and dtype == tl.bfloat16).to(dtype)

    # The GPU's approximate reciprocal and exp (one MUFU instruction each, subnormals flushed to zero: relative error
    # ~2^-22) where epilogue math is on the critical path; '/' and tl.exp compile to a rounded division and a
    # subnormal-safe exp2 of several instructions each. The interpreter has no libdevice: plain math there.
    FAST_MATH = tl.constexpr(not interpreting())

    if FAST_MATH:
        from triton.language.extra import libdevice

    @triton.jit
    def fast_reciprocal(x):
        if FAST_MATH:
            return libdevice.fast_dividef(1.0, x)
        return 1.0 / x

    @triton.jit
    def fast_exp(x):
        if FAST_MATH:
            return libdevice.fast_expf(x)
        return tl.exp(x)


TMA_ALIGN = 16   # bytes: a copy-engine (TMA) descriptor's base and strides must be multiples of it


def tma_readable(t: torch.Tensor) -> bool:
    """Whether the copy engine can read t as it is: a contiguous last dimension, and the base and the stride of
    every other dimension longer than 1 multiples of 16 bytes."""
    size = t.element_size()
    return (t.stride(-1) == 1 and t.data_ptr() % TMA_ALIGN == 0
            and all(s * size % TMA_ALIGN == 0 for s, n in zip(t.stride()[:-1], t.shape[:-1]) if n > 1))


def tma_descriptor(t: torch.Tensor, block_shape: list[int], shape=None, strides=None, layout=None):
    """A descriptor of t (tma_readable) for the copy engine, copying blocks of block_shape; of t's memory seen
    as `shape` with `strides` where given (a [B, T, K] activation as the [B * T, K] matrix it is). A size-1
    dimension's stride is never used: it is given one that is aligned. With a shared-memory `layout`, a Gluon
    kernel's descriptor (whose type holds the layout its blocks land in)."""
    shape = list(t.shape if shape is None else shape)
    strides = t.stride() if strides is None else strides
    step = TMA_ALIGN // t.element_size()
    strides = [s if n > 1 else step for s, n in zip(strides[:-1], shape[:-1])] + [1]
    if layout is not None:
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor as GluonDescriptor

        return GluonDescriptor(t, shape, strides, list(block_shape), layout)
    return TensorDescriptor(t, shape, strides, list(block_shape))


def elementwise_block(element_size: int, num_warps: int = 4) -> int:
    """Elements per program of an elementwise kernel: 32 bytes per thread (two 16-byte accesses), enough bytes
    in flight per SM to cover memory latency at 4 warps a program."""
    return 32 * num_warps * (32 // element_size)


def wants_grad(*tensors) -> bool:
    """Whether autograd must record a call on these tensors (None for absent ones): grad mode on and one of
    them requiring grad."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def hand_on_later(ctx, *tensors) -> None:
    """Keep buffers the forward wrote (the loss ops' gradients, computed while the logits were on chip) that the
    backward hands on as gradients, scaled in place: autograd moves a gradient into .grad only where nothing else
    holds it, and copies it otherwise (2 GB for [8192 x 128256] bf16 logits).

    Eager, through the C++ node: saved, and let go of as its backward starts (EagerContext.hand_on). Through a
    torch.autograd.Function (no C++ node): held on ctx, not saved (a saved tensor is still referenced as the
    backward returns), which handed_on takes off. Under compile: saved, since the compiled graph keeps only saved
    tensors alive (one held on ctx was freed, and its memory reused, before the backward read it). Mark them
    non-differentiable too: held on ctx they then make no reference cycle through the graph."""
    if ctx.in_graph:
        ctx.save_for_backward(*tensors)
    elif isinstance(ctx, _eager_node.EagerContext):
        ctx.hand_on(*tensors)
    else:
        ctx.handed_on = tensors


def handed_on(ctx, op: str) -> tuple:
    """What hand_on_later kept, for an eager backward (under compile the rule reads ctx.saved_tensors); only once."""
    if isinstance(ctx, _eager_node.EagerContext):
        return ctx.saved_tensors   # (the C++ node raises for a second backward itself)
    tensors = getattr(ctx, "handed_on", None)
    if tensors is None:
        raise RuntimeError(f"{op}(backend='triton') computed its gradient during the forward pass and hands that "
                           "buffer on: a second backward through the same forward (retain_graph=True) is not "
                           "supported; use backend='torch' for that")
    del ctx.handed_on
    return tensors
