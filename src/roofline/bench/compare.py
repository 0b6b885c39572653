"""Is the candidate faster than the baseline, and is the difference real?"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from roofline.bench.stats import Speedup, min_rounds, speedup_ci
from roofline.bench.timer import Measurement, _Runner, finish, repetitions, sample_interleaved


@dataclass
class Comparison:
    baseline: Measurement
    candidate: Measurement
    speedup: Speedup

    def __str__(self) -> str:
        return f"baseline:  {self.baseline}\ncandidate: {self.candidate}\n{self.speedup}"


def compare(
    baseline: Callable,
    candidate: Callable,
    *args,
    rotate: Sequence[tuple] | None = None,
    flush: bool = True,
    cuda_graph: bool = False,
    grad_to_none: Sequence[torch.Tensor] | None = None,
    warmup_ms: float = 25.0,
    rep_ms: float = 100.0,
    min_reps: int = 20,
    max_reps: int = 10_000,
    rounds: int = 20,
    confidence: float = 0.95,
    device=None,
    timeout_s: float = 60.0,
    warn: bool = True,
) -> Comparison:
    """Time baseline and candidate on the same arguments, interleaved, and give the speedup
    (baseline time / candidate time) with a bootstrap confidence interval.

    The samples are drawn in `rounds` rounds (baseline then candidate, candidate then baseline, ...); each round
    gives one paired speedup, and the speedup and its interval are the median of those and the sign test's
    interval (stats.speedup_ci), so that noise lasting longer than a call (a neighbour's burst, a clock change)
    widens the interval instead of passing for a difference. At least 6 rounds.
    The options are those of `bench.time`; rep_ms is the budget of each callable.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if rounds < min_rounds(confidence):
        raise ValueError(f"rounds must be at least {min_rounds(confidence)} for a {confidence:.0%} interval, "
                         f"got {rounds}")
    arg_sets = rotate if rotate is not None else [args]
    runners = [
        _Runner(fn, arg_sets, device=device, flush=flush, cuda_graph=cuda_graph,
                grad_to_none=grad_to_none, timeout_s=timeout_s, what=what)
        for fn, what in ((baseline, "baseline"), (candidate, "candidate"))
    ]
    # at least a sample per round, so that every round gives a speedup
    counts = [max(rounds, repetitions(r.warmup(warmup_ms, 3), rep_ms, min_reps, max_reps)) for r in runners]
    sample_interleaved(runners, counts, rounds)
    base, cand = (finish(r, warn) for r in runners)
    speedup = speedup_ci(base.samples_ms, cand.samples_ms, rounds=(base.round_sizes, cand.round_sizes),
                         confidence=confidence)
    return Comparison(base, cand, speedup)
