"""softmax and log_softmax over one dimension: reference, Triton kernels (forward and backward), autograd, entry points.

    softmax(x)_i     = exp(x_i - m) / sum_j exp(x_j - m),      m = max_j x_j
    log_softmax(x)_i = x_i - m - log(sum_j exp(x_j - m))

Memory-bound: the least traffic is one read of x and one write of y (backward: read y and
dy, write dx). A row that fits in one block (up to MAX_BLOCK elements) is held in registers
and read once, forward and backward; short rows go several to a program. A longer row is
read twice: a first pass keeps a running max and a running sum rescaled whenever the max
grows (the online softmax), a second pass, from the row's end back, writes the output; no
block size spills registers, so there is no cliff at long rows. Long rows are walked by one
resident program per SM, so that the rows in flight stay in L2 between their two reads
(33 MB at 65536 bf16 columns, forward and backward).
The math runs in fp32 whatever the storage dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roofline.ops._common import cdiv, choose_backend, next_power_of_2, resident_programs, rows_per_program, tl, triton
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache
from roofline.ops._runtime import KernelOp, torch_route

BACKENDS = ("torch", "triton", "compile", "cuda")
MAX_BLOCK = 16384             # elements per block: 64 KB of fp32 per row, 32 per thread at 16 warps
LONG_ROW_PROGRAMS_PER_SM = 1  # rows longer than a block: one in flight an SM, 33 MB in all at 2^16 bf16 (L2: 50)
LONG_ROW_WARPS = 32


# --------------------------------------------------------------------------- reference

def softmax_by_hand(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """softmax written out in eager PyTorch (max, subtract, exp, sum, divide): a pass over memory per step."""
    shifted = x - x.amax(dim=dim, keepdim=True)
    e = shifted.exp()
    return e / e.sum(dim=dim, keepdim=True)


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    LOG2E = tl.constexpr(1.4426950408889634)   # exp(x) = exp2(x log2(e)); exp2 is one hardware instruction

    @triton.jit
    def _online_update(m, s, x):
        """One step of the online softmax for each lane: the running max m and sum s of exp(. - m) of a lane's
        elements, updated with its next chunk of elements x (a row of x per lane, held by one thread, so the
        chunk's max and sum need no other thread).

        Per element this is a max, a subtraction, a multiply, an exp2 and an add; per chunk, one more exp2 to
        rescale s when the max grew. m starts at -FLT_MAX, not -inf, so no -inf - -inf arises: an x of -inf adds
        exp(-inf) = 0. A nan is dropped by the max but reaches s through its own exp. x - m is formed before
        scaling to base 2, so that no finite x overflows: exp(x - m) is exact for every finite x."""
        m_new = tl.maximum(m, tl.max(x, axis=1))
        e = tl.exp2((x - m_new[:, None]) * LOG2E)
        return m_new, s * tl.exp2((m - m_new) * LOG2E) + tl.sum(e, axis=1)

    @triton.jit
    def _row_max_and_sum(x_row, n, BLOCK: tl.constexpr, SUM_X: tl.constexpr):
        """(max, sum of exp(x - max), and if SUM_X the sum of x) of a row longer than one block, in one pass.

        A block is read as lanes of one 16-byte load each (8 elements of 16 bits, 4 of 32); each lane runs the
        online softmax over its chunks (whole blocks without masks, then the partial last block), and the lanes
        are combined at the end (one exp per lane). A row of only -inf gives (-FLT_MAX, 0): its softmax and
        loss come out nan, as torch's do."""
        CHUNK: tl.constexpr = min(128 // x_row.dtype.element_ty.primitive_bitwidth, BLOCK)
        LANES: tl.constexpr = BLOCK // CHUNK
        offs = tl.arange(0, LANES)[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]
        m = tl.full([LANES], -3.4028234663852886e38, tl.float32)
        s = tl.zeros([LANES], dtype=tl.float32)
        # Summed element by element, not a chunk's sum at a time: Triton 3.6's thread-locality pass fails an
        # assertion on `total += tl.sum(x, axis=1)` in this loop (fp32 rows).
        total = tl.zeros([LANES, CHUNK], dtype=tl.float32)
        whole = n // BLOCK * BLOCK
        for start in range(0, whole, BLOCK):
            x = tl.load(x_row + start + offs).to(tl.float32)
            if SUM_X:
                total += x
            m, s = _online_update(m, s, x)
        if whole < n:
            mask = whole + offs < n
            x = tl.load(x_row + whole + offs, mask=mask, other=-float("inf")).to(tl.float32)
            if SUM_X:
                total += tl.where(mask, x, 0.0)
            m, s = _online_update(m, s, x)
        row_max = tl.max(m, axis=0)
        return row_max, tl.sum(s * tl.exp2((m - row_max) * LOG2E), axis=0), tl.sum(tl.sum(total, axis=1), axis=0)

    @triton.jit
    def _row_block(rows, n, cols, ROWS: tl.constexpr):
        """(offsets, mask) of a program's ROWS rows of n elements, where each fits in one block (cols)."""
        r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        return r.to(tl.int64) * n + cols[None, :], (r < rows) & (cols[None, :] < n)

    @triton.jit
    def softmax_forward_kernel(x_ptr, y_ptr, rows, n, LOG: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                               ROWS: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        # A row of all -inf gives nan (-inf minus -inf), as torch does.
        if SINGLE:   # rows that fit in one block, ROWS of them per program: each read once, kept in registers
            offs, mask = _row_block(rows, n, cols, ROWS)
            x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
            shifted = x - tl.max(x, axis=1, keep_dims=True)
            e = tl.exp2(shifted * LOG2E)
            total = tl.sum(e, axis=1, keep_dims=True)
            # times the reciprocal: a division per element is a dozen instructions, and within 1 ulp of it
            y = shifted - tl.log(total) if LOG else e * (1.0 / total)
            tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)
        else:        # longer rows, walked by resident programs: max and sum in one pass, y in a second
            blocks = tl.cdiv(n, BLOCK)
            for r in range(tl.program_id(0), rows, tl.num_programs(0)):
                row = tl.cast(r, tl.int64) * n
                x_row, y_row = x_ptr + row, y_ptr + row
                m, total, _ = _row_max_and_sum(x_row, n, BLOCK, False)
                log_total = tl.log(total)
                inverse_total = 1.0 / total
                for i in range(0, blocks):
                    start = (blocks - 1 - i) * BLOCK   # from the row's end back: the blocks likeliest in L2 first
                    mask = start + cols < n
                    x = tl.load(x_row + start + cols, mask=mask, other=-float("inf")).to(tl.float32)
                    # (x - m) first: exact near the max, where x - (m + log_total) would round at |x| ~ 1e4
                    y = (x - m) - log_total if LOG else tl.exp2((x - m) * LOG2E) * inverse_total
                    tl.store(y_row + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _backward_from(y, g, LOG: tl.constexpr, total):
        return g - tl.exp2(y * LOG2E) * total if LOG else y * (g - total)

    @triton.jit
    def softmax_backward_kernel(y_ptr, dy_ptr, dx_ptr, rows, n, LOG: tl.constexpr, BLOCK: tl.constexpr,
                                SINGLE: tl.constexpr, ROWS: tl.constexpr):
        """softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy)."""
        cols = tl.arange(0, BLOCK)
        if SINGLE:   # rows that fit in one block, ROWS of them per program: y and dy read once
            offs, mask = _row_block(rows, n, cols, ROWS)
            g = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            y = tl.load(y_ptr + offs, mask=mask, other=0.0).to(tl.float32)
            total = tl.sum(g if LOG else g * y, axis=1, keep_dims=True)
            tl.store(dx_ptr + offs, _backward_from(y, g, LOG, total).to(dx_ptr.dtype.element_ty), mask=mask)
        else:        # longer rows, walked by resident programs: the sum in one pass, dx in a second
            blocks = tl.cdiv(n, BLOCK)
            for r in range(tl.program_id(0), rows, tl.num_programs(0)):
                row = tl.cast(r, tl.int64) * n
                acc = tl.zeros([BLOCK], dtype=tl.float32)
                for start in range(0, n, BLOCK):
                    mask = start + cols < n
                    g = tl.load(dy_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    if LOG:
                        acc += g
                    else:
                        acc += g * tl.load(y_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                total = tl.sum(acc, axis=0)
                for i in range(0, blocks):
                    start = (blocks - 1 - i) * BLOCK   # from the row's end back: the blocks likeliest in L2 first
                    mask = start + cols < n
                    g = tl.load(dy_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    y = tl.load(y_ptr + row + start + cols, mask=mask, other=0.0).to(tl.float32)
                    tl.store(dx_ptr + row + start + cols,
                             _backward_from(y, g, LOG, total).to(dx_ptr.dtype.element_ty), mask=mask)


def _block(n: int) -> int:
    return min(next_power_of_2(n), MAX_BLOCK)


def _warps(block: int) -> int:
    return max(1, min(16, block // 512))


class SoftmaxPlan:
    """The launches for contiguous rows of n elements of one dtype on one device, softmax or log_softmax. Rows
    that fit in a block go several to a program; longer rows are walked by LONG_ROW_PROGRAMS_PER_SM resident
    programs an SM, so that the rows in flight (read twice) stay in L2 between their two passes."""

    def __init__(self, rows: int, n: int, log: bool, device: torch.device):
        self.rows, self.n = rows, n
        block = _block(n)
        if n <= block:
            per_program = rows_per_program(rows, n, block)
            grid, warps = cdiv(rows, per_program), _warps(block * per_program)
        else:
            per_program = 1
            grid, warps = resident_programs(rows, device, LONG_ROW_PROGRAMS_PER_SM), LONG_ROW_WARPS
        index = device.index if device.type == "cuda" else -1
        settings = dict(LOG=log, BLOCK=block, SINGLE=n <= block, ROWS=per_program, num_warps=warps)
        self.forward_launch = Launch(softmax_forward_kernel, (grid,), index, **settings)
        self.backward_launch = Launch(softmax_backward_kernel, (grid,), index, **settings)

    def forward(self, x: torch.Tensor, log: bool) -> torch.Tensor:
        y = torch.empty_like(x)
        self.forward_launch.for_pointers(x.data_ptr())(x, y, self.rows, self.n)
        return y

    def backward(self, y: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dx = torch.empty_like(y)
        self.backward_launch.for_pointers(y.data_ptr() | dy.data_ptr())(y, dy, dx, self.rows, self.n)
        return dx


@plan_cache("softmax", key=lambda x, log: (x.numel(), x.shape[-1], x.dtype, x.device, log))
def _plan(x: torch.Tensor, log: bool) -> SoftmaxPlan:
    """The plan for contiguous x, over its last dimension."""
    return SoftmaxPlan(x.numel() // x.shape[-1], x.shape[-1], log, x.device)


# The registered ops take contiguous x of any shape, over its last dimension; the entry point moves `dim` there.

def _forward_rows(x: torch.Tensor, log: bool) -> torch.Tensor:
    return _plan(x, log).forward(x, log)


def _backward_rows(y: torch.Tensor, dy: torch.Tensor, log: bool) -> torch.Tensor:
    return _plan(y, log).backward(y, dy, log)


def _save_output(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.log = inputs[1]


def _backward_rule(ctx, run_backward, dy):
    (y,) = ctx.saved_tensors
    return run_backward(y, dy, ctx.log), None


_softmax_rows = KernelOp(
    "softmax_rows", forward=_forward_rows, forward_fake=lambda x, log: torch.empty_like(x),
    backward=_backward_rows, backward_fake=lambda y, dy, log: torch.empty_like(y),
    setup_context=_save_output, backward_rule=_backward_rule, plan=_plan,
    public_name=lambda args: "log_softmax" if args[1] else "softmax",
    signature=lambda x, dim, backend, log: (type(x), x.shape, x.stride(), x.dtype, x.device, dim, type(dim), backend,
                                            log))


def _triton_softmax(key, x: torch.Tensor, dim: int, log: bool) -> torch.Tensor:
    if dim != x.dim() - 1:
        rows = x.movedim(dim, -1).contiguous()   # a copy unless `dim` is already last and contiguous
        return _softmax_rows(rows, log).movedim(-1, dim)
    rows = x.contiguous()   # the usual case, without two movedim calls (a few us of host time each)
    return _softmax_rows.call(key, rows is x, rows.requires_grad and torch.is_grad_enabled(), rows, log)


def _cuda_softmax(x: torch.Tensor, dim: int) -> torch.Tensor:
    from roofline.ops import cuda

    cuda.refuse_gradients("softmax", x)
    rows = x.movedim(dim, -1).contiguous()
    return cuda.load("softmax", ("softmax_forward",)).softmax_forward(rows).movedim(-1, dim)


# --------------------------------------------------------------------------- entry points

def _run(op: str, x, dim, backend: str | None, log: bool) -> torch.Tensor:
    key, plan = _softmax_rows.seen(x, dim, backend, log)
    if plan is not None:
        return _softmax_rows.eager(plan, x.requires_grad and torch.is_grad_enabled(), x, log)
    backend = choose_backend(op, x, backend, BACKENDS)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{op}: dim must be an int, got {type(dim).__name__}")
    ndim = max(x.dim(), 1)
    if not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim} is out of range for x with {x.dim()} dimensions")
    reference = F.log_softmax if log else F.softmax
    done = torch_route(backend, reference, x, dim, nothing_to_launch=x.numel() == 0 or x.dim() == 0)
    if done is not None:
        return done
    if backend == "cuda":
        if log:
            raise ValueError("log_softmax: backend='cuda' has softmax only; use 'triton'")
        return _cuda_softmax(x, dim % x.dim())
    return _triton_softmax(key, x, dim % x.dim(), log)


@replayed_entry
def softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """softmax with torch.nn.functional.softmax's meaning (dim is required there; here it defaults to the last).

    backend: "triton" (the default on CUDA), "torch" (F.softmax; the default on CPU), "compile", "cuda"
    (CUDA C++, forward only). The result has x's dtype; the math is fp32.
    """
    return _run("softmax", x, dim, backend, log=False)


@replayed_entry
def log_softmax(x: torch.Tensor, dim: int = -1, *, backend: str | None = None) -> torch.Tensor:
    """log_softmax with torch.nn.functional.log_softmax's meaning; see softmax for the backends."""
    return _run("log_softmax", x, dim, backend, log=True)
