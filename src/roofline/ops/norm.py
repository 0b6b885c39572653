"""layer_norm, rms_norm and add_rms_norm: reference, Triton kernels (forward and backward), autograd, entry points.

    layer_norm(x) = (x - mean) * rstd * w + b,      rstd = 1 / sqrt(var + eps)   (biased variance)
    rms_norm(x)   = x * rstd * w,                   rstd = 1 / sqrt(mean(x^2) + eps)
    add_rms_norm(x, residual) = rms_norm(h), h      with h = x + residual          (the pre-norm transformer step)

One kernel pair serves all three: rms_norm is layer_norm with the mean fixed at zero and no bias, and
add_rms_norm adds the residual on the way in (writing h, the next residual) and, in the backward pass, the
gradient that reaches h directly on the way out.

Memory-bound. Forward: a row of up to MAX_BLOCK elements is read once into registers (short rows several to
a program); a longer row, one per program, is read twice (statistics by a per-lane Welford pass, combined
across lanes at the end, then a write pass). The per-row mean and rstd (fp32) are saved for the backward.

Backward: dx = rstd * (w dy - (xhat * mean(xhat w dy) + mean(w dy))), and dw, db are sums over rows. A 2-D
grid of column blocks by row groups: each program walks its group's rows, writes dx and keeps dw and db for
its columns in registers, then writes one partial row; the few partial rows are summed afterwards. Up to
blocks of BACKWARD_PREFETCH_BLOCK columns a program issues the next row's loads before it reduces the current
row, so that memory stays busy while the threads wait on each other. A row
longer than one block needs its two means before any dx: a small kernel computes them first (one more
read of x and dy, for those rows only).
"""

from __future__ import annotations

import math
import numbers

import torch
import torch.nn.functional as F

from roofline.ops._common import (DTYPES, cdiv, choose_backend, next_power_of_2, rows_per_program, sm_count, tl, triton,
                                  wants_grad)
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp, torch_route

BACKENDS = ("torch", "triton", "compile")
MAX_BLOCK = 16384        # forward: elements of a row held in registers at once
BACKWARD_BLOCK = 8192    # backward: columns a program covers (it keeps x, dy, w, dw and db of each in registers)
RMS_BACKWARD_BLOCK = 16384   # the same for rms_norm, which has no db
SHORT_ROW_BLOCK = 512      # forward: the longest rows (as a power of two) that go several to a program
# torch's rms_norm with eps=None takes the epsilon of the type it computes in: float32, also for fp16 and bf16.
DEFAULT_RMS_EPS = torch.finfo(torch.float32).eps
BACKWARD_PREFETCH_BLOCK = 4096   # backward: up to this block the next row's loads are issued before this row
                                 # is reduced, which hides part of their latency for both norms; at 8192 it gains
                                 # nothing, and a block of 16384 spills registers and runs many times slower
                                 # (measured: benchmarks/results/h100-tune.md, run 8)


# --------------------------------------------------------------------------- references

