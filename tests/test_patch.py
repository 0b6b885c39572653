"""roofline.patch (what it catches, swaps and leaves, on small blocks and on the Llama-style example model) and
roofline.routing.Router (measured decisions, checks before a swap, the decisions' cache)."""

import functools
import math
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import roofline
from roofline import patching, routing
from roofline.patching import TORCH_SDPA, router

from module_checks import same_outputs_and_grads

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from examples.models.llama import Llama, LlamaConfig  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY_LLAMA = LlamaConfig(vocab_size=64, max_seq=32, n_layer=1, n_head=4, n_kv_head=2, d_model=32,
                         intermediate_size=48)


def served(model, op) -> dict[str, int]:
    """Calls of op by who served them."""
    counts = {}
    for row in router(model).report():
        if row["op"] == op:
            counts[row["served_by"]] = counts.get(row["served_by"], 0) + row["calls"]
    return counts


def twins(make, dtype=torch.float32):
    torch.manual_seed(0)
    theirs = make().to(DEVICE, dtype)
    ours = make().to(DEVICE, dtype)
    ours.load_state_dict(theirs.state_dict())
    return ours, theirs


# --------------------------------------------------------------------------- modules swapped by class

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
    model, reference = twins(Block)
    keys = list(model.state_dict())
    report = roofline.patch(model, policy="always")
    assert report.swapped == [("norm1", "layer_norm"), ("mlp.1", "gelu"), ("norm2", "rms_norm"),
                              ("", "scaled_dot_product_attention"), ("", "cross_entropy")]
    assert isinstance(model.norm1, nn.LayerNorm) and type(model.norm1).__name__ == "LayerNorm"
    assert type(model.custom) is Block.CustomNorm                      # a user's subclass keeps its forward
    assert list(model.state_dict()) == keys
    same_outputs_and_grads(model, reference, torch.randn(4, 9, 32, device=DEVICE), rtol=1e-4, atol=1e-4)
    assert served(model, "layer_norm") == {"roofline": 1} and served(model, "gelu") == {"roofline": 1}
    assert roofline.patch(model).swapped == []                          # nothing left to swap
    partial = Block()
    assert roofline.patch(partial, gelu=False, rms_norm=False, attention=False, cross_entropy=False).swapped == \
        [("norm1", "layer_norm")]


def test_patch_names_a_wrong_argument():
    with pytest.raises(TypeError, match="patch: model must be a torch.nn.Module, got dict"):
        roofline.patch({})
    with pytest.raises(ValueError, match="policy must be one of"):
        roofline.patch(Block(), policy="sometimes")


def test_patch_leaves_float64_to_torch_and_says_why():
    model, reference = twins(Block, torch.float64)
    roofline.patch(model, policy="always")
    x = torch.randn(3, 32, device=DEVICE, dtype=torch.float64)
    torch.testing.assert_close(model(x), reference(x), rtol=0, atol=0)
    reasons = {row["why"] for row in router(model).report()}
    assert reasons == {"dtype torch.float64 (served: float32, float16, bfloat16)"}


# --------------------------------------------------------------------------- a Llama-style model: SwiGLU MLP and RoPE

def test_patch_serves_the_llama_example_and_keeps_outputs_and_grads():
    model, reference = twins(lambda: Llama(TINY_LLAMA))
    report = roofline.patch(model, policy="always")
    assert ("layers.0.mlp", "swiglu") in report.swapped
    assert ("examples.models.llama.apply_rotary_pos_emb", "rope") in report.swapped
    assert [what for _, what in report.swapped].count("rms_norm") == 3 and report.left == []
    idx = torch.randint(0, TINY_LLAMA.vocab_size, (2, 7), device=DEVICE)
    same_outputs_and_grads(model, reference, idx, rtol=1e-4, atol=1e-4)
    for op in ("swiglu", "rope", "rms_norm"):
        assert served(model, op) == {"roofline": 3 if op == "rms_norm" else 1}, op
    assert served(model, "attention") == {"torch": 1}   # fp32: flash_attention serves fp16 and bf16
    import examples.models.llama as llama
    assert llama.apply_rotary_pos_emb.__module__ == "examples.models.llama"   # put back after the forward


