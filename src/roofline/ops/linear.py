"""linear: a GEMM with its epilogue fused, y = activation(x W^T + bias) + residual, and the int8 weight-only variant.

    linear(x, weight, bias, activation, residual)        weight [N, K] in x's dtype (nn.Linear's layout)
    int8_linear(x, weight_int8, scale, bias)              weight [N, K] int8 and scale [N] (W = weight_int8 *
                                                          scale[:, None]) or [N, K / G] (a scale per group of G
                                                          weights along K)

One Triton kernel serves both. A program computes a [BLOCK_M, BLOCK_N] tile of y over K in BLOCK_K steps,
tiles of x and W arriving through Hopper's copy engine (TMA descriptors); the per-channel scale, the bias, the
activation and the residual are applied to the fp32 tile in registers before the one store, where a library
GEMM followed by eager ops would write y and read it back once per op. An int8 weight tile is converted to x's
dtype in registers (exactly: int8 fits in fp16 and bf16), so the weights cross memory at one byte each, which is
what a decode step (a few rows of x) is bound by. Grouped scales multiply each group's partial product, so the
kernel's K step never straddles two groups. Up to DECODE_ROWS rows of x take int8_decode_kernel instead: narrow
column blocks, so that many programs stream W at once, and plain vector loads; and one row of x with per-channel
scales int8_gemv_kernel, on the CUDA cores, in thousands of programs of a few columns.

Tiles, warps and pipeline depth are autotuned per (M bucket, N, K) over a small set that suits Hopper; programs
are ordered in groups of GROUP_M row blocks, so that neighbours share tiles of W in L2.
The backward (linear) is torch's: the forward kernel writes Z = x W^T + bias beside y when a gradient is wanted (as
torch's autograd keeps it), dZ comes from torch's activation backward, then dX = dZ W, dW = dZ^T X (cuBLAS) and
dbias = sum dZ.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from roofline.ops._common import (KernelOp, TMA_ALIGN, as_stored, cdiv, choose_backend, fast_exp, fast_reciprocal,
                                  interpreting, next_power_of_2, sm_count, tl, tma_readable, triton, wants_grad)
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, Plans, tensor_key
from roofline.ops.gelu import _gelu_and_grad

BACKENDS = ("torch", "triton")
ACTIVATIONS = (None, "gelu", "gelu_tanh", "silu", "relu")
_ACTIVATION_CODE = {name: code for code, name in enumerate(ACTIVATIONS)}
GROUP_M = 8
DECODE_ROWS = 16   # int8_linear on up to this many rows of x takes the decode kernel (one 16-row MMA tile)

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

    # The decode kernel: up to DECODE_ROWS rows of x, int8 weights. W's bytes are all the cost, so the column
    # blocks are narrow (N / BLOCK_N programs stream W side by side) and the K steps long.

    def _decode_config(bn, bk, stages, warps):
        return triton.Config(dict(BLOCK_N=bn, BLOCK_K=bk), num_stages=stages, num_warps=warps)

    INT8_DECODE = [_decode_config(*c) for c in ((16, 256, 4, 2), (16, 512, 3, 4), (32, 256, 4, 4), (32, 512, 3, 4),
                                                (64, 128, 4, 4), (64, 256, 3, 4), (16, 128, 6, 2), (32, 64, 8, 4),
                                                (16, 1024, 2, 4))]

    def _prune_decode(configs, named_args, **kwargs):
        return [c for c in configs if _fits_groups(c, kwargs["GROUP_K"])]

    def _fresh_tickets(nargs, reset_only=False):
        """Autotuning's hook before each launch it times: a split K's tickets zeroed again (DecodePlan zeroes
        them once; without this the later launches would never see the last ticket, skip the epilogue, and time
        short)."""
        if nargs["ticket_ptr"] is not None:
            nargs["ticket_ptr"].zero_()

    # Under the interpreter each program runs as Python, its time about proportional to its K steps whatever its
    # block: the interpreter's configs take steps of 64 (the tests' K of 70-4095 still take several) and blocks of
    # 32 columns (the tests' N = 33 still splits into a full block and a masked one).
    @triton.autotune(configs=[_decode_config(32, 64, 1, 4)] if interpreting() else INT8_DECODE,
                     key=["N", "K", "GROUP_K", "SPLIT_K"], prune_configs_by=dict(early_config_prune=_prune_decode),
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
        sm_90 (16 a cycle per SM), about the rate at which W arrives at full bandwidth. On the H100 the GEMV was
        up to 7% faster with this at one of a decode step's shapes, 2-5% over the step's chain of matmuls (two
        runs of benchmarks/gemv_probe.py)."""
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

    @triton.autotune(configs=[_gemv_config(32, 64, 4)] if interpreting() else INT8_GEMV, key=["N", "K"],   # as above
                     prune_configs_by=dict(early_config_prune=_prune_gemv))
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
        upcast = interpreting() and x.dtype == torch.bfloat16   # Triton 3.6's interpreter: no bf16 dot
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
            W_SCALED=scale is not None, GROUP_K=group_k, SAVE_Z=save_z, PRECISION="ieee" if upcast else "tf32",
            UPCAST=upcast, GROUP_M=GROUP_M, ROUND_TF32=x.dtype == torch.float32 and not interpreting())
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


