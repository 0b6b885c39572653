"""flash_attention: reference, the Triton forward kernel (FlashAttention-2), entry point.

    O = softmax(Q K^T * scale + mask) V          per (batch, head); Q: [Nq, D], K, V: [Nk, D]

The N x N matrix of scores is never written: a program holds a block of queries, walks the keys and values
block by block, and keeps for each query the running max m, the running sum l of exp(s - m) and the running
output, rescaled when the max grows (the online softmax). Only O and the log-sum-exp of each query's scores
(for the backward pass) reach memory. Scores are kept in base 2 (scale * log2 e folded in), so each costs one
exp2.

Layout as torch.nn.functional.scaled_dot_product_attention: (batch, heads, seq, head_dim). K and V may have
fewer heads than Q (grouped-query attention: query head h reads key head h // (Hq // Hk)). With causal=True
and Nq != Nk the mask is aligned bottom-right, as in FlashAttention-2: query i sees key j when
j <= i + Nk - Nq. A query that sees no key at all (Nq > Nk, causal) gets a zero output and a log-sum-exp of
-inf, as FlashAttention gives; torch's math path gives nan there.

Backward (FlashAttention-2): a pre-pass takes delta = rowsum(dO * O); one kernel walks the queries for each
block of keys and accumulates dK and dV (over every query head of a key head), another walks the keys for each
block of queries and accumulates dQ; both recompute the weights P from the saved log-sum-exp, tile by tile.
That is seven products a tile where FlashAttention-2's CUDA backward makes five, adding dQ up with atomic adds
from the dK/dV kernel: done so here, it was slower (benchmarks/results/h200-attention.md, run 7). No atomic adds,
so the gradients are the same bit for bit from run to run.
Registered with torch.library through KernelOp, so torch.compile(fullgraph=True) holds it as one op.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from roofline.ops._common import (as_stored, cdiv, choose_backend, hopper, interpreting, next_power_of_2, tl,
                                  tma_readable, triton)
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp
from roofline.ops._state import dot_settings

BACKENDS = ("torch", "triton")
HEAD_DIMS = (32, 64, 96, 128, 256)
LOG2E = 1.4426950408889634


# --------------------------------------------------------------------------- reference

def _key_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V with each key head repeated for the query heads that read it."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def attention_reference(q, k, v, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """Attention written out in torch (scores, mask, softmax, weighted sum), with flash_attention's conventions:
    bottom-right causal alignment and zero output for a query that sees no key. Computes in q's dtype."""
    nq, nk, d = q.shape[2], k.shape[2], q.shape[3]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = q @ _key_heads(k, q.shape[1]).transpose(-1, -2) * scale
    if not causal:
        return torch.softmax(scores, dim=-1) @ _key_heads(v, q.shape[1])
    i = torch.arange(nq, device=q.device)[:, None]
    j = torch.arange(nk, device=q.device)[None, :]
    hidden = j > i + (nk - nq)
    sees_a_key = ~hidden.all(-1, keepdim=True)
    # a query that sees no key: a row of zeros, forward and backward (its scores are not all -inf, so no nan)
    scores = scores.masked_fill(hidden & sees_a_key, float("-inf"))
    weights = torch.softmax(scores, dim=-1) * sees_a_key
    return weights @ _key_heads(v, q.shape[1])


# --------------------------------------------------------------------------- Triton kernels


@dataclass(frozen=True)
class Tiles:
    """How a kernel cuts its work: `held` rows stay in a program for its life (queries in the forward and dQ
    kernels, keys and values in dK/dV), `walked` rows come in per step of its loop; warps per program and
    software-pipeline stages of the loop."""
    held: int
    walked: int
    warps: int
    stages: int


