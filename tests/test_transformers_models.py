"""roofline.patch on Hugging Face's own model code (transformers' Llama, Qwen2 and GPT-2, built from small configs:
no download): what it swaps as those models are written, outputs and gradients unchanged."""

import pytest
import torch
import transformers

import roofline
from roofline.patching import router

from module_checks import same_outputs_and_grads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
SMALL = dict(vocab_size=64, max_position_embeddings=32, attn_implementation="sdpa")
MODELS = {
    "llama": lambda: transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        **SMALL)),
    "qwen2": lambda: transformers.Qwen2ForCausalLM(transformers.Qwen2Config(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        **SMALL)),
    "gpt2": lambda: transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=4, bos_token_id=0, eos_token_id=0,
        attn_implementation="sdpa")),
}
SWAPPED = {
    "llama": ["model.layers.0.mlp swiglu", "model.layers.0.input_layernorm rms_norm",
              "model.layers.0.post_attention_layernorm rms_norm", "model.norm rms_norm",
              " scaled_dot_product_attention", " cross_entropy",
              "transformers.models.llama.modeling_llama.apply_rotary_pos_emb rope"],
    "qwen2": ["model.layers.0.mlp swiglu", "model.layers.0.input_layernorm rms_norm",
              "model.layers.0.post_attention_layernorm rms_norm", "model.norm rms_norm",
              " scaled_dot_product_attention", " cross_entropy",
              "transformers.models.qwen2.modeling_qwen2.apply_rotary_pos_emb rope"],
    "gpt2": ["transformer.h.0.ln_1 layer_norm", "transformer.h.0.ln_2 layer_norm", "transformer.h.0.mlp.act gelu",
             "transformer.ln_f layer_norm", " scaled_dot_product_attention", " cross_entropy"],
}


class Logits(torch.nn.Module):
    """The model's logits as one tensor, for the output-and-gradient check."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, idx):
        return self.model(idx).logits


def _same_loss_and_grads(model, reference, loss_of, loss_tolerance, grad_tolerance):
    """loss_of(model) against loss_of(reference), then every parameter's gradient, within (rtol, atol) each."""
    losses = [loss_of(m) for m in (model, reference)]
    torch.testing.assert_close(losses[0], losses[1], rtol=loss_tolerance[0], atol=loss_tolerance[1])
    for loss in losses:
        loss.backward()
    for (where, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=grad_tolerance[0], atol=grad_tolerance[1],
                                   msg=lambda m, where=where: f"{where}: {m}")


@pytest.mark.parametrize("name", list(MODELS))
def test_patch_serves_transformers_models_as_written(name):
    torch.manual_seed(0)
    model, reference = MODELS[name]().to(DEVICE).eval(), MODELS[name]().to(DEVICE).eval()
    reference.load_state_dict(model.state_dict())
    report = roofline.patch(model, policy="always")
    assert sorted(f"{where} {what}" for where, what in report.swapped) == sorted(SWAPPED[name])
    assert report.left == []
    idx = torch.randint(0, 64, (2, 7), device=DEVICE)
    same_outputs_and_grads(Logits(model), Logits(reference), idx, rtol=1e-4, atol=1e-4)
    # the loss as transformers computes it inside the forward (F.cross_entropy over shifted labels, -100 ignored)
    labels = idx.clone()
    labels[0, :3] = -100
    _same_loss_and_grads(model, reference, lambda m: m(idx, labels=labels).loss, (1e-5, 1e-5), (1e-4, 1e-5))
    served = {row["op"]: row["served_by"] for row in router(model).report()}
    kernels = {"llama": ["rms_norm", "swiglu", "rope"], "qwen2": ["rms_norm", "swiglu", "rope"],
               "gpt2": ["layer_norm", "gelu"]}[name] + ["cross_entropy"]
    assert served == {**{op: "roofline" for op in kernels}, "attention": "torch"}   # fp32: flash serves fp16/bf16


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_gpu_transformers_models_patched_in_bf16_measure_and_match(name):
    torch.manual_seed(0)
    model = MODELS[name]().to("cuda", torch.bfloat16).eval()
    reference = MODELS[name]().to("cuda", torch.bfloat16).eval()
    reference.load_state_dict(model.state_dict())
    roofline.patch(model)
    idx = torch.randint(0, 64, (4, 31), device="cuda")
    with torch.no_grad():
        got, want = model(idx).logits.float(), reference(idx).logits.float()
    assert ((got - want).norm() / want.norm()).item() < 3e-2
    assert all(row["ours_us"] is not None or row["served_by"] == "torch" for row in router(model).report())


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_under_autocast_rope_and_attention_see_the_dtypes_autocast_runs(name):
    """fp32 weights under bf16 autocast, as training runs them: q and k come from the projections in bf16, cos and sin
    in fp32, so torch's RoPE promotes to fp32, and autocast runs attention in bf16. Both are served by roofline,
    with the dtypes torch's code gives (they were left to torch: 'torch promotes the result')."""
    make = {"llama": (transformers.LlamaForCausalLM, transformers.LlamaConfig),
            "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config)}[name]
    config = make[1](hidden_size=128, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                     num_key_value_heads=2, **SMALL)   # head_dim 32: one flash_attention serves
    torch.manual_seed(0)
    model, reference = make[0](config).to(DEVICE).train(), make[0](config).to(DEVICE).train()
    reference.load_state_dict(model.state_dict())
    roofline.patch(model, policy="always")
    idx = torch.randint(0, 64, (2, 8), device=DEVICE)
    def under_autocast(m):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return m(idx, labels=idx).loss

    _same_loss_and_grads(model, reference, under_autocast, (2e-2, 2e-2), (5e-2, 5e-3))
    served = {row["op"]: row["served_by"] for row in router(model).report()}
    assert served["rope"] == "roofline" and served["attention"] == "roofline", router(model).report()
