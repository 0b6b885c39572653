"""roofline.nn modules against their torch counterparts (same parameters, state-dict keys, outputs and gradients),
and quantize_int8_weight_only. roofline.patch: tests/test_patch.py."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import roofline
from roofline import nn as rnn

from module_checks import same_outputs_and_grads

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


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
    same_outputs_and_grads(ours, theirs, torch.randn(shape, device=DEVICE))


@pytest.mark.parametrize("options", [dict(), dict(reduction="sum", label_smoothing=0.1), dict(ignore_index=2)])
def test_cross_entropy_loss_matches_torch(options):
    logits, target = torch.randn(7, 30, device=DEVICE), torch.randint(0, 30, (7,), device=DEVICE)
    same_outputs_and_grads(rnn.CrossEntropyLoss(**options), nn.CrossEntropyLoss(**options), logits, target)
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
