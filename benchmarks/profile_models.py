"""roofline profile on the training steps of whole models, held against the program timed without the profiler,
and each finding's advice applied to the program and measured.

    python benchmarks/profile_models.py OUT_DIR [--runs gpt2 gpt2-unfixed ...] [--steps 20]

Runs (examples/train_lm.py): gpt2 and llama as they come (bf16 autocast, fused AdamW, SDPA); gpt2-unfixed and
llama-unfixed with the advice undone (fp32, attention by hand, foreach AdamW; llama at batch 4 so that its fp32
scores fit); llama+patch (roofline.patch: its ops then appear by name, roofline::rms_norm and the rest).

Each run: `roofline profile --skip 3 --steps 5 --verify` over --steps steps, so that the steps after the window
are timed without the profiler and each op-level fix is timed on the recorded shapes. The first table: the step
recorded and unrecorded (the profiler's inflation), GPU busy per step, the idle a user can remove (unprofiled
step - GPU busy per step, times the recorded steps), and the estimated gain of the finding that names the GPU's
waits on the host (launch-bound, else host-bound) against it (issue 17: within +-30%).
The second: for each finding whose advice is a change to the program (FIXES), the program run again with that
one change (train_lm.py --time, its median step by CUDA events, against the run's own configuration timed the
same way): measured gain = (step before - step after) x the 5 recorded steps, beside the estimate and what
--verify measured of the ops alone; the ratio is the program's where the advice changes the program, else
--verify's (issue 17: the top three findings of each model within 0.5-2x).
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
UNFIXED = ["--precision", "fp32", "--attention", "by_hand", "--optimizer", "foreach"]
RUNS = {
    "gpt2": ["--model", "gpt2"],
    "gpt2-unfixed": ["--model", "gpt2"] + UNFIXED,
    "llama": ["--model", "llama"],
    "llama-unfixed": ["--model", "llama", "--batch", "4"] + UNFIXED,
    "llama+patch": ["--model", "llama", "--patch"],
}
# a finding's advice as train_lm.py options, given after the run's own (the later option wins)
FIXES = {
    "fp32-matmul-no-tf32": ["--precision", "tf32"],
    "no-autocast": ["--precision", "bf16"],
    "manual-attention": ["--attention", "sdpa"],
    "unfused-optimizer": ["--optimizer", "fused"],
    "launch-bound": ["--graphs"],
    "host-bound": ["--graphs"],
}
TARGET = (0.5, 2.0)   # measured / estimated, for the top three findings


def _run(cmd: list[str], log: Path) -> str:
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
    log.write_text(done.stdout + done.stderr)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout


def profile(run: str, steps: int, out: Path, tiny: bool) -> dict:
    cmd = [sys.executable, "-m", "roofline.cli", "profile", "--skip", str(SKIP), "--steps", str(RECORD)]
    cmd += [] if tiny else ["--verify"]   # on a CPU there are no findings to verify
    cmd += ["--json", str(out / f"{run}.json"), "--html", str(out / f"{run}.html"),
            "examples/train_lm.py", "--steps", str(steps)] + RUNS[run]
    _run(cmd, out / f"{run}.txt")
    return json.loads((out / f"{run}.json").read_text())


def timed(run: str, extra: list[str], steps: int, out: Path, name: str) -> float:
    """The run's program with `extra` options, its median step (ms) without the profiler."""
    stdout = _run([sys.executable, "examples/train_lm.py", "--steps", str(steps), "--time"] + RUNS[run] + extra,
                  out / f"{run}.time-{name}.txt")
    line = next(t for t in stdout.splitlines() if t.startswith("timing: "))
    return json.loads(line.removeprefix("timing: "))["step_ms"]


