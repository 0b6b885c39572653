"""Statistics over timing samples: summaries, and speedups with confidence intervals.

Pure numpy, no torch, so every number here can be checked on synthetic samples
whose answers are known.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

# A coefficient of variation above this makes a median untrustworthy to the
# percent level that speedup claims are made at.
NOISY_CV = 0.05


@dataclass(frozen=True)
class Summary:
    """Order statistics and moments of a list of per-call times (milliseconds)."""

    n: int
    median: float
    mean: float
    min: float
    max: float
    p10: float
    p90: float
    q1: float
    q3: float
    std: float

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def cv(self) -> float:
        """Coefficient of variation: standard deviation over mean."""
        return self.std / self.mean if self.mean > 0 else float("nan")


def summarize(samples_ms) -> Summary:
    s = np.asarray(samples_ms, dtype=np.float64)
    if s.ndim != 1 or s.size == 0:
        raise ValueError(f"samples_ms must be a non-empty 1-D sequence, got shape {s.shape}")
    if not np.all(np.isfinite(s)):
        raise ValueError("samples_ms contains NaN or inf")
    p10, q1, median, q3, p90 = np.percentile(s, [10, 25, 50, 75, 90])
    return Summary(
        n=int(s.size),
        median=float(median),
        mean=float(s.mean()),
        min=float(s.min()),
        max=float(s.max()),
        p10=float(p10),
        p90=float(p90),
        q1=float(q1),
        q3=float(q3),
        # Sample standard deviation (ddof=1); zero for a single sample.
        std=float(s.std(ddof=1)) if s.size > 1 else 0.0,
    )


@dataclass(frozen=True)
class Speedup:
    """How much faster the candidate is than the baseline: baseline time / candidate time.

    `low`, `high` bound a confidence interval at level `confidence`; when the
    interval contains 1 the difference is not significant.
    """

    ratio: float
    low: float
    high: float
    confidence: float
    baseline_median_ms: float
    candidate_median_ms: float
    method: str = "bootstrap of the ratio of medians"
    notes: list[str] = field(default_factory=list)

    @property
    def significant(self) -> bool:
        return not (self.low <= 1.0 <= self.high)

    @property
    def verdict(self) -> str:
        if not self.significant:
            return "no significant difference"
        if self.ratio >= 1.0:
            return f"candidate is {self.ratio:.3g}x faster"
        return f"candidate is {1 / self.ratio:.3g}x slower"

    def __str__(self) -> str:
        pct = round(self.confidence * 100)
        return (
            f"speedup {self.ratio:.3f}x ({pct}% CI {self.low:.3f}-{self.high:.3f}): {self.verdict}"
        )


def speedup_ci(
    baseline_ms,
    candidate_ms,
    *,
    rounds: tuple | None = None,
    confidence: float = 0.95,
    resamples: int = 4000,
    seed: int = 0,
) -> Speedup:
    """Speedup of candidate over baseline with a confidence interval.

    rounds: (baseline's, candidate's) sizes of the blocks the samples were drawn in, in order, one block of each
    per round (bench.compare draws them so: baseline, candidate, candidate, baseline, ...). Each round then gives
    one paired speedup, the ratio of its two blocks' medians; the speedup is their median, and the interval the
    sign test's: two of their order statistics, picked by the binomial distribution so that the interval holds
    the true median with at least `confidence` whatever the noise's distribution, if rounds are independent.
    Rounds nearly are, samples are not: a neighbour's burst or a clock change outlasts a call and hits a block
    of samples, both halves of a round alike. On a small machine beside a bursty neighbour, resampling samples
    as if independent called identical functions different far more often than the nominal rate, and so did a
    bootstrap of whole rounds; the sign test stayed within it, and the per-round speedups there were nearly
    uncorrelated. At 95% it needs at least 6 rounds.
    Without rounds, the ratio of medians with a percentile bootstrap, each sample set resampled independently
    (seeded, so the same samples always give the same interval).
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if resamples < 100:
        raise ValueError(f"resamples must be at least 100, got {resamples}")
    b = np.asarray(baseline_ms, dtype=np.float64)
    c = np.asarray(candidate_ms, dtype=np.float64)
    for name, s in (("baseline_ms", b), ("candidate_ms", c)):
        if s.ndim != 1 or s.size < 2:
            raise ValueError(f"{name} needs at least 2 samples, got {s.size}")
        if not np.all(np.isfinite(s)) or np.any(s <= 0):
            raise ValueError(f"{name} must hold positive, finite times")
    b_median, c_median = float(np.median(b)), float(np.median(c))
    if rounds is not None:
        low, ratio, high = _sign_test_interval(_round_speedups(b, c, rounds), confidence)
        return Speedup(ratio=ratio, low=low, high=high, confidence=confidence, baseline_median_ms=b_median,
                       candidate_median_ms=c_median, method="median of per-round speedups, sign-test interval "
                                                            "over whole rounds (paired)")
    rng = np.random.default_rng(seed)
    b_med = np.median(b[rng.integers(0, b.size, size=(resamples, b.size))], axis=1)
    c_med = np.median(c[rng.integers(0, c.size, size=(resamples, c.size))], axis=1)
    ratios = b_med / c_med
    tail = (1.0 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return Speedup(
        ratio=b_median / c_median,
        low=float(low),
        high=float(high),
        confidence=confidence,
        baseline_median_ms=b_median,
        candidate_median_ms=c_median,
    )


def min_rounds(confidence: float) -> int:
    """The fewest rounds whose sign-test interval (all of them between its ends) reaches `confidence`."""
    return math.ceil(math.log2(2 / (1.0 - confidence)))


def _round_speedups(b: np.ndarray, c: np.ndarray, rounds) -> np.ndarray:
    """Each round's baseline median over its candidate median."""
    b_blocks, c_blocks = _blocks(b, rounds[0], "baseline"), _blocks(c, rounds[1], "candidate")
    if len(b_blocks) != len(c_blocks):
        raise ValueError(f"rounds must give baseline and candidate the same number of blocks, got "
                         f"{len(b_blocks)} and {len(c_blocks)}")
    return np.array([np.median(x) / np.median(y) for x, y in zip(b_blocks, c_blocks)])


def median_ci(samples, confidence: float = 0.95) -> tuple[float, float, float]:
    """(low, median, high) of independent samples: the sign test's interval for their median."""
    return _sign_test_interval(np.asarray(samples, dtype=float), confidence)


def _sign_test_interval(values: np.ndarray, confidence: float) -> tuple[float, float, float]:
    """(low, median, high): the k-th smallest and k-th largest values, k the largest for which the interval
    misses the median with probability 2 * P(Binomial(n, 1/2) < k) <= 1 - confidence."""
    n, alpha = values.size, 1.0 - confidence
    below = [math.comb(n, i) / 2.0 ** n for i in range(n + 1)]   # P(exactly i values below the true median)
    k, miss = 0, 0.0
    while k < n // 2 and 2 * (miss + below[k]) <= alpha:
        miss += below[k]
        k += 1
    if k == 0:
        raise ValueError(f"rounds: {n} rounds cannot give a {confidence:.0%} interval; it needs at least "
                         f"{min_rounds(confidence)}")
    ordered = np.sort(values)
    return float(ordered[k - 1]), float(np.median(values)), float(ordered[n - k])


def _blocks(samples: np.ndarray, sizes, name: str) -> list[np.ndarray]:
    """samples cut into consecutive blocks of `sizes`."""
    sizes = [int(n) for n in sizes]
    if any(n < 1 for n in sizes) or sum(sizes) != samples.size:
        raise ValueError(f"rounds: the {name}'s block sizes must be positive and add up to its {samples.size} "
                         f"samples, got {sizes}")
    return np.split(samples, np.cumsum(sizes)[:-1])