class GeluMLP(nn.Module):
    """The names of a SwiGLU MLP, but not its forward."""

    def __init__(self, width=16):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(width, 24), nn.Linear(width, 24)
        self.down_proj = nn.Linear(24, width)

    def forward(self, x):
        return self.down_proj(F.gelu(self.gate_proj(x)) * self.up_proj(x))


def apply_rotary_pos_emb(q, k, cos, sin):
    """Interleaved (GPT-J) RoPE under Hugging Face's name: not what ops.rope computes."""
    def rotate(x):
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


def apply_rotary_emb(x, freqs_cis):
    """RoPE on complex numbers, under the name gpt-fast, torchtitan and Meta's Llama give it."""
    pairs = torch.view_as_complex(x.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(pairs * freqs_cis).flatten(-2).type_as(x)


def test_patch_checks_what_it_catches_by_name_and_leaves_what_differs():
    model = GeluMLP()
    report = roofline.patch(model, policy="always")
    assert type(model) is GeluMLP
    assert report.left == [("", "its forward is not down_proj(silu(gate_proj(x)) * up_proj(x))"),
                           (f"{__name__}.apply_rotary_emb", patching.UNSERVED_ROPE_WHY),
                           (f"{__name__}.apply_rotary_pos_emb", "apply_rotary_pos_emb is not rotate-half RoPE")]


class HandWrittenRMSNorm(nn.Module):
    """RMSNorm as Hugging Face's Llama and Qwen write it (their names: weight, variance_epsilon)."""

    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(width))
        self.variance_epsilon = eps

    def forward(self, hidden_states):
        dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon)).to(dtype)


class OffsetRMSNorm(nn.Module):
    """Gemma's variant (scaled by 1 + weight): the name and parameters of an RMSNorm, another forward."""

    def __init__(self, width, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(width))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps) * (1 + self.weight)).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_patch_serves_hand_written_rms_norms_and_leaves_their_variants(dtype):
    model, reference = twins(lambda: nn.Sequential(HandWrittenRMSNorm(48), nn.Linear(48, 48), OffsetRMSNorm(48)),
                             dtype)
    report = roofline.patch(model, policy="always", rope=False)
    assert report.swapped == [("0", "rms_norm"), ("", "scaled_dot_product_attention"), ("", "cross_entropy")]
    assert report.left == [("2", "its forward is not weight * rms_normalized(x in fp32).to(x.dtype)")]
    assert type(model[0]).__name__ == "HandWrittenRMSNorm" and list(model.state_dict()) == list(reference.state_dict())
    x = torch.randn(3, 5, 48, device=DEVICE, dtype=dtype)
    tolerance = 1e-5 if dtype == torch.float32 else 6e-2   # bf16: torch sums the weight's gradient in bf16
    same_outputs_and_grads(model, reference, x, rtol=tolerance, atol=tolerance)
    assert served(model, "rms_norm") == {"roofline": 1}


# --------------------------------------------------------------------------- attention

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


@pytest.mark.parametrize("options", [dict(is_causal=True), dict(scale=0.2), dict(is_causal=True, enable_gqa=True)])
def test_patch_routes_the_attention_flash_attention_serves(options):
    kv_heads = 1 if options.get("enable_gqa") else 2
    ours, theirs = twins(lambda: SelfAttention(kv_heads=kv_heads, **options), torch.float16)
    assert ("", "scaled_dot_product_attention") in roofline.patch(ours, policy="always").swapped
    x = torch.randn(2, 37, 128, device=DEVICE, dtype=torch.float16)
    same_outputs_and_grads(ours, theirs, x, rtol=2e-2, atol=2e-2)
    assert served(ours, "attention") == {"roofline": 1}
    assert F.scaled_dot_product_attention is TORCH_SDPA   # put back after the forward