# By head dim, for fp16/bf16. Chosen by `benchmarks/tune_ops.py OUT --only attention` on the H100
# (benchmarks/results/h100-tune.md): at B4 H32 N4096, the fastest for head_dim 64 and 128, causal and not (where
# the two differ, the one ahead on both). 32 takes 64's, 96 128's (same block width); 256's fit shared memory.
TILES = {
    "forward": {32: Tiles(64, 64, 4, 3), 64: Tiles(64, 64, 4, 3), 96: Tiles(64, 64, 4, 3), 128: Tiles(64, 64, 4, 3),
                256: Tiles(64, 32, 4, 2)},
    "dkdv": {32: Tiles(128, 32, 4, 3), 64: Tiles(128, 32, 4, 3), 96: Tiles(64, 64, 4, 2), 128: Tiles(64, 64, 4, 2),
             256: Tiles(32, 32, 4, 1)},
    "dq": {32: Tiles(128, 64, 8, 3), 64: Tiles(128, 64, 8, 3), 96: Tiles(128, 64, 8, 3), 128: Tiles(128, 64, 8, 3),
           256: Tiles(32, 32, 4, 1)},
}
# fp32 operands take twice the registers and shared memory, and are multiplied without the tensor cores: small
# tiles, whatever the kernel, so that every head dim fits.
FP32_TILES = {32: Tiles(64, 32, 4, 1), 64: Tiles(64, 32, 4, 1), 96: Tiles(32, 32, 4, 1), 128: Tiles(32, 32, 4, 1),
              256: Tiles(16, 16, 4, 1)}
DELTA_BLOCK = 64   # queries a program of the dot(dO, O) pre-pass takes


def _sm90_setting(value: str) -> bool | None:
    """ROOFLINE_SM90_ATTENTION's value as SM90_ATTENTION holds it (empty: auto)."""
    settings = {"auto": None, "": None, "1": True, "0": False}
    key = value.strip().lower()
    if key not in settings:
        raise ValueError(f"ROOFLINE_SM90_ATTENTION must be auto, 1 or 0, got {value!r}")
    return settings[key]


# The Hopper forward and backward in Gluon (attention_sm90.py, Gluon imported with it), in place of the tiled ones
# for the inputs they take. ROOFLINE_SM90_ATTENTION: "auto" (the default, None here) where they were measured faster
# than the tiled ones alone, as eager code calls them and in a whole program (attention_sm90.routed); "1" (True) at
# every length they take; "0" (False) never (code that sets it sets one of those three). Read at each call (plans
# and call signatures hold it), so that a benchmark can set it call by call and time both ways as eager code calls
# them.
SM90_ATTENTION = _sm90_setting(os.environ.get("ROOFLINE_SM90_ATTENTION", "auto"))