def add_rms_norm_reference(x, residual, weight=None, eps=None):
    """The pre-norm step in eager PyTorch: two passes over memory (the add, then the norm)."""
    h = x + residual
    return F.rms_norm(h, h.shape[-1:], weight, eps), h


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _row_in(x_row, r_row, offs, mask, HAS_RES: tl.constexpr):
        """The row's values at `offs` in fp32 (0 where mask is False; mask None: all of them): x, or
        x + residual rounded to x's dtype (as torch rounds h)."""
        if mask is None:
            x = tl.load(x_row + offs)
        else:
            x = tl.load(x_row + offs, mask=mask, other=0.0)
        if HAS_RES:   # added in fp32 and rounded once, as torch does
            if mask is None:
                r = tl.load(r_row + offs)
            else:
                r = tl.load(r_row + offs, mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)
        return x.to(tl.float32)

    @triton.jit
    def _exact_mean(total, n):
        """total / n rounded correctly. The GPU's default fp32 division is an approximation (2 ulp): a constant
        row's mean could land an ulp off its value, which 1/sqrt(eps) then magnifies; torch rounds it."""
        return tl.div_rn(total, tl.full(total.shape, n, tl.float32))

    @triton.jit
    def _rstd(var, eps):
        """1 / sqrt(var + eps), square root and division correctly rounded (and 0 for an infinite variance,
        as torch gives), where the GPU's defaults are approximations."""
        one = tl.full(var.shape, 1.0, tl.float32)
        return tl.div_rn(one, tl.sqrt_rn(var + eps))

    @triton.jit
    def _mean_and_var(x_row, r_row, n, RMS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK: tl.constexpr):
        """(mean, variance) of a row longer than one block, in one pass; for RMS (0, mean of squares).
        Each lane runs Welford's update over its elements, lanes merged by Chan's formula at the end. Every
        lane has seen the same count in the whole blocks, so the update divides by a scalar, once a block."""
        cols = tl.arange(0, BLOCK)
        mean = tl.zeros([BLOCK], dtype=tl.float32)
        m2 = tl.zeros([BLOCK], dtype=tl.float32)
        whole = n // BLOCK
        for i in range(0, whole):
            x = _row_in(x_row, r_row, i * BLOCK + cols, None, HAS_RES)
            if RMS:
                m2 += x * x
            else:
                delta = x - mean
                mean += delta * (1.0 / (i + 1))
                m2 += delta * (x - mean)
        tail = whole * BLOCK + cols < n   # the partial last block: its lanes count one more
        x = _row_in(x_row, r_row, whole * BLOCK + cols, tail, HAS_RES)
        if RMS:
            return 0.0, _exact_mean(tl.sum(m2 + x * x, axis=0), n)
        delta = tl.where(tail, x - mean, 0.0)
        mean += delta * (1.0 / (whole + 1))
        m2 += delta * tl.where(tail, x - mean, 0.0)
        count = whole + tail.to(tl.float32)
        row_mean = _exact_mean(tl.sum(count * mean, axis=0), n)
        spread = mean - row_mean
        return row_mean, _exact_mean(tl.sum(m2 + count * spread * spread, axis=0), n)

    @triton.jit
    def _normalize_and_store(x, mean, rstd, h_ptr, w_ptr, b_ptr, y_ptr, start_of_row, offs, mask,
                             HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr):
        """Write h (with a residual) and y = (x - mean) * rstd * w + b at offs of the row(s) at start_of_row."""
        if HAS_RES:
            tl.store(h_ptr + start_of_row + offs, x.to(h_ptr.dtype.element_ty), mask=mask)
        y = (x - mean) * rstd
        if HAS_W:
            y *= tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_B:
            y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + start_of_row + offs, y.to(y_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def norm_forward_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, h_ptr, stats_ptr, rows, n, eps,
                            RMS: tl.constexpr, HAS_RES: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                            STATS: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr, ROWS: tl.constexpr):
        """STATS: each row's mean and rstd to stats_ptr [2, rows] (fp32), for the backward."""
        mean_ptr, rstd_ptr = stats_ptr, stats_ptr + rows
        if SINGLE:   # rows that fit in one block, ROWS of them per program: one read, an exact two-pass variance
            row = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
            in_rows = row < rows
            start_of_row = row.to(tl.int64) * n
            cols = tl.arange(0, BLOCK)[None, :]
            mask = in_rows & (cols < n)
            x = _row_in(x_ptr + start_of_row, r_ptr + start_of_row, cols, mask, HAS_RES)
            if RMS:
                mean = tl.zeros([ROWS, 1], dtype=tl.float32)
                var = _exact_mean(tl.sum(x * x, axis=1, keep_dims=True), n)
            else:
                mean = _exact_mean(tl.sum(x, axis=1, keep_dims=True), n)
                centered = tl.where(mask, x - mean, 0.0)
                var = _exact_mean(tl.sum(centered * centered, axis=1, keep_dims=True), n)
            rstd = _rstd(var, eps)
            if STATS:
                tl.store(mean_ptr + row, mean, mask=in_rows)
                tl.store(rstd_ptr + row, rstd, mask=in_rows)
            _normalize_and_store(x, mean, rstd, h_ptr, w_ptr, b_ptr, y_ptr, start_of_row, cols, mask,
                                 HAS_RES, HAS_W, HAS_B)
        else:        # one long row per program: statistics in one pass, then a write pass
            row = tl.program_id(0)
            start_of_row = row.to(tl.int64) * n
            cols = tl.arange(0, BLOCK)
            mean, var = _mean_and_var(x_ptr + start_of_row, r_ptr + start_of_row, n, RMS, HAS_RES, BLOCK)
            rstd = _rstd(var, eps)
            if STATS:
                tl.store(mean_ptr + row, mean)
                tl.store(rstd_ptr + row, rstd)
            for start in range(0, n, BLOCK):
                offs = start + cols
                mask = offs < n
                x = _row_in(x_ptr + start_of_row, r_ptr + start_of_row, offs, mask, HAS_RES)
                _normalize_and_store(x, mean, rstd, h_ptr, w_ptr, b_ptr, y_ptr, start_of_row, offs, mask,
                                     HAS_RES, HAS_W, HAS_B)

    @triton.jit
    def _row_of(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, live, n, offs, mask, RMS: tl.constexpr):
        """x and dy of a row at offs (as stored), its mean and rstd; nothing is read where not live."""
        start_of_row = tl.cast(row, tl.int64) * n   # a loop index is a plain int in the interpreter
        x = tl.load(x_ptr + start_of_row + offs, mask=mask & live, other=0.0)
        dy = tl.load(dy_ptr + start_of_row + offs, mask=mask & live, other=0.0)
        mean = 0.0 if RMS else tl.load(mean_ptr + row, mask=live, other=0.0)
        return x, dy, mean, tl.load(rstd_ptr + row, mask=live, other=0.0)

    @triton.jit
    def _xhat_and_wdy(x, dy, w, mean, rstd, RMS: tl.constexpr):
        x, dy = x.to(tl.float32), dy.to(tl.float32)
        xhat = x * rstd if RMS else (x - mean) * rstd
        return xhat, dy, w * dy

    @triton.jit
    def norm_row_means_kernel(x_ptr, dy_ptr, w_ptr, stats_ptr, c_ptr, rows, n,
                              RMS: tl.constexpr, HAS_W: tl.constexpr, BLOCK: tl.constexpr):
        """For rows longer than one block: c1 = mean(xhat * w dy) and c2 = mean(w dy) of each row, to c_ptr
        [2, rows]."""
        mean_ptr, rstd_ptr, c1_ptr, c2_ptr = stats_ptr, stats_ptr + rows, c_ptr, c_ptr + rows
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        c1 = tl.zeros([BLOCK], dtype=tl.float32)
        c2 = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, n, BLOCK):
            mask = start + cols < n
            w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32) if HAS_W else 1.0
            x, dy, mean, rstd = _row_of(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, True, n, start + cols, mask, RMS)
            xhat, _, wdy = _xhat_and_wdy(x, dy, w, mean, rstd, RMS)
            c1 += xhat * wdy
            c2 += wdy
        tl.store(c1_ptr + row, tl.sum(c1, axis=0) / n)
        tl.store(c2_ptr + row, tl.sum(c2, axis=0) / n)

    @triton.jit
    def norm_backward_kernel(x_ptr, dy_ptr, dres_ptr, w_ptr, stats_ptr, c_ptr, dx_ptr, parts_ptr, dw_ptr, db_ptr,
                             rows, n, RMS: tl.constexpr, HAS_W: tl.constexpr, HAS_B: tl.constexpr,
                             HAS_DRES: tl.constexpr, BLOCK: tl.constexpr, SINGLE: tl.constexpr,
                             PREFETCH: tl.constexpr, DIRECT: tl.constexpr):
        """Program (column block, row group): dx for its rows and columns; dw, db for its columns: partial sums to
        row `group` of parts_ptr [HAS_W + HAS_B, groups, n] (dw's first), or, with one row group (DIRECT), the
        sums themselves to dw_ptr and db_ptr in their dtypes. PREFETCH: the next row's loads are issued before
        this row is reduced, so that they are in flight meanwhile (registers for a second row)."""
        mean_ptr, rstd_ptr, c1_ptr, c2_ptr = stats_ptr, stats_ptr + rows, c_ptr, c_ptr + rows
        col_block, group, groups = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
        offs = col_block * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32) if HAS_W else 1.0
        dw = tl.zeros([BLOCK], dtype=tl.float32)
        db = tl.zeros([BLOCK], dtype=tl.float32)
        if PREFETCH:
            x_next, dy_next, mean_next, rstd_next = _row_of(x_ptr, dy_ptr, mean_ptr, rstd_ptr, group, group < rows,
                                                            n, offs, mask, RMS)
        for row in range(group, rows, groups):
            if PREFETCH:
                x, dy, mean, rstd = x_next, dy_next, mean_next, rstd_next
                x_next, dy_next, mean_next, rstd_next = _row_of(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row + groups,
                                                                row + groups < rows, n, offs, mask, RMS)
            else:
                x, dy, mean, rstd = _row_of(x_ptr, dy_ptr, mean_ptr, rstd_ptr, row, True, n, offs, mask, RMS)
            xhat, dy, wdy = _xhat_and_wdy(x, dy, w, mean, rstd, RMS)
            if SINGLE:   # this block is the whole row: its means are at hand
                c1 = tl.sum(xhat * wdy, axis=0) / n
                c2 = tl.sum(wdy, axis=0) / n
            else:
                c1 = tl.load(c1_ptr + row)
                c2 = tl.load(c2_ptr + row)
            dx = wdy - xhat * c1 if RMS else wdy - (xhat * c1 + c2)
            dx *= rstd
            start_of_row = tl.cast(row, tl.int64) * n
            if HAS_DRES:
                dx += tl.load(dres_ptr + start_of_row + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(dx_ptr + start_of_row + offs, dx.to(dx_ptr.dtype.element_ty), mask=mask)
            dw += dy * xhat
            db += dy
        if DIRECT:
            if HAS_W:
                tl.store(dw_ptr + offs, dw.to(dw_ptr.dtype.element_ty), mask=mask)
            if HAS_B:
                tl.store(db_ptr + offs, db.to(db_ptr.dtype.element_ty), mask=mask)
        else:
            if HAS_W:
                tl.store(parts_ptr + group * n + offs, dw, mask=mask)
            if HAS_B:
                tl.store(parts_ptr + (groups * n if HAS_W else 0) + group * n + offs, db, mask=mask)

    @triton.jit
    def norm_parameter_grads_kernel(parts_ptr, dw_ptr, db_ptr, groups, n, HAS_W: tl.constexpr,
                                    HAS_B: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr):
        """dw and db: the backward kernel's partial rows [HAS_W + HAS_B, groups, n] summed (fp32) and stored in
        the parameters' dtypes, in one launch where torch would take a sum and a cast for each."""
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        g = tl.arange(0, BLOCK_G)[:, None]
        dw = tl.zeros([BLOCK_N], dtype=tl.float32)
        db = tl.zeros([BLOCK_N], dtype=tl.float32)
        db_parts = parts_ptr + groups * n if HAS_W else parts_ptr
        for start in range(0, groups, BLOCK_G):
            mask = (start + g < groups) & (cols[None, :] < n)
            at = (start + g) * n + cols[None, :]
            if HAS_W:
                dw += tl.sum(tl.load(parts_ptr + at, mask=mask, other=0.0), axis=0)
            if HAS_B:
                db += tl.sum(tl.load(db_parts + at, mask=mask, other=0.0), axis=0)
        if HAS_W:
            tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=cols < n)
        if HAS_B:
            tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=cols < n)


