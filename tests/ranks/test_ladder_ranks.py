"""The ladder on several ranks: real gloo process groups of two, DDP and FSDP2 on a small task; each rung's loss
held against the one-GPU run's, the slowest rank's steps, and a rank that fails stopping the others."""

import json

import pytest

from roofline.distributed import ladder as ranks_ladder
from roofline.ladder_results import LadderResult, RungResult

from . import workers
from .workers import tiny_task

pytestmark = pytest.mark.long   # processes of their own: run first (conftest)

TARGET = "tests/ranks/workers.py:tiny_task"
RUNGS = ("fp32 baseline", "bf16 autocast", "fused optimizer")   # what runs on CPUs in seconds


def _skip_all_but(rungs):
    from roofline.ladder import ladder_rungs

    return tuple(r.name for r in ladder_rungs(tiny_task()) if r.name not in rungs)


def test_ddp_and_fsdp2_train_as_one_gpu_does_and_are_timed_by_their_slowest_rank(tmp_path):
    """Through the command, as a user climbs: its table at 80 columns, and its JSON read back."""
    from typer.testing import CliRunner

    from roofline.cli import app

    out = tmp_path / "ladder.json"
    skips = [a for name in _skip_all_but(RUNGS) for a in ("--skip", name)]
    run = CliRunner().invoke(app, ["ladder", "--nproc-per-node", "2", TARGET, *skips, "--json", str(out)],
                             env={"COLUMNS": "80"})
    assert run.exit_code == 0, run.output
    assert "ladder: tiny, ddp on 2 x cpu" in run.output and "scaling" in run.output
    assert max(len(line) for line in run.output.splitlines()) <= 80
    result = json.loads(out.read_text())
    assert [ladder["parallel"] for ladder in result["ladders"]] == ["ddp", "fsdp2"]
    assert result["tokens"] == 4 * 16 and result["flops"] > 0 and result["reference"]["ranks"] == 1
    alone = {r["rung"]: RungResult(**r) for r in result["reference"]["rungs"]}
    # each strategy's own rungs (FSDP2's layers in fewer units, then one, then its gradients reduced in bf16; DDP's
    # gradients as bucket views) are the rung before them on one GPU: held against that
    own = {"fsdp2": [ranks_ladder.FEWER_UNITS, ranks_ladder.ONE_UNIT, ranks_ladder.BF16_REDUCE],
           "ddp": [ranks_ladder.BUCKET_VIEWS]}
    for name in own["fsdp2"] + own["ddp"]:
        alone[name] = alone[RUNGS[-1]]
        assert name not in {r["rung"] for r in result["reference"]["rungs"]}
    for each in result["ladders"]:
        assert each["ranks"] == 2
        rungs = [RungResult(**r) for r in each["rungs"]]
        timed = [r for r in rungs if r.median_ms is not None]
        assert [r.rung for r in timed] == [*RUNGS, *own[each["parallel"]]]
        if each["parallel"] == "ddp":   # its one-graph rung needs the torch.compile rung, left out here
            assert timed[-1].config["bucket_view"] and not timed[-2].config["bucket_view"]
            one = next(r for r in rungs if r.rung == ranks_ladder.ONE_GRAPH)
            assert (one.status, one.reason) == ("skipped", "nothing compiled: the torch.compile rung did not run")
        else:
            assert [(r.config["fsdp2_groups"], r.config["reduce_bf16"]) for r in timed[-3:]] == \
                [(ranks_ladder.FSDP2_GROUPS, False), (1, False), (1, True)]
        for r in timed:
            # every rank trains on the same batch, so the reduced gradients are one GPU's: the same loss
            assert r.status == "ok", (each["parallel"], r.rung, r.loss_error)
            assert r.loss_step == alone[r.rung].loss_step == 2   # the task's check_steps
            assert r.loss == pytest.approx(alone[r.rung].loss, rel=r.tolerance)
            assert r.scaling == pytest.approx(alone[r.rung].median_ms / r.median_ms)
            assert r.tokens_per_s == pytest.approx(64 / (r.median_ms / 1e3))
            assert r.mfu is None   # no datasheet peak for a CPU
            assert len(r.samples_ms) == 6 and r.low_ms <= r.median_ms <= r.high_ms
        assert timed[0].vs_baseline == 1.0 and timed[1].vs_previous == pytest.approx(
            timed[0].median_ms / timed[1].median_ms)
        assert {r.rung: r.status for r in rungs}["CUDA graphs"] == "skipped"
    wrong = CliRunner().invoke(app, ["ladder", "--parallel", "ddp", TARGET])
    assert wrong.exit_code != 0 and "only with --nproc-per-node" in wrong.output


