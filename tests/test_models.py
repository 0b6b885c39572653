"""The example models (examples/models) and the whole-model benchmark (benchmarks/models.py) at tiny sizes."""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
import decode_ab  # noqa: E402  (benchmarks/decode_ab.py)
import models as benchmark  # noqa: E402  (benchmarks/models.py)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoding_through_the_kv_cache_gives_the_full_forward_logits(name):
    model = benchmark.build(name, tiny=True, device=torch.device("cpu")).double()
    idx = torch.randint(0, model.config.vocab_size, (3, 11))
    full = model(idx)
    model.setup_cache(3, 16, torch.float64)
    prefill = model(idx[:, :6], torch.arange(6))
    steps = [model(idx[:, i:i + 1], torch.tensor([i])) for i in range(6, 11)]
    torch.testing.assert_close(torch.cat([prefill, *steps], dim=1), full, rtol=1e-10, atol=1e-10)


def _twins(name, field, values):
    """The tiny model of `name`, built from the same seed once for each value of its config's `field`, in float64."""
    cls, _, tiny = benchmark.MODELS[name]
    models = []
    for value in values:
        torch.manual_seed(0)
        models.append(cls(type(tiny)(**{**tiny.__dict__, field: value})).double())
    return models, tiny


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_attention_by_hand_computes_what_sdpa_does(name):
    """attention="by_hand" (profile_models' unfixed program) is the same model: training logits and gradients,
    and decoding through the KV cache."""
    models, tiny = _twins(name, "attention", ("sdpa", "by_hand"))
    idx = torch.randint(0, tiny.vocab_size, (2, 9))
    (sdpa_logits, sdpa_loss), (hand_logits, hand_loss) = (m(idx, targets=idx) for m in models)
    torch.testing.assert_close(hand_logits, sdpa_logits, rtol=1e-10, atol=1e-10)
    sdpa_loss.backward()
    hand_loss.backward()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12)
    for m in models:
        m.setup_cache(2, 16, torch.float64)
    decoded = [m(idx[:, :4], torch.arange(4)) for m in models]
    torch.testing.assert_close(decoded[1], decoded[0], rtol=1e-10, atol=1e-10)
    with pytest.raises(ValueError, match="attention must be one of"):
        type(tiny)(attention="flash")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_the_fused_head_and_loss_give_the_separate_ones_loss_and_gradients(name):
    """loss="fused" (the ladder's fused linear + cross-entropy rung): no logits, the same loss and gradients, the
    tied embedding's included."""
    models, tiny = _twins(name, "loss", ("separate", "fused"))
    idx = torch.randint(0, tiny.vocab_size, (2, 9))
    (_, separate), (logits, fused) = (m(idx, targets=idx) for m in models)
    assert logits is None
    torch.testing.assert_close(fused, separate, rtol=1e-10, atol=1e-10)
    separate.backward()
    fused.backward()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-9, atol=1e-12)
    with pytest.raises(ValueError, match="loss must be one of"):
        type(tiny)(loss="chunked")


@pytest.mark.long
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_models_benchmark_runs_every_cpu_mode_and_checks_numerics(tmp_path):
    # Llama alone: its patch serves the most ops (GPT-2's, layer_norm and gelu, are patched in test_patch.py), and
    # each model here costs about 40 s under the interpreter
    code = benchmark.main([str(tmp_path), "--tiny", "--models", "llama", "--train", "eager", "patch-all",
                           "patch-all+tiled", "compile+patch", "--generate", "eager", "patch-all", "int8", "--batches",
                           "2", "--steps", "2", "--warmup", "1", "--tokens", "3"])
    assert code == 0
    result = json.loads((tmp_path / "models.json").read_text())
    expected = {"train": ["eager", "patch-all", "patch-all+tiled", "compile+patch"],
                "generate": ["eager", "patch-all", "int8"]}
    for kind, modes in expected.items():
        assert list(result[kind]) == ["llama"]
        for name in ("llama",):
            rows = result[kind][name]
            assert [r["mode"] for r in rows] == modes
            assert all(r["numerics_ok"] and r["median_ms"] > 0 and len(r["samples_ms"]) >= 2 for r in rows)
    llama = {r["mode"]: r for r in result["train"]["llama"]}
    served = {row["op"]: row["served_by"] for row in llama["patch-all"]["routes"]}
    assert served == {"rms_norm": "roofline", "swiglu": "roofline", "rope": "roofline", "attention": "torch",
                      "cross_entropy": "roofline"}   # the loss, computed in the model's forward
    assert llama["eager"]["losses"][0] > 0 and llama["eager"]["routes"] is None
    # under compile no judge can run (Inductor serves the compiled step's calls): none is waited for, and it says so
    assert llama["compile+patch"]["verdicts"] == [
        "none judged: under torch.compile Inductor serves every call of the timed steps; patch's routes served only "
        "calls made eagerly (generation's: the prompt's prefill)"]
    assert "| patch-all |" in (tmp_path / "models.md").read_text()


