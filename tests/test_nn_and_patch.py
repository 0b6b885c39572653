"""roofline.nn modules against their torch counterparts (same parameters, state-dict keys, outputs and gradients)
and roofline.patch on a small transformer block."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import roofline
from roofline import nn as rnn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _same_outputs_and_grads(ours: nn.Module, theirs: nn.Module, *inputs, rtol=1e-5, atol=1e-5):
    a = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    b = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ya, yb = ours(*a), theirs(*b)
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    ya.sum().backward()
    yb.sum().backward()
    for x, y in zip(a, b):
        if x.is_floating_point():
            torch.testing.assert_close(x.grad, y.grad, rtol=rtol, atol=atol)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("make, torch_make, shape", [
    (lambda: rnn.LayerNorm(48), lambda: nn.LayerNorm(48), (5, 48)),
    (lambda: rnn.LayerNorm((6, 8), bias=False), lambda: nn.LayerNorm((6, 8), bias=False), (5, 6, 8)),
    (lambda: rnn.RMSNorm(48, eps=1e-6), lambda: nn.RMSNorm(48, eps=1e-6), (5, 48)),
    (lambda: rnn.GELU("tanh"), lambda: nn.GELU("tanh"), (5, 48)),
])
def test_modules_match_torch_with_the_same_state_dict(make, torch_make, shape):
    torch.manual_seed(0)
    ours, theirs = make().to(DEVICE), torch_make().to(DEVICE)
    with torch.no_grad():
        for p in theirs.parameters():
            p.copy_(torch.randn_like(p))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    _same_outputs_and_grads(ours, theirs, torch.randn(shape, device=DEVICE))


@pytest.mark.parametrize("options", [dict(), dict(reduction="sum", label_smoothing=0.1), dict(ignore_index=2)])
def test_cross_entropy_loss_matches_torch(options):
    logits, target = torch.randn(7, 30, device=DEVICE), torch.randint(0, 30, (7,), device=DEVICE)
    _same_outputs_and_grads(rnn.CrossEntropyLoss(**options), nn.CrossEntropyLoss(**options), logits, target)
    # what the kernel does not serve goes to torch: class weights, probability targets
    weighted = rnn.CrossEntropyLoss(weight=torch.rand(30, device=DEVICE))
    torch.testing.assert_close(weighted(logits, target), F.cross_entropy(logits, target, weight=weighted.weight))
    probabilities = torch.softmax(torch.randn(7, 30, device=DEVICE), -1)
    torch.testing.assert_close(rnn.CrossEntropyLoss()(logits, probabilities), F.cross_entropy(logits, probabilities))


def test_swiglu_mlp_keys_and_output():
    mlp = rnn.SwiGLUMLP(16, 40, device=DEVICE)
    assert list(mlp.state_dict()) == ["gate_proj.weight", "up_proj.weight", "down_proj.weight"]
    x = torch.randn(3, 5, 16, device=DEVICE)
    expected = mlp.down_proj(F.silu(mlp.gate_proj(x)) * mlp.up_proj(x))
    torch.testing.assert_close(mlp(x), expected, rtol=1e-5, atol=1e-5)


def test_float64_falls_back_to_torch():
    ln = rnn.LayerNorm(10).double()
    x = torch.randn(4, 10, dtype=torch.float64)
    torch.testing.assert_close(ln(x), F.layer_norm(x, (10,), ln.weight, ln.bias))


class Block(nn.Module):
    """A pre-norm transformer block's non-attention half, with one subclass that must not be swapped."""

    class CustomNorm(nn.LayerNorm):
        def forward(self, x):
            return super().forward(x) * 2

    def __init__(self, width=32):
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(approximate="tanh"), nn.Linear(4 * width, width))
        self.norm2 = nn.RMSNorm(width)
        self.custom = Block.CustomNorm(width)

    def forward(self, x):
        x = x + self.mlp(self.norm1(x))
        return self.custom(self.norm2(x))


