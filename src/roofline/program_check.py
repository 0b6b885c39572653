"""patch's routes judged by the program they run in, not by their calls alone.

The Router decides each call signature by timing roofline's call against torch's in a loop, with a fixed charge
for what a routed call costs more in a program. A loop cannot say what a call costs among the program's other
calls (colder caches, a host-bound decode step's every microsecond), so the decisions can be wrong both ways:
transformers' Llama decoded slower patched than unpatched on one machine and much faster on another. Here the
program itself is the measurement.

Once the routes' decisions are made and the program is in its steady state (QUIET forwards of the model in a row
with no signature measured: a measurement takes milliseconds of the program's time), each op that roofline serves
somewhere (layer_norm, swiglu, attention, ...) is put on trial: its routed calls are served as decided (on) and by
torch (off) in alternating blocks of BLOCK forwards, ROUNDS rounds, the order reversed every other round so that a
drift of the machine falls on both. A forward's time is the interval from its start to the next forward's start, by
CUDA events on the current stream where CUDA runs (no synchronization: host time shows wherever the GPU waits for
it) and by perf_counter elsewhere, so a training step's backward and optimizer count with its forward; an interval
far from the others held more than a step and is left out, as is a forward that served some signature from a side
for the first time in the process (its one-time costs: Triton's compilation, torch's plans for a new shape; a decode
step through a growing cache meets a new length every step, which a steady program meets once). A trial left without
enough steady forwards that way is not counted against the op, up to COLD_TRIES times: it is tried again once the
program is quiet. Each round gives the ratio of its medians (off / on); the verdict is their median with the sign
test's 95% interval over rounds. The op keeps its routes only where the whole interval is above 1 (faster in this
program); otherwise its routed signatures go back to torch, the routes settle and cost nothing, and the report says
so with the figures. Verdicts are cached per device and software, the model's class and parameters, and the op's
routed signatures: a later run of the same program applies them at once.
"""

from __future__ import annotations

import dataclasses
import hashlib
import statistics
import time

import torch

from roofline.bench.stats import median_ci

ROUNDS = 9    # rounds of a trial: the 95% sign-test interval then leaves out the lowest and the highest ratio
VALID = 6     # rounds a verdict needs (the fewest that give a 95% interval), once rounds with no step are dropped
BLOCK = 2     # forwards a side serves in a row: a program that calls its model twice a step gets one of each
QUIET = 2     # forwards in a row with no signature measured before a trial starts
TRIES = 2     # trials an op gets before an unsteady program's op goes back to torch, unjudged
COLD_TRIES = 8   # trials more, not counted, while the program still meets new signatures (see _step)
NOT_A_STEP = 3.0   # an interval this many times its side's median, or its inverse, held something else than a step
CACHE = "program_checks.json"


@dataclasses.dataclass
class Verdict:
    op: str
    kept: bool
    speedup: float                # the patched program's speed over the unpatched one's, for this op's routes
    low: float
    high: float
    on_ms: float                  # the median forward-to-forward time with the op's routes as decided ...
    off_ms: float                 # ... and with torch serving them
    rounds: int
    cached: bool = False

    def __str__(self) -> str:
        if not self.rounds:
            return (f"{self.op}: taken back: the program's steps varied too much, or kept meeting new shapes, in "
                    f"{TRIES} trials (and up to {COLD_TRIES} more while it met them), to show it "
                    "faster")
        said = (f"{self.op}: {'kept' if self.kept else 'taken back'}: in this program a step took {self.on_ms:.3f} "
                f"ms with roofline's {self.op} and {self.off_ms:.3f} ms with torch's, {self.speedup:.3f}x "
                f"(95% interval {self.low:.3f}-{self.high:.3f}, {self.rounds} rounds)")
        return said + (" (judged by an earlier run)" if self.cached else "")


