"""Transformer models written the way users write them, for roofline's benchmarks and examples.

    gpt2.py   GPT-2: LayerNorm, GELU-tanh MLP, fused QKV projection, causal attention, tied LM head
    llama.py  a Llama-style model: RMSNorm, SwiGLU MLP, rotary embeddings (rotate-half, as Hugging Face
              writes them), grouped-query attention
    cache.py  the static KV cache both use for generation (fixed shapes, so a decode step can be a CUDA graph)

Plain PyTorch, no roofline imports: `roofline.patch` and `quantize_int8_weight_only` are applied to them from
outside, as a user would apply them to their own model.
"""
