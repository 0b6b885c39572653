"""int8_linear: x @ dequantize(W)^T + bias with the weight read as int8 (weight-only quantization), and
quantize_int8 to make such a weight.

    int8_linear(x, weight_int8, scale, bias)     weight [N, K] int8 and scale [N] (W = weight_int8 * scale[:, None])
                                                 or [N, K / G] (a scale per group of G weights along K)

The weights cross memory at one byte each, which is what a decode step (a few rows of x) is bound by. Up to
DECODE_ROWS rows of x take int8_decode_kernel: narrow column blocks, so that many programs stream W at once, and
plain vector loads (K split in shares where N alone gives too few programs). One row of x with per-channel scales
takes int8_gemv_kernel, on the CUDA cores, in thousands of programs of a few columns. Beyond DECODE_ROWS rows,
ops.linear's tiled kernel takes the int8 weight and its scales. The backward, for x only, is torch's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roofline.ops._common import as_stored, cdiv, choose_backend, interpreting, next_power_of_2, sm_count, tl, triton
from roofline.ops._state import dot_settings
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp
from roofline.ops.linear import BACKENDS, LinearPlan, _group_k, _prepare

DECODE_ROWS = 16   # up to this many rows of x take the decode kernels (one 16-row MMA tile)

if triton is not None:
    from roofline.ops.linear import _accumulate, _fits_groups, _scale_and_bias

    # The decode kernel: up to DECODE_ROWS rows of x, int8 weights. W's bytes are all the cost, so the column
    # blocks are narrow (N / BLOCK_N programs stream W side by side) and the K steps long.

    def _decode_config(bn, bk, stages, warps):
        return triton.Config(dict(BLOCK_N=bn, BLOCK_K=bk), num_stages=stages, num_warps=warps)

    INT8_DECODE = [_decode_config(*c) for c in ((16, 256, 4, 2), (16, 512, 3, 4), (32, 256, 4, 4), (32, 512, 3, 4),
                                                (64, 128, 4, 4), (64, 256, 3, 4), (16, 128, 6, 2), (32, 64, 8, 4),
                                                (16, 1024, 2, 4))]

    def _prune_decode(configs, named_args, **kwargs):
        return [c for c in configs if _fits_groups(c, kwargs["GROUP_K"])]

    def _tuned(configs, **autotune):
        """triton.autotune over `configs`; under the interpreter, which times nothing, a block by N instead. There
        each program runs as Python, its time about proportional to its K steps whatever its block: K steps of
        64 (the tests' K of 70-4095 still take several), and blocks of 32 columns up to N = 64 (the tests' N = 33
        still splits into a full block and a masked one), of 128 beyond (a decode step's wider layers in a
        quarter of the programs)."""
        if interpreting():
            return triton.heuristics(dict(BLOCK_N=lambda args: 32 if args["N"] <= 64 else 128,
                                          BLOCK_K=lambda args: 64))
        return triton.autotune(configs=configs, **autotune)

    def _fresh_tickets(nargs, reset_only=False):
        """Autotuning's hook before each launch it times: a split K's tickets zeroed again (DecodePlan zeroes
        them once; without this the later launches would never see the last ticket, skip the epilogue, and time
        short)."""
        if nargs["ticket_ptr"] is not None:
            nargs["ticket_ptr"].zero_()

    @_tuned(INT8_DECODE, key=["N", "K", "GROUP_K", "SPLIT_K"], prune_configs_by=dict(early_config_prune=_prune_decode),
            pre_hook=_fresh_tickets)
    @triton.heuristics(dict(EVEN_K=lambda args: args["K"] % args["BLOCK_K"] == 0))
    @triton.jit
    def int8_decode_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, y_ptr, partial_ptr, ticket_ptr, M, N, K, GROUPS,
                           stride_x, stride_w, stride_y, HAS_BIAS: tl.constexpr, GROUP_K: tl.constexpr,
                           SPLIT_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                           EVEN_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr):
        """Program (column block, split): y[:M, BLOCK_N columns] = x W^T * scale + bias, M <= BLOCK_M, W int8
        [N, K] (rows stride_w apart), scale [N] or [N, GROUPS]. Columns past N read row N - 1 again (no mask)
        and are not stored.

        With SPLIT_K > 1 each of a column block's programs sums its share of K, writes it to partial_ptr
        [SPLIT_K, BLOCK_M, N] (fp32) and takes a ticket (ticket_ptr, one zeroed int32 per column block); the
        program holding the last ticket adds the shares up and applies the epilogue. More programs stream W at
        once when N alone gives too few column blocks to keep the memory system busy."""
        rows = tl.arange(0, BLOCK_M)
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        safe_cols = tl.minimum(cols, N - 1)
        ks = tl.arange(0, BLOCK_K)
        share = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
        k_start = tl.program_id(1) * share
        x_ptrs = x_ptr + rows[:, None] * stride_x + (k_start + ks)[None, :]
        w_ptrs = w_ptr + safe_cols[:, None].to(tl.int64) * stride_w + (k_start + ks)[None, :]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k in range(k_start, tl.minimum(k_start + share, K), BLOCK_K):
            if EVEN_K:
                a = tl.load(x_ptrs, mask=rows[:, None] < M, other=0.0)
                b = tl.load(w_ptrs)
            else:
                in_k = (k + ks)[None, :] < K
                a = tl.load(x_ptrs, mask=(rows[:, None] < M) & in_k, other=0.0)
                b = tl.load(w_ptrs, mask=in_k, other=0)
            if UPCAST:
                a = a.to(tl.float32)
            acc = _accumulate(acc, a, b, scale_ptr, safe_cols, k, GROUPS, GROUP_K, PRECISION)
            x_ptrs += BLOCK_K
            w_ptrs += BLOCK_K
        if SPLIT_K == 1:
            _decode_epilogue(acc, rows, cols, M, N, scale_ptr, bias_ptr, y_ptr, stride_y, HAS_BIAS, GROUP_K, UPCAST)
        else:
            shares = partial_ptr + rows[:, None] * N + cols[None, :]
            tl.store(shares + tl.program_id(1) * BLOCK_M * N, acc, mask=cols[None, :] < N)
            tl.debug_barrier()   # every thread's share is written before the ticket releases it
            if tl.atomic_add(ticket_ptr + tl.program_id(0), 1, sem="acq_rel") == SPLIT_K - 1:
                acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
                for split in tl.static_range(SPLIT_K):   # from L2, where the other programs' shares are
                    acc += tl.load(shares + split * BLOCK_M * N, mask=cols[None, :] < N, other=0.0,
                                   cache_modifier=".cg")
                _decode_epilogue(acc, rows, cols, M, N, scale_ptr, bias_ptr, y_ptr, stride_y, HAS_BIAS, GROUP_K,
                                 UPCAST)

    # One row of x with per-channel scales (a decode step of one token): a GEMV on the CUDA cores. Many small
    # programs of a few columns each, and K steps of a few kilobytes, keep enough loads in flight to stream W;
    # a column block's product with one row needs no tensor cores. Each config is among the fastest at one of
    # a Llama decode step's shapes on the H100 (N x K = 512 .. 32000 x 2048 and 2048 x 5632;
    # benchmarks/gemv_probe.py, results in benchmarks/results/h100-models.md).

    def _gemv_config(bn, bk, warps):
        return triton.Config(dict(BLOCK_N=bn, BLOCK_K=bk), num_stages=1, num_warps=warps)

    INT8_GEMV = [_gemv_config(*c) for c in ((1, 2048, 4), (1, 2048, 8), (2, 1024, 4), (2, 2048, 4), (4, 1024, 4),
                                            (4, 2048, 4), (8, 2048, 8), (4, 512, 2), (16, 512, 8), (4, 256, 2),
                                            (16, 256, 4))]

    def _prune_gemv(configs, named_args, **kwargs):
        """No K step longer than K needs (a masked half of every load)."""
        longest = max(256, next_power_of_2(named_args["K"]))
        return [c for c in configs if c.kwargs["BLOCK_K"] <= longest]

    @triton.jit
    def _int8_to_float32(w):
        """int8 to fp32 exactly, in two full-rate ALU instructions and a bitcast: the float with bits 0x4B000000 +
        (w + 128) is 2^23 + 128 + w. The conversion instruction (I2F) runs at a quarter of that rate on
        sm_90 (16 a cycle per SM), about the rate at which W arrives at full bandwidth, so the GEMV is faster
        with this at a decode step's shapes, alone and in the step's chain of matmuls (benchmarks/gemv_probe.py;
        measured: benchmarks/results/h100-models.md)."""
        return (w.to(tl.int32) + 0x4B000080).to(tl.float32, bitcast=True) - 8388736.0

    @triton.jit
    def _gemv_loads(x_ptr, w_ptrs, k, ks, K, EVEN_K: tl.constexpr):
        """The GEMV's K step at k: x's [BLOCK_K] (kept in cache for the other programs) and W's [BLOCK_N,
        BLOCK_K] (streamed once)."""
        if EVEN_K:
            return (tl.load(x_ptr + k + ks, eviction_policy="evict_last"),
                    tl.load(w_ptrs, eviction_policy="evict_first"))
        return (tl.load(x_ptr + k + ks, mask=k + ks < K, other=0.0, eviction_policy="evict_last"),
                tl.load(w_ptrs, mask=(k + ks)[None, :] < K, other=0, eviction_policy="evict_first"))

    @_tuned(INT8_GEMV, key=["N", "K"], prune_configs_by=dict(early_config_prune=_prune_gemv))
    @triton.heuristics(dict(EVEN_K=lambda args: args["K"] % args["BLOCK_K"] == 0))
    @triton.jit
    def int8_gemv_kernel(x_ptr, w_ptr, scale_ptr, bias_ptr, y_ptr, N, K, stride_w, HAS_BIAS: tl.constexpr,
                         UPCAST: tl.constexpr, EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        """Program: y[BLOCK_N columns] = x W^T * scale + bias for one row x [K] (contiguous), W int8 [N, K] (rows
        stride_w apart), scale [N]. W streams through once (evict first); x stays in cache for every program."""
        cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        ks = tl.arange(0, BLOCK_K)
        w_ptrs = w_ptr + tl.minimum(cols, N - 1)[:, None].to(tl.int64) * stride_w + ks[None, :]
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
        for k in range(0, K, BLOCK_K):
            x, w = _gemv_loads(x_ptr, w_ptrs, k, ks, K, EVEN_K)
            acc += _int8_to_float32(w) * x.to(tl.float32)[None, :]
            w_ptrs += BLOCK_K
        _decode_epilogue(tl.sum(acc, axis=1)[None, :], tl.arange(0, 1), cols, 1, N, scale_ptr, bias_ptr, y_ptr, 0,
                         HAS_BIAS, 0, UPCAST)

    @triton.jit
    def _decode_epilogue(acc, rows, cols, M, N, scale_ptr, bias_ptr, y_ptr, stride_y, HAS_BIAS: tl.constexpr,
                         GROUP_K: tl.constexpr, UPCAST: tl.constexpr):
        acc = _scale_and_bias(acc, cols, N, scale_ptr, bias_ptr, True, GROUP_K, HAS_BIAS)
        tl.store(y_ptr + rows[:, None] * stride_y + cols[None, :], as_stored(acc, UPCAST).to(y_ptr.dtype.element_ty),
                 mask=(rows[:, None] < M) & (cols[None, :] < N))


# --------------------------------------------------------------------------- int8 decode: launching

class DecodePlan:
    """The launch of the decode kernels for x [M <= DECODE_ROWS, K] (rows stride_x apart, unit last stride; any
    leading shape) and int8 weight [N, K] of given strides, scales per channel or per group, with or without
    bias: int8_gemv_kernel for one row with per-channel scales, else int8_decode_kernel, K split where N alone
    gives too few programs."""

    def __init__(self, x, weight, scale, has_bias: bool, out_shape):
        m, k = x.numel() // x.shape[-1], x.shape[-1]
        n = weight.shape[0]
        self.out_shape, self.dtype, self.device, self.n = tuple(out_shape), x.dtype, x.device, n
        index = x.device.index if x.is_cuda else -1
        dot = dot_settings(x.dtype)
        self.gemv = m == 1 and scale.dim() == 1
        stride_x = x.stride(-2) if x.dim() > 1 else k
        if self.gemv:
            self.launch = Launch(int8_gemv_kernel, lambda meta: (cdiv(n, meta["BLOCK_N"]),), index,
                                 HAS_BIAS=has_bias, UPCAST=dot["UPCAST"])
            self.args = (n, k, weight.stride(0))
            return
        self.split = split = decode_split_k(n, k, x.device)
        self.launch = Launch(int8_decode_kernel, lambda meta: (cdiv(n, meta["BLOCK_N"]), split), index,
                             HAS_BIAS=has_bias, GROUP_K=_group_k(weight, scale), SPLIT_K=split,
                             **dot, BLOCK_M=DECODE_ROWS)
        self.args = (m, n, k, scale.shape[1] if scale.dim() == 2 else 1, stride_x, weight.stride(0), n)

    def forward(self, x, weight, scale, bias) -> torch.Tensor:
        y = torch.empty(self.out_shape, dtype=self.dtype, device=self.device)
        pointers = x.data_ptr() | weight.data_ptr() | scale.data_ptr() | (0 if bias is None else bias.data_ptr())
        launch = self.launch.for_pointers(pointers)
        if self.gemv:
            launch(x, weight, scale, bias, y, *self.args)
            return y
        partial = tickets = None   # only a split K needs the shares' buffer and the zeroed tickets
        if self.split > 1:
            partial = torch.empty(self.split * DECODE_ROWS * self.n, dtype=torch.float32, device=self.device)
            tickets = torch.zeros(cdiv(self.n, DECODE_MIN_BLOCK_N), dtype=torch.int32, device=self.device)
        launch(x, weight, scale, bias, y, partial, tickets, *self.args)
        return y


DECODE_MIN_BLOCK_N = 16      # the narrowest column block of the decode kernel's configs
DECODE_PROGRAMS_PER_SM = 4   # split K until there are about this many programs per SM (narrowest blocks)
DECODE_MIN_SHARE = 4096      # ...but no share is shorter than this: splitting K = 4096 in 2, 4 or 8 made the kernel
                             # slower (the tickets' memset, the shares' round trip), K = 14336 in 2 faster
                             # (measured: benchmarks/results/h100-linear.md, "Reading (run 4)")


def decode_split_k(n: int, k: int, device: torch.device) -> int:
    """Into how many shares the decode kernel splits K (a power of two, at most 8): enough that the column
    blocks times the shares give each SM a few programs, when N alone does not."""
    programs = sm_count(device) * DECODE_PROGRAMS_PER_SM if device.type == "cuda" else 1
    split = 1
    blocks = cdiv(n, 2 * DECODE_MIN_BLOCK_N)   # the configs' typical column block: 32
    while split < 8 and blocks * split < programs and k // (2 * split) >= DECODE_MIN_SHARE:
        split *= 2
    return split


@plan_cache("int8_linear decode", key=lambda x, weight, scale, bias, out_shape: (
    x.shape, x.stride(), weight.shape, weight.stride(), scale.shape, x.dtype, x.device, bias is not None, out_shape))
def _decode_plan(x, weight, scale, bias, out_shape) -> DecodePlan:
    """The plan for x and weight with unit last strides, scale contiguous."""
    return DecodePlan(x, weight, scale, bias is not None, out_shape)


# --------------------------------------------------------------------------- int8 weight-only

INT8_DTYPES = (torch.float16, torch.bfloat16)


GROUP_MULTIPLE = 64   # group sizes are multiples of the kernels' smallest K step


def quantize_int8(weight: torch.Tensor, group_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8: (q [N, K] int8, scale fp32) with weight ~= q * scale, each scale the largest |w| it
    covers / 127. group_size None: a scale per output channel, scale [N]. group_size G (a multiple of 64 that
    divides K): a scale per G consecutive weights of a row, scale [N, K / G]; heavy-tailed rows, whose few large
    weights set a coarse step for the whole row, keep more signal (on Laplace weights, ~36.7 dB per channel and
    ~40.6 dB with G = 128, against the bf16 layer). (Clipping the largest values, with the scale that minimizes
    the squared error, gained nothing on Gaussian, Laplace, Student-t or outlier-sprinkled rows: a few large
    weights cost more clipped than the finer step saves.)"""
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or not weight.is_floating_point() \
            or weight.shape[1] == 0:
        raise ValueError(f"quantize_int8: weight must be a 2-D floating-point tensor with at least one column, got "
                         f"{getattr(weight, 'shape', type(weight).__name__)}")
    n, k = weight.shape
    if group_size is not None and (isinstance(group_size, bool) or not isinstance(group_size, int)
                                   or group_size <= 0 or group_size % GROUP_MULTIPLE or k % group_size):
        raise ValueError(f"quantize_int8: group_size must be None or a multiple of {GROUP_MULTIPLE} that divides "
                         f"in_features ({k}), got {group_size!r}")
    w = weight.detach().float().reshape(n, k // (group_size or k), group_size or k)
    scale = w.abs().amax(dim=2, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / 127
    q = (w / scale).round().clamp(-127, 127).to(torch.int8).reshape(n, k)
    return q, scale.reshape(n, -1) if group_size else scale.reshape(n)


def dequantize_int8(weight_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight_int8 * scale in fp32 (scale [N], or [N, K / G] for groups of G along K), in scale's dtype."""
    n, k = weight_int8.shape
    groups = scale.reshape(n, -1, 1)
    return (weight_int8.to(scale.dtype).reshape(n, groups.shape[1], -1) * groups).reshape(n, k)


def int8_linear_reference(x, weight_int8, scale, bias=None) -> torch.Tensor:
    """What int8_linear computes, in torch: the weight dequantized to x's dtype, then F.linear."""
    return F.linear(x, dequantize_int8(weight_int8, scale).to(x.dtype), bias)


def _int8_backward(dy: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """dX = dY dequantize(W). With a scale per output channel that is (dY * scale) W: dY * scale computed in fp32
    and rounded once to dY's dtype, W widened exactly (every int8 is a bf16 and an fp16), three kernels. The
    dequantized weight costs four (int8 to fp32, the scaling, the cast, the matmul) and moves about 21 bytes per
    weight (bf16) where this moves 5; groups along K take that way."""
    if scale.dim() == 1:
        scaled = torch.empty(dy.shape, dtype=dy.dtype, device=dy.device)
        torch.mul(dy, scale, out=scaled)
        return scaled @ weight_int8.to(dy.dtype)
    return dy @ dequantize_int8(weight_int8, scale.float()).to(dy.dtype)


class Int8Plan:
    """int8_linear's launches for one signature: the decode kernels (DecodePlan) up to DECODE_ROWS rows,
    linear_kernel (LinearPlan) beyond. Its backward, for x only, is torch's."""

    def __init__(self, x, weight_int8, scale, bias, out_shape):
        self.decode = x.numel() // x.shape[-1] <= DECODE_ROWS
        self.plan = DecodePlan(x, weight_int8, scale, bias is not None, out_shape) if self.decode else \
            LinearPlan(x, weight_int8, bias, scale, None, 0, False, out_shape)

    def forward(self, x, weight_int8, scale, bias) -> torch.Tensor:
        if self.decode:
            return self.plan.forward(x, weight_int8, scale, bias)
        return self.plan.run(x, weight_int8, bias, scale, None)[0]

    backward = staticmethod(_int8_backward)


def _int8_prepare(x, weight_int8, scale, bias):
    """2-D x [rows, K] and the rest as the decode kernels (unit last strides) or linear_kernel (_prepare) take
    them."""
    if x.shape[0] <= DECODE_ROWS:
        x, weight_int8 = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, weight_int8))
        return x, weight_int8, scale.contiguous(), bias
    x, weight_int8, bias, scale, _ = _prepare(x, weight_int8, bias, scale, None)
    return x, weight_int8, scale, bias


@plan_cache("int8_linear", key=lambda x, weight_int8, scale, bias, out_shape: (
    x.shape, x.stride(), weight_int8.shape, weight_int8.stride(), scale.shape, scale.dtype, x.dtype, x.device,
    None if bias is None else bias.dtype, out_shape))
def _int8_plan(x, weight_int8, scale, bias, out_shape) -> Int8Plan:
    return Int8Plan(x, weight_int8, scale, bias, out_shape)


def _int8_forward(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None) -> torch.Tensor:
    x, weight_int8, scale, bias = _int8_prepare(x, weight_int8, scale, bias)
    return _int8_plan(x, weight_int8, scale, bias, (x.shape[0], weight_int8.shape[0])).forward(
        x, weight_int8, scale, bias)


def _int8_save(ctx, inputs, output):
    ctx.save_for_backward(inputs[1], inputs[2])


def _int8_backward_rule(ctx, run_backward, dy):
    # the gradient of x only (adapters trained over a frozen quantized layer); the weights are buffers
    return run_backward(dy, *ctx.saved_tensors), None, None, None


class _Int8AsGiven:
    """int8_linear's eager forward and backward for tensors as the caller holds them (_int8_forward prepares
    them, as _AsGiven's forward does for linear)."""
    forward = staticmethod(_int8_forward)
    backward = staticmethod(_int8_backward)


_int8_linear = KernelOp(
    "int8_linear", forward=_int8_forward,
    forward_fake=lambda x, weight_int8, scale, bias: x.new_empty(x.shape[0], weight_int8.shape[0]),
    backward=_int8_backward,
    backward_fake=lambda dy, weight_int8, scale: dy.new_empty(dy.shape[0], weight_int8.shape[1]),
    setup_context=_int8_save, backward_rule=_int8_backward_rule, plan=lambda *args: _Int8AsGiven,
    signature=lambda x, weight_int8, scale, bias, backend: (type(x), tensor_key(x), tensor_key(weight_int8),
                                                            tensor_key(scale), tensor_key(bias), backend))


@replayed_entry
def int8_linear(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                *, backend: str | None = None) -> torch.Tensor:
    """x @ dequantize_int8(weight_int8, scale)^T + bias, the weight read as int8 and dequantized in registers.
    weight_int8 [N, K] int8 and scale [N] or [N, K / G] as quantize_int8 gives them; x fp16 or bf16.
    Differentiable in x.

    backend: "triton" (the default on CUDA), or "torch" (int8_linear_reference, any float dtype; the default on
    CPU).
    """
    key, plan = _int8_linear.seen(x, weight_int8, scale, bias, backend)
    # the copy engine may read x and the weight: 16-byte aligned, which the signature cannot hold
    if plan is not None and (x.data_ptr() | weight_int8.data_ptr()) & 15 == 0:
        return _int8_linear.eager(plan, x.requires_grad and torch.is_grad_enabled(), x, weight_int8, scale, bias)
    backend = choose_backend("int8_linear", x, backend, BACKENDS)
    if backend == "triton" and x.dtype not in INT8_DTYPES:
        raise TypeError(f"int8_linear: backend='triton' takes x of float16 or bfloat16, got {x.dtype}")
    if not isinstance(weight_int8, torch.Tensor) or weight_int8.dtype != torch.int8 or weight_int8.dim() != 2:
        raise TypeError("int8_linear: weight_int8 must be a 2-D int8 tensor (quantize_int8 gives one)")
    if x.dim() == 0 or x.shape[-1] != weight_int8.shape[1]:
        raise ValueError(f"int8_linear: x's last dimension must be weight_int8's in_features ({weight_int8.shape[1]})")
    n, k = weight_int8.shape
    if not isinstance(scale, torch.Tensor) or not scale.is_floating_point() or not (
            scale.shape == (n,) or (scale.dim() == 2 and scale.shape[0] == n and scale.shape[1] > 0
                                    and k % scale.shape[1] == 0 and (k // scale.shape[1]) % GROUP_MULTIPLE == 0)):
        raise ValueError(f"int8_linear: scale must be a float tensor of shape [{n}], or [{n}, {k} / G] for groups "
                         f"of G (a multiple of {GROUP_MULTIPLE}) along K, as quantize_int8 gives it; got "
                         f"{getattr(scale, 'shape', type(scale).__name__)}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (weight_int8.shape[0],)
                             or bias.dtype != x.dtype):
        raise ValueError(f"int8_linear: bias must be a {x.dtype} tensor of shape [{weight_int8.shape[0]}]")
    for name, t in (("weight_int8", weight_int8), ("scale", scale), ("bias", bias)):
        if t is not None and t.device != x.device:
            raise ValueError(f"int8_linear: {name} is on {t.device} but x is on {x.device}")
    if backend == "torch" or x.numel() == 0 or weight_int8.numel() == 0:
        return int8_linear_reference(x, weight_int8, scale, bias)
    rows = x.reshape(-1, x.shape[-1])
    out_shape = (*x.shape[:-1], weight_int8.shape[0])
    if torch.compiler.is_compiling():
        return _int8_linear(rows, weight_int8, scale, bias).view(out_shape)
    grad = x.requires_grad and torch.is_grad_enabled()
    x2, w2, s2, b2 = _int8_prepare(rows, weight_int8, scale, bias)
    if x2.data_ptr() != x.data_ptr() or w2 is not weight_int8 or s2 is not scale or b2 is not bias:   # copied
        return _int8_linear.eager(_Int8AsGiven, grad, rows, weight_int8, scale, bias).view(out_shape)
    # x is the rows the plan describes (a view of its memory, no copy): the plan takes it as it is, and a later
    # call with this signature too
    plan = _int8_plan(x2, w2, s2, b2, out_shape)
    _int8_linear.keep(key, plan)
    return _int8_linear.eager(plan, grad, x, weight_int8, scale, bias)
