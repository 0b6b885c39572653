"""Timing a callable the way experts do.

On a CUDA device: CUDA events around every call, warm-up and repetitions set by
time budgets, the L2 cache flushed before each call but outside the timed
window, and optionally the calls captured into one CUDA graph (with an event
pair per call inside it) so that microsecond kernels are timed without launch
overhead. On the CPU: perf_counter around every call, the last-level cache
flushed the same way. The timer's own reading for an empty region (its tare)
is measured once and subtracted from every sample. Every result says how it
was taken and warns when it should not be trusted: the clock dropped, the
samples are noisy, the time is near the timer's own floor, the host could not
issue calls as fast as the GPU ran them, or the work escaped the timed stream.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import statistics
import threading
import time as _time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from roofline import device as _device
from roofline.bench.stats import NOISY_CV, Summary, summarize

# A median within this factor of the timer's floor (the time of an empty timed
# region) is dominated by the timer, not the work.
RESOLUTION_FACTOR = 10
# Issuing a call in more than this share of its measured time makes it launch-bound.
LAUNCH_BOUND = 0.5
# A clock that ends more than this far below where it started has dropped.
CLOCK_DROP = 0.05


class TimingWarning(UserWarning):
    """A measurement was taken, but should not be trusted as it stands."""


class BenchTimeout(TimeoutError):
    """A timed callable did not finish within its time limit."""


@dataclass
class Measurement:
    """Per-call times of one callable, with how they were taken and what to distrust."""

    samples_ms: list[float]
    mode: str  # "cuda-events", "cuda-graph" or "cpu"
    device: str
    flush: str  # what was done to the caches before each call
    warmup_calls: int
    sm_clock_before_mhz: int | None = None
    sm_clock_after_mhz: int | None = None
    wall_ms_per_call: float | None = None  # device-synchronized wall time, the escaped-work check
    host_ms_per_call: float | None = None  # host time to issue a call (median), events mode
    floor_ms: float | None = None  # the timer's own reading for an empty region, subtracted from every sample
    round_sizes: list[int] | None = None  # samples per round, in order, where drawn in turns with others
    warnings: list[str] = field(default_factory=list)

    @functools.cached_property
    def summary(self) -> Summary:
        return summarize(self.samples_ms)

    def __getattr__(self, name: str) -> Any:
        # median, mean, min, max, p10, p90, q1, q3, iqr, std, cv, n come from the summary.
        if name in ("n", "median", "mean", "min", "max", "p10", "p90", "q1", "q3", "iqr", "std", "cv"):
            return getattr(self.summary, name)
        raise AttributeError(name)

    def to_dict(self, samples: bool = True) -> dict:
        d = asdict(self)
        if not samples:
            d.pop("samples_ms")
        s = self.summary
        d.update({k: getattr(s, k) for k in ("n", "median", "mean", "min", "max", "p10", "p90", "q1", "q3", "std")})
        d["iqr"], d["cv"] = s.iqr, s.cv
        return d

    def __str__(self) -> str:
        s = self.summary
        text = (
            f"{_fmt_ms(s.median)} median (p10 {_fmt_ms(s.p10)}, p90 {_fmt_ms(s.p90)}; "
            f"CV {s.cv:.1%}, n={s.n}; {self.mode}, {self.flush})"
        )
        return text + "".join(f"\n  warning: {w}" for w in self.warnings)


def _fmt_ms(ms: float) -> str:
    if ms >= 1:
        return f"{ms:.3f} ms"
    return f"{ms * 1e3:.2f} us"


# --------------------------------------------------------------------------- time limits

@contextlib.contextmanager
def _host_deadline(seconds: float, what: str):
    """Interrupt Python code that runs past `seconds` (main thread only, where signals work)."""
    usable = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if not usable or not math.isfinite(seconds):
        yield
        return

    def expire(signum, frame):
        raise BenchTimeout(f"{what} did not finish within {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _wait_for(event: torch.cuda.Event, seconds: float, what: str) -> None:
    """Wait for GPU work by polling, so a kernel that never ends becomes an error, not a hang."""
    deadline = _time.monotonic() + seconds
    while not event.query():
        if _time.monotonic() > deadline:
            raise BenchTimeout(
                f"{what} did not finish on the GPU within {seconds:g} s; the GPU may still be "
                "running it, and later work on this device will wait for it"
            )
        _time.sleep(1e-4)


# --------------------------------------------------------------------------- cache flushing

@functools.cache
def _flush_buffer(dev: torch.device) -> torch.Tensor:
    """A buffer twice the size of the last-level cache: reading it evicts everything else."""
    d = _device.info(dev)
    cache = d.l2_bytes if d.kind == "cuda" else d.llc_bytes
    nbytes = 2 * (cache or (64 << 20))
    return torch.zeros(nbytes // 4, dtype=torch.float32, device=dev)


def flush_cache(dev=None) -> None:
    """Evict the device's last-level cache (GPU L2, CPU LLC) by reading a buffer twice its size.

    Reading, not writing: a write would leave the cache full of dirty lines, and
    the timed call would then pay for writing them back to memory (measured
    against Nsight Compute: docs/measurement.md). A read evicts the
    previous call's dirty lines here, outside the timed window, and leaves clean ones.
    """
    _flush_buffer(_device.resolve(dev)).sum()


# --------------------------------------------------------------------------- the runner

def _device_of(args_sets: Sequence[tuple], requested) -> torch.device:
    if requested is not None:
        return _device.resolve(requested)
    for args in args_sets:
        for a in args:
            if isinstance(a, torch.Tensor):
                return _device.resolve(a.device)
    return _device.resolve(None)


class _Runner:
    """One callable on one device, prepared for timing: call `sample(n)` as often as needed.

    Samples of several runners can be drawn in turns (compare, sweeps), so slow
    drift of the machine falls on all of them alike.
    """

    def __init__(
        self,
        fn: Callable,
        arg_sets: Sequence[tuple],
        *,
        device,
        flush: bool,
        cuda_graph: bool,
        grad_to_none: Sequence[torch.Tensor] | None,
        timeout_s: float,
        what: str = "fn",
    ):
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        if not arg_sets:
            raise ValueError("rotate must hold at least one tuple of arguments")
        self.fn, self.arg_sets = fn, [tuple(a) for a in arg_sets]
        self.device = _device_of(self.arg_sets, device)
        self.cuda = self.device.type == "cuda"
        if cuda_graph and not self.cuda:
            raise ValueError("cuda_graph=True needs a CUDA device")
        if cuda_graph and grad_to_none:
            raise ValueError(
                "cuda_graph=True cannot be combined with grad_to_none: resetting .grad is host "
                "work that a graph replay would skip; time backward passes with cuda_graph=False"
            )
        self.flush, self.cuda_graph = flush, cuda_graph
        self.grad_to_none = list(grad_to_none or [])
        self.timeout_s, self.what = timeout_s, what
        self.mode = "cpu" if not self.cuda else ("cuda-graph" if cuda_graph else "cuda-events")
        self._next_args = 0
        self.warmup_calls = 0
        self.samples: list[float] = []
        self.round_sizes: list[int] = []   # samples per round, when drawn in turns with other runners
        self._graph = None
        self._graph_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.host_ms: list[float] = []  # host time to issue each call (events mode)
        self.flush_ms = 0.0  # wall time of one flush (measured in the warm-up when flushing)
        self.clock_first_mhz: int | None = None  # SM clock when sampling began
        self.clock_last_mhz: int | None = None  # and when it last ended

    # One call, with what comes before it outside the timed window.
    def _args(self) -> tuple:
        args = self.arg_sets[self._next_args]
        self._next_args = (self._next_args + 1) % len(self.arg_sets)
        return args

    def _prepare_call(self) -> tuple:
        for t in self.grad_to_none:
            t.grad = None
        if self.flush:
            flush_cache(self.device)
        return self._args()

    def _sync(self, seconds: float) -> None:
        if self.cuda:
            done = torch.cuda.Event()
            done.record()
            _wait_for(done, seconds, self.what)

    def _call_budget_s(self, calls: int, per_call_ms: float) -> float:
        # Each call is preceded by its flush, inside the same deadline.
        return max(self.timeout_s, 10 * calls * (per_call_ms + self.flush_ms) / 1e3)

    def _measure_flush(self) -> None:
        """The wall time of one cache flush (ms): outside the timed window, but part of every repetition's cost.
        A CPU with a large last-level cache (480 MiB here) reads ~1 GB per flush."""
        if not self.flush:
            return
        times = []
        for _ in range(3):
            self._sync(self.timeout_s)
            t0 = _time.perf_counter()
            flush_cache(self.device)
            self._sync(self.timeout_s)
            times.append((_time.perf_counter() - t0) * 1e3)
        self.flush_ms = statistics.median(times)

    def warmup(self, warmup_ms: float, min_calls: int) -> float:
        """Run fn until the warm-up budget is spent; return the estimated cost of one repetition (ms): a call and
        its cache flush."""
        if not self.cuda_graph:
            return self._warmup(warmup_ms, min_calls)
        # Graph capture wants lazily initialized state (cuBLAS workspaces, autotuning) made on
        # the stream that captures, so warm up there.
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            estimate = self._warmup(warmup_ms, min_calls)
            self._capture(estimate, side)
        torch.cuda.current_stream(self.device).wait_stream(side)
        return estimate

    def _warmup(self, warmup_ms: float, min_calls: int) -> float:
        self._measure_flush()
        with _host_deadline(self.timeout_s, self.what):
            self.fn(*self._prepare_call())  # compiles, autotunes, allocates
        self._sync(self.timeout_s)
        self.warmup_calls = 1
        estimate = self._estimate()
        calls = max(min_calls, math.ceil(warmup_ms / max(estimate + self.flush_ms, 1e-4)))
        with _host_deadline(self._call_budget_s(calls, estimate), self.what):
            for _ in range(calls):
                self.fn(*self._prepare_call())
        self._sync(self._call_budget_s(calls, estimate))
        self.warmup_calls += calls
        # What one repetition costs, its flush included: the repetition budget (rep_ms) is spent on both.
        return min(estimate, self._estimate()) + self.flush_ms

    def _estimate(self, calls: int = 3) -> float:
        """Median of a few timed calls, in ms, to size the warm-up and the repetitions."""
        times = self._sample_direct(calls, self.timeout_s)
        self.warmup_calls += calls
        return statistics.median_high(times)

    def _sample_direct(self, n: int, seconds: float, record_host: bool = False) -> list[float]:
        if not self.cuda:
            times = []
            with _host_deadline(seconds, self.what):
                for _ in range(n):
                    args = self._prepare_call()
                    t0 = _time.perf_counter()
                    self.fn(*args)
                    times.append((_time.perf_counter() - t0) * 1e3)
            return times
        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        host = []
        with _host_deadline(seconds, self.what):
            for start, end in pairs:
                args = self._prepare_call()
                start.record()
                t0 = _time.perf_counter()
                self.fn(*args)
                host.append((_time.perf_counter() - t0) * 1e3)
                end.record()
        _wait_for(pairs[-1][1], seconds, self.what)
        if record_host:
            self.host_ms += host
        return [start.elapsed_time(end) for start, end in pairs]

    def _capture(self, estimate_ms: float, stream: torch.cuda.Stream) -> None:
        """Capture enough calls into one graph that a replay takes ~20 ms, with timing events around each."""
        calls = int(min(max(20.0 / max(estimate_ms, 1e-3), 1), 256))
        self._graph_events = [
            (torch.cuda.Event(enable_timing=True, external=True), torch.cuda.Event(enable_timing=True, external=True))
            for _ in range(calls)
        ]
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for start, end in self._graph_events:
                args = self._prepare_call()
                start.record()
                self.fn(*args)
                end.record()
        self._graph = graph

    def sample(self, n: int) -> list[float]:
        """Draw n more timed samples (ms per call)."""
        if self.cuda and self.clock_first_mhz is None:
            self.clock_first_mhz = _device.sm_clock_mhz(self.device)
        if self._graph is None:
            times = self._sample_direct(n, self._call_budget_s(n, self._last_estimate()), record_host=True)
        else:
            times = []
            seconds = self._call_budget_s(len(self._graph_events), self._last_estimate())
            while len(times) < n:
                self._graph.replay()
                _wait_for(self._graph_events[-1][1], seconds, self.what)
                times += [start.elapsed_time(end) for start, end in self._graph_events]
            times = times[:n]
        if self.cuda:
            self.clock_last_mhz = _device.sm_clock_mhz(self.device)
        self.samples += times
        return times

    def _last_estimate(self) -> float:
        return statistics.median_high(self.samples) if self.samples else 1.0

    def wall_ms_per_call(self, calls: int = 5) -> float:
        """Shortest wall time of a call with the whole device synchronized around it.

        Unlike events on one stream, this sees work that fn sent to other streams.
        The shortest, because host noise only ever adds time, and escaped work always does.
        """
        times = []
        with _host_deadline(self._call_budget_s(calls, self._last_estimate()), self.what):
            for _ in range(calls):
                args = self._prepare_call()
                torch.cuda.synchronize(self.device)
                t0 = _time.perf_counter()
                self.fn(*args)
                torch.cuda.synchronize(self.device)
                times.append((_time.perf_counter() - t0) * 1e3)
        return min(times)

    def flush_label(self) -> str:
        parts = []
        if self.flush:
            parts.append(f"cache flushed ({_flush_buffer(self.device).numel() * 4 >> 20} MiB read)")
        if len(self.arg_sets) > 1:
            parts.append(f"rotating {len(self.arg_sets)} input sets")
        return ", ".join(parts) or "hot cache (no flush)"


@functools.cache
def _timer_floor_ms(dev: torch.device, mode: str) -> float:
    """The time the timer itself reports for an empty region, in this mode.

    On a GPU the empty regions are queued behind a sleeping kernel, so this is
    the events' own resolution, not the host's speed at recording them (which
    the launch-bound check covers).
    """
    runner = _Runner(lambda: None, [()], device=dev, flush=False, cuda_graph=mode == "cuda-graph",
                     grad_to_none=None, timeout_s=60, what="empty region")
    runner.warmup(warmup_ms=1, min_calls=5)
    if mode == "cuda-events":
        torch.cuda._sleep(20_000_000)  # ~10 ms at 2 GHz: the host queues all 100 pairs meanwhile
    return statistics.median_high(runner.sample(100))


def _diagnose(runner: _Runner, m: Measurement) -> list[str]:
    """Reasons not to trust a measurement as it stands."""
    found = []
    s = m.summary
    if s.cv > NOISY_CV:
        found.append(f"noisy: CV {s.cv:.1%} > {NOISY_CV:.0%}; compare medians with care or time longer")
    if m.floor_ms is not None and s.median < RESOLUTION_FACTOR * m.floor_ms:
        hint = "; use cuda_graph=True" if m.mode == "cuda-events" else ""
        found.append(
            f"short: median {_fmt_ms(s.median)} is within {RESOLUTION_FACTOR}x of the timer's floor "
            f"({_fmt_ms(m.floor_ms)}), so timer overhead dominates{hint}"
        )
    before, after = m.sm_clock_before_mhz, m.sm_clock_after_mhz
    if before and after and after < (1 - CLOCK_DROP) * before:
        found.append(f"clock dropped: SM clock {before} MHz at the start, {after} MHz at the end")
    if runner.cuda:
        reasons = _device.slowdown_reasons(runner.device)
        if reasons:
            found.append("GPU slowed itself down during the run: " + ", ".join(reasons))
    # A GPU-bound call is issued in a small fraction of its GPU time; when issuing it takes
    # the host about as long as the measured time, the GPU was (or could have been) waiting.
    if m.host_ms_per_call is not None and m.host_ms_per_call > LAUNCH_BOUND * s.median:
        found.append(
            f"launch-bound: issuing a call takes the host {_fmt_ms(m.host_ms_per_call)} of the "
            f"{_fmt_ms(s.median)} measured, so host launch gaps may be in the times (and in eager use "
            "the GPU would wait on the host); cuda_graph=True times the GPU alone")
    if m.wall_ms_per_call is not None and m.wall_ms_per_call > 3 * s.median + 0.1:
        found.append(
            f"escaped work: with the device synchronized a call takes {_fmt_ms(m.wall_ms_per_call)}, "
            f"but the timed stream saw {_fmt_ms(s.median)}; fn may run its work on another stream "
            "(or launch nothing at all), so this time is too short to be true"
        )
    return found


def time(
    fn: Callable,
    *args,
    rotate: Sequence[tuple] | None = None,
    flush: bool = True,
    cuda_graph: bool = False,
    grad_to_none: Sequence[torch.Tensor] | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_warmup: int = 3,
    min_reps: int = 10,
    max_reps: int = 10_000,
    device=None,
    timeout_s: float = 60.0,
    warn: bool = True,
) -> Measurement:
    """Time `fn(*args)` and return a Measurement of its per-call time in milliseconds.

    rotate: several argument tuples to cycle through instead of `args`, so that
        inputs do not stay in cache from one call to the next.
    flush: evict the last-level cache before each call (outside the timed window);
        False measures hot-cache behaviour on purpose.
    cuda_graph: capture the calls into a CUDA graph and time replays, for
        microsecond kernels whose launch overhead would otherwise dominate.
    grad_to_none: tensors whose .grad is reset before each call, for timing backward passes.
    warmup_ms, rep_ms: time budgets for warm-up and for timed repetitions;
        min_warmup, min_reps and max_reps bound the counts they give.
    timeout_s: a call that runs longer than this raises BenchTimeout.
    warn: also report the measurement's warnings as TimingWarning on the terminal.
    """
    runner = _Runner(fn, rotate if rotate is not None else [args], device=device, flush=flush,
                     cuda_graph=cuda_graph, grad_to_none=grad_to_none, timeout_s=timeout_s)
    estimate = runner.warmup(warmup_ms, min_warmup)
    runner.sample(repetitions(estimate, rep_ms, min_reps, max_reps))
    return finish(runner, warn)


def finish(runner: _Runner, warn: bool) -> Measurement:
    """Turn a runner's samples into a Measurement, with its checks."""
    floor = _timer_floor_ms(runner.device, runner.mode)
    m = Measurement(
        # The timer's own reading for an empty region is its bias (event nodes, perf_counter
        # calls): subtract it, so back-to-back work adds up. Without it a microsecond kernel in graph mode
        # reads well above Nsight Compute's duration; with it, close to it (measured: benchmarks/results/h100.md).
        samples_ms=[max(t - floor, 1e-6) for t in runner.samples],
        mode=runner.mode,
        device=str(runner.device),
        flush=runner.flush_label(),
        warmup_calls=runner.warmup_calls,
        sm_clock_before_mhz=runner.clock_first_mhz,
        sm_clock_after_mhz=runner.clock_last_mhz,
        floor_ms=floor,
        round_sizes=runner.round_sizes or None,
    )
    if runner.cuda:
        m.wall_ms_per_call = runner.wall_ms_per_call()
    if runner.host_ms:
        m.host_ms_per_call = statistics.median_high(runner.host_ms)
    m.warnings = _diagnose(runner, m)
    if warn:
        for w in m.warnings:
            warnings.warn(f"{runner.what}: {w}", TimingWarning, stacklevel=_user_stacklevel())
    return m


