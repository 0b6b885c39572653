"""linear_cross_entropy: a language model's head (x W^T + b) and its cross-entropy loss, fused so that the
[tokens x vocabulary] logits are never held whole.

    loss = cross_entropy(x W^T + b, target)        x [..., H], W [V, H] (nn.Linear's layout), b [V], target [...]

At 8192 tokens x 4096 hidden x 128256 classes in bf16, the logits are 2 GB, and eager PyTorch holds them, an fp32
copy, its log-softmax and their gradients at once (11.8 GiB beyond the inputs; measured:
benchmarks/results/h100-linear-cross-entropy.md). Here the rows go through in chunks of CHUNK_BYTES of logits. Per
chunk, when a gradient is wanted:

    logits = x_c W^T (+ b)                          cuBLAS, into one chunk-sized buffer reused by every chunk
    loss rows, d loss / d logits                    cross_entropy's forward kernel, the gradient written over the
                                                    logits in place (each element read, then overwritten)
    dx_c = G W,  dW += G^T x_c,  db += sum_rows G   cuBLAS, accumulating dW in its own dtype

so the forward pass computes every gradient, and the backward only scales them by the incoming gradient, in place
and on the device only where that is not 1 (the loss.backward() of training costs nothing). A mean divides by the
count of targets over all rows, made before the first chunk. The extra memory is dW and dx (which any method
returns) and one chunk of logits: 1.3 GiB at that shape.

reduction="none" cannot scale dW by a gradient per row after the fact: its forward computes the losses only, and
its backward recomputes each chunk's logits (four matmuls instead of three).
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F

from roofline.ops._common import choose_backend, hand_on_later, handed_on
from roofline.ops._eager_node import host_step
from roofline.ops._launch import plan_cache
from roofline.ops._runtime import KernelOp, torch_route
from roofline.ops._target_check import poll_targets
from roofline.ops.cross_entropy import CrossEntropyPlan, _scale_rows_, check_loss_arguments

BACKENDS = ("torch", "triton", "compile")
CHUNK_BYTES = 256 << 20   # logits of one chunk of rows: 1024 rows at 128256 classes in bf16
CHUNK_ALIGN = 128         # rows per chunk a multiple of it: whole 128-row GEMM tiles, and aligned targets


def linear_cross_entropy_reference(x, weight, target, bias=None, ignore_index=-100, label_smoothing=0.0,
                                   reduction="mean"):
    logits = F.linear(x, weight, bias)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=ignore_index,
                           reduction=reduction, label_smoothing=label_smoothing)
    # a reduced loss as cross_entropy gives it, no view of it: FSDP2 warns of a module returning a view
    return loss.reshape(target.shape) if reduction == "none" else loss


def chunk_rows_for(classes: int, element_size: int, rows: int) -> int:
    """Rows per chunk: CHUNK_BYTES of logits, a multiple of CHUNK_ALIGN, at least CHUNK_ALIGN, at most `rows`."""
    per_chunk = max(CHUNK_ALIGN, CHUNK_BYTES // (classes * element_size) // CHUNK_ALIGN * CHUNK_ALIGN)
    return min(rows, per_chunk)


def _scale_gradients_(dx: torch.Tensor, dw: torch.Tensor, db: torch.Tensor, dloss: torch.Tensor) -> None:
    """Each gradient computed in the forward pass times the reduced loss's incoming gradient, in place (nothing to
    do, on the device, where that is 1); empty ones are the gradients not wanted."""
    for gradient in (dx, dw, db):
        if gradient.numel():
            _scale_rows_(gradient.view(-1, gradient.shape[-1]), dloss)


class LinearCrossEntropyPlan:
    """The chunks of one call signature: rows x hidden inputs, `classes` rows of W, one dtype and device, one
    ignore_index, reduction and label smoothing, and which gradients are wanted."""

    def __init__(self, rows: int, classes: int, chunk: int, ignore_index: int, reduction: str, smoothing: float,
                 grads: tuple[bool, bool, bool], device: torch.device, loss_dtype: torch.dtype):
        self.rows, self.classes, self.chunk, self.reduction, self.grads = rows, classes, chunk, reduction, grads
        self.ignore_index, self.device = ignore_index, device
        # Gradients in the forward pass, except for reduction="none" (see the module's docstring).
        self.in_forward = reduction != "none" and any(grads)
        self.ce = CrossEntropyPlan(chunk, classes, ignore_index, reduction, smoothing, self.in_forward, device,
                                   loss_dtype)
        self.ce_backward = None
        if reduction == "none" and any(grads):   # the backward's: gradients of the per-row losses, unscaled
            self.ce_backward = CrossEntropyPlan(chunk, classes, ignore_index, "none", smoothing, True, device,
                                                loss_dtype)

    backward = staticmethod(_scale_gradients_)

    def forward(self, x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_w, grad_b,
                check_targets, chunk_rows):
        report = self.ce.report(target, check_targets, "linear_cross_entropy")
        stats = torch.empty(2, device=self.device, dtype=torch.int32)   # (rows counted, targets out of range)
        losses = torch.empty(self.rows, device=self.device, dtype=torch.float32)
        self.ce.count(target, stats, report, self.rows, target.data_ptr())
        gradients = _gradient_buffers(x, weight, bias, self.grads if self.in_forward else (False,) * 3)
        self._chunks(self.ce, x, weight, bias, target, stats, losses, gradients)
        if self.reduction == "none":
            loss = losses
        else:
            loss = torch.empty((), device=self.device, dtype=self.ce.loss_dtype)
            self.ce.reduce(losses, stats, loss, self.rows)
        return (loss, *_outputs(x, gradients, bias))

    def recompute(self, dloss, x, weight, bias, target):
        """(dx, dW, db) of reduction="none" for the per-row incoming gradient dloss, from the logits recomputed."""
        stats = torch.empty(2, device=self.device, dtype=torch.int32)
        losses = torch.empty(self.rows, device=self.device, dtype=torch.float32)
        self.ce.count(target, stats, self.ce.unread, self.rows, target.data_ptr())
        gradients = _gradient_buffers(x, weight, bias, self.grads)
        self._chunks(self.ce_backward, x, weight, bias, target, stats, losses, gradients, dloss)
        return _outputs(x, gradients, bias)

    def _chunks(self, ce, x, weight, bias, target, stats, losses, gradients, dloss=None):
        """Per chunk of rows: the logits, the losses, and where `gradients` holds buffers, the logits' gradient in
        their place (scaled by dloss's rows if given) and its products into those buffers."""
        # The inputs come in the dtype to multiply in; and the matmuls are the op's kernels, which autograd must not
        # record (the eager node's forward runs in grad mode, as the op's caller does).
        with torch.autocast(self.device.type, enabled=False), torch.no_grad():
            self._each_chunk(ce, x, weight, bias, target, stats, losses, gradients, dloss)

    def _each_chunk(self, ce, x, weight, bias, target, stats, losses, gradients, dloss):
        dx, dw, db = gradients
        logits = torch.empty(min(self.chunk, self.rows), self.classes, device=self.device, dtype=x.dtype)
        weight_t = weight.t()
        for start in range(0, self.rows, self.chunk):
            end = min(start + self.chunk, self.rows)
            x_chunk, rows = x[start:end], end - start
            chunk_logits = logits[:rows]
            if bias is None:
                torch.mm(x_chunk, weight_t, out=chunk_logits)
            else:
                torch.addmm(bias, x_chunk, weight_t, out=chunk_logits)
            gradient = chunk_logits if (dx is not None or dw is not None or db is not None) else None
            ce.rows_forward(chunk_logits, target[start:end], losses[start:end], gradient, stats, rows,
                            target.data_ptr() | x.data_ptr())
            if gradient is None:
                continue
            if dloss is not None:
                _scale_rows_(gradient, dloss[start:end])
            if dx is not None:
                torch.mm(gradient, weight, out=dx[start:end])
            if dw is not None:
                if start == 0:
                    torch.mm(gradient.t(), x_chunk, out=dw)
                else:
                    dw.addmm_(gradient.t(), x_chunk)
            if db is not None:
                db += gradient.sum(0, dtype=torch.float32)



def _gradient_buffers(x, weight, bias, grads):
    """(dx, dW, db) to fill, None where not wanted; db accumulates in fp32."""
    grad_x, grad_w, grad_b = grads
    return (torch.empty_like(x) if grad_x else None, torch.empty_like(weight) if grad_w else None,
            torch.zeros(weight.shape[0], device=weight.device, dtype=torch.float32) if grad_b and bias is not None
            else None)


def _outputs(x, gradients, bias):
    """The gradients as the op returns them: an empty tensor where there is none, db in the bias's dtype."""
    dx, dw, db = gradients
    return (x.new_empty(0) if dx is None else dx, x.new_empty(0) if dw is None else dw,
            x.new_empty(0) if db is None else db.to(bias.dtype))


def _plan_key(x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_w, grad_b,
              check_targets=None, chunk_rows=0):
    rows, classes = x.shape[0], weight.shape[0]
    chunk = chunk_rows or chunk_rows_for(classes, x.element_size(), rows)
    return (rows, x.shape[1], classes, x.dtype, target.dtype, x.device, bias is not None, ignore_index, reduction,
            label_smoothing, (grad_x, grad_w, grad_b and bias is not None), chunk, _loss_dtype(x))


@plan_cache("linear_cross_entropy", key=_plan_key)
def _plan(x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_w, grad_b,
          check_targets=None, chunk_rows=0) -> LinearCrossEntropyPlan:
    rows, classes = x.shape[0], weight.shape[0]
    chunk = chunk_rows or chunk_rows_for(classes, x.element_size(), rows)
    return LinearCrossEntropyPlan(rows, classes, chunk, ignore_index, reduction, label_smoothing,
                                  (grad_x, grad_w, grad_b and bias is not None), x.device, _loss_dtype(x))


def _loss_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float32 if torch.is_autocast_enabled(x.device.type) else x.dtype


# --------------------------------------------------------------------------- registration

def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, target: torch.Tensor,
             ignore_index: int, reduction: str, label_smoothing: float, grad_x: bool, grad_w: bool, grad_b: bool,
             check_targets: bool, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    args = (x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_w, grad_b,
            check_targets, chunk_rows)
    return _plan(*args).forward(*args)


def _forward_fake(x, weight, bias, target, ignore_index, reduction, label_smoothing, grad_x, grad_w, grad_b,
                  check_targets, chunk_rows):
    loss = x.new_empty(x.shape[0], dtype=torch.float32) if reduction == "none" else x.new_empty(())
    in_forward = reduction != "none"
    return (loss, torch.empty_like(x) if grad_x and in_forward else x.new_empty(0),
            torch.empty_like(weight) if grad_w and in_forward else x.new_empty(0),
            torch.empty_like(bias) if grad_b and in_forward and bias is not None else x.new_empty(0))


@torch.library.custom_op("roofline::linear_cross_entropy_recompute", mutates_args=())
def _recompute(dloss: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
               target: torch.Tensor, ignore_index: int, label_smoothing: float, grad_x: bool, grad_w: bool,
               grad_b: bool, chunk_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    plan = _plan(x, weight, bias, target, ignore_index, "none", label_smoothing, grad_x, grad_w, grad_b,
                 chunk_rows=chunk_rows)
    return plan.recompute(dloss, x, weight, bias, target)


@_recompute.register_fake
def _recompute_fake(dloss, x, weight, bias, target, ignore_index, label_smoothing, grad_x, grad_w, grad_b,
                    chunk_rows):
    return (torch.empty_like(x) if grad_x else x.new_empty(0), torch.empty_like(weight) if grad_w else x.new_empty(0),
            torch.empty_like(bias) if grad_b and bias is not None else x.new_empty(0))


def _setup_context(ctx, inputs, output):
    x, weight, bias, target, ignore_index, reduction, smoothing, grad_x, grad_w, grad_b, _, chunk_rows = inputs
    ctx.reduction, ctx.wanted = reduction, (grad_x, grad_w, grad_b and bias is not None)
    if reduction == "none":
        ctx.save_for_backward(x, weight, bias, target)
        ctx.options = ignore_index, smoothing, grad_x, grad_w, grad_b, chunk_rows
        return
    ctx.mark_non_differentiable(*output[1:])
    hand_on_later(ctx, *output[1:])


def _backward_rule(ctx, scale_, dloss, *_):
    if not ctx.in_graph:
        host_step(poll_targets)   # this call's targets, most likely: raised before the gradients are handed on
    if ctx.reduction == "none":
        x, weight, bias, target = ctx.saved_tensors
        if ctx.in_graph:
            gradients = _recompute(dloss, x, weight, bias, target, *ctx.options)
        else:
            gradients = ctx.plan.recompute(dloss.contiguous(), x, weight, bias, target)
    elif ctx.in_graph:
        gradients = tuple(g * dloss.to(g.dtype) for g in ctx.saved_tensors)
    else:
        gradients = handed_on(ctx, "linear_cross_entropy")
        scale_(*gradients, dloss)
    return (*(g if wanted else None for g, wanted in zip(gradients, ctx.wanted)),) + (None,) * 9


_linear_cross_entropy = KernelOp(
    "linear_cross_entropy", forward=_forward, forward_fake=_forward_fake, backward=_scale_gradients_,
    backward_fake=lambda dx, dw, db, dloss: None, backward_mutates=("dx", "dw", "db"),
    setup_context=_setup_context, backward_rule=_backward_rule, plan=_plan,
    replay_forward=False)   # its forward checks the targets (_target_check), reading and raising on the host


# --------------------------------------------------------------------------- entry point

def _check(x, weight, target, bias, ignore_index, reduction, label_smoothing, chunk_rows) -> None:
    name = "linear_cross_entropy"
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise TypeError(f"{name}: weight must be a 2-d torch.Tensor [classes, hidden], got "
                        f"{list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"{name}: x's last dimension must be weight's hidden size {weight.shape[1]}, got x of shape "
                         f"{list(x.shape)}")
    # under autocast the matmuls run in its dtype whatever x's and weight's are (as F.linear's): FSDP2 keeps the
    # weights in bf16 while a norm before the head gives fp32
    autocast = x.device.type in ("cuda", "cpu") and torch.is_autocast_enabled(x.device.type)
    if (weight.dtype != x.dtype and not autocast) or weight.device != x.device:
        raise ValueError(f"{name}: weight must have x's dtype and device ({x.dtype} on {x.device}), got "
                         f"{weight.dtype} on {weight.device}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or list(bias.shape) != [weight.shape[0]]
                             or (bias.dtype != x.dtype and not autocast) or bias.device != x.device):
        raise ValueError(f"{name}: bias must be None or a tensor of shape [{weight.shape[0]}] with x's dtype and "
                         f"device, got {bias if not isinstance(bias, torch.Tensor) else (list(bias.shape), bias.dtype)}")
    check_loss_arguments(name, target, x, "x", ignore_index, reduction, label_smoothing)
    if chunk_rows is not None and (isinstance(chunk_rows, bool) or not isinstance(chunk_rows, numbers.Integral)
                                   or chunk_rows < 1):
        raise ValueError(f"{name}: chunk_rows must be None or a positive int, got {chunk_rows!r}")


def linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, bias: torch.Tensor | None = None,
                         ignore_index: int = -100, label_smoothing: float = 0.0, reduction: str = "mean", *,
                         backend: str | None = None, check_targets: bool = True,
                         chunk_rows: int | None = None) -> torch.Tensor:
    """F.cross_entropy(F.linear(x, weight, bias), target, ...) for x [..., H], weight [V, H], target [...] of class
    indices, without holding the [tokens x V] logits (see the module's docstring).

    backend: "triton" (the default on CUDA: cuBLAS matmuls over chunks of rows, roofline's cross-entropy kernel),
    "torch" (the expression itself; the default on CPU), "compile" (torch.compile of the expression).
    The loss has x's dtype, or fp32 under autocast (which runs the matmuls in its dtype, as F.linear's). A target
    out of range gives its row a nan loss, and in eager mode raises ValueError without stopping the host: from the
    backward, the next call of either loss op, or roofline.ops.wait_for_target_checks()
    (roofline.ops._target_check). Under torch.compile, in a CUDA graph's capture and with check_targets=False,
    the nan loss is all. chunk_rows: rows per chunk (default: 256 MB of logits).
    """
    backend = choose_backend("linear_cross_entropy", x, backend, BACKENDS, arg="x")
    _check(x, weight, target, bias, ignore_index, reduction, label_smoothing, chunk_rows)
    done = torch_route(backend, linear_cross_entropy_reference, x, weight, target, bias, ignore_index,
                       label_smoothing, reduction, nothing_to_launch=x.numel() == 0)
    if done is not None:
        return done
    if torch.is_autocast_enabled(x.device.type):   # the matmuls in autocast's dtype, as F.linear's
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    shape = target.shape
    wanted = [torch.is_grad_enabled() and t is not None and t.requires_grad for t in (x, weight, bias)]
    compiling = torch.compiler.is_compiling()
    args = (x.reshape(-1, x.shape[-1]).contiguous(), weight.contiguous(), bias, target.reshape(-1).contiguous(),
            int(ignore_index), reduction, float(label_smoothing), *wanted, check_targets and not compiling,
            int(chunk_rows or 0))
    if compiling:
        loss = _linear_cross_entropy.forward_op(*args)[0]
    else:
        plan = _plan(*args)
        loss = _linear_cross_entropy.eager(plan, any(wanted), *args)[0]
    if reduction == "none":
        return loss.to(_loss_dtype(x)).reshape(shape)
    return loss
