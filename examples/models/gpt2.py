"""GPT-2 as it is usually written (nanoGPT's layout): pre-norm blocks of LayerNorm, causal self-attention through
F.scaled_dot_product_attention with one fused QKV projection, and a GELU-tanh MLP; learned positions; the LM
head tied to the token embedding.

    model = GPT2(GPT2Config())                    # GPT-2 small, 124M parameters
    logits = model(idx)                           # training: [batch, seq] -> [batch, seq, vocab]
    logits, loss = model(idx, targets=targets)    # and the loss (F.cross_entropy), as nanoGPT's
                                                  # (config loss="fused": None and the loss, the head and
                                                  # loss fused by roofline.ops.linear_cross_entropy)
    model.setup_cache(batch, max_seq, dtype)      # generation: then model(idx, input_pos) one chunk at a time
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attention_by_hand, attention_mask, check_attention
from .cache import KVCache, causal_mask
from .loss import check_loss, logits_and_loss


@dataclass
class GPT2Config:
    vocab_size: int = 50304        # 50257 rounded up to a multiple of 64, as nanoGPT does
    max_seq: int = 1024
    n_layer: int = 12
    n_head: int = 12
    d_model: int = 768
    attention: str = "sdpa"        # or "by_hand": matmul, mask, softmax, matmul (examples/models/attention.py)
    loss: str = "separate"         # or "fused": head and loss in one (examples/models/loss.py)

    def __post_init__(self):
        check_attention(self)
        check_loss(self)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.n_head = config.n_head
        self.by_hand = config.attention == "by_hand"
        self.c_attn = nn.Linear(config.d_model, 3 * config.d_model)
        self.c_proj = nn.Linear(config.d_model, config.d_model)
        self.kv_cache: KVCache | None = None

    def forward(self, x, input_pos=None, mask=None):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        if self.by_hand:
            y = attention_by_hand(q, k, v, mask)
        elif self.kv_cache is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.d_model, 4 * config.d_model)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.d_model, config.d_model)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x, input_pos=None, mask=None):
        x = x + self.attn(self.ln_1(x), input_pos, mask)
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.d_model)
        self.wpe = nn.Embedding(config.max_seq, config.d_model)
        self.h = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight
        self.apply(self._init_weights)
        self.register_buffer("mask", causal_mask(config.max_seq), persistent=False)

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def setup_cache(self, batch: int, max_seq: int, dtype: torch.dtype):
        """Give every layer a KV cache for generation; model(idx, input_pos) then decodes."""
        head_dim = self.config.d_model // self.config.n_head
        for block in self.h:
            block.attn.kv_cache = KVCache(batch, self.config.n_head, max_seq, head_dim, dtype,
                                          self.wte.weight.device)
        self.mask = causal_mask(max_seq, self.wte.weight.device)

    def forward(self, idx, input_pos=None, targets=None):
        """idx [batch, seq] -> logits [batch, seq, vocab]; with input_pos (the positions of idx's tokens), through
        the KV cache; with targets [batch, seq] (each position's next token), (logits, loss), as nanoGPT returns
        them."""
        positions = torch.arange(idx.shape[1], device=idx.device) if input_pos is None else input_pos
        mask = attention_mask(self.mask, idx.shape[1], input_pos, self.config.attention == "by_hand")
        x = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            x = block(x, input_pos, mask)
        return logits_and_loss(self.ln_f(x), self.lm_head, targets, self.config.loss)