if triton is not None:

    @triton.jit
    def _tile(desc, b, h, start, UPCAST: tl.constexpr):
        """Rows [start, start + the block's rows) of head h of batch b through a (batch, heads, seq, head_dim)
        descriptor, as [rows, BLOCK_D]: zeros past the sequence's end and past head_dim (the copy engine fills
        them). In fp32 if UPCAST."""
        shape: tl.constexpr = desc.block_shape
        t = desc.load([b, h, start, 0]).reshape(shape[2], shape[3])
        if UPCAST:
            t = t.to(tl.float32)
        return t

    @triton.jit
    def _store_tile(desc, b, h, start, value, UPCAST: tl.constexpr):
        """Store fp32 rows in the tensor's dtype (rows past the sequence's end are dropped). UPCAST (bf16 through
        the interpreter, which truncates fp32 to bf16): round to nearest even first, as the GPU's conversion
        does, so that the CPU checks see its error."""
        shape: tl.constexpr = desc.block_shape
        desc.store([b, h, start, 0], as_stored(value, UPCAST).to(desc.dtype).reshape(shape))

    @triton.jit
    def _key_ranges(start_m, nq, nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        """For the queries [start_m, start_m + BLOCK_M): (full, end), where the keys [0, full), whole blocks,
        are seen by every one of them (no mask to apply) and [full, end) by some (masked). Causal, aligned
        bottom-right: query i sees key j when j <= i + nk - nq."""
        if CAUSAL:
            end = tl.minimum(nk, tl.maximum(start_m + BLOCK_M + nk - nq, 0))
            full = tl.maximum(tl.minimum(nk, start_m + 1 + nk - nq), 0) // BLOCK_N * BLOCK_N
            return full, end
        return nk // BLOCK_N * BLOCK_N, nk

    @triton.jit
    def _query_ranges(start_n, nq, nk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
        """For the keys [start_n, start_n + BLOCK_N): (first, full), where the queries [first, full), whole
        blocks, see some of them (masked) and [full, nq) see all of them."""
        if CAUSAL:
            first = tl.maximum(start_n - (nk - nq), 0) // BLOCK_M * BLOCK_M
            full = tl.cdiv(tl.maximum(start_n + BLOCK_N - 1 - (nk - nq), 0), BLOCK_M) * BLOCK_M
            return first, tl.minimum(full, nq)
        return 0, 0

    @triton.jit
    def _visible(queries, keys, nq, nk, CAUSAL: tl.constexpr):
        """Which (query, key) pairs count, queries and keys broadcast against each other (a column and a row,
        either way round): the key exists and, causal, query i sees key j when j <= i + nk - nq."""
        visible = keys < nk
        if CAUSAL:
            visible = visible & (keys <= queries + (nk - nq))
        return visible

    @triton.jit
    def _query_block(q_desc, heads, group):
        """(first query, batch, head, key head, the queries) of a program (query block, batch x head). The last
        query blocks go first: causal, they have the most keys to walk, and the short ones fill the tail."""
        BLOCK_M: tl.constexpr = q_desc.block_shape[2]
        start_m = (tl.num_programs(0) - 1 - tl.program_id(0)) * BLOCK_M
        b = tl.program_id(1) // heads
        h = tl.program_id(1) % heads
        return start_m, b, h, h // group, start_m + tl.arange(0, BLOCK_M)

    @triton.jit
    def _forward_step(acc, l_i, m_i, q, k_desc, v_desc, b, hk, start_n, offs_m, nq, nk, scale_log2,
                      MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """One block of keys and values into the running (acc, l, m) of a block of queries (online softmax,
        base 2). scale_log2 > 0, so the max of the scaled scores is the scaled max, and each score costs one
        fused multiply-add before its exp2. Unmasked: every query sees every key of the block."""
        k = _tile(k_desc, b, hk, start_n, UPCAST)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if MASKED:
            keys = start_n + tl.arange(0, k_desc.block_shape[2])
            s = tl.where(_visible(offs_m[:, None], keys[None, :], nq, nk, CAUSAL), s * scale_log2, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == -float("inf"), 0.0, m_new)   # no key seen yet: shift by 0, not -inf
            p = tl.exp2(s - m_use[:, None])
        else:
            m_new = tl.maximum(m_i, tl.max(s, axis=1) * scale_log2)
            m_use = m_new
            p = tl.exp2(s * scale_log2 - m_new[:, None])
        alpha = tl.exp2(m_i - m_use)
        v = _tile(v_desc, b, hk, start_n, False)
        # the sum of p as computed, then p in the values' dtype for the tensor cores (summing the rounded p instead
        # makes the weights add up to exactly 1, for a conversion back per weight on the softmax's path)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        p = p.to(v.dtype)
        acc = acc * alpha[:, None]
        if UPCAST:
            acc = tl.dot(p.to(tl.float32), v.to(tl.float32), acc, input_precision=PRECISION)
        else:
            acc = tl.dot(p, v, acc, input_precision=PRECISION)
        return acc, l_i, m_new

    @triton.jit
    def attention_forward_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, heads, group, nq, nk, scale_log2,
                                 q_sign, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """Program (query block, batch x head): O and the log-sum-exp (natural log, fp32) of its queries.
        scale_log2 = |scale| log2(e), and q_sign the scale's sign, applied to q (exactly). UPCAST: multiply in
        fp32 (exact for bf16 products, so the same math as the tensor cores' bf16 dot)."""
        BLOCK_M: tl.constexpr = q_desc.block_shape[2]
        BLOCK_N: tl.constexpr = k_desc.block_shape[2]
        BLOCK_D: tl.constexpr = q_desc.block_shape[3]
        start_m, b, h, hk, offs_m = _query_block(q_desc, heads, group)
        q = _tile(q_desc, b, h, start_m, UPCAST)
        q = (q * q_sign).to(q.dtype)
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        full, end = _key_ranges(start_m, nq, nk, BLOCK_M, BLOCK_N, CAUSAL)
        for start_n in range(0, full, BLOCK_N):
            acc, l_i, m_i = _forward_step(acc, l_i, m_i, q, k_desc, v_desc, b, hk, start_n, offs_m, nq, nk,
                                          scale_log2, False, CAUSAL, PRECISION, UPCAST)
        for start_n in range(full, end, BLOCK_N):
            acc, l_i, m_i = _forward_step(acc, l_i, m_i, q, k_desc, v_desc, b, hk, start_n, offs_m, nq, nk,
                                          scale_log2, True, CAUSAL, PRECISION, UPCAST)
        seen = l_i > 0.0
        _store_tile(o_desc, b, h, start_m, tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0),
                    UPCAST)
        lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, -float("inf"))
        tl.store(lse_ptr + tl.program_id(1).to(tl.int64) * nq + offs_m, lse, mask=offs_m < nq)

    @triton.jit
    def _p_and_ds(s, dp, lse2, delta, queries, keys, nq, nk, scale_log2, MASKED: tl.constexpr,
                  CAUSAL: tl.constexpr):
        """For a tile of scores s = q k^T and dp = dO v^T (either way round, with lse2, delta, queries and keys
        broadcast to them): the attention weights p, recomputed from the saved log-sum-exp (base 2), and the
        scores' gradient ds = p (dp - delta). MASKED: p is 0 where a key is hidden or out of range. Unmasked, a
        query or key past the end has zero q, dO, lse and delta, so it adds nothing to the rows that are
        stored."""
        p = tl.exp2(s * scale_log2 - lse2)
        if MASKED:
            p = tl.where(_visible(queries, keys, nq, nk, CAUSAL), p, 0.0)
        return p, p * (dp - delta)

    @triton.jit
    def _lse2_and_delta(lse_ptr, delta_ptr, row, offs_m, nq):
        """The saved log-sum-exp (in base 2) and delta of the queries offs_m, zero past the end."""
        lse = tl.load(lse_ptr + row + offs_m, mask=offs_m < nq, other=0.0)
        return lse * 1.4426950408889634, tl.load(delta_ptr + row + offs_m, mask=offs_m < nq, other=0.0)

    @triton.jit
    def attention_delta_kernel(o_desc, do_desc, delta_ptr, lse_ptr, lse2_ptr, heads, nq, row_len,
                               LSE2: tl.constexpr):
        """delta = rowsum(dO * O) per query, the backward's pre-pass (fp32), in rows of row_len: nq, or more for
        rows padded to whole blocks (past nq, O and dO are the copy engine's zeros and delta is 0, as far as the
        last block reaches). LSE2: also the log-sum-exp in base 2 into lse2_ptr's rows alike, 0 past nq (the
        Hopper backward's per-query values)."""
        BLOCK_M: tl.constexpr = o_desc.block_shape[2]
        start_m = tl.program_id(0) * BLOCK_M
        b = tl.program_id(1) // heads
        h = tl.program_id(1) % heads
        row = tl.program_id(1).to(tl.int64)
        offs_m = start_m + tl.arange(0, BLOCK_M)
        delta = tl.sum(_tile(o_desc, b, h, start_m, True) * _tile(do_desc, b, h, start_m, True), axis=1)
        tl.store(delta_ptr + row * row_len + offs_m, delta, mask=offs_m < row_len)
        if LSE2:
            lse = tl.load(lse_ptr + row * nq + offs_m, mask=offs_m < nq, other=0.0)
            tl.store(lse2_ptr + row * row_len + offs_m, lse * 1.4426950408889634, mask=offs_m < row_len)

    @triton.jit
    def _dkdv_step(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, b, h, row, start_m, keys, nq, nk,
                   scale_log2, MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr):
        """One block of queries (and their dO) into the running dK, dV of a block of keys. The tile is taken
        keys by queries (s^T = k q^T), so that p^T and ds^T multiply dO and q as they are, with no transpose in
        registers."""
        offs_m = start_m + tl.arange(0, q_desc.block_shape[2])
        q = _tile(q_desc, b, h, start_m, UPCAST)
        do = _tile(do_desc, b, h, start_m, UPCAST)
        lse2, delta = _lse2_and_delta(lse_ptr, delta_ptr, row, offs_m, nq)
        p, ds = _p_and_ds(tl.dot(k, tl.trans(q), input_precision=PRECISION),
                          tl.dot(v, tl.trans(do), input_precision=PRECISION), lse2[None, :], delta[None, :],
                          offs_m[None, :], keys[:, None], nq, nk, scale_log2, MASKED, CAUSAL)
        dv = tl.dot(p.to(do.dtype), do, dv, input_precision=PRECISION)
        dk = tl.dot(ds.to(q.dtype), q, dk, input_precision=PRECISION)
        return dk, dv

    @triton.jit
    def attention_dkdv_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_ptr, delta_ptr, heads,
                              kv_heads, group, nq, nk, scale, scale_log2, CAUSAL: tl.constexpr,
                              PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """Program (key block, batch x key head): dK and dV of its keys, summed over the query heads that read
        them and over every query that sees them (p recomputed tile by tile, never stored)."""
        BLOCK_M: tl.constexpr = q_desc.block_shape[2]
        BLOCK_N: tl.constexpr = k_desc.block_shape[2]
        BLOCK_D: tl.constexpr = k_desc.block_shape[3]
        start_n = tl.program_id(0) * BLOCK_N
        b = tl.program_id(1) // kv_heads
        hk = tl.program_id(1) % kv_heads
        keys = start_n + tl.arange(0, BLOCK_N)
        k = _tile(k_desc, b, hk, start_n, UPCAST)
        v = _tile(v_desc, b, hk, start_n, UPCAST)
        dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
        first, full = _query_ranges(start_n, nq, nk, BLOCK_M, BLOCK_N, CAUSAL)
        for g in range(0, group):
            h = hk * group + g
            row = (b * heads + h).to(tl.int64) * nq
            for start_m in range(first, full, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, b, h, row, start_m, keys, nq,
                                    nk, scale_log2, True, CAUSAL, PRECISION, UPCAST)
            for start_m in range(full, nq, BLOCK_M):
                dk, dv = _dkdv_step(dk, dv, k, v, q_desc, do_desc, lse_ptr, delta_ptr, b, h, row, start_m, keys, nq,
                                    nk, scale_log2, False, CAUSAL, PRECISION, UPCAST)
        _store_tile(dk_desc, b, hk, start_n, dk * scale, UPCAST)
        _store_tile(dv_desc, b, hk, start_n, dv, UPCAST)

    @triton.jit
    def _dq_step(dq, q, do, k_desc, v_desc, lse2, delta, b, hk, start_n, offs_m, nq, nk, scale_log2,
                 MASKED: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
        """One block of keys and values into the running dQ of a block of queries."""
        keys = start_n + tl.arange(0, k_desc.block_shape[2])
        k = _tile(k_desc, b, hk, start_n, UPCAST)
        v = _tile(v_desc, b, hk, start_n, UPCAST)
        _, ds = _p_and_ds(tl.dot(q, tl.trans(k), input_precision=PRECISION),
                          tl.dot(do, tl.trans(v), input_precision=PRECISION), lse2[:, None], delta[:, None],
                          offs_m[:, None], keys[None, :], nq, nk, scale_log2, MASKED, CAUSAL)
        return tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)

    @triton.jit
    def attention_dq_kernel(q_desc, k_desc, v_desc, do_desc, dq_desc, lse_ptr, delta_ptr, heads, group, nq, nk,
                            scale, scale_log2, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                            UPCAST: tl.constexpr):
        """Program (query block, batch x head): dQ of its queries, over the keys they see."""
        BLOCK_M: tl.constexpr = q_desc.block_shape[2]
        BLOCK_N: tl.constexpr = k_desc.block_shape[2]
        BLOCK_D: tl.constexpr = q_desc.block_shape[3]
        start_m, b, h, hk, offs_m = _query_block(q_desc, heads, group)
        q = _tile(q_desc, b, h, start_m, UPCAST)
        do = _tile(do_desc, b, h, start_m, UPCAST)
        lse2, delta = _lse2_and_delta(lse_ptr, delta_ptr, tl.program_id(1).to(tl.int64) * nq, offs_m, nq)
        dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        full, end = _key_ranges(start_m, nq, nk, BLOCK_M, BLOCK_N, CAUSAL)
        for start_n in range(0, full, BLOCK_N):
            dq = _dq_step(dq, q, do, k_desc, v_desc, lse2, delta, b, hk, start_n, offs_m, nq, nk, scale_log2, False,
                          CAUSAL, PRECISION, UPCAST)
        for start_n in range(full, end, BLOCK_N):
            dq = _dq_step(dq, q, do, k_desc, v_desc, lse2, delta, b, hk, start_n, offs_m, nq, nk, scale_log2, True,
                          CAUSAL, PRECISION, UPCAST)
        _store_tile(dq_desc, b, h, start_m, dq * scale, UPCAST)


def tiles(kernel: str, dtype: torch.dtype, d: int) -> Tiles:
    """The tiles `kernel` ("forward", "dkdv" or "dq") runs with at head dim d and dtype."""
    return (FP32_TILES if dtype == torch.float32 else TILES[kernel])[d]


def _block(t: Tiles | int, d: int, kind: str = "held") -> list[int]:
    """The descriptor block of a (batch, heads, seq, head_dim) tensor: one head's `rows` rows."""
    rows = t if isinstance(t, int) else getattr(t, kind)
    return [1, 1, rows, next_power_of_2(d)]


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """t, or a contiguous copy (at a new, aligned address) where the copy engine cannot read it as it is."""
    return t if tma_readable(t) else t.clone(memory_format=torch.contiguous_format)


def _settings(kernel: str, dtype: torch.dtype, d: int) -> tuple[Tiles, dict]:
    """The tiles of `kernel` and the launch options every attention kernel takes. fp32 inputs in fp32 (tl.dot
    would round them to tf32); fp16 and bf16 on the tensor cores (dot_settings)."""
    t = tiles(kernel, dtype, d)
    return t, dict(**dot_settings(dtype, fp32="ieee"), num_warps=t.warps, num_stages=t.stages)


class AttentionPlan:
    """The launches for q, k and v of given shapes and strides (readable by the copy engine) and one dtype on
    one device, causal or not, at one scale. The backward's launches are kept by the strides of dO, which come
    from the caller's graph (a transposed view's gradient is itself transposed)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float):
        batch, heads, nq, d = q.shape
        kv_heads, nk = k.shape[1], k.shape[2]
        self.causal, self.scale, self.dtype, self.d = causal, scale, q.dtype, d
        self.index = q.device.index if q.is_cuda else -1
        self.lse_shape, self.device = (batch, heads, nq), q.device
        self.grids = {name: (cdiv(n, tiles(name, q.dtype, d).held), batch * h)
                      for name, n, h in (("forward", nq, heads), ("dkdv", nk, kv_heads), ("dq", nq, heads))}
        t, settings = _settings("forward", q.dtype, d)
        self.forward_launch = Launch(
            attention_forward_kernel, self.grids["forward"], self.index,
            descriptors={0: _block(t, d), 1: _block(t, d, "walked"), 2: _block(t, d, "walked"), 3: _block(t, d)},
            CAUSAL=causal, **settings)
        self.forward_args = (heads, heads // kv_heads, nq, nk, abs(scale) * LOG2E, -1.0 if scale < 0 else 1.0)
        self.backward_args = (heads, kv_heads, heads // kv_heads, nq, nk, scale, scale * LOG2E)
        self.delta_grid = (cdiv(nq, DELTA_BLOCK), batch * heads)
        self._backward_launches, self._per_query_launches = {}, {}
        self.sm90 = self.sm90_backward = None
        # imported (Gluon with it) only where its kernels could run: a Hopper GPU, or the CPU tests' interpreter
        if SM90_ATTENTION is not False and (interpreting() or hopper(q.device)):
            from roofline.ops import attention_sm90

            routed = attention_sm90.routed(d, nq, nk, every_length=SM90_ATTENTION is True)
            if routed and attention_sm90.supports(q, k, scale):
                self.sm90 = attention_sm90.Sm90Forward(q, k, causal, scale * LOG2E)
            if routed and attention_sm90.supports(q, k, scale, backward=True):
                self.sm90_backward = attention_sm90.Sm90Backward(q, k, causal, scale, scale * LOG2E,
                                                                 self._per_query_launch)

    def forward(self, q, k, v, causal, scale) -> tuple[torch.Tensor, torch.Tensor]:
        if self.sm90 is not None:
            return self.sm90(q, k, v)
        o = torch.empty_like(q)
        lse = torch.empty(self.lse_shape, device=self.device, dtype=torch.float32)
        self.forward_launch(q, k, v, o, lse, *self.forward_args)
        return o, lse

    def _backward_launch(self, do_strides):
        """(delta, dK and dV, dQ) launches for a dO of these strides."""
        launches = self._backward_launches.get(do_strides)
        if launches is None:
            d, dtype, causal = self.d, self.dtype, self.causal
            t, settings = _settings("dkdv", dtype, d)
            dkdv = Launch(attention_dkdv_kernel, self.grids["dkdv"], self.index, descriptors={
                0: _block(t, d, "walked"), 1: _block(t, d), 2: _block(t, d), 3: _block(t, d, "walked"),
                4: _block(t, d), 5: _block(t, d)}, CAUSAL=causal, **settings)
            t, settings = _settings("dq", dtype, d)
            dq = Launch(attention_dq_kernel, self.grids["dq"], self.index, descriptors={
                0: _block(t, d), 1: _block(t, d, "walked"), 2: _block(t, d, "walked"), 3: _block(t, d),
                4: _block(t, d)}, CAUSAL=causal, **settings)
            launches = self._backward_launches[do_strides] = self._delta_launch(), dkdv, dq
        return launches

    def _delta_launch(self, lse2: bool = False) -> Launch:
        """The pre-pass's launch: delta alone, or (lse2) delta and the log-sum-exp in base 2."""
        d = self.d
        return Launch(attention_delta_kernel, self.delta_grid, self.index,
                      descriptors={0: _block(DELTA_BLOCK, d), 1: _block(DELTA_BLOCK, d)}, LSE2=lse2)

    def _per_query_launch(self, do_strides) -> Launch:
        """The Hopper backward's pre-pass for a dO of these strides (a launch's descriptors hold them): delta and
        the log-sum-exp in base 2, in rows padded to whole blocks of DELTA_BLOCK queries."""
        launch = self._per_query_launches.get(do_strides)
        if launch is None:
            launch = self._per_query_launches[do_strides] = self._delta_launch(lse2=True)
        return launch

    def backward(self, do, q, k, v, o, lse, causal, scale) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        do = _aligned(do)
        # the Hopper backward adds dQ up with atomic adds: where deterministic algorithms are asked for, the tiled
        # backward, whose gradients are the same bit for bit from run to run
        if self.sm90_backward is not None and not torch.are_deterministic_algorithms_enabled():
            return self.sm90_backward(do, q, k, v, o, lse)
        delta_launch, dkdv_launch, dq_launch = self._backward_launch(do.stride())
        delta = torch.empty_like(lse)
        heads, _, _, nq = self.backward_args[:4]
        delta_launch(o, do, delta, lse, delta, heads, nq, nq)   # (delta twice: no log-sum-exp written)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dkdv_launch(q, k, v, do, dk, dv, lse, delta, *self.backward_args)
        dq_launch(q, k, v, do, dq, lse, delta, heads, *self.backward_args[2:])
        return dq, dk, dv


@plan_cache("flash_attention", key=lambda q, k, v, causal, scale: (q.shape, q.stride(), k.shape, k.stride(), v.stride(),
                                                                    q.dtype, q.device, causal, scale, SM90_ATTENTION))
def _plan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float) -> AttentionPlan:
    """The plan for q, k and v readable by the copy engine (_aligned)."""
    return AttentionPlan(q, k, causal, scale)


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    return _plan(q, k, v, causal, scale).forward(q, k, v, causal, scale)


