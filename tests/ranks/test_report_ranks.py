"""The findings across ranks, from figures as the GPU's runs give them: the recorder stretches every host, so a
finding's gain is what the unrecorded program can win (figures of the DDP GPT-2 run on two H100s,
benchmarks/results/h100x2-distributed.md)."""

import math
import statistics
from types import SimpleNamespace

import pytest

from roofline.distributed.ledger import Ledger
from roofline.distributed.merge import Merged, Rank, Straggler, _straggler
from roofline.distributed.report import findings
from roofline.profiler.attribution import Location
from roofline.profiler.trace import Trace


def _rank(rank, gpu=True, **figures):
    return Rank(rank, Trace(gpu=[object()] if gpu else []), [], 10, **figures)


def _merged(ranks, straggler=None):
    return Merged(ranks, [0.0] * len(ranks), 140, None, straggler, [0.0] * len(ranks))


# recorded: 67 ms steps (2.0x), rank 0 waiting for rank 1's host; unrecorded: 33.1 ms steps of 27.1 ms compute
RANK0 = dict(step_ms=67.29, compute_ms=29.88, comm_ms=41.55, exposed_ms=27.18, unprofiled_ms=33.14, mean_step_ms=67.29,
             recorded_step_ms=67.29, stretch=67.29 / 33.14)
RANK1 = dict(step_ms=66.54, compute_ms=27.14, comm_ms=3.01, exposed_ms=1.84, unprofiled_ms=33.13, mean_step_ms=66.54,
             recorded_step_ms=66.54, stretch=66.54 / 33.13)
LINE = Location("examples/models/gpt2.py", 71, "forward")


def test_a_wait_the_straggler_does_not_explain_is_no_finding_and_exposure_is_the_unrecorded_programs():
    # the others waited 43.55 ms a step, recorded, but rank 1 spent only 0.38 ms more at any line, and its GPU
    # computed less than rank 0's: no straggler to fix
    lead = Straggler(1, 135, 140, 43.55, LINE, 0.38, 0.0)
    found = {f.id: f for f in findings(_merged([_rank(0, **RANK0), _rank(1, **RANK1)], lead))}
    assert "straggler" not in found
    exposed = found["exposed-communication"]
    # rank 1 waits least: unrecorded 33.13 - 27.14 ms of compute, less its own 0.38 ms lead
    assert exposed.gain_ms == pytest.approx(33.13 - 27.14 - 0.38)
    assert "Unrecorded, a step of rank 1" in exposed.message and "2.01x as long, 1.84 ms" in exposed.message


def test_a_straggler_s_gain_is_its_own_lead_not_the_recorded_wait():
    lead = Straggler(1, 140, 140, 94.49, LINE, 20.3, 0.0)   # rank 1 sleeps 20 ms after each step
    asleep = [_rank(0, **{**RANK0, "unprofiled_ms": 53.4}), _rank(1, **{**RANK1, "unprofiled_ms": 53.4})]
    found = {f.id: f for f in findings(_merged(asleep, lead))}
    assert found["straggler"].gain_ms == pytest.approx(20.3) and found["straggler"].where == str(LINE)
    assert "waited 94.49 ms a step" in found["straggler"].message
    # its sleep is no communication: rank 1's unrecorded step less its compute and its own lead
    assert found["exposed-communication"].gain_ms == pytest.approx(53.4 - 27.14 - 20.3)
    # a GPU that computes longer is a straggler without a line
    slow_gpu = Straggler(0, 140, 140, 10.0, None, 0.0, 2.74)
    found = {f.id: f for f in findings(_merged([_rank(0, **RANK0), _rank(1, **RANK1)], slow_gpu))}
    assert found["straggler"].gain_ms == pytest.approx(2.74) and "computation took 2.74 ms a step longer" in \
        found["straggler"].message


def test_a_straggler_s_slower_gpu_is_compute_not_taken_off_its_exposure():
    # rank 1 waits least and is the straggler by its GPU (2.74 ms more compute, no line): its unrecorded step less
    # its compute is the exposure already; its GPU's lead is not taken off again
    slow_gpu = Straggler(1, 140, 140, 10.0, None, 0.0, 2.74)
    found = {f.id: f for f in findings(_merged([_rank(0, **RANK0), _rank(1, **RANK1)], slow_gpu))}
    assert found["exposed-communication"].gain_ms == pytest.approx(33.13 - 27.14)


