"""benchmarks/host_overhead.py's verdicts: a row counts against a target only where its whole interval of
per-round ratios lies beyond it (CPU: the report, from made-up samples)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import host_overhead  # noqa: E402  (benchmarks/host_overhead.py)


def _row(op, ours, theirs, elements=1 << 10):
    return dict(op=op, pass_="forward+backward", shape=[1, elements], elements=elements,
                **host_overhead.compared(dict(roofline=ours, torch=theirs)))


def test_a_row_is_over_its_target_only_where_its_whole_interval_is():
    torch_us = [100.0] * 9
    slower = _row("slower", [105, 104, 106, 105, 107, 104, 105, 106, 105], torch_us)
    noisy = _row("noisy", [112, 93, 104, 96, 108, 99, 103, 95, 110], torch_us)
    faster = _row("faster", [90, 91, 89, 92, 90, 88, 91, 90, 89], torch_us)
    assert slower["ratio"] == pytest.approx(1.05) and slower["ratio_low"] == pytest.approx(1.04)
    assert noisy["ratio"] > 1.0 and noisy["ratio_low"] < 1.0 < noisy["ratio_high"]
    assert faster["ratio_high"] < 1.0
    assert host_overhead.beyond([slower, noisy, faster], 1.0) == [slower]
    lines = "\n".join(host_overhead._verdict([slower, noisy, faster], 1.0))
    assert "**1 of 3**" in lines and "- slower, forward+backward, 2^10: 1.05 (1.04-1.06)" in lines
    assert "by the median alone, their interval holding it: 1" in lines


def test_the_ratio_is_the_median_of_paired_rounds_not_of_medians():
    # a drift of the host (every round slower than the last) falls on both providers of a round alike
    ours = [100.0 * 1.1 ** i for i in range(9)]
    theirs = [t / 0.95 for t in ours]
    row = host_overhead.compared(dict(roofline=ours, torch=theirs))
    assert row["ratio"] == pytest.approx(0.95) and row["ratio_low"] == pytest.approx(0.95)
    assert row["ratio_high"] == pytest.approx(0.95)


def test_too_few_rounds_for_an_interval_are_refused():
    with pytest.raises(SystemExit):
        host_overhead.main(["/tmp/unused", "--rounds", "5"])
