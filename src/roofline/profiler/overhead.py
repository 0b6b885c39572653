"""The profiler's own cost, taken out of the numbers.

torch.profiler stretches the host's time (every op recorded, every launch traced by CUPTI, roofline's line
marks), not the GPU's work. A program that waits on its host therefore looks slower and idler under the
profiler than without it: a GPT-2 training step, recorded, took far longer than unrecorded with the same GPU
work either way (measured: benchmarks/results/h100-profile.md). capture times steps outside the recorded window
(wall clock, and CUDA events where CUDA runs) and leaves them among the trace's facts ("unprofiled_steps"); here
they become the step time of the program as it runs unwatched, and the factor by which the window's idle time
shrinks without the profiler:

    idle per unprofiled step = max(unprofiled step - GPU busy per recorded step, 0)
    idle_scale               = idle per unprofiled step / idle per recorded step      (at most 1)

Every cause of idle (sync, launch, host, GPU-side) is scaled alike, and the findings whose gain is idle time
are stated for the unprofiled program: launch-bound and host-bound scaled, a host sync's gain capped by the
unprofiled idle.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from roofline.profiler.timeline import Timeline
from roofline.profiler.trace import Trace


@dataclass(frozen=True)
class Overhead:
    steps: int                     # steps timed outside the window
    step_ms: float                 # their median length: by CUDA events where CUDA ran, else by wall clock
    clock: str                     # which: "CUDA events" or "wall clock"
    wall_step_ms: float            # their median wall time between step marks (the host's pace)
    profiled_step_ms: float        # a recorded step, measured the same way (the window's span per step on a GPU)
    busy_step_ms: float            # GPU busy time per recorded step
    idle_scale: float              # unprofiled idle / recorded idle

    @property
    def inflation(self) -> float:
        """How much longer a step took under the profiler."""
        return self.profiled_step_ms / self.step_ms

    @property
    def idle_step_ms(self) -> float:
        """GPU idle per step of the program without the profiler."""
        return max(self.step_ms - self.busy_step_ms, 0.0)

    def to_dict(self) -> dict:
        return {"steps_timed": self.steps, "step_ms": self.step_ms, "clock": self.clock,
                "wall_step_ms": self.wall_step_ms,
                "profiled_step_ms": self.profiled_step_ms, "inflation": self.inflation,
                "busy_step_ms": self.busy_step_ms, "idle_step_ms": self.idle_step_ms,
                "idle_scale": self.idle_scale}


# Steps timed outside the window that an unprofiled step time stands on: their median then outvotes one slow step.
# The second step of a DDP program rebuilds its buckets: two gloo ranks of examples/ddp_train.py with --skip 3 (one
# step timed) read 523 ms unprofiled where the program's own steps took 22, and "the profiler stretched steps 0.05x"
MIN_TIMED = 3


def unprofiled_steps(trace: Trace) -> dict:
    """{"wall_ms": [...], "gpu_ms": [...]}: steps capture timed outside the window; empty lists where it timed none,
    or fewer than MIN_TIMED."""
    facts = trace.facts.get("unprofiled_steps") or {}
    timed = {"wall_ms": [float(x) for x in facts.get("wall_ms") or [] if x and x > 0],
             "gpu_ms": [float(x) for x in facts.get("gpu_ms") or [] if x and x > 0]}
    return timed if len(timed["wall_ms"]) >= MIN_TIMED else {"wall_ms": [], "gpu_ms": []}


def measure(trace: Trace, tl: Timeline) -> Overhead | None:
    """The unprofiled program's step time against the recorded one; None when the trace has no steps timed
    outside its window, or no recorded steps to hold them against.

    On a GPU a step's length is the GPU's: the time between the stream reaching one step mark and the next
    (events), and for the recorded steps the window's span per step. A program's host may run ahead of its
    GPU (a short run never reaches a steady state), and then the wall time between marks is the host's pace,
    not the program's."""
    timed = unprofiled_steps(trace)
    if not timed["wall_ms"] or not tl.steps or not tl.step_us:
        return None
    wall_ms = statistics.median(timed["wall_ms"])
    gpu = tl.busy_us > 0 and bool(timed["gpu_ms"])
    step_ms = statistics.median(timed["gpu_ms"]) if gpu else wall_ms
    profiled_ms = (tl.window_us if gpu else tl.step_us * tl.steps) / tl.steps / 1e3
    busy_step_ms = tl.busy_us / tl.steps / 1e3
    recorded_idle_ms = tl.idle_total_us / tl.steps / 1e3
    unprofiled_idle_ms = max(step_ms - busy_step_ms, 0.0)
    scale = min(unprofiled_idle_ms / recorded_idle_ms, 1.0) if recorded_idle_ms > 0 else 1.0
    return Overhead(steps=len(timed["wall_ms"]), step_ms=step_ms, clock="CUDA events" if gpu else "wall clock",
                    wall_step_ms=wall_ms, profiled_step_ms=profiled_ms,
                    busy_step_ms=busy_step_ms, idle_scale=scale)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


NO_OPS = ("Recorded without ops (--no-ops): kernels and their launches alone, tied to lines, modules and steps by "
          "roofline's own marks; no op table, shapes or FLOPs.")


def sentence(totals: dict, gpu: bool) -> str | None:
    """The profiler's cost in words, from a report's totals (its JSON form): what the terminal and HTML say."""
    u = totals.get("unprofiled")
    if u is None:
        if not totals.get("steps"):
            return None
        return (f"The profiler's own overhead is in these numbers: fewer than {MIN_TIMED} steps ran outside the "
                f"recorded window to time the program without it: skip {MIN_TIMED + 2} or more steps, or let the "
                f"program run {MIN_TIMED + 1} or more steps after the recorded ones (the program's first step, the "
                "profiler's warm-up step before the window and the first step after it are not timed).")
    clock = u["clock"] + (f"; the host's pace {u['wall_step_ms']:.2f} ms" if u["clock"] == "CUDA events" else "")
    said = (f"Without the profiler a step took {u['step_ms']:.2f} ms (median of {_count(u['steps_timed'], 'step')} "
            f"timed outside the window, {clock}) against {u['profiled_step_ms']:.2f} ms recorded: the profiler "
            f"stretched steps {u['inflation']:.2f}x.")
    if gpu:
        said += (f" Unprofiled, the GPU idles {u['idle_step_ms']:.2f} ms a step ({u['idle_ms']:.1f} ms over the "
                 "window); findings of idle time are the unprofiled program's.")
    return said
