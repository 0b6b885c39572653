"""What every op shares: the optional Triton import, the dtypes its kernels take, and the checks that pick a backend
and reject bad input with an error naming the argument, before anything is launched."""

from __future__ import annotations

import os

import torch

try:  # Triton ships with CUDA builds of torch; elsewhere it is optional.
    import triton
    import triton.language as tl
except ImportError:
    triton = tl = None

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def interpreting() -> bool:
    """Whether Triton kernels run through its CPU interpreter (how the tests check them without a GPU)."""
    return os.environ.get("TRITON_INTERPRET") == "1"


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
        on_cpu_ok = backend == "triton" and interpreting()
        if not x.is_cuda and not on_cpu_ok:
            raise ValueError(
                f"{op}: backend={backend!r} needs {arg} on a CUDA device, got {arg} on {x.device}"
                + (" (set TRITON_INTERPRET=1 to run Triton kernels on the CPU)" if backend == "triton" else ""))
    return backend


def elementwise_block(element_size: int, num_warps: int = 4) -> int:
    """Elements per program of an elementwise kernel: 32 bytes per thread (two 16-byte accesses), enough bytes
    in flight per SM to cover memory latency at 4 warps a program."""
    return 32 * num_warps * (32 // element_size)
