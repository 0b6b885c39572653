"""Gather what scripts/gpu-check wrote into one results.md and results.json.

    python benchmarks/gpu_summary.py WORK_DIR OUT_DIR
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path


def last_line(path: Path) -> str:
    lines = [line for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    return lines[-1] if lines else ("(no output)" if path.exists() else "(not run in this call: see SECTIONS)")


def doctor_markdown(doctor: dict) -> str:
    d, c, sheet = doctor["device"], doctor["ceilings"], doctor.get("datasheet") or {}
    rows = ["| ceiling | measured | datasheet | of datasheet |", "|---|---|---|---|"]

    def add(label, value, peak, unit):
        pct = f"{value / peak:.0%}" if value and peak else ""
        rows.append(f"| {label} | {value:,.1f} {unit} | {f'{peak:,.1f} {unit}' if peak else ''} | {pct} |")

    add("DRAM bandwidth (1 GiB copy, read+write)", c["dram_gbps"], sheet.get("dram_gbps"), "GB/s")
    if c.get("l2_gbps"):
        add("L2 bandwidth (copy within half the L2, read+write)", c["l2_gbps"], None, "GB/s")
    for key, value in c["matmul_tflops"].items():
        add(f"{key} matmul {c['details'].get(f'matmul_{key}_n')}^3", value, sheet.get("matmul_tflops", {}).get(key), "TFLOP/s")
    return "\n".join(rows)


def _json_or_none(path: Path):
    return json.loads(path.read_text()) if path.exists() else None


def profiler_section(work: Path) -> list[str]:
    """roofline profile on the planted-problem programs, the profiler's overhead, and whole models."""
    examples, overhead = work / "profile" / "profile_examples.md", _json_or_none(work / "profile_overhead.json")
    models = work / "profile-models" / "profile_models.md"
    if not examples.exists() and overhead is None and not models.exists():
        return []
    lines = ["## roofline profile: planted problems, found and fixed (`benchmarks/profile_examples.py`)", "",
             "Each program in examples/problems carries one planted problem on a line marked `# planted: <id>`. "
             "`roofline profile --skip 3 --steps 5 --verify` ran on it (20 steps) and on its `--fixed` version; measured gain "
             "= the unprofiled step (steps timed outside the window) before minus after, times the 5 recorded steps; "
             "the profiled windows' difference beside it.", "",
             examples.read_text() if examples.exists() else "(did not run)", ""]
    if overhead is not None:
        lines += ["## What recording costs a step (`benchmarks/profile_overhead.py`)", "",
                  "Each step plain and under each way of recording it, in rounds; roofline's defaults against plain: "
                  + ", ".join(f"**{w['ratio']:.2f}x** ({w['what']})" for w in overhead["workloads"]) + ".", "",
                  (work / "profile_overhead.md").read_text(), ""]
    if models.exists():
        lines += ["## roofline profile on whole models' training steps (`benchmarks/profile_models.py`)", "",
                  "examples/train_lm.py as it comes (bf16 autocast, fused AdamW, SDPA) and unfixed (fp32, attention "
                  "by hand, foreach AdamW) run 20 steps under `roofline profile --skip 3 --steps 5 --verify`; the "
                  "steps after the window are timed without the profiler. Idle a user can remove = (unprofiled step "
                  "- GPU busy per step) x 5 steps. Then each finding's advice is applied to the program and timed.",
                  "", models.read_text(), ""]
    main_job = work / "profile" / "mlp_train.txt"
    if main_job.exists():
        lines += ["## The main job: `roofline profile --skip 3 --steps 5 --verify examples/mlp_train.py`", "", "```",
                  main_job.read_text().rstrip(), "```", ""]
    return lines