def _forward_fake(q, k, v, causal, scale):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


def _backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    q, k, v, o = (_aligned(t) for t in (q, k, v, o))
    return _plan(q, k, v, causal, scale).backward(do, q, k, v, o, lse, causal, scale)


def _save_for_backward(ctx, inputs, output):
    q, k, v, causal, scale = inputs
    o, lse = output
    ctx.save_for_backward(q, k, v, o, lse)
    ctx.causal, ctx.scale = causal, scale
    # the plan's backward branches on it (the Hopper backward is not deterministic): on the context, the eager
    # node keeps the backwards it records for each value apart, as it does for every attribute the forward leaves
    ctx.deterministic = torch.are_deterministic_algorithms_enabled()
    ctx.mark_non_differentiable(lse)


def _backward_rule(ctx, run_backward, do, dlse):
    q, k, v, o, lse = ctx.saved_tensors
    dq, dk, dv = run_backward(do, q, k, v, o, lse, ctx.causal, ctx.scale)
    return dq, dk, dv, None, None


_attention = KernelOp(
    "flash_attention", forward=_forward, forward_fake=_forward_fake, backward=_backward,
    backward_fake=lambda do, q, k, v, o, lse, causal, scale: (torch.empty_like(q), torch.empty_like(k),
                                                               torch.empty_like(v)),
    setup_context=_save_for_backward, backward_rule=_backward_rule, plan=_plan,
    signature=lambda q, k, v, causal, scale, backend: (type(q), tensor_key(q), tensor_key(k), tensor_key(v), causal,
                                                       type(causal), scale, type(scale), backend, SM90_ATTENTION))


