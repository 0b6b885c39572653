"""Each op of roofline.ops called at a shape, on inputs made the way its benchmarks make them: what
`roofline inspect OP --shape ...` looks inside, and what benchmarks/ops_suite.py times.

    example = EXAMPLES["rms_norm"]
    args = example.inputs((4096, 4096), "cuda", torch.bfloat16, grad=True)
    out = example.call(*args, backend="triton")

A shape names the sizes a user thinks in, which `shape_means` says: rows x hidden for the row-wise ops, batch x
seq x head_dim for rope (32 query and 8 key heads), batch x heads x seq x head_dim for attention, M x N x K for
linear. Inputs are random normal, scaled where the op's interesting range asks it (softmax's and gelu's inputs by
3: a softmax of unit inputs is nearly flat).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from roofline.ops.attention import flash_attention
from roofline.ops.cross_entropy import cross_entropy
from roofline.ops.gelu import gelu
from roofline.ops.linear import linear
from roofline.ops.norm import add_rms_norm, layer_norm, rms_norm
from roofline.ops.rope import rope
from roofline.ops.softmax import log_softmax, softmax
from roofline.ops.swiglu import swiglu

EPS = 1e-6
ROPE_HEADS = (32, 8)   # rope's query and key heads (grouped-query attention, as Llama 3 8B has them)


@dataclass(frozen=True)
class Example:
    shape_means: str                 # what each size of a shape is
    dims: int                        # how many sizes a shape has (0: any number, at least 1)
    inputs: Callable                 # (shape, device, dtype, grad) -> the op's tensors
    call: Callable                   # (*tensors, backend=) -> the op's output(s)

    def check(self, shape: tuple[int, ...]) -> None:
        """A ValueError naming `shape` where the op cannot take it."""
        if not shape or any(not isinstance(s, int) or s < 1 for s in shape):
            raise ValueError(f"shape: positive sizes, got {shape}")
        if self.dims and len(shape) != self.dims:
            raise ValueError(f"shape: {self.dims} sizes ({self.shape_means}), got {len(shape)}: {shape}")


def randn(shape, device, dtype, grad: bool = False, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(shape, device=device, dtype=dtype) * scale).requires_grad_(grad)


def _norm_params(n: int, device, dtype, grad: bool, bias: bool = True) -> tuple[torch.Tensor, ...]:
    """A norm's weight near 1 (and bias near 0), as a trained model's are."""
    weight = (1 + 0.1 * torch.randn(n, device=device, dtype=dtype)).requires_grad_(grad)
    return (weight, (0.1 * torch.randn(n, device=device, dtype=dtype)).requires_grad_(grad)) if bias else (weight,)


def _rope_inputs(shape, device, dtype, grad: bool):
    batch, seq, dim = shape
    q = randn((batch, ROPE_HEADS[0], seq, dim), device, dtype, grad)
    k = randn((batch, ROPE_HEADS[1], seq, dim), device, dtype, grad)
    freqs = torch.arange(seq, device=device)[:, None] / 10000 ** (torch.arange(0, dim, 2, device=device) / dim)
    angles = torch.cat((freqs, freqs), -1)[None]
    return q, k, angles.cos().to(dtype), angles.sin().to(dtype)


def _cross_entropy_inputs(shape, device, dtype, grad: bool):
    target = torch.randint(0, shape[-1], shape[:-1], device=device)
    return randn(shape, device, dtype, grad, 2.0), target


def _linear_inputs(shape, device, dtype, grad: bool):
    m, n, k = shape
    return randn((m, k), device, dtype, grad), randn((n, k), device, dtype, grad, k ** -0.5)


ROWS = "rows x hidden (or any leading sizes x hidden)"
EXAMPLES: dict[str, Example] = {
    "softmax": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g, 3.0),), softmax),
    "log_softmax": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g, 3.0),), log_softmax),
    "layer_norm": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g), *_norm_params(s[-1], d, t, g)),
                          lambda x, w, b, backend: layer_norm(x, x.shape[-1:], w, b, EPS, backend=backend)),
    "rms_norm": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g), *_norm_params(s[-1], d, t, g, False)),
                        lambda x, w, backend: rms_norm(x, x.shape[-1:], w, EPS, backend=backend)),
    "add_rms_norm": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g), randn(s, d, t, g),
                                                         *_norm_params(s[-1], d, t, g, False)),
                            lambda x, r, w, backend: add_rms_norm(x, r, w, EPS, backend=backend)),
    "gelu": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g, 3.0),),
                    lambda x, backend: gelu(x, approximate="tanh", backend=backend)),
    "swiglu": Example(ROWS, 0, lambda s, d, t, g: (randn(s, d, t, g, 2.0), randn(s, d, t, g)), swiglu),
    "cross_entropy": Example("rows x vocabulary", 2, _cross_entropy_inputs, cross_entropy),
    "rope": Example("batch x seq x head_dim (32 query heads, 8 key heads)", 3, _rope_inputs, rope),
    "flash_attention": Example("batch x heads x seq x head_dim", 4,
                               lambda s, d, t, g: tuple(randn(s, d, t, g) for _ in range(3)),
                               lambda q, k, v, backend: flash_attention(q, k, v, True, backend=backend)),
    "linear": Example("M x N x K (x: M x K, weight: N x K)", 3, _linear_inputs, linear),
}


def run(name: str, shape: tuple[int, ...], *, device, dtype: torch.dtype = torch.bfloat16, backward: bool = False,
        backend: str = "triton"):
    """The op `name` called once at `shape` (and its backward, with a random cotangent for each output)."""
    if name not in EXAMPLES:
        raise ValueError(f"op: one of {', '.join(sorted(EXAMPLES))}, got {name!r}")
    example = EXAMPLES[name]
    example.check(tuple(shape))
    args = example.inputs(tuple(shape), device, dtype, backward)
    out = example.call(*args, backend=backend)
    if backward:
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, [torch.randn_like(o) for o in outs])
    return out