def test_on_cpus_the_recorded_exposure_stands():
    ranks = [_rank(0, gpu=False, **RANK0), _rank(1, gpu=False, **{**RANK1, "exposed_ms": 4.0})]
    assert ranks[1].not_computing_ms is None
    found = {f.id: f for f in findings(_merged(ranks))}
    assert found["exposed-communication"].gain_ms == pytest.approx(4.0)
    assert "A step spends 4.00 ms of 67.29" in found["exposed-communication"].message
    # under 5% of the step: no finding
    ranks[1].exposed_ms = 1.84
    assert "exposed-communication" not in {f.id for f in findings(_merged(ranks))}


def _timed(held, waits, comm=(3.0, 3.0)):
    return Ledger(steps=8, calls=56, comm_ms=list(comm), waits_ms=list(waits), held_ms=list(held))


def test_nccl_s_timing_outside_the_window_gives_the_straggler_s_gain_and_the_exposure():
    # rank 1 sleeps 20 ms after each step; NCCL timed rank 0 waiting 20.1 ms a step for it, outside the window
    lead = Straggler(1, 140, 140, 94.49, LINE, 23.0, 0.0, held_ms=20.1)
    asleep = [_rank(0, **{**RANK0, "unprofiled_ms": 53.4}), _rank(1, **{**RANK1, "unprofiled_ms": 53.4})]
    merged = _merged(asleep, lead)
    merged.ledger = _timed([0.0, 20.1], [20.1, 0.3], comm=(24.0, 6.5))
    found = {f.id: f for f in findings(merged)}
    assert found["straggler"].gain_ms == pytest.approx(20.1)
    assert "NCCL timed it 20.10 ms a step behind the next latest rank" in found["straggler"].message
    # rank 1 waits least (0.3 ms, timed): its unrecorded step less its compute, its waits and its idle lead
    exposed = found["exposed-communication"]
    assert exposed.gain_ms == pytest.approx(53.4 - 27.14 - 0.3 - 20.1)
    assert "less its 0.30 ms of waits for other ranks and its own 20.10 ms lead" in exposed.message


def test_a_lead_only_the_recorder_made_is_no_straggler():
    # recorded, rank 1 arrives last at every call, 3 ms late; NCCL's timing outside the window shows the ranks
    # taking turns (the recorder slowed rank 1's host, not the program)
    def calls(late):
        return [SimpleNamespace(start=1000.0 * i + late, on_gpu=True) for i in range(14)]

    ranks = [_rank(0, **RANK0), _rank(1, **RANK1)]
    ranks[0].calls, ranks[1].calls = calls(0.0), calls(3000.0)
    straggler, waits = _straggler(ranks, 14, [0.0, 0.0], _timed([0.2, 0.25], [0.25, 0.2]))
    assert straggler is None and waits == pytest.approx([14 * 3.0 / 10, 0.0])


def test_recorded_alone_a_straggler_holds_the_others_back_in_most_steps():
    # no timing outside the window (gloo). Without step marks, by calls: rank 1 late by 30 ms at 4 calls of 10
    # makes nearly all the waits, but rank 0 arrives last at the other 6: a hiccup. Late at 6 of 10, it is named
    def calls(late_at, late_us, count=10, every=1000.0):
        return [SimpleNamespace(arrived=every * i + (late_us if i in late_at else 0.0), on_gpu=False)
                for i in range(count)]

    for late_at, named in (((0, 3, 5, 8), None), ((0, 2, 3, 5, 7, 8), 1)):
        ranks = [_rank(0, gpu=False, **RANK0), _rank(1, gpu=False, **RANK1)]
        ranks[0].calls, ranks[1].calls = calls(range(10), 100.0), calls(late_at, 30_000.0)
        straggler, _ = _straggler(ranks, 10, [0.0, 0.0], None)
        assert (straggler.rank if straggler else None) == named
    # with step marks, by steps: five steps of four collectives. Rank 1 late by 20 ms to each step's first is last
    # at 5 calls of 20, and holds the others back most in every step: named. Late in one step only: a hiccup
    for late_at, named in (((0, 4, 8, 12, 16), 1), ((8,), None)):
        ranks = [_rank(0, gpu=False, **RANK0), _rank(1, gpu=False, **RANK1)]
        ranks[0].trace.steps = [(step * 100_000.0, (step + 1) * 100_000.0) for step in range(5)]
        ranks[0].calls = calls(range(20), 100.0, 20, 25_000.0)
        ranks[1].calls = calls(late_at, 20_000.0, 20, 25_000.0)
        straggler, _ = _straggler(ranks, 20, [0.0, 0.0], None)
        assert (straggler.rank if straggler else None) == named, late_at


