"""Host time by source line (profiler/host.py), and the host-bound finding, on synthetic traces."""

import pytest

from roofline.profiler.report import analyze

from .synth import AUTOGRAD, PEAKS, TraceBuilder, at


def _program(b, kernel_us=40.0, unprofiled_ms=None):
    """One recorded step of 1 ms: the main thread at line 10 (a forward matmul) until 300 us, at loss.backward()
    (line 20) until 800, then at line 30 where it waits 100 us on the GPU. The autograd engine runs the
    matmul's backward for 200 us of the backward() call."""
    b.op("ProfilerStep#1", 0, 1000, cat="user_annotation")
    b.mark(0, at(10))
    b.op("aten::mm", 10, 50, shapes=[[64, 64], [64, 64]], dtypes=["float"] * 2, seq=5)
    b.kernel("sm90_xmma_gemm_f32", 100, kernel_us, launch_ts=20)
    b.mark(300, at(20))
    b.op("MmBackward0", 400, 200, tid=AUTOGRAD, seq=5, backward=True)
    b.kernel("sm90_xmma_gemm_f32", 620, kernel_us, launch_ts=450, tid=AUTOGRAD)
    b.mark(800, at(30))
    b.runtime("cudaStreamSynchronize", 850, 100)
    if unprofiled_ms is not None:
        b.unprofiled_steps = {"wall_ms": unprofiled_ms, "gpu_ms": unprofiled_ms}


def _report(tmp_path, **kwargs):
    b = TraceBuilder()
    _program(b, **kwargs)
    return analyze(b.write(tmp_path / "t.json"), peaks=PEAKS)


def test_host_time_goes_to_lines_waits_left_out_and_backward_work_to_the_forward_line(tmp_path):
    r = _report(tmp_path)
    by_line = {h.location.line: h for h in r.host}
    # line 10: its own 300 us and the engine's 200 us of its matmul's backward; line 20 (backward()) keeps
    # 500 - 200; line 30: 200 us less the 100 us wait on the GPU
    assert {k: h.host_us for k, h in by_line.items()} == {10: 500.0, 20: 300.0, 30: 100.0}
    assert by_line[10].backward_us == 200.0 and by_line[20].backward_us == 0.0
    assert [h.location.line for h in r.host] == [10, 20, 30]
    rows = r.to_dict()["host_lines"]
    assert rows[0]["line"] == 10 and rows[0]["host_ms_per_step"] == pytest.approx(0.5) and r.host_scale == 1.0


def test_host_bound_names_the_lines_whose_host_time_sets_the_pace(tmp_path):
    # 80 us of GPU work a step of 1 ms: the GPU waits on the host; kernels of 40 us are no launch-bound pattern
    r = _report(tmp_path)
    (f,) = [f for f in r.findings if f.id == "host-bound"]
    assert f.location.line == 10 and "train.py:10 0.50 ms (backward 0.20)" in f.message
    assert f.est_gain_ms == pytest.approx((r.timeline.idle_us["launch"] + r.timeline.idle_us["host"]) / 1e3)
    assert "launch-bound" not in [g.id for g in r.findings]


def test_host_time_and_its_finding_are_the_unprofiled_program_s(tmp_path):
    # Steps outside the window took 0.5 ms: host work shrinks by half, and so does the idle it causes
    r = _report(tmp_path, unprofiled_ms=[0.5] * 3)
    assert r.host_scale == pytest.approx(0.5)
    assert r.to_dict()["host_lines"][0]["host_ms_per_step"] == pytest.approx(0.25)
    (f,) = [f for f in r.findings if f.id == "host-bound"]
    assert f.est_gain_ms == pytest.approx(0.5 - 0.08) and "train.py:10 0.25 ms" in f.message
    # a program whose GPU is busy nearly all the time, unprofiled, is not host-bound
    assert "host-bound" not in [g.id for g in _report(tmp_path, kernel_us=40.0, unprofiled_ms=[0.082] * 3).findings]


def test_the_wait_before_the_first_step_is_on_no_line(tmp_path):
    """The warm-up step's end, recorded before the first step: its line (marked at 50) waits there for the GPU
    until 900. No host time before the step counts; that line keeps the first step's work until the next mark."""
    b = TraceBuilder()
    b.mark(50, at(5))
    b.runtime("cudaDeviceSynchronize", 100, 800)
    b.op("ProfilerStep#1", 1000, 1000, cat="user_annotation")
    b.op("aten::mm", 1010, 50, shapes=[[64, 64], [64, 64]], dtypes=["float"] * 2)
    b.kernel("sm90_xmma_gemm_f32", 1100, 40, launch_ts=1020)
    b.mark(1300, at(10))
    r = analyze(b.write(tmp_path / "t.json"), peaks=PEAKS)
    assert {h.location.line: h.host_us for h in r.host} == {5: 300.0, 10: 700.0}
