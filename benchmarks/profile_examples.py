"""Profile each program with a planted problem, then its fixed version, and check roofline's findings.

    python benchmarks/profile_examples.py OUT_DIR

For every program in examples/problems: run `roofline profile --skip 3 --steps 5 --verify` on it (20 steps) and
`roofline profile --skip 3 --steps 5` on it with --fixed; check that the planted finding is reported at the planted
line (the line marked `# planted: <finding id>`), and compare the gain it estimated with the gain measured.
Measured without the profiler: the median step of the steps outside the window (the report's unprofiled step
time), before minus after, times the 5 recorded steps; the profiled windows' difference beside it, and what
--verify measured of the ops alone where the finding has an op-level fix. Writes
OUT_DIR/profile_examples.json and .md, and keeps each run's JSON report and trace.
"""

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIP = 3   # warm-up steps left out: compilation, cuBLAS heuristics, allocator growth
RECORD = 5          # steps recorded; the rest of the program's steps are timed without the profiler
PROGRAM_STEPS = 20


def planted(path: Path) -> tuple[str, int]:
    for number, text in enumerate(path.read_text().splitlines(), 1):
        found = re.search(r"#\s*planted:\s*([\w-]+)", text)
        if found:
            return found[1], number
    raise SystemExit(f"{path} has no '# planted: <finding id>' line")


def profile(path: Path, fixed: bool, out: Path) -> dict:
    name = path.stem + ("-fixed" if fixed else "")
    cmd = [sys.executable, "-m", "roofline.cli", "profile", "--skip", str(SKIP), "--steps", str(RECORD)]
    cmd += [] if fixed else ["--verify"]
    cmd += ["--json", str(out / f"{name}.json"), "--trace", str(out / f"{name}.trace.json.gz"),
            str(path.relative_to(ROOT)), "--steps", str(PROGRAM_STEPS)] + (["--fixed"] if fixed else [])
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**__import__("os").environ, "COLUMNS": "160"})
    (out / f"{name}.txt").write_text(done.stdout + done.stderr)
    if done.returncode:
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    return json.loads((out / f"{name}.json").read_text())


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for path in sorted((ROOT / "examples/problems").glob("*.py")):
        finding_id, line = planted(path)
        before, after = profile(path, False, out), profile(path, True, out)
        row = {"program": path.name, "finding": finding_id, "planted_line": line}
        if "error" in before or "error" in after:
            row["error"] = before.get("error") or after.get("error")
            rows.append(row)
            print(path.name, "ERROR", row["error"][-300:], flush=True)
            continue
        hits = [f for f in before["findings"] if f["id"] == finding_id]
        hit = hits[0] if hits else None
        row.update({
            "found": hit is not None,
            "reported_line": hit["location"]["line"] if hit and hit["location"] else None,
            "rank": before["findings"].index(hit) + 1 if hit else None,
            "estimated_gain_ms": hit["est_gain_ms"] if hit else None,
            "verified": hit.get("verified") if hit else None,
            "wall_ms": before["totals"]["wall_ms"], "fixed_wall_ms": after["totals"]["wall_ms"],
            "busy_ms": before["totals"]["busy_ms"], "fixed_busy_ms": after["totals"]["busy_ms"],
            "still_found_after_fix": any(f["id"] == finding_id for f in after["findings"]),
            "other_findings": [f["id"] for f in before["findings"] if f["id"] != finding_id],
            "attributed_share": before["totals"]["attributed_share"],
            "exact_share": before["totals"]["exact_share"],
        })
        unprofiled = before["totals"]["unprofiled"], after["totals"]["unprofiled"]
        row["profiled_gain_ms"] = row["wall_ms"] - row["fixed_wall_ms"]
        row["step_ms"], row["fixed_step_ms"] = (u["step_ms"] for u in unprofiled)
        row["inflation"] = unprofiled[0]["inflation"]
        row["measured_gain_ms"] = (row["step_ms"] - row["fixed_step_ms"]) * before["totals"]["steps"]
        if hit and hit["est_gain_ms"] > 0:
            row["measured_over_estimated"] = row["measured_gain_ms"] / hit["est_gain_ms"]
        row["at_planted_line"] = row["reported_line"] == line
        row["within_2x"] = 0.5 <= row.get("measured_over_estimated", 0) <= 2.0
        rows.append(row)
        print(f"{path.name:24s} {finding_id:24s} found={row['found']} line {row['reported_line']} (planted {line}) "
              f"est {row['estimated_gain_ms']} ms, measured {row['measured_gain_ms']:.1f} ms", flush=True)
    (out / "profile_examples.json").write_text(json.dumps(rows, indent=1))
    lines = ["| program | finding | at the planted line | rank | estimated gain ms | measured gain ms (unprofiled) | "
             "measured / estimated | --verify: the ops alone, ms | unprofiled step ms before / after | "
             "profiled: gain ms, step inflation |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['program']} | {r['finding']} | error | | | | | | | |")
            continue
        ratio = r.get("measured_over_estimated")
        v = r["verified"] or {}
        verified = (f"{v['gain_ms']:.1f} ({v['gain_low_ms']:.1f} to {v['gain_high_ms']:.1f})"
                    if v.get("gain_ms") is not None else "program-level" if v else "")
        lines.append(f"| {r['program']} | {r['finding']} | {'yes' if r['at_planted_line'] else 'no'} "
                     f"(line {r['reported_line']}, planted {r['planted_line']}) | {r['rank']} | "
                     f"{r['estimated_gain_ms'] if r['estimated_gain_ms'] is not None else 'not found'} | "
                     f"{r['measured_gain_ms']:.1f} | {f'{ratio:.2f}' if ratio else ''} | {verified} | "
                     f"{r['step_ms']:.2f} / {r['fixed_step_ms']:.2f} | {r['profiled_gain_ms']:.1f}, "
                     f"{r['inflation']:.2f}x |")
    (out / "profile_examples.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
