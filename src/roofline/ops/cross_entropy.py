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

import functools
import numbers

import torch
import torch.nn.functional as F

from roofline.ops._common import KernelOp, choose_backend, tl, triton
from roofline.ops.softmax import _row_max_and_sum

BACKENDS = ("torch", "triton", "compile")
REDUCTIONS = ("mean", "sum", "none")
# One program of 32 warps per SM, 16 elements per thread per step: the fastest of the configurations tried on
# the H100 at [8192 x 128256] bf16 (8 to 32 warps, blocks of 2048 to 16384, 1 to 8 programs per SM, Triton
# loop pipelining of 1 to 4 stages; benchmarks/results/h100-ops.md).
BLOCK = 16384           # elements of a row per step
PROGRAMS_PER_SM = 1     # resident rows per SM: more would push the second pass's reads out of L2
NUM_WARPS = 32
STAGES = 1              # blocks of a row whose loads are in flight at once (Triton's loop pipelining)


# --------------------------------------------------------------------------- reference

def cross_entropy_reference(logits, target, ignore_index=-100, reduction="mean", label_smoothing=0.0):
    return F.cross_entropy(logits, target, ignore_index=ignore_index, reduction=reduction,
                           label_smoothing=label_smoothing)


# --------------------------------------------------------------------------- Triton kernels

if triton is not None:

    @triton.jit
    def cross_entropy_forward_kernel(x_ptr, target_ptr, loss_ptr, grad_ptr, grad_scale_ptr, rows, n,
                                     ignore_index, smoothing, GRAD: tl.constexpr, SMOOTH: tl.constexpr,
                                     BLOCK: tl.constexpr, STAGES: tl.constexpr):
        """Per row: the loss (fp32) and, if GRAD, grad_scale * d loss / d x into grad (x's dtype).
        A target outside [0, n) that is not ignore_index gives a nan loss and gradient row (no access)."""
        cols = tl.arange(0, BLOCK)
        blocks = tl.cdiv(n, BLOCK)
        grad_scale = tl.load(grad_scale_ptr) if GRAD else 1.0
        for row in range(tl.program_id(0), rows, tl.num_programs(0)):
            start_of_row = tl.cast(row, tl.int64) * n
            x_row = x_ptr + start_of_row
            target = tl.load(target_ptr + row).to(tl.int64)   # as given: a huge value must not wrap into range
            ignored = target == ignore_index
            valid = (target >= 0) & (target < n)
            if ignored:
                tl.store(loss_ptr + row, 0.0)
                if GRAD:
                    for start in range(0, n, BLOCK):
                        tl.store(grad_ptr + start_of_row + start + cols, tl.zeros([BLOCK], grad_ptr.dtype.element_ty),
                                 mask=start + cols < n)
            else:
                m, total, sum_x = _row_max_and_sum(x_row, n, BLOCK, SMOOTH, STAGES)
                log_total = tl.log(total)
                x_target = tl.load(x_row + target, mask=valid, other=float("nan")).to(tl.float32)
                # lse - x = (m - x) + log_total: exact near the max, where m + log_total would round at 1e4
                loss = (m - x_target) + log_total
                if SMOOTH:
                    loss = (1.0 - smoothing) * loss + smoothing * ((m - sum_x / n) + log_total)
                tl.store(loss_ptr + row, loss)
                if GRAD:
                    spread = smoothing / n if SMOOTH else 0.0
                    bad = tl.where(valid, 0.0, float("nan"))
                    for i in tl.range(0, blocks, num_stages=STAGES):   # backwards: the row's last blocks are the likeliest in L2
                        offs = (blocks - 1 - i) * BLOCK + cols
                        mask = offs < n
                        x = tl.load(x_row + offs, mask=mask, other=0.0).to(tl.float32)
                        g = tl.exp((x - m) - log_total) - spread - tl.where(offs == target, 1.0 - smoothing, 0.0) + bad
                        tl.store(grad_ptr + start_of_row + offs, (g * grad_scale).to(grad_ptr.dtype.element_ty),
                                 mask=mask)

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


