"""Sweeps: sizes x providers (implementations), checked for correctness, then timed side by side.

At every size each provider first runs on two sets of fresh random inputs and
is compared with the baseline provider, with the memory it will allocate its
output from poisoned (NaN) beforehand: an unwritten element, a result that does
not depend on the input, or a wrong value marks the provider failed at that
size, with the reason, and the sweep goes on. Providers that pass are then
timed in turns, so that drift of the machine falls on all of them alike.
"""

from __future__ import annotations

import math
import time as _time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from roofline import device as _device
from roofline.bench.stats import speedup_ci
from roofline.bench.timer import (
    BenchTimeout,
    Measurement,
    _host_deadline,
    _Runner,
    finish,
    repetitions,
    sample_interleaved,
)


class Skip(Exception):
    """Raised by a provider (or an inputs function) that cannot run here; the message says why."""


@dataclass
class Provider:
    """One implementation in a sweep. `skip`, when set, is why it cannot run on this machine."""

    name: str
    fn: Callable
    skip: str | None = None


# rtol, atol for comparing two implementations' outputs, by output dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1e-2),
}


@dataclass
class Sweep:
    """A benchmark over sizes and providers.

    inputs(x, device) returns a tuple of fresh random inputs for size x; each provider is
    called as provider(*inputs) and returns its output (a tensor or a tuple of tensors).
    bytes(x, *inputs) and flops(x, *inputs), when given, turn times into GB/s, TFLOP/s
    and a percentage of the device's measured roofline.

    Each provider's output is checked before it is timed: against the baseline's, or, when
    `reference(*inputs)` is given, against what that returns, computed in higher precision (float64, say):
    then the baseline is checked too, and the outputs are compared in float64 whatever their dtype, with
    the tolerance of the provider's output dtype (or rtol, atol). With atol_per_rms, atol counts in units of
    each expected output's root-mean-square: for outputs summed over many terms (a weight's gradient over
    10^5 rows), whose rounding grows with their size.
    """

    name: str
    x_name: str
    x_values: Sequence[Any]
    inputs: Callable[..., tuple]
    providers: Sequence[Provider]
    baseline: str | None = None
    bytes: Callable[..., int] | None = None
    flops: Callable[..., int] | None = None
    rtol: float | None = None
    atol: float | None = None
    description: str = ""
    reference: Callable[..., Any] | None = None
    atol_per_rms: bool = False

    def __post_init__(self):
        if isinstance(self.providers, dict):
            self.providers = [Provider(name, fn) for name, fn in self.providers.items()]
        self.providers = list(self.providers)
        if not self.providers:
            raise ValueError("providers must name at least one provider")
        names = [p.name for p in self.providers]
        if len(set(names)) != len(names):
            raise ValueError(f"provider names must be unique, got {names}")
        if self.baseline is None:
            self.baseline = names[0]
        if self.baseline not in names:
            raise ValueError(f"baseline={self.baseline!r} is not one of the providers {names}")
        if not list(self.x_values):
            raise ValueError("x_values must hold at least one value")

    def run(self, **options) -> "SweepResult":
        """Run the sweep; see `run_sweep` for the options."""
        return run_sweep(self, **options)


@dataclass
class Row:
    x: Any
    provider: str
    status: str  # "ok", "failed" or "skipped"
    reason: str = ""
    measurement: Measurement | None = None
    dtype: str | None = None  # of the first floating-point input: which matrix ceiling applies
    bytes: int | None = None
    flops: int | None = None
    gbps: float | None = None
    tflops: float | None = None
    pct_of_roofline: float | None = None
    speedup: float | None = None  # over the baseline provider, ratio of medians
    speedup_low: float | None = None
    speedup_high: float | None = None

    @property
    def median_ms(self) -> float | None:
        return self.measurement.median if self.measurement else None

    def to_dict(self, samples: bool = False) -> dict:
        d = {k: getattr(self, k) for k in (
            "x", "provider", "status", "reason", "median_ms", "dtype", "bytes", "flops", "gbps", "tflops",
            "pct_of_roofline", "speedup", "speedup_low", "speedup_high")}
        if self.measurement is not None:
            m = self.measurement.to_dict(samples=samples)
            d["timing"] = {k: m[k] for k in m if k not in ("device",)}
        return d


