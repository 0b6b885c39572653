"""roofline.ladder on the CPU: the example GPT-2 task climbed (the CUDA rungs skipped, with the reason), each rung's
loss held against the baseline's, a rung that breaks numerics or fails marked, and the CLI."""

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from roofline import ladder
from roofline.cli import app

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from examples.ladder_tasks import gpt2  # noqa: E402

# Inductor's compiling, and patch's measurements of its routes (the interpreter's kernels on a CPU), cost minutes
# here: tests/test_patch.py and tests/test_models.py cover them on the CPU, the GPU ladder runs them
QUICK = ("roofline.patch", "torch.compile")


def test_the_ladder_climbs_every_rung_this_machine_can_run():
    result = ladder.run(replace(gpt2(), skip=QUICK), device="cpu")
    by_name = {r.rung: r for r in result.rungs}
    names = [r.name for r in ladder.TRAINING_RUNGS]
    at = names.index("roofline.patch")   # the task's own SDPA rung goes before patch
    assert [r.rung for r in result.rungs] == [*names[:at], "SDPA", *names[at:]]
    for name in ("TF32", "compile max-autotune", "CUDA graphs"):
        assert (by_name[name].status, by_name[name].reason) == ("skipped", "needs a CUDA device")
    for name in QUICK:
        assert (by_name[name].status, by_name[name].reason) == ("skipped", "left out by the task")
    timed = [r for r in result.rungs if r.median_ms is not None]
    assert [r.rung for r in timed] == ["fp32 baseline", "bf16 autocast", "fused optimizer", "SDPA",
                                       "fused linear + cross-entropy"]
    assert by_name["fused linear + cross-entropy"].config["changes"] == ("SDPA",)
    for r in timed:
        assert r.status == "ok" and len(r.samples_ms) == 6 and r.low_ms <= r.median_ms <= r.high_ms
        assert r.loss_error <= r.tolerance and r.vs_baseline == pytest.approx(timed[0].median_ms / r.median_ms)
    # cumulative: the optimizer's rung runs in bf16 too
    assert by_name["fused optimizer"].config == {"precision": "bf16", "fused_optimizer": True, "patch": False,
                                                 "fused_head_loss": False, "compile": None, "graphs": False,
                                                 "changes": (), "parallel": None,
                                                 "fsdp2_groups": None, "reduce_bf16": False, "bucket_view": False,
                                                 "one_graph": False}
    assert by_name["fused linear + cross-entropy"].config["fused_head_loss"]
    assert by_name["fused optimizer"].vs_previous == pytest.approx(
        by_name["bf16 autocast"].median_ms / by_name["fused optimizer"].median_ms)


def test_a_rung_off_the_baseline_s_loss_is_marked_and_a_failing_rung_reported(monkeypatch):
    monkeypatch.setitem(ladder.LOSS_TOLERANCE, "bf16", 0.0)
    broken = ladder.Rung("no such compile mode", "torch.compile(model, mode='fastest')",
                         lambda c: replace(c, compile="fastest"))
    rungs = (ladder.TRAINING_RUNGS[0], ladder.TRAINING_RUNGS[2], broken)
    result = ladder.run(gpt2(), device="cpu", rungs=rungs)
    base, bf16, failed = result.rungs
    assert base.status == "ok" and bf16.status == "numerics" and bf16.loss_error > 0
    assert failed.status == "failed" and "fastest" in failed.reason and failed.median_ms is None
    assert "numerics" in ladder.markdown(result) and "failed" in ladder.markdown(result)


def test_a_task_s_own_rung_changes_the_model_of_its_rung_and_those_after():
    built = []

    def count(model):
        built.append(model)

    late = ladder.task_rung("counted", "(nothing)", count)
    task = replace(gpt2(), rungs=(*gpt2().rungs, late))
    assert [r.name for r in ladder.ladder_rungs(task)][-1] == "counted"   # no `before`: after the built-in ones
    result = ladder.run(task, device="cpu", rungs=[ladder.TRAINING_RUNGS[0], *task.rungs])
    base, sdpa, counted = result.rungs
    assert sdpa.status == counted.status == "ok" and sdpa.loss_error <= sdpa.tolerance
    assert sdpa.config["changes"] == ("SDPA",) and counted.config["changes"] == ("SDPA", "counted")
    assert len(built) == 1 and not any(getattr(m, "by_hand", False) for m in built[0].modules())
    with pytest.raises(ValueError, match="no built-in rung named 'TF64'"):
        ladder.ladder_rungs(replace(gpt2(), rungs=(ladder.task_rung("x", "", count, before="TF64"),)))


def test_cuda_graphs_are_not_captured_over_max_autotune_s_own():
    graphs = next(r for r in ladder.TRAINING_RUNGS if r.name == "CUDA graphs")
    assert "replays CUDA graphs itself" in graphs.refused(ladder.Config(compile="max-autotune"))
    assert graphs.refused(ladder.Config(compile="default")) is None


def test_the_fused_head_is_skipped_where_the_task_says_not_how_to_switch_to_it():
    result = ladder.run(replace(gpt2(), fuse_head_loss=None), device="cpu",
                        rungs=[r for r in ladder.TRAINING_RUNGS if r.name in ("fp32 baseline",
                                                                               "fused linear + cross-entropy")])
    assert (result.rungs[1].status, result.rungs[1].reason) == ("skipped", "the task gives no fuse_head_loss")