def test_a_tiled_mode_switches_the_hopper_attention_off_during_its_own_turns_only(monkeypatch):
    """patch-all+tiled takes turns with patch-all in one process: the Hopper kernels are off while it runs and the
    setting back as it was after (also where the mode fails), and left alone for the other modes."""
    from roofline.ops import attention

    monkeypatch.setattr(attention, "SM90_ATTENTION", None)   # the default: where they were timed faster
    before = attention.SM90_ATTENTION
    for mode, inside in (("patch-all+tiled", False), ("patch-all", before), ("eager", before)):
        with benchmark._in_force(None, mode):
            assert attention.SM90_ATTENTION is inside
        assert attention.SM90_ATTENTION is before
    with pytest.raises(RuntimeError, match="a failed step"):
        with benchmark._in_force(None, "patch-all+tiled"):
            raise RuntimeError("a failed step")
    assert attention.SM90_ATTENTION is before


def test_the_head_dim_128_llama_is_the_same_llama_with_fewer_wider_heads():
    """hf-llama-hd128: hf-llama's sizes with head_dim 128 (the full model's 2048 / 16 heads; the tiny one's
    heads halved too)."""
    import hf_models

    full, tiny = hf_models._HEADS["hf-llama-hd128"]
    assert hf_models._SIZES["hidden_size"] // full["num_attention_heads"] == 128
    assert full["num_attention_heads"] // full["num_key_value_heads"] == 4   # grouped as hf-llama's
    config = hf_models.build("hf-llama-hd128", tiny=True).config
    assert (config.num_attention_heads, config.num_key_value_heads) == (2, 1)
    assert config.hidden_size == hf_models._TINY["hidden_size"] and config.num_hidden_layers == 2


def test_generation_speedups_are_paired_by_turn():
    # the host's speed drifts from turn to turn (here 10 then 20 ms a step, and back); each turn both modes decode,
    # the candidate 10% faster in every one: paired by turn, the interval is as tight as that; over the samples
    # as if independent, it spans the drift
    eager = [10.0] * 4 + [20.0] * 4
    rows = [dict(mode="eager", samples_ms=eager * 4, turns=[4] * 8),
            dict(mode="int8", samples_ms=[t / 1.1 for t in eager * 4], turns=[4] * 8),
            dict(mode="patch", samples_ms=[t / 1.1 for t in eager * 4])]   # no turns: training's rows
    benchmark._speedups(rows, "eager", "vs_eager")
    paired, unpaired = rows[1]["vs_eager"], rows[2]["vs_eager"]
    assert paired["paired"] and paired["low"] == pytest.approx(1.1) and paired["high"] == pytest.approx(1.1)
    assert not unpaired["paired"] and unpaired["high"] - unpaired["low"] > 0.5


def test_decode_ab_times_the_modes_in_rounds_and_each_call_inside_the_model(tmp_path):
    modes = ["eager", "patch-without-layer_norm,gelu"]   # (int8 runs its kernel through the interpreter here: slow)
    code = decode_ab.main([str(tmp_path), "--tiny", "--model", "gpt2", "--modes", *modes, "--rounds", "2",
                           "--tokens", "2", "--warmup", "1"])
    assert code == 0
    result = json.loads((tmp_path / "decode_ab.json").read_text())
    assert list(result["rounds"]) == modes and result["rounds"]["eager"]["speedup"] == 1.0
    assert all(r["ms"] > 0 and len(r["rounds_ms"]) == 2 for r in result["rounds"].values())
    tokens = 2 * 2   # the timed rounds' tokens: 2 layers, each with 4 linears and 2 norms, then the head and a norm
    host = result["host_us"]
    for mode in modes:
        assert host[mode]["Linear"]["calls"] == 9 * tokens
        assert host[mode]["LayerNorm"]["calls"] == 5 * tokens and host[mode]["CausalSelfAttention"]["calls"] == 2 * tokens
        assert all(v["us"] > 0 for v in host[mode].values())