@pytest.mark.parametrize("options, call_args, reason", [
    (dict(attn_mask=None, dropout_p=0.0), dict(dtype=torch.float32), "dtype torch.float32"),
    (dict(is_causal=True), dict(memory_length=20), "causal with query and key lengths that differ"),
    (dict(dropout_p=0.5), dict(), "dropout"),
    (dict(), dict(dim=96, heads=2), "head_dim 48"),
    (dict(), dict(kv_heads=1), "key heads differ"),
])
def test_patch_leaves_to_sdpa_what_flash_attention_does_not_serve(options, call_args, reason):
    dim, heads = call_args.get("dim", 128), call_args.get("heads", 2)
    ours, theirs = twins(lambda: SelfAttention(dim, heads, call_args.get("kv_heads", heads), **options),
                         call_args.get("dtype", torch.float16))
    roofline.patch(ours, policy="always")
    x = torch.randn(2, 24, dim, device=DEVICE, dtype=call_args.get("dtype", torch.float16))
    memory = torch.randn(2, call_args["memory_length"], dim, device=DEVICE, dtype=x.dtype) \
        if "memory_length" in call_args else None
    torch.manual_seed(1)   # the same dropout draws
    y_ours = ours(x, memory)
    torch.manual_seed(1)
    torch.testing.assert_close(y_ours, theirs(x, memory), rtol=0, atol=0)   # torch's own call, whatever it does
    [row] = router(ours).report()
    assert row["served_by"] == "torch" and row["why"].startswith(reason)


def test_patch_puts_sdpa_back_when_the_forward_raises():
    model = SelfAttention().to(DEVICE, torch.float16)
    roofline.patch(model)
    with pytest.raises(RuntimeError):
        model(torch.randn(2, 5, 64, device=DEVICE, dtype=torch.float16))   # wrong width for the projections
    assert F.scaled_dot_product_attention is TORCH_SDPA


def test_patched_model_under_torch_compile_leaves_every_call_to_torch():
    ours, theirs = twins(lambda: SelfAttention(is_causal=True), torch.float16)
    roofline.patch(ours, policy="always")
    compiled = torch.compile(ours, backend="aot_eager", fullgraph=True)
    x = torch.randn(1, 40, 128, device=DEVICE, dtype=torch.float16)
    torch.testing.assert_close(compiled(x), theirs(x), rtol=0, atol=0)
    assert router(ours).report() == []          # Inductor gets torch's expression; nothing was routed
    assert F.scaled_dot_product_attention is TORCH_SDPA


# --------------------------------------------------------------------------- Router: measured decisions

def _never(*args, **kwargs):
    return None


def _twice(x):
    return x * 2


def _doubled(x):
    return x + x


class Timer:
    """A stand-in for routing.time_as_eager that says what it is told and counts its calls."""

    def __init__(self, ours_us, torch_us):
        self.times, self.calls = (ours_us, torch_us), 0

    def __call__(self, run_ours, run_theirs, device):
        self.calls += 1
        run_ours(), run_theirs()
        return self.times


# the last two: faster in the loop, not by IN_PROGRAM_US (the second, Llama's decode SwiGLU as measured on the H100)
@pytest.mark.parametrize("times, ours", [((10.0, 25.0), True), ((20.0, 10.0), False), ((9.9, 10.0), False),
                                         ((12.0, 15.0), False), ((9.6, 15.9), False)])
def test_router_serves_each_signature_by_what_it_measured(times, ours):
    timer = Timer(*times)
    r = routing.Router(timer=timer, persist=False)
    calls = []
    mine = lambda x: calls.append("ours") or _twice(x)   # noqa: E731
    torchs = lambda x: calls.append("torch") or _doubled(x)   # noqa: E731
    x = torch.randn(5, 3)
    for _ in range(3):
        torch.testing.assert_close(r.call("double", _never, mine, torchs, x), x * 2)
    assert timer.calls == 1                      # measured once per signature
    [row] = r.report()
    assert row["served_by"] == ("roofline" if ours else "torch") and row["calls"] == 3
    assert (row["ours_us"], row["torch_us"]) == times and row["signature"] == "[5, 3] fp32 (forward)"
    if times == (12.0, 15.0):
        assert row["why"] == ("1.25x faster than torch in a loop, by less than the 10 us a routed call costs more "
                              "in a program")
    r.call("double", _never, mine, torchs, torch.randn(5, 4))   # a new signature: measured again
    assert timer.calls == 2


