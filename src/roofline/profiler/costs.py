"""FLOPs and bytes of every aten op from its recorded shapes and dtypes, and each op placed on the roofline.

Bytes are the minimum traffic (each input read once, each output written once); FLOPs follow
the usual conventions (matmul 2·M·N·K; attention forward 4·B·H·Nq·Nk·D, half when causal,
backward 2.5x forward; elementwise one per output element). The profiler records input
shapes only, so outputs are inferred: broadcast for elementwise ops, the reduced shape for
reductions. An op with no rule gets the elementwise default and says so (`rule="default"`).
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass

from roofline.ops.traffic import PASSES, unit_inputs
from roofline.profiler.trace import Op

NO_COST_MODEL = "no cost model"   # what the tables say of an op whose FLOPs and bytes the trace does not give
VIEW = "view"     # the rule of a view or metadata op: it costs nothing, and has no place on the roofline


def roofline_cell(rule: str | None, pct: float | None, percent) -> str:
    """The "of roofline" cell of an op: its fraction (through `percent`), "view" for a view or metadata op (it costs
    nothing), or NO_COST_MODEL."""
    if rule is None:
        return NO_COST_MODEL
    return VIEW if rule == VIEW else percent(pct)

# Element sizes by the profiler's "Input type" strings.
ITEMSIZE = {"float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "int": 4,
            "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1,
            "c10::Float8_e5m2": 1, "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1,
            "c10::complex<float>": 8, "c10::complex<double>": 16, "c10::complex<c10::Half>": 4}
MATMUL_KEY = {"c10::BFloat16": "bf16", "c10::Half": "fp16", "float": "fp32", "c10::Float8_e4m3fn": "fp8",
              "c10::Float8_e5m2": "fp8"}
# torch.ScalarType codes, as _to_copy records its dtype argument.
SCALAR_TYPE_ITEMSIZE = {0: 1, 1: 1, 2: 2, 3: 4, 4: 8, 5: 2, 6: 4, 7: 8, 11: 1, 15: 2, 23: 1, 24: 1}


@dataclass(frozen=True, slots=True)
class Cost:
    flops: float
    bytes: float
    rule: str                     # which rule counted it: matmul, attention, conv, elementwise, ... default
    matmul_dtype: str | None = None   # for tensor-core work: bf16 / fp16 / fp32 / fp8
    note: str | None = None       # where the count came from, when not from the op's own recorded shapes


@dataclass(frozen=True)
class ParameterSet:
    """What the program's optimizer updates, as capture saw it at a step. torch.profiler records no shapes for a
    tensor list past a few dozen tensors (a GPT-2's 148 parameters arrive as empty lists), so a foreach or fused
    optimizer op whose lists came through empty is costed as running over these: each list one tensor per
    parameter, of the parameters' sizes and element size."""
    tensors: int
    numel: int
    itemsize: int

    @classmethod
    def from_facts(cls, facts: dict) -> "ParameterSet | None":
        """The one optimizer among a trace's facts; None when there is none, or several (an op's lists could
        then belong to any of them)."""
        optimizers = facts.get("optimizers") or []
        if len(optimizers) != 1:
            return None
        o = optimizers[0]
        return cls(int(o["tensors"]), int(o["numel"]), int(o["itemsize"]))


def _numel(shape) -> int:
    return math.prod(shape) if shape else 1


def _is_shape(x) -> bool:
    return isinstance(x, list) and all(isinstance(d, int) for d in x)


class _Args:
    """The op's recorded arguments: tensors (shape, dtype), tensor lists, and scalars."""

    def __init__(self, op: Op, params: ParameterSet | None = None):
        self.params = params   # the optimizer's parameters, for tensor lists the profiler did not record
        shapes = op.shapes or []
        dtypes = op.dtypes or []
        scalars = op.scalars or []
        self.n = len(shapes)
        self.shapes, self.dtypes, self.scalars = shapes, dtypes, scalars
        self.strides = op.strides or []
        self.known_itemsize = next((ITEMSIZE[t] for t in dtypes if t in ITEMSIZE), 4)

    def tensor(self, i: int):
        """(shape, itemsize) of argument i if it is a tensor, else None."""
        if i >= self.n or i >= len(self.dtypes):
            return None
        shape, dtype = self.shapes[i], self.dtypes[i]
        if dtype in ITEMSIZE and _is_shape(shape):
            return shape, ITEMSIZE[dtype]
        return None

    def tensors(self):
        return [t for t in (self.tensor(i) for i in range(self.n)) if t is not None]

    def lists(self):
        """Tensor-list arguments, as lists of shapes (their dtype is not recorded)."""
        return [s for s, t in zip(self.shapes, self.dtypes) if t == "TensorList" and isinstance(s, list)]

    def stored_numel(self, i: int) -> int:
        """Elements argument i holds in memory: an expanded tensor (stride 0, `idx[..., None].expand(...)`) holds
        fewer than its shape says. Its numel where strides were not recorded."""
        shape = self.shapes[i]
        strides = self.strides[i] if i < len(self.strides) else None
        if not _is_shape(strides) or len(strides) != len(shape):
            return _numel(shape)
        return math.prod(d for d, s in zip(shape, strides) if s != 0)

    def scalar(self, i: int):
        if i >= len(self.scalars) or self.scalars[i] in ("", None):
            return None
        try:
            return ast.literal_eval(self.scalars[i])
        except (ValueError, SyntaxError):
            return self.scalars[i]

    def dtype(self, i: int) -> str | None:
        return self.dtypes[i] if i < len(self.dtypes) else None


def _bytes(t) -> int:
    return _numel(t[0]) * t[1]


def _broadcast(shapes) -> list[int]:
    ndim = max((len(s) for s in shapes), default=0)
    out = [1] * ndim
    for s in shapes:
        for k, d in enumerate(s):
            j = ndim - len(s) + k
            out[j] = max(out[j], d)
    return out


# --------------------------------------------------------------------------- rules

def _matmul(op: Op, a: _Args) -> Cost | None:
    name = op.name.removeprefix("aten::")
    first = 1 if name in ("addmm", "addmm_", "baddbmm", "baddbmm_", "_addmm_activation", "addbmm") else 0
    x, w = a.tensor(first), a.tensor(first + 1)
    if x is None or w is None:
        return None
    (xs, sx), (ws, sw) = x, w
    if name == "linear":                      # x[..., K] @ w[N, K]^T
        k, n = xs[-1], ws[0]
        m = _numel(xs) // max(k, 1)
        batch = 1
    elif len(xs) >= 3 or len(ws) >= 3:        # batched: [..., M, K] @ [..., K, N]
        m, k, n = xs[-2], xs[-1], ws[-1]
        batch = _numel(_broadcast([xs[:-2], ws[:-2]]))
    else:
        if len(xs) == 1:                      # mv / dot
            xs = [1, xs[0]]
        if len(ws) == 1:
            ws = [ws[0], 1]
        m, k, n = xs[0], xs[1], ws[1]
        batch = 1
    out_size = max(sx, sw) if a.dtype(first) != "float" or sx == 4 else sx
    nbytes = batch * (m * k * sx + k * n * sw + m * n * out_size)
    if first:
        bias = a.tensor(0)
        nbytes += _bytes(bias) if bias else 0
    return Cost(2.0 * batch * m * n * k, nbytes, "matmul", MATMUL_KEY.get(a.dtype(first)))


# is_causal's position among each SDPA op's arguments.
_CAUSAL_ARG = {"_scaled_dot_product_flash_attention": 4, "_scaled_dot_product_efficient_attention": 6,
               "_scaled_dot_product_cudnn_attention": 6, "_flash_attention_forward": 7,
               "_efficient_attention_forward": 8, "_scaled_dot_product_flash_attention_backward": 9,
               "_scaled_dot_product_efficient_attention_backward": 10,
               "_scaled_dot_product_cudnn_attention_backward": 11, "_scaled_dot_product_fused_attention_overrideable": 6}


def _attention(op: Op, a: _Args) -> Cost | None:
    name = op.name.removeprefix("aten::")
    backward = name.endswith("_backward")
    first = 1 if backward and "flash" in name or backward and "efficient" in name or backward and "cudnn" in name else 0
    q, k, v = a.tensor(first), a.tensor(first + 1), a.tensor(first + 2)
    if q is None or k is None or v is None:
        return None
    (qs, s), (ks, _), (vs, _) = q, k, v
    if len(qs) != 4 or len(ks) != 4:
        return None
    b, h, nq, d = qs
    nk = ks[-2]
    flops = 4.0 * b * h * nq * nk * d
    causal = a.scalar(_CAUSAL_ARG.get(name, -1)) is True if name in _CAUSAL_ARG else False
    if causal:
        flops /= 2
    io = _bytes(q) + _bytes(k) + _bytes(v) + _numel(qs[:-1] + [vs[-1]]) * s   # q, k, v in; out
    if backward:
        flops *= 2.5
        io = 2 * io + _numel(qs[:-1] + [vs[-1]]) * s    # + dout, dq, dk, dv
    return Cost(flops, io, "attention", MATMUL_KEY.get(a.dtype(first)))


def _roofline(public: str, a: _Args, backward: bool, unit_at: int = 0) -> Cost | None:
    """A call of a roofline op (roofline::<op>, roofline::<op>_backward), from the forward's inputs (or, under
    torch.compile, the registered op's own, its unit of traffic from argument `unit_at`): the row-wise ops by the
    passes their benchmarks count (roofline.ops.traffic), the GEMMs and attention as the aten ones are counted."""
    first = a.tensor(unit_at)
    if first is None:
        return None
    if public in PASSES:
        unit = sum(_bytes(t) for t in (a.tensor(i) for i in range(unit_at, unit_at + unit_inputs(public))) if t)
        passes = PASSES[public].backward if backward else PASSES[public].forward
        return Cost(float(_numel(first[0])), passes * unit, "roofline")
    if public in ("linear", "int8_linear"):
        w = a.tensor(1)
        if w is None:
            return None
        (xs, sx), (ws, sw) = first, w
        k, n = xs[-1], ws[0]
        m = _numel(xs) // max(k, 1)
        x_bytes, w_bytes, y_bytes = m * k * sx, n * k * sw, m * n * sx
        if not backward:
            return Cost(2.0 * m * n * k, x_bytes + w_bytes + y_bytes, "matmul", MATMUL_KEY.get(a.dtype(0)))
        if public == "int8_linear":   # the gradient of x only: dy W
            return Cost(2.0 * m * n * k, y_bytes + w_bytes + x_bytes, "matmul", MATMUL_KEY.get(a.dtype(0)))
        # dx = dy W and dW = dy^T x: dy, x and W read, dx and dW written
        return Cost(4.0 * m * n * k, y_bytes + 2 * (x_bytes + w_bytes), "matmul", MATMUL_KEY.get(a.dtype(0)))
    if public == "flash_attention":
        k, v = a.tensor(1), a.tensor(2)
        if k is None or v is None or len(first[0]) != 4:
            return None
        (qs, size), (ks, _) = first, k
        b, h, nq, d = qs
        flops = 4.0 * b * h * nq * ks[-2] * d / (2 if a.scalar(3) is True else 1)
        out = _numel(qs[:-1] + [v[0][-1]]) * size
        io = _bytes(first) + _bytes(k) + _bytes(v) + out
        if backward:
            flops, io = flops * 2.5, 2 * io + out
        return Cost(flops, io, "attention", MATMUL_KEY.get(a.dtype(0)))
    return None


def _int_list(value, n: int) -> list[int]:
    if isinstance(value, int):
        return [value] * n
    if isinstance(value, (list, tuple)) and value:
        return list(value) * n if len(value) == 1 else list(value)
    return [1] * n


def _conv(op: Op, a: _Args) -> Cost | None:
    name = op.name.removeprefix("aten::")
    if name == "convolution_backward":
        grad, x, w = a.tensor(0), a.tensor(1), a.tensor(2)
        if grad is None or x is None or w is None:
            return None
        groups = a.scalar(9) if isinstance(a.scalar(9), int) else 1
        per_grad = 2.0 * _numel(grad[0]) * (x[0][1] // groups) * _numel(w[0][2:])
        mask = a.scalar(10) if isinstance(a.scalar(10), list) else [True, True, False]
        flops = per_grad * (int(bool(mask[0])) + int(bool(mask[1])))
        return Cost(flops, 2 * (_bytes(grad) + _bytes(x) + _bytes(w)), "conv", MATMUL_KEY.get(a.dtype(0)))
    x, w = a.tensor(0), a.tensor(1)
    if x is None or w is None or len(x[0]) < 3:
        return None
    (xs, s), (ws, _) = x, w
    spatial = len(xs) - 2
    stride, padding, dilation = (_int_list(a.scalar(i), spatial) for i in (3, 4, 5))
    transposed = a.scalar(6) is True
    groups = a.scalar(8) if isinstance(a.scalar(8), int) else 1
    if transposed:
        out = [(xs[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (ws[2 + i] - 1) + 1 for i in range(spatial)]
        cout = ws[1] * groups
    else:
        out = [(xs[2 + i] + 2 * padding[i] - dilation[i] * (ws[2 + i] - 1) - 1) // stride[i] + 1 for i in range(spatial)]
        cout = ws[0]
    out_numel = xs[0] * cout * _numel(out)
    cin_per_group = xs[1] // groups
    flops = 2.0 * out_numel * cin_per_group * _numel(ws[2:])
    bias = a.tensor(2)
    return Cost(flops, _bytes(x) + _bytes(w) + out_numel * s + (_bytes(bias) if bias else 0), "conv",
                MATMUL_KEY.get(a.dtype(0)))


def _reduced_numel(shape, dims, keepdim=False) -> int:
    if dims in (None, [], ()):
        return 1
    dims = [dims] if isinstance(dims, int) else dims
    kept = [d for i, d in enumerate(shape) if i not in {x % max(len(shape), 1) for x in dims}]
    return _numel(kept)


def _reduction(op: Op, a: _Args) -> Cost | None:
    x = a.tensor(0)
    if x is None:
        return None
    dims = a.scalar(1)
    out = _reduced_numel(x[0], dims if isinstance(dims, (list, int)) else None)
    return Cost(float(_numel(x[0])), _bytes(x) + out * x[1], "reduction")


def _softmax(op: Op, a: _Args) -> Cost | None:
    tensors = a.tensors()
    if not tensors:
        return None
    n = _numel(tensors[0][0])
    if op.name.endswith("_backward_data"):            # grad_out, output -> grad_in
        return Cost(3.0 * n, 3 * n * tensors[0][1], "softmax")
    out_size = 4 if a.scalar(2) is True else tensors[0][1]   # half_to_float
    return Cost(5.0 * n, n * (tensors[0][1] + out_size), "softmax")


def _normalization(op: Op, a: _Args) -> Cost | None:
    x = a.tensor(0)
    if x is None:
        return None
    n = _numel(x[0])
    params = sum(_bytes(t) for t in a.tensors()[1:] if _numel(t[0]) < n)
    if op.name.endswith("_backward"):
        big = [t for t in a.tensors() if _numel(t[0]) == n]      # grad_out, input (and more) in; grad_in out
        return Cost(10.0 * n, sum(_bytes(t) for t in big) + n * x[1] + 2 * params, "normalization")
    return Cost(8.0 * n, 2 * n * x[1] + params, "normalization")


def _copy(op: Op, a: _Args) -> Cost | None:
    name = op.name.removeprefix("aten::")
    tensors = a.tensors()
    if not tensors:
        return None
    if name in ("copy_", "_copy_from", "_copy_from_and_resize") and len(tensors) >= 2:
        dst, src = tensors[0], tensors[1]
        return Cost(0.0, _numel(src[0]) * src[1] + _numel(dst[0]) * dst[1], "copy")
    if name == "cat":
        total = sum(_bytes(t) for t in tensors)
        return Cost(0.0, 2 * total, "copy")
    x = tensors[0]
    out_size = SCALAR_TYPE_ITEMSIZE.get(a.scalar(1), x[1]) if name == "_to_copy" else x[1]
    return Cost(0.0, _numel(x[0]) * (x[1] + out_size), "copy")


def _fill(op: Op, a: _Args) -> Cost | None:
    x = a.tensor(0)
    return Cost(0.0, _bytes(x), "fill") if x else None


def _embedding(op: Op, a: _Args) -> Cost | None:
    w, idx = a.tensor(0), a.tensor(1)
    if w is None or idx is None:
        return None
    rows = _numel(idx[0])
    row_bytes = w[0][-1] * w[1]
    if op.name.endswith("backward"):
        grad = w                                          # (grad, indices, num_weights, ...)
        return Cost(float(_numel(grad[0])), 2 * _bytes(grad) + _bytes(idx), "embedding")
    return Cost(0.0, 2 * rows * row_bytes + _bytes(idx), "embedding")


def _gather(op: Op, a: _Args) -> Cost | None:
    """gather(self, dim, index) and take_along_dim(self, index): as many elements of self read as index holds
    (not the whole of self), the same number written."""
    source = a.tensor(0)
    at = 2 if op.name.removeprefix("aten::") == "gather" else 1
    index = a.tensor(at)
    if source is None or index is None:
        return None
    n = _numel(index[0])
    return Cost(0.0, n * 2 * source[1] + a.stored_numel(at) * index[1], "gather")


def _loss(op: Op, a: _Args) -> Cost | None:
    tensors = a.tensors()
    if not tensors:
        return None
    name = op.name.removeprefix("aten::")
    n = _numel(tensors[0][0])
    if name.startswith("nll_loss") and name.endswith("backward"):
        # (grad_output, self, target, ...): one gradient element written per row; the zero fill of the rest is
        # an op of its own (fill_ below it)
        grad, logits, target = a.tensor(0), a.tensor(1), a.tensor(2)
        if logits is None or target is None:
            return None
        rows = _numel(target[0])
        return Cost(float(rows), rows * (logits[1] + target[1]) + (_bytes(grad) if grad else 0), "loss")
    if name.startswith("nll_loss"):
        rows = _numel(tensors[0][0][:-1]) if len(tensors[0][0]) > 1 else 1
        return Cost(float(rows), rows * tensors[0][1] + sum(_bytes(t) for t in tensors[1:]), "loss")
    return Cost(3.0 * n, sum(_bytes(t) for t in tensors), "loss")


def _foreach(op: Op, a: _Args) -> Cost | None:
    lists, params = a.lists(), a.params
    if not lists:
        return None
    name = op.name.removeprefix("aten::")
    fused = name.startswith("_fused_adam") or name.startswith("_fused_sgd")
    note = None
    if any(lists):
        size = a.known_itemsize
        per_list = [sum(_numel(s) for s in shapes if _is_shape(s)) for shapes in lists]
    elif params is not None:   # recorded empty: the profiler's limit, not empty lists
        size, note = params.itemsize, f"tensor lists not recorded: {params.tensors} parameters' sizes assumed"
        # fused Adam(W): params, grads, exp_avg, exp_avg_sq (amsgrad's list and the step counts not counted)
        per_list = [params.numel] * (4 if name.startswith("_fused_adam") else 2 if fused else len(lists))
    else:
        return None
    n = per_list[0]
    if fused:
        # params, grads, exp_avg, exp_avg_sq (...): all read; params and states written
        lists_rw = len([p for p in per_list if p == n])
        return Cost(15.0 * n, (2 * lists_rw - 1) * n * size, "optimizer", note=note)
    reads = sum(per_list)
    return Cost(float(n * len(per_list)), (reads + n) * size, "foreach", note=note)


def _elementwise(op: Op, a: _Args, rule: str = "elementwise") -> Cost | None:
    tensors = a.tensors()
    if not tensors:
        return None
    out_shape = _broadcast([t[0] for t in tensors])
    # Python scalars arrive as 0-d double/long tensors; like torch's type promotion, they do not widen the output.
    full = [t for t in tensors if t[0]] or tensors
    out_size = max(t[1] for t in full)
    n = _numel(out_shape)
    reads = sum(_bytes(t) for t in tensors)
    inplace = op.name.endswith("_") and not op.name.endswith("__")
    return Cost(float(n), reads + (0 if inplace else n * out_size), rule)


# Views, metadata and allocation: no data moved by the op itself (a copy it needs runs as an op of its own under it).
_VIEWS = {"view", "reshape", "_reshape_alias", "_unsafe_view", "t", "t_", "transpose", "transpose_", "permute",
          "expand", "as_strided", "as_strided_", "detach", "detach_", "alias", "slice", "select", "unsqueeze",
          "unsqueeze_", "squeeze", "squeeze_", "narrow", "split", "split_with_sizes", "tensor_split", "chunk",
          "unbind", "diagonal", "movedim", "moveaxis", "swapaxes", "swapdims", "flatten", "unflatten", "unfold",
          "empty", "empty_like", "empty_strided", "resize_", "set_", "lift_fresh", "contiguous", "item",
          "_local_scalar_dense", "result_type", "broadcast_tensors", "view_as", "expand_as", "numpy_T",
          "resolve_conj", "resolve_neg", "conj", "_conj", "_neg_view", "view_as_real", "view_as_complex", "real",
          "imag", "indices", "values", "_indices", "_values", "is_same_size", "_has_compatible_shallow_copy_type"}
_REDUCTIONS = {"sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "norm", "linalg_vector_norm",
               "var", "std", "var_mean", "std_mean", "logsumexp", "prod", "all", "any", "count_nonzero", "_foreach_norm"}
_RULES = [
    (re.compile(r"^(mm|addmm_?|bmm|baddbmm_?|addbmm|matmul|linear|mv|addmv|dot|_addmm_activation|_scaled_mm|_int_mm)$"), _matmul),
    (re.compile(r"attention|^_flash_attention|^_efficient_attention"), _attention),
    (re.compile(r"^(convolution|_convolution|cudnn_convolution|cudnn_convolution_transpose|convolution_overrideable|"
                r"conv\dd|convolution_backward|mkldnn_convolution)$"), _conv),
    (re.compile(r"^(_softmax|_log_softmax|softmax|log_softmax|_softmax_backward_data|_log_softmax_backward_data)$"), _softmax),
    (re.compile(r"^(native_layer_norm|native_layer_norm_backward|_fused_rms_norm|_fused_rms_norm_backward|rms_norm|"
                r"native_batch_norm|native_batch_norm_backward|_batch_norm_impl_index|cudnn_batch_norm|"
                r"cudnn_batch_norm_backward|native_group_norm|native_group_norm_backward|layer_norm|group_norm)$"), _normalization),
    (re.compile(r"^(copy_|_copy_from|_copy_from_and_resize|_to_copy|clone|cat|to)$"), _copy),
    (re.compile(r"^(fill_|zero_|zeros|zeros_like|ones|ones_like|full|full_like|_foreach_zero_)$"), _fill),
    (re.compile(r"^(embedding|embedding_dense_backward|embedding_backward)$"), _embedding),
    (re.compile(r"^(gather|take_along_dim)$"), _gather),
    (re.compile(r"^(nll_loss\w*|mse_loss|l1_loss|smooth_l1_loss|huber_loss|binary_cross_entropy\w*|kl_div)$"), _loss),
    (re.compile(r"^_foreach_|^_fused_adam|^_fused_sgd"), _foreach),
]


def _norm_public(a: _Args, residual: int, rms: int) -> str:
    return "add_rms_norm" if a.tensor(residual) else "rms_norm" if a.scalar(rms) is True else "layer_norm"


# roofline's ops under torch.compile run as their registered ops (roofline::<internal>[_backward]) with their own
# arguments, unlinked to a forward: which public op each call is, and which argument holds its unit of traffic.
# (An eager call is recorded under its public name with the forward's inputs, its backward linked to it.)
_COMPILED = {
    "norm_rows": (lambda a: _norm_public(a, residual=1, rms=6), 0),
    "norm_rows_backward": (lambda a: _norm_public(a, residual=4, rms=5), 1),          # (dy, x, w, stats, dres, ...)
    "softmax_rows": (lambda a: "log_softmax" if a.scalar(1) is True else "softmax", 0),
    "softmax_rows_backward": (lambda a: "log_softmax" if a.scalar(2) is True else "softmax", 0),   # (y, dy, log)
    "swiglu_rows": (lambda a: "swiglu", 0),
    "swiglu_rows_backward": (lambda a: "swiglu", 0),                                  # (gate, up, dy)
    "gelu_backward": (lambda a: "gelu", 1),                                           # (dy, x, approximate)
    "cross_entropy_rows": (lambda a: "cross_entropy", 0),
    "cross_entropy_rows_backward": (lambda a: "cross_entropy", 0),                    # (grad, dloss)
}
# gelu, rope, linear, int8_linear and flash_attention are registered under their public names with the forward's
# arguments, so a compiled forward is costed as an eager one; their compiled backwards have no cost model yet.


def _compiled(op: Op) -> tuple[str, int] | None:
    """(public op, unit argument) of a roofline op run by torch.compile; None for an eager record."""
    internal = op.name.removeprefix("roofline::")
    if not op.name.startswith("roofline::") or op.forward >= 0 or internal not in _COMPILED:
        return None
    public, unit_at = _COMPILED[internal]
    return public(_Args(op)), unit_at


def display_name(op: Op) -> str:
    """The op's name in the tables: a roofline op run by torch.compile by its public name, as an eager call's."""
    found = _compiled(op)
    if found is None:
        return op.name
    return f"roofline::{found[0]}" + ("_backward" if op.name.endswith("_backward") else "")


def cost(op: Op, params: ParameterSet | None = None, forward: Op | None = None) -> Cost | None:
    """FLOPs and bytes of one call of the op; None for views and ops that move no data, and where the trace lacks
    what a count needs (no cost model: better no number than 0 bytes). params: the optimizer's parameters, for
    tensor lists the profiler did not record; forward: for a roofline op's backward, the forward call that made
    it (its inputs give the sizes)."""
    name = op.name.removeprefix("aten::")
    compiled = _compiled(op)
    if compiled is not None:
        return _roofline(compiled[0], _Args(op), op.name.endswith("_backward"), unit_at=compiled[1])
    if name.startswith("roofline::"):
        public = name.removeprefix("roofline::")
        backward = public.endswith("_backward")
        source = forward if backward else op
        return _roofline(public.removesuffix("_backward"), _Args(source), backward) if source else None
    if op.annotation:
        return None
    if name in _VIEWS:
        return Cost(0.0, 0.0, VIEW, note="a view or metadata op: it moves no data")
    a = _Args(op, params)
    if name in _REDUCTIONS:
        return _reduction(op, a)
    for pattern, rule in _RULES:
        if pattern.search(name):
            found = rule(op, a)
            if found is not None:
                return found if found.flops or found.bytes else None   # nothing counted: no cost model
            if rule is _foreach:
                return None   # its lists are all it reads: no elementwise default over the scalars
            break
    return _elementwise(op, a, rule="default" if not _is_elementwise_name(name) else "elementwise")


_ELEMENTWISE_NAMES = re.compile(
    r"^(add|sub|mul|div|neg|exp|exp2|expm1|log|log1p|log2|tanh|sigmoid|relu|gelu|silu|mish|clamp|clamp_min|"
    r"clamp_max|threshold|threshold_backward|gelu_backward|silu_backward|sigmoid_backward|tanh_backward|pow|sqrt|"
    r"rsqrt|where|abs|maximum|minimum|lerp|addcmul|addcdiv|masked_fill|square|dropout|native_dropout|erf|erfc|sin|"
    r"cos|reciprocal|eq|ne|lt|gt|le|ge|bitwise_\w+|logical_\w+|hardtanh|leaky_relu|elu|softplus|hardswish|"
    r"hardsigmoid|sign|floor|ceil|round|trunc|fmod|remainder|rsub|mse_loss_backward|mul_|add_|sub_|div_)_?$")


def _is_elementwise_name(name: str) -> bool:
    return bool(_ELEMENTWISE_NAMES.match(name))


# --------------------------------------------------------------------------- roofline per op

_NO_TENSOR_CORES = re.compile(r"ffma|simt|sgemm|gemv|dot_kernel", re.IGNORECASE)


@dataclass
class Peaks:
    """The ceilings ops are placed against: DRAM GB/s, matrix TFLOP/s by dtype, and the vector (non-tensor-core)
    fp32 rate for everything that is not a matmul."""
    gbps: float | None
    matmul_tflops: dict
    vector_tflops: float | None
    source: str                   # measured | datasheet | none
    l2_gbps: float | None = None  # measured by doctor: the ceiling of an op whose working set stays in L2
    l2_bytes: int | None = None

    @classmethod
    def from_ceilings(cls, c) -> "Peaks":
        tflops = dict(c.matmul_tflops or {})
        return cls(c.dram_gbps, tflops, tflops.get("fp32"), c.source, c.l2_gbps, c.l2_bytes)

    def compute(self, matmul_dtype: str | None, tensor_cores: bool) -> float | None:
        if matmul_dtype is None:
            return self.vector_tflops
        if matmul_dtype == "fp32":
            return self.matmul_tflops.get("tf32" if tensor_cores else "fp32")
        return self.matmul_tflops.get(matmul_dtype, self.matmul_tflops.get("bf16"))


@dataclass
class OpRow:
    """One aten op with one set of input shapes and dtypes: its calls, device time and place on the roofline."""
    name: str
    shapes: list
    dtypes: list
    rule: str | None              # which counting rule applied (None: no cost model, e.g. a view that launched work)
    count: int = 0
    us: float = 0.0
    flops: float = 0.0            # all calls together
    bytes: float = 0.0
    matmul_dtype: str | None = None
    tensor_cores: bool | None = None   # for matmul-like ops: whether the kernels used tensor cores
    backward: bool = False
    locations: dict = None        # Location -> us
    modules: dict = None          # module path -> us
    kernels: dict = None          # kernel short name -> us
    peak_tflops: float | None = None
    peak_gbps: float | None = None
    host_transfer: bool = False   # moves data between host and GPU: bound by PCIe, which no ceiling here measures
    l2_resident: bool = False     # faster than DRAM allows, with a working set that fits in L2: placed against L2
    note: str | None = None       # Cost.note
    scalars: list = None          # the first call's scalar arguments (a softmax's dim, a GELU's approximation)

    @property
    def intensity(self) -> float | None:
        return self.flops / self.bytes if self.bytes else None

    @property
    def tflops(self) -> float | None:
        return self.flops / self.us / 1e6 if self.us > 0 and self.flops else None

    @property
    def gbps(self) -> float | None:
        return self.bytes / self.us / 1e3 if self.us > 0 and self.bytes else None

    @property
    def roofline_us(self) -> float | None:
        """The time the op's work takes at the ceilings: max(FLOPs / peak, bytes / bandwidth)."""
        if self.rule in (None, VIEW) or (not self.peak_tflops and not self.peak_gbps):
            return None
        compute = self.flops / (self.peak_tflops * 1e6) if self.peak_tflops else 0.0
        memory = self.bytes / (self.peak_gbps * 1e3) if self.peak_gbps else 0.0
        return max(compute, memory)

    @property
    def bound(self) -> str | None:
        if self.rule in (None, VIEW) or not self.peak_tflops or not self.peak_gbps:
            return None
        ridge = self.peak_tflops * 1e12 / (self.peak_gbps * 1e9)
        if (self.intensity or 0.0) >= ridge:
            return "compute"
        return "memory (L2)" if self.l2_resident else "memory"

    @property
    def pct_of_roofline(self) -> float | None:
        r = self.roofline_us
        return r / self.us if r is not None and self.us > 0 else None

    @property
    def headroom_us(self) -> float | None:
        r = self.roofline_us
        return max(self.us - r, 0.0) if r is not None else None


def op_table(trace, attr, peaks: Peaks) -> list[OpRow]:
    """Device work grouped by (op, shapes, dtypes, pass), each group costed and placed on the roofline."""
    from roofline.profiler.kernels import short_name

    per_op: dict[int, list] = {}
    for w in attr.work:
        if w.op >= 0:
            per_op.setdefault(w.op, []).append(w)
    # An op that calls other ops (aten::matmul -> aten::mm) does its work through them: its own time (on a CPU,
    # its self time) is dispatch, and its FLOPs are counted once, on the callee.
    # A caller is composite when a callee does its kind of work (matmul -> mm, layer_norm -> native_layer_norm),
    # or when the caller has no rule of its own and a callee has one (cross_entropy_loss -> log_softmax, nll_loss).
    # Helpers of another kind (a bias copy_ under addmm, resolve_conj under mm) leave the caller's cost alone.
    children: dict[int, list] = {}
    for o in trace.ops:
        if o.parent in per_op and not o.annotation:
            children.setdefault(o.parent, []).append(o)

    params = ParameterSet.from_facts(trace.facts)

    def composite(op_index: int, own: Cost | None) -> bool:
        rules = {c.rule for child in children.get(op_index, ()) if (c := cost(child, params)) is not None} - {VIEW}
        return own is not None and (own.rule in rules or (own.rule == "default" and bool(rules - {"default"})))

    rows: dict[tuple, OpRow] = {}
    for op_index, works in per_op.items():
        op = trace.ops[op_index]
        backward = works[0].backward
        key = (op.name, repr(op.shapes), repr(op.dtypes), backward)
        row = rows.get(key)
        if row is None:
            c = cost(op, params, trace.ops[op.forward] if op.forward >= 0 else None)
            c = None if composite(op_index, c) else c
            row = rows[key] = OpRow(display_name(op), op.shapes or [], op.dtypes or [], c.rule if c else None,
                                    matmul_dtype=c.matmul_dtype if c else None, backward=backward,
                                    locations={}, modules={}, kernels={}, note=c.note if c else None,
                                    scalars=op.scalars or [])
            row._cost = c
        row.count += 1
        if row._cost is not None:
            row.flops += row._cost.flops
            row.bytes += row._cost.bytes
        for w in works:
            row.us += w.us
            loc = w.location
            row.locations[loc] = row.locations.get(loc, 0.0) + w.us
            row.modules[w.module] = row.modules.get(w.module, 0.0) + w.us
            if w.kind == "memcpy" and ("HtoD" in w.name or "DtoH" in w.name):
                row.host_transfer = True
            if w.kind == "kernel":
                k = short_name(w.name)
                row.kernels[k] = row.kernels.get(k, 0.0) + w.us
                if row.matmul_dtype is not None:
                    uses = not _NO_TENSOR_CORES.search(w.name)
                    row.tensor_cores = uses if row.tensor_cores is None else row.tensor_cores and uses
    for row in rows.values():
        del row._cost
        if row.host_transfer:
            continue              # no roofline: placing it against DRAM bandwidth would call every copy slow
        tensor_cores = row.tensor_cores if row.tensor_cores is not None else attr.device == "cuda"
        row.peak_tflops = peaks.compute(row.matmul_dtype, tensor_cores)
        row.peak_gbps = peaks.gbps
        # Lists costed from the optimizer's parameters that would have moved faster than twice the DRAM roof
        # were not the parameters (fused AdamW's step counts: 148 scalars, through _foreach_add_).
        if row.note and row.gbps and peaks.gbps and row.gbps > 2 * peaks.gbps:
            row.note = (f"tensor lists not recorded; as the optimizer's parameters they would have moved "
                        f"{row.gbps / 1e3:,.0f} TB/s, so they are smaller: {NO_COST_MODEL}")
            row.rule, row.flops, row.bytes = None, 0.0, 0.0
            continue
        # Above the DRAM roof is possible only from a cache: an op whose bytes per call fit in L2 is held against
        # the L2 ceiling, and says so; one that does not fit stays above its roof, a cost model to question.
        per_call = row.bytes / row.count if row.count else 0.0
        if (row.gbps and peaks.gbps and row.gbps > peaks.gbps and peaks.l2_gbps and peaks.l2_bytes
                and per_call <= peaks.l2_bytes):
            row.l2_resident, row.peak_gbps = True, peaks.l2_gbps
    return sorted(rows.values(), key=lambda r: -r.us)
