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
