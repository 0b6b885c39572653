"""Collectives timed across real process groups (gloo over 2 and 4 processes, started as torchrun starts them), bus
bandwidth as nccl-tests defines it, and ranks that fail: named, with the others stopped."""

import inspect
import os
import re
import time

import pytest

from roofline.bench.collective import KINDS, CollectiveTiming, bus_factor, time_collective
from roofline.distributed import RankFailed, spawn

from .workers import every_collective, fail, threads

pytestmark = pytest.mark.long   # processes of their own: run first (conftest)


@pytest.mark.parametrize("ranks", [2, 4, 8])
def test_bus_bandwidth_is_nccl_tests(ranks):
    """nccl-tests' doc/PERFORMANCE.md: all_reduce 2(n-1)/n; all_gather, reduce_scatter, all_to_all (n-1)/n;
    broadcast and reduce 1 (send_recv moves each byte once)."""
    n = ranks
    expected = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n,
                "all_to_all": (n - 1) / n, "broadcast": 1.0, "reduce": 1.0, "send_recv": 1.0}
    assert {kind: bus_factor(kind, n) for kind in KINDS} == pytest.approx(expected)
    # 1 GiB in 6.5 ms: algbw 165.2 GB/s; on 2 ranks an all_reduce's busbw is the same, on 8 it is 7/4 of it
    t = CollectiveTiming("all_reduce", 1 << 30, n, "bfloat16", 1, (6.5,) * 9, (6.5,) * n, 6.5, 6.4, 6.6)
    assert t.algbw_gbps == pytest.approx(165.19, abs=0.01)
    assert t.busbw_gbps == pytest.approx(165.19 * 2 * (n - 1) / n, abs=0.01)


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="kind must be one of"):
        bus_factor("all_sum", 2)
    with pytest.raises(RuntimeError, match="initialized process group"):
        time_collective("all_reduce", 1 << 20)
    with pytest.raises(ValueError, match="nproc must be a positive int"):
        spawn(every_collective, 0, ())


@pytest.mark.parametrize("ranks, sizes", [(2, (4096, 1 << 18)), (4, (1 << 14,))])
def test_every_collective_is_checked_and_timed_on_every_rank(ranks, sizes):
    results = spawn(every_collective, ranks, sizes)
    assert len(results) == ranks and all(r == results[0] for r in results)   # every rank: the same numbers
    rows = results[0]
    assert [(r["kind"], r["nbytes"]) for r in rows] == [(k, s) for k in KINDS for s in sizes]
    for r in rows:
        assert r["ranks"] == ranks and len(r["rounds_ms"]) == 9 and len(r["rank_ms"]) == ranks
        assert 0 < r["low_ms"] <= r["median_ms"] <= r["high_ms"]
        assert r["median_ms"] == pytest.approx(sorted(r["rounds_ms"])[4])    # the median of the slowest ranks
        assert r["busbw_gbps"] == pytest.approx(r["nbytes"] / r["median_ms"] / 1e6 * bus_factor(r["kind"], ranks))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return open(f"/proc/{pid}/stat").read().split()[2] == "Z"   # a zombie has stopped


@pytest.mark.parametrize("how, said", [("raise", "rank 1: ValueError: rank 1 could not go on (the first error)"),
                                       ("signal", "rank 1: killed by signal 9")])
def test_a_rank_that_fails_is_named_and_no_rank_is_left_running(tmp_path, how, said):
    with pytest.raises(RankFailed) as failed:
        spawn(fail, 2, how, str(tmp_path))
    assert said in str(failed.value) and 1 in failed.value.failures
    pids = [int(p.name) for p in tmp_path.iterdir()]
    assert len(pids) == 2 and all(_gone(pid) for pid in pids)


