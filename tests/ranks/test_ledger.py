"""The collectives of the steps outside the recorded window, from torch.distributed's flight recorder
(distributed.ledger): read on gloo ranks, and matched across ranks from figures as NCCL's timing gives them."""

import pytest

from roofline.distributed import ledger, spawn

from .workers import steps_with_a_late_rank


def test_the_flight_recorder_gives_each_step_its_calls_on_gloo():
    per_rank = spawn(steps_with_a_late_rank, 2, 1, 0.01)
    for calls in per_rank:
        # the call before the first step is in no step; each step holds its all_reduce and its all_gather
        assert [c["step"] for c in calls] == [0, 0, 1, 1, 2, 2, 3, 3]
        assert [c["kind"] for c in calls] == ["all_reduce", "all_gather"] * 4
        # nccl-tests' message: the all_reduce's buffer, the all_gather's whole output (2000 float32)
        assert [c["bytes"] for c in calls[:2]] == [4000, 8000]
        assert [c["seq"] for c in calls] == list(range(2, 10)) and not any(c["p2p"] for c in calls)
        assert all(c["ms"] is None for c in calls)   # gloo's calls are not timed on a GPU
    # untimed calls match nothing: the recorded window's figures stand
    assert ledger.match(per_rank) is None


@pytest.mark.parametrize("name, kind", [
    ("nccl:all_reduce", "all_reduce"), ("nccl:_all_gather_base", "all_gather"),
    ("nccl:all_gather_into_tensor_coalesced", "all_gather"), ("nccl:_reduce_scatter_base", "reduce_scatter"),
    ("nccl:reduce_scatter_tensor_coalesced", "reduce_scatter"), ("nccl:all_to_all", "all_to_all"),
    ("nccl:broadcast", "broadcast"), ("nccl:reduce", "reduce"), ("nccl:send 0->1", "send_recv"),
    ("nccl:recv 1<-0", "send_recv"), ("gloo:barrier", "barrier"), ("nccl:something_new", None)])
def test_the_recorder_s_call_names(name, kind):
    assert ledger.kind_of(name) == kind


def _calls(ms_per_step, kind="all_reduce", nbytes=1 << 20):
    """One rank's calls: a step each list of call times (ms), sequence numbers counting on, issued in order."""
    out, seq = [], 0
    for step, times in enumerate(ms_per_step):
        for ms in times:
            seq += 1
            out.append({"step": step, "group": "0", "p2p": False, "seq": seq, "created_ns": seq * 1000, "kind": kind,
                        "bytes": nbytes, "ms": ms})
    return out


def test_a_late_rank_is_the_one_whose_calls_are_shortest():
    # at each step's first call rank 1 arrives 20 ms after rank 0 and 19.5 ms after rank 2 (whose calls wait that
    # long), and the ranks are even after it; the transfer takes 1 ms
    late = ledger.match([_calls([[21.0, 1.0]] * 3), _calls([[1.0, 1.0]] * 3), _calls([[20.5, 1.2]] * 3)])
    assert late.steps == 3 and late.calls == 6 and late.straggler == 1
    # what a step loses to it: its largest lead over the next latest (rank 2)
    assert late.held_ms == pytest.approx([0.0, 19.5, 0.0])
    assert late.waits_ms == pytest.approx([20.0, 0.0, 19.5])   # each rank's largest wait in a step
    assert late.comm_ms == pytest.approx([22.0, 2.0, 21.7])    # every call's time, waits included
    assert late.transfers[("all_reduce", 1 << 20)] == pytest.approx([1.0] * 6)


def test_a_rank_late_at_every_call_costs_a_step_its_lag_once():
    # rank 1 is 2 ms behind at each of 14 calls: the others' NCCL kernels wait 28 ms a step, hidden under their
    # compute but for one lag's 2 ms
    lag = ledger.match([_calls([[3.0] * 14] * 2), _calls([[1.0] * 14] * 2)])
    assert lag.straggler == 1 and lag.held_ms == pytest.approx([0.0, 2.0]) and lag.waits_ms == pytest.approx([2.0, 0])
    assert lag.comm_ms == pytest.approx([42.0, 14.0])