def test_a_recorded_transfer_is_each_call_s_shortest_over_the_ranks():
    """The rank that arrives last waits for none: its call's time is the transfer. Rank 0 waits 30-50 ms for rank 1
    at each of three 256 KiB all_reduces over gloo; the transfer is 1 ms, not the median call's 30 ms."""
    from roofline.distributed.comms import Call
    from roofline.distributed.merge import collective_rows

    def call(start, us):
        return Call("all_reduce", 1 << 18, start, start, start + us, LINE, None, -1, False, False)

    ranks = [_rank(0, gpu=False, **RANK0), _rank(1, gpu=False, **RANK1)]
    ranks[0].calls = [call(0, 50_000), call(100_000, 30_000), call(200_000, 40_000)]
    ranks[1].calls = [call(49_000, 1_000), call(129_200, 800), call(239_000, 1_100)]
    (row,) = collective_rows(_merged(ranks))
    assert row["call_us"] == pytest.approx(1_000) and not row["unrecorded"]
    assert row["busbw_gbps"] == pytest.approx((1 << 18) / 1e-3 / 1e9)   # 2 ranks: algbw x 2(n-1)/n = algbw
    assert row["ms"] == pytest.approx(statistics.median([120.0, 2.9]) / 10)   # a step: the median rank's total


def test_exposed_communication_is_placed_at_the_collective_whose_transfers_take_longest():
    """Not at the table's first row, whose time is mostly a wait: a broadcast right after rank 1's sleep waits 30
    ms and moves its bytes in 0.2; the all_reduce moves its in 3 ms."""
    from roofline.distributed.comms import Call

    sleep_line, reduce_line = Location("train.py", 7, "main"), Location("train.py", 8, "main")

    def call(kind, where, start, us):
        return Call(kind, 1 << 20, start, start, start + us, where, None, -1, False, True)

    ranks = [_rank(0, gpu=False, **{**RANK0, "exposed_ms": 4.0}), _rank(1, gpu=False, **{**RANK1, "exposed_ms": 4.0})]
    ranks[0].calls = [c for i in range(10) for c in (call("broadcast", sleep_line, 1e5 * i, 30_200),
                                                     call("all_reduce", reduce_line, 1e5 * i + 5e4, 3_000))]
    ranks[1].calls = [c for i in range(10) for c in (call("broadcast", sleep_line, 1e5 * i + 30_000, 200),
                                                     call("all_reduce", reduce_line, 1e5 * i + 5e4, 3_000))]
    exposed = {f.id: f for f in findings(_merged(ranks))}["exposed-communication"]
    assert exposed.where == str(reduce_line)


def test_a_gpu_idle_longer_than_its_collectives_ran_waits_on_its_host():
    # FSDP2's GPT-2 on two H100s, unrecorded: rank 0's step 84.42 ms, 25.68 ms of compute, its NCCL kernels 4.11 ms;
    # it is the straggler by 7.81 ms. The other 46.82 ms its GPU idles with no kernel: not communication
    late = Straggler(0, 380, 380, 122.44, LINE, 3.64, 0.0, held_ms=7.81)
    ranks = [_rank(0, step_ms=131.15, compute_ms=25.68, comm_ms=2.68, exposed_ms=2.54, unprofiled_ms=84.42),
             _rank(1, step_ms=116.06, compute_ms=30.59, comm_ms=124.99, exposed_ms=97.32, unprofiled_ms=84.61)]
    merged = _merged(ranks, late)
    merged.ledger = _timed([7.81, 0.0], [0.0, 7.81], comm=(4.11, 107.94))
    found = {f.id: f for f in findings(merged)}
    assert "exposed-communication" not in found   # 4.11 ms: under 5% of the 84.42 ms step
    assert found["straggler"].gain_ms == pytest.approx(7.81)
    merged.ledger = _timed([7.81, 0.0], [0.0, 7.81], comm=(9.0, 107.94))   # had its collectives run 9 ms
    exposed = {f.id: f for f in findings(merged)}["exposed-communication"]
    assert exposed.gain_ms == pytest.approx(9.0)
    assert "the other 41.93 ms its GPU idles with no kernel at all" in exposed.message


