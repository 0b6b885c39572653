"""Measured fixes (`roofline profile --verify`): each finding with a concrete replacement, timed against what it
replaces, so that its gain is measured and not only estimated.

The ops a finding names are rebuilt on their recorded shapes and dtypes with fresh random inputs. The replacement
(the same matmul under TF32 or in bf16, scaled_dot_product_attention for matmul + softmax + matmul, the fused
optimizer, the padded matmul, the roofline op, a pinned copy) is first checked against a float64 reference; then
both are timed by bench.compare (interleaved rounds, the sign test's interval). Each case stands for the profiled
ops of its shapes, so its measured gain is their profiled time times (1 - 1/speedup): the estimate's counterpart,
in the same window. A finding's heaviest shapes are measured until they cover COVER of its time (at most
MAX_CASES); the share they cover is stated.

Findings that change the program rather than an op (launch-bound, host-bound, host syncs, elementwise chains,
small grids) have no op to time alone: benchmarks/profile_models.py measures those by running the program with
the advice applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from roofline.device import float32_matmul_precision
from roofline.profiler.costs import ParameterSet

COVER = 0.9        # a finding's heaviest shapes are measured until they hold this share of its time ...
MAX_CASES = 12     # ... or this many were
TOLERANCE = {torch.float32: 1e-4, "tf32": 5e-3, torch.bfloat16: 2e-2, torch.float16: 5e-3}
# attention's outputs and gradients, norm-wise: fused kernels may run fp32 through TF32 tensor cores
ATTENTION_TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}
_DTYPES = {"float": torch.float32, "c10::BFloat16": torch.bfloat16, "c10::Half": torch.float16,
           "double": torch.float64}
_MATMUL_FIRST = {"aten::addmm": 1, "aten::baddbmm": 1, "aten::mm": 0, "aten::bmm": 0, "aten::matmul": 0}


class NoReplacement(Exception):
    """The finding has nothing concrete to time here (the reason is the message)."""


class CheckFailed(Exception):
    """The replacement's result disagrees with the float64 reference."""


@dataclass
class Built:
    """A case's callables on a device: check() runs the candidate once, compares it with a float64 reference and
    says how closely it agreed (or raises CheckFailed); grads are leaves whose .grad is reset between calls."""
    baseline: Callable
    candidate: Callable
    check: Callable[[], str]
    grads: list | None = None


@dataclass
class Case:
    """One shape of a finding's ops: build(device) -> Built."""
    label: str
    us: float                      # profiled time of the ops this case stands for
    build: Callable[[torch.device], Built]


@dataclass
class Measured:
    label: str
    us: float
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    check: str | None = None
    error: str | None = None

    def gain_us(self, speedup: float | None) -> float:
        return self.us * (1.0 - 1.0 / speedup) if speedup else 0.0

    def to_dict(self) -> dict:
        return {"case": self.label, "profiled_ms": self.us / 1e3, "speedup": self.speedup, "low": self.low,
                "high": self.high, "check": self.check, "error": self.error}


@dataclass
class Verification:
    replacement: str               # what was put in the ops' place ("" when nothing was)
    total_us: float = 0.0          # profiled time of all the finding's ops
    cases: list[Measured] = field(default_factory=list)
    reason: str | None = None      # why nothing was measured

    @property
    def measured(self) -> list[Measured]:
        return [c for c in self.cases if c.speedup is not None]

    @property
    def gain_ms(self) -> float | None:
        return sum(c.gain_us(c.speedup) for c in self.measured) / 1e3 if self.measured else None

    @property
    def interval_ms(self) -> tuple[float, float] | None:
        """The gain at every case's low and at every case's high speedup: wider than a joint interval."""
        if not self.measured:
            return None
        return (sum(c.gain_us(c.low) for c in self.measured) / 1e3,
                sum(c.gain_us(c.high) for c in self.measured) / 1e3)

    @property
    def covered_share(self) -> float:
        return sum(c.us for c in self.measured) / self.total_us if self.total_us else 0.0

    def summary(self) -> str:
        if self.gain_ms is None:
            return "not measured: " + (self.reason or "; ".join(c.error for c in self.cases if c.error))
        low, high = self.interval_ms
        ratios = sorted(c.speedup for c in self.measured)
        speedups = (", ".join(f"{x:.2f}x" for x in ratios) if len(ratios) <= 3 else
                    f"{ratios[0]:.2f}x to {ratios[-1]:.2f}x over {len(ratios)} shapes")
        return (f"measured {self.gain_ms:,.2f} ms ({low:,.2f} to {high:,.2f}), speedup {speedups} on "
                f"{self.covered_share:.0%} of the ops' time: {self.replacement}")

    def to_dict(self) -> dict:
        interval = self.interval_ms
        return {"replacement": self.replacement, "gain_ms": self.gain_ms,
                "gain_low_ms": interval[0] if interval else None, "gain_high_ms": interval[1] if interval else None,
                "covered_share": self.covered_share, "profiled_ms": self.total_us / 1e3, "reason": self.reason,
                "cases": [c.to_dict() for c in self.cases]}