def test_router_measures_roofline_through_a_route_and_torch_as_called_unpatched(monkeypatch):
    # a patched program reaches roofline's op through its route and the router's look-up (a key built per call),
    # which torch's unpatched call never pays: the measurement must charge it to roofline's side
    keys = []
    built = routing._key
    monkeypatch.setattr(routing, "_key", lambda *a: keys.append(a[0]) or built(*a))
    during = {}

    def timer(run_ours, run_theirs, device):
        for name, run in (("ours", run_ours), ("torch", run_theirs)):
            before = len(keys)
            run()
            during[name] = len(keys) - before
        return 10.0, 25.0

    r = routing.Router(timer=timer, persist=False)
    x = torch.randn(5, 3)
    torch.testing.assert_close(r.call("double", _never, _twice, _doubled, x), x * 2)
    assert during == {"ours": 1, "torch": 0}
    assert r.report()[0]["served_by"] == "roofline"


@pytest.mark.eager_node
def test_a_calls_key_is_the_same_from_cpp_and_from_python(monkeypatch):
    # the key is built in C++ where the extension is (on every routed call), in Python where it cannot be built:
    # both must give the same keys (a cached decision is found under either), telling the same calls apart
    w = torch.randn(8)
    x = torch.randn(4, 8)
    calls = [((x, [8], w, None, 1e-5), {}), ((torch.randn(4, 8), (8,), w, None, 1e-5), {}),   # the same
             ((x.t().contiguous().t(), [8], w, None, 1e-5), {}),                            # strides
             ((x.double(), [8], w, None, 1e-5), {}), ((x, [8], w, None, 1e-6), {}),          # dtype, a value
             ((x.requires_grad_(False).clone().requires_grad_(), [8], w, None, 1e-5), {}),   # a gradient wanted
             ((x, [8], w), dict(bias=None, eps=1e-5)), ((x, [8], w), dict(eps=1e-5, bias=None)),   # keyword order
             ((x[:, :4], [4], w[:4], None, 1e-5), {})]
    from_cpp = [routing._key("layer_norm", args, kwargs) for args, kwargs in calls]
    with torch.no_grad():   # no gradient wanted: the key says so
        from_cpp.append(routing._key("layer_norm", *calls[5]))
    monkeypatch.setattr(routing._eager_node, "extension", lambda: None)
    from_python = [routing._key("layer_norm", args, kwargs) for args, kwargs in calls]
    with torch.no_grad():
        from_python.append(routing._key("layer_norm", *calls[5]))
    assert type(from_cpp[0][3]) is tuple and type(from_python[0][3]) is torch.Size   # (each build ran)
    assert from_cpp == from_python and [hash(k) for k in from_cpp] == [hash(k) for k in from_python]
    same = [[a == b for b in from_cpp] for a in from_cpp]
    assert same[0][1] and not any(same[0][2:-1]) and same[0][-1] and not same[6][7]


def test_router_measures_forward_and_backward_apart():
    timer = Timer(10.0, 25.0)
    r = routing.Router(timer=timer, persist=False)
    x = torch.randn(4, requires_grad=True)
    r.call("double", _never, _twice, _doubled, x).sum().backward()   # torch's: the gradient's layout, seen
    r.call("double", _never, _twice, _doubled, x)
    with torch.no_grad():
        r.call("double", _never, _twice, _doubled, x)
    assert timer.calls == 2
    rows = r.report()
    assert sorted(row["signature"] for row in rows if row["why"] != routing.AWAITING) == [
        "[4] fp32 (forward)", "[4] fp32 (forward+backward)"]


def _watched(fn):
    """fn, calling which records the strides of every gradient its output gets; and that record."""
    seen = []

    def watched(x):
        y = fn(x)
        y.register_hook(lambda g: seen.append(g.stride()))
        return y
    return watched, seen


def test_router_measures_with_gradients_laid_out_as_the_programs_arrive():
    # torch serves the first call that wants a gradient; its backward shows the layout the program's gradient has
    # (here transposed, the output contiguous), and the measurement's backward takes it: a measured layout the
    # program never uses leaves torch's caches (cuDNN attention's backward graph) holding it
    doubled, seen = _watched(_twice)
    timer = Timer(10.0, 25.0)
    r = routing.Router(timer=timer, persist=False)
    x = torch.randn(6, 4, requires_grad=True)
    for _ in range(2):
        r.call("double", _never, doubled, _doubled, x).t().contiguous().square().sum().backward()
    assert timer.calls == 1 and seen and set(seen) == {(1, 6)}