_plans = Plans("linear")


def _plan(x, weight, bias, scale, residual, activation: int, save_z: bool, out_shape) -> LinearPlan:
    """The plan for x, weight and residual as _tma_ready leaves them."""
    key = (x.shape, x.stride(), weight.shape, weight.stride(), x.dtype, weight.dtype, x.device,
           None if bias is None else bias.dtype, None if scale is None else scale.shape,
           None if residual is None else residual.stride(), activation, save_z, out_shape)
    plan = _plans.get(key)
    if plan is None:
        plan = _plans.add(key, LinearPlan(x, weight, bias, scale, residual, activation, save_z, out_shape))
    return plan


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
        upcast = interpreting() and x.dtype == torch.bfloat16
        self.gemv = m == 1 and scale.dim() == 1
        stride_x = x.stride(-2) if x.dim() > 1 else k
        if self.gemv:
            self.launch = Launch(int8_gemv_kernel, lambda meta: (cdiv(n, meta["BLOCK_N"]),), index,
                                 HAS_BIAS=has_bias, UPCAST=upcast)
            self.args = (n, k, weight.stride(0))
            return
        self.split = split = decode_split_k(n, k, x.device)
        self.launch = Launch(int8_decode_kernel, lambda meta: (cdiv(n, meta["BLOCK_N"]), split), index,
                             HAS_BIAS=has_bias, GROUP_K=_group_k(weight, scale), SPLIT_K=split,
                             PRECISION="ieee" if upcast else "tf32", UPCAST=upcast, BLOCK_M=DECODE_ROWS)
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
DECODE_MIN_SHARE = 4096      # ...but no share is shorter than this: on the H100 splitting K = 4096 in 2, 4 or 8
                             # cost 12-30% (the tickets' memset, the shares' round trip), K = 14336 in 2 gained 7%


def decode_split_k(n: int, k: int, device: torch.device) -> int:
    """Into how many shares the decode kernel splits K (a power of two, at most 8): enough that the column
    blocks times the shares give each SM a few programs, when N alone does not."""
    programs = sm_count(device) * DECODE_PROGRAMS_PER_SM if device.type == "cuda" else 1
    split = 1
    blocks = cdiv(n, 2 * DECODE_MIN_BLOCK_N)   # the configs' typical column block: 32
    while split < 8 and blocks * split < programs and k // (2 * split) >= DECODE_MIN_SHARE:
        split *= 2
    return split


_decode_plans = Plans("int8_linear decode")


def _decode_plan(x, weight, scale, bias, out_shape) -> DecodePlan:
    """The plan for x and weight with unit last strides, scale contiguous."""
    key = (x.shape, x.stride(), weight.shape, weight.stride(), scale.shape, x.dtype, x.device, bias is not None,
           out_shape)
    plan = _decode_plans.get(key)
    if plan is None:
        plan = _decode_plans.add(key, DecodePlan(x, weight, scale, bias is not None, out_shape))
    return plan


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