def _user_stacklevel() -> int:
    """The stacklevel that points a warning at the first frame outside roofline."""
    import sys

    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("roofline."):
        frame, level = frame.f_back, level + 1
    return level


def repetitions(estimate_ms: float, rep_ms: float, min_reps: int, max_reps: int) -> int:
    """How many timed calls fit the repetition budget, within the given bounds."""
    return int(min(max(min_reps, math.ceil(rep_ms / max(estimate_ms, 1e-4))), max_reps))


def sample_interleaved(runners: Sequence[_Runner], counts: Sequence[int], rounds: int = 10) -> None:
    """Draw each runner's samples in turns, reversing the order every round (A B, B A, ...): every runner gets
    the same number of rounds (at most `rounds`, at most its count), one block of samples each, and keeps their
    sizes in `round_sizes`.

    Drift of the machine (clocks, temperature, neighbours) then falls on all runners alike instead of on
    whichever ran last, and a comparison can resample whole rounds (stats.speedup_ci's rounds).
    """
    blocks = max(1, min(rounds, *counts))
    order = list(range(len(runners)))
    for block in range(blocks):
        for i in order:
            take = counts[i] // blocks + (1 if block < counts[i] % blocks else 0)
            runners[i].sample(take)
            runners[i].round_sizes.append(take)
        order.reverse()
