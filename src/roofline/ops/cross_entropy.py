"""cross_entropy over class logits: reference, Triton kernels, registration and autograd, entry point.

    loss_i = (1 - eps) (lse_i - x_i[t_i]) + eps (lse_i - mean_j x_ij),     lse_i = log sum_j exp(x_ij)
    d loss_i / d x_ij = softmax(x_i)_j - (1 - eps) [j = t_i] - eps / V

(eps is label_smoothing, V the number of classes; rows whose target is ignore_index count for nothing.)

The language-model loss: [tokens x vocabulary] logits, 2 GB at 8192 x 128256 in bf16. In eager PyTorch the
loss and its gradient materialize fp32 log-probabilities and several logits-sized temporaries. Here the
gradient is computed during the forward pass, while each row is on chip, and written once into a buffer of
the logits' size and dtype: that buffer is the only extra memory. The backward pass only multiplies it by
the incoming gradient, in place, and skips every row where that is 1 (the loss.backward() of training),
deciding on the device, without a host sync.

Each program walks rows (a persistent grid, one program per SM): a first pass over a row keeps a running
max and sum of exponentials; a second pass, from the row's end back to its start, writes the gradient. A
program's row is 256 KB at V = 128256 in bf16, so the rows in flight fit in L2 and the second pass reads
mostly from it: HBM sees the logits about once and the gradient once.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from roofline.ops._common import (choose_backend, converted, hand_on_later, handed_on, next_power_of_2,
                                  resident_programs, tl, triton)
from roofline.ops._eager_node import host_step, replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp, torch_route
from roofline.ops._target_check import poll_targets, target_checks
from roofline.ops.softmax import LOG2E, _row_max_and_sum

BACKENDS = ("torch", "triton", "compile")
REDUCTIONS = ("mean", "sum", "none")
# One program of 32 warps per SM, 16 elements per thread per step: the fastest of the configurations tried on
# the H100 at [8192 x 128256] bf16 (8 to 32 warps, blocks of 4096 to 16384, 1 or 2 programs per SM, Triton
# loop pipelining of 1 to 4 stages, L2 eviction hints; benchmarks/tune_ops.py, results in
# benchmarks/results/h100-tune.md). There the forward kernel takes little more than the time of one read of the
# logits and one write of the gradient at the measured copy bandwidth (run 8 of that file). It was issue-bound
# until the first pass kept a lane's online softmax over 16-byte chunks and the second folded the gradient's
# scale into the exponent and compared offsets with the target only in the target's block: 26 instructions an
# element down to 14 (benchmarks/sass_loops.py).
BLOCK = 16384           # elements of a row per step
PROGRAMS_PER_SM = 1     # resident rows per SM: more would push the second pass's reads out of L2
NUM_WARPS = 32
STATS_BLOCK = 1024      # targets per step of a program's count, and losses per step of a program's sum
# Logits up to this size are done by one program in one launch (counts, losses, gradient, reduction), larger ones
# up to SPREAD_BYTES by one launch of many programs (SPREAD: each counts the targets itself, the last to finish
# sums the losses), larger still by three launches (count, rows, sum), whose host time the GPU's then hides (and
# the counting would be repeated by every program over ever more targets). Timed as forwards of [rows, 32768] bf16
# logits called back to back, one program is the cheapest call for small logits, since it launches least, but a
# single program streams the logits slowly (at 1 MB it is the slowest of the three), and one spread launch still
# beats three at 16 MB (measured: benchmarks/results/h100-host.md, "2026-11-26").
ALONE_BYTES = 1 << 18
SPREAD_BYTES = 1 << 25
SPREAD_ROWS = 16384   # ...and rows up to this: every program of a spread launch reads every target (128 KB of int64)


# --------------------------------------------------------------------------- reference

def cross_entropy_reference(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def _count_targets(target_ptr, rows, n, ignore_index, BLOCK: tl.constexpr):
        """(targets that are not ignore_index, those of them outside [0, n)), counted by one program."""
        offs = tl.arange(0, BLOCK)
        kept = tl.zeros([BLOCK], dtype=tl.int32)
        bad = tl.zeros([BLOCK], dtype=tl.int32)
        for start in range(0, rows, BLOCK):
            t = tl.load(target_ptr + start + offs, mask=start + offs < rows, other=ignore_index).to(tl.int64)
            counted = t != ignore_index
            kept += counted.to(tl.int32)
            bad += (counted & ((t < 0) | (t >= n))).to(tl.int32)
        return tl.sum(kept, axis=0), tl.sum(bad, axis=0)

    @triton.jit
    def _write_counts(stats_ptr, report_ptr, kept, bad):
        """stats = (kept, bad); bad to report_ptr too, where the host reads it without a copy (a slot of pinned
        host memory: roofline.ops._target_check), visible there once the store has crossed the bus."""
        tl.store(stats_ptr, kept)
        tl.store(stats_ptr + 1, bad)
        tl.atomic_xchg(report_ptr, bad, sem="release", scope="sys")

    @triton.jit
    def target_stats_kernel(target_ptr, stats_ptr, report_ptr, rows, n, ignore_index, BLOCK: tl.constexpr):
        kept, bad = _count_targets(target_ptr, rows, n, ignore_index, BLOCK)
        _write_counts(stats_ptr, report_ptr, kept, bad)

    @triton.jit
    def _sum_losses(loss_ptr, rows, BLOCK: tl.constexpr):
        """The sum of loss_ptr[:rows] (fp32), in a fixed order: the same bits from either launch that reduces.
        Read past L1 (.cg), where the other programs' losses are."""
        offs = tl.arange(0, BLOCK)
        total = tl.zeros([BLOCK], dtype=tl.float32)
        for start in range(0, rows, BLOCK):
            total += tl.load(loss_ptr + start + offs, mask=start + offs < rows, other=0.0, cache_modifier=".cg")
        return tl.sum(total, axis=0)

    @triton.jit
    def _write_gradient(x_row, grad_row, offs, n, m, log2_scaled_total, target, keep, spread,
                        MASKED: tl.constexpr, TARGET: tl.constexpr):
        """grad = softmax(x) scale - spread - keep [offs == target] at offs, from the row's max m and
        log2(sum of exponentials / scale), the scale folded into the exponent (keep and spread come scaled).
        Only the block that holds the target (TARGET) compares offsets with it. The logits are read for the
        last time, the gradient is not read again: neither should hold on to L2 (eviction hints)."""
        if MASKED:
            mask = offs < n
            x = tl.load(x_row + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        else:
            x = tl.load(x_row + offs, eviction_policy="evict_first")
        # (x - m) first: exact near the max, where x - (m + log_total) would round at |x| ~ 1e4
        g = tl.exp2((x.to(tl.float32) - m) * LOG2E - log2_scaled_total) - spread
        if TARGET:
            g -= tl.where(offs == target, keep, 0.0)
        g = converted(g, grad_row.dtype.element_ty)
        if MASKED:
            tl.store(grad_row + offs, g, mask=mask, eviction_policy="evict_first")
        else:
            tl.store(grad_row + offs, g, eviction_policy="evict_first")

    @triton.jit
    def cross_entropy_forward_kernel(x_ptr, target_ptr, loss_ptr, grad_ptr, stats_ptr, report_ptr, out_ptr,
                                     ticket_ptr, rows, n, ignore_index, smoothing, GRAD: tl.constexpr,
                                     MEAN: tl.constexpr, SMOOTH: tl.constexpr, ALONE: tl.constexpr,
                                     SPREAD: tl.constexpr, REDUCE: tl.constexpr, BLOCK: tl.constexpr,
                                     STATS_BLOCK: tl.constexpr):
        """Per row: the loss (fp32) and, if GRAD, d loss / d x into grad (x's dtype; it may be x itself),
        divided by the number of rows counted (stats[0]) if MEAN. A target outside [0, n) that is not
        ignore_index gives a nan loss and gradient row (no access).

        ALONE: one program does the whole call, where a small input is bound by the host's launches: it counts
        the targets into stats (and report_ptr) first, and with REDUCE sums the rows' losses as it goes (in row
        order) into loss_ptr[0], divided by the count for a mean, in loss_ptr's dtype, instead of storing them per
        row.

        SPREAD: the whole call in one launch of many programs: each counts the targets itself (program 0 writes
        the counts), and with REDUCE the program that takes the last ticket (ticket_ptr, an int32 that is 0
        before the launch and again after it) sums the stored losses into out_ptr[0], as reduce_losses_kernel
        would. Otherwise the counts come from target_stats_kernel's launch, in stats."""
        cols = tl.arange(0, BLOCK)
        whole = n // BLOCK * BLOCK
        if ALONE or SPREAD:
            kept, bad = _count_targets(target_ptr, rows, n, ignore_index, STATS_BLOCK)
            if tl.program_id(0) == 0:
                _write_counts(stats_ptr, report_ptr, kept, bad)
        else:
            kept = tl.load(stats_ptr)
        grad_scale = 1.0 / kept.to(tl.float32) if MEAN else 1.0
        loss_sum = 0.0
        for row in range(tl.program_id(0), rows, tl.num_programs(0)):
            start_of_row = tl.cast(row, tl.int64) * n
            x_row = x_ptr + start_of_row
            target = tl.load(target_ptr + row).to(tl.int64)   # as given: a huge value must not wrap into range
            ignored = target == ignore_index
            valid = (target >= 0) & (target < n)
            loss = 0.0
            if ignored:
                if GRAD:
                    for start in range(0, n, BLOCK):
                        tl.store(grad_ptr + start_of_row + start + cols, tl.zeros([BLOCK], grad_ptr.dtype.element_ty),
                                 mask=start + cols < n)
            else:
                m, total, sum_x = _row_max_and_sum(x_row, n, BLOCK, SMOOTH)
                log_total = tl.log(total)
                x_target = tl.load(x_row + target, mask=valid, other=float("nan")).to(tl.float32)
                # lse - x = (m - x) + log_total: exact near the max, where m + log_total would round at 1e4
                loss = (m - x_target) + log_total
                if SMOOTH:
                    loss = (1.0 - smoothing) * loss + smoothing * ((m - sum_x / n) + log_total)
                if GRAD:
                    # The gradient's scale (1 / rows counted, or nan for a target out of range) goes into the
                    # exponent: log2(total / scale).
                    row_scale = tl.where(valid, grad_scale, float("nan"))
                    log2_scaled_total = tl.log2(total) - tl.log2(row_scale)
                    spread = smoothing / n * row_scale if SMOOTH else 0.0
                    keep = (1.0 - smoothing) * row_scale
                    target_col = tl.where(valid, target, -1).to(tl.int32)   # a 32-bit compare per element
                    grad_row = grad_ptr + start_of_row
                    # Backwards from the row's end: the blocks read last in the first pass are the likeliest in L2.
                    if whole < n:
                        _write_gradient(x_row, grad_row, whole + cols, n, m, log2_scaled_total, target_col, keep,
                                        spread, True, True)
                    for i in range(0, whole // BLOCK):
                        start = whole - (i + 1) * BLOCK
                        if (target_col >= start) & (target_col < start + BLOCK):
                            _write_gradient(x_row, grad_row, start + cols, n, m, log2_scaled_total, target_col,
                                            keep, spread, False, True)
                        else:
                            _write_gradient(x_row, grad_row, start + cols, n, m, log2_scaled_total, target_col,
                                            keep, spread, False, False)
            if REDUCE and ALONE:
                loss_sum += loss
            else:
                tl.store(loss_ptr + row, loss)
        if REDUCE and ALONE:
            if MEAN:
                loss_sum = tl.div_rn(loss_sum, kept.to(tl.float32))
            tl.store(loss_ptr, converted(loss_sum, loss_ptr.dtype.element_ty))
        if REDUCE and SPREAD:
            tl.debug_barrier()   # every thread's losses are stored before the ticket releases them
            if tl.atomic_add(ticket_ptr, 1, sem="acq_rel") == tl.num_programs(0) - 1:
                total = _sum_losses(loss_ptr, rows, STATS_BLOCK)
                if MEAN:
                    total = tl.div_rn(total, kept.to(tl.float32))
                tl.store(out_ptr, converted(total, out_ptr.dtype.element_ty))
                tl.atomic_xchg(ticket_ptr, 0)   # for the stream's next call

    @triton.jit
    def scale_rows_kernel(grad_ptr, dloss_ptr, dloss_stride, n, BLOCK: tl.constexpr):
        """grad[row] *= dloss[row * dloss_stride], in place; nothing to do (and no traffic) where that is 1."""
        row = tl.program_id(0)
        scale = tl.load(dloss_ptr + row * dloss_stride).to(tl.float32)
        if scale != 1.0:
            cols = tl.arange(0, BLOCK)
            grad_row = grad_ptr + tl.cast(row, tl.int64) * n
            for start in range(0, n, BLOCK):
                mask = start + cols < n
                g = tl.load(grad_row + start + cols, mask=mask).to(tl.float32)
                tl.store(grad_row + start + cols, (g * scale).to(grad_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def reduce_losses_kernel(loss_ptr, stats_ptr, out_ptr, rows, MEAN: tl.constexpr, BLOCK: tl.constexpr):
        """out = the sum of the rows' losses, divided by the rows counted (stats[0]) for a mean, in out's dtype:
        one program, the rows in a fixed order (deterministic), one launch where torch would take three."""
        result = _sum_losses(loss_ptr, rows, BLOCK)
        if MEAN:
            result = tl.div_rn(result, tl.load(stats_ptr).to(tl.float32))
        tl.store(out_ptr, converted(result, out_ptr.dtype.element_ty))



class CrossEntropyPlan:
    """The launches for rows x n logits of one dtype and targets of one dtype on one device, with one
    ignore_index, reduction and label smoothing, and with or without the gradient.

    The forward returns the loss (reduced, in loss_dtype), the gradient already scaled for the reduction
    (when asked) and the targets' counts; the backward scales that gradient in place by the incoming one."""

    def __init__(self, rows: int, n: int, ignore_index: int, reduction: str, smoothing: float, grad: bool,
                 device: torch.device, loss_dtype: torch.dtype, alone: bool = False, spread: bool = False):
        self.rows, self.n, self.ignore_index, self.smoothing = rows, n, ignore_index, smoothing
        self.reduction, self.device, self.loss_dtype, self.alone = reduction, device, loss_dtype, alone
        self.spread = spread and not alone
        self.index = index = device.index if device.type == "cuda" else -1
        block = min(BLOCK, next_power_of_2(n))
        settings = dict(GRAD=grad, MEAN=reduction == "mean", SMOOTH=smoothing > 0, BLOCK=block,
                        STATS_BLOCK=STATS_BLOCK, num_warps=NUM_WARPS)
        programs = (resident_programs(rows, device, PROGRAMS_PER_SM),)
        if alone:   # one launch of one program: counts, losses, gradient and the reduction
            self.forward_launch = Launch(cross_entropy_forward_kernel, (1,), index, ALONE=True, SPREAD=False,
                                         REDUCE=reduction != "none", **settings)
        elif self.spread:   # one launch of many programs
            self.forward_launch = Launch(cross_entropy_forward_kernel, programs, index, ALONE=False, SPREAD=True,
                                         REDUCE=reduction != "none", **settings)
            self.scratch = {}   # by stream (see _scratch)
        else:
            self.stats_launch = Launch(target_stats_kernel, (1,), index, BLOCK=STATS_BLOCK)
            self.forward_launch = Launch(cross_entropy_forward_kernel, programs, index, ALONE=False, SPREAD=False,
                                         REDUCE=False, **settings)
            self.reduce_launch = Launch(reduce_losses_kernel, (1,), index, MEAN=reduction == "mean",
                                        BLOCK=STATS_BLOCK)
        self.scale_launches = {}   # by the incoming gradient's stride, which the kernel is specialized on
        self.scale_block = block
        # where the count of targets out of range goes when no check reads it (under torch.compile, in a capture)
        self.unread = torch.empty(1, device=device, dtype=torch.int32)
        # A one-launch call that reduces its losses reads its counts in registers: what it stores of them is read
        # by nobody, so it goes to the plan's words instead of a tensor allocated per call (an allocation from
        # Python is a noticeable part of a small call's host time). Calls that leave the reduction to a compiled
        # graph, or that count in a launch of their own, need their own.
        self.unread_stats = torch.empty(2, device=device, dtype=torch.int32) \
            if (alone or self.spread) and reduction != "none" else None

    def forward(self, logits, target, ignore_index, reduction, label_smoothing, grad, check_targets):
        # (host steps: a replay of the entry point takes the check's slot and the scratch anew at each call)
        report = host_step(self.report, target, check_targets)
        stats = self.unread_stats   # (rows counted, targets out of range)
        if stats is None:
            stats = torch.empty(2, device=self.device, dtype=torch.int32)
        gradient = torch.empty_like(logits) if grad else None
        pointers = logits.data_ptr() | target.data_ptr()
        reduced = self.reduction != "none"
        if self.alone or self.spread:
            if self.spread and reduced:
                ticket, losses = host_step(self._scratch)
            else:   # (stats: a word never read; the losses are the output, or stay in registers)
                ticket, losses = stats, None if reduced else torch.empty(self.rows, device=self.device,
                                                                         dtype=torch.float32)
            out = torch.empty((), device=self.device, dtype=self.loss_dtype) if reduced else losses
            self.forward_launch.for_pointers(pointers)(
                logits, target, out if losses is None else losses, out if gradient is None else gradient, stats,
                report, out, ticket, self.rows, self.n, self.ignore_index, self.smoothing)
            return out, gradient, stats
        losses = torch.empty(self.rows, device=self.device, dtype=torch.float32)
        self.count(target, stats, report, self.rows, pointers)
        # The host does not wait for the count: the kernel is safe with any target (a row whose target is out of
        # range gets nan, with no access), and the check raises at a later entry.
        self.rows_forward(logits, target, losses, gradient, stats, self.rows, pointers)
        if self.reduction == "none":
            return losses, gradient, stats   # fp32: a compiled graph reduces them
        loss = torch.empty((), device=self.device, dtype=self.loss_dtype)
        self.reduce(losses, stats, loss, self.rows)
        return loss, gradient, stats

    def _scratch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What a spread launch that reduces works in: the int32 its programs count themselves off on, 0 before the
        launch (its last program sets it back), and the rows' losses, which that program sums. One pair per stream,
        whose calls run one after another (an allocation from Python costs a call a noticeable part of torch's
        whole loss; measured: benchmarks/results/h100-host.md, "2026-11-26, later"); a fresh pair in a CUDA
        graph's capture (the ticket zeroed at every replay, in the graph's own memory)."""
        if capturing(self.device):
            return self._new_scratch()
        stream = torch._C._cuda_getCurrentStream(self.index)[0] if self.device.type == "cuda" else 0
        found = self.scratch.get(stream)
        if found is None:
            found = self.scratch[stream] = self._new_scratch()
        return found

    def _new_scratch(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.zeros(1, device=self.device, dtype=torch.int32),
                torch.empty(self.rows, device=self.device, dtype=torch.float32))

    # The three steps of a large input, which linear_cross_entropy also runs over chunks of rows: `rows` may differ
    # from the plan's (at most it, for rows_forward), and `pointers` are the inputs' data pointers or-ed together.

    def report(self, target, check_targets: bool, op: str = "cross_entropy") -> torch.Tensor:
        """Where a call's counting kernel writes its count of targets out of range: a slot that a later entry
        reads (roofline.ops._target_check), after earlier calls' counts are read (raising before this call
        launches anything); or, unchecked, a word of the plan's. A CUDA graph's capture goes unchecked: a graph
        would write the same slot at every replay."""
        if not check_targets or capturing(self.device):
            return self.unread
        return target_checks.later(op, self.device, target, self.n, self.ignore_index)

    def count(self, target, stats, report, rows: int, pointers: int) -> None:
        """stats = (targets that are not ignore_index, those outside [0, n)) over target[:rows], the second to
        `report` too."""
        self.stats_launch.for_pointers(pointers)(target, stats, report, rows, self.n, self.ignore_index)

    def rows_forward(self, logits, target, losses, gradient, stats, rows: int, pointers: int) -> None:
        """losses[:rows] and, if the plan has one, the gradient (which may be the logits themselves, overwritten),
        divided by stats[0] for a mean."""
        self.forward_launch.for_pointers(pointers)(logits, target, losses, losses if gradient is None else gradient,
                                                   stats, self.unread, losses, stats, rows, self.n,
                                                   self.ignore_index, self.smoothing)   # (counted before: none here)

    def reduce(self, losses, stats, loss, rows: int) -> None:
        """loss = the sum of losses[:rows], divided by stats[0] for a mean."""
        self.reduce_launch(losses, stats, loss, rows)

    def backward(self, gradient: torch.Tensor, dloss: torch.Tensor) -> None:
        """gradient[row] *= dloss[row] (a loss per row) or dloss (a reduced loss), in place."""
        stride = dloss.stride(0) if dloss.dim() else 0
        launch = self.scale_launches.get(stride)
        if launch is None:
            launch = self.scale_launches[stride] = Launch(scale_rows_kernel, (self.rows,), self.index,
                                                          BLOCK=self.scale_block, num_warps=8)
        launch.for_pointers(dloss.data_ptr())(gradient, dloss, stride, self.n)


def _plan_key(logits, target, ignore_index, reduction, label_smoothing, grad, check_targets=None, loss_dtype=None):
    return (*logits.shape, logits.dtype, target.dtype, logits.device, ignore_index, reduction, label_smoothing, grad,
            loss_dtype or logits.dtype)


@plan_cache("cross_entropy", key=_plan_key)
def _plan(logits, target, ignore_index, reduction, label_smoothing, grad, check_targets=None,
          loss_dtype=None) -> CrossEntropyPlan:
    rows, n = logits.shape
    size = logits.numel() * logits.element_size()
    return CrossEntropyPlan(rows, n, ignore_index, reduction, label_smoothing, grad, logits.device,
                            loss_dtype or logits.dtype, alone=size <= ALONE_BYTES,
                            spread=size <= SPREAD_BYTES and rows <= SPREAD_ROWS)


# The registered ops (torch.compile): per-row losses, the reduction left to the graph; the backward scales out of
# place there.

def _forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
             label_smoothing: float, grad: bool, check_targets: bool) -> tuple[torch.Tensor, torch.Tensor,
                                                                                torch.Tensor]:
    loss, gradient, stats = _plan(logits, target, ignore_index, reduction, label_smoothing, grad).forward(
        logits, target, ignore_index, reduction, label_smoothing, grad, check_targets)
    return loss, logits.new_empty(0) if gradient is None else gradient, stats


def _forward_fake(logits, target, ignore_index, reduction, label_smoothing, grad, check_targets):
    loss = logits.new_empty(logits.shape[0], dtype=torch.float32) if reduction == "none" else logits.new_empty(())
    gradient = torch.empty_like(logits) if grad else logits.new_empty(0)
    return loss, gradient, logits.new_empty(2, dtype=torch.int32)


def _scale_rows_(grad: torch.Tensor, dloss: torch.Tensor) -> None:
    _plan(grad, dloss, 0, "none", 0.0, True).backward(grad, dloss)


def _keep_gradient(ctx, inputs, output):
    ctx.mark_non_differentiable(*(t for t in output[1:] if t is not None))
    hand_on_later(ctx, output[1])


def _backward_rule(ctx, scale_rows_, dloss, _, __):
    if ctx.in_graph:
        # Under compile, out of place (a mutation of a saved tensor is one more thing for the graph to track).
        (gradient,) = ctx.saved_tensors
        scale = dloss if dloss.dim() else dloss.expand(gradient.shape[0])
        return (gradient * scale.to(gradient.dtype)[:, None], None, None, None, None, None, None)
    host_step(poll_targets)   # this call's targets, most likely: raised before the gradient is handed on
    (gradient,) = handed_on(ctx, "cross_entropy")
    scale_rows_(gradient, dloss)
    return gradient, None, None, None, None, None, None


_cross_entropy_rows = KernelOp(
    "cross_entropy_rows", forward=_forward, forward_fake=_forward_fake, backward=_scale_rows_,
    backward_fake=lambda grad, dloss: None, backward_mutates=("grad",), setup_context=_keep_gradient,
    backward_rule=_backward_rule, plan=_plan, public_name=lambda args: "cross_entropy",
    replay_forward=False,   # the entry point's replays serve its forwards (host steps check the targets)
    signature=lambda logits, target, ignore_index, reduction, label_smoothing, backend, check_targets: (
        type(logits), tensor_key(logits), type(target), tensor_key(target), ignore_index, type(ignore_index),
        reduction, label_smoothing, type(label_smoothing), backend, check_targets,
        torch.is_autocast_enabled(logits.device.type), logits.requires_grad and torch.is_grad_enabled()))


# --------------------------------------------------------------------------- entry point

def _check(logits, target, ignore_index, reduction, label_smoothing) -> None:
    if logits.dim() not in (1, 2):
        raise ValueError(f"cross_entropy: logits must be (N, C) or (C,), got shape {list(logits.shape)}")
    check_loss_arguments("cross_entropy", target, logits, "logits", ignore_index, reduction, label_smoothing)


def check_loss_arguments(op: str, target, scores: torch.Tensor, name: str, ignore_index, reduction: str,
                         label_smoothing) -> None:
    """The checks cross_entropy and linear_cross_entropy share: target holds a class index for each row of `scores`
    (the argument called `name`), on its device; ignore_index, reduction and label_smoothing are valid."""
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{op}: target must be a torch.Tensor of class indices, got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"{op}: target must hold class indices (an integer dtype), got {target.dtype}; "
                        "class probabilities are not supported")
    expected = list(scores.shape[:-1])
    if list(target.shape) != expected:
        raise ValueError(f"{op}: target must have shape {expected} for {name} of shape {list(scores.shape)}, got "
                         f"{list(target.shape)}")
    if target.device != scores.device:
        raise ValueError(f"{op}: target is on {target.device} but {name} is on {scores.device}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"{op}: ignore_index must be an int, got {type(ignore_index).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")

def _loss_dtype(logits: torch.Tensor) -> torch.dtype:
    """The loss's dtype: the logits', except under autocast, where torch computes cross_entropy in fp32 (it is on
    autocast's fp32 list) and returns an fp32 loss; the gradient keeps the logits' dtype either way."""
    return torch.float32 if torch.is_autocast_enabled(logits.device.type) else logits.dtype


def capturing(device: torch.device) -> bool:
    """Whether the current stream is being captured into a CUDA graph, where the targets' check, a host sync,
    cannot be: they go unchecked there, as under torch.compile."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


@replayed_entry
def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, *, backend: str | None = None,
                  check_targets: bool = True) -> torch.Tensor:
    """cross_entropy with torch.nn.functional.cross_entropy's meaning, for logits (N, C) or (C,) and target of
    class indices (no class weights, no probability targets).

    backend: "triton" (the default on CUDA), "torch" (F.cross_entropy; the default on CPU), "compile".
    The loss has the logits' dtype (math in fp32), or fp32 under autocast, as torch's. With backend="triton" the
    gradient is computed in the forward pass whenever logits requires grad. A target out of range gives its row a
    nan loss, and in eager mode raises ValueError without stopping the host: from the call's backward, the next
    call of either loss op, or roofline.ops.wait_for_target_checks() (roofline.ops._target_check). Under
    torch.compile, in a CUDA graph's capture and with check_targets=False, the nan loss is all.
    """
    key, plan = _cross_entropy_rows.seen(logits, target, ignore_index, reduction, label_smoothing, backend,
                                         check_targets)
    if plan is not None:
        return _run(plan, key[-1], logits, target, check_targets)
    backend = choose_backend("cross_entropy", logits, backend, BACKENDS, arg="logits")
    _check(logits, target, ignore_index, reduction, label_smoothing)
    done = torch_route(backend, cross_entropy_reference, logits, target, ignore_index, reduction, label_smoothing,
                       nothing_to_launch=logits.numel() == 0 or logits.dim() == 1)   # (one row: torch's own result)
    if done is not None:
        return done
    grad = logits.requires_grad and torch.is_grad_enabled()
    given = logits, target
    logits, target = logits.contiguous(), target.contiguous()
    args = (int(ignore_index), reduction, float(label_smoothing), grad)
    if torch.compiler.is_compiling():
        # No check of the targets under torch.compile (it would be a host sync in the graph): a row whose target
        # is out of range gets a nan loss and gradient instead. The reduction is plain torch ops there, and the
        # backward scales the gradient (an autograd.Function reducing the losses came out as zero gradients on
        # the GPU, not pinned down).
        losses, _, stats = _cross_entropy_rows(logits, target, *args[:1], "none", *args[2:], False)
        loss_dtype = _loss_dtype(logits)
        if reduction == "none":
            return losses.to(loss_dtype)
        total = losses.sum()
        return (total / stats[0] if reduction == "mean" else total).to(loss_dtype)
    # Eager: a target out of range is a clear error (CrossEntropyPlan.check). The kernel scales the gradient for
    # the reduction, so loss.backward() costs only the scaling by the incoming gradient, skipped on the device
    # where that is 1.
    plan = _plan(logits, target, *args, loss_dtype=_loss_dtype(logits))
    if given[0] is logits and given[1] is target:
        _cross_entropy_rows.keep(key, plan)
    return _run(plan, grad, logits, target, check_targets)


def _run(plan: CrossEntropyPlan, grad: bool, logits: torch.Tensor, target: torch.Tensor, check_targets: bool):
    loss = _cross_entropy_rows.eager(plan, grad, logits, target, plan.ignore_index, plan.reduction, plan.smoothing,
                                     grad, check_targets)[0]
    return loss.to(plan.loss_dtype) if plan.reduction == "none" else loss