class _AsGiven:
    """linear's eager forward and backward for tensors as the caller holds them: launch() prepares them for the
    copy engine (a pad or a copy where it cannot read them as they are), which a LinearPlan's forward, for
    tensors already so, does not."""
    forward = staticmethod(_forward)
    backward = staticmethod(_backward)


_linear = KernelOp("linear", forward=_forward, forward_fake=_forward_fake, backward=_backward,
                   backward_fake=_backward_fake, setup_context=_save, backward_rule=_backward_rule,
                   plan=lambda *args: _AsGiven)
_calls = Plans("linear calls")   # the plans of calls as the entry points saw them, checks passed


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
    key = None
    if not torch.compiler.is_compiling():
        try:
            grad = wants_grad(x, weight, bias, residual)
            key = (type(x), tensor_key(x), tensor_key(weight), tensor_key(bias), activation, tensor_key(residual),
                   backend, grad)
            plan = _calls.get(key)
        except (AttributeError, TypeError):
            key = plan = None
        # the copy engine reads x, weight and residual: 16-byte aligned, which the signature cannot hold
        if plan is not None and (x.data_ptr() | weight.data_ptr()
                                 | (0 if residual is None else residual.data_ptr())) & 15 == 0:
            return _linear.eager(plan, grad, x, weight, bias, residual, plan.activation, plan.save_z)[0]
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
    if key is not None:
        _calls.add(key, plan)
    return _linear.eager(plan, grad, x, weight, bias, residual, code, save_z)[0]



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


_int8_plans = Plans("int8_linear")


def _int8_prepare(x, weight_int8, scale, bias):
    """2-D x [rows, K] and the rest as the decode kernels (unit last strides) or linear_kernel (_prepare) take
    them."""
    if x.shape[0] <= DECODE_ROWS:
        x, weight_int8 = (t if t.stride(-1) == 1 else t.contiguous() for t in (x, weight_int8))
        return x, weight_int8, scale.contiguous(), bias
    x, weight_int8, bias, scale, _ = _prepare(x, weight_int8, bias, scale, None)
    return x, weight_int8, scale, bias


def _int8_plan(x, weight_int8, scale, bias, out_shape) -> Int8Plan:
    key = (x.shape, x.stride(), weight_int8.shape, weight_int8.stride(), scale.shape, scale.dtype, x.dtype,
           x.device, None if bias is None else bias.dtype, out_shape)
    plan = _int8_plans.get(key)
    if plan is None:
        plan = _int8_plans.add(key, Int8Plan(x, weight_int8, scale, bias, out_shape))
    return plan


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
    setup_context=_int8_save, backward_rule=_int8_backward_rule, plan=lambda *args: _Int8AsGiven)
_int8_calls = Plans("int8_linear calls")   # the plans of calls as the entry point saw them, checks passed


@replayed_entry
def int8_linear(x: torch.Tensor, weight_int8: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                *, backend: str | None = None) -> torch.Tensor:
    """x @ dequantize_int8(weight_int8, scale)^T + bias, the weight read as int8 and dequantized in registers.
    weight_int8 [N, K] int8 and scale [N] or [N, K / G] as quantize_int8 gives them; x fp16 or bf16.
    Differentiable in x.

    backend: "triton" (the default on CUDA), or "torch" (int8_linear_reference, any float dtype; the default on
    CPU).
    """
    key = None
    if not torch.compiler.is_compiling():
        try:
            key = (type(x), tensor_key(x), tensor_key(weight_int8), tensor_key(scale), tensor_key(bias), backend)
            plan = _int8_calls.get(key)
        except (AttributeError, TypeError):
            key = plan = None
        # the copy engine may read x and the weight: 16-byte aligned, which the signature cannot hold
        if plan is not None and (x.data_ptr() | weight_int8.data_ptr()) & 15 == 0:
            return _int8_linear.eager(plan, x.requires_grad and torch.is_grad_enabled(), x, weight_int8, scale,
                                      bias)
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
    if key is not None:
        _int8_calls.add(key, plan)
    return _int8_linear.eager(plan, grad, x, weight_int8, scale, bias)
