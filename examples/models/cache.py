"""A static key/value cache: one preallocated [batch, kv_heads, max_seq, head_dim] buffer per layer, written in
place at the decoded positions. Fixed shapes and no allocation per step are what let a decode step be captured
as a CUDA graph (the approach gpt-fast takes)."""

import torch
from torch import nn


class KVCache(nn.Module):
    def __init__(self, batch: int, kv_heads: int, max_seq: int, head_dim: int, dtype: torch.dtype, device=None):
        super().__init__()
        shape = (batch, kv_heads, max_seq, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor):
        """Write k and v ([batch, kv_heads, len(input_pos), head_dim]) at input_pos; return the whole cache."""
        self.k.index_copy_(2, input_pos, k.to(self.k.dtype))
        self.v.index_copy_(2, input_pos, v.to(self.v.dtype))
        return self.k, self.v


def causal_mask(max_seq: int, device=None) -> torch.Tensor:
    """[max_seq, max_seq] bool, True where a query position may attend to a key position."""
    return torch.ones(max_seq, max_seq, dtype=torch.bool, device=device).tril()
