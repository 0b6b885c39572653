import numpy as np
import pytest

from roofline.bench.stats import speedup_ci, summarize


def test_summary_of_known_samples():
    s = summarize(np.arange(1, 101, dtype=float))  # 1..100
    assert s.n == 100
    assert s.median == 50.5
    assert s.mean == 50.5
    assert (s.min, s.max) == (1.0, 100.0)
    # numpy's linear interpolation: the p-th percentile of 1..100 is 1 + 0.99 p
    assert s.p10 == pytest.approx(10.9)
    assert s.p90 == pytest.approx(90.1)
    assert s.iqr == pytest.approx(75.25 - 25.75)
    assert s.std == pytest.approx(np.sqrt(100 * 101 / 12))  # sample std of 1..n is sqrt(n(n+1)/12)
    assert s.cv == pytest.approx(s.std / 50.5)


def test_summary_of_one_sample_has_zero_spread():
    s = summarize([3.0])
    assert (s.median, s.std, s.iqr, s.cv) == (3.0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("bad", [[], [[1.0, 2.0]], [1.0, float("nan")], [float("inf")]])
def test_summary_rejects_bad_samples(bad):
    with pytest.raises(ValueError, match="samples_ms"):
        summarize(bad)


def test_speedup_of_a_clear_difference_is_significant():
    rng = np.random.default_rng(1)
    base = 2.0 + 0.02 * rng.standard_normal(200)
    cand = 1.0 + 0.01 * rng.standard_normal(200)
    s = speedup_ci(base, cand)
    assert s.ratio == pytest.approx(np.median(base) / np.median(cand))
    assert 1.95 < s.low < s.ratio < s.high < 2.05
    assert s.significant
    assert s.verdict == "candidate is 2x faster"
    assert "95% CI" in str(s)


def test_speedup_of_a_slower_candidate():
    rng = np.random.default_rng(2)
    s = speedup_ci(1.0 + 0.01 * rng.random(100), 1.5 + 0.01 * rng.random(100))
    assert s.high < 1 and s.verdict.startswith("candidate is 1.5") and s.verdict.endswith("slower")


def test_same_distribution_gives_no_significant_difference():
    rng = np.random.default_rng(3)
    s = speedup_ci(1.0 + 0.05 * rng.standard_normal(300), 1.0 + 0.05 * rng.standard_normal(300))
    assert s.low < 1 < s.high
    assert not s.significant
    assert s.verdict == "no significant difference"


def test_interval_narrows_with_more_samples_and_is_reproducible():
    rng = np.random.default_rng(4)
    base, cand = 1.2 + 0.1 * rng.random(2000), 1.0 + 0.1 * rng.random(2000)
    few, many = speedup_ci(base[:50], cand[:50]), speedup_ci(base, cand)
    assert many.high - many.low < few.high - few.low
    assert speedup_ci(base, cand) == many  # same samples, same seed: same interval


def test_higher_confidence_gives_a_wider_interval():
    rng = np.random.default_rng(5)
    base, cand = 1.1 + 0.2 * rng.random(100), 1.0 + 0.2 * rng.random(100)
    narrow, wide = speedup_ci(base, cand, confidence=0.5), speedup_ci(base, cand, confidence=0.99)
    assert wide.low < narrow.low and narrow.high < wide.high


@pytest.mark.parametrize("kwargs, match", [
    (dict(baseline_ms=[1.0], candidate_ms=[1.0, 2.0]), "baseline_ms"),
    (dict(baseline_ms=[1.0, 2.0], candidate_ms=[0.0, 1.0]), "candidate_ms"),
    (dict(baseline_ms=[1.0, 2.0], candidate_ms=[1.0, 2.0], confidence=1.0), "confidence"),
    (dict(baseline_ms=[1.0, 2.0], candidate_ms=[1.0, 2.0], resamples=10), "resamples"),
])
def test_speedup_rejects_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        speedup_ci(**kwargs)


def _rounds_of_identical_functions(rng, rounds=20, per_round=10):
    """Samples of two identical functions drawn in rounds on a noisy machine: a slowdown that lasts longer than
    a call (a neighbour's burst, a clock step) stretches a whole block of samples, on top of per-call jitter."""
    a, b = [], []
    for _ in range(rounds):
        a.append(rng.lognormal(0.0, 0.05) * rng.lognormal(0.0, 0.01, per_round))
        b.append(rng.lognormal(0.0, 0.05) * rng.lognormal(0.0, 0.01, per_round))
    return np.concatenate(a), np.concatenate(b), ([per_round] * rounds, [per_round] * rounds)


def test_pairing_rounds_keeps_false_positives_near_the_nominal_rate():
    rng = np.random.default_rng(7)
    trials, by_rounds, by_samples = 200, 0, 0
    for seed in range(trials):
        a, b, rounds = _rounds_of_identical_functions(rng)
        by_rounds += speedup_ci(a, b, rounds=rounds, resamples=1000, seed=seed).significant
        by_samples += speedup_ci(a, b, resamples=1000, seed=seed).significant
    assert by_rounds <= 0.08 * trials          # nominal 5%: 10 of 200
    assert by_samples >= 0.25 * trials         # samples resampled as if independent: the interval is too narrow


def test_pairing_rounds_still_finds_a_real_difference():
    rng = np.random.default_rng(3)
    a, b, rounds = _rounds_of_identical_functions(rng)
    s = speedup_ci(a * 1.1, b, rounds=rounds)
    assert s.significant and s.ratio == pytest.approx(1.1, rel=0.05) and "whole rounds" in s.method


def test_the_sign_test_interval_covers_the_true_speedup_as_often_as_it_promises():
    # One sample a round, so each round's speedup is a draw from a skewed, heavy-tailed (Pareto) distribution
    # whose median is 1.25; with 20 rounds the interval runs from the 6th to the 15th smallest: coverage 95.86%.
    rng = np.random.default_rng(11)
    trials, covered = 2000, 0
    for _ in range(trials):
        baseline = 1.25 * (rng.pareto(1.5, 20) + 1) / 2 ** (1 / 1.5)
        s = speedup_ci(baseline, np.ones(20), rounds=([1] * 20, [1] * 20))
        ordered = np.sort(baseline)
        assert (s.low, s.high) == (ordered[5], ordered[14]) and s.ratio == pytest.approx(np.median(baseline))
        covered += s.low <= 1.25 <= s.high
    assert 0.94 <= covered / trials <= 0.975


@pytest.mark.parametrize("rounds, match", [(([5, 5], [10]), "same number of blocks"),
                                           (([5, 4], [5, 5]), "add up to its 10 samples"),
                                           (([10, 0], [5, 5]), "must be positive"),
                                           (([2] * 5, [2] * 5), "5 rounds cannot give a 95% interval; it needs "
                                                                "at least 6")])
def test_rounds_that_do_not_describe_the_samples_are_refused(rounds, match):
    with pytest.raises(ValueError, match=match):
        speedup_ci(np.ones(10), np.ones(10), rounds=rounds)
