"""A Llama-style decoder as it is usually written (the layout of Hugging Face's and torchtitan's Llama): pre-norm
blocks of nn.RMSNorm, attention with rotary position embeddings (rotate-half convention) and grouped-query
heads, and a SwiGLU MLP (gate_proj, up_proj, down_proj); no biases; an untied LM head.

    model = Llama(LlamaConfig())                  # 16 layers, d 2048, 32 query / 8 key-value heads: 0.95B
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

from .attention import attention_by_hand, attention_mask, check_attention, grouped_query_sdpa
from .cache import KVCache, causal_mask
from .loss import check_loss, logits_and_loss


@dataclass
class LlamaConfig:
    vocab_size: int = 32000
    max_seq: int = 2048
    n_layer: int = 16
    n_head: int = 32
    n_kv_head: int = 8
    d_model: int = 2048
    intermediate_size: int = 5632
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    attention: str = "sdpa"        # or "by_hand": matmul, mask, softmax, matmul (examples/models/attention.py)
    loss: str = "separate"         # or "fused": head and loss in one (examples/models/loss.py)

    def __post_init__(self):
        check_attention(self)
        check_loss(self)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """q, k [batch, heads, seq, head_dim] rotated by cos, sin [batch, seq, head_dim] (Hugging Face's signature)."""
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def rotary_tables(config: LlamaConfig, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, [max_seq, head_dim], fp32."""
    inv_freq = 1.0 / config.rope_theta ** (torch.arange(0, config.head_dim, 2, device=device).float() / config.head_dim)
    angles = torch.outer(torch.arange(config.max_seq, device=device).float(), inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = config.n_head, config.n_kv_head, config.head_dim
        self.by_hand = config.attention == "by_hand"
        self.q_proj = nn.Linear(config.d_model, config.n_head * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.d_model, config.n_kv_head * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.d_model, config.n_kv_head * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.n_head * config.head_dim, config.d_model, bias=False)
        self.kv_cache: KVCache | None = None

    def forward(self, x, cos, sin, input_pos=None, mask=None):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_head, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos.to(q.dtype), sin.to(q.dtype))
        if self.kv_cache is not None:
            k, v = self.kv_cache.update(input_pos, k, v)
        if self.by_hand:
            y = attention_by_hand(q, k, v, mask)
        elif self.kv_cache is None:
            y = grouped_query_sdpa(q, k, v, is_causal=True)
        else:
            y = grouped_query_sdpa(q, k, v, attn_mask=mask)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.d_model, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.d_model, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.d_model, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x, cos, sin, input_pos=None, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, input_pos, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        cos, sin = rotary_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("mask", causal_mask(config.max_seq), persistent=False)

    def setup_cache(self, batch: int, max_seq: int, dtype: torch.dtype):
        """Give every layer a KV cache for generation; model(idx, input_pos) then decodes."""
        device = self.embed_tokens.weight.device
        for block in self.layers:
            block.self_attn.kv_cache = KVCache(batch, self.config.n_kv_head, max_seq, self.config.head_dim,
                                               dtype, device)
        self.mask = causal_mask(max_seq, device)

    def forward(self, idx, input_pos=None, targets=None):
        """idx [batch, seq] -> logits [batch, seq, vocab]; with input_pos (the positions of idx's tokens), through
        the KV cache; with targets [batch, seq] (each position's next token), (logits, loss), as nanoGPT returns
        them."""
        positions = torch.arange(idx.shape[1], device=idx.device) if input_pos is None else input_pos
        cos, sin = self.rope_cos[positions][None], self.rope_sin[positions][None]
        mask = attention_mask(self.mask, idx.shape[1], input_pos, self.config.attention == "by_hand")
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x, cos, sin, input_pos, mask)
        return logits_and_loss(self.norm(x), self.lm_head, targets, self.config.loss)
