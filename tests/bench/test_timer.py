"""bench.time on the CPU: the same API and checks a GPU user gets."""

import time as systime
import warnings

import functools

import pytest
import torch

from roofline import bench
from roofline.bench.timer import BenchTimeout, TimingWarning

# The CPU path, also on a machine with a GPU (where a callable without tensors would be timed with CUDA events).
cpu_time = functools.partial(bench.time, device="cpu")


def sleeper(ms):
    def fn(*args):
        systime.sleep(ms / 1e3)
    return fn


def test_times_a_known_duration():
    m = cpu_time(sleeper(2), flush=False, rep_ms=60, warn=False)
    assert m.mode == "cpu" and m.device == "cpu"
    assert 2.0 <= m.median < 3.0  # sleep never returns early; the scheduler adds a little
    assert m.min <= m.p10 <= m.median <= m.p90 <= m.max
    assert m.n == len(m.samples_ms) >= 10
    assert m.warmup_calls >= 3 + 1
    assert m.flush == "hot cache (no flush)"


def test_repetitions_follow_the_time_budget_within_bounds():
    assert cpu_time(sleeper(1), flush=False, rep_ms=30, warn=False).n in range(10, 31)
    assert cpu_time(sleeper(1), flush=False, rep_ms=1000, max_reps=15, warn=False).n == 15
    assert cpu_time(sleeper(5), flush=False, rep_ms=1, min_reps=12, warn=False).n == 12


def test_flush_happens_outside_the_timed_window():
    x = torch.randn(1000)
    hot = cpu_time(torch.add, x, x, flush=False, warn=False)
    flushed = cpu_time(torch.add, x, x, flush=True, warn=False)
    assert flushed.flush.startswith("cache flushed")
    # Reading twice the last-level cache takes far longer than adding 1000 floats: had it been
    # timed, the median would be milliseconds.
    assert flushed.median < 0.5 and hot.median < 0.5


def test_arguments_are_passed_and_rotated():
    seen = []
    sets = [(torch.tensor(i),) for i in range(3)]
    cpu_time(lambda t: seen.append(int(t)), rotate=sets, flush=False, rep_ms=1, warn=False)
    assert set(seen) == {0, 1, 2}
    assert all(b == (a + 1) % 3 for a, b in zip(seen, seen[1:]))  # in turn, every call
    m = cpu_time(lambda t: None, rotate=sets, flush=False, rep_ms=1, warn=False)
    assert "rotating 3 input sets" in m.flush


def test_grad_to_none_resets_gradients_before_every_call():
    w = torch.randn(8, requires_grad=True)
    grads_seen = []

    def step():
        grads_seen.append(w.grad is None)
        (w * 2).sum().backward()

    cpu_time(step, grad_to_none=[w], flush=False, rep_ms=1, warn=False)
    assert all(grads_seen)
    assert torch.equal(w.grad, torch.full_like(w, 2.0))  # never accumulated


def test_noisy_run_is_flagged_in_the_result_and_on_the_terminal():
    durations = iter([1, 1, 1, 1, 1, 1] + [1, 6] * 100)
    with pytest.warns(TimingWarning, match="noisy"):
        m = cpu_time(lambda: systime.sleep(next(durations) / 1e3), flush=False, min_reps=20, rep_ms=1)
    assert m.cv > 0.05
    assert any(w.startswith("noisy") for w in m.warnings)


def test_a_run_at_the_timer_floor_is_flagged_as_short():
    m = cpu_time(lambda: None, flush=False, warn=False)
    assert m.floor_ms is not None and 0 < m.floor_ms < 0.1
    assert any(w.startswith("short") for w in m.warnings)


def test_the_timers_tare_is_subtracted_from_every_sample():
    m = cpu_time(sleeper(1), flush=False, rep_ms=20, warn=False)
    assert all(t >= 1.0 - m.floor_ms for t in m.samples_ms)  # sleep(1 ms) minus a tare of microseconds
    assert m.floor_ms < 0.01


def test_steady_samples_get_no_warnings():
    # Synthetic samples: whether a real sleep is steady depends on the machine's scheduler.
    from roofline.bench.timer import Measurement, _diagnose, _Runner

    runner = _Runner(sleeper(3), [()], device="cpu", flush=False, cuda_graph=False, grad_to_none=None, timeout_s=5)
    m = Measurement(samples_ms=[3.0 + 0.01 * (i % 7) for i in range(50)], mode="cpu", device="cpu",
                    flush="hot cache (no flush)", warmup_calls=3, floor_ms=1e-4)
    assert _diagnose(runner, m) == []


def test_a_real_run_gets_no_warning_that_noise_cannot_explain():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TimingWarning)
        m = cpu_time(sleeper(3), flush=False, rep_ms=60)
    assert [w for w in m.warnings if not w.startswith("noisy")] == []


def test_hang_raises_timeout_instead_of_hanging():
    calls = []

    def hangs_on_third_call():
        calls.append(1)
        if len(calls) >= 3:
            systime.sleep(3600)

    t0 = systime.monotonic()
    with pytest.raises(BenchTimeout, match="did not finish within 1 s"):
        cpu_time(hangs_on_third_call, flush=False, timeout_s=1)
    assert systime.monotonic() - t0 < 10


def test_errors_in_fn_propagate_unchanged():
    def boom():
        raise KeyError("inside fn")

    with pytest.raises(KeyError, match="inside fn"):
        cpu_time(boom, flush=False)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(cuda_graph=True), ValueError, "cuda_graph=True needs a CUDA device"),
    (dict(rotate=[]), ValueError, "rotate"),
])
def test_bad_options_are_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        cpu_time(lambda: None, device="cpu", **kwargs)


def test_fn_must_be_callable():
    with pytest.raises(TypeError, match="fn must be callable"):
        bench.time(42)


def test_measurement_serializes_with_and_without_samples():
    m = cpu_time(sleeper(1), flush=False, rep_ms=15, warn=False)
    d = m.to_dict()
    assert d["median"] == m.median and d["samples_ms"] == m.samples_ms and d["cv"] == m.cv
    assert "samples_ms" not in m.to_dict(samples=False)
    assert "median" in str(m) and "cpu" in str(m)


def test_compare_finds_a_real_speedup():
    c = bench.compare(sleeper(6), sleeper(2), device="cpu", flush=False, rep_ms=60, warn=False)
    assert c.baseline.n >= 20 and c.candidate.n >= 20
    assert 1.5 < c.speedup.low <= c.speedup.ratio <= c.speedup.high < 3.5   # 3x; a busy host oversleeps both
    assert c.speedup.significant and "faster" in c.speedup.verdict
    assert "speedup" in str(c)


def test_compare_refuses_too_few_rounds_for_its_confidence_before_timing():
    calls = []
    with pytest.raises(ValueError, match="rounds must be at least 8 for a 99% interval, got 7"):
        bench.compare(lambda: calls.append(1), lambda: calls.append(1), device="cpu", rounds=7, confidence=0.99)
    assert calls == []
