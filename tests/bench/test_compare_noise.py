"""bench.compare on a noisy machine: two identical functions beside a bursty neighbour must come out "no
significant difference" about as often as the confidence level promises (issue: 7-17% false positives at a
nominal 5% while samples were resampled as if independent, 6-17% while whole rounds were)."""

import subprocess
import sys
import warnings

import pytest
import torch

from roofline import bench

# Busy for 5-50 ms, idle for 10-100 ms, at random: bursts that outlast many calls and hit one function's block
# of samples and not the other's.
NEIGHBOUR = """
import random, sys, time
random.seed(int(sys.argv[1]))
while True:
    end = time.perf_counter() + random.uniform(0.005, 0.05)
    while time.perf_counter() < end:
        pass
    time.sleep(random.uniform(0.01, 0.1))
"""
COMPARES = 40   # each 30 ms a side: about 6 s alone, and the neighbours slow whatever else runs meanwhile
# Not marked long (run first): its two busy neighbours would run beside the ranks' tests, which time stragglers.


@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_identical_functions_beside_a_bursty_neighbour_rarely_differ():
    x = torch.randn(64, 64)

    def work():
        for _ in range(20):
            x @ x

    neighbours = [subprocess.Popen([sys.executable, "-c", NEIGHBOUR, str(seed)]) for seed in range(2)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            results = [bench.compare(work, work, device="cpu", flush=False, rep_ms=30, warmup_ms=5, warn=False)
                       for _ in range(COMPARES)]
    finally:
        for process in neighbours:
            process.kill()
    for c in results:   # every compare drew both functions in the same rounds, which the interval pairs
        assert len(c.baseline.round_sizes) == len(c.candidate.round_sizes) == 20
        assert sum(c.baseline.round_sizes) == c.baseline.n and "sign-test interval over whole rounds" in c.speedup.method
    false_positives = sum(c.speedup.significant for c in results)
    # nominal 5%: 2 of 40 expected; 7 or more has a chance under 1% at a true 6% (and 39% at the 15% of the old
    # resampling)
    assert false_positives <= 6, f"{false_positives} of {COMPARES} compares of identical functions 'differ'"