def test_models_benchmark_knows_the_modes_that_need_a_gpu():
    assert benchmark.needs_gpu(["eager", "graphs+patch", "compile"], ["int8+graphs", "compile", "patch"]) == \
        ["compile", "graphs+patch", "int8+graphs"]


def test_profiling_a_model_s_training_times_the_steps_outside_the_window(tmp_path):
    import profile_models   # benchmarks/profile_models.py

    profile_models.main([str(tmp_path), "--runs", "llama", "--steps", "11", "--tiny"])
    (row,) = json.loads((tmp_path / "profile_models.json").read_text())["runs"]
    # 11 steps, 3 skipped (the third the profiler's warm-up), 5 recorded: steps 1, 9 and 10 (0-based) are timed
    # (0 is the program's own warm-up, 8 the profiler stopping)
    assert row["steps_timed"] == 3 and row["steps_recorded"] == 5
    # how much the profiler stretched a step is read from the two, not asserted: on a loaded 2-core machine one
    # unprofiled step took 1,012 ms (CI, 2026-11-28) and the recorded ones less
    assert row["step_ms"] > 0 and row["profiled_step_ms"] > 0
    assert row["inflation"] == pytest.approx(row["profiled_step_ms"] / row["step_ms"])
    assert "| llama |" in (tmp_path / "profile_models.md").read_text()


@pytest.mark.long
def test_a_finding_s_advice_is_applied_to_the_program_and_timed(tmp_path):
    import profile_models

    report = {"totals": {"steps": 5}, "findings": [
        {"id": "unfused-optimizer", "title": "t", "est_gain_ms": 2.0,
         "verified": {"gain_ms": 1.5, "gain_low_ms": 1.0, "gain_high_ms": 2.0, "reason": None}},
        {"id": "below-roofline", "title": "t", "est_gain_ms": 1.0, "verified": None},
        {"id": "below-roofline", "title": "t", "est_gain_ms": 1.0,
         "verified": {"gain_ms": 0.6, "gain_low_ms": 0.5, "gain_high_ms": 0.7, "reason": None}},
        {"id": "fp32-matmul-no-tf32", "title": "t", "est_gain_ms": 1.0, "verified": None}]}
    table = profile_models.advice("gpt2-unfixed", report, 6, tmp_path)
    optimizer, slow_op, verified_op, tf32 = table["findings"]
    assert tf32["fix"] == ["--precision", "tf32"] and tf32["fixed_step_ms"] > 0   # a second change, run too
    assert optimizer["fix"] == ["--optimizer", "fused"] and optimizer["fixed_step_ms"] > 0
    assert optimizer["measured_ms"] == pytest.approx((table["step_ms"] - optimizer["fixed_step_ms"]) * 5)
    assert optimizer["ratio"] == pytest.approx(optimizer["measured_ms"] / 2.0)   # the program's, over --verify's
    assert optimizer["verified_ms"] == 1.5 and slow_op["fix"] is None and "measured_ms" not in slow_op
    assert slow_op["ratio"] is None and verified_op["ratio"] == pytest.approx(0.6)   # --verify's, no program fix
    assert table["top3_measured"] == 2
    text = profile_models.advice_markdown([table])
    assert "| gpt2-unfixed (" in text and "--optimizer fused" in text