def main(work: Path, out: Path) -> None:
    doctor = json.loads((work / "doctor.json").read_text())
    d = doctor["device"]
    sweeps = {p.stem: json.loads(p.read_text()) for p in sorted(work.glob("gelu-*.json"))}
    for sweep in sweeps.values():  # samples stay in the bundle's per-sweep JSON; results.json is the summary
        for row in sweep["rows"]:
            row.get("timing", {}).pop("samples_ms", None)
    lines = [
        f"# roofline results on {d['name']}",
        "",
        f"- date: {time.strftime('%Y-%m-%d %H:%M %Z')}",
        f"- GPU: {d['name']}, {d['sm_count']} SMs, L2 {d['l2_bytes'] / 2**20:.0f} MiB, "
        f"{d['memory_bytes'] / 2**30:.0f} GiB; SM clock max {d['sm_clock_max_mhz']} MHz",
        f"- driver {d['driver']}, CUDA {d['cuda']}, torch {d['torch']}, triton {d['triton']}",
        "- command: `scripts/gpu-check` (from the repository root)",
        f"- GPU tests: {last_line(work / 'gpu-tests.log')}",
        f"- CPU test suite run on the GPU machine: {last_line(work / 'cpu-tests-on-gpu.log')}",
        "",
        "## Ceilings (`roofline doctor --remeasure`)",
        "",
        doctor_markdown(doctor),
        "",
        "## Is the measurement right? (`benchmarks/validate_timing.py`)",
        "",
        (work / "validate_timing.md").read_text() if (work / "validate_timing.md").exists() else "(validation did not run)",
    ]
    for name, sweep in sweeps.items():
        md = work / f"{name}.md"
        skipped = sorted({(r["provider"], r["reason"]) for r in sweep["rows"] if r["status"] == "skipped"})
        graphs = sweep["options"]["cuda_graph"]
        command = (f"roofline bench examples/gelu_classic.py:{'sweep_bf16' if 'bf16' in name else 'sweep'}"
                   + (" --cuda-graph" if graphs else ""))
        lines += [
            f"## {sweep['name']}, {'CUDA graphs' if graphs else 'CUDA events'}: the classic comparison (`{command}`)",
            "",
            f"Timing: {'CUDA graphs (the kernels alone)' if graphs else 'CUDA events (per-call cost in eager use, host launch gaps included where the host is slower than the GPU)'}, "
            f"L2 flushed before each call, median; speedup vs {sweep['baseline']} with a "
            f"95% bootstrap CI; % roofline against the measured copy bandwidth ({sweep['ceilings']['dram_gbps']:,.0f} GB/s). "
            f"Plot: `{name}.png`.",
            "",
            md.read_text() if md.exists() else "(sweep did not run)",
            *[f"- skipped {p}: {r}" for p, r in skipped],
            "",
        ]
        png = work / f"{name}.png"
        if png.exists():
            shutil.copy(png, out / png.name)
    lines += profiler_section(work)
    if (work / "ops.md").exists():
        lines += ["## roofline.ops against eager PyTorch, torch.compile and Liger-Kernel (`benchmarks/ops_suite.py`)",
                  "", "CUDA events (a call as eager code makes it) and CUDA graphs (the kernels alone), L2 flushed "
                  "before each call, median of 3 interleaved rounds; every output (fwd+bwd: every gradient) "
                  "checked first, against float64 for fwd+bwd; bytes = the least traffic; GB/s over the measured copy bandwidth is the % of roofline. Per-sweep tables and the "
                  "row-length plots are under ops/ in the bundle (plots also beside this file).", "",
                  (work / "ops.md").read_text(), ""]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    validation = work / "validate_timing.json"
    (out / "results.json").write_text(json.dumps({
        "doctor": doctor,
        "validation": json.loads(validation.read_text()) if validation.exists() else None,
        "sweeps": sweeps,
        "profile_examples": _json_or_none(work / "profile" / "profile_examples.json"),
        "profile_overhead": _json_or_none(work / "profile_overhead.json"),
        "profile_models": _json_or_none(work / "profile-models" / "profile_models.json"),
        "ops": _json_or_none(work / "ops.json"),
    }, indent=1))
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