class _Clock:
    """Marks at forward starts: CUDA events on the current stream of the model's GPU, or perf_counter (ms)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self):
        if not self.cuda:
            return time.perf_counter() * 1e3
        event = torch.cuda.Event(enable_timing=True)
        event.record(torch.cuda.current_stream(self.device))
        return event

    def ready(self, mark) -> bool:
        return not self.cuda or mark.query()

    def between(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else end - start


class _Trial:
    """One op's A/B: which side each forward is served by, and the marks at their starts."""

    def __init__(self, op: str, clock: _Clock, router):
        self.op, self.clock, self.router = op, clock, router
        self.forwards = 0
        # (routed as decided, mark, the router's first calls so far), one a forward, and a last mark
        self.marks: list[tuple[bool, object, int]] = []

    @property
    def total(self) -> int:
        return 2 * BLOCK * ROUNDS

    def side(self, forward: int) -> bool:
        """Whether forward number `forward` is served as decided (True) or by torch; rounds alternate the order."""
        block, round_ = forward // BLOCK, forward // (2 * BLOCK)
        return (block % 2 == 0) != (round_ % 2 == 1)

    def mark(self, on: bool) -> None:
        self.marks.append((on, self.clock.mark(), self.router.first_calls))

    def ready(self) -> bool:
        """Whether every interval's end has been reached (by the GPU, where CUDA events mark them)."""
        return self.clock.ready(self.marks[-1][1])

    def cold(self) -> int:
        """Forwards that served a signature from a side for the first time."""
        return sum(b[2] != a[2] for a, b in zip(self.marks, self.marks[1:]))

    def verdict(self, cold_too: bool = False) -> Verdict | None:
        """The verdict over the rounds that held a step on each side, or None where fewer than VALID did.

        An interval far from its side's median (NOT_A_STEP) held something else than a step of the program (the
        program's other work between two forwards: an evaluation, another model's turn in a benchmark, a prefill
        among decode steps) and is left out, as is one that served a signature from a side for the first time; a
        round left without an interval on either side is dropped."""
        times = [(on, self.clock.between(a, b) if first == then or cold_too else None)
                 for (on, a, first), (_, b, then) in zip(self.marks, self.marks[1:])]
        steady = {side: [t for s, t in times if s == side and t is not None] for side in (True, False)}
        if not (steady[True] and steady[False]):
            return None
        typical = {side: statistics.median(steady[side]) for side in (True, False)}
        ratios, on_all, off_all = [], [], []
        for r in range(ROUNDS):
            chunk = [(side, t) for side, t in times[r * 2 * BLOCK:(r + 1) * 2 * BLOCK]
                     if t is not None and typical[side] / NOT_A_STEP <= t <= typical[side] * NOT_A_STEP]
            on = [t for side, t in chunk if side]
            off = [t for side, t in chunk if not side]
            if on and off:
                ratios.append(statistics.median(off) / statistics.median(on))
                on_all += on
                off_all += off
        if len(ratios) < VALID:
            return None
        low, speedup, high = median_ci(ratios)
        return Verdict(self.op, low > 1.0, speedup, low, high, statistics.median(on_all), statistics.median(off_all),
                       len(ratios))


