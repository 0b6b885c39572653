"""Drop-in modules over roofline.ops, with the parameters and state-dict keys of the modules they replace.

LayerNorm, RMSNorm, GELU and CrossEntropyLoss subclass torch.nn's, so a checkpoint loads into either and
`roofline.patch` can swap a model's modules in place. SwiGLUMLP is the LLaMA-style MLP, with the names
gate_proj, up_proj and down_proj that Hugging Face models use.

Each runs roofline's Triton kernel where it can (a CUDA tensor of fp32, fp16 or bf16) and torch's own
implementation otherwise (a CPU tensor, float64, or an option the kernel does not have), so a swapped model
never fails where the original ran.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from roofline import ops
from roofline.ops._common import DTYPES, interpreting


def _on_kernel(x: torch.Tensor) -> bool:
    # On a CPU only through Triton's interpreter, which is how the tests run the kernels without a GPU.
    return (x.is_cuda or interpreting()) and x.dtype in DTYPES


class LayerNorm(nn.LayerNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _on_kernel(x):
            return super().forward(x)
        return ops.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps, backend="triton")


class RMSNorm(nn.RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _on_kernel(x):
            return super().forward(x)
        return ops.rms_norm(x, self.normalized_shape, self.weight, self.eps, backend="triton")


class GELU(nn.GELU):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not _on_kernel(x):
            return super().forward(x)
        return ops.gelu(x, self.approximate, backend="triton")


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """nn.CrossEntropyLoss; the fused kernel serves (N, C) logits with class-index targets and no class weights."""

    def forward(self, input: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if not _on_kernel(input) or self.weight is not None or input.dim() != 2 or target.is_floating_point():
            return super().forward(input, target)
        return ops.cross_entropy(input, target, self.ignore_index, self.reduction, self.label_smoothing,
                                 backend="triton")


class SwiGLUMLP(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), the gate fused in one kernel."""

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool = False, device=None, dtype=None):
        super().__init__()
        factory = dict(device=device, dtype=dtype)
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias, **factory)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_proj(x), self.up_proj(x)
        hidden = ops.swiglu(gate, up, backend="triton") if _on_kernel(gate) else F.silu(gate) * up
        return self.down_proj(hidden)


class Int8Linear(nn.Module):
    """nn.Linear with its weight stored as int8 (buffers weight_int8 [out, in], and fp32 scale: [out] per output
    channel, or [out, in / group_size] per group of group_size weights along a row) and dequantized in registers
    by roofline.ops.int8_linear: half the bytes of a bf16 weight, which is what a decode step's matmuls are bound
    by. The input's gradient flows; the weights are frozen."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None,
                 dtype=torch.bfloat16, group_size: int | None = None):
        super().__init__()
        self.in_features, self.out_features, self.group_size = in_features, out_features, group_size
        scale_shape = (out_features,) if group_size is None else (out_features, in_features // group_size)
        self.register_buffer("weight_int8", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("scale", torch.ones(scale_shape, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.zeros(out_features, device=device, dtype=dtype)) if bias else None

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int | None = None) -> "Int8Linear":
        """The int8 version of linear (its weight quantized, per group_size weights if given; its bias kept in
        its dtype)."""
        q, scale = ops.quantize_int8(linear.weight, group_size)
        module = cls(linear.in_features, linear.out_features, linear.bias is not None, linear.weight.device,
                     linear.weight.dtype, group_size)
        module.weight_int8.copy_(q)
        module.scale.copy_(scale)
        if linear.bias is not None:
            module.bias.data.copy_(linear.bias.data)
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        if (x.is_cuda or interpreting()) and x.dtype in (torch.float16, torch.bfloat16):
            return ops.int8_linear(x, self.weight_int8, self.scale, bias, backend="triton")
        return ops.int8_linear(x, self.weight_int8, self.scale, bias, backend="torch")

    def extra_repr(self) -> str:
        groups = "" if self.group_size is None else f", group_size={self.group_size}"
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}{groups}"
