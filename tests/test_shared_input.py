"""quantize_int8_weight_only's fusion of sibling layers called on one input (roofline.nn.SharedInput): what it
learns from a model's first forward, that every output stays the layer's own whatever the calls do, and that a
decode step launches fewer kernels."""

import copy

import pytest
import torch
from torch import nn

import roofline
from roofline import nn as rnn
from roofline.quantization import shared_inputs

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class Projections(nn.Module):
    """An attention's projections as model code calls them: q, k and v on one input, o on another."""

    def __init__(self, bias=False):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(64, 64, bias), nn.Linear(64, 32, bias), nn.Linear(64, 32, bias)
        self.o = nn.Linear(64, 64, bias)

    def forward(self, x):
        return self.q(x), self.k(x), self.v(x), self.o(x * 2)


def _pair(bias=False):
    """A quantized model and an unfused copy of it."""
    torch.manual_seed(0)
    model = Projections(bias).to(DEVICE, torch.bfloat16)
    alone = copy.deepcopy(model)
    roofline.quantize_int8_weight_only(model)
    roofline.quantize_int8_weight_only(alone, fuse_shared_input=False)
    assert all(layer.shared is None for layer in alone.children())
    return model, alone


def _row():
    return torch.randn(1, 1, 64, device=DEVICE, dtype=torch.bfloat16)


@pytest.fixture
def launches(monkeypatch):
    """The int8 matmuls run, by weight rows."""
    seen = []
    run = rnn._int8_linear

    def counted(x, weight_int8, scale, bias):
        seen.append(weight_int8.shape[0])
        return run(x, weight_int8, scale, bias)

    monkeypatch.setattr(rnn, "_int8_linear", counted)
    return seen


# the interpreter runs one config for any N, so fused and unfused sums match bit for bit; a GPU's autotuned configs
# may order them differently
EXACT_ON_CPU = dict(rtol=0, atol=0) if DEVICE == "cpu" else {}


def _same(ours, theirs):
    for a, b in zip(ours, theirs):
        assert a.is_contiguous() and a.shape == b.shape
        torch.testing.assert_close(a, b, **EXACT_ON_CPU)


@torch.no_grad()
def test_a_run_of_calls_on_one_input_is_one_matmul_after_the_first_forward(launches):
    model, alone = _pair()
    x = _row()
    _same(model(x), alone(x))
    assert shared_inputs(model) == []            # the first forward is learned from
    for _ in range(3):
        x = _row()
        expected = alone(x)
        del launches[:]
        _same(model(x), expected)
        assert launches == [128, 64]             # q, k and v as one; o alone
    assert shared_inputs(model) == [["q", "k", "v"]]
    assert "fused=['q', 'k', 'v']" in repr(model.q)
    # the layers' weights are views of the one matrix: no byte stored twice
    assert model.k.weight_int8.untyped_storage().data_ptr() == model.q.weight_int8.untyped_storage().data_ptr()
    assert set(model.state_dict()) == set(alone.state_dict())


@torch.no_grad()
def test_a_call_out_of_order_on_another_or_a_changed_input_runs_alone(launches):
    model, alone = _pair()
    for _ in range(2):
        model(_row())
    x, y = _row(), _row()
    expected = [alone.k(x), alone.q(x), alone.k(y)]
    del launches[:]
    _same([model.k(x), model.q(x), model.k(y)], expected)   # k with no q before it; k on another tensor
    assert launches == [32, 128, 32]
    before = x.clone()
    q = model.q(x)
    x.add_(1)                                                        # changed in place after q
    _same([q, model.k(x), model.v(x)], [alone.q(before), alone.k(x), alone.v(x)])
    _same([model.q(x), model.v(x)], [alone.q(x), alone.v(x)])        # k skipped
    rows = torch.randn(3, 64, device=DEVICE, dtype=torch.bfloat16)  # more than one row: each layer alone
    expected = alone(rows)
    del launches[:]
    _same(model(rows), expected)
    assert launches == [64, 32, 32, 64]


@torch.no_grad()
def test_biases_join_the_matmul_and_follow_their_updates(launches):
    model, alone = _pair(bias=True)
    for _ in range(2):
        model(_row())
    x = _row()
    _same(model(x), alone(x))
    model.k.bias.add_(1)
    alone.k.bias.add_(1)
    _same(model(x), alone(x))
    model.v.bias = nn.Parameter(torch.ones(32, device=DEVICE, dtype=torch.bfloat16))   # replaced
    alone.v.bias = nn.Parameter(torch.ones(32, device=DEVICE, dtype=torch.bfloat16))
    _same(model(x), alone(x))