def test_a_transfer_far_under_doctor_s_bus_bandwidth_names_the_nccl_settings_doctor_did_not_have():
    from roofline.distributed.comms import Call
    from roofline.distributed.interconnect import Interconnect

    mib27 = 27 << 20
    doctor = Interconnect(2, "2 x NVIDIA H100 80GB HBM3", "nccl", "", {}, "2026-11-27T11:00:00",
                          [{"kind": "all_reduce", "nbytes": 16 << 20, "busbw_gbps": 300.0},
                           {"kind": "all_reduce", "nbytes": 64 << 20, "busbw_gbps": 340.0}],
                          environment={"NCCL_NVLS_ENABLE": "0"})
    expected = doctor.busbw_at("all_reduce", mib27)
    assert expected == pytest.approx(300 + 40 * math.log(27 / 16) / math.log(4))
    assert doctor.busbw_at("all_reduce", 1 << 10) == 300.0 and doctor.busbw_at("all_gather", mib27) is None

    def rank(k, env):
        r = _rank(k, **RANK1)
        r.trace.meta = {"roofline": {"nccl_env": env}}
        r.calls = [Call("all_reduce", mib27, 0.0, 1000.0 * i, 1000.0 * i + 450, LINE, None, i, True, True)
                   for i in range(110)]   # 11 a step over the 10 recorded steps
        return r

    # DDP's gradient buckets, 11 a step: NCCL timed each transfer at 400 us outside the window (70.8 GB/s)
    env = {"NCCL_NVLS_ENABLE": "0", "NCCL_ALGO": "Tree", "NCCL_PROTO": "Simple"}
    merged = _merged([rank(0, env), rank(1, env)])
    merged.ledger = _timed([0.0, 0.0], [0.0, 0.0], comm=(4.4, 4.4))
    merged.ledger.transfers = {("all_reduce", mib27): [0.4] * 77}
    slow = {f.id: f for f in findings(merged, doctor)}["slow-collectives"]
    busbw = mib27 / 400e-6 / 1e9
    assert slow.gain_ms == pytest.approx(11 * 0.4 * (1 - busbw / expected))
    assert f"{busbw:,.1f} GB/s of bus bandwidth, where roofline doctor measured {expected:,.1f}" in slow.message
    assert "NCCL_ALGO=Tree, NCCL_PROTO=Simple" in slow.message and "NCCL_NVLS_ENABLE" not in slow.message
    # a measurement from before doctor kept its settings: none are blamed, the ranks' are listed
    doctor.environment = None
    unknown = {f.id: f for f in findings(merged, doctor)}["slow-collectives"].message
    assert "does not say which NCCL settings it had" in unknown and "NCCL_ALGO=Tree" in unknown
    # no ceiling measured, or a transfer near it: no finding
    assert "slow-collectives" not in {f.id for f in findings(merged)}
    merged.ledger.transfers = {("all_reduce", mib27): [0.1] * 77}
    assert "slow-collectives" not in {f.id for f in findings(merged, doctor)}


@pytest.mark.parametrize("owner, said, unsaid", [("DDP bucket 0 (head.weight … wte.weight, 28 tensors)",
                                                  "bucket_cap_mb", "FSDP2"),
                                                 ("FSDP2 layers.0 … layers.11 (12)", "reduce_dtype=torch.bfloat16",
                                                  "DDP"),
                                                 (None, "bucket_cap_mb", "async_op")])
