"""The scale benchmark's synthetic training-loop trace, small: it loads, links and attributes completely."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from roofline.profiler.report import analyze

ROOT = Path(__file__).resolve().parents[2]


def _benchmark():
    spec = importlib.util.spec_from_file_location("profile_scale", ROOT / "benchmarks/profile_scale.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_synthetic_loop_trace_is_fully_attributed(tmp_path):
    path = tmp_path / "t.json.gz"
    events = _benchmark().write_trace(path, 6000)
    report = analyze(path)
    iterations = len(report.trace.gpu)
    assert events >= 6000 and iterations == len([o for o in report.trace.ops if o.name.startswith("aten::")])
    assert report.attribution.attributed_share == pytest.approx(1.0)
    lines = {r.location.line for r in report.lines if r.self_us}
    assert lines == set(range(40, 52))                  # the 12 stacks the marks cycle through
    # Every 100th iteration synchronizes outside any op, after its line's mark: each sync is on its line then.
    syncs = {row.location.line: row.count for row in report.timeline.syncs}
    assert syncs == Counter(40 + i % 12 for i in range(99, iterations, 100))