@torch.no_grad()
def test_new_weights_reach_the_matmul(launches):
    model, alone = _pair()
    for _ in range(2):
        model(_row())
    other = Projections().to(DEVICE, torch.bfloat16)
    roofline.quantize_int8_weight_only(other, fuse_shared_input=False)
    model.load_state_dict(other.state_dict())    # copied into the views, so into the one matrix
    x = _row()
    _same(model(x), other(x))
    model.k.weight_int8 = torch.zeros_like(model.k.weight_int8)   # replaced, as model.to(...) replaces buffers
    other.k.weight_int8 = torch.zeros_like(other.k.weight_int8)
    expected = other(x)
    del launches[:]
    _same(model(x), expected)
    assert launches == [128, 64]                 # joined again


def test_inference_tensors_are_served_too(launches):
    model, alone = _pair()
    with torch.inference_mode():   # its tensors count no in-place changes: identity and order still checked
        for _ in range(2):
            model(_row())
        x, y = _row(), _row()
        expected = [*alone(x), alone.k(y)]
        del launches[:]
        _same([*model(x), model.k(y)], expected)
        assert launches == [128, 64, 32]


@torch.no_grad()
def test_layers_that_never_share_an_input_stop_learning():
    model = nn.Sequential(nn.Linear(64, 64), nn.Linear(64, 64)).to(DEVICE, torch.bfloat16)
    roofline.quantize_int8_weight_only(model)
    shared = model[0].shared
    assert shared is model[1].shared
    for _ in range(2):
        model(_row())
    assert not shared.learning and not shared.fused and shared.last is None
    assert shared_inputs(model) == []


@torch.no_grad()
def test_a_llama_decode_step_launches_four_matmuls_a_layer(launches):
    from examples.models.llama import Llama, LlamaConfig

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, max_seq=32, n_layer=2, n_head=4, n_kv_head=2, d_model=64,
                         intermediate_size=96)
    model = Llama(config).to(DEVICE, torch.bfloat16)
    alone = copy.deepcopy(model)
    roofline.quantize_int8_weight_only(model)
    roofline.quantize_int8_weight_only(alone, fuse_shared_input=False)
    for m in (model, alone):
        m.setup_cache(1, 32, torch.bfloat16)
    prompt = torch.randint(0, 96, (1, 6), device=DEVICE)
    positions = torch.arange(6, device=DEVICE)
    _same([model(prompt, input_pos=positions)], [alone(prompt, input_pos=positions)])
    for step in range(6, 9):
        token = torch.randint(0, 96, (1, 1), device=DEVICE)
        position = torch.tensor([step], device=DEVICE)
        expected = alone(token, input_pos=position)
        del launches[:]
        _same([model(token, input_pos=position)], [expected])
        # learned from the prefill: 2 layers x (qkv, o, gate_up, down) + the head, where 7 a layer were
        assert launches == [128, 64, 192, 64] * 2 + [96]
    assert shared_inputs(model) == [[f"layers.{i}.{part}" for part in parts] for i in range(2) for parts in (
        ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj"))]


@pytest.mark.gpu
@torch.no_grad()
def test_gpu_a_captured_decode_step_replays_the_fused_matmuls():
    from examples.models.llama import Llama, LlamaConfig
    from roofline.bench.steps import capture

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=512, max_seq=64, n_layer=2, n_head=8, n_kv_head=2, d_model=256,
                         intermediate_size=704)
    model = Llama(config).to("cuda", torch.bfloat16)
    alone = copy.deepcopy(model)
    roofline.quantize_int8_weight_only(model)
    roofline.quantize_int8_weight_only(alone, fuse_shared_input=False)
    prompt = torch.randint(0, 512, (1, 8), device="cuda")
    for m in (model, alone):
        m.setup_cache(1, 64, torch.bfloat16)
        m(prompt, input_pos=torch.arange(8, device="cuda"))
    token, position = prompt[:, -1:].clone(), torch.tensor([8], device="cuda")
    replay = capture(lambda: model(token, input_pos=position))   # its warm-up calls learn and fuse, outside
    assert len(shared_inputs(model)) == 4
    for step in range(8, 20):
        token.random_(0, 512)
        position.fill_(step)
        expected = alone(token, input_pos=position)
        torch.testing.assert_close(replay(), expected, rtol=2e-2, atol=2e-2)