def test_the_exposed_collective_s_advice_is_for_whoever_s_tensors_it_moves(owner, said, unsaid):
    from roofline.distributed import comms

    def calls():   # one asynchronous all-reduce of 1 MiB a step, as DDP's and FSDP2's hooks make them
        return [comms.Call("all_reduce", 1 << 20, 0.0, 0.0, 2000.0, LINE, None, 0, False, True, owner)]

    ranks = [_rank(0, gpu=False, **RANK0), _rank(1, gpu=False, **{**RANK1, "exposed_ms": 4.0})]
    for r in ranks:
        r.calls = calls()
    message = {f.id: f for f in findings(_merged(ranks))}["exposed-communication"].message
    assert said in message and unsaid not in message


def test_collectives_on_the_stream_that_computes_are_named_with_their_stream_and_line():
    serial = dict(RANK1, serialized_ms=2.5, serialized_streams=[7], serialized_at=LINE)
    found = {f.id: f for f in findings(_merged([_rank(0, **RANK0), _rank(1, **serial)]))}
    f = found["serialized-communication"]
    assert f.where == str(LINE) and f.gain_ms == pytest.approx(min(2.5, RANK1["exposed_ms"]))
    assert "rank 1, NCCL's kernels run on stream 7" in f.message and "2.50 ms a step" in f.message
    assert "serialized-communication" not in {f.id for f in findings(_merged([_rank(0, **RANK0), _rank(1, **RANK1)]))}


def test_ddp_reducing_each_bucket_four_times_a_step_gains_three_in_four_of_the_least_waiting_rank_s_reductions():
    from roofline.distributed.comms import Call

    def reductions(ms_each):   # 10 steps of 4 micro-batches, each reducing buckets 0 and 1
        return [Call("all_reduce", 1 << 20, 0, 0, ms_each * 1e3, LINE, None, 0, True, True, f"DDP bucket {b} (x)")
                for _ in range(10 * 4) for b in (0, 1)]

    ranks = [_rank(0, **RANK0), _rank(1, **RANK1)]
    ranks[0].calls, ranks[1].calls = reductions(2.0), reductions(0.5)   # rank 0 waits in them for rank 1
    found = next(f for f in findings(_merged(ranks)) if f.id == "ddp-no-sync")
    assert found.title == "DDP reduces the gradients 4 times a step" and found.where == str(LINE)
    assert found.gain_ms == pytest.approx(8 * 0.5 * 3 / 4)   # rank 1's 8 calls a step of 0.5 ms, less one in four
    ranks[0].calls, ranks[1].calls = reductions(2.0)[:20], reductions(0.5)[:20]   # once a step: nothing to say
    assert not any(f.id == "ddp-no-sync" for f in findings(_merged(ranks)))


SYNC_LINE = Location("train.py", 42, "<module>")


def _synced(rank, count, wait_ms, gain_ms, **figures):
    from roofline.distributed.merge import HostSync

    r = _rank(rank, **{**RANK1, **figures})
    r.syncs = [HostSync(SYNC_LINE, "cudaStreamSynchronize", count, wait_ms, gain_ms)]
    return r


def test_a_sync_on_every_rank_gains_the_least_any_rank_would_win():
    # loss.item() once a step on both ranks: rank 0's GPU idles 1.5 ms after it, rank 1's 0.9 ms
    found = {f.id: f for f in findings(_merged([_synced(0, 1.0, 2.0, 1.5), _synced(1, 1.0, 1.2, 0.9)]))}
    every = found["host-sync-every-rank"]
    assert every.gain_ms == pytest.approx(0.9) and every.where == str(SYNC_LINE)
    assert "runs once a step at this line on each rank" in every.message and "once a step" in every.title
    assert "rank 0 2.00, rank 1 1.20" in every.message and "rank 0 1.50, rank 1 0.90" in every.message
    assert "host-sync-some-ranks" not in found


def _waiting(ranks, waits):
    merged = _merged(ranks)
    merged.waits_ms = waits   # each rank's wait for later ranks, a step (recorded)
    return {f.id: f for f in findings(merged)}