@dataclass
class SweepResult:
    name: str
    x_name: str
    baseline: str
    providers: list[str]
    device: dict
    ceilings: dict
    options: dict
    rows: list[Row] = field(default_factory=list)
    started_at: str = ""
    seconds: float = 0.0
    description: str = ""

    def row(self, x, provider: str) -> Row:
        for r in self.rows:
            if r.x == x and r.provider == provider:
                return r
        raise KeyError((x, provider))


# --------------------------------------------------------------------------- correctness guard

def _tensors(out) -> list[torch.Tensor] | None:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and out and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    return None


def _mismatch(out, ref, rtol: float | None, atol: float | None, against: str = "the baseline",
              atol_per_rms: bool = False) -> str | None:
    """Why out is not ref (within tolerance), or None when it is. Against a higher-precision reference
    (against="the reference") the dtypes may differ and the values are compared in float64. atol_per_rms:
    atol is in units of each ref output's root-mean-square."""
    reference = against == "the reference"
    if out is None:
        return "returned nothing (None); a provider must return its output"
    outs, refs = _tensors(out), _tensors(ref)
    if outs is None:
        return f"returned {type(out).__name__}, expected a tensor or a tuple of tensors"
    if len(outs) != len(refs):
        return f"returned {len(outs)} tensors, the baseline {len(refs)}"
    for i, (o, r) in enumerate(zip(outs, refs)):
        where = f"output {i}: " if len(outs) > 1 else ""
        if o.shape != r.shape:
            return f"{where}shape {tuple(o.shape)}, expected {tuple(r.shape)}"
        if o.dtype != r.dtype and not (reference and o.is_floating_point() and r.is_floating_point()):
            return f"{where}dtype {o.dtype}, expected {r.dtype}"
        if o.device != r.device:
            return f"{where}on {o.device}, expected {r.device}"
        if not o.is_floating_point():
            bad = o != r
            tol = "exact"
        else:
            rt, at = TOLERANCES.get(o.dtype, (1e-5, 1e-5))
            rt, at = rtol if rtol is not None else rt, atol if atol is not None else at
            wide = torch.float64 if reference else torch.float32
            r_wide = r.to(wide)
            if atol_per_rms:
                finite = r_wide[torch.isfinite(r_wide)]
                at = at * max(float(finite.square().mean().sqrt()) if finite.numel() else 0.0, 1.0)
            bad = ~torch.isclose(o.to(wide), r_wide, rtol=rt, atol=at, equal_nan=True)
            tol = f"rtol={rt:g}, atol={at:g}"
        count = int(bad.sum())
        if count:
            nan = int((torch.isnan(o) & ~torch.isnan(r)).sum()) if o.is_floating_point() else 0
            first = tuple(int(v) for v in torch.nonzero(bad)[0])
            detail = f"; {nan} are NaN (unwritten?)" if nan else ""
            return (f"{where}{count} of {o.numel()} elements differ from {against} ({tol}){detail}; "
                    f"first at index {first}: {o[first].item():.6g} vs {r[first].item():.6g}")
    return None


def _poison(ref, dev: torch.device) -> None:
    """Fill memory the allocator will hand out next for an output like `ref` with NaN bytes.

    The CUDA caching allocator returns a freed block to the next request of the
    same size, so a provider that allocates its output and leaves elements
    unwritten leaves NaN there (0xFF bytes are NaN in every float format).
    """
    for t in _tensors(ref) or []:
        block = torch.empty(max(t.untyped_storage().nbytes(), 1), dtype=torch.uint8, device=dev)
        block.fill_(0xFF)
        del block