def test_ranks_that_take_turns_arriving_last_hold_no_one_back():
    turns = ledger.match([_calls([[1.0], [1.3], [1.0], [1.3]]), _calls([[1.3], [1.0], [1.3], [1.0]])])
    assert turns.straggler is None and turns.held_ms == pytest.approx([0.15, 0.15])
    # a call only one rank timed (its watchdog had not retired the other's yet) is left out
    partial = _calls([[1.0], [1.0]])
    partial[1]["ms"] = None
    assert ledger.match([partial, _calls([[1.0], [1.0]])]).calls == 1
    # point-to-point calls count their own sequence per pair: never matched
    sends = [dict(c, p2p=True) for c in _calls([[1.0]])]
    assert ledger.match([sends, sends]) is None


def test_enable_keeps_the_user_s_own_settings(monkeypatch):
    import os

    for name in ledger.ENV:
        monkeypatch.delenv(name, raising=False)   # restored after the test, whatever enable() sets
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "0")
    ledger.enable()
    assert os.environ["TORCH_NCCL_ENABLE_TIMING"] == "0" and os.environ["TORCH_FR_BUFFER_SIZE"] == "20000"


def test_reads_at_the_window_s_end_and_at_exit_are_one():
    early = _calls([[None, 1.0]])                 # the first call not yet timed when the window closed
    late = _calls([[2.0, 1.0], [3.0]])[:1] + _calls([[2.0, 1.0], [3.0]])[2:]   # the program's end: the second lost
    calls = ledger.union(early, late)
    assert [(c["seq"], c["ms"]) for c in calls] == [(1, 2.0), (2, 1.0), (3, 3.0)]


def test_one_early_step_s_lag_is_not_the_program_s():
    # the first timed step (DDP rebuilding its buckets, say) puts rank 1 20 ms behind; the four after it 0.2 ms
    early = ledger.match([_calls([[21.0]] + [[1.2]] * 4), _calls([[1.0]] * 5)])
    assert early.held_ms == pytest.approx([0.0, 0.2]) and early.waits_ms == pytest.approx([0.2, 0.0])
    assert early.per_step["held_ms"][0] == pytest.approx([0.0, 20.0])   # kept, step by step


def _entry(name, pg_id, seq, created, ms, kind="nccl:all_reduce", sizes=((1024,),), dtypes=("BFloat16",)):
    """One flight-recorder entry as NCCL's dump gives it (torch 2.11's keys)."""
    return {"pg_id": pg_id, "process_group": (name, ""), "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False,
            "profiling_name": kind, "time_created_ns": created, "input_sizes": [list(s) for s in sizes],
            "input_dtypes": list(dtypes), "output_sizes": [list(s) for s in sizes], "output_dtypes": list(dtypes),
            "duration_ms": ms}


def test_nccl_s_entries_are_read_by_group_name_not_by_the_process_s_own_group_number(monkeypatch):
    # on this rank pg_id 1 is the subgroup named "3" (the ranks {0, 2}); another rank numbers its own subgroup 1 too
    entries = [_entry("0", 0, 1, 100, 2.5), _entry("3", 1, 1, 150, 0.4),
               _entry("0", 0, 2, 250, None, kind="nccl:_all_gather_base", sizes=((512,),)),
               _entry("0", 0, 3, 400, 1.0)]   # created at the second span's end: in no step
    monkeypatch.setattr(ledger, "_dumps", lambda: [("nccl", e) for e in entries])
    calls = ledger.read([(0, 200), (200, 400)])
    assert [(c["step"], c["group"], c["seq"], c["kind"], c["bytes"], c["ms"]) for c in calls] == [
        (0, "nccl:0", 1, "all_reduce", 2048, 2.5), (0, "nccl:3", 1, "all_reduce", 2048, 0.4),
        (1, "nccl:0", 2, "all_gather", 1024, None)]
    # rank 1 made the subgroup "4" (ranks {1, 3}), also its pg_id 1: its calls match nothing of rank 0's
    other = [dict(c, group="nccl:4") if c["group"] == "nccl:3" else c for c in calls]
    matched = ledger.match([calls, other])
    assert matched.calls == 1 and matched.steps == 1   # step 1's all-gather was not timed: the step is left out


def test_a_gloo_group_beside_nccl_s_leaves_the_steps_whole():
    # FSDP's checkpointing keeps a gloo group beside NCCL's: its calls are never timed, and its steps still count
    nccl = [dict(c, group="nccl:0") for c in _calls([[1.0], [1.0]])]
    gloo = [dict(c, group="gloo:1", seq=1, ms=None) for c in _calls([[1.0]])]
    matched = ledger.match([nccl + gloo, nccl + gloo])
    assert matched.steps == 2 and matched.calls == 2
