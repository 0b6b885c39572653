"""On a GPU: each program with a planted problem yields that finding, at the planted line."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = sorted((ROOT / "examples/problems").glob("*.py"))

pytestmark = pytest.mark.gpu


def _planted(path: Path) -> tuple[str, int]:
    for number, text in enumerate(path.read_text().splitlines(), 1):
        found = re.search(r"#\s*planted:\s*([\w-]+)", text)
        if found:
            return found[1], number
    raise AssertionError(f"{path} has no planted line")


def _profile(path: Path, tmp_path: Path, *args: str, options: tuple = ()) -> dict:
    """roofline profile [options] path [args]: the report's JSON."""
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "roofline.cli", "profile", "--skip", "3", *options, "--json", str(out),
                           str(path.relative_to(ROOT)), *args], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_planted_problem_is_found_at_its_line(path, tmp_path):
    finding_id, line = _planted(path)
    report = _profile(path, tmp_path)
    hits = [f for f in report["findings"] if f["id"] == finding_id]
    assert hits, f"{finding_id} not found; found {[f['id'] for f in report['findings']]}"
    assert hits[0]["location"] == {"file": str(path.relative_to(ROOT)), "line": line}
    assert hits[0]["est_gain_ms"] > 0
    assert report["totals"]["attributed_share"] >= 0.99


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_fixed_program_no_longer_has_the_finding(path, tmp_path):
    finding_id, _ = _planted(path)
    report = _profile(path, tmp_path, "--fixed")
    assert finding_id not in [f["id"] for f in report["findings"]]


OP_LEVEL = [p for p in PROGRAMS if p.stem in ("fp32_matmul", "manual_attention", "pageable_copy")]


@pytest.mark.parametrize("path", OP_LEVEL, ids=[p.stem for p in OP_LEVEL])
def test_verify_measures_the_planted_op_level_fix(path, tmp_path):
    finding_id, _ = _planted(path)
    report = _profile(path, tmp_path, options=("--verify",))
    v = next(f["verified"] for f in report["findings"] if f["id"] == finding_id)
    assert v["gain_ms"] is not None, v
    for case in v["cases"]:
        assert case["error"] is None and case["low"] <= case["speedup"] <= case["high"]
        assert case["check"].startswith(("relative error", "bytes identical"))
    assert v["gain_low_ms"] <= v["gain_ms"] <= v["gain_high_ms"] and v["covered_share"] > 0


def test_inspect_looks_inside_the_heaviest_triton_kernels(tmp_path):
    """--inspect 2 on a loop of roofline's Triton softmax and layer_norm: the two heaviest Triton kernels of the
    profile, each seen from inside the binary it ran."""
    program = tmp_path / "ops_loop.py"
    program.write_text(
        "import torch\nfrom roofline import ops\n"
        "x = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16, requires_grad=True)\n"
        "w = torch.nn.Parameter(torch.ones(4096, device='cuda', dtype=torch.bfloat16))\n"
        "opt = torch.optim.SGD([w], lr=0.0)\n"
        "for _ in range(6):\n"
        "    y = ops.layer_norm(ops.softmax(x, backend='triton'), (4096,), w, backend='triton')\n"
        "    y.float().sum().backward()\n"
        "    opt.step()\n")
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "roofline.cli", "profile", "--skip", "2", "--inspect", "2", "--json",
                           str(out), str(program)], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())["inside"]
    assert len(found) == 2 and all(x["share"] > 0 for x in found)
    names = {"softmax_forward_kernel", "softmax_backward_kernel", "norm_forward_kernel", "norm_backward_kernel",
             "norm_parameter_grads_kernel"}
    for x in found:
        assert x["kernel"] in names and x["configurations"]
        assert all(c["registers"] > 0 and not c["compiled_here"] for c in x["configurations"])
    assert "Inside the heaviest Triton kernels" in done.stdout


def test_a_window_without_ops_ties_the_kernels_to_lines_and_modules(tmp_path):
    """--no-ops on the main job: no op recorded, yet its kernels land on its lines and layers, by their launches,
    and the forward's kernels (the matmuls and GELUs inside the model) on the lines inside Sequential's calls."""
    path = ROOT / "examples/mlp_train.py"
    report = _profile(path, tmp_path, "--steps", "8", options=("--no-ops", "--steps", "4"))
    totals = report["totals"]
    assert totals["steps"] == 4 and totals["attributed_share"] >= 0.99 and report["ops"] == []
    # The forward's launches are on the marked thread itself (exact); the autograd engine's are inferred.
    assert totals["exact_share"] > 0.2
    lines = {r["line"]: r for r in report["lines"] if r["file"] == "examples/mlp_train.py"}
    text = path.read_text().splitlines()
    forward = [n for n, t in enumerate(text, 1) if "model(x)" in t]
    assert forward and lines[forward[0]]["self_ms"] > 0   # the forward's kernels, exactly on its line
    assert any(m["path"].startswith("Sequential.") for m in report["modules"])