def test_router_measures_a_signature_whose_backward_never_comes_with_gradients_laid_out_as_its_outputs(
        monkeypatch):
    monkeypatch.setattr(routing, "AWAIT_CALLS", 3)
    transposed, seen = _watched(lambda x: (x * 2).t())
    timer = Timer(10.0, 25.0)
    r = routing.Router(timer=timer, persist=False)
    x = torch.randn(6, 4, requires_grad=True)
    for _ in range(4):
        r.call("double", _never, transposed, lambda t: (t + t).t(), x)
    assert timer.calls == 1 and seen and set(seen) == {(1, 4)}
    [awaiting] = [row for row in r.report() if row["why"] == routing.AWAITING]
    assert awaiting["calls"] == 3


def test_router_decides_under_autocast_apart():
    timer = Timer(10.0, 25.0)
    r = routing.Router(timer=timer, persist=False)
    x = torch.randn(4, 8)
    r.call("double", _never, _twice, _doubled, x)
    with torch.autocast("cpu", dtype=torch.bfloat16):   # torch's side may return another dtype here
        r.call("double", _never, _twice, _doubled, x)
    assert timer.calls == 2 and sum(row["calls"] for row in r.report()) == 2


def test_router_checks_roofline_against_torch_before_serving():
    timer = Timer(10.0, 25.0)
    r = routing.Router(timer=timer, persist=False)
    x = torch.randn(6)
    torch.testing.assert_close(r.call("wrong", _never, lambda t: t * 2 + 1e-2, _doubled, x), x * 2)
    torch.testing.assert_close(r.call("raises", _never, lambda t: 1 / 0, _doubled, x), x * 2)
    whys = {row["op"]: row["why"] for row in r.report()}
    assert whys["wrong"].startswith("differs from torch on a random input: relative error")
    assert whys["raises"] == "roofline raised ZeroDivisionError: division by zero"
    assert timer.calls == 0


def test_router_judges_gradients_by_the_dtype_autocast_ran_the_op_in():
    # autocast runs attention in bf16 on fp32 inputs (transformers' Llama rotates q and k in fp32): the inputs'
    # gradients come back fp32 with bf16's error, which fp32's tolerance would refuse
    def attention(q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)

    def in_bf16_otherwise(q):   # the same math, rounded differently: within bf16's error, beyond fp32's
        return attention(q.to(torch.bfloat16) * (1 + 2 ** -8))

    def decided(ours, autocast: bool) -> str:
        r = routing.Router(timer=Timer(10.0, 25.0), persist=False)
        q = torch.randn(1, 2, 16, 8, requires_grad=True)
        for _ in range(2):   # the first call's backward shows how its gradients arrive; the second is measured
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                out = r.call("attention", _never, ours, attention, q)
            out.float().sum().backward()
        return [row["why"] for row in r.report() if row["why"] != routing.AWAITING]

    assert decided(in_bf16_otherwise, autocast=True) == ["2.50x faster than torch here"]
    # in fp32 throughout, the same difference is refused
    [why] = decided(lambda q: attention(q * (1 + 2 ** -8)), autocast=False)
    assert why.startswith("differs from torch on a random input: relative error"), why


def test_router_leaves_to_torch_a_result_laid_out_otherwise():
    r = routing.Router(timer=Timer(10.0, 25.0), persist=False)
    x = torch.randn(4, 6).t()                    # torch's x * 2 keeps this transposed layout
    r.call("double", _never, lambda t: (t * 2).contiguous(), _twice, x)
    [row] = r.report()
    assert row["served_by"] == "torch" and row["why"].startswith("differs from torch on a random input: result 0 "
                                                                 "is laid out with strides (4, 1), torch's with (1, 6)")


def test_router_counts_why_roofline_cannot_serve():
    r = routing.Router(timer=Timer(10.0, 25.0), persist=False)
    for _ in range(2):
        r.call("double", lambda x: "not today", _twice, _doubled, torch.randn(3))
    assert r.report() == [dict(op="double", signature="[3] fp32 (forward)", calls=2, served_by="torch",
                               why="not today", ours_us=None, torch_us=None)]


