"""Attention written out by hand, as it is often first written (and as nanoGPT's path without flash attention is):
the [seq x seq] scores are computed, masked, softmaxed and multiplied by v as separate kernels, each a pass over
memory. The models take it with `attention="by_hand"` in their config; their default is
F.scaled_dot_product_attention."""

import torch
import torch.nn.functional as F

ATTENTION = ("sdpa", "by_hand")


def _repeat_heads(q, k, v):
    """k and v ([batch, kv_heads, seq, head_dim]) repeated to q's heads, each kv head serving its group in turn."""
    if k.shape[1] == q.shape[1]:
        return k, v
    return (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))


def grouped_query_sdpa(q, k, v, **kwargs):
    """F.scaled_dot_product_attention for k, v with fewer heads than q. In fp16/bf16, enable_gqa=True runs the
    flash kernel on the shared heads. In fp32 SDPA's fused kernels take no grouped heads and enable_gqa sends the
    call to its math path (on the H100 the fp32 Llama step gained 15 ms from SDPA so, where the
    fused kernel was estimated to save 86): k and v are repeated to q's heads first, and the memory-efficient kernel runs."""
    if q.dtype in (torch.float16, torch.bfloat16):
        return F.scaled_dot_product_attention(q, k, v, enable_gqa=True, **kwargs)
    k, v = _repeat_heads(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


def attention_by_hand(q, k, v, mask):
    """softmax(q k^T / sqrt(head_dim), where mask is True) v, for q [batch, heads, seq, head_dim]; k and v with
    fewer heads than q (grouped-query attention) are repeated to q's heads; mask (bool) broadcasts to the scores."""
    k, v = _repeat_heads(q, k, v)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def check_attention(config) -> None:
    if config.attention not in ATTENTION:
        raise ValueError(f"attention must be one of {ATTENTION}, got {config.attention!r}")


def attention_mask(mask, seq: int, input_pos, by_hand: bool):
    """What a model's attention layers get as their mask, from its causal [max_seq, max_seq] mask: the rows of the
    decoded positions (input_pos) through a KV cache; in training, the causal [seq, seq] block where attention is
    written by hand, else None (SDPA's is_causal)."""
    if input_pos is not None:
        return mask[None, None, input_pos]
    return mask[:seq, :seq] if by_hand else None
