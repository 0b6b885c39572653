"""roofline.quantize_int8_weight_only(model): a model's nn.Linear layers swapped in place for int8 weight-only ones
(roofline.nn.Int8Linear over ops.int8_linear), and the layers that share an input computed as one matmul for a row
of it (roofline.nn.SharedInput: q/k/v, gate/up); shared_inputs(model) lists those."""

from __future__ import annotations

import dataclasses

from torch import nn

from roofline import nn as roofline_nn


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
                              skip=lambda name, module: False, fuse_shared_input: bool = True) -> QuantizationReport:
    """Swap model's nn.Linear layers (exactly that class, skip(name, module) false) for roofline.nn.Int8Linear in
    place: weights int8 with a scale per output channel, or per group_size weights along each row (for
    heavy-tailed weights; see ops.quantize_int8), activations as they were. The model itself cannot be swapped
    (it has no parent); a bare nn.Linear is quantized with Int8Linear.from_linear instead.

    fuse_shared_input: layers of one parent with the same in_features that the model calls one after another on
    the same tensor (q_proj, k_proj, v_proj; gate_proj, up_proj) are learned from the model's first forward and
    then computed as one matmul for a row of input (roofline.nn.SharedInput); see shared_inputs(model)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"quantize_int8_weight_only: model must be a torch.nn.Module, got {type(model).__name__}")
    report = QuantizationReport([], 0, 0)
    for name, module in list(model.named_modules()):
        siblings: dict[tuple, list[tuple[str, roofline_nn.Int8Linear]]] = {}
        for child_name, child in list(module.named_children()):
            full_name = f"{name}.{child_name}" if name else child_name
            if type(child) is not nn.Linear or skip(full_name, child):
                continue
            quantized = roofline_nn.Int8Linear.from_linear(child, group_size)
            setattr(module, child_name, quantized)
            report.layers.append(full_name)
            report.bytes_before += child.weight.numel() * child.weight.element_size()
            report.bytes_after += quantized.weight_int8.numel() + quantized.scale.numel() * 4
            siblings.setdefault((child.in_features, child.weight.device), []).append((child_name, quantized))
        for group in siblings.values():
            if fuse_shared_input and len(group) > 1:
                shared = roofline_nn.SharedInput([layer for _, layer in group], [n for n, _ in group])
                for _, layer in group:
                    layer.shared = shared
    return report


def shared_inputs(model: nn.Module) -> list[list[str]]:
    """The runs of Int8Linear layers that quantize_int8_weight_only computes as one matmul, by their names:
    [["layers.0.attn.q_proj", "layers.0.attn.k_proj", "layers.0.attn.v_proj"], ...]. Empty until the model's
    second forward (the first is learned from)."""
    names = {id(module): name for name, module in model.named_modules()}
    groups = {id(m.shared): m.shared for m in model.modules()
              if isinstance(m, roofline_nn.Int8Linear) and m.shared is not None and m.shared.fused}
    return [[names[id(shared.members[i])] for i in shared.fused] for shared in groups.values()]