def test_router_decisions_are_cached_for_the_next_process(tmp_path, monkeypatch):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    x = torch.randn(8)
    routing.Router(timer=Timer(10.0, 30.0)).call("double", _never, _twice, _doubled, x)
    later = routing.Router(timer=Timer(3.0, 1.0))
    later.call("double", _never, _twice, _doubled, torch.randn(8))
    [row] = later.report()
    assert later._timer.calls == 0 and row["served_by"] == "roofline"
    assert row["why"] == "3.00x faster than torch here (measured by an earlier run)"
    assert (tmp_path / routing.CACHE).exists()


def test_router_never_errs_where_torch_would_not():
    r = routing.Router("always", persist=False)

    def refuses(x):
        raise ValueError("rope: no gradient flows to cos")
    for _ in range(2):
        torch.testing.assert_close(r.call("double", _never, refuses, _doubled, torch.ones(3)), torch.full((3,), 2.0))
    [row] = r.report()
    assert row["served_by"] == "torch" and row["calls"] == 2
    assert row["why"] == "roofline raised ValueError: rope: no gradient flows to cos"


def test_router_always_serves_what_roofline_can():
    r = routing.Router("always", timer=Timer(5.0, 1.0), persist=False)
    r.call("double", _never, _twice, _doubled, torch.randn(2))
    assert r.report()[0]["served_by"] == "roofline" and r._timer.calls == 0


@pytest.mark.parametrize("times, settles", [((20.0, 10.0), True), ((10.0, 25.0), False)])
def test_a_route_that_torch_served_throughout_settles(times, settles):
    settled = []
    r = routing.Router(timer=Timer(*times), persist=False)
    route = routing.Route(r, "double", _never, _twice, _doubled, "double", on_settle=lambda: settled.append(1))
    for i in range(routing.SETTLE_CALLS + 3):
        torch.testing.assert_close(route(torch.full((3,), float(i))), torch.full((3,), 2.0 * i))
        assert route.settled == (settles and i + 1 >= routing.SETTLE_CALLS)
    assert settled == ([1] if settles else [])
    assert r.report()[0]["calls"] == (routing.SETTLE_CALLS if settles else routing.SETTLE_CALLS + 3)


def test_calls_served_without_a_decision_do_not_settle_a_route(monkeypatch):
    r = routing.Router(timer=Timer(20.0, 10.0), persist=False)
    route = routing.Route(r, "double", _never, _twice, _doubled, "double")
    monkeypatch.setattr(routing, "capturing", lambda: True)   # first seen during capture: nothing decided
    for _ in range(routing.SETTLE_CALLS + 1):
        route(torch.ones(2))
    assert not route.settled and route.decided == 0


class TanhGELU(nn.Module):
    """GELU as Hugging Face's NewGELUActivation writes it: the tanh formula, several kernels."""

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class NormActAttentionLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm, self.act = nn.LayerNorm(16), TanhGELU()

    def forward(self, x, target):
        h = self.act(self.norm(x))
        return F.scaled_dot_product_attention(h[None, None], h[None, None], h[None, None]), F.cross_entropy(h, target)