def row(run: str, report: dict) -> dict:
    t, u = report["totals"], report["totals"]["unprofiled"]
    if u is None:
        raise SystemExit(f"{run}: no step was timed outside the window; run more than {SKIP + RECORD + 1} steps")
    steps = t["steps"]
    removable_ms = u["idle_step_ms"] * steps
    # the finding that names the GPU's waits on the host: launch-bound (short kernels), else host-bound
    waits = next((f for f in report["findings"] if f["id"] in ("launch-bound", "host-bound")), None)
    return {
        "run": run, "options": RUNS[run], "steps_recorded": steps, "steps_timed": u["steps_timed"],
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


def advice(run: str, report: dict, steps: int, out: Path) -> dict:
    """Each finding of the report, its estimate, what --verify measured of its ops, and (FIXES) the program run
    again with its advice applied."""
    recorded = report["totals"]["steps"]
    base_ms = timed(run, [], steps, out, "as-is")
    fixed_ms: dict[tuple, float] = {}   # the same change named by two findings is run once
    rows = []
    for rank, f in enumerate(report["findings"], 1):
        fix = FIXES.get(f["id"])
        r = {"rank": rank, "id": f["id"], "title": f["title"], "estimated_ms": f["est_gain_ms"], "fix": fix,
             "verified_ms": (f.get("verified") or {}).get("gain_ms"),
             "verified_interval_ms": [(f.get("verified") or {}).get(k) for k in ("gain_low_ms", "gain_high_ms")],
             "verify_note": (f.get("verified") or {}).get("reason")}
        if fix:
            if tuple(fix) not in fixed_ms:
                fixed_ms[tuple(fix)] = timed(run, fix, steps, out, f["id"])
            r["fixed_step_ms"] = fixed_ms[tuple(fix)]
            r["measured_ms"] = (base_ms - r["fixed_step_ms"]) * recorded
        # the program's own gain where the advice could be applied to it, else the ops' alone (--verify)
        measured = r.get("measured_ms", r["verified_ms"])
        r["ratio"] = measured / f["est_gain_ms"] if measured is not None and f["est_gain_ms"] else None
        rows.append(r)
    top = [r for r in rows[:3] if r["ratio"] is not None]
    return {"run": run, "step_ms": base_ms, "steps_recorded": recorded, "findings": rows,
            "top3_measured": len(top),
            "top3_within_target": sum(TARGET[0] <= r["ratio"] <= TARGET[1] for r in top)}


def markdown(rows: list[dict]) -> str:
    lines = ["| run | step ms, recorded / unrecorded | inflation | GPU busy ms a step | idle a user can remove "
             "ms (window) | idle recorded ms (window) | host finding: gain ms (/ removable) | top findings (gain ms) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        waits = ("not found" if r["host_finding_gain_ms"] is None else
                 f"{r['host_finding']}: {r['host_finding_gain_ms']:.2f}"
                 + (f" ({r['host_finding_over_removable']:.2f})" if r["host_finding_over_removable"] else ""))
        top = ", ".join(f"{fid} ({gain:.2f})" for fid, gain in r["top_findings"]) or "none"
        lines.append(f"| {r['run']} | {r['profiled_step_ms']:.2f} / {r['step_ms']:.2f} | {r['inflation']:.2f}x | "
                     f"{r['busy_step_ms']:.2f} | {r['removable_idle_ms']:.2f} | {r['profiled_idle_ms']:.2f} | "
                     f"{waits} | {top} |")
    return "\n".join(lines) + "\n"


def _ms(x) -> str:
    return "" if x is None else f"{x:,.2f}"


def advice_markdown(tables: list[dict]) -> str:
    lines = ["\nEach finding's advice measured: estimated gain over the 5 recorded steps; `--verify`'s measurement "
             "of the ops alone (the fix timed on the recorded shapes); and the program run again with the advice "
             "applied, (step before - step after) x 5 steps, both timed without the profiler.\n",
             "| run | # | finding | advice applied | estimated ms | --verify ms (interval) | program measured ms "
             "(step ms after) | measured / estimated (program, else --verify) |", "|---|---|---|---|---|---|---|---|"]
    for t in tables:
        for r in t["findings"]:
            interval = r["verified_interval_ms"]
            verified = (f"{_ms(r['verified_ms'])} ({_ms(interval[0])} to {_ms(interval[1])})"
                        if r["verified_ms"] is not None else "")
            program = (f"{_ms(r['measured_ms'])} ({_ms(r['fixed_step_ms'])})" if r.get("measured_ms") is not None
                       else "")
            ratio = r["ratio"]
            lines.append(f"| {t['run']} ({_ms(t['step_ms'])} ms) | {r['rank']} | {r['id']} | "
                         f"{' '.join(r['fix']) if r['fix'] else ''} | {_ms(r['estimated_ms'])} | {verified} | "
                         f"{program} | {'' if ratio is None else f'{ratio:.2f}'} |")
    lines.append("")
    for t in tables:
        lines.append(f"- {t['run']}: of the top three findings, {t['top3_measured']} measured (the program, else "
                     f"--verify), {t['top3_within_target']} within {TARGET[0]}-{TARGET[1]}x of the estimate")
    return "\n".join(lines) + "\n"


def ours_markdown(rows: list[dict]) -> str:
    """roofline's own ops as the profile placed them, per run that has any."""
    def place(o: dict) -> str:
        pct = o["pct_of_roofline"]
        return f"{o['name']} {o['ms']:.2f} ms at " + (f"{pct:.0%} of its roofline" if pct else "no cost model")

    lines = [f"- {r['run']}: " + ", ".join(place(o) for o in r["roofline_ops"]) for r in rows if r["roofline_ops"]]
    return "\nroofline's own ops in the window:\n\n" + "\n".join(lines) + "\n" if lines else ""


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--runs", nargs="+", default=list(RUNS), choices=list(RUNS))
    p.add_argument("--steps", type=int, default=20, help="steps each program runs (recorded: 5 after 3 skipped)")
    p.add_argument("--tiny", action="store_true", help="on a CPU: profile only (no findings to apply there)")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows, tables = [], []
    for run in args.runs:
        report = profile(run, args.steps, args.out, args.tiny)
        rows.append(row(run, report))
        if not args.tiny:
            tables.append(advice(run, report, args.steps, args.out))
        # after each run, so that a call stopped at its time limit keeps what was measured
        (args.out / "profile_models.json").write_text(json.dumps({"runs": rows, "advice": tables}, indent=1))
        text = markdown(rows) + (advice_markdown(tables) if tables else "") + ours_markdown(rows)
        (args.out / "profile_models.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
