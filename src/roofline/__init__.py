"""roofline: make PyTorch programs run as fast as the GPU allows, and show how far each piece is from that limit.

Submodules load on first use, so `import roofline` is instant and touches no GPU:
    roofline.bench   timing, comparisons, sweeps
    roofline.device  what the device is and its measured ceilings
    roofline.ops     fused kernels
    roofline.nn      drop-in modules over them; roofline.patch(model) routes a model's norms, GELUs, SwiGLU
                     MLPs, rotary embeddings and attention to them where measured faster (roofline.routing);
                     roofline.quantize_int8_weight_only(model) swaps its nn.Linear layers for int8 weight-only ones
    roofline.profiler / roofline.profile   where a program's time goes, line by line
"""

import importlib

__version__ = "0.1.0"
_SUBMODULES = ("bench", "device", "nn", "ops", "patching", "profiler", "quantization", "routing")
_FUNCTIONS = {"patch": "patching", "quantize_int8_weight_only": "quantization"}   # roofline.NAME: from that module


def __getattr__(name):
    if name in _SUBMODULES:
        return importlib.import_module(f"roofline.{name}")
    if name == "profile":
        return importlib.import_module("roofline.profiler").profile
    if name in _FUNCTIONS:
        return getattr(importlib.import_module(f"roofline.{_FUNCTIONS[name]}"), name)
    raise AttributeError(f"module 'roofline' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_SUBMODULES, *_FUNCTIONS, "profile"])