def test_patch_swaps_in_place_and_keeps_outputs():
    torch.manual_seed(0)
    model = Block().to(DEVICE)
    reference = Block().to(DEVICE)
    reference.load_state_dict(model.state_dict())
    keys = list(model.state_dict())
    swapped = roofline.patch(model)
    assert swapped == [("norm1", "LayerNorm"), ("mlp.1", "GELU"), ("norm2", "RMSNorm")]
    assert isinstance(model.norm1, rnn.LayerNorm) and type(model.custom) is Block.CustomNorm
    assert list(model.state_dict()) == keys
    _same_outputs_and_grads(model, reference, torch.randn(4, 9, 32, device=DEVICE), rtol=1e-4, atol=1e-4)
    assert roofline.patch(model) == []                                    # nothing left to swap
    partial = Block()
    assert roofline.patch(partial, gelu=False, rms_norm=False) == [("norm1", "LayerNorm")]


def test_patch_names_a_wrong_argument():
    with pytest.raises(TypeError, match="patch: model must be a torch.nn.Module, got dict"):
        roofline.patch({})


@pytest.mark.gpu
def test_gpu_patched_block_in_bf16():
    model = Block(1024).to("cuda", torch.bfloat16)
    reference = Block(1024).to("cuda", torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    roofline.patch(model)
    x = torch.randn(8, 512, 1024, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(model(x), reference(x), rtol=1.6e-2, atol=5e-2)


# --------------------------------------------------------------------------- patch(model, attention=True)

class SelfAttention(nn.Module):
    """A block that calls F.scaled_dot_product_attention as most models do; the arguments of the call are set per
    test."""

    def __init__(self, dim=128, heads=2, kv_heads=2, **sdpa_options):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = nn.Linear(dim, dim, bias=False)
        self.kv = nn.Linear(dim, 2 * kv_heads * self.head_dim, bias=False)
        self.sdpa_options = sdpa_options

    def forward(self, x, memory=None):
        b, n, _ = x.shape
        memory = x if memory is None else memory
        q = self.q(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(memory).view(b, memory.shape[1], 2, self.kv_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, **self.sdpa_options).transpose(1, 2).reshape(b, n, -1)


def _twins(make, dtype=torch.float16):
    torch.manual_seed(0)
    theirs = make().to(DEVICE, dtype)
    ours = make().to(DEVICE, dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


@pytest.mark.parametrize("options", [dict(is_causal=True), dict(scale=0.2), dict(is_causal=True, enable_gqa=True)])
def test_patch_routes_the_attention_flash_attention_serves(options):
    kv_heads = 1 if options.get("enable_gqa") else 2
    ours, theirs = _twins(lambda: SelfAttention(kv_heads=kv_heads, **options))
    assert roofline.patch(ours, attention=True) == [("", "scaled_dot_product_attention")]
    assert roofline.patch(ours, attention=True) == []   # once only
    router = roofline.patching.attention_router(ours)
    x = torch.randn(2, 37, 128, device=DEVICE, dtype=torch.float16)
    _same_outputs_and_grads(ours, theirs, x, rtol=2e-2, atol=2e-2)
    assert router.served == 1 and not router.passed
    assert F.scaled_dot_product_attention is roofline.patching.TORCH_SDPA   # put back after the forward


@pytest.mark.parametrize("options, call_args, reason", [
    (dict(attn_mask=None, dropout_p=0.0), dict(dtype=torch.float32), "dtype torch.float32"),
    (dict(is_causal=True), dict(memory_length=20), "causal with query and key lengths that differ"),
    (dict(dropout_p=0.5), dict(), "dropout"),
    (dict(), dict(dim=96, heads=2), "head_dim 48"),
    (dict(), dict(kv_heads=1), "key heads differ"),
])
def test_patch_leaves_to_sdpa_what_flash_attention_does_not_serve(options, call_args, reason):
    dim, heads = call_args.get("dim", 128), call_args.get("heads", 2)
    ours, theirs = _twins(lambda: SelfAttention(dim, heads, call_args.get("kv_heads", heads), **options),
                          call_args.get("dtype", torch.float16))
    roofline.patch(ours, attention=True)
    x = torch.randn(2, 24, dim, device=DEVICE, dtype=call_args.get("dtype", torch.float16))
    memory = torch.randn(2, call_args["memory_length"], dim, device=DEVICE, dtype=x.dtype) \
        if "memory_length" in call_args else None
    torch.manual_seed(1)   # the same dropout draws
    y_ours = ours(x, memory)
    torch.manual_seed(1)
    torch.testing.assert_close(y_ours, theirs(x, memory), rtol=0, atol=0)   # torch's own call, whatever it does
    router = roofline.patching.attention_router(ours)
    assert router.served == 0 and [r for r in router.passed if r.startswith(reason)]


def test_patch_puts_sdpa_back_when_the_forward_raises():
    model = SelfAttention().to(DEVICE, torch.float16)
    roofline.patch(model, attention=True)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 5, 64, device=DEVICE, dtype=torch.float16))   # wrong width for the projections
    assert F.scaled_dot_product_attention is roofline.patching.TORCH_SDPA


def test_patched_attention_under_torch_compile():
    ours, theirs = _twins(lambda: SelfAttention(is_causal=True))
    roofline.patch(ours, attention=True)
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    x = torch.randn(1, 40, 128, device=DEVICE, dtype=torch.float16)
    torch.testing.assert_close(compiled(x), theirs(x), rtol=2e-2, atol=2e-2)
    assert roofline.patching.attention_router(ours).served >= 1
    assert F.scaled_dot_product_attention is roofline.patching.TORCH_SDPA


# --------------------------------------------------------------------------- quantize_int8_weight_only

def test_quantize_int8_weight_only_swaps_linears_and_reports_memory():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 96), nn.GELU(), nn.Linear(96, 32, bias=False), rnn.RMSNorm(32))
    model = model.to(DEVICE, torch.bfloat16)
    x = torch.randn(5, 64, device=DEVICE, dtype=torch.bfloat16)
    before = model(x).float()
    report = roofline.quantize_int8_weight_only(model, skip=lambda name, m: False)
    assert report.layers == ["0", "2"] and all(isinstance(model[i], rnn.Int8Linear) for i in (0, 2))
    assert report.bytes_before == (64 * 96 + 96 * 32) * 2
    assert report.bytes_after == 64 * 96 + 96 * 32 + (96 + 32) * 4
    assert "MiB saved" in str(report)
    after = model(x).float()
    assert 10 * torch.log10(before.square().sum() / (after - before).square().sum()) > 30   # dB
    assert set(model.state_dict()) == {"0.weight_int8", "0.scale", "0.bias", "2.weight_int8", "2.scale",
                                       "3.weight"}
    assert roofline.quantize_int8_weight_only(model).layers == []   # nothing left to swap