def test_a_sync_on_one_rank_costs_every_rank_what_it_costs_that_one_at_most_what_they_waited():
    ranks = [_synced(0, 2.0, 3.0, 2.5), _rank(1, **RANK1)]
    some = _waiting(ranks, [0.0, 3.0])["host-sync-some-ranks"]   # rank 1 waited 3 ms a step for rank 0
    assert some.gain_ms == pytest.approx(2.5) and some.title == "hosts wait for their GPUs 2 times a step on rank 0"
    assert "Only rank 0 of 2 waits for its GPU at this line" in some.message and "The GPU then idles" in some.message
    assert _waiting(ranks, [0.0, 1.0])["host-sync-some-ranks"].gain_ms == pytest.approx(1.0)
    # the others never waited for rank 0 (another rank is late, or none): nothing to win
    assert "host-sync-some-ranks" not in _waiting(ranks, [0.0, 0.0])
    # NCCL's timing outside the window, where there is one, says how long the others waited
    merged = _merged(ranks)
    merged.waits_ms, merged.ledger = [0.0, 3.0], _timed([0.0, 0.0], [0.0, 1.5])
    assert {f.id: f for f in findings(merged)}["host-sync-some-ranks"].gain_ms == pytest.approx(1.5)


def test_syncs_on_several_ranks_of_more_are_said_of_those_ranks():
    ranks = [_synced(0, 1.0, 3.0, 2.5), _synced(1, 1.0, 3.0, 2.0), _rank(2, **RANK1)]
    some = _waiting(ranks, [0.0, 0.0, 4.0])["host-sync-some-ranks"]
    assert some.gain_ms == pytest.approx(2.5) and some.title.endswith("once a step on ranks 0, 1")
    assert "Only ranks 0, 1 of 3 wait for their GPUs" in some.message and "Their GPUs then idle" in some.message


def test_a_sync_s_gain_is_at_most_what_the_rank_s_gpu_does_not_compute_unrecorded():
    # rank 0's unrecorded step 28 ms of 27.14 ms compute: at most 0.86 ms to win, whatever the recorded idle
    ranks = [_synced(0, 2.0, 3.0, 2.5, unprofiled_ms=28.0), _rank(1, **RANK1)]
    assert _waiting(ranks, [0.0, 3.0])["host-sync-some-ranks"].gain_ms == pytest.approx(0.86)


def test_a_sync_outside_the_loop_or_too_cheap_to_matter_is_no_finding():
    once = [_synced(0, 0.1, 5.0, 4.0), _synced(1, 0.1, 5.0, 4.0)]   # 1 call in the window's 10 steps
    cheap = [_synced(0, 1.0, 0.5, 0.2), _synced(1, 1.0, 0.5, 0.2)]  # 0.2 ms of a 66.54 ms step
    for ranks in (once, cheap):
        assert not {f.id for f in findings(_merged(ranks))} & {"host-sync-every-rank", "host-sync-some-ranks"}


def test_the_host_syncs_table_reads_at_80_columns():
    import io

    from rich.console import Console

    from roofline.distributed.merge import host_sync_rows
    from roofline.distributed.report import render

    merged = _merged([_synced(0, 1.0, 2.0, 1.5), _synced(1, 1.0, 1.2, 0.9)])
    rows = host_sync_rows(merged)
    assert [(r["ranks"], r["every_rank"], r["gain_ms"]) for r in rows] == [([0, 1], True, [1.5, 0.9])]
    out = io.StringIO()
    render(merged, Console(file=out, width=80, force_terminal=False))
    text = out.getvalue()
    table = text[text.index("host syncs"):text.index("findings across")]
    assert all(len(line) <= 80 for line in text.splitlines()) and "…" not in text   # nothing cut
    for cell in ("train.py:42", "cudaStream", "all", "1.20-2.00", "0.90-1.50"):
        assert cell in table, cell


def test_the_ranks_page_lists_the_host_syncs():
    from roofline.distributed.merge import host_sync_rows
    from roofline.profiler.html import _ranks

    merged = _merged([_synced(0, 2.0, 3.0, 2.5), _rank(1, **RANK1)])
    rank = {"rank": 0, "overlap": None, "unprofiled_ms": 1.0, "step_ms": 1.0, "compute_ms": 1.0, "comm_ms": 0.0,
            "exposed_ms": 0.0}
    page = _ranks({"ranks": {"ranks": [rank, {**rank, "rank": 1}], "waits_ms": [0.0, 0.0], "unrecorded": None,
                             "collectives": [], "lanes": None, "world_size": 2, "matched": 0,
                             "host_syncs": host_sync_rows(merged), "findings": []}})
    assert 'id="host-syncs"' in page and "train.py:42 (&lt;module&gt;)" in page and "0: 3.00" in page


