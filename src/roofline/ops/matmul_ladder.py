"""The matmul ladder: a @ b in CUDA C++, five steps from naive to vectorized, for reading and measuring.

    matmul_ladder(a, b, step)     a [M, K] @ b [K, N], fp32, on the CUDA cores (no tensor cores, no tf32)

Each step is one idea (the kernels and the why of each are in ops/cuda/matmul_ladder.cu):

    naive            a thread per output, a warp along a column of C: uncoalesced loads of A
    coalesced        a warp along a row of C: the same math, loads in whole cache lines
    shared_memory    32x32 tiles staged in shared memory: each load from L2 serves 32 multiply-adds
    register_tiled   a thread computes an 8x8 block of C from registers: 16 shared-memory reads per 64 FMAs
    vectorized       the same with 16-byte accesses: float4 loads from memory and from shared memory

`benchmarks/linear_suite.py --only ladder` times the five against cuBLAS's fp32 matmul (torch.mm with tf32
off) and reports TFLOP/s and the fraction of cuBLAS each reaches. The kernels are for learning what each step
buys, not for use: linear() is the fast GEMM.
"""

from __future__ import annotations

import torch

STEPS = ("naive", "coalesced", "shared_memory", "register_tiled", "vectorized")
# The kernels index with 32-bit ints, and put row or column blocks of 32 on the grid's y axis (65535 at most).
MAX_ELEMENTS = 2**31 - 1
MAX_ROWS_OR_COLUMNS = 65535 * 32


def _check(a, b, step, out) -> None:
    if step not in STEPS:
        raise ValueError(f"matmul_ladder: step must be one of {STEPS}, got {step!r}")
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul_ladder: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"matmul_ladder: {name} must be 2-D, got shape {list(t.shape)}")
        if t.dtype != torch.float32:
            raise TypeError(f"matmul_ladder: {name} must be float32 (the ladder runs on the fp32 CUDA cores), "
                            f"got {t.dtype}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul_ladder: a's columns ({a.shape[1]}) must equal b's rows ({b.shape[0]})")
    m, n = a.shape[0], b.shape[1]
    if max(a.numel(), b.numel(), m * n) > MAX_ELEMENTS or max(m, n) > MAX_ROWS_OR_COLUMNS:
        raise ValueError(f"matmul_ladder: the teaching kernels take fewer than 2^31 elements per operand and at "
                         f"most {MAX_ROWS_OR_COLUMNS} rows or columns; got a {list(a.shape)}, b {list(b.shape)}")
    if out is not None:
        if not isinstance(out, torch.Tensor) or out.shape != (m, n) or out.dtype != torch.float32 \
                or out.device != a.device or not out.is_contiguous():
            raise ValueError(f"matmul_ladder: out must be a contiguous float32 tensor of shape [{m}, {n}] on "
                             f"{a.device}")
    for name, t in (("a", a), ("b", b)):
        if not t.is_cuda:
            raise ValueError(f"matmul_ladder: {name} must be on a CUDA device, got {t.device}")
    if b.device != a.device:
        raise ValueError(f"matmul_ladder: b is on {b.device} but a is on {a.device}")


def matmul_ladder(a: torch.Tensor, b: torch.Tensor, step: str = "register_tiled", *,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b for fp32 CUDA tensors a [M, K] and b [K, N] with the ladder's kernel `step` (one of STEPS), into
    out (a new tensor if None). Forward only: the ladder is for reading and timing."""
    _check(a, b, step, out)
    if (a.requires_grad or b.requires_grad) and torch.is_grad_enabled():
        raise NotImplementedError("matmul_ladder has no backward (it is a teaching ladder); use linear()")
    from roofline.ops import cuda

    out = a.new_empty(a.shape[0], b.shape[1]) if out is None else out
    module = cuda.load("matmul_ladder", ("matmul_ladder",))
    return module.matmul_ladder(a.contiguous(), b.contiguous(), out, STEPS.index(step) + 1)