def test_decode_breakdown_groups_kernels_and_bounds_int8():
    """benchmarks/decode_breakdown.py's arithmetic (the measurement itself needs a GPU)."""
    import torch.nn as nn

    import decode_breakdown as breakdown
    from roofline import quantize_int8_weight_only

    assert [breakdown.group_of(k) for k in ("nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT", "int8_gemv_kernel",
                                            "cudnn_generated_fort_native_sdpa_sm80_flash_fprop",
                                            "void at::native::vectorized_layer_norm_kernel")] == [
        "matmul", "matmul", "attention", "other"]
    model = nn.Sequential(nn.Linear(64, 32, bias=False), nn.LayerNorm(32))
    assert breakdown.weight_bytes(model) == 64 * 32 * 4   # the Linear's fp32 weights; the norm's are no matmul's
    quantize_int8_weight_only(model)
    assert breakdown.weight_bytes(model) == 64 * 32 + 32 * 4   # int8 weights and an fp32 scale per channel
    bf16 = dict(ms=2.0)
    int8 = dict(ms=1.5, weight_bytes=10 ** 9, groups=dict(matmul=dict(ms=0.6)))
    limit = breakdown.bound(bf16, int8, 1.6)
    assert limit["most"] == pytest.approx(2.0 / 0.9)
    assert limit["matmul_ms_needed"] == pytest.approx(2.0 / 1.6 - 0.9)
    assert limit["matmul_gbs_needed"] == pytest.approx(1e9 / (2.0 / 1.6 - 0.9) / 1e6)
    assert breakdown.bound(bf16, int8, 3.0)["matmul_gbs_needed"] is None   # beyond the bound: not reachable


@pytest.mark.long
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_transformers_models_train_and_decode_through_their_own_cache(tmp_path):
    """transformers' Llama in the benchmark: the training step's loss computed by transformers, decoding
    through its DynamicCache cropped to the position (warm-up decodes one position again); every mode's logits
    against eager's."""
    # Llama only: Qwen2 goes through the same adapter (tests/test_transformers_models.py patches both)
    code = benchmark.main([str(tmp_path), "--tiny", "--models", "hf-llama", "--train", "eager", "patch-all",
                           "--generate", "eager", "patch-all", "--batches", "1", "--steps", "2", "--warmup", "1",
                           "--tokens", "3"])
    assert code == 0
    result = json.loads((tmp_path / "models.json").read_text())
    for name in ("hf-llama",):
        for kind in ("train", "generate"):
            assert all(r["numerics_ok"] for r in result[kind][name]), result[kind][name]
        served = {row["op"] for row in result["train"][name][1]["routes"] if row["served_by"] == "roofline"}
        assert {"rms_norm", "swiglu", "rope", "cross_entropy"} <= served


def test_transformers_static_cache_decodes_as_the_dynamic_one():
    """Under CUDA graphs transformers' models decode through a StaticCache (a replayed step of a DynamicCache writes
    into tensors freed since: wrong logits, then an illegal address on an H200). Written at the position given,
    warm-up's repeated position included, it gives the DynamicCache's logits."""
    import hf_models
    import transformers

    torch.manual_seed(0)
    model = hf_models.build("hf-llama", tiny=True).eval()
    tokens, positions = torch.randint(0, 96, (2, 12)), torch.arange(12)
    logits = {}
    for static in (False, True):
        model.setup_cache(2, 12, torch.float32, static=static)
        with torch.inference_mode():
            model(tokens[:, :6], positions[:6])
            for at in (6, 6, 6, 7, 8, 9, 10, 11):   # position 6 decoded three times, as warm-up does
                model.at = at
                logits.setdefault(static, []).append(model(tokens[:, at:at + 1], positions[at:at + 1])[:, -1])
    assert torch.allclose(torch.stack(logits[True]), torch.stack(logits[False]), atol=1e-5, rtol=1e-5)
    assert isinstance(model.cache, transformers.StaticCache)


def _fake_liger(monkeypatch, apply):
    import sys
    import types

    fake = types.ModuleType("liger_kernel.transformers.monkey_patch")
    fake._apply_liger_kernel_to_instance = apply
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", fake)


