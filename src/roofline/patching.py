"""roofline.patch(model) (this module is roofline.patching, so the name roofline.patch stays the function): swap
a model's LayerNorm, RMSNorm and GELU modules for roofline's, in place, and, when asked, route its
F.scaled_dot_product_attention calls to roofline.ops.flash_attention; quantize_int8_weight_only(model).

A module is swapped by changing its class to roofline's subclass of the same torch class: its parameters,
buffers, hooks and state-dict keys stay exactly as they were, so optimizers, checkpoints and FSDP wrappers
see no difference. Only modules whose type is exactly the torch class are swapped (a user's subclass may
have changed forward).

Attention calls are caught by an AttentionRouter that stands in for torch.nn.functional.scaled_dot_product_attention
while the model's forward runs. A call flash_attention cannot serve exactly as SDPA would goes to SDPA unchanged,
and the router counts why.
"""

from __future__ import annotations

import collections
import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from roofline import nn as roofline_nn
from roofline.ops._common import interpreting
from roofline.ops.attention import HEAD_DIMS, flash_attention

TORCH_SDPA = F.scaled_dot_product_attention
SWAPS = {nn.LayerNorm: roofline_nn.LayerNorm, nn.RMSNorm: roofline_nn.RMSNorm, nn.GELU: roofline_nn.GELU}
ROUTED_DTYPES = (torch.float16, torch.bfloat16)


def why_not_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False) -> str | None:
    """Why flash_attention cannot give what F.scaled_dot_product_attention(same arguments) gives, or None if it
    can."""
    tensors = (query, key, value)
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "an input is not a tensor"
    if not all(t.is_cuda for t in tensors) and not interpreting():
        return "not on a CUDA device"
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p != 0.0:
        return "dropout"
    if any(t.dim() != 4 for t in tensors):
        return "not 4-D (batch, heads, seq, head_dim)"
    if query.dtype not in ROUTED_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (routed: float16, bfloat16)"
    if query.shape[-1] not in HEAD_DIMS or key.shape[-1] != query.shape[-1] or value.shape != key.shape:
        return f"head_dim {query.shape[-1]} or k/v shapes (routed: head_dim in {HEAD_DIMS}, k and v alike)"
    if key.shape[0] != query.shape[0]:
        return "batch sizes differ"
    if key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        return "key heads differ from query heads without enable_gqa"
    if is_causal and query.shape[2] != key.shape[2]:
        # SDPA aligns the causal mask top-left, flash_attention bottom-right: they agree only when Nq == Nk
        return "causal with query and key lengths that differ"
    return None


class AttentionRouter:
    """Routes the F.scaled_dot_product_attention calls made during a patched model's forward: those that
    flash_attention serves go to it, the rest to SDPA. served counts the calls routed, passed the others by
    reason.

    For the forward, torch.nn.functional.scaled_dot_product_attention is this router's route (put back after it, an
    exception included), so calls made through that module's attribute (F.scaled_dot_product_attention,
    torch.nn.functional.scaled_dot_product_attention, nn.MultiheadAttention) are caught, and nothing else in
    the program pays for it. A name bound before the forward (from torch.nn.functional import
    scaled_dot_product_attention) still calls torch's.
    """

    def __init__(self):
        self.served = 0
        self.passed: collections.Counter[str] = collections.Counter()
        self._saved = []

    def route(self, *args, **kwargs):
        """F.scaled_dot_product_attention(*args, **kwargs), through flash_attention where it serves."""
        reason = why_not_flash(*args, **kwargs)
        if reason is None:
            self.served += 1
            return _flash_from_sdpa_arguments(*args, **kwargs)
        self.passed[reason] += 1
        return (self._saved[-1] if self._saved else TORCH_SDPA)(*args, **kwargs)

    def _enter(self, module, args):
        self._saved.append(F.scaled_dot_product_attention)
        F.scaled_dot_product_attention = self.route

    def _exit(self, module, args, output):
        F.scaled_dot_product_attention = self._saved.pop()


def _flash_from_sdpa_arguments(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                               enable_gqa=False):
    return flash_attention(query, key, value, bool(is_causal), scale, backend="triton")


def patch(model: nn.Module, *, layer_norm: bool = True, rms_norm: bool = True, gelu: bool = True,
          attention: bool = False) -> list[tuple[str, str]]:
    """Swap model's nn.LayerNorm, nn.RMSNorm and nn.GELU modules (those asked for) in place; with attention=True,
    also route the F.scaled_dot_product_attention calls made during model's forward that flash_attention can
    serve (fp16/bf16 on CUDA, no mask or dropout, a supported head_dim, causal only with equal lengths) to it.

    Returns (qualified name, torch class name) for every module swapped, in the model's order; the model
    itself may be one of them (name ""). Routing adds ("", "scaled_dot_product_attention"); its counts are in
    attention_router(model). Calling it again swaps nothing more.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch: model must be a torch.nn.Module, got {type(model).__name__}")
    wanted = {nn.LayerNorm: layer_norm, nn.RMSNorm: rms_norm, nn.GELU: gelu}
    swapped = []
    for name, module in model.named_modules():
        torch_class = type(module)
        if torch_class in SWAPS and wanted[torch_class]:
            module.__class__ = SWAPS[torch_class]
            swapped.append((name, torch_class.__name__))
    if attention and attention_router(model) is None:
        router = AttentionRouter()
        model.register_forward_pre_hook(router._enter)
        model.register_forward_hook(router._exit, always_call=True)
        swapped.append(("", "scaled_dot_product_attention"))
    return swapped


def attention_router(model: nn.Module) -> AttentionRouter | None:
    """The router patch(model, attention=True) installed (with its counts), or None."""
    for hook in model._forward_pre_hooks.values():
        if isinstance(getattr(hook, "__self__", None), AttentionRouter):
            return hook.__self__
    return None


@dataclasses.dataclass
class QuantizationReport:
    """What quantize_int8_weight_only did: the layers swapped, and their weights' bytes before and after (the
    int8 weight and its fp32 scales)."""
    layers: list[str]
    bytes_before: int
    bytes_after: int

    @property
    def bytes_saved(self) -> int:
        return self.bytes_before - self.bytes_after

    def __str__(self) -> str:
        return (f"{len(self.layers)} nn.Linear layers to int8: weights {self.bytes_before / 2**20:,.1f} MiB -> "
                f"{self.bytes_after / 2**20:,.1f} MiB, {self.bytes_saved / 2**20:,.1f} MiB saved")


def quantize_int8_weight_only(model: nn.Module, *, group_size: int | None = None,
                              skip=lambda name, module: False) -> QuantizationReport:
    """Swap model's nn.Linear layers (exactly that class, skip(name, module) false) for roofline.nn.Int8Linear in
    place: weights int8 with a scale per output channel, or per group_size weights along each row (for
    heavy-tailed weights; see ops.quantize_int8), activations as they were. The model itself cannot be swapped
    (it has no parent); a bare nn.Linear is quantized with Int8Linear.from_linear instead."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_int8_weight_only: model must be a torch.nn.Module, got {type(model).__name__}")
    report = QuantizationReport([], 0, 0)
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full_name = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear or skip(full_name, child):
                continue
            quantized = roofline_nn.Int8Linear.from_linear(child, group_size)
            setattr(module, child_name, quantized)
            report.layers.append(full_name)
            report.bytes_before += child.weight.numel() * child.weight.element_size()
            report.bytes_after += quantized.weight_int8.numel() + quantized.scale.numel() * 4
    return report