def _programs(rows: int, device: torch.device) -> int:
    if device.type != "cuda":
        return min(rows, 3)   # the interpreter: a few programs, so the tests walk several rows each
    return min(rows, PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count)


# The forward returns the per-row losses and, when asked, the gradient already scaled for the reduction; the
# backward scales that gradient in place by the incoming one.

def _forward(logits: torch.Tensor, target: torch.Tensor, ignore_index: int, reduction: str,
                        label_smoothing: float, grad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows, n = logits.shape
    losses = torch.empty(rows, device=logits.device, dtype=torch.float32)
    gradient = torch.empty_like(logits) if grad else logits.new_empty(0)
    if reduction == "mean":   # d mean / d loss_i = 1 / (rows not ignored): counted on the device
        grad_scale = 1.0 / (target != ignore_index).sum(dtype=torch.float32)
    else:
        grad_scale = torch.ones((), device=logits.device)
    cross_entropy_forward_kernel[(_programs(rows, logits.device),)](
        logits, target, losses, gradient, grad_scale, rows, n, ignore_index, label_smoothing,
        GRAD=grad, SMOOTH=label_smoothing > 0, BLOCK=min(BLOCK, triton.next_power_of_2(n)), STAGES=STAGES,
        num_warps=NUM_WARPS)
    return losses, gradient


def _forward_fake(logits, target, ignore_index, reduction, label_smoothing, grad):
    losses = logits.new_empty(logits.shape[0], dtype=torch.float32)
    return losses, torch.empty_like(logits) if grad else logits.new_empty(0)


def _scale_rows_(grad: torch.Tensor, dloss: torch.Tensor) -> None:
    rows, n = grad.shape
    dloss_stride = dloss.stride(0) if dloss.dim() else 0   # 0 for a mean's or sum's gradient, expanded
    scale_rows_kernel[(rows,)](grad, dloss, dloss_stride, n, BLOCK=min(BLOCK, triton.next_power_of_2(n)),
                               num_warps=8)




def _keep_gradient(ctx, inputs, output):
    # Held on ctx, not saved for backward, so that the backward can let go of it: autograd then moves the
    # buffer into logits.grad instead of copying it (a saved tensor is still referenced, so it would copy).
    # Marked non-differentiable, so holding it makes no reference cycle through the graph.
    ctx.mark_non_differentiable(output[1])
    ctx.gradient = output[1]


def _backward_rule(ctx, scale_rows_, dlosses, _):
    gradient = getattr(ctx, "gradient", None)
    if gradient is None:
        raise RuntimeError("cross_entropy(backend='triton') wrote its gradient during the forward pass and "
                           "hands that buffer on: a second backward through the same forward (retain_graph=True) "
                           "is not supported; use backend='torch' for that")
    del ctx.gradient
    scale_rows_(gradient, dlosses)
    return gradient, None, None, None, None, None


_cross_entropy_rows = KernelOp(
    "cross_entropy_rows", forward=_forward, forward_fake=_forward_fake, backward=_scale_rows_,
    backward_fake=lambda grad, dloss: None, backward_mutates=("grad",), setup_context=_keep_gradient,
    backward_rule=_backward_rule)


class _ReduceLosses(torch.autograd.Function):
    """The reduction of the per-row losses, whose backward hands the incoming gradient to the rows unchanged:
    the forward kernel already scaled the gradient for the reduction."""

    @staticmethod
    def forward(ctx, losses, target, ignore_index, reduction, dtype):
        ctx.rows = losses.shape[0]
        if reduction == "none":
            return losses.to(dtype)
        total = losses.sum()
        if reduction == "mean":
            total = total / (target != ignore_index).sum()
        return total.to(dtype)

    @staticmethod
    def backward(ctx, dloss):
        return dloss.float().expand(ctx.rows) if dloss.dim() == 0 else dloss.float(), None, None, None, None


# --------------------------------------------------------------------------- entry point

@functools.cache
def _compiled():
    return torch.compile(cross_entropy_reference)


def _check(logits, target, ignore_index, reduction, label_smoothing) -> None:
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"cross_entropy: target must be a torch.Tensor of class indices, got {type(target).__name__}")
    if target.is_floating_point() or target.is_complex() or target.dtype == torch.bool:
        raise TypeError(f"cross_entropy: target must hold class indices (an integer dtype), got {target.dtype}; "
                        "class probabilities are not supported")
    if logits.dim() not in (1, 2):
        raise ValueError(f"cross_entropy: logits must be (N, C) or (C,), got shape {list(logits.shape)}")
    expected = list(logits.shape[:-1])
    if list(target.shape) != expected:
        raise ValueError(f"cross_entropy: target must have shape {expected} for logits of shape "
                         f"{list(logits.shape)}, got {list(target.shape)}")
    if target.device != logits.device:
        raise ValueError(f"cross_entropy: target is on {target.device} but logits is on {logits.device}")
    if isinstance(ignore_index, bool) or not isinstance(ignore_index, numbers.Integral):
        raise TypeError(f"cross_entropy: ignore_index must be an int, got {type(ignore_index).__name__}")
    if reduction not in REDUCTIONS:
        raise ValueError(f"cross_entropy: reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, numbers.Real) \
            or not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be a number in [0, 1], got {label_smoothing!r}")