def test_ddp_around_a_model_compiled_as_many_graphs_is_told_to_compile_one_and_gains_its_host_wait():
    from roofline.distributed.comms import Call

    # DDP GPT-2 small compiled by torch.compile of the DDP module on two H200s: 14 graphs a step, one forward
    # (Dynamo's DDP optimizer split it at the buckets; the count of a later run); unrecorded, rank 1 waits least (0.03 ms), its step 31.60 ms
    # of 19.05 ms compute, its NCCL kernels 2.61 ms, and rank 0 waited 5.03 ms a step for it at the compiled forward
    def buckets(micro_batches=1):   # 10 steps, each reducing buckets 0 and 1 once a micro-batch
        return [Call("all_reduce", 27 << 20, 0, 0, 140.0, LINE, None, 0, True, True, f"DDP bucket {b} (x)")
                for _ in range(10 * micro_batches) for b in (0, 1)]

    forward = Location("examples/models/gpt2.py", 115, "forward")   # the compiled function, as a run resolved it
    ranks = [_rank(0, step_ms=47.81, compute_ms=22.18, comm_ms=29.31, exposed_ms=17.10, unprofiled_ms=31.84,
                   compiled_graphs=14.0, compiled_at=forward),
             _rank(1, step_ms=46.35, compute_ms=19.05, comm_ms=2.12, exposed_ms=1.79, unprofiled_ms=31.60,
                   compiled_graphs=14.0, compiled_at=forward)]
    for r in ranks:
        r.calls = buckets()
    late = Straggler(1, 60, 70, 30.56, forward, 0.0, 0.0, held_ms=5.03)
    merged = _merged(ranks, late)
    merged.ledger = _timed([0.0, 5.03], [5.03, 0.03], comm=(21.12, 2.61))

    def found():
        return {f.id: f for f in findings(merged)}

    split = found()["ddp-split-graphs"]
    # rank 1: 31.60 - 19.05 = 12.55 ms not computing, less 0.03 of waits, 2.58 of NCCL's kernels (its own time
    # there) and its 5.03 ms lead, which it spent at the compiled forward: that lead counts too
    assert split.gain_ms == pytest.approx(31.60 - 19.05 - 0.03 - (2.61 - 0.03))
    assert split.where == str(forward) and split.title == "DDP runs 14 compiled graphs a forward"
    assert "torch._dynamo.config.optimize_ddp = False" in split.message and "straggler finding's too" in split.message
    late.where = LINE   # a lead at another line (a rank loading its data late) is the straggler finding's alone
    assert found()["ddp-split-graphs"].gain_ms == pytest.approx(31.60 - 19.05 - 0.03 - 5.03 - 2.58)
    late.where = forward
    # 14 graphs a step in 14 micro-batches is one graph a forward; one graph a step; no DDP; no NCCL timing to tell
    # the host's wait from communication: no finding
    for r in ranks:
        r.calls = buckets(14)
    assert "ddp-split-graphs" not in found()
    for r in ranks:
        r.calls, r.compiled_graphs = buckets(), 1.0
    assert "ddp-split-graphs" not in found()
    for r in ranks:
        r.compiled_graphs, r.calls = 14.0, []
    assert "ddp-split-graphs" not in found()
    for r in ranks:
        r.calls = buckets()
    merged.ledger = None
    assert "ddp-split-graphs" not in found()
    # the ranks even, each GPU idle only for its collectives: the host keeps up
    for r in ranks:
        r.unprofiled_ms = r.compute_ms + 2.7
    merged.straggler, merged.ledger = None, _timed([0.0, 0.0], [0.05, 0.03], comm=(2.7, 2.61))
    assert "ddp-split-graphs" not in found()


def test_the_ranks_table_gives_the_recorded_steps_mean_as_its_compute_and_communication_are():
    import io

    from rich.console import Console

    from roofline.distributed.report import render

    # one spiked step among five: the median (step_ms) holds none of it, compute and comm (window / steps) do
    ranks = [_rank(0, **{**RANK0, "step_ms": 60.0, "mean_step_ms": 67.29}),
             _rank(1, **{**RANK1, "step_ms": 60.0, "mean_step_ms": 66.54})]
    console = Console(file=io.StringIO(), width=120, color_system=None)
    render(_merged(ranks), console)
    table = console.file.getvalue()
    assert "67.29" in table and "66.54" in table and "60.00" not in table


