"""Record the example programs' traces with roofline's capture, each in a fresh process.

    python benchmarks/record_traces.py OUT_DIR [--steps N]

Writes OUT_DIR/<program>[-fixed].json.gz, and OUT_DIR/record.json with each run's wall time
with and without the profiler (the profiler's overhead on real programs).
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

SKIP = 3   # warm-up iterations left out of every trace (compilation, cuBLAS heuristics, allocator growth)
ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = [("mlp_train", "examples/mlp_train.py", [])] + [
    (f"{p.stem}{'-fixed' if fixed else ''}", str(p.relative_to(ROOT)), ["--fixed"] if fixed else [])
    for p in sorted((ROOT / "examples/problems").glob("*.py")) for fixed in (False, True)]


def one(path: str, args: list[str], trace: str | None) -> None:
    from roofline.profiler import run_program

    if trace is None:
        sys.argv = [path, *args]
        import runpy
        runpy.run_path(path, run_name="__main__")
        return
    prof, status, error = run_program(path, args, trace=trace, skip=SKIP)
    if error is not None:
        raise error


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--trace", help=argparse.SUPPRESS)
    p.add_argument("--one", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)   # PROGRAM [ARGS]: run it here
    opts = p.parse_args()
    if opts.one:
        return one(opts.one[0], opts.one[1:], opts.trace)
    opts.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for name, path, args in PROGRAMS:
        row = {"program": name, "path": path, "args": args}
        for mode in ("plain", "profiled"):
            extra = ["--trace", str(opts.out / f"{name}.json.gz")] if mode == "profiled" else []
            t0 = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, str(opts.out), *extra, "--one", path, *args],
                                  capture_output=True, text=True, cwd=ROOT)
            row[f"{mode}_s"] = round(time.perf_counter() - t0, 3)
            row[f"{mode}_rc"] = done.returncode
            if done.returncode:
                row[f"{mode}_error"] = done.stderr[-2000:]
            print(f"{name:28s} {mode:9s} rc={done.returncode} {row[f'{mode}_s']:7.2f} s", flush=True)
        runs.append(row)
    (opts.out / "record.json").write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