def test_several_ranks_refuse_the_rungs_that_would_capture_their_collectives():
    from roofline.ladder import TRAINING_RUNGS, Config

    refused = {r.name: r.refused(Config(parallel="fsdp2")) for r in TRAINING_RUNGS}
    assert refused["CUDA graphs"].startswith("not climbed on several ranks: a captured step would hold")
    assert refused["compile max-autotune"].startswith("not climbed on several ranks: its CUDA graphs")
    assert [name for name, why in refused.items() if why] == ["compile max-autotune", "CUDA graphs"]
    assert TRAINING_RUNGS[-1].refused(Config()) is None   # on one GPU, CUDA graphs climb
    bf16_reduce = next(r for r in ranks_ladder._own_rungs("fsdp2") if r.name == ranks_ladder.BF16_REDUCE)
    assert bf16_reduce.refused(Config(parallel="fsdp2")) == "not under bf16: the bf16 autocast rung did not run"
    assert bf16_reduce.refused(Config(parallel="fsdp2", precision="bf16")) is None


def test_the_slowest_rank_sets_each_step():
    def rung(samples, peak):
        return RungResult("r", "c", {}, "ok", median_ms=sorted(samples)[len(samples) // 2], samples_ms=samples,
                          peak_gib=peak, warmup_s=1.0, tolerance=1e-3, losses=[1.0])

    rank0 = LadderResult("t", "cuda:0", [rung([1.0, 5.0, 1.0, 1.0, 1.0, 1.0], peak=2.0), rung([2.0] * 6, 1.0)])
    rank1 = LadderResult("t", "cuda:1", [rung([3.0, 1.0, 3.0, 3.0, 3.0, 3.0], peak=3.0), rung([1.0] * 6, 1.0)])
    combined = ranks_ladder.combine([rank0, rank1], "ddp")
    first, second = combined.rungs
    assert first.samples_ms == [3.0, 5.0, 3.0, 3.0, 3.0, 3.0] and first.median_ms == 3.0 and first.peak_gib == 3.0
    assert second.median_ms == 2.0 and second.vs_previous == 1.5 and second.vs_baseline == 1.5
    assert combined.ranks == 2 and combined.parallel == "ddp" and combined.device == "2 x cuda:0"


def test_a_rank_whose_rung_fails_stops_the_others_and_is_named_and_the_next_strategy_climbs():
    result = ranks_ladder.run("tests/ranks/workers.py:failing_task", 2, ("ddp", "fsdp2"),
                              skip=_skip_all_but(RUNGS[:2]), progress=False)
    assert list(result.failures) == ["ddp", "fsdp2"]   # rank 1 fails under each, and each is stopped
    assert "rank 1: RuntimeError: rung 'bf16 autocast' failed: ValueError: rank 1 ran out of luck (the first " \
           "error)" in result.failures["ddp"]
    alone = {r.rung: r.status for r in result.reference.rungs}
    assert result.ladders == [] and alone["bf16 autocast"] == "ok"   # alone, the step never fails: it is rank 0


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="nproc must be an int of at least 2"):
        ranks_ladder.run(TARGET, 1)
    with pytest.raises(ValueError, match="strategies must be some of ddp, fsdp2"):
        ranks_ladder.run(TARGET, 2, ("zero3",))


def test_fsdp2_s_rungs_shard_the_layers_in_four_units_and_the_root_then_the_model_as_one():
    from roofline.distributed.launch import spawn

    units, one_a_layer, one = spawn(workers.fsdp2_units, 2, [(10, ranks_ladder.FSDP2_GROUPS), (3, None),
                                                              (3, 1)])[0]
    # the model itself (no parameters of its own), then its 10 layers in 4 groups as even as they divide, each
    # kept gathered after its forward
    assert units == [([""], None, 0), (["0.0", "0.1", "0.2"], False, 6), (["0.3", "0.4", "0.5"], False, 6),
                     (["0.6", "0.7"], False, 4), (["0.8", "0.9"], False, 4)]
    # without groups, a unit a layer, resharded after its forward
    assert one_a_layer == [([""], None, 0), (["0.0"], True, 2), (["0.1"], True, 2), (["0.2"], True, 2)]
    # one unit: the model's fully_shard holds every layer's parameters (FSDP2 keeps a root's gathered from its
    # forward to its backward, whatever it is set to: at its first forward)
    assert one == [([""], True, 6)]
    assert spawn(workers.fsdp2_reduce_dtypes, 2, [True, False])[0] == ["torch.bfloat16", "torch.float32"]
    from roofline.distributed.wrapping import grouped

    assert grouped(list(range(6)), 4) == [[0, 1], [2, 3], [4], [5]] and grouped([0, 1], 4) == [[0], [1]]
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="groups must be a positive int"):
            grouped([0], bad)


def test_the_one_graph_rung_climbs_one_graph_and_puts_dynamo_s_setting_back():
    """Through the ladder's own rung code: compiled under DDP, the step is split at the buckets; with the rung's
    setting it is one graph; either way Dynamo's setting is as it was after the rung (True, its default)."""
    from roofline.distributed import spawn

    for split, one in spawn(workers.compiled_rungs_under_ddp, 2):
        assert split[0] > 1 and one[0] == 1   # a graph a bucket, and one
        assert split[1:] == one[1:] == (True, "ok")
