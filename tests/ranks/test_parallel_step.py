"""benchmarks/parallel_step.py's arithmetic: how a variant is read, what its scaling is held against, the slowest
rank's step, and the cores a pinned rank keeps to; and the Python reducer's step on two gloo ranks. (Its timed runs
need GPUs: scripts/gpu-check's parallel section.)"""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import parallel_step  # noqa: E402  (benchmarks/parallel_step.py)

from roofline.distributed import spawn  # noqa: E402

from .workers import compiled_ddp_gradients  # noqa: E402


def test_a_variant_is_its_strategy_and_options_and_a_wrong_one_is_named():
    assert parallel_step.parse("ddp+nobcast+view+bucket100") == ("ddp", {"nobcast": True, "view": True,
                                                                          "bucket": 100})
    assert parallel_step.parse("fsdp2+units3+keep") == ("fsdp2", {"units": 3, "keep": True})
    assert parallel_step.parse("single") == ("single", {})
    assert parallel_step.parse("ddp+view+ctas8+hiprio") == ("ddp", {"view": True, "ctas": 8, "hiprio": True})
    assert parallel_step.parse("fsdp2+root+bf16reduce") == ("fsdp2", {"root": True, "bf16reduce": True})
    for wrong, said in [("zero3", "the strategy must be one of"), ("ddp+units2", "'units2' is not an option of ddp"),
                        ("fsdp2+units", "take a positive number"), ("ddp+view2", "'view2' is not an option"),
                        ("ddp+ctas0", "'ctas0' is not an option"), ("single+hiprio", "'hiprio' is not an option"),
                        ("ddp+onegraph+overlap", "overlap reorders the Python reducer's collectives")]:
        with pytest.raises(ValueError, match=said):
            parallel_step.parse(wrong)


def test_each_variant_is_held_against_one_gpu_doing_what_it_does_on_one_gpu():
    variants = ["single", "single+compile", "single+blocks", "single+patch+lce", "ddp", "ddp+view+compile",
                "ddp+onegraph", "ddp+view+blocks",
                "ddp+lce+patch+view", "fsdp2+units2+keep+pin", "ddp+compile+pin", "ddp+compile+patch"]
    against = {v: parallel_step.reference(v, variants) for v in variants}
    assert against == {"single": None, "single+compile": None, "single+blocks": None, "single+patch+lce": None,
                       "ddp": "single", "ddp+view+compile": "single+compile", "ddp+onegraph": "single+compile",
                       "ddp+view+blocks": "single+blocks",
                       # the same options in another order; and no single+pin here: plain single
                       "ddp+lce+patch+view": "single+patch+lce", "fsdp2+units2+keep+pin": "single",
                       # no exact match: the one that compiles as it does, then does most of what it does
                       "ddp+compile+pin": "single+compile", "ddp+compile+patch": "single+compile"}


def test_a_step_is_its_slowest_rank_s_and_scaling_is_paired_round_by_round():
    def rank(single, ddp):
        return {"times": {"single": single, "ddp": ddp}, "warmup_s": {"single": 1.0, "ddp": 2.0},
                "syncs": {"single": [], "ddp": ["x.py:3"]}}

    rounds = 6
    ranks = [rank([[10.0, 12.0]] * rounds, [[20.0, 11.0]] * rounds), rank([[11.0, 10.0]] * rounds,
                                                                            [[15.0, 25.0]] * rounds)]
    out = parallel_step.summarize(ranks, ["single", "ddp"])
    assert out["single"]["rounds_ms"] == [[11.0, 12.0]] * rounds and "scaling" not in out["single"]
    assert out["ddp"]["rounds_ms"] == [[20.0, 25.0]] * rounds and out["ddp"]["reference"] == "single"
    assert out["ddp"]["scaling"] == pytest.approx(11.5 / 22.5)
    assert out["ddp"]["scaling_low"] == out["ddp"]["scaling_high"] == pytest.approx(11.5 / 22.5)
    assert out["ddp"]["warmup_s"] == 2.0 and out["ddp"]["syncs"] == ["x.py:3"]
    assert "| gpt2 | ddp | 22.50 (20.00-25.00) | 0.511 (0.511-0.511) | single | 2.0 | 1 |" in \
        parallel_step.table([{"model": "gpt2", "variants": out}])


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="CPU affinity is Linux's")
def test_pinned_ranks_keep_to_disjoint_whole_cores_and_get_them_back():
    allowed = os.sched_getaffinity(0)
    mine = [parallel_step.own_cores(rank, 2) for rank in range(2)]
    assert all(m and m <= allowed for m in mine)
    if len(parallel_step.physical_cores(allowed)) >= 2:   # two hyperthreads of one core are one core: nothing to split
        assert not mine[0] & mine[1]
    with parallel_step.pinned(mine[0]):
        assert os.sched_getaffinity(0) == mine[0]
    assert os.sched_getaffinity(0) == allowed


