"""The example models (examples/models) and the whole-model benchmark (benchmarks/models.py) at tiny sizes."""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
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


@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_models_benchmark_runs_every_cpu_mode_and_checks_numerics(tmp_path):
    code = benchmark.main([str(tmp_path), "--tiny", "--train", "eager", "patch-all", "compile+patch",
                           "--generate", "eager", "patch-all", "int8", "--batches", "2", "--steps", "2", "--warmup", "2",
                           "--tokens", "3"])
    assert code == 0
    result = json.loads((tmp_path / "models.json").read_text())
    expected = {"train": ["eager", "patch-all", "compile+patch", "eager-again"],
                "generate": ["eager", "patch-all", "int8"]}
    for kind, modes in expected.items():
        for name in ("gpt2", "llama"):
            rows = result[kind][name]
            assert [r["mode"] for r in rows] == modes
            assert all(r["numerics_ok"] and r["median_ms"] > 0 and len(r["samples_ms"]) >= 2 for r in rows)
    llama = {r["mode"]: r for r in result["train"]["llama"]}
    served = {row["op"]: row["served_by"] for row in llama["patch-all"]["routes"]}
    assert served == {"rms_norm": "roofline", "swiglu": "roofline", "rope": "roofline", "attention": "torch",
                      "cross_entropy": "roofline"}   # the loss, computed in the model's forward
    assert llama["eager"]["losses"][0] > 0 and llama["eager"]["routes"] is None
    assert "| patch-all |" in (tmp_path / "models.md").read_text()


def test_models_benchmark_knows_the_modes_that_need_a_gpu():
    assert benchmark.needs_gpu(["eager", "graphs+patch", "compile"], ["int8+graphs", "compile", "patch"]) == \
        ["compile", "graphs+patch", "int8+graphs"]


def test_profiling_a_model_s_training_times_the_steps_outside_the_window(tmp_path):
    import profile_models   # benchmarks/profile_models.py

    profile_models.main([str(tmp_path), "--models", "llama", "--steps", "11"])
    (row,) = json.loads((tmp_path / "profile_models.json").read_text())
    # 11 steps, 3 skipped (the third the profiler's warm-up), 5 recorded: steps 1, 9 and 10 (0-based) are timed
    # (0 is the program's own warm-up, 8 the profiler stopping)
    assert row["steps_timed"] == 3 and row["steps_recorded"] == 5
    assert row["step_ms"] > 0 and row["inflation"] > 1.0 and row["profiled_step_ms"] > row["step_ms"]
    assert "| llama |" in (tmp_path / "profile_models.md").read_text()