def test_the_straggler_s_lead_is_put_on_its_host_or_its_gpu_by_what_its_gpu_computed():
    # no straggler planted, on two H200s: NCCL timed rank 1 2.64 ms a step behind rank 0, and rank 1's GPU computed
    # less than rank 0's (recorded): its GPU idled, waiting on its host
    ranks = [_rank(0, **RANK0), _rank(1, **RANK1)]
    merged = _merged(ranks, Straggler(1, 136, 140, 52.37, LINE, 3.79, 0.0, held_ms=2.64))
    merged.ledger = _timed([0.03, 2.64], [2.64, 0.03], comm=(14.18, 2.47))
    said = {f.id: f for f in findings(merged)}["straggler"].message
    assert "Of that lead, 2.64 ms a step is its host's: its GPU computed no longer than the others'" in said
    assert "waiting for rank 1's host to launch" in said and "at the line above first" in said
    assert "a host whose launches reach this GPU more slowly lags alike" in said
    # its GPU computed 2.0 of its 2.64 ms lead longer: a GPU's lead, not its host's
    merged.straggler = Straggler(1, 136, 140, 52.37, None, 0.0, 2.0, held_ms=2.64)
    said = {f.id: f for f in findings(merged)}["straggler"].message
    assert "Of that lead, 2.00 ms a step is its GPU computing longer than the others'" in said
    assert "host's" not in said
    # 1.0 of 2.64 computed longer: 1.64 ms its host's
    merged.straggler = Straggler(1, 136, 140, 52.37, None, 0.0, 1.0, held_ms=2.64)
    said = {f.id: f for f in findings(merged)}["straggler"].message
    assert "1.64 ms a step is its host's: its GPU computed only 1.00 ms longer" in said
    assert "at the line above first" not in said   # no line to look at


def test_a_straggler_whose_host_is_late_is_told_where_its_process_may_run():
    # the two ranks unbound on one host of two NUMA nodes, rank 1's GPU near the second
    ranks = [_rank(0, **RANK0), _rank(1, **RANK1)]
    for r, near in zip(ranks, ("0-15", "16-31")):
        r.trace.meta = {"roofline": {"placement": {"host": "h", "cpus": "0-31", "gpu": f"00000000:{r.rank}b:00.0",
                                                   "gpu_cpus": near}}}
    merged = _merged(ranks, Straggler(1, 136, 140, 52.37, LINE, 3.79, 0.0, held_ms=11.85))
    merged.ledger = _timed([0.05, 11.85], [11.85, 0.05], comm=(29.16, 2.5))
    said = {f.id: f for f in findings(merged)}["straggler"].message
    assert "Rank 1's process may run on CPUs 0-31, and its GPU (00000000:1b:00.0) is attached near CPUs 16-31" in said
    assert "torchrun --numa-binding node" in said
    # bound near its GPU: nothing to say of its placement
    ranks[1].trace.meta["roofline"]["placement"]["cpus"] = "16-31"
    said = {f.id: f for f in findings(merged)}["straggler"].message
    assert "may run on CPUs" not in said
    assert said.endswith("the lag once followed the GPU when the ranks swapped GPUs).")


def test_fsdp2_s_hooks_are_scaled_back_by_the_host_s_stretch():
    """Hook time is the host's: scaled back to the program's pace by the recorded steps' mean over the unrecorded
    step (here 2.0x), not by the GPU's stretch (here 1.5x), which the ranks table and the exposure use."""
    figures = dict(step_ms=60.0, compute_ms=20.0, comm_ms=2.0, exposed_ms=1.0, unprofiled_ms=30.0, mean_step_ms=60.0,
                   recorded_step_ms=45.0, stretch=1.5, hooks_ms=16.0, hook_units=13)
    found = {f.id: f for f in findings(_merged([_rank(0, **figures), _rank(1, **figures)]))}
    assert found["fsdp2-hooks"].title == "13 FSDP2 units cost the host 8.00 ms a step"