def _block(n: int, largest: int) -> int:
    return min(next_power_of_2(n), largest)


def _programs_per_wave(device: torch.device, per_sm: int) -> int:
    if device.type != "cuda":
        return 4   # the interpreter: a few groups, so the tests cover more than one
    return per_sm * sm_count(device)


def forward_config(rows: int, n: int) -> tuple[int, int, int]:
    """(block, rows per program, warps) of the forward kernel for `rows` rows of n elements.

    Rows of up to SHORT_ROW_BLOCK elements go several to a program: short rows one to a program leave the
    kernel far from the bandwidth. A row held in registers runs fastest with 4 warps up to 2048 elements and 8
    above (16 warps were slower for layer_norm at 4096 and 16384), and a looped row with 32 warps. Chosen by
    benchmarks/tune_ops.py on 256 MB of bf16, the kernel alone (measured: benchmarks/results/h100-tune.md)."""
    block = _block(n, MAX_BLOCK)
    per_program = rows_per_program(rows, n, block, SHORT_ROW_BLOCK)
    if n > block:
        return block, 1, 32
    return block, per_program, 8 if block * per_program >= 4096 else 4


def backward_config(rows: int, n: int, rms: bool, device: torch.device) -> tuple[int, int, int]:
    """(column block, row groups, warps) of the backward kernel.

    Chosen by benchmarks/tune_ops.py on 256 MB of bf16 x and dy, the kernels alone (measured:
    benchmarks/results/h100-tune.md, run 4): a warp per 512 columns (4 to 16); 4 programs per SM for blocks up
    to 2048 columns, 2 above (where 4 ran slower); rms_norm holds rows of up to 16384 in one block (faster than
    splitting them in two with the row-means pre-pass), layer_norm, which also keeps db, up to 8192 (its
    16384-column block measured slower than two of 8192)."""
    block = _block(n, min(MAX_BLOCK, RMS_BACKWARD_BLOCK if rms else BACKWARD_BLOCK))
    per_sm = 4 if block <= 2048 else 2
    groups = max(1, min(rows, _programs_per_wave(device, per_sm) // cdiv(n, block)))
    return block, groups, max(4, min(16, block // 512))


PARAMETER_GRADS_BLOCK = (32, 64)   # rows of partial sums a step, columns a program of norm_parameter_grads_kernel


class NormPlan:
    """The launches of one norm signature: rows of n elements of one dtype on one device; whether a residual,
    a weight and a bias are there (and their dtypes); eps; rms_norm or layer_norm. Built once per signature
    (Plans), so that no config is chosen and no kernel looked up on later calls."""

    def __init__(self, rows: int, n: int, eps: float | None, rms: bool, has_residual: bool, has_weight: bool,
                 bias_dtype: torch.dtype | None, device: torch.device):
        self.rows, self.n, self.eps, self.rms = rows, n, eps, rms
        self.device = device
        has_bias = bias_dtype is not None
        index = device.index if device.type == "cuda" else -1
        block, per_program, warps = forward_config(rows, n)
        forward = dict(RMS=rms, HAS_RES=has_residual, HAS_W=has_weight, HAS_B=has_bias, BLOCK=block,
                       SINGLE=n <= block, ROWS=per_program, num_warps=warps)
        grid = (cdiv(rows, per_program),)
        self.forward_launch = Launch(norm_forward_kernel, grid, index, STATS=False, **forward)
        self.forward_saving_launch = Launch(norm_forward_kernel, grid, index, STATS=True, **forward)

        block, groups, warps = backward_config(rows, n, rms, device)
        self.single, self.groups = n <= block, groups
        self.row_means_launch = Launch(norm_row_means_kernel, (rows,), index, RMS=rms, HAS_W=has_weight,
                                       BLOCK=block, num_warps=warps)
        # One row group (a few rows, or columns enough to fill the GPU) sums dw and db whole: the kernel stores
        # them itself, and the partial sums' buffer and the second launch are not needed (each costs host time
        # that a tiny forward+backward, bound by its host, pays in full).
        direct = groups == 1
        backward = dict(RMS=rms, HAS_W=has_weight, HAS_B=has_bias, BLOCK=block, SINGLE=self.single,
                        PREFETCH=block <= BACKWARD_PREFETCH_BLOCK, DIRECT=direct, num_warps=warps)
        grid = (cdiv(n, block), groups)
        self.backward_launch = {dres: Launch(norm_backward_kernel, grid, index, HAS_DRES=dres, **backward)
                                for dres in (False, True)}
        self.parts = 0 if direct else (has_weight + has_bias) * groups * n
        g, b = PARAMETER_GRADS_BLOCK
        self.parameter_grads_launch = Launch(norm_parameter_grads_kernel, (cdiv(n, b),), index, HAS_W=has_weight,
                                             HAS_B=has_bias, BLOCK_G=g, BLOCK_N=b)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
                bias: torch.Tensor | None, n: int, eps: float, rms: bool, stats: bool):
        """(y, h or None, stats [2, rows] fp32 or None) for contiguous x (and residual) of any shape."""
        y = torch.empty_like(x)
        h = torch.empty_like(x) if residual is not None else None
        saved = torch.empty(2 * self.rows, dtype=torch.float32, device=self.device) if stats else None
        pointers = x.data_ptr()
        if residual is not None:
            pointers |= residual.data_ptr()
        if weight is not None:
            pointers |= weight.data_ptr()
        if bias is not None:
            pointers |= bias.data_ptr()
        launch = self.forward_saving_launch if stats else self.forward_launch
        launch.for_pointers(pointers)(
            x, x if residual is None else residual, x if weight is None else weight, x if bias is None else bias,
            y, y if h is None else h, y if saved is None else saved, self.rows, self.n, eps)
        return y, h, saved

    def backward(self, dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
                 dresidual: torch.Tensor | None, rms: bool, bias_dtype: torch.dtype | None):
        """(dx, dw or None, db or None): dw in the weight's dtype, db in bias_dtype."""
        if not dy.is_contiguous():
            dy = dy.contiguous()
        dx = torch.empty_like(x)
        parts = torch.empty(self.parts, dtype=torch.float32, device=self.device) if self.parts else None
        dw = torch.empty_like(weight) if weight is not None else None
        db = torch.empty(self.n, dtype=bias_dtype, device=self.device) if bias_dtype is not None else None
        pointers = dy.data_ptr() | x.data_ptr()
        if weight is not None:
            pointers |= weight.data_ptr()
        if dresidual is not None:
            pointers |= dresidual.data_ptr()
        w = x if weight is None else weight
        means = stats
        if not self.single:
            means = torch.empty(2 * self.rows, dtype=torch.float32, device=self.device)
            self.row_means_launch.for_pointers(pointers)(x, dy, w, stats, means, self.rows, self.n)
        self.backward_launch[dresidual is not None].for_pointers(pointers)(
            x, dy, x if dresidual is None else dresidual, w, stats, means, dx, dx if parts is None else parts,
            dx if dw is None else dw, dx if db is None else db, self.rows, self.n)
        if parts is not None:
            self.parameter_grads_launch(parts, parts if dw is None else dw, parts if db is None else db,
                                        self.groups, self.n)
        return dx, dw, db


@plan_cache("norm", key=lambda x, residual, weight, bias_dtype, n, eps, rms: (
    x.numel(), n, x.dtype, x.device, residual is not None, None if weight is None else weight.dtype, bias_dtype, eps,
    rms))
def _plan(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None, bias_dtype, n: int,
          eps: float | None, rms: bool) -> NormPlan:
    """The plan for these arguments (as the registered ops take them)."""
    return NormPlan(x.numel() // n, n, eps, rms, residual is not None, weight is not None, bias_dtype, x.device)


def _nothing(like: torch.Tensor) -> torch.Tensor:
    """A placeholder for an absent result (a registered op's outputs are all tensors)."""
    return like.new_empty(0)


# The registered ops: contiguous x (and residual) of any shape, normalized over their last n elements.

def _forward(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
             bias: torch.Tensor | None, n: int, eps: float, rms: bool,
             stats: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    y, h, saved = _plan(x, residual, weight, None if bias is None else bias.dtype, n, eps, rms).forward(
        x, residual, weight, bias, n, eps, rms, stats)
    return y, _nothing(x) if h is None else h, _nothing(x) if saved is None else saved


def _forward_fake(x, residual, weight, bias, n, eps, rms, stats):
    h = torch.empty_like(x) if residual is not None else _nothing(x)
    return torch.empty_like(x), h, x.new_empty(2 * (x.numel() // n) if stats else 0, dtype=torch.float32)


def _backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor | None, stats: torch.Tensor,
              dresidual: torch.Tensor | None, rms: bool,
              bias_dtype: torch.dtype | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = x.numel() // (stats.numel() // 2)
    dx, dw, db = _plan(x, dresidual, weight, bias_dtype, n, None, rms).backward(dy, x, weight, stats, dresidual,
                                                                               rms, bias_dtype)
    return dx, _nothing(x) if dw is None else dw, _nothing(x) if db is None else db


def _backward_fake(dy, x, weight, stats, dresidual, rms, bias_dtype):
    dw = torch.empty_like(weight) if weight is not None else _nothing(x)
    n = x.numel() // (stats.numel() // 2)
    db = x.new_empty(n, dtype=bias_dtype) if bias_dtype is not None else _nothing(x)
    return torch.empty_like(x), dw, db


def _save_for_backward(ctx, inputs, output):
    x, residual, weight, bias, n, eps, rms, stats = inputs
    y, h, saved = output
    ctx.save_for_backward(h if residual is not None else x, weight, saved)
    ctx.rms, ctx.has_residual, ctx.bias_dtype = rms, residual is not None, None if bias is None else bias.dtype
    ctx.bias_shape = None if bias is None or bias.dim() == 1 else bias.shape   # db comes flat


def _backward_rule(ctx, run_backward, dy, dh, dstats):
    x, weight, stats = ctx.saved_tensors
    if dy is None:   # only the new residual h reached the loss
        dy = torch.zeros_like(x)
    dresidual = dh.contiguous() if ctx.has_residual and dh is not None else None
    dx, dw, db = run_backward(dy, x, weight, stats, dresidual, ctx.rms, ctx.bias_dtype)
    if ctx.bias_dtype is None:
        db = None
    elif ctx.bias_shape is not None:
        db = db.view(ctx.bias_shape)
    return dx, dx if ctx.has_residual else None, dw if weight is not None else None, db, None, None, None, None


_norm_rows = KernelOp("norm_rows", forward=_forward, forward_fake=_forward_fake, backward=_backward,
                      backward_fake=_backward_fake, setup_context=_save_for_backward, backward_rule=_backward_rule,
                      plan=lambda x, residual, weight, bias, n, eps, rms, stats: _plan(
                          x, residual, weight, None if bias is None else bias.dtype, n, eps, rms),
                      public_name=lambda args: "add_rms_norm" if args[1] is not None else
                      "rms_norm" if args[6] else "layer_norm",
                      # everything the entry points' checks look at
                      signature=lambda op, x, normalized_shape, residual, weight, bias, eps, backend: (
                          op, type(x), x.shape, x.stride(), x.dtype, x.device, normalized_shape, tensor_key(residual),
                          tensor_key(weight), tensor_key(bias), eps, type(eps), backend))


# --------------------------------------------------------------------------- entry points

def _normalized_size(op: str, x: torch.Tensor, normalized_shape) -> tuple[tuple[int, ...], int]:
    shape = (normalized_shape,) if isinstance(normalized_shape, numbers.Integral) else normalized_shape
    if isinstance(shape, (str, bytes)):
        shape = None
    try:
        shape = tuple(int(s) for s in shape)
    except TypeError:
        raise TypeError(f"{op}: normalized_shape must be an int or a sequence of ints, "
                        f"got {type(normalized_shape).__name__}") from None
    if not shape or len(shape) > x.dim() or tuple(x.shape[x.dim() - len(shape):]) != shape:
        raise ValueError(f"{op}: normalized_shape {list(shape)} must be the trailing dimensions of x, "
                         f"whose shape is {list(x.shape)}")
    return shape, math.prod(shape)


def _check_parameter(op: str, name: str, p, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    if p is None:
        return
    if not isinstance(p, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor or None, got {type(p).__name__}")
    if tuple(p.shape) != shape:
        raise ValueError(f"{op}: {name} must have shape {list(shape)} (normalized_shape), got {list(p.shape)}")
    if p.device != x.device:
        raise ValueError(f"{op}: {name} is on {p.device} but x is on {x.device}")
    if p.dtype not in DTYPES:
        raise TypeError(f"{op}: {name} must be float32, float16 or bfloat16, got {p.dtype}")


def _check_eps(op: str, eps) -> None:
    if isinstance(eps, bool) or not isinstance(eps, numbers.Real) or not eps >= 0:
        raise ValueError(f"{op}: eps must be a number >= 0, got {eps!r}")


def _run(key, x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor | None,
         bias: torch.Tensor | None, n: int, eps: float, rms: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(normalized, h) for checked arguments. A call whose tensors the kernels take as they are leaves its plan
    under `key`, so that the next call with this signature goes from the entry point straight to it."""
    as_given = (x, residual, weight, bias)
    x, residual, weight, bias = (None if t is None else t.contiguous() for t in as_given)
    grad = wants_grad(*as_given)
    keep = all(a is b for a, b in zip(as_given, (x, residual, weight, bias)))
    y, h, _ = _norm_rows.call(key, keep, grad, x, residual, weight, bias, n, eps, rms, grad)
    return y, h


def _run_plan(plan: NormPlan, x, residual, weight, bias):
    """A call whose signature has a plan: checked before, nothing to reshape."""
    grad = torch.is_grad_enabled() and (x.requires_grad or (residual is not None and residual.requires_grad)
                                        or (weight is not None and weight.requires_grad)
                                        or (bias is not None and bias.requires_grad))
    return _norm_rows.eager(plan, grad, x, residual, weight, bias, plan.n, plan.eps, plan.rms, grad)


def _normalized(op: str, x, normalized_shape, weight, bias, eps, backend):
    """layer_norm's and rms_norm's entry point (rms_norm: no bias, and eps None is float32's epsilon): the plan
    of an earlier call with this signature, else the arguments checked and the call routed by its backend."""
    rms = op == "rms_norm"
    key, plan = _norm_rows.seen(op, x, normalized_shape, None, weight, bias, eps, backend)
    if plan is not None:
        return _run_plan(plan, x, None, weight, bias)[0]
    backend = choose_backend(op, x, backend, BACKENDS)
    shape, n = _normalized_size(op, x, normalized_shape)
    _check_parameter(op, "weight", weight, x, shape)
    if not rms:
        _check_parameter(op, "bias", bias, x, shape)
    if eps is not None or not rms:
        _check_eps(op, eps)
    done = torch_route(backend, F.rms_norm, x, shape, weight, eps, nothing_to_launch=x.numel() == 0) if rms else \
        torch_route(backend, F.layer_norm, x, shape, weight, bias, eps, nothing_to_launch=x.numel() == 0)
    if done is not None:
        return done
    return _run(key, x, None, weight, bias, n, DEFAULT_RMS_EPS if eps is None else float(eps), rms)[0]


@replayed_entry
def layer_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, eps: float = 1e-5, *, backend: str | None = None) -> torch.Tensor:
    """layer_norm with torch.nn.functional.layer_norm's signature and meaning.

    backend: "triton" (the default on CUDA), "torch" (F.layer_norm; the default on CPU), "compile".
    The result has x's dtype; statistics are fp32. weight and bias may have another float dtype than x
    (their gradients keep it).
    """
    return _normalized("layer_norm", x, normalized_shape, weight, bias, eps, backend)


@replayed_entry
def rms_norm(x: torch.Tensor, normalized_shape, weight: torch.Tensor | None = None, eps: float | None = None,
             *, backend: str | None = None) -> torch.Tensor:
    """rms_norm with torch.nn.functional.rms_norm's signature and meaning (eps=None: float32's epsilon, which
    is what torch takes for fp16 and bf16 inputs too: the epsilon of the type the math runs in).

    backend: "triton" (the default on CUDA), "torch" (F.rms_norm; the default on CPU), "compile".
    """
    return _normalized("rms_norm", x, normalized_shape, weight, None, eps, backend)


@replayed_entry
def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor | None = None,
                 eps: float | None = None, *, backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x + residual), x + residual) over the last dimension, in one pass: the pre-norm transformer's
    "add the block's output to the residual stream, normalize it for the next block".

    Returns (normalized, new residual), both of x's shape and dtype. residual must match x in shape, dtype
    and device. backend: as rms_norm ("torch" is add_rms_norm_reference).
    """
    key, plan = _norm_rows.seen("add_rms_norm", x, None, residual, weight, None, eps, backend)
    if plan is not None:
        return _run_plan(plan, x, residual, weight, None)[:2]
    backend = choose_backend("add_rms_norm", x, backend, BACKENDS)
    if not isinstance(residual, torch.Tensor):
        raise TypeError(f"add_rms_norm: residual must be a torch.Tensor, got {type(residual).__name__}")
    if residual.shape != x.shape or residual.dtype != x.dtype or residual.device != x.device:
        raise ValueError(f"add_rms_norm: residual must match x in shape, dtype and device: x is "
                         f"{list(x.shape)} {x.dtype} on {x.device}, residual {list(residual.shape)} "
                         f"{residual.dtype} on {residual.device}")
    if x.dim() == 0:
        raise ValueError("add_rms_norm: x must have at least one dimension (it normalizes the last)")
    shape, n = (x.shape[-1],), x.shape[-1]
    _check_parameter("add_rms_norm", "weight", weight, x, shape)
    if eps is not None:
        _check_eps("add_rms_norm", eps)
    done = torch_route(backend, add_rms_norm_reference, x, residual, weight, eps, nothing_to_launch=x.numel() == 0)
    if done is not None:
        return done
    return _run(key, x, residual, weight, None, n, DEFAULT_RMS_EPS if eps is None else float(eps), True)