def test_quantize_int8_weight_only_with_groups_keeps_a_scale_per_group():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 16)).to(DEVICE, torch.bfloat16)
    x = torch.randn(3, 128, device=DEVICE, dtype=torch.bfloat16)
    before = model(x).float()
    report = roofline.quantize_int8_weight_only(model, group_size=64)
    assert [model[i].scale.shape for i in (0, 1)] == [(64, 2), (16, 1)]
    assert report.bytes_after == 128 * 64 + 64 * 16 + (64 * 2 + 16) * 4
    assert "group_size=64" in repr(model[0])
    after = model(x).float()
    assert 10 * torch.log10(before.square().sum() / (after - before).square().sum()) > 30   # dB
    with pytest.raises(ValueError, match="group_size must be None or a multiple of 64"):
        roofline.quantize_int8_weight_only(nn.Sequential(nn.Linear(96, 8)), group_size=64)


def test_quantize_int8_weight_only_skips_what_it_is_told_to():
    model = nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 8)).to(DEVICE, torch.float16)
    report = roofline.quantize_int8_weight_only(model, skip=lambda name, m: m.out_features == 8)
    assert report.layers == ["0"] and type(model[1]) is nn.Linear
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        roofline.quantize_int8_weight_only("model")


def test_int8_linear_module_runs_on_torch_where_the_kernel_does_not():
    layer = nn.Linear(32, 8).double()
    int8 = rnn.Int8Linear.from_linear(layer)
    x = torch.randn(3, 32, dtype=torch.float64)
    torch.testing.assert_close(int8(x), layer(x), rtol=0.02, atol=0.02)