def test_patch_takes_out_the_routes_torch_served_throughout():
    model = NormActAttentionLoss().to(DEVICE, torch.float64)   # float64: torch serves every call
    x, target = torch.randn(5, 16, device=DEVICE, dtype=torch.float64), torch.randint(0, 16, (5,), device=DEVICE)
    want = model(x, target)
    report = roofline.patch(model)
    for i in range(routing.SETTLE_CALLS + 2):
        for a, b in zip(model(x, target), want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
        assert (type(model.norm) is nn.LayerNorm) == (i + 1 >= routing.SETTLE_CALLS)   # its own class back
    assert type(model.act) is not TanhGELU          # a hand-written GELU keeps going to F.gelu's one kernel
    assert sorted(report.settled()) == ["act", "cross_entropy", "norm", "scaled_dot_product_attention"]
    assert F.scaled_dot_product_attention is TORCH_SDPA and F.cross_entropy is patching.TORCH_CROSS_ENTROPY
    assert f"settled, torch served their first {routing.SETTLE_CALLS} calls" in str(report)
    calls = {row["op"]: row["calls"] for row in router(model).report()}
    assert calls == {op: routing.SETTLE_CALLS for op in ("layer_norm", "gelu", "attention", "cross_entropy")}
    assert roofline.patch(model).swapped == []      # a settled module is not swapped again


def test_time_as_eager_tells_a_slow_call_from_a_fast_one():
    fast_us, slow_us = routing.time_as_eager(lambda: None, lambda: time.sleep(2e-4), torch.device("cpu"))
    assert 0 < fast_us < 50 < slow_us


# --------------------------------------------------------------------------- on the GPU: measured, as users call it

@pytest.mark.gpu
def test_gpu_patched_llama_in_bf16_is_measured_and_matches():
    config = LlamaConfig(vocab_size=512, max_seq=256, n_layer=2, n_head=8, n_kv_head=2, d_model=512,
                         intermediate_size=1408)
    model, reference = twins(lambda: Llama(config), torch.bfloat16)
    report = roofline.patch(model)
    # torch serves the first step's calls, whose backward shows the gradients' layouts; the second's are measured
    for _ in range(2):
        idx = torch.randint(0, config.vocab_size, (4, 128), device="cuda")
        for m in (model, reference):
            m.zero_grad(set_to_none=True)
        losses = [m(idx).float().square().mean() for m in (model, reference)]
        for loss in losses:
            loss.backward()
    # bf16 through two layers: compared as norms (an elementwise rule trips on near-zero sums of many terms)
    assert abs(losses[0].item() - losses[1].item()) <= 1e-2 * losses[1].item()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        error = ((p.grad.float() - q.grad.float()).norm() / q.grad.float().norm()).item()
        assert error < 5e-2, f"{name}: relative error {error:.3g}"
    rows = router(model).report()
    assert {row["op"] for row in rows} == {"rms_norm", "swiglu", "rope", "attention"}, str(report)
    for row in rows:   # every call decided by a measurement, or by the check that came before it, or awaiting
        assert (row["ours_us"] > 0 and row["torch_us"] > 0) if row["ours_us"] is not None else \
            row["why"] == routing.AWAITING or row["why"].startswith("differs from torch on a random input"), row
    assert any(row["ours_us"] is not None for row in rows)


@pytest.mark.gpu
@pytest.mark.parametrize("heads_outer", [False, True])
def test_gpu_measuring_attention_leaves_torchs_cudnn_gradients_right(heads_outer):
    # torch 2.11 keeps cuDNN attention's backward graph under q's, k's and v's layouts only, not the gradient's:
    # a measurement whose gradient is laid out otherwise than the program's leaves the program's own backward a
    # graph built for the other layout (silently wrong gradients). The program's gradient here arrives laid out as
    # the output (q from a projection, seen as (batch, heads, seq, dim)), or not (q contiguous in that order, the
    # output then copied by .transpose(1, 2).reshape).
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, T, H, KV, D = 4, 128, 8, 2, 64
    shape = (lambda h: (B, h, T, D)) if heads_outer else (lambda h: (B, T, h, D))
    q, k, v = (torch.randn(*shape(h), device="cuda", dtype=torch.bfloat16) for h in (H, KV, KV))
    q, k, v = (t if heads_outer else t.transpose(1, 2) for t in (q, k, v))
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    project = torch.randn(H * D, H * D, device="cuda", dtype=torch.bfloat16) / H
    r = routing.Router(timer=Timer(10.0, 25.0), persist=False)

    def gradients(attention, dtype=torch.bfloat16):
        inputs = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        y = attention(*inputs, is_causal=True, enable_gqa=True)
        loss = (y.transpose(1, 2).reshape(B, T, H * D) @ project.to(dtype)).double().square().mean()
        return torch.autograd.grad(loss, inputs)

    routed = functools.partial(r.call, "attention", patching.why_not_flash, patching._flash, TORCH_SDPA)
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        gradients(routed)   # torch serves; its backward shows the gradient's layout
        gradients(routed)   # measured (torch's side forward and backward), then served by roofline
        grads = gradients(TORCH_SDPA)   # torch's own, after the measurement
    assert [row["served_by"] for row in r.report() if row["ours_us"] is not None] == ["roofline"]
    for name, got, want in zip("qkv", grads, gradients(F.scaled_dot_product_attention, torch.float64)):
        error = ((got.double() - want).norm() / want.norm()).item()
        assert error < 2e-2, f"d{name}: relative error {error:.3g}"


def _trained_under_autocast(models, vocab: int, shape) -> list[torch.Tensor]:
    """Each model's loss (computed in its forward) on the same random tokens under bf16 autocast, after its
    backward."""
    idx, targets = (torch.randint(0, vocab, shape, device="cuda") for _ in range(2))
    losses = []
    for m in models:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            losses.append(m(idx, targets=targets)[1])
        losses[-1].backward()
    return losses


@pytest.mark.gpu
def test_gpu_patched_training_under_autocast_routes_the_loss_and_matches():
    # fp32 weights, bf16 autocast, the loss computed in the forward: as benchmarks/models.py trains
    config = LlamaConfig(vocab_size=4096, max_seq=256, n_layer=2, n_head=8, n_kv_head=2, d_model=512,
                         intermediate_size=1408)
    model, reference = twins(lambda: Llama(config))
    report = roofline.patch(model, policy="always")
    losses = _trained_under_autocast((model, reference), config.vocab_size, (4, 256))
    assert losses[0].dtype == losses[1].dtype == torch.float32
    assert abs(losses[0].item() - losses[1].item()) <= 1e-2 * losses[1].item()
    for (name, p), q in zip(model.named_parameters(), reference.parameters()):
        error = ((p.grad - q.grad).norm() / q.grad.norm()).item()
        assert error < 5e-2, f"{name}: relative error {error:.3g}"
    assert served(model, "cross_entropy") == {"roofline": 1}, str(report)


@pytest.mark.gpu
def test_gpu_patched_model_compiles_with_inductor_and_leaves_its_calls_to_it():
    # compile+patch of benchmarks/models.py once failed in Inductor at the routed F.cross_entropy
    config = LlamaConfig(vocab_size=1024, max_seq=128, n_layer=1, n_head=4, n_kv_head=2, d_model=256,
                         intermediate_size=512)
    model, reference = twins(lambda: Llama(config))
    roofline.patch(model)
    losses = _trained_under_autocast((torch.compile(model), reference), config.vocab_size, (2, 128))
    assert abs(losses[0].item() - losses[1].item()) <= 1e-2 * losses[1].item()
    assert router(model).report() == [] and F.cross_entropy is patching.TORCH_CROSS_ENTROPY


def test_decisions_made_with_one_attention_forward_are_not_read_back_with_the_other(tmp_path, monkeypatch):
    """On a Hopper GPU, a decision measured with the tiled attention kernels is kept apart from one made with the
    Hopper kernels at every length (ROOFLINE_SM90_ATTENTION=1) and from one made with them at long sequences (auto,
    the default): the next process, with another setting, measures again. Elsewhere the setting changes nothing
    and splits nothing."""
    from roofline.ops import attention

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(routing, "_hopper_present", lambda: False)
    for setting in (None, True, False):
        monkeypatch.setattr(attention, "SM90_ATTENTION", setting)
        assert routing.kernel_settings() == ""
    monkeypatch.setattr(routing, "_hopper_present", lambda: True)
    monkeypatch.setattr(attention, "SM90_ATTENTION", False)
    routing.Router(timer=Timer(10.0, 30.0)).call("double", _never, _twice, _doubled, torch.randn(8))
    monkeypatch.setattr(attention, "SM90_ATTENTION", True)
    switched = routing.Router(timer=Timer(3.0, 1.0))
    switched.call("double", _never, _twice, _doubled, torch.randn(8))
    assert switched._timer.calls == 1 and switched.report()[0]["why"] == "torch 3.00x as fast here"
    monkeypatch.setattr(attention, "SM90_ATTENTION", False)
    later = routing.Router(timer=Timer(3.0, 1.0))
    later.call("double", _never, _twice, _doubled, torch.randn(8))
    assert later._timer.calls == 0 and later.report()[0]["served_by"] == "roofline"   # the first run's decision
    monkeypatch.setattr(attention, "SM90_ATTENTION", None)   # the default: the Hopper kernels at long sequences
    auto = routing.Router(timer=Timer(3.0, 1.0))
    auto.call("double", _never, _twice, _doubled, torch.randn(8))
    assert auto._timer.calls == 1
