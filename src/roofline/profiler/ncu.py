"""Nsight Compute on the kernels that took the most time (`roofline profile --ncu K`).

The trace says how long each kernel ran; Nsight Compute says why: how full the SMs were, what share of DRAM and
SM throughput it reached, how often L2 hit, and how many registers each thread held and whether any spilled to
local memory. ncu replays a kernel many times to read its counters, so it runs the program again, once per
kernel, profiling one launch of it (after a few, so that the first step's warm-up is past), with the program's
own arguments. The run takes as long as the program K times over and more; the report states it. ncu locks the
clocks to their base rate (its default, so that counters compare across runs): its durations run longer than the
trace's (an H100 GEMM of 94 us in the trace took 111 us under ncu).
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# name -> Nsight Compute metric
METRICS = {
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",   # achieved occupancy
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "registers": "launch__registers_per_thread",
    "spill_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",   # stores to local memory: spilled registers
    "duration_us": "gpu__time_duration.sum",
}
# (header, KernelCounters field, format): the tables' columns, terminal and HTML
COLUMNS = [("occupancy %", "occupancy_pct", "{:.0f}"), ("DRAM %", "dram_pct", "{:.0f}"), ("SM %", "sm_pct", "{:.0f}"),
           ("L2 hit %", "l2_hit_pct", "{:.0f}"), ("registers", "registers", "{:.0f}"),
           ("spilled bytes", "spill_bytes", "{:,.0f}"), ("us", "duration_us", "{:,.1f}")]
_SCALE = {"%": 1.0, "register/thread": 1.0, "": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
          "nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
SKIP_LAUNCHES = 3    # launches of the kernel left alone before the one profiled (the first step's warm-up)
TIMEOUT_S = 900


@dataclass
class KernelCounters:
    name: str                      # as the trace names it
    occupancy_pct: float | None = None
    dram_pct: float | None = None
    sm_pct: float | None = None
    l2_hit_pct: float | None = None
    registers: float | None = None
    spill_bytes: float | None = None
    duration_us: float | None = None
    error: str | None = None       # why ncu gave nothing for it


@dataclass
class NcuRun:
    seconds: float
    kernels: list[KernelCounters]

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "kernels": [asdict(k) for k in self.kernels]}


def binary() -> str | None:
    """The ncu executable: on PATH, or where the CUDA toolkit and Nsight Compute install it."""
    found = shutil.which("ncu")
    if found:
        return found
    candidates = sorted(Path("/opt/nvidia/nsight-compute").glob("*/ncu")) + sorted(Path("/usr/local/cuda/bin").glob("ncu"))
    return str(candidates[-1]) if candidates else None


def kernel_pattern(name: str) -> str:
    """A regex for ncu's --kernel-name (demangled base) matching the trace's kernel name: the name up to its
    argument list, where the two tools might print the arguments differently."""
    head = name.split("(", 1)[0].strip()
    return "regex:^" + re.escape(head)


def command(ncu: str, program: list[str], kernel: str, skip: int) -> list[str]:
    metrics = ",".join(METRICS.values())
    return [ncu, "--kernel-name-base", "demangled", "--kernel-name", kernel_pattern(kernel), "--launch-skip",
            str(skip), "--launch-count", "1", "--metrics", metrics, "--csv", "--page", "raw", *program]


def parse(stdout: str) -> dict | None:
    """The counters of the first kernel in ncu's `--csv --page raw` output, by METRICS name; None if none."""
    lines = [line for line in stdout.splitlines() if line.startswith('"')]
    if len(lines) < 3:
        return None
    header, units, first = list(csv.reader(io.StringIO("\n".join(lines[:3]))))
    out = {}
    for name, metric in METRICS.items():
        if metric not in header:
            out[name] = None
            continue
        i = header.index(metric)
        try:
            out[name] = float(first[i].replace(",", "")) * _SCALE.get(units[i], 1.0)
        except ValueError:
            out[name] = None
    return out


def measure(program: list[str], kernels: list[tuple[str, int]], ncu: str | None = None) -> NcuRun:
    """Counters for each (kernel name, launches in the window), running `program` (an argv) under ncu once per
    kernel."""
    ncu = ncu or binary()
    if ncu is None:
        raise FileNotFoundError("ncu (Nsight Compute) is not installed here")
    start = time.perf_counter()
    rows = []
    for name, launches in kernels:
        skip = min(SKIP_LAUNCHES, max(launches - 1, 0))
        try:
            done = subprocess.run(command(ncu, program, name, skip), capture_output=True, text=True,
                                  timeout=TIMEOUT_S)
            found = parse(done.stdout)
            error = None if found else (done.stdout[-600:] + done.stderr[-600:]).strip() or f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            found, error = None, f"ncu took over {TIMEOUT_S} s"
        rows.append(KernelCounters(name, **(found or {}), error=error))
    return NcuRun(time.perf_counter() - start, rows)


def program_argv(target: str, args: list[str], module: bool) -> list[str]:
    """How to run the profiled program again, as `python` would."""
    return [sys.executable, "-m", target, *args] if module else [sys.executable, target, *args]
