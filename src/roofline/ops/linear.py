"""linear: a GEMM with its epilogue fused, y = activation(x W^T + bias) + residual.

    linear(x, weight, bias, activation, residual)        weight [N, K] in x's dtype (nn.Linear's layout)

A program computes a [BLOCK_M, BLOCK_N] tile of y over K in BLOCK_K steps, tiles of x and W arriving through
Hopper's copy engine (TMA descriptors); the per-channel scale, the bias, the activation and the residual are applied
to the fp32 tile in registers before the one store, where a library GEMM followed by eager ops would write y and
read it back once per op. The same kernel takes int8 weights (ops.int8_linear beyond a few rows of x): a weight
tile is converted to x's dtype in registers (exactly: int8 fits in fp16 and bf16), and grouped scales multiply
each group's partial product, so that the kernel's K step never straddles two groups.

Tiles, warps and pipeline depth are autotuned per (M bucket, N, K) over a small set that suits Hopper; programs
are ordered in groups of GROUP_M row blocks, so that neighbours share tiles of W in L2.
The backward (linear) is torch's: the forward kernel writes Z = x W^T + bias beside y when a gradient is wanted (as
torch's autograd keeps it), dZ comes from torch's activation backward, then dX = dZ W, dW = dZ^T X (cuBLAS) and
dbias = sum dZ.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from roofline.ops._common import (TMA_ALIGN, as_stored, cdiv, choose_backend, fast_exp, fast_reciprocal, interpreting,
                                  next_power_of_2, sm_count, tl, tma_readable, triton, wants_grad)
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp
from roofline.ops._state import dot_settings
from roofline.ops.gelu import _gelu_and_grad

BACKENDS = ("torch", "triton")
ACTIVATIONS = (None, "gelu", "gelu_tanh", "silu", "relu")
_ACTIVATION_CODE = {name: code for code, name in enumerate(ACTIVATIONS)}
GROUP_M = 8

if triton is not None:

    @triton.jit
    def _activation(z, ACTIVATION: tl.constexpr):
        """activation(z), fp32, for the codes of ACTIVATIONS."""
        if ACTIVATION == 1 or ACTIVATION == 2:
            y, _ = _gelu_and_grad(z, ACTIVATION == 2)
            return y
        if ACTIVATION == 3:
            return z * fast_reciprocal(1.0 + fast_exp(-z))
        if ACTIVATION == 4:
            return tl.maximum(z, 0.0)
        return z

    @triton.jit
    def _round_to_tf32(value):
        """fp32 values rounded to tf32's 10-bit mantissa, to nearest even (still fp32 bits)."""
        bits = value.to(tl.int32, bitcast=True)
        bits = (bits + 0xFFF + ((bits >> 13) & 1)) & -8192
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def _accumulate(acc, a, b, scale_ptr, cols, k, GROUPS, GROUP_K: tl.constexpr, PRECISION: tl.constexpr):
        """acc + a b^T: b [BLOCK_N, BLOCK_K], int8 weights converted exactly to a's dtype; with grouped scales
        (GROUP_K > 0, a multiple of BLOCK_K) the product is scaled by the group's scale of each column."""
        b = b.to(a.dtype)
        if GROUP_K > 0:
            group_scale = tl.load(scale_ptr + cols * GROUPS + k // GROUP_K)
            return acc + tl.dot(a, tl.trans(b), input_precision=PRECISION) * group_scale[None, :]
        return tl.dot(a, tl.trans(b), acc, input_precision=PRECISION)

    @triton.jit
    def _scale_and_bias(acc, cols, N, scale_ptr, bias_ptr, W_SCALED: tl.constexpr, GROUP_K: tl.constexpr,
                        HAS_BIAS: tl.constexpr):
        """The epilogue's first part: a per-channel scale, then the bias."""
        if W_SCALED and GROUP_K == 0:
            acc = acc * tl.load(scale_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        if HAS_BIAS:
            acc = acc + tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
        return acc

    def _set_block_shapes(nargs):
        """Autotuning's pre-launch hook: the descriptors' blocks are the config's tiles (the output's, half a
        tile when the epilogue is split)."""
        bm, bn, bk = nargs["BLOCK_M"], nargs["BLOCK_N"], nargs["BLOCK_K"]
        nargs["x_desc"].block_shape = [bm, bk]
        nargs["w_desc"].block_shape = [bn, bk]
        for name in ("y_desc", "r_desc", "z_desc"):
            if nargs[name] is not None:
                nargs[name].block_shape = [bm, bn // 2 if nargs["SPLIT_EPILOGUE"] else bn]

    def _config(bm, bn, bk, stages, warps, persistent=False, split_epilogue=False):
        return triton.Config(dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PERSISTENT=persistent,
                                  SPLIT_EPILOGUE=split_epilogue),
                             num_stages=stages, num_warps=warps, pre_hook=_set_block_shapes)

    # Hopper: 128 x 128..256 tiles with 8 warps (two warp groups) for large M, each also persistent (a program
    # per SM walking the tiles, so that one tile's epilogue overlaps the next one's loads); narrow tiles and long
    # K steps for decode, where W's bytes are the cost and the grid must still cover the SMs.
    LARGE_TILES = ((128, 256, 64, 3, 8), (128, 128, 64, 4, 8), (256, 128, 64, 3, 8), (128, 256, 64, 4, 8),
                   (128, 128, 64, 4, 4))
    LARGE = [_config(*c, persistent=p) for c in LARGE_TILES for p in (False, True)]
    # An epilogue with an activation or a residual may go half a tile at a time: fewer registers live while
    # the activation's math runs on 128 x 256 fp32 values.
    LARGE_SPLIT = [_config(*c, persistent=True, split_epilogue=True) for c in LARGE_TILES]
    SMALL = [_config(64, 128, 64, 4, 4), _config(64, 64, 128, 4, 4), _config(64, 128, 128, 3, 4)]
    DECODE = [_config(16, 32, 256, 4, 4), _config(16, 64, 256, 4, 4), _config(16, 64, 128, 6, 4),
              _config(16, 128, 128, 4, 4), _config(32, 64, 256, 4, 4), _config(16, 16, 512, 4, 4),
              _config(16, 32, 512, 3, 4), _config(16, 16, 256, 6, 2), _config(32, 64, 64, 8, 4)]
    INTERPRETER = [_config(16, 32, 32, 1, 4)]   # one config: the interpreter would time every one of them

    def _prune(configs, named_args, **kwargs):
        """The configs worth timing for this M: decode tiles for a few rows, small ones up to 128, large beyond."""
        if interpreting():
            return [c for c in configs if _fits_groups(c, kwargs["GROUP_K"])]
        m = named_args["M"]
        epilogue = kwargs["ACTIVATION"] != 0 or kwargs["HAS_RESIDUAL"]
        wanted = DECODE if m <= 32 else (SMALL + DECODE[1:2]) if m <= 128 else (
            LARGE + SMALL[:1] + (LARGE_SPLIT if epilogue else []))
        return [c for c in configs if any(c is w for w in wanted) and _fits_groups(c, kwargs["GROUP_K"])]

    def _fits_groups(config, group_k) -> bool:
        """Whether a config's K step stays inside one group of grouped scales (group_k a multiple of 64)."""
        return group_k == 0 or group_k % config.kwargs["BLOCK_K"] == 0

    @triton.jit
    def _epilogue(acc, off_m, off_n, N, y_desc, r_desc, z_desc, bias_ptr, scale_ptr, ACTIVATION: tl.constexpr,
                  HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr, W_SCALED: tl.constexpr, GROUP_K: tl.constexpr,
                  SAVE_Z: tl.constexpr, UPCAST: tl.constexpr):
        """Store act(acc * scale + bias) + residual (and z = acc * scale + bias) at [off_m, off_n]."""
        cols = off_n + tl.arange(0, acc.shape[1])
        acc = _scale_and_bias(acc, cols, N, scale_ptr, bias_ptr, W_SCALED, GROUP_K, HAS_BIAS)
        if SAVE_Z:
            z_desc.store([off_m, off_n], as_stored(acc, UPCAST).to(z_desc.dtype))
        y = _activation(acc, ACTIVATION)
        if HAS_RESIDUAL:
            y = y + r_desc.load([off_m, off_n]).to(tl.float32)
        y_desc.store([off_m, off_n], as_stored(y, UPCAST).to(y_desc.dtype))

    @triton.jit
    def _linear_tile(tile, blocks_m, blocks_n, x_desc, w_desc, y_desc, r_desc, z_desc, bias_ptr, scale_ptr, N, K,
                     GROUPS, ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                     W_SCALED: tl.constexpr, GROUP_K: tl.constexpr, SAVE_Z: tl.constexpr, PRECISION: tl.constexpr,
                     UPCAST: tl.constexpr, ROUND_TF32: tl.constexpr, GROUP_M: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_EPILOGUE: tl.constexpr):
        """One tile of linear_kernel: its K loop and its epilogue."""
        # grouped order: GROUP_M row blocks sweep the column blocks together
        group = tile // (GROUP_M * blocks_n)
        first_m = group * GROUP_M
        rows_in_group = tl.minimum(blocks_m - first_m, GROUP_M)
        off_m = (first_m + (tile % (GROUP_M * blocks_n)) % rows_in_group) * BLOCK_M
        off_n = (tile % (GROUP_M * blocks_n)) // rows_in_group * BLOCK_N

        cols = off_n + tl.arange(0, BLOCK_N)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            a = x_desc.load([off_m, k])
            b = w_desc.load([off_n, k])
            if UPCAST:
                a = a.to(tl.float32)
            if ROUND_TF32:   # the tensor cores read tf32 by dropping fp32's low bits; cuBLAS rounds them
                a = _round_to_tf32(a)
                b = _round_to_tf32(b)
            acc = _accumulate(acc, a, b, scale_ptr, cols % N, k, GROUPS, GROUP_K, PRECISION)

        if SPLIT_EPILOGUE:
            left, right = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1).split()
            _epilogue(left, off_m, off_n, N, y_desc, r_desc, z_desc, bias_ptr, scale_ptr, ACTIVATION, HAS_BIAS,
                      HAS_RESIDUAL, W_SCALED, GROUP_K, SAVE_Z, UPCAST)
            _epilogue(right, off_m, off_n + BLOCK_N // 2, N, y_desc, r_desc, z_desc, bias_ptr, scale_ptr,
                      ACTIVATION, HAS_BIAS, HAS_RESIDUAL, W_SCALED, GROUP_K, SAVE_Z, UPCAST)
        else:
            _epilogue(acc, off_m, off_n, N, y_desc, r_desc, z_desc, bias_ptr, scale_ptr, ACTIVATION, HAS_BIAS,
                      HAS_RESIDUAL, W_SCALED, GROUP_K, SAVE_Z, UPCAST)

    @triton.autotune(configs=INTERPRETER if interpreting() else LARGE + LARGE_SPLIT + SMALL + DECODE,
                     key=["M_BUCKET", "N", "K", "ACTIVATION", "W_SCALED", "GROUP_K", "HAS_RESIDUAL"],
                     prune_configs_by=dict(early_config_prune=_prune))
    @triton.jit
    def linear_kernel(x_desc, w_desc, y_desc, r_desc, z_desc, bias_ptr, scale_ptr, M, N, K, GROUPS, M_BUCKET,
                      ACTIVATION: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                      W_SCALED: tl.constexpr, GROUP_K: tl.constexpr, SAVE_Z: tl.constexpr, PRECISION: tl.constexpr,
                      UPCAST: tl.constexpr, ROUND_TF32: tl.constexpr, GROUP_M: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PERSISTENT: tl.constexpr,
                      SPLIT_EPILOGUE: tl.constexpr):
        """Program: the tiles [BLOCK_M, BLOCK_N] tile_id, tile_id + programs, ... (one tile, unless PERSISTENT)
        of y = act(z) + residual, z = x W^T * scale + bias (and z itself into z_desc if SAVE_Z, for the
        backward); scale [N], or [N, GROUPS] for groups of GROUP_K along K. M_BUCKET only keys the autotuning.
        UPCAST: multiply in fp32 (Triton 3.6's interpreter returns garbage from a bf16 dot; fp32 is exact for bf16
        products). SPLIT_EPILOGUE: the epilogue by halves of the tile."""
        blocks_m = tl.cdiv(M, BLOCK_M)
        blocks_n = tl.cdiv(N, BLOCK_N)
        for tile in tl.range(tl.program_id(0), blocks_m * blocks_n, tl.num_programs(0), flatten=PERSISTENT):
            _linear_tile(tile, blocks_m, blocks_n, x_desc, w_desc, y_desc, r_desc, z_desc, bias_ptr, scale_ptr, N, K,
                         GROUPS, ACTIVATION, HAS_BIAS, HAS_RESIDUAL, W_SCALED, GROUP_K, SAVE_Z, PRECISION, UPCAST,
                         ROUND_TF32, GROUP_M, BLOCK_M, BLOCK_N, BLOCK_K, SPLIT_EPILOGUE)


# --------------------------------------------------------------------------- launching

def _tma_ready(t: torch.Tensor) -> torch.Tensor:
    """t (2-D), or a copy the copy engine can read (tma_readable, and rows a multiple of 16 bytes wide). A row
    whose bytes are no multiple of 16 gets zero columns added (columns that are never stored, or that add zero
    products along K)."""
    size = t.element_size()
    if tma_readable(t) and t.shape[1] * size % TMA_ALIGN == 0:
        return t
    width = -(-t.shape[1] * size // TMA_ALIGN) * TMA_ALIGN // size
    return F.pad(t, (0, width - t.shape[1])) if width != t.shape[1] else t.clone(memory_format=torch.contiguous_format)


def _matrix(t: torch.Tensor | None):
    """(block placeholder, shape, strides) of a descriptor of t's memory as the 2-D matrix it holds: its rows
    are its leading dimensions (contiguous among themselves), its last dimension the columns. The autotuner's
    pre-hook sets the block."""
    if t is None:
        return None
    return [1, TMA_ALIGN // t.element_size()], (t.numel() // t.shape[-1], t.shape[-1]), (t.stride(-2), 1)


def _group_k(weight: torch.Tensor, scale: torch.Tensor | None) -> int:
    """The group size along K of grouped int8 scales [N, K / G]; 0 for per-channel scales [N] (or none)."""
    return weight.shape[1] // scale.shape[1] if scale is not None and scale.dim() == 2 else 0


class LinearPlan:
    """The launch of linear_kernel for an [M, K] x (any leading shape whose rows are evenly strided, as
    _tma_ready leaves it) and weight [N, K] of given strides and dtypes on one device; bias, scale (int8 weights,
    per channel or per group), residual, activation and whether z is kept. Outputs are [M, N], or x's leading
    shape by N (`out_shape`), contiguous where N's rows are 16-byte multiples (else padded views)."""

    def __init__(self, x, weight, bias, scale, residual, activation: int, save_z: bool, out_shape):
        m, k = x.numel() // x.shape[-1], x.shape[-1]
        n = weight.shape[0]
        self.m, self.n, self.out_shape, self.dtype, self.device = m, n, tuple(out_shape), x.dtype, x.device
        self.step = TMA_ALIGN // x.element_size()
        self.padded = n % self.step != 0   # y's rows are not 16-byte multiples: a padded buffer, sliced
        group_k = _group_k(weight, scale)
        programs = sm_count(x.device) if x.is_cuda else 1
        y_like = (self.m, self.n), (-(-n // self.step) * self.step, 1)

        def grid(meta):
            tiles = cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"])
            return (min(tiles, programs) if meta["PERSISTENT"] else tiles,)

        placeholder = [1, self.step]
        self.launch = Launch(
            linear_kernel, grid, x.device.index if x.is_cuda else -1,
            descriptors={0: _matrix(x), 1: _matrix(weight), 2: (placeholder, *y_like), 3: _matrix(residual),
                         4: (placeholder, *y_like)},
            ACTIVATION=activation, HAS_BIAS=bias is not None, HAS_RESIDUAL=residual is not None,
            W_SCALED=scale is not None, GROUP_K=group_k, SAVE_Z=save_z, **dot_settings(x.dtype), GROUP_M=GROUP_M,
            ROUND_TF32=x.dtype == torch.float32 and not interpreting())
        self.args = (m, n, k, scale.shape[1] if group_k else 1, next_power_of_2(m))
        self.activation, self.save_z = activation, save_z

    def _output(self) -> torch.Tensor:
        if not self.padded:
            return torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        return torch.empty(self.m, -(-self.n // self.step) * self.step, dtype=self.dtype,
                           device=self.device)[:, :self.n]

    def forward(self, x, weight, bias, residual, activation: int, save_z: bool):
        """linear's forward (the registered op's signature)."""
        return self.run(x, weight, bias, None, residual)

    def backward(self, dy, x, weight, z, activation: int, bias_grad: bool):
        """linear's backward: torch's matmuls."""
        return _backward(dy, x, weight, z, activation, bias_grad)

    def run(self, x, weight, bias, scale, residual) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(y, z or None): y = act(z) + residual, z = x weight^T (* scale) + bias, for x, weight and residual
        laid out as the plan's and 16-byte aligned (a padded y is made contiguous, in out_shape)."""
        y = self._output()
        z = self._output() if self.save_z else None
        pointers = (0 if bias is None else bias.data_ptr()) | (0 if scale is None else scale.data_ptr())
        self.launch.for_pointers(pointers)(x, weight, y, residual, z, bias, scale, *self.args)
        if self.padded:
            y = y.contiguous().view(self.out_shape)
        return y, z


@plan_cache("linear", key=lambda x, weight, bias, scale, residual, activation, save_z, out_shape: (
    x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, weight.dtype, x.device,
    None if bias is None else bias.dtype, None if scale is None else scale.shape,
    None if residual is None else residual.stride(), activation, save_z, out_shape))
def _plan(x, weight, bias, scale, residual, activation: int, save_z: bool, out_shape) -> LinearPlan:
    """The plan for x, weight and residual as _tma_ready leaves them."""
    return LinearPlan(x, weight, bias, scale, residual, activation, save_z, out_shape)


def _prepare(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
             residual: torch.Tensor | None):
    """2-D x, weight and residual the copy engine can read (padded along K alike where a row is no 16-byte
    multiple), contiguous bias and scale."""
    x, weight = _tma_ready(x), _tma_ready(weight)
    if x.shape[1] != weight.shape[1]:   # one of them padded along K: pad the other alike
        width = max(x.shape[1], weight.shape[1])
        x, weight = (F.pad(t, (0, width - t.shape[1])) for t in (x, weight))
    residual = _tma_ready(residual) if residual is not None else None
    bias, scale = (None if t is None else t.contiguous() for t in (bias, scale))
    return x, weight, bias, scale, residual


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, scale: torch.Tensor | None,
           residual: torch.Tensor | None, activation: int, save_z: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """y = act(z) + residual, z = x weight^T (* scale) + bias, for 2-D x [M, K] and weight [N, K]; and z if
    save_z (else an empty tensor). y comes back contiguous."""
    x, weight, bias, scale, residual = _prepare(x, weight, bias, scale, residual)
    y, z = _plan(x, weight, bias, scale, residual, activation, save_z, (x.shape[0], weight.shape[0])).run(
        x, weight, bias, scale, residual)
    return y, x.new_empty(0) if z is None else z



# --------------------------------------------------------------------------- linear: registration and autograd

def linear_reference(x, weight, bias=None, activation=None, residual=None) -> torch.Tensor:
    """What linear computes, in torch, in x's dtype."""
    y = F.linear(x, weight, bias)
    y = {None: lambda t: t, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "silu": F.silu,
         "relu": F.relu}[activation](y)
    return y if residual is None else y + residual


def _forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor | None,
             activation: int, save_z: bool) -> tuple[torch.Tensor, torch.Tensor]:
    return launch(x, weight, bias, None, residual, activation, save_z)


def _forward_fake(x, weight, bias, residual, activation, save_z):
    y = x.new_empty(x.shape[0], weight.shape[0])
    return y, (x.new_empty(y.shape) if save_z else x.new_empty(0))


def _activation_backward(dy: torch.Tensor, z: torch.Tensor, activation: int) -> torch.Tensor:
    """dL/dz from dL/dy = dL/d act(z), with the kernels torch's own autograd uses (so the same rounding)."""
    name = ACTIVATIONS[activation]
    if name in ("gelu", "gelu_tanh"):
        return torch.ops.aten.gelu_backward(dy, z, approximate="tanh" if name == "gelu_tanh" else "none")
    if name == "silu":
        return torch.ops.aten.silu_backward(dy, z)
    return torch.ops.aten.threshold_backward(dy, z, 0)


def _backward(dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, activation: int,
              bias_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dx, dweight, dbias) for x of any leading shape (its rows against dy's)."""
    dz = _activation_backward(dy, z, activation) if activation else dy
    rows = dz if dz.dim() == 2 else dz.reshape(-1, dz.shape[-1])
    # torch's reductions accumulate half-precision sums in fp32 and round once: one kernel, as torch's own
    # backward of a bias takes it
    db = rows.sum(0) if bias_grad else dz.new_empty(0)
    return dz @ weight, rows.t() @ (x if x.dim() == 2 else x.reshape(-1, x.shape[-1])), db


def _backward_fake(dy, x, weight, z, activation, bias_grad):
    return torch.empty_like(x), torch.empty_like(weight), dy.new_empty(weight.shape[0] if bias_grad else 0)


def _save(ctx, inputs, output):
    x, weight, bias, residual, activation, save_z = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.activation, ctx.has_bias, ctx.has_residual = activation, bias is not None, residual is not None
    if output[1] is not None:
        ctx.mark_non_differentiable(output[1])


def _backward_rule(ctx, run_backward, dy, _dz):
    x, weight, z = ctx.saved_tensors
    dx, dw, db = run_backward(dy, x, weight, z, ctx.activation, ctx.has_bias)
    return dx, dw, db if ctx.has_bias else None, dy if ctx.has_residual else None, None, None


def _signature(x, weight, bias, activation, residual, backend):
    """A call's signature, whether autograd records it last."""
    return (type(x), tensor_key(x), tensor_key(weight), tensor_key(bias), activation, tensor_key(residual), backend,
            wants_grad(x, weight, bias, residual))


class _AsGiven:
    """linear's eager forward and backward for tensors as the caller holds them: launch() prepares them for the
    copy engine (a pad or a copy where it cannot read them as they are), which a LinearPlan's forward, for
    tensors already so, does not."""
    forward = staticmethod(_forward)
    backward = staticmethod(_backward)


_linear = KernelOp("linear", forward=_forward, forward_fake=_forward_fake, backward=_backward,
                   backward_fake=_backward_fake, setup_context=_save, backward_rule=_backward_rule,
                   plan=lambda *args: _AsGiven, signature=_signature)


def _check_linear(x, weight, bias, activation, residual) -> None:
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise ValueError(f"linear: weight must be a 2-D tensor [out_features, in_features], got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    if x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: x's last dimension ({x.shape[-1] if x.dim() else 'none'}) must be weight's "
                         f"in_features ({weight.shape[1]})")
    for name, t in (("weight", weight), ("bias", bias), ("residual", residual)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"linear: {name} must be a torch.Tensor or None, got {type(t).__name__}")
        if t.dtype != x.dtype:
            raise TypeError(f"linear: {name} has dtype {t.dtype} but x has {x.dtype}")
        if t.device != x.device:
            raise ValueError(f"linear: {name} is on {t.device} but x is on {x.device}")
    if bias is not None and bias.shape != (weight.shape[0],):
        raise ValueError(f"linear: bias must have shape [{weight.shape[0]}], got {list(bias.shape)}")
    if residual is not None and residual.shape != (*x.shape[:-1], weight.shape[0]):
        raise ValueError(f"linear: residual must have the output's shape {[*x.shape[:-1], weight.shape[0]]}, "
                         f"got {list(residual.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {ACTIVATIONS}, got {activation!r}")


@replayed_entry
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
           residual: torch.Tensor | None = None, *, backend: str | None = None) -> torch.Tensor:
    """activation(x @ weight^T + bias) + residual in one GEMM whose epilogue applies bias, activation and
    residual to each tile before it is stored. weight in nn.Linear's layout [out_features, in_features];
    activation one of ACTIVATIONS; residual the output's shape. fp16/bf16 multiply on the tensor cores with fp32
    accumulation; fp32 as tf32 (as torch.backends.cuda.matmul.allow_tf32 = True would).

    backend: "triton" (the default on CUDA), or "torch" (linear_reference; the default on CPU).
    """
    key, plan = _linear.seen(x, weight, bias, activation, residual, backend)
    # the copy engine reads x, weight and residual: 16-byte aligned, which the signature cannot hold
    if plan is not None and (x.data_ptr() | weight.data_ptr()
                             | (0 if residual is None else residual.data_ptr())) & 15 == 0:
        return _linear.eager(plan, key[-1], x, weight, bias, residual, plan.activation, plan.save_z)[0]
    backend = choose_backend("linear", x, backend, BACKENDS)
    _check_linear(x, weight, bias, activation, residual)
    if backend == "torch" or x.numel() == 0 or weight.numel() == 0:
        return linear_reference(x, weight, bias, activation, residual)
    rows = x.reshape(-1, x.shape[-1])
    residual_rows = None if residual is None else residual.reshape(rows.shape[0], -1)
    grad = wants_grad(x, weight, bias, residual)
    code, save_z = _ACTIVATION_CODE[activation], grad and activation is not None
    out_shape = (*x.shape[:-1], weight.shape[0])
    if torch.compiler.is_compiling():
        return _linear(rows, weight, bias, residual_rows, code, save_z)[0].view(out_shape)
    x2, w2, b2, _, r2 = _prepare(rows, weight, bias, None, residual_rows)
    if x2.data_ptr() != x.data_ptr() or w2 is not weight or b2 is not bias or (
            residual is not None and r2.data_ptr() != residual.data_ptr()):   # padded or copied
        return _linear.eager(_AsGiven, grad, rows, weight, bias, residual_rows, code, save_z)[0].view(out_shape)
    # x and residual are the rows the plan describes (views of their memory, no copies): the plan takes them as
    # they are, and a later call with this signature too
    plan = _plan(x2, w2, b2, None, r2, code, save_z, out_shape)
    _linear.keep(key, plan)
    return _linear.eager(plan, grad, x, weight, bias, residual, code, save_z)[0]