def test_a_note_cut_off_mid_write_is_not_read(tmp_path):
    """A rank killed while noting its error leaves a draft, never a half-written note: the launcher's record (its
    exit status) speaks for it, and the notes written whole still order the errors."""
    from types import SimpleNamespace

    from roofline.distributed.launch import what_failed

    (tmp_path / "rank0.draft").write_text('{"time": 2.0, "err')
    (tmp_path / "rank2.json").write_text('{"time": 1.0, "error": "ValueError: no"}')
    (tmp_path / "rank3.json").write_text('{"time": 3.0, "error": "RuntimeError: waited"}')
    launcher = {rank: SimpleNamespace(exitcode=code) for rank, code in [(0, -9), (1, 1), (2, 1), (3, 1)]}
    assert what_failed(launcher, tmp_path, 4) == {2: "ValueError: no (the first error)", 3: "RuntimeError: waited",
                                             0: "killed by signal 9", 1: "exit status 1"}


def test_a_rank_that_never_arrives_times_out_the_collective_that_waited(tmp_path):
    """Rank 1 never calls the all_reduce that rank 0 waits in: after the group's timeout rank 0's collective fails
    and says so, and rank 1 (asleep for a minute) is stopped, not waited for."""
    started = time.perf_counter()
    with pytest.raises(RankFailed) as failed:
        spawn(fail, 2, "hang", str(tmp_path), timeout_s=3)
    assert time.perf_counter() - started < 45
    # rank 0 says which call it waited in, and where; rank 1, where it was when stopped
    lines, first = inspect.getsourcelines(fail)
    sleep, call = (first + max(i for i, text in enumerate(lines) if needle in text) for needle in
                   ("time.sleep(60)", "dist.all_reduce"))   # the last all_reduce: the one rank 1 never reaches
    said = failed.value.failures
    assert re.search(r"Timed out.*; waited [0-9.]+ s in call 2 of process group default_pg \(all_reduce, 16 B\) "
                     rf"at workers.py:{call} \(fail\)$", said[0])
    assert said[1] == f"stopped at workers.py:{sleep} (fail)"
    assert str(failed.value).startswith("1 of the ranks failed, and the others were stopped: rank 0: ")
    assert all(_gone(int(p.name)) for p in tmp_path.iterdir())


def test_several_ranks_run_a_thread_each_as_under_torchrun_unless_told(monkeypatch):
    """torchrun's rule: several ranks on a host, OMP_NUM_THREADS unset, each rank's torch on one thread (else each
    takes every core); the parent's environment as it was after; the user's own setting stands."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert spawn(threads, 2) == [("1", 1), ("1", 1)]
    assert "OMP_NUM_THREADS" not in os.environ
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert spawn(threads, 2) == [("2", 2), ("2", 2)]


def test_a_signal_to_the_launcher_is_one_line_and_the_process_s_handlers_come_back():
    """torch's elastic agent stops the ranks on Ctrl-C, then raises its SignalException (a traceback of 60 lines),
    and leaves its own handlers in place: Interrupted says it in a line, and the handlers are the process's again."""
    import signal

    from torch.distributed.elastic.multiprocessing.api import SignalException

    from roofline.distributed.launch import Interrupted, signals_said

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted, match="^interrupted by SIGINT: every rank was stopped$") as caught:
        with signals_said():
            signal.signal(signal.SIGINT, lambda *args: None)   # as the agent installs its own
            raise SignalException("Process 1 got signal: 2", sigval=signal.SIGINT)
    # no RankFailed: the ladder, which climbs on after a strategy's failure, stops
    assert caught.value.signum == signal.SIGINT and not isinstance(caught.value, RankFailed)
    assert signal.getsignal(signal.SIGINT) is before
    with pytest.raises(Interrupted, match="SIGINT"):   # a Ctrl-C before the agent has set its handlers
        with signals_said():
            raise KeyboardInterrupt


def test_a_note_of_a_rank_past_the_job_s_is_a_larger_job_s(tmp_path):
    """A folder reused: rank 3's note of an earlier job of 4 ranks is no rank of this job of 2. A note holds the
    error's lines in one."""
    from roofline.distributed.launch import note_error, what_failed

    note_error(tmp_path, 3, RuntimeError("an earlier job's"))
    note_error(tmp_path, 1, RuntimeError("NCCL error in: NCCLUtils.cpp:77\nLast error: out of memory"))
    assert what_failed({}, tmp_path, 2) == {1: "RuntimeError: NCCL error in: NCCLUtils.cpp:77 / Last error: out of "
                                                "memory"}
