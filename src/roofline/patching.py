"""roofline.patch(model) (this module is roofline.patching, so the name roofline.patch stays the function): swap a model's LayerNorm, RMSNorm and GELU modules for roofline's, in place.

A module is swapped by changing its class to roofline's subclass of the same torch class: its parameters,
buffers, hooks and state-dict keys stay exactly as they were, so optimizers, checkpoints and FSDP wrappers
see no difference. Only modules whose type is exactly the torch class are swapped (a user's subclass may
have changed forward).
"""

from __future__ import annotations

from torch import nn

from roofline import nn as roofline_nn

SWAPS = {nn.LayerNorm: roofline_nn.LayerNorm, nn.RMSNorm: roofline_nn.RMSNorm, nn.GELU: roofline_nn.GELU}


def patch(model: nn.Module, *, layer_norm: bool = True, rms_norm: bool = True, gelu: bool = True) -> list[tuple[str, str]]:
    """Swap model's nn.LayerNorm, nn.RMSNorm and nn.GELU modules (those asked for) in place.

    Returns (qualified name, torch class name) for every module swapped, in the model's order; the model
    itself may be one of them (name ""). Calling it again swaps nothing more.
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
    return swapped
