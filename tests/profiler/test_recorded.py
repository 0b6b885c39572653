"""Traces recorded on an H100 (by scripts/gpu-check, `roofline profile --skip 3` on examples/problems), analyzed here
on the CPU: each planted problem is found at its planted line, and the JSON follows its documented schema."""

import json
from pathlib import Path

import pytest

from roofline.profiler.report import SCHEMA, analyze

from .test_examples_gpu import _planted

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = sorted((Path(__file__).parent / "fixtures").glob("h100-*.json.gz"))


@pytest.fixture(scope="module", params=FIXTURES, ids=[p.name for p in FIXTURES])
def recorded(request):
    program = request.param.name.removeprefix("h100-").removesuffix(".json.gz")
    return program, analyze(request.param)


def test_there_are_recorded_traces():
    assert len(FIXTURES) >= 5


def test_planted_problem_found_at_its_line(recorded):
    program, report = recorded
    finding_id, line = _planted(ROOT / "examples/problems" / f"{program}.py")
    hits = [f for f in report.findings if f.id == finding_id]
    assert hits, [f.id for f in report.findings]
    assert (hits[0].location.file, hits[0].location.line) == (f"examples/problems/{program}.py", line)
    assert hits[0].est_gain_ms > 0 and hits[0].severity in ("high", "medium")
    assert report.attribution.attributed_share >= 0.99
    assert report.device["name"] == "NVIDIA H100 80GB HBM3" and report.device["sm_count"] == 132


def test_tables_match_what_each_program_does(recorded):
    program, report = recorded
    categories = {}
    for k in report.kernels:
        categories[k.category] = categories.get(k.category, 0.0) + k.total_us
    top = max(categories, key=categories.get)
    if program == "pageable_copy":
        pageable = [m for m in report.memory if m.kind == "HtoD" and m.pageable]
        assert pageable and pageable[0].count >= 15 and pageable[0].bytes > 0
    elif program == "fp32_matmul":
        assert top == "gemm"
        assert any(o.matmul_dtype == "fp32" and o.tensor_cores is False for o in report.ops)
    elif program == "eager_elementwise":
        assert top == "elementwise"
    elif program == "item_sync":
        [sync] = [s for s in report.timeline.syncs if s.count >= 20]
        assert sync.call == "cudaStreamSynchronize" and sync.gain_us > 0
    elif program == "manual_attention":
        assert any(o.rule == "softmax" for o in report.ops)


_NUMBER = (int, float)
_TYPES = {
    "totals": {"wall_ms": _NUMBER, "busy_ms": _NUMBER, "idle_ms": _NUMBER, "idle": dict, "work_ms": _NUMBER,
               "steps": int, "attributed_share": _NUMBER, "unattributed_ms": _NUMBER, "exact_share": _NUMBER},
    "kernels": {"name": str, "full_name": str, "category": str, "count": int, "total_ms": _NUMBER, "avg_ms": _NUMBER,
                "min_ms": _NUMBER, "max_ms": _NUMBER, "share": _NUMBER},
    "memory_ops": {"kind": str, "source": str, "destination": str, "pageable": bool, "count": int, "bytes": int,
                   "total_ms": _NUMBER},
    "lines": {"file": str, "line": int, "function": str, "self_ms": _NUMBER, "total_ms": _NUMBER,
              "backward_ms": _NUMBER, "count": int},
    "modules": {"path": str, "self_ms": _NUMBER, "total_ms": _NUMBER, "forward_ms": _NUMBER, "backward_ms": _NUMBER},
    "syncs": {"call": str, "count": int, "wait_ms": _NUMBER, "idle_ms": _NUMBER, "gain_ms": _NUMBER},
    "ops": {"name": str, "shapes": list, "dtypes": list, "pass": str, "count": int, "ms": _NUMBER, "flops": _NUMBER,
            "bytes": _NUMBER},
    "findings": {"id": str, "severity": str, "title": str, "message": str, "evidence": dict, "est_gain_ms": _NUMBER},
}


def test_json_follows_the_documented_schema(recorded, tmp_path):
    _, report = recorded
    path = tmp_path / "r.json"
    report.write_json(path)
    d = json.loads(path.read_text())
    assert d["schema"] == SCHEMA
    assert set(d["totals"]["idle"]) == {"sync", "launch", "host", "gpu"}
    assert d["device"]["ceilings"]["source"] in ("measured", "datasheet", "none")
    for key, fields in _TYPES.items():
        rows = [d[key]] if isinstance(d[key], dict) else d[key]
        for row in rows:
            for name, kind in fields.items():
                assert isinstance(row[name], kind), (key, name, row[name])
    for f in d["findings"]:
        assert f["severity"] in ("high", "medium", "low") and set(f["location"]) == {"file", "line"}
    for o in d["ops"]:
        if o["pct_of_roofline"] is not None:
            assert o["bound"] in ("memory", "compute") and o["roofline_ms"] > 0 and o["headroom_ms"] >= 0
    tl = d["timeline"]
    assert tl["bin_ms"] > 0 and set(tl["idle_ms"]) == {"sync", "launch", "host", "gpu"}
    assert sum(sum(v) for v in tl["idle_ms"].values()) == pytest.approx(d["totals"]["idle_ms"], rel=1e-3, abs=1e-3)
    assert d["tree"]["total_ms"] == pytest.approx(d["totals"]["work_ms"])
