"""softmax and log_softmax over one dimension: reference, Triton kernels (forward and backward), autograd, entry points.

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),      m = max_j x_j
    log_softmax(x)_i = x_i - m - log(sum_j exp(x_j - m))

Memory-bound: the least traffic is one read of x and one write of y (backward: read y and
dy, write dx). A row that fits in one block (up to MAX_BLOCK elements) is held in registers
and read once, forward and backward; short rows go several to a program. A longer row is
read twice: a first pass keeps a running max and a running sum rescaled whenever the max
grows (the online softmax), a second pass writes the output; no block size spills
registers, so there is no cliff at long rows.
The math runs in fp32 whatever the storage dtype.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from roofline.ops._common import KernelOp, choose_backend, rows_per_program, tl, triton

BACKENDS = ("torch", "triton", "compile", "cuda")
MAX_BLOCK = 16384             # elements per block: 64 KB of fp32 per row, 32 per thread at 16 warps


# --------------------------------------------------------------------------- reference

def softmax_by_hand(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax written out in eager PyTorch (max, subtract, exp, sum, divide): a pass over memory per step."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _online_update(m, s, x):
        """One step of the per-lane online softmax: the running max m and sum s of exp(. - m), updated with x.

        One exp per element: e = exp(min(x, m) - max(x, m)); if x raised the max, s = s e + 1 (rescaled to
        the new max), else s = s + e. m starts at -FLT_MAX, not -inf, so that no -inf - -inf arises: an x of
        -inf adds exp(-inf) = 0 and needs no check. nan must reach s: the GPU's default max and min drop a nan
        operand."""
        m_new = tl.maximum(m, x, propagate_nan=tl.PropagateNan.ALL)
        e = tl.exp(tl.minimum(m, x, propagate_nan=tl.PropagateNan.ALL) - m_new)
        return m_new, tl.where(x > m, s * e + 1.0, s + e)

    @triton.jit
    def _row_max_and_sum(x_row, n, BLOCK: tl.constexpr, SUM_X: tl.constexpr):
        """(max, sum of exp(x - max), and if SUM_X the sum of x) of a row longer than one block, in one pass:
        each lane runs the online softmax over its elements (whole blocks without masks, then the partial
        last block), and the lanes are combined at the end (one exp per lane).
        A row of only -inf gives (-FLT_MAX, 0): its softmax and loss come out nan, as torch's do."""
        cols = tl.arange(0, BLOCK)
        m = tl.full([BLOCK], -3.4028234663852886e38, tl.float32)
        s = tl.zeros([BLOCK], dtype=tl.float32)
        total = tl.zeros([BLOCK], dtype=tl.float32)
        whole = n // BLOCK * BLOCK
        for start in range(0, whole, BLOCK):
            x = tl.load(x_row + start + cols).to(tl.float32)
            if SUM_X:
                total += x
            m, s = _online_update(m, s, x)
        if whole < n:
            mask = whole + cols < n
            x = tl.load(x_row + whole + cols, mask=mask, other=-float("inf")).to(tl.float32)
            if SUM_X:
                total += tl.where(mask, x, 0.0)
            m, s = _online_update(m, s, x)
        row_max = tl.max(m, axis=0)
        return row_max, tl.sum(s * tl.exp(m - row_max), axis=0), tl.sum(total, axis=0)

    @triton.jit
    def softmax_forward_kernel(x_ptr, y_ptr, rows, n, LOG: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                               ROWS: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * n
        x_row, y_row = x_ptr + row, y_ptr + row
        cols = tl.arange(0, BLOCK)
        # A row of all -inf gives nan (-inf minus -inf), as torch does.
        if SINGLE:   # rows that fit in one block, ROWS of them per program: each read once, kept in registers
            r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
            offs = r.to(tl.int64) * n + cols[None, :]
            mask = (r < rows) & (cols[None, :] < n)
            x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
            shifted = x - tl.max(x, axis=1, keep_dims=True)
            e = tl.exp(shifted)
            total = tl.sum(e, axis=1, keep_dims=True)
            y = shifted - tl.log(total) if LOG else e / total
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
        else:
            m, total, _ = _row_max_and_sum(x_row, n, BLOCK, False)
            log_total = tl.log(total)
            for start in range(0, n, BLOCK):
                mask = start + cols < n
                x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
                # (x - m) first: exact near the max, where x - (m + log_total) would round at |x| ~ 1e4
                y = (x - m) - log_total if LOG else tl.exp(x - m) / total
                tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _backward_from(y, g, LOG: tl.constexpr, total):
        return g - tl.exp(y) * total if LOG else y * (g - total)

    @triton.jit
    def softmax_backward_kernel(y_ptr, dy_ptr, dx_ptr, rows, n, LOG: tl.constexpr, BLOCK: tl.constexpr,
                                SINGLE: tl.constexpr, ROWS: tl.constexpr):
        """softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy)."""
        cols = tl.arange(0, BLOCK)
        if SINGLE:   # rows that fit in one block, ROWS of them per program: y and dy read once
            r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
            offs = r.to(tl.int64) * n + cols[None, :]
            mask = (r < rows) & (cols[None, :] < n)
            g = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            total = tl.sum(g if LOG else g * y, axis=1, keep_dims=True)
            tl.store(dx_ptr + offs, _backward_from(y, g, LOG, total).to(dx_ptr.dtype.element_ty), mask=mask)
        else:        # a longer row: its sum in one pass, dx in a second
            row = tl.program_id(0).to(tl.int64) * n
            acc = tl.zeros([BLOCK], dtype=tl.float32)
            for start in range(0, n, BLOCK):
                mask = start + cols < n
                g = tl.load(dy_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                if LOG:
                    acc += g
                else:
                    acc += g * tl.load(y_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
            total = tl.sum(acc, axis=0)
            for start in range(0, n, BLOCK):
                mask = start + cols < n
                g = tl.load(dy_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                y = tl.load(y_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(dx_ptr + row + start + cols, _backward_from(y, g, LOG, total).to(dx_ptr.dtype.element_ty),
                         mask=mask)


def _block(n: int) -> int:
    return min(triton.next_power_of_2(max(n, 1)), MAX_BLOCK)


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


# The kernels take contiguous rows (the last dimension); the entry point moves `dim` there and back.

def _forward_rows(x: torch.Tensor, log: bool) -> torch.Tensor:
    n = x.shape[-1]
    rows = x.numel() // n
    y = torch.empty_like(x)
    block = _block(n)
    per_program = rows_per_program(rows, n, block)
    softmax_forward_kernel[(triton.cdiv(rows, per_program),)](
        x, y, rows, n, LOG=log, BLOCK=block, SINGLE=n <= block, ROWS=per_program,
        num_warps=_warps(block * per_program))
    return y


def _backward_rows(y: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
    n = y.shape[-1]
    rows = y.numel() // n
    dx = torch.empty_like(y)
    block = _block(n)
    per_program = rows_per_program(rows, n, block)
    softmax_backward_kernel[(triton.cdiv(rows, per_program),)](
        y, dy, dx, rows, n, LOG=log, BLOCK=block, SINGLE=n <= block, ROWS=per_program,
        num_warps=_warps(block * per_program))
    return dx


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.log = inputs[1]


def _backward_rule(ctx, run_backward, dy):
    (y,) = ctx.saved_tensors
    return run_backward(y, dy.contiguous(), ctx.log), None


_softmax_rows = KernelOp(
    "softmax_rows", forward=_forward_rows, forward_fake=lambda x, log: torch.empty_like(x),
    backward=_backward_rows, backward_fake=lambda y, dy, log: torch.empty_like(y),
    setup_context=_save_output, backward_rule=_backward_rule)


def _triton_softmax(x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    rows = x.movedim(dim, -1).contiguous()   # a copy unless `dim` is already last and contiguous
    return _softmax_rows(rows, log).movedim(-1, dim)


def _cuda_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    from roofline.ops import cuda

    cuda.refuse_gradients("softmax", x)
    rows = x.movedim(dim, -1).contiguous()
    return cuda.load("softmax", ("softmax_forward",)).softmax_forward(rows).movedim(-1, dim)


# --------------------------------------------------------------------------- entry points

@functools.cache
def _compiled(log: bool):
    return torch.compile(F.log_softmax if log else F.softmax)


def _run(op: str, x, dim, backend: str | None, log: bool) -> torch.Tensor:
    backend = choose_backend(op, x, backend, BACKENDS)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim} is out of range for x with {x.dim()} dimensions")
    reference = F.log_softmax if log else F.softmax
    if backend == "torch":
        return reference(x, dim=dim)
    if backend == "compile":
        return _compiled(log)(x, dim=dim)
    if x.numel() == 0 or x.dim() == 0:
        return reference(x, dim=dim)   # nothing to launch for: torch's result, with its shape and grad_fn
    if backend == "cuda":
        if log:
            raise ValueError("log_softmax: backend='cuda' has softmax only; use 'triton'")
        return _cuda_softmax(x, dim % x.dim())
    return _triton_softmax(x, dim % x.dim(), log)


def softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """softmax with torch.nn.functional.softmax's meaning (dim is required there; here it defaults to the last).

    backend: "triton" (the default on CUDA), "torch" (F.softmax; the default on CPU), "compile", "cuda"
    (CUDA C++, forward only). The result has x's dtype; the math is fp32.
    """
    return _run("softmax", x, dim, backend, log=False)


def log_softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """log_softmax with torch.nn.functional.log_softmax's meaning; see softmax for the backends."""
    return _run("log_softmax", x, dim, backend, log=True)