def _check_target_range(target: torch.Tensor, classes: int, ignore_index: int) -> None:
    """A clear error for a target outside [0, classes) in eager mode. It costs one device-to-host sync; under
    torch.compile the check is skipped and such a row gets a nan loss and gradient instead."""
    if torch.compiler.is_compiling() or target.numel() == 0:
        return
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    if bad.any():
        index = int(bad.nonzero()[0, 0]) if target.dim() else 0
        value = int(target.reshape(-1)[index])
        raise ValueError(f"cross_entropy: target[{index}] = {value} is not a class index in [0, {classes}) "
                         f"and not ignore_index ({ignore_index})")


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, ignore_index: int = -100, reduction: str = "mean",
                  label_smoothing: float = 0.0, *, backend: str | None = None,
                  check_targets: bool = True) -> torch.Tensor:
    """cross_entropy with torch.nn.functional.cross_entropy's meaning, for logits (N, C) or (C,) and target of
    class indices (no class weights, no probability targets).

    backend: "triton" (the default on CUDA), "torch" (F.cross_entropy; the default on CPU), "compile".
    The loss has the logits' dtype (math in fp32). With backend="triton" the gradient is computed in the
    forward pass whenever logits requires grad; a target out of range raises ValueError in eager mode (one
    host sync) and gives a nan loss under torch.compile.
    """
    backend = choose_backend("cross_entropy", logits, backend, BACKENDS, arg="logits")
    _check(logits, target, ignore_index, reduction, label_smoothing)
    if backend == "torch":
        return cross_entropy_reference(logits, target, ignore_index, reduction, label_smoothing)
    if backend == "compile":
        return _compiled()(logits, target, ignore_index, reduction, label_smoothing)
    if logits.numel() == 0 or logits.dim() == 1:   # nothing to launch for, or one row: torch's own result
        return cross_entropy_reference(logits, target, ignore_index, reduction, label_smoothing)
    if check_targets:
        _check_target_range(target, logits.shape[1], ignore_index)
    grad = logits.requires_grad and torch.is_grad_enabled()
    losses, _ = _cross_entropy_rows(logits.contiguous(), target.contiguous(), int(ignore_index), reduction,
                                    float(label_smoothing), grad)
    return _ReduceLosses.apply(losses, target, ignore_index, reduction, logits.dtype)