# --------------------------------------------------------------------------- entry point

def _check(q, k, v, causal, scale) -> None:
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"flash_attention: {name} must be a torch.Tensor, got {type(t).__name__}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            raise ValueError(f"flash_attention: {name} must be (batch, heads, seq, head_dim), got shape "
                             f"{list(t.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise TypeError(f"flash_attention: q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if k.device != q.device or v.device != q.device:
        raise ValueError(f"flash_attention: q, k and v must be on one device, got {q.device}, {k.device}, "
                         f"{v.device}")
    if k.shape != v.shape:
        raise ValueError(f"flash_attention: k and v must have the same shape, got {list(k.shape)} and "
                         f"{list(v.shape)}")
    if k.shape[0] != q.shape[0]:
        raise ValueError(f"flash_attention: k has batch {k.shape[0]} but q has batch {q.shape[0]}")
    if k.shape[3] != q.shape[3]:
        raise ValueError(f"flash_attention: k and v have head_dim {k.shape[3]} but q has {q.shape[3]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise ValueError(f"flash_attention: the key heads ({k.shape[1]}) must divide the query heads "
                         f"({q.shape[1]})")
    if not isinstance(causal, bool):
        raise TypeError(f"flash_attention: causal must be a bool, got {type(causal).__name__}")
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))
                              or not math.isfinite(scale)):
        raise ValueError(f"flash_attention: scale must be a finite number or None, got {scale!r}")