# --------------------------------------------------------------------------- inputs and checks

def _dtype(name: str) -> torch.dtype:
    if name not in _DTYPES:
        raise NoReplacement(f"inputs of type {name} are not rebuilt")
    return _DTYPES[name]


def _random(shape, dtype, device, requires_grad: bool = False) -> torch.Tensor:
    return torch.randn(shape, dtype=dtype, device=device, requires_grad=requires_grad)


def _rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    ref = ref.double()
    return ((got.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _agree(pairs, tolerance: float) -> str:
    """Every (got, ref) pair within `tolerance` relative (norm-wise) error; the worst error, as a sentence."""
    worst = max(_rel_error(got, ref) for got, ref in pairs)
    if not worst <= tolerance:
        raise CheckFailed(f"relative error {worst:.2e} against float64, over the tolerance {tolerance:.0e}")
    return f"relative error {worst:.1e} against float64 (tolerance {tolerance:.0e})"


def _shape_text(shapes) -> str:
    return " x ".join(str(list(s)) for s in shapes)


# --------------------------------------------------------------------------- matmuls

def _matmul_args(row) -> tuple[Callable, list, list]:
    """The aten op of a matmul row, and the shapes and dtypes of its tensor arguments (bias first for addmm)."""
    if row.name not in _MATMUL_FIRST:
        raise NoReplacement(f"{row.name} is not rebuilt")
    first = _MATMUL_FIRST[row.name]
    shapes, dtypes = row.shapes[:first + 2], row.dtypes[:first + 2]
    if len(shapes) < first + 2 or not all(isinstance(s, list) and all(isinstance(d, int) for d in s) for s in shapes):
        raise NoReplacement(f"{row.name}'s shapes were not recorded")
    return getattr(torch.ops.aten, row.name.removeprefix("aten::")), shapes, dtypes


def _matmul_case(row, candidate_dtype: torch.dtype | None, pad_to: int | None = None) -> Case:
    """row's matmul in fp32 against: TF32 (candidate_dtype None), the same op in candidate_dtype, or (pad_to) the
    op on dimensions padded to multiples of pad_to, the result sliced back."""
    op, shapes, dtypes = _matmul_args(row)
    first = _MATMUL_FIRST[row.name]
    label = f"{row.name} {_shape_text(shapes)}" + (" (backward)" if row.backward else "")

    def build(device):
        args = [_random(s, _dtype(t), device) for s, t in zip(shapes, dtypes)]
        reference = op(*(a.double() for a in args))
        if pad_to is not None:
            padded = _padded(args, first, pad_to)
            m, n = reference.shape[-2], reference.shape[-1]
            candidate = lambda: op(*padded)[..., :m, :n]  # noqa: E731
            tolerance = TOLERANCE.get(args[first].dtype, 2e-2)
        elif candidate_dtype is None:
            def candidate():
                with float32_matmul_precision("high"):
                    return op(*args)
            tolerance = TOLERANCE["tf32"]
        else:
            cast = [a.to(candidate_dtype) for a in args]
            candidate = lambda: op(*cast)  # noqa: E731
            tolerance = TOLERANCE[candidate_dtype]

        def baseline():
            with float32_matmul_precision("highest"):
                return op(*args)
        return Built(baseline, candidate, lambda: _agree([(candidate(), reference)], tolerance))
    return Case(label, row.us, build)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _padded(args: list, first: int, to: int) -> list:
    """addmm/mm/bmm arguments with M, K and N zero-padded to multiples of `to` (the bias along N and M)."""
    x, w = args[first], args[first + 1]
    m, k, n = x.shape[-2], x.shape[-1], w.shape[-1]
    mp, kp, np_ = _round_up(m, to), _round_up(k, to), _round_up(n, to)
    out = []
    if first:
        bias = args[0]
        pad = [0, np_ - n if bias.shape[-1] == n else 0]
        if bias.dim() >= 2:
            pad += [0, mp - m if bias.shape[-2] == m else 0]
        out.append(torch.nn.functional.pad(bias, pad))
    out.append(torch.nn.functional.pad(x, [0, kp - k, 0, mp - m]))
    out.append(torch.nn.functional.pad(w, [0, np_ - n, 0, kp - k]))
    return out


def _heaviest(rows) -> list:
    """The rows with the most time, until they hold COVER of it (at most MAX_CASES)."""
    rows, total, chosen, held = sorted(rows, key=lambda r: -r.us), sum(r.us for r in rows), [], 0.0
    for r in rows[:MAX_CASES]:
        if held >= COVER * total:
            break
        chosen.append(r)
        held += r.us
    return chosen


def _precision_cases(finding, candidate_dtype: torch.dtype | None) -> list[Case]:
    rows = [r for r in finding.ops if r.name in _MATMUL_FIRST]
    return [_matmul_case(r, candidate_dtype) for r in _heaviest(rows)]


def _tf32(finding, report):
    return "the same matmuls with TF32 on", _precision_cases(finding, None)


def _bf16(finding, report):
    return ("the same matmuls on bf16 inputs (what autocast runs; its casts not counted)",
            _precision_cases(finding, torch.bfloat16))


def _misaligned(finding, report):
    align = finding.evidence.get("pad_to")
    rows = [r for r in finding.ops if r.name in _MATMUL_FIRST]
    if not align or not rows:
        raise NoReplacement("no matmul to pad")
    cases = [_matmul_case(r, None, pad_to=align) for r in rows]
    return f"the same matmul with M, K, N zero-padded to multiples of {align}", cases


# --------------------------------------------------------------------------- attention

def _attention(finding, report):
    e = finding.evidence
    shape, head_dim, dtype_name = e.get("scores_shape"), e.get("head_dim"), e.get("dtype")
    if not shape or not head_dim or dtype_name is None:
        raise NoReplacement("the attention's shapes were not recorded")
    dtype, backward, causal = _dtype(dtype_name), bool(e.get("backward")), bool(e.get("masked"))
    nq, nk = shape[-2], shape[-1]
    q_shape, kv_shape = list(shape[:-1]) + [head_dim], list(shape[:-2]) + [nk, head_dim]
    scale = head_dim ** -0.5
    sdpa = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731

    def build(device):
        q, k, v = (_random(s, dtype, device, requires_grad=backward) for s in (q_shape, kv_shape, kv_shape))
        grad = _random(q_shape, dtype, device)
        # SDPA's is_causal: query i sees keys up to i, aligned at the top left
        hidden = torch.ones(nq, nk, dtype=torch.bool, device=device).triu(1) if causal else None

        def manual(q, k, v):
            scores = q @ k.transpose(-2, -1) * scale
            if hidden is not None:
                scores = scores.masked_fill(hidden, float("-inf"))
            return torch.softmax(scores, dim=-1) @ v

        def run(attend):
            out = attend(q, k, v)
            if backward:
                out.backward(grad)
            return out

        def candidate_results():
            for t in (q, k, v):
                t.grad = None
            out = run(sdpa)
            return [out] + ([q.grad, k.grad, v.grad] if backward else [])

        def check():
            got = [t.detach().clone() for t in candidate_results()]
            q64, k64, v64 = (t.detach().double().requires_grad_(backward) for t in (q, k, v))
            ref = manual(q64, k64, v64)
            refs = [ref]
            if backward:
                ref.backward(grad.double())
                refs += [q64.grad, k64.grad, v64.grad]
            return _agree(list(zip(got, refs)), ATTENTION_TOLERANCE[dtype])
        return Built(lambda: run(manual), lambda: run(sdpa), check,
                     grads=[q, k, v] if backward else None)

    label = (f"attention over {shape} scores, head_dim {head_dim}, {dtype_name}, {'causal' if causal else 'no mask'}"
             + (", forward and backward" if backward else ""))
    us = sum(r.us for r in finding.ops)
    return (f"torch.nn.functional.scaled_dot_product_attention{'(is_causal=True)' if causal else ''}",
            [Case(label, us, build)])


# --------------------------------------------------------------------------- optimizer

def _optimizer(finding, report):
    e = finding.evidence
    shapes = next((r.shapes[0] for r in finding.ops if r.shapes and isinstance(r.shapes[0], list)
                   and r.shapes[0] and all(isinstance(s, list) for s in r.shapes[0])), None)
    label = "the optimizer's step over its parameters as recorded"
    if not shapes:
        known = ParameterSet.from_facts(report.trace.facts)
        if not known:
            raise NoReplacement("the parameters' sizes were not recorded")
        shapes = [[known.numel // known.tensors]] * known.tensors
        label = f"the optimizer's step over {known.tensors} parameters of equal size ({known.numel / 1e6:.1f} M in all)"
    adam = e.get("adam", True)
    make = ((lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-3, **kw)) if adam
            else (lambda ps, **kw: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, **kw)))

    def build(device):
        start = [_random(s, torch.float32, device) for s in shapes]
        grads = [_random(s, torch.float32, device) for s in shapes]

        def optimizer(dtype, **kw):
            params = [torch.nn.Parameter(p.to(dtype).clone()) for p in start]
            for p, g in zip(params, grads):
                p.grad = g.to(dtype)
            return params, make(params, **kw)

        _, base = optimizer(torch.float32, foreach=True)
        cand_params, cand = optimizer(torch.float32, fused=True)

        def check():
            ref_params, ref = optimizer(torch.float64, foreach=False)
            cand.step()
            ref.step()
            deltas = [(c.detach() - s, r.detach() - s.double()) for c, r, s in zip(cand_params, ref_params, start)]
            return _agree(deltas, 1e-3)
        return Built(base.step, cand.step, check)
    us = sum(r.us for r in finding.ops)
    return f"`fused=True` ({'AdamW' if adam else 'SGD'})", [Case(label, us, build)]


# --------------------------------------------------------------------------- roofline ops for slow torch ops

@dataclass(frozen=True)
class _DropIn:
    """A roofline op standing in for an aten op: its public name, which argument is the op's input (1 in a
    backward op, whose argument 0 is the incoming gradient), which scalar holds softmax's dim or GELU's
    approximation, and whether the row is the backward (then the backward alone is timed)."""
    public: str
    x_arg: int = 0
    scalar_arg: int | None = None
    backward: bool = False


_ROOFLINE_OPS = {
    "aten::native_layer_norm": _DropIn("layer_norm"),
    "aten::native_layer_norm_backward": _DropIn("layer_norm", 1, backward=True),
    "aten::_fused_rms_norm": _DropIn("rms_norm"),
    "aten::_fused_rms_norm_backward": _DropIn("rms_norm", 1, backward=True),
    "aten::_softmax": _DropIn("softmax", 0, 1),
    "aten::_softmax_backward_data": _DropIn("softmax", 1, 2, backward=True),
    "aten::_log_softmax": _DropIn("log_softmax", 0, 1),
    "aten::_log_softmax_backward_data": _DropIn("log_softmax", 1, 2, backward=True),
    "aten::gelu": _DropIn("gelu", 0, 1),
    "aten::gelu_backward": _DropIn("gelu", 1, 2, backward=True),
}


def _scalar(row, i: int | None) -> str | None:
    return str(row.scalars[i]).strip("'\"") if i is not None and i < len(row.scalars or []) else None


def _pair(row, drop: _DropIn, x_shape) -> tuple[Callable, Callable, list]:
    """torch's function and roofline's, both f(x, *params), and the params' shapes, for the op in `row`."""
    from roofline import ops

    d = x_shape[-1]
    if drop.public in ("layer_norm", "rms_norm"):
        affine = any(s == [d] for s in row.shapes[drop.x_arg + 1:])   # weight (and layer_norm's bias) were passed
        if drop.public == "layer_norm":
            return ((lambda x, *p: torch.nn.functional.layer_norm(x, (d,), *p)),
                    (lambda x, *p: ops.layer_norm(x, (d,), *p)), [[d], [d]] if affine else [])
        eps = torch.finfo(torch.float32).eps   # roofline's default, torch's for fp32
        return ((lambda x, *p: torch.nn.functional.rms_norm(x, (d,), *p, eps=eps)),
                (lambda x, *p: ops.rms_norm(x, (d,), *p)), [[d]] if affine else [])
    if drop.public == "gelu":
        approximate = _scalar(row, drop.scalar_arg) or "none"
        return ((lambda x: torch.nn.functional.gelu(x, approximate=approximate)),
                (lambda x: ops.gelu(x, approximate=approximate)), [])
    try:
        dim = int(_scalar(row, drop.scalar_arg))
    except (TypeError, ValueError):
        dim = None
    if dim not in (-1, len(x_shape) - 1):
        raise NoReplacement(f"{row.name} here is not over the last dimension, which roofline.ops.{drop.public} serves")
    return (lambda x: getattr(torch, drop.public)(x, -1)), (lambda x: getattr(ops, drop.public)(x, -1)), []


def _drop_in_case(row, drop: _DropIn) -> Case:
    if len(row.shapes) <= drop.x_arg or not isinstance(row.shapes[drop.x_arg], list) or not row.shapes[drop.x_arg]:
        raise NoReplacement(f"{row.name}'s input shape was not recorded")
    x_shape, dtype = row.shapes[drop.x_arg], _dtype(row.dtypes[drop.x_arg])
    theirs, ours, param_shapes = _pair(row, drop, x_shape)
    tolerance = TOLERANCE.get(dtype, 2e-2)

    def build(device):
        inputs = [_random(s, dtype, device, requires_grad=drop.backward) for s in [x_shape, *param_shapes]]
        if not drop.backward:
            return Built(lambda: theirs(*inputs), lambda: ours(*inputs),
                         lambda: _agree([(ours(*inputs), theirs(*(t.double() for t in inputs)))], tolerance))
        # the backward alone: each side's forward once, its graph kept and walked again on every call
        grad = _random(x_shape, dtype, device)
        outputs = theirs(*inputs), ours(*inputs)
        backward = [lambda out=out: torch.autograd.grad(out, inputs, grad, retain_graph=True) for out in outputs]

        def check():
            ref_inputs = [t.detach().double().requires_grad_() for t in inputs]
            ref = torch.autograd.grad(theirs(*ref_inputs), ref_inputs, grad.double())
            return _agree(list(zip(backward[1](), ref)), tolerance)
        return Built(backward[0], backward[1], check)
    return Case(f"{row.name} {x_shape} {row.dtypes[drop.x_arg]}", row.us, build)


def _roofline_op(finding, report):
    row = finding.ops[0] if finding.ops else None
    if row is None or row.name not in _ROOFLINE_OPS:
        raise NoReplacement(f"roofline.ops has no drop-in for {row.name if row else 'this op'}")
    drop = _ROOFLINE_OPS[row.name]
    what = f"roofline.ops.{drop.public}" + (" (its backward, timed alone)" if drop.backward else "")
    return what, [_drop_in_case(row, drop)]


# --------------------------------------------------------------------------- host copies

def _pinned_copy(finding, report):
    e = finding.evidence
    direction, copies, nbytes = e.get("direction"), e.get("copies"), e.get("bytes")
    if direction not in ("HtoD", "DtoH") or not copies or not nbytes:
        raise NoReplacement("the copies' direction and sizes were not recorded")
    size = nbytes // copies

    def build(device):
        if device.type != "cuda":
            raise NoReplacement("host-device copies need a GPU")
        data = torch.randint(0, 255, (size,), dtype=torch.uint8)
        pinned = data.pin_memory()
        if direction == "HtoD":
            base = lambda: data.to(device)  # noqa: E731
            cand = lambda: pinned.to(device, non_blocking=True)  # noqa: E731
            return Built(base, cand, lambda: _exact(cand().cpu(), data))
        on_gpu = data.to(device)
        return Built(lambda: on_gpu.to("cpu"), lambda: pinned.copy_(on_gpu, non_blocking=True),
                     lambda: _exact(_synced(pinned.copy_(on_gpu, non_blocking=True)), data))
    return "pinned host memory, copied with non_blocking=True", [
        Case(f"{copies} copies of {size / 1e6:.1f} MB, {direction}", e["ms"] * 1e3, build)]


def _synced(t: torch.Tensor) -> torch.Tensor:
    torch.cuda.synchronize()
    return t


def _exact(got: torch.Tensor, want: torch.Tensor) -> str:
    if not torch.equal(got, want):
        raise CheckFailed("the copy's bytes differ")
    return "bytes identical"


REPLACEMENTS = {
    "fp32-matmul-no-tf32": _tf32,
    "no-autocast": _bf16,
    "manual-attention": _attention,
    "unfused-optimizer": _optimizer,
    "misaligned-matmul": _misaligned,
    "below-roofline": _roofline_op,
    "pageable-copy": _pinned_copy,
}
PROGRAM_LEVEL = ("launch-bound", "host-bound", "host-sync-in-loop", "eager-elementwise-chain", "small-grid")


# --------------------------------------------------------------------------- running

def verify_finding(finding, report, device: torch.device, rounds: int = 12, rep_ms: float = 50.0) -> Verification:
    from roofline.bench import compare

    if finding.id in PROGRAM_LEVEL:
        return Verification("", reason="a change to the program, not to an op: measured by running the program "
                                       "with the advice applied (benchmarks/profile_models.py)")
    if finding.id not in REPLACEMENTS:
        return Verification("", reason="no replacement to time")
    try:
        replacement, cases = REPLACEMENTS[finding.id](finding, report)
    except NoReplacement as exc:
        return Verification("", total_us=sum(r.us for r in finding.ops), reason=str(exc))
    total = sum(r.us for r in finding.ops) or sum(c.us for c in cases)
    result = Verification(replacement, total_us=total)
    for case in cases:
        m = Measured(case.label, case.us)
        result.cases.append(m)
        try:
            built = case.build(device)
            m.check = built.check()
            c = compare(built.baseline, built.candidate, rounds=rounds, rep_ms=rep_ms, device=device,
                        grad_to_none=built.grads, warn=False)
            m.speedup, m.low, m.high = c.speedup.ratio, c.speedup.low, c.speedup.high
        except (NoReplacement, CheckFailed) as exc:
            m.error = str(exc)
        except (RuntimeError, ValueError) as exc:   # a kernel that refused the shape, memory that ran out
            m.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        finally:
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return result


def verify(report, device=None, rounds: int = 12, rep_ms: float = 50.0, progress: Callable | None = None) -> None:
    """Measure every finding of the report that has a replacement; sets finding.verified."""
    if device is None:
        if report.attribution.device == "cuda" and not torch.cuda.is_available():
            for f in report.findings:
                f.verified = Verification("", reason="the trace ran on a GPU, and none is here")
            return
        device = "cuda" if report.attribution.device == "cuda" else "cpu"
    device = torch.device(device)
    for f in report.findings:
        if progress:
            progress(f)
        f.verified = verify_finding(f, report, device, rounds=rounds, rep_ms=rep_ms)