class ProgramCheck:
    """Puts a patched model's ops on trial in its own forwards (see the module's docstring); installed by patch as
    a forward pre-hook on the model. verdicts: op -> Verdict, once judged."""

    def __init__(self, router, routes: list, persist: bool = True):
        self.router, self.routes, self.persist = router, routes, persist
        self.model_key: str | None = None   # taken at the first trial: the model as it runs (int8 weights, say)
        self.verdicts: dict[str, Verdict] = {}
        self.trial: _Trial | None = None
        self.tries: dict[str, int] = {}   # trials run to their end, by op
        self.cold_tries: dict[str, int] = {}   # trials not counted: new signatures cost them their verdict
        self._measured = -1     # the router's count of measurements at the last forward
        self._quiet = 0
        self._scanned = -1      # the router's count of decisions when every routed op was last found judged
        self.device = torch.device("cpu")   # the model's, taken at its first trial

    def pending(self) -> bool:
        """Whether an op roofline serves is still to be judged (a trial runs, or one is yet to start)."""
        return self.trial is not None or bool(self.unjudged())

    def unjudged(self) -> list[str]:
        """The ops roofline serves somewhere that have no verdict yet."""
        return [op for op in self._routed_ops() if op not in self.verdicts]

    def __call__(self, module, args) -> None:
        if torch.compiler.is_compiling() or _capturing():
            return
        trial = self.trial
        if trial is not None:
            self._step(trial)
            return
        measured = self.router.measurements
        self._quiet = self._quiet + 1 if measured == self._measured else 0
        self._measured = measured
        decided = len(self.router.decisions)
        if self._quiet >= QUIET and decided != self._scanned:   # a forward costs this much once all is judged
            op = next((op for op in self._routed_ops() if op not in self.verdicts), None)
            if op is None:
                self._scanned = decided
                return
            self.model_key = self.model_key or _model_key(module)
            self.device = next((p.device for p in module.parameters()), torch.device("cpu"))
            self._judge(op)

    def _routed_ops(self) -> list[str]:
        """The ops roofline serves some signature of, in the order first decided."""
        return list(dict.fromkeys(key[0] for key, d in self.router.decisions.items() if d.ours and d.signature))

    def _cache_key(self, op: str) -> str:
        """What a verdict holds for: the device and software, the model, the op and its routed signatures."""
        from roofline.device import cache_key
        from roofline.routing import kernel_settings

        signatures = sorted(d.signature for key, d in self.router.decisions.items()
                            if key[0] == op and d.ours and d.signature)
        settings = kernel_settings()
        return "|".join([cache_key(self.device), self.model_key, op, *signatures, *([settings] if settings else [])])

    def _judge(self, op: str) -> None:
        """Apply a cached verdict, or start a trial (timed by CUDA events where the model's work is on a GPU)."""
        if self.persist:
            from roofline.device import read_cache

            cached = read_cache(CACHE).get(self._cache_key(op))
            if cached is not None:
                self._conclude(Verdict(**{**cached, "cached": True}), store=False)
                return
        self.trial = _Trial(op, _Clock(self.device), self.router)
        self._step(self.trial)

    def _step(self, trial: _Trial) -> None:
        """A forward starts during the trial: mark it, and serve it from the side its block is on."""
        if self.router.measurements != self._measured:   # a signature was measured mid-trial: start again later
            self.router.held_back.discard(trial.op)
            self.trial, self._measured, self._quiet = None, self.router.measurements, 0
            return
        if trial.forwards < trial.total:
            on = trial.side(trial.forwards)
            trial.mark(on)
            (self.router.held_back.discard if on else self.router.held_back.add)(trial.op)
            trial.forwards += 1
            return
        if len(trial.marks) == trial.total:   # the last forward's end: this forward's start
            trial.mark(True)
            self.router.held_back.discard(trial.op)
        if not trial.ready():
            return
        self.trial = None
        found = trial.verdict()
        if (found is None and trial.cold() and self.cold_tries.get(trial.op, 0) < COLD_TRIES
                and trial.verdict(cold_too=True) is not None):
            # the forwards that met new signatures are what left it without a verdict: the program is not steady
            # yet, which is not the op's fault; a program that never repeats its shapes ends as an unsteady one
            self.cold_tries[trial.op] = self.cold_tries.get(trial.op, 0) + 1
            self._quiet = 0
            return
        self.tries[trial.op] = self.tries.get(trial.op, 0) + 1   # trials run to their end
        if found is not None:
            self._conclude(found, store=True)
        elif self.tries[trial.op] >= TRIES:   # no steady steps to compare, twice: not shown faster
            self._conclude(Verdict(trial.op, False, float("nan"), float("nan"), float("nan"), float("nan"),
                                   float("nan"), 0), store=False)
        else:
            self._quiet = 0   # judged again once the program is quiet

    def _conclude(self, verdict: Verdict, store: bool) -> None:
        self.verdicts[verdict.op] = verdict
        if store and self.persist:
            from roofline.device import write_cache

            fields = dataclasses.asdict(verdict)
            fields.pop("cached")
            write_cache(CACHE, self._cache_key(verdict.op), fields)
        if not verdict.kept:
            self.router.take_back(verdict.op, f"slower in this program: {verdict}")
            for route in self.routes:
                if route.op == verdict.op:
                    route.reconsider()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _model_key(model: torch.nn.Module) -> str:
    """The model's class and its parameters' and buffers' names, shapes and dtypes (int8 weights are buffers),
    hashed."""
    described = [type(model).__qualname__] + [f"{name}:{tuple(t.shape)}:{t.dtype}" for name, t in
                                              (*model.named_parameters(), *model.named_buffers())]
    return hashlib.sha256("\n".join(described).encode()).hexdigest()[:16]