def _describe(exc: BaseException) -> str:
    if isinstance(exc, torch.OutOfMemoryError):
        return "out of memory: " + str(exc).split("\n")[0][:200]
    if isinstance(exc, BenchTimeout):
        return "timed out: " + str(exc)
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" ({frame.filename.rsplit('/', 1)[-1]}:{frame.lineno})" if frame else ""
    return f"raised {type(exc).__name__}: {str(exc)[:300]}{where}"


def _free(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------- running

def _call(fn, args, timeout_s, dev):
    with _host_deadline(timeout_s, "provider"):
        out = fn(*args)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    return out


def _metrics(row: Row, sweep: Sweep, x, inputs, ceil: _device.Ceilings) -> None:
    m = row.measurement
    seconds = m.median * 1e-3
    roofline_s = 0.0
    if sweep.bytes is not None:
        row.bytes = int(sweep.bytes(x, *inputs))
        row.gbps = row.bytes / seconds / 1e9
        if ceil.dram_gbps:
            roofline_s = max(roofline_s, row.bytes / (ceil.dram_gbps * 1e9))
    dtype = next((a.dtype for a in inputs if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
    row.dtype = str(dtype).removeprefix("torch.") if dtype is not None else None
    if sweep.flops is not None:
        row.flops = int(sweep.flops(x, *inputs))
        row.tflops = row.flops / seconds / 1e12
        peak = ceil.tflops(dtype) if dtype is not None else None
        if peak:
            roofline_s = max(roofline_s, row.flops / (peak * 1e12))
    if roofline_s > 0:
        row.pct_of_roofline = 100 * roofline_s / seconds


def run_sweep(
    sweep: Sweep,
    *,
    device=None,
    flush: bool = True,
    cuda_graph: bool = False,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 10,
    max_reps: int = 5_000,
    rounds: int = 5,
    timeout_s: float = 60.0,
    x_values: Sequence[Any] | None = None,
    progress: bool = True,
    console=None,
) -> SweepResult:
    """Check, then time, every provider at every size; a provider's failure never stops the sweep."""
    from rich.progress import Progress

    dev = _device.resolve(device)
    xs = list(x_values if x_values is not None else sweep.x_values)
    ceil = _device.ceilings(dev)
    result = SweepResult(
        name=sweep.name, x_name=sweep.x_name, baseline=sweep.baseline,
        providers=[p.name for p in sweep.providers], device=_device.info(dev).to_dict(),
        ceilings=ceil.to_dict(), description=sweep.description,
        options=dict(flush=flush, cuda_graph=cuda_graph, warmup_ms=warmup_ms, rep_ms=rep_ms,
                     min_reps=min_reps, max_reps=max_reps, rounds=rounds),
        started_at=_time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    t0 = _time.perf_counter()
    with Progress(console=console, transient=True, disable=not progress) as bar:
        task = bar.add_task(sweep.name, total=len(xs))
        for x in xs:
            bar.update(task, description=f"{sweep.name}: {sweep.x_name}={x}")
            result.rows += _run_size(sweep, x, dev, ceil, flush=flush, cuda_graph=cuda_graph,
                                     warmup_ms=warmup_ms, rep_ms=rep_ms, min_reps=min_reps,
                                     max_reps=max_reps, rounds=rounds, timeout_s=timeout_s)
            _free(dev)
            bar.advance(task)
    result.seconds = _time.perf_counter() - t0
    return result


def _run_size(sweep: Sweep, x, dev, ceil, *, flush, cuda_graph, warmup_ms, rep_ms, min_reps,
              max_reps, rounds, timeout_s) -> list[Row]:
    rows = {p.name: Row(x, p.name, "pending") for p in sweep.providers}
    for p in sweep.providers:
        if p.skip:
            rows[p.name].status, rows[p.name].reason = "skipped", p.skip

    def fail_all(status: str, reason: str) -> list[Row]:
        for r in rows.values():
            if r.status == "pending":
                r.status, r.reason = status, reason
        return list(rows.values())

    # Two independent sets of fresh inputs, and the baseline's answers on them.
    try:
        sets = [tuple(sweep.inputs(x, dev)) for _ in range(2)]
        base = next(p for p in sweep.providers if p.name == sweep.baseline)
        if base.skip:
            return fail_all("skipped", f"baseline {base.name!r} cannot run: {base.skip}")
        refs = [_call(sweep.reference or base.fn, s, timeout_s, dev) for s in sets]
    except Skip as exc:
        return fail_all("skipped", str(exc))
    except Exception as exc:  # noqa: BLE001 - any failure here is reported in the rows
        source = "reference" if sweep.reference else f"baseline {sweep.baseline!r}"
        return fail_all("failed", f"inputs or {source}: {_describe(exc)}")
    if _tensors(refs[0]) is None:
        source = "reference" if sweep.reference else f"baseline {sweep.baseline!r}"
        return fail_all("failed", f"{source} {_mismatch(refs[0], refs[0], None, None)}")
    against = "the reference" if sweep.reference else "the baseline"

    for p in sweep.providers:
        row = rows[p.name]
        if row.status != "pending":
            continue
        try:
            outs = []
            for s, ref in zip(sets, refs):
                _poison(ref, dev)
                out = _call(p.fn, s, timeout_s, dev)
                reason = _mismatch(out, ref, sweep.rtol, sweep.atol, against, sweep.atol_per_rms)
                if reason is None and any(out is o for o in outs):
                    reason = "returned the same object for different inputs (a cached result?)"
                if reason:
                    row.status, row.reason = "failed", reason
                    break
                outs.append(out)
            del outs
        except Skip as exc:
            row.status, row.reason = "skipped", str(exc)
        except Exception as exc:  # noqa: BLE001
            row.status, row.reason = "failed", _describe(exc)
    del refs
    _free(dev)

    # Time every provider that passed, in turns.
    ready = [rows[p.name] for p in sweep.providers if rows[p.name].status == "pending"]
    runners, counts = [], []
    for row in ready:
        fn = next(p.fn for p in sweep.providers if p.name == row.provider)
        try:
            runner = _Runner(fn, [sets[0]], device=dev, flush=flush, cuda_graph=cuda_graph,
                             grad_to_none=None, timeout_s=timeout_s, what=row.provider)
            counts.append(repetitions(runner.warmup(warmup_ms, 3), rep_ms, min_reps, max_reps))
            runners.append((row, runner))
        except Exception as exc:  # noqa: BLE001
            row.status, row.reason = "failed", _describe(exc)
            _free(dev)
    try:
        sample_interleaved([r for _, r in runners], counts, rounds)
    except Exception:  # noqa: BLE001 - one provider failed mid-sampling: find it, finish the rest alone
        _retime_alone(runners, counts)
    for row, runner in runners:
        if row.status != "pending":
            continue
        try:
            row.measurement = finish(runner, warn=False)
            row.status = "ok"
            _metrics(row, sweep, x, sets[0], ceil)
        except Exception as exc:  # noqa: BLE001
            row.status, row.reason = "failed", _describe(exc)

    base_row = rows[sweep.baseline]
    for row in rows.values():
        if row.status == "ok" and base_row.status == "ok":
            s = speedup_ci(base_row.measurement.samples_ms, row.measurement.samples_ms, resamples=1000)
            row.speedup, row.speedup_low, row.speedup_high = s.ratio, s.low, s.high
    return list(rows.values())


def _retime_alone(runners, counts) -> None:
    """After a failure while sampling in turns, find who failed and finish the others one by one."""
    for (row, runner), count in zip(runners, counts):
        missing = count - len(runner.samples)
        if missing <= 0:
            continue
        try:
            runner.sample(missing)
        except Exception as exc:  # noqa: BLE001
            row.status, row.reason = "failed", _describe(exc)


def geometric_sizes(start: int, stop: int, factor: int = 2) -> list[int]:
    """start, start*factor, ... up to and including stop."""
    if start < 1 or stop < start or factor < 2:
        raise ValueError(f"need 1 <= start <= stop and factor >= 2, got {start}, {stop}, {factor}")
    return [start * factor**k for k in range(int(math.log(stop / start, factor) + 1e-9) + 1)]
