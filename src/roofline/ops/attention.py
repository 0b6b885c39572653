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

This is the forward pass; the backward (dQ, dK, dV recomputed from the log-sum-exp) is not written yet, so
backend="triton" refuses inputs that require grad.
"""

from __future__ import annotations

import math

import torch

from roofline.ops._common import choose_backend, interpreting, tl, triton

BACKENDS = ("torch", "triton")
HEAD_DIMS = (32, 64, 96, 128, 256)
BLOCK_M = 64     # queries a program holds
BLOCK_N = 64     # keys and values per step


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
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        scores = scores.masked_fill(j > i + (nk - nq), float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if causal and nq > nk:
        weights = torch.nan_to_num(weights, nan=0.0)   # the queries that see no key
    return weights @ _key_heads(v, q.shape[1])


# --------------------------------------------------------------------------- Triton kernel

if triton is not None:

    @triton.jit
    def attention_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr,
                                 sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
                                 heads, group, nq, nk, scale_log2,
                                 CAUSAL: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
                                 UPCAST: tl.constexpr):
        """Program (query block, batch x head): O and the log-sum-exp (natural log, fp32) of its queries.
        UPCAST: multiply in fp32 (exact for bf16 products, so the same math as the tensor cores' bf16 dot)."""
        start_m = tl.program_id(0) * BLOCK_M
        b = tl.program_id(1) // heads
        h = tl.program_id(1) % heads
        hk = h // group
        offs_m = start_m + tl.arange(0, BLOCK_M)
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        in_d = offs_d < HEAD_DIM
        q_base = q_ptr + b.to(tl.int64) * sqb + h.to(tl.int64) * sqh
        k_base = k_ptr + b.to(tl.int64) * skb + hk.to(tl.int64) * skh
        v_base = v_ptr + b.to(tl.int64) * svb + hk.to(tl.int64) * svh
        q = tl.load(q_base + offs_m[:, None] * sqm + offs_d[None, :] * sqd,
                    mask=(offs_m[:, None] < nq) & in_d[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_M], -float("inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        shift = nk - nq   # bottom-right alignment: query i sees key j when j <= i + shift
        end = nk
        if CAUSAL:   # no key past the block's last query's diagonal
            end = tl.minimum(nk, tl.maximum(start_m + BLOCK_M + shift, 0))
        for start_n in range(0, end, BLOCK_N):
            keys = start_n + offs_n
            k = tl.load(k_base + keys[None, :] * skn + offs_d[:, None] * skd,
                        mask=(keys[None, :] < nk) & in_d[:, None], other=0.0)
            if UPCAST:
                k = k.to(tl.float32)
            s = tl.dot(q, k, input_precision=PRECISION) * scale_log2
            visible = keys[None, :] < nk
            if CAUSAL:
                visible = visible & (keys[None, :] <= offs_m[:, None] + shift)
            s = tl.where(visible, s, -float("inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)   # no key seen yet: shift by 0, not -inf
            alpha = tl.exp2(m_i - m_safe)
            v = tl.load(v_base + keys[:, None] * svn + offs_d[None, :] * svd,
                        mask=(keys[:, None] < nk) & in_d[None, :], other=0.0)
            # p in the values' dtype for the tensor cores; the sum is of the same rounded p, so that the
            # weights O is divided by add up to exactly 1 (summing the unrounded p left a bias of up to 2^-9)
            p = tl.exp2(s - m_safe[:, None]).to(v.dtype)
            l_i = l_i * alpha + tl.sum(p.to(tl.float32), axis=1)
            if UPCAST:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.float32), v.to(tl.float32), input_precision=PRECISION)
            else:
                acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
            m_i = m_new
        seen = l_i > 0.0
        o = tl.where(seen[:, None], acc / tl.where(seen, l_i, 1.0)[:, None], 0.0)
        o_base = o_ptr + b.to(tl.int64) * sob + h.to(tl.int64) * soh
        tl.store(o_base + offs_m[:, None] * som + offs_d[None, :] * sod, o.to(o_ptr.dtype.element_ty),
                 mask=(offs_m[:, None] < nq) & in_d[None, :])
        lse = tl.where(seen, (m_i + tl.log2(tl.where(seen, l_i, 1.0))) * 0.6931471805599453, -float("inf"))
        tl.store(lse_ptr + tl.program_id(1).to(tl.int64) * nq + offs_m, lse, mask=offs_m < nq)


def _forward(q, k, v, causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    batch, heads, nq, d = q.shape
    o = torch.empty_like(q)
    lse = torch.empty(batch, heads, nq, device=q.device, dtype=torch.float32)
    grid = (triton.cdiv(nq, BLOCK_M), batch * heads)
    upcast = interpreting() and q.dtype == torch.bfloat16
    attention_forward_kernel[grid](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        heads, heads // k.shape[1], nq, k.shape[2], scale * 1.4426950408889634,
        CAUSAL=causal, HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
        # fp32 inputs in fp32 (tl.dot would round them to tf32); fp16 and bf16 on the tensor cores. Triton
        # 3.6's interpreter returns garbage from a bf16 tl.dot, so there bf16 multiplies in fp32 (exactly).
        PRECISION="ieee" if q.dtype == torch.float32 or upcast else "tf32", UPCAST=upcast, num_warps=4)
    return o, lse


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


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    scale: float | None = None, *, backend: str | None = None) -> torch.Tensor:
    """Attention over (batch, heads, seq, head_dim) tensors, without the seq x seq matrix in memory.

    k and v may have fewer heads than q (dividing them); Nq and Nk may differ (causal: aligned bottom-right);
    scale defaults to 1 / sqrt(head_dim). backend: "triton" (the default on CUDA; head_dim one of HEAD_DIMS,
    forward only for now) or "torch" (attention_reference; the default on CPU).
    """
    backend = choose_backend("flash_attention", q, backend, BACKENDS, arg="q")
    _check(q, k, v, causal, scale)
    scale = 1.0 / math.sqrt(q.shape[3]) if scale is None else float(scale)
    if backend == "torch":
        return attention_reference(q, k, v, causal, scale)
    if q.shape[3] not in HEAD_DIMS:
        raise ValueError(f"flash_attention: backend='triton' takes head_dim in {HEAD_DIMS}, got {q.shape[3]}")
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        raise NotImplementedError("flash_attention: backend='triton' has no backward pass yet; use "
                                  "backend='torch' where gradients are needed, or torch.no_grad()")
    if q.numel() == 0:
        return torch.empty_like(q)
    if k.shape[2] == 0:   # no keys: every query sees nothing
        return torch.zeros_like(q)
    o, _ = _forward(q, k, v, causal, scale)
    return o
