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
from roofline.ops._common import DTYPES, capturing, interpreting


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

    shared: "SharedInput | None" = None   # set by quantize_int8_weight_only for layers that may share an input

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shared = self.shared
        # past learning, only a row of input can be served fused: others skip the run's bookkeeping (a few us
        # a call, which an eager decode step at batch 8 pays 112 times)
        if shared is not None and (shared.learning or shared.fused and x.numel() == x.shape[-1]):
            return shared.forward(self, x)
        return _int8_linear(x, self.weight_int8, self.scale, self.bias)

    def extra_repr(self) -> str:
        groups = "" if self.group_size is None else f", group_size={self.group_size}"
        fused = "" if self.shared is None or not self.shared.fused else f", fused={self.shared.names}"
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"
                f"{groups}{fused}")


_KERNEL_DTYPES = (torch.float16, torch.bfloat16)


def _int8_linear(x, weight_int8, scale, bias):
    # A decode step calls this once per layer, host-bound: no call made that changes nothing (bias.to of its own
    # dtype) and no backend named where the default is the one wanted (a keyword the forward's replay must match)
    if bias is not None and bias.dtype != x.dtype:
        bias = bias.to(x.dtype)
    if x.dtype in _KERNEL_DTYPES:
        if x.is_cuda:
            return ops.int8_linear(x, weight_int8, scale, bias)   # Triton's, the default on CUDA
        if interpreting():
            return ops.int8_linear(x, weight_int8, scale, bias, backend="triton")
    return ops.int8_linear(x, weight_int8, scale, bias, backend="torch")


def _version(t: torch.Tensor) -> int | None:
    """t's count of in-place changes; None for an inference tensor (made under torch.inference_mode), which keeps
    none."""
    return None if t.is_inference() else t._version


class SharedInput:
    """Int8Linear siblings (children of one module, same in_features) that the model may call one after another
    on the same tensor, as a Llama attention calls q_proj, k_proj and v_proj, and its MLP gate_proj and up_proj.
    After the first such run of calls is seen, their weights are one int8 matrix (each layer's weight_int8 a view
    of its rows, so no byte is stored twice) and the run's first call computes every output of the run in one
    kernel; the later calls return their part, if they come in the order seen, with the same tensor, unchanged.

    A decode step at batch 1 is bound by its weights' bytes and by the number of kernels that stream them: the
    Llama decode step's matmuls took markedly less time as 65 kernels than as 113, the bytes being the same
    (benchmarks/gemv_probe.py; measured: benchmarks/results/h100-models.md). Models written with fused projections
    (gpt-fast's wqkv) get this by hand; this gets it for model code as written, without changing the model's
    forward.

    Only one row of input is served fused: its outputs are then each contiguous, as nn.Linear's are (with more
    rows they would be strided column slices, which a model's `.view` may refuse). Any other call (out of order,
    on another tensor, after the tensor changed in place, under torch.compile's tracing) runs the layer alone, so
    the result is always the layer's own. One exception: an inference tensor (torch.inference_mode) counts no
    in-place changes, so a change made to it between the run's calls goes unseen (model code does not change the
    input it hands to its projections). Nothing is learned or rebuilt while a CUDA graph is being captured (the
    new weights would be allocated in the graph's pool and rebuilt at every replay)."""

    def __init__(self, members: list[Int8Linear], names: list[str]):
        self.members, self.member_names = members, names
        self.learning = True
        self.called: set[int] = set()        # members called while learning
        self.run: list[int] = []             # the current run of calls on one tensor
        self.best: tuple[int, ...] = ()      # the longest run seen
        self.last = None                     # (input, its version) of the last call while learning
        self.fused: tuple[int, ...] = ()     # the run served as one kernel, once learned
        self.pending = None                  # (input, version, outputs, next position in the run)

    @property
    def names(self) -> list[str]:
        return [self.member_names[i] for i in self.fused]

    def forward(self, layer: Int8Linear, x: torch.Tensor) -> torch.Tensor:
        index = self.members.index(layer)
        if torch.compiler.is_compiling():
            return self._alone(layer, x)
        if not self.fused:
            if self.learning and not capturing():
                self._learn(index, x)
            if not self.fused:
                return self._alone(layer, x)
        if self.pending is not None:
            given, version, outputs, position = self.pending
            if self.fused[position] == index and given is x and _version(x) == version:
                self.pending = None if position + 1 == len(self.fused) else (given, version, outputs, position + 1)
                return outputs[position]
        if index == self.fused[0] and x.numel() == x.shape[-1] and self._current():
            y = _int8_linear(x, self.weight, self.scale, self._bias(x.dtype))
            outputs = y.split(self.sizes, -1)
            self.pending = (x, _version(x), outputs, 1)
            return outputs[0]
        return self._alone(layer, x)

    def _alone(self, layer, x):
        return _int8_linear(x, layer.weight_int8, layer.scale, layer.bias)

    def _learn(self, index: int, x: torch.Tensor) -> None:
        """Follow the runs of calls on one unchanged tensor. A member called again starts the model's next
        forward: the longest run of the first is fused if it has two members or more, else learning stops."""
        if index in self.called:
            if len(self.best) >= 2:
                self._fuse(self.best)
            self.learning, self.last, self.run = False, None, []
            return
        same = self.last is not None and self.last[0] is x and self.last[1] == _version(x)
        self.called.add(index)
        self.run = self.run + [index] if same else [index]
        if len(self.run) > len(self.best):
            self.best = tuple(self.run)
        self.last = (x, _version(x))

    def _fuse(self, run: tuple[int, ...]) -> None:
        layers = [self.members[i] for i in run]
        with torch.no_grad():
            weight = torch.cat([layer.weight_int8 for layer in layers])
            scale = torch.cat([layer.scale for layer in layers])
        rows = 0
        for layer in layers:   # each layer's weights become a view of the one matrix
            for old in (layer.weight_int8, layer.scale):
                if old.is_cuda:   # freed below: not reused before this stream's kernels that read it are done
                    old.record_stream(torch.cuda.current_stream(old.device))
            n = layer.out_features
            layer._buffers["weight_int8"], layer._buffers["scale"] = weight[rows:rows + n], scale[rows:rows + n]
            rows += n
        self.weight, self.scale, self.fused, self.layers = weight, scale, run, layers
        self.sizes = [layer.out_features for layer in layers]
        self.views = [(layer._buffers["weight_int8"], layer._buffers["scale"]) for layer in layers]
        self.bias_key = None

    def _current(self) -> bool:
        """Whether the one matrix holds the layers' weights: a layer's weight replaced since (model.to(...) moves
        them) makes it join the current ones again, except during a capture (then the layers run alone)."""
        if all(layer._buffers["weight_int8"] is w and layer._buffers["scale"] is s
               for layer, (w, s) in zip(self.layers, self.views)):
            return True
        if capturing():
            return False
        self._fuse(self.fused)
        return True

    def _bias(self, dtype):
        """The run's biases as one vector (zeros for a layer without one), built again when one has changed
        (replaced, or updated in place). The biases are held, so that no id is reused while compared."""
        sources = [layer.bias for layer in self.layers]
        if all(b is None for b in sources):
            return None
        key = [None if b is None else (id(b), _version(b)) for b in sources]
        if key != self.bias_key:
            with torch.no_grad():
                self.bias = torch.cat([torch.zeros(layer.out_features, dtype=dtype, device=self.weight.device)
                                       if b is None else b.to(dtype) for layer, b in zip(self.layers, sources)])
            self.bias_key, self.bias_sources = key, sources
        return self.bias.to(dtype)