def test_each_compiled_variant_gets_classes_of_its_own_so_that_dynamo_compiles_it_anew():
    """Dynamo's guards check a module's class: a second model of the same classes would run the first one's
    compiled graph (as every compiled DDP variant of the first H100 calls did)."""
    sys.path.insert(0, str(ROOT))
    from torch import nn

    from examples.models.gpt2 import GPT2, GPT2Config

    def tiny():
        return GPT2(GPT2Config(vocab_size=96, max_seq=64, n_layer=2, n_head=2, d_model=32))

    a, b, again = tiny(), tiny(), tiny()
    for model, variant in ((a, "ddp+compile"), (b, "ddp+onegraph"), (again, "ddp+compile")):
        parallel_step.own_classes(model, variant)
    for x, y, z in zip(a.modules(), b.modules(), again.modules()):
        if type(x).__module__.startswith("torch."):   # torch's own modules are left as they are
            assert type(x) is type(y) is type(z) and isinstance(x, nn.Module)
        else:
            assert type(x) is not type(y) and type(x) is type(z) and type(x).__mro__[1] is type(y).__mro__[1]
    assert isinstance(a, GPT2) and type(a).__name__ == "GPT2" and "[ddp+compile]" in type(a).__qualname__


@pytest.mark.long   # processes of their own: run first (conftest)
def test_the_python_reducer_s_step_reduces_every_gradient_in_a_backward_that_compiled_autograd_captured():
    """DDP's Python reducer all-reduces inside the backward graph: on two gloo ranks, each rank's gradients are the
    mean of the ranks' own (a reducer that never ran would leave this rank's), and the backward was compiled."""
    for rank in spawn(compiled_ddp_gradients, 2, "ddp+pyreducer+view"):
        assert rank["error"] < 1e-6 and rank["captured"] >= 1 and not rank["reorder"]


@pytest.mark.long   # processes of their own: run first (conftest)
def test_inductor_s_passes_over_the_python_reducer_s_all_reduces_leave_every_gradient_reduced():
    """Compiled by Inductor itself, on two gloo ranks: DDP's Python reducer has Inductor bucket the backward's
    all-reduces, and +overlap has it reorder them among its kernels; each rank's gradients are still the ranks'
    mean."""
    for rank in spawn(compiled_ddp_gradients, 2, "ddp+pyreducer+view+overlap", "inductor"):
        assert rank["error"] < 1e-6 and rank["captured"] >= 1 and rank["buckets"] >= 1 and rank["reorder"]


@pytest.mark.long   # processes of their own: run first (conftest)
def test_blocks_compiled_alone_under_ddp_have_every_gradient_reduced_and_each_block_one_graph():
    """+blocks: each block compiled on its own inside DDP's forward: the gradients are the ranks' mean (DDP's hooks
    saw the compiled blocks' gradients), and the model's blocks (one code, one class) share one graph, not one a
    block."""
    for rank in spawn(compiled_ddp_gradients, 2, "ddp+view+blocks"):
        assert rank["error"] < 1e-6 and rank["captured"] == 0 and rank["graphs"] == 1


def test_nccl_s_settings_are_refused_before_any_rank_starts_where_the_ranks_talk_over_gloo(monkeypatch, capsys,
                                                                                         tmp_path):
    monkeypatch.setattr(parallel_step.torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(parallel_step.sys, "argv", ["parallel_step.py", str(tmp_path / "out"), "gpt2:single,ddp+ctas8"])
    with pytest.raises(SystemExit) as refused:
        parallel_step.main()
    assert refused.value.code == 2
    assert "'ddp+ctas8': ctas set NCCL's communicator" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())   # nothing measured, nothing written


def test_the_python_reducer_is_refused_beside_another_ddp_variant(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(parallel_step.sys, "argv", ["parallel_step.py", str(tmp_path / "out"),
                                                    "gpt2:single,ddp+pyreducer,ddp+view+onegraph"])
    with pytest.raises(SystemExit) as refused:
        parallel_step.main()
    assert refused.value.code == 2
    assert "+pyreducer sets torch's settings for its whole launch, and DDP reads them: ddp+view+onegraph would " \
           "run with its Python reducer" in " ".join(capsys.readouterr().err.split())
    assert parallel_step.parse("ddp+pyreducer+view") == ("ddp", {"pyreducer": True, "view": True})


def test_the_time_ranks_add_is_each_round_s_median_step_less_the_same_round_s_alone():
    """benchmarks/distributed.py's profile part holds the exposed-communication estimate against this."""
    import distributed   # benchmarks/, on the path above

    # six rounds of three steps: the rounds drift together, and DDP adds 2-7 ms to its own round
    single = [[10.0 + r, 10.0 + r, 30.0] for r in range(6)]
    ddp = [[12.0 + r + r, 40.0, 12.0 + r + r] for r in range(6)]
    turns = {"single": {"rounds_ms": single}, "ddp": {"rounds_ms": ddp}}
    low, median, high = distributed.added_ms(turns, "ddp")
    assert (low, high) == (2.0, 7.0)   # six rounds: the sign test's 95% interval is their whole range
    assert median == pytest.approx(4.5)
    # against DDP with no gradient reduced, 1 ms a round over the step alone: what the reduction alone adds
    turns[distributed.NO_REDUCTION] = {"rounds_ms": [[11.0 + r, 11.0 + r, 31.0] for r in range(6)]}
    assert distributed.added_ms(turns, "ddp", over=distributed.NO_REDUCTION) == (1.0, pytest.approx(3.5), 6.0)
