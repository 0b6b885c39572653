"""`roofline inspect` against Nsight Compute, kernel by kernel: registers a thread, shared memory a block, the
blocks an SM holds by each limit, and the theoretical occupancy.

    python benchmarks/inspect_vs_ncu.py OUT_DIR [FILE:FUNCTION ...]
        (default: examples/inspect_kernels.py's ops_tour and matmuls: 19 Triton kernels)

Each function runs twice, each time in a process of its own: under `roofline inspect --json`, which reads the
binaries that ran (cuobjdump) and computes occupancy from the device's limits (roofline.inspect.occupancy), and
under ncu, whose launch statistics and occupancy section say what the driver saw. The kernels are matched by name,
in launch order. One limit may part without a fault: ncu's shared-memory limit is the carveout the driver chose
for that launch (it picks a smaller one where shared memory does not limit the blocks), inspect's the largest the
SM offers; they must agree where shared memory limits the blocks, alone or tied with another limit. Shared memory is the kernel's own
(static and dynamic); both add the system's 1 KiB a block to it. Writes OUT_DIR/inspect-vs-ncu.md and
.json; exits 1 where a figure disagrees.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from roofline.profiler import ncu as ncu_tool

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["examples/inspect_kernels.py:ops_tour", "examples/inspect_kernels.py:matmuls"]
# ncu's metric -> the figure's name in the table (in inspect's units: bytes, blocks, %)
METRICS = {"launch__registers_per_thread": "registers", "launch__block_size": "threads",
           "launch__shared_mem_per_block_static": "static shared bytes",
           "launch__shared_mem_per_block_dynamic": "dynamic shared bytes",
           "sm__maximum_warps_per_active_cycle_pct": "occupancy %",
           "launch__occupancy_limit_registers": "blocks by registers",
           "launch__occupancy_limit_warps": "blocks by warps", "launch__occupancy_limit_blocks": "blocks by blocks",
           "launch__occupancy_limit_shared_mem": "blocks by shared memory"}
RUN = "import sys; from roofline.targets import load_name; load_name(sys.argv[1], type(None))"


def inspected(target: str, out: Path) -> list[dict]:
    path = out / f"inspect-{target.rsplit(':', 1)[1]}.json"
    done = subprocess.run([sys.executable, "-m", "roofline", "inspect", target, "--json", str(path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"roofline inspect {target} failed: {done.stderr[-2000:]}")
    return json.loads(path.read_text())["kernels"]


def measured(target: str, names: set[str]) -> list[dict]:
    """ncu's figures for each launch of the kernels `names`, in launch order."""
    binary = ncu_tool.binary()
    if binary is None:
        raise FileNotFoundError("ncu (Nsight Compute) is not installed here")
    done = subprocess.run([binary, "--kernel-name-base", "function", "--metrics", ",".join(METRICS), "--csv",
                           "--page", "raw", sys.executable, "-c", RUN, target], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    return [row for row in parse(done.stdout) if row["name"] in names]


def parse(stdout: str) -> list[dict]:
    """Each kernel of ncu's `--csv --page raw` output: its name and METRICS' figures, in inspect's units."""
    header, units, rows = ncu_tool.raw_table(stdout)
    out = []
    for row in rows:
        figures = {"name": row[header.index("Kernel Name")]}
        for metric, name in METRICS.items():
            i = header.index(metric)
            figures[name] = ncu_tool.value(row[i], units[i])
        figures["shared bytes"] = figures["static shared bytes"] + figures["dynamic shared bytes"]
        out.append(figures)
    return out


def inspect_figures(kernel: dict) -> dict:
    occ = kernel["occupancy"]
    return {"registers": kernel["registers"], "shared bytes": kernel["shared_bytes"],
            "occupancy %": 100 * occ["occupancy"], "blocks by registers": occ["by"]["registers"],
            "blocks by warps": occ["by"]["warps"], "blocks by blocks": occ["by"]["blocks"],
            "blocks by shared memory": occ["by"]["shared memory"], "limiter": occ["limiter"]}


def compare(kernels: list[dict], counters: list[dict]) -> list[dict]:
    rows = []
    for kernel, found in zip(kernels, counters):
        ours = inspect_figures(kernel)
        differ = [name for name in ("registers", "shared bytes", "occupancy %", "blocks by registers",
                                    "blocks by warps", "blocks by blocks")
                  if abs(ours[name] - found[name]) > 1e-6 * max(1.0, abs(found[name]))]
        limits = min(ours[f"blocks by {k}"] for k in ("registers", "warps", "blocks", "shared memory"))
        if ours["blocks by shared memory"] == limits and found["blocks by shared memory"] != limits:
            differ.append("blocks by shared memory")   # it limits the blocks (alone or tied): ncu must agree
        rows.append({"kernel": kernel["name"], "inspect": ours, "ncu": found, "differ": differ})
    return rows


def markdown(rows: list[dict], machine: str) -> str:
    lines = [f"`roofline inspect` against Nsight Compute, {machine}: {len(rows)} kernels, "
             f"{sum(not r['differ'] for r in rows)} agreeing on every figure.", "",
             "| kernel | registers (inspect / ncu) | shared bytes | blocks an SM: registers, warps, shared memory "
             "(ncu's carveout) | theoretical occupancy | limiter | agree |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["inspect"], r["ncu"]
        lines.append(f"| {r['kernel']} | {a['registers']} / {b['registers']:.0f} | {a['shared bytes']:,} / "
                     f"{b['shared bytes']:,.0f} | {a['blocks by registers']}, {a['blocks by warps']}, "
                     f"{a['blocks by shared memory']} / {b['blocks by registers']:.0f}, {b['blocks by warps']:.0f}, "
                     f"{b['blocks by shared memory']:.0f} | {a['occupancy %']:.1f}% / {b['occupancy %']:.1f}% | "
                     f"{a['limiter']} | {'yes' if not r['differ'] else 'no: ' + ', '.join(r['differ'])} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    import torch

    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for target in sys.argv[2:] or TARGETS:
        kernels = inspected(target, out)
        counters = measured(target, {k["name"] for k in kernels})
        if len(counters) != len(kernels):
            raise RuntimeError(f"{target}: inspect saw {len(kernels)} launches, ncu {len(counters)}")
        rows += compare(kernels, counters)
    machine = f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    (out / "inspect-vs-ncu.md").write_text(markdown(rows, machine))
    (out / "inspect-vs-ncu.json").write_text(json.dumps({"machine": machine, "kernels": rows}, indent=1))
    print(markdown(rows, machine))
    return 1 if any(r["differ"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