# a call under each setting is recorded apart: the Hopper kernels' switch, and deterministic algorithms (which the
# context a recorded call hands its backward holds)
@replayed_entry(settings=lambda: (SM90_ATTENTION, torch.are_deterministic_algorithms_enabled()))
def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, *, backend: str | None = None) -> torch.Tensor:
    """Attention over (batch, heads, seq, head_dim) tensors, without the seq x seq matrix in memory.

    k and v may have fewer heads than q (dividing them); Nq and Nk may differ (causal: aligned bottom-right);
    scale defaults to 1 / sqrt(head_dim). backend: "triton" (the default on CUDA; head_dim one of HEAD_DIMS),
    forward and backward, or "torch" (attention_reference; the default on CPU).
    """
    key, plan = _attention.seen(q, k, v, causal, scale, backend)
    # the plan's descriptors need the copy engine's alignment, which the signature cannot hold
    if plan is not None and (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15 == 0:
        return _run(plan, q, k, v)
    backend = choose_backend("flash_attention", q, backend, BACKENDS, arg="q")
    _check(q, k, v, causal, scale)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    if backend == "torch":
        return attention_reference(q, k, v, causal, scale)
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"flash_attention: backend='triton' takes head_dim in {HEAD_DIMS}, got {q.shape[3]}")
    if q.numel() == 0 or k.shape[2] == 0:   # nothing to launch for: torch's result, with its grad_fn
        return attention_reference(q, k, v, causal, scale)
    if torch.compiler.is_compiling():   # _aligned reads pointers, which a traced graph has not: the op aligns
        return _attention(q, k, v, causal, scale)[0]
    given = (q, k, v)
    q, k, v = _aligned(q), _aligned(k), _aligned(v)
    keep = all(a is b for a, b in zip(given, (q, k, v)))
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _attention.call(key, keep, grad, q, k, v, causal, scale)[0]


def _run(plan: AttentionPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    return _attention.eager(plan, grad, q, k, v, plan.causal, plan.scale)[0]
