"""The timeline: busy time, and each idle gap put down to sync, launch, host or the GPU itself."""

import pytest

from roofline.profiler import timeline
from roofline.profiler.trace import load

from .synth import TraceBuilder, at


def _analyze(tmp_path, build):
    b = TraceBuilder()
    build(b)
    return timeline.analyze(load(b.write(tmp_path / "t.json")))


def test_sync_gap_is_charged_to_the_line_that_synced(tmp_path):
    def build(b):
        b.mark(0, at(20))
        b.op("aten::mul", 1, 10, shapes=[[4]])
        b.kernel("k1", 20, 100, launch_ts=2)           # busy 20..120
        b.mark(30, at(21))
        b.op("aten::item", 31, 95)
        b.runtime("cudaStreamSynchronize", 32, 90)     # host blocked 32..122: returns after the GPU ran dry
        b.mark(200, at(22))
        b.op("aten::mul", 201, 10, shapes=[[4]])
        b.kernel("k2", 250, 50, launch_ts=202)         # busy 250..300

    t = _analyze(tmp_path, build)
    assert t.busy_us == pytest.approx(150)
    assert t.idle_us["sync"] == pytest.approx(130)     # 120..250
    [row] = t.syncs
    assert row.call == "cudaStreamSynchronize" and row.location.line == 21 and row.count == 1
    assert row.wait_us == pytest.approx(90) and row.idle_us == pytest.approx(130)


def test_launch_host_and_gpu_causes(tmp_path):
    def build(b):
        b.mark(0, at(30))
        b.op("aten::add", 1, 500, shapes=[[4]])
        b.kernel("a", 10, 10, launch_ts=2)             # 10..20
        b.kernel("b", 40, 10, launch_ts=35)            # launched after the GPU went idle, gap 20 < 50: launch
        b.kernel("c", 200, 10, launch_ts=190)          # gap 150 after a late launch: host
        b.kernel("d", 230, 10, launch_ts=100)          # queued long before: the GPU waited on itself (gpu)

    t = _analyze(tmp_path, build)
    assert t.idle_us["launch"] == pytest.approx(20)
    assert t.idle_us["host"] == pytest.approx(150 + 9 + (501 - 240))    # + from the first op (1) and after the last kernel
    assert t.idle_us["gpu"] == pytest.approx(20)
    assert t.idle_us["sync"] == 0 and t.syncs == []
    assert t.busy_us + t.idle_total_us == pytest.approx(t.window_us)
    # The binned timeline holds the same time, bin by bin.
    assert len(t.bins.idle["host"]) == 400 and t.bins.width_us == pytest.approx(t.window_us / 400)
    for cause, us in t.idle_us.items():
        assert sum(t.bins.idle[cause]) == pytest.approx(us)
    assert list(t.bins.busy) == ["other"] and sum(t.bins.busy["other"]) == pytest.approx(40)   # kernels a-d


def test_launch_bound_region_collects_its_kernels_and_lines(tmp_path):
    def build(b):
        b.mark(0, at(40))
        b.op("aten::add", 1, 2000, shapes=[[4]])
        for k in range(30):                            # 30 kernels of 2 us, each launched 8 us after the last ended
            b.kernel("tiny", 10 + 10 * k, 2, launch_ts=10 + 10 * k - 1)

    t = _analyze(tmp_path, build)
    assert t.idle_us["launch"] == pytest.approx(29 * 8)
    [region] = t.launch_regions
    # The first kernel ran before the first launch-bound gap opened; the region holds the 29 launched late.
    assert region.kernels == 29 and region.busy_us == pytest.approx(58)
    assert list(region.locations) == [next(iter(region.locations))] and next(iter(region.locations)).line == 40


def test_few_short_gaps_do_not_make_a_region(tmp_path):
    def build(b):
        b.op("aten::add", 1, 200, shapes=[[4]])
        b.kernel("a", 10, 10, launch_ts=2)
        b.kernel("b", 30, 10, launch_ts=25)

    t = _analyze(tmp_path, build)
    assert t.idle_us["launch"] == pytest.approx(10) and t.launch_regions == []


def test_overlapping_streams_count_once(tmp_path):
    def build(b):
        b.op("aten::add", 0, 200, shapes=[[4]])
        b.kernel("a", 10, 100, launch_ts=1)
        b.kernel("b", 50, 100, launch_ts=2, stream=8)   # overlaps a: busy 10..150

    t = _analyze(tmp_path, build)
    assert t.busy_us == pytest.approx(140) and timeline.busy_intervals(load(tmp_path / "t.json"))[0][:2] == (10, 150)


def test_steps_and_no_gpu_work(tmp_path):
    def build(b):
        b.step(0, 100, 0)
        b.step(100, 300, 1)
        b.op("aten::add", 1, 50, shapes=[[4]])

    t = _analyze(tmp_path, build)
    assert t.steps == 2 and t.step_us == pytest.approx(200) and t.busy_us == 0 and t.gaps == 0


@pytest.mark.parametrize("name, blocks", [("cudaDeviceSynchronize", True), ("cudaStreamSynchronize", True),
                                           ("cudaEventSynchronize", True), ("cudaMemcpy", True),
                                           ("cudaMemcpyAsync", False), ("cudaLaunchKernel", False)])
def test_is_sync_call(name, blocks):
    assert timeline.is_sync_call(name) is blocks