def test_the_waterfall_plots_a_result_read_back_from_its_json(tmp_path):
    rungs = [ladder.RungResult(name, "", {}, status, median_ms=ms, low_ms=ms, high_ms=ms)
             for name, status, ms in (("fp32 baseline", "ok", 200.0), ("TF32", "ok", 90.0),
                                      ("slower", "numerics", 95.0), ("CUDA graphs", "skipped", None))]
    ladder.LadderResult("t", "cpu", rungs).write_json(tmp_path / "r.json")
    back = ladder.LadderResult.read_json(tmp_path / "r.json")
    assert [r.median_ms for r in back.rungs] == [200.0, 90.0, 95.0, None]
    ladder.waterfall(back, tmp_path / "w.png")
    assert (tmp_path / "w.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="no rung was timed"):
        ladder.waterfall(ladder.LadderResult("t", "cpu", rungs[3:]), tmp_path / "none.png")


@pytest.mark.parametrize("field, value, message", [("steps", 3, "at least 6"), ("warmup", 0, "positive int"),
                                                   ("check_steps", 99, "must not exceed")])
def test_a_task_s_bad_settings_are_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        replace(gpt2(), **{field: value})


def test_cli_climbs_the_ladder_and_writes_every_report(tmp_path):
    runner = CliRunner()
    # Without patch and the compile rungs (QUICK, above). With patch this test took 8 minutes on a 2-core CPU,
    # its router timing Triton's interpreter at the task's shapes; max-autotune's autotuning took 6 more.
    skip = [arg for name in ("roofline.patch", "torch.compile", "compile max-autotune") for arg in ("--skip", name)]
    out = runner.invoke(app, ["ladder", "examples/ladder_tasks.py:gpt2", "--device", "cpu", *skip, "--json",
                              str(tmp_path / "l.json"), "--markdown", str(tmp_path / "l.md"), "--plot",
                              str(tmp_path / "l.png")])
    assert out.exit_code == 0, out.output
    rungs = {r["rung"]: r for r in json.loads((tmp_path / "l.json").read_text())["rungs"]}
    assert rungs["fused linear + cross-entropy"]["status"] == "ok" and rungs["fused linear + cross-entropy"][
        "config"] == {"precision": "bf16", "fused_optimizer": True, "patch": False, "fused_head_loss": True,
                      "compile": None, "graphs": False, "changes": ["SDPA"], "parallel": None, "fsdp2_groups": None,
                      "reduce_bf16": False, "bucket_view": False, "one_graph": False}
    assert [rungs[name]["reason"] for name in ("roofline.patch", "torch.compile", "compile max-autotune")] == [
        "left out by the task"] * 3
    assert "| fused linear + cross-entropy |" in (tmp_path / "l.md").read_text()
    assert "each rung's change" in out.output
    assert (tmp_path / "l.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_refuses_what_is_not_a_task_and_rungs_it_does_not_know():
    unknown = CliRunner().invoke(app, ["ladder", "examples/ladder_tasks.py:gpt2", "--skip", "TF64"])
    assert unknown.exit_code == 2 and "no rung named 'TF64'" in unknown.output
    bad = CliRunner().invoke(app, ["ladder", "examples/ladder_tasks.py:TINY"])
    assert bad.exit_code == 2 and "TrainTask" in bad.output


def test_a_cuda_graph_s_loss_is_checked_at_the_first_step_it_was_seen():
    """A graph's first steps run inside its capture (no loss read): its loss is held against the baseline's at
    the first step after check_steps that both saw."""
    def rung(name, losses, ms):
        return ladder.RungResult(name, "", {}, "ok", tolerance=1e-3, median_ms=ms, losses=losses)

    base = rung("fp32 baseline", [5.0, 4.0, 3.0, 2.0, 1.0], 10.0)
    graphs = rung("CUDA graphs", [None, None, None, 2.0005, 1.0], 5.0)
    broken = rung("broken", [None, None, None, None, 9.0], 5.0)
    unseen = rung("unseen", [None] * 5, 5.0)
    ladder.compare([base, graphs, broken, unseen], check_steps=3)
    assert (graphs.loss_step, graphs.loss, graphs.status) == (4, 2.0005, "ok")
    assert graphs.loss_error == pytest.approx(0.0005 / 2.0) and graphs.vs_baseline == 2.0
    assert (broken.loss_step, broken.status) == (5, "numerics")
    assert unseen.loss is None and unseen.status == "ok" and "not checked" in unseen.reason


def test_gradients_are_reduced_in_bf16_only_under_bf16():
    import torch
    from torch import nn

    from roofline.distributed.wrapping import wrap

    for strategy, bf16 in (("fsdp2", False), ("ddp", True)):   # refused before any process group is needed
        with pytest.raises(ValueError, match="reduce_bf16: FSDP2's gradients are reduced in bf16 under bf16 only"):
            wrap(nn.Sequential(nn.ModuleList([nn.Linear(2, 2)])), strategy, torch.device("cpu"), bf16=bf16,
                 compile_mode=None, reduce_bf16=True)
