"""roofline profile on the training steps of whole models, held against the program timed without the profiler.

    python benchmarks/profile_models.py OUT_DIR [--models gpt2 llama] [--steps 20]

For each model of examples/train_lm.py (GPT-2 small, the Llama-style model; bf16 autocast, fused AdamW, SDPA),
and the Llama-style model with roofline.patch (its ops then appear by name, roofline::rms_norm and the rest):
`roofline profile --skip 3 --steps 5` over a run of --steps steps, so that the steps after the window are
timed without the profiler. The table: the step recorded and unrecorded (the profiler's inflation), GPU busy
per step, the idle a user can remove (unprofiled step - GPU busy per step, times the recorded steps), the
estimated gain of the finding that names the GPU's waits on the host (launch-bound, else host-bound) against it
(issue 17's target: within +-30%), and the top findings.
Writes OUT_DIR/profile_models.json and .md, and keeps each run's report (JSON, HTML, terminal text).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP, RECORD = 3, 5


def profile(run: str, steps: int, out: Path) -> dict:
    """run: a model, or model+patch (roofline.patch applied)."""
    model, _, patch = run.partition("+")
    cmd = [sys.executable, "-m", "roofline.cli", "profile", "--skip", str(SKIP), "--steps", str(RECORD),
           "--json", str(out / f"{run}.json"), "--html", str(out / f"{run}.html"),
           "examples/train_lm.py", "--model", model, "--steps", str(steps)] + (["--patch"] if patch else [])
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
    (out / f"{run}.txt").write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads((out / f"{run}.json").read_text())


def row(model: str, report: dict) -> dict:
    t, u = report["totals"], report["totals"]["unprofiled"]
    if u is None:
        raise SystemExit(f"{model}: no step was timed outside the window; run more than {SKIP + RECORD + 1} steps")
    steps = t["steps"]
    removable_ms = u["idle_step_ms"] * steps
    # the finding that names the GPU's waits on the host: launch-bound (short kernels), else host-bound
    waits = next((f for f in report["findings"] if f["id"] in ("launch-bound", "host-bound")), None)
    return {
        "model": model, "steps_recorded": steps, "steps_timed": u["steps_timed"],
        "profiled_step_ms": u["profiled_step_ms"], "step_ms": u["step_ms"], "clock": u["clock"],
        "wall_step_ms": u["wall_step_ms"],
        "inflation": u["inflation"], "busy_step_ms": u["busy_step_ms"], "removable_idle_ms": removable_ms,
        "profiled_idle_ms": t["idle_ms"],
        "host_finding": waits["id"] if waits else None,
        "host_finding_gain_ms": waits["est_gain_ms"] if waits else None,
        "host_finding_over_removable": waits["est_gain_ms"] / removable_ms if waits and removable_ms else None,
        "top_findings": [(f["id"], f["est_gain_ms"]) for f in report["findings"][:3]],
        "roofline_ops": [{"name": o["name"], "ms": o["ms"], "pct_of_roofline": o["pct_of_roofline"]}
                         for o in report["ops"] if o["name"].startswith("roofline::")],
        "device": report["device"]["name"],
    }


def markdown(rows: list[dict]) -> str:
    lines = ["| model | step ms, recorded / unrecorded | inflation | GPU busy ms a step | idle a user can remove "
             "ms (window) | idle recorded ms (window) | host finding: gain ms (/ removable) | top findings (gain ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        waits = ("not found" if r["host_finding_gain_ms"] is None else
                 f"{r['host_finding']}: {r['host_finding_gain_ms']:.2f}"
                 + (f" ({r['host_finding_over_removable']:.2f})" if r["host_finding_over_removable"] else ""))
        top = ", ".join(f"{fid} ({gain:.2f})" for fid, gain in r["top_findings"]) or "none"
        lines.append(f"| {r['model']} | {r['profiled_step_ms']:.2f} / {r['step_ms']:.2f} | {r['inflation']:.2f}x | "
                     f"{r['busy_step_ms']:.2f} | {r['removable_idle_ms']:.2f} | {r['profiled_idle_ms']:.2f} | "
                     f"{waits} | {top} |")
    return "\n".join(lines) + "\n"


def ours_markdown(rows: list[dict]) -> str:
    """roofline's own ops as the profile placed them, per run that has any."""
    def place(o: dict) -> str:
        pct = o["pct_of_roofline"]
        return f"{o['name']} {o['ms']:.2f} ms at " + (f"{pct:.0%} of its roofline" if pct else "no cost model")

    lines = [f"- {r['model']}: " + ", ".join(place(o) for o in r["roofline_ops"]) for r in rows if r["roofline_ops"]]
    return "\nroofline's own ops in the window:\n\n" + "\n".join(lines) + "\n" if lines else ""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--models", nargs="+", default=["gpt2", "llama", "llama+patch"],
                   choices=["gpt2", "llama", "gpt2+patch", "llama+patch"])
    p.add_argument("--steps", type=int, default=20, help="steps each program runs (recorded: 5 after 3 skipped)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [row(model, profile(model, args.steps, args.out)) for model in args.models]
    (args.out / "profile_models.json").write_text(json.dumps(rows, indent=1))
    text = markdown(rows) + ours_markdown(rows)
    (args.out / "profile_models.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