def test_liger_is_in_force_only_while_active(monkeypatch):
    """Liger-Kernel replaces names in transformers' modeling file and the model class's forward, for every model of
    the process; the benchmark binds them to Liger's only while the liger mode runs."""
    import hf_models
    from transformers.models.llama import modeling_llama

    before = (modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm,
              modeling_llama.LlamaForCausalLM.forward)

    def fake_apply(model):
        modeling_llama.apply_rotary_pos_emb = lambda *a: None
        modeling_llama.LlamaRMSNorm = object
        modeling_llama.LlamaForCausalLM.forward = lambda self, *a, **k: None
        modeling_llama.LlamaForCausalLM.ADDED_BY_LIGER = True
        modeling_llama.ADDED_BY_LIGER = True

    def theirs():
        assert (modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm,
                modeling_llama.LlamaForCausalLM.forward) == before
        assert not hasattr(modeling_llama, "ADDED_BY_LIGER")
        assert not hasattr(modeling_llama.LlamaForCausalLM, "ADDED_BY_LIGER")

    _fake_liger(monkeypatch, fake_apply)
    liger = hf_models.Liger(hf_models.build("hf-llama", tiny=True))
    theirs()
    for _ in range(2):   # in and out, as the liger mode's turns come and go
        with liger.active():
            assert modeling_llama.LlamaRMSNorm is object and modeling_llama.ADDED_BY_LIGER
            assert modeling_llama.LlamaForCausalLM.ADDED_BY_LIGER
        theirs()
    with pytest.raises(ValueError, match="liger mode serves transformers' models"):
        benchmark._liger(benchmark.build("llama", True, torch.device("cpu")), "liger")


def _counting_liger(monkeypatch):
    """A fake Liger-Kernel whose RMSNorm counts its calls (and computes what transformers' does); the count, and the
    order in which the modes took their turns, each with whether Liger's RMSNorm served it."""
    from transformers.models.llama import modeling_llama

    original = modeling_llama.LlamaRMSNorm.forward
    liger_calls = []

    def fake_apply(model):
        def forward(self, x):
            liger_calls.append(1)
            return original(self, x)
        modeling_llama.LlamaRMSNorm.forward = forward

    _fake_liger(monkeypatch, fake_apply)
    order = []
    for cls in (benchmark.Training, benchmark.Decoding):
        steps = cls.steps

        def steps_seen(self, n, steps=steps):
            calls = len(liger_calls)
            steps(self, n)
            order.append((self.mode, len(liger_calls) > calls))

        monkeypatch.setattr(cls, "steps", steps_seen)
    return original, order


TURN_ORDER = [("eager", False), ("liger", True), ("liger", True), ("eager", False)] * 3


def test_training_modes_take_turns_with_liger_in_force_in_its_own_only(monkeypatch):
    """The training modes step in turns, the order reversed every other turn; Liger-Kernel's replacements serve the
    liger mode's steps and none of eager's, and the rows are paired by turn."""
    import argparse

    from transformers.models.llama import modeling_llama

    original, order = _counting_liger(monkeypatch)
    args = argparse.Namespace(device=torch.device("cpu"), tiny=True, warmup=1, steps=6)
    rows = benchmark.train("hf-llama", ["eager", "liger"], args)
    assert modeling_llama.LlamaRMSNorm.forward is original
    assert order == TURN_ORDER
    benchmark._check_losses(rows)
    benchmark._speedups(rows, "eager", "vs_eager")
    eager, liger = rows
    assert eager["turns"] == liger["turns"] == [1] * 6 and len(liger["samples_ms"]) == 6
    assert liger["numerics_ok"] and liger["loss_error"] == 0.0   # the same math, through the fake's forward
    assert liger["vs_eager"]["paired"]


def test_decoding_with_liger_in_turns(monkeypatch):
    """Generation's liger mode decodes through Liger-Kernel's replacements in its own turns (and its warm-up, which
    runs a second pass through a DynamicCache) and eager through transformers' own; the logits agree."""
    import argparse

    from transformers.models.llama import modeling_llama

    original, order = _counting_liger(monkeypatch)
    args = argparse.Namespace(device=torch.device("cpu"), tiny=True, warmup=1, tokens=6)
    rows = benchmark.generate("hf-llama", ["eager", "liger"], 1, args)
    assert modeling_llama.LlamaRMSNorm.forward is original
    # each mode's warm-up second pass through its cache first, then the turns
    assert order == [("eager", False), ("liger", True)] + TURN_ORDER
    benchmark._check_logits(rows)
    eager, liger = rows
    assert liger["numerics_ok"] and liger["logits_error"] == 0.0 and liger["turns"] == [1] * 6


def test_compile_modes_of_generation_need_a_gpu():
    assert benchmark.needs_gpu([], ["compile+patch", "liger"]) == ["compile+patch"]
