"""Nsight Compute on the kernels that took the most time (`roofline profile --ncu K`).

The trace says how long each kernel ran; Nsight Compute says why: how full the SMs were, what share of DRAM and
SM throughput it reached, how often L2 hit, and how many registers each thread held and whether any spilled to
local memory. ncu replays a kernel many times to read its counters, so it runs the program again, once per
launch measured, with the program's own arguments.

Which launch: the one the profile timed. A kernel launched at many sizes (a copy kernel, a softmax over several
shapes) is a different launch at each, so its launches are grouped by grid and block, and the heaviest group
(by total time) is measured, at its median launch; the next group too where the heaviest holds under half the
kernel's time. The program runs under ncu with its recorded window marked by cudaProfilerStart/Stop
(capture.CudaProfilerRange, with `--profile-from-start off`), so ncu counts launches from the window's start as
the trace does, and the launch is named by its ordinal among the window's launches of its function. ncu's grid
and block are read back: where they are not the trace's, or ncu's duration is far from the trace's, the row
says so.

ncu locks the clocks to their base rate (its default, so that counters compare across runs): its durations run
longer than the trace's (measured: benchmarks/results/h100-profile.md, "`roofline profile --ncu 3`").
"""

from __future__ import annotations

import csv
import io
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from roofline.profiler.kernels import function_name
from roofline.profiler.trace import Trace

# name -> Nsight Compute metric
METRICS = {
    "occupancy_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",   # achieved occupancy
    "dram_pct": "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    "sm_pct": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
    "l2_hit_pct": "lts__t_sector_hit_rate.pct",
    "registers": "launch__registers_per_thread",
    "spill_bytes": "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum",   # stores to local memory: spilled registers
    "duration_us": "gpu__time_duration.sum",
    "grid_size": "launch__grid_size",       # blocks: to check that ncu measured the launch the profile timed
    "block_size": "launch__block_size",     # threads a block
}
# (header, short header, KernelCounters field, format): the tables' columns, terminal and HTML
COLUMNS = [("occupancy %", "occ %", "occupancy_pct", "{:.0f}"), ("DRAM %", "DRAM", "dram_pct", "{:.0f}"),
           ("SM %", "SM", "sm_pct", "{:.0f}"), ("L2 hit %", "L2 %", "l2_hit_pct", "{:.0f}"),
           ("registers", "regs", "registers", "{:.0f}"), ("spilled bytes", "spill", "spill_bytes", "{:,.0f}"),
           ("us", "us", "duration_us", "{:,.1f}"), ("profile us", "prof us", "trace_us", "{:,.1f}")]
_SCALE = {"%": 1.0, "register/thread": 1.0, "": 1.0, "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9,
          "nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
TIMEOUT_S = 900
# Where ncu's duration and the trace's may part before the row says so: ncu runs at base clocks, somewhat longer
# than the trace's boosted ones; beyond 2x either way it measured other work than the profile timed.
DURATION_AGREES = (0.5, 2.0)


@dataclass(frozen=True)
class Launch:
    """One launch to measure, as the trace timed it."""
    kernel: str                    # the full name, as the trace names it
    function: str                  # its function name (ncu's --kernel-name-base function)
    ordinal: int                   # launches of that function before it in the window
    grid: tuple | None
    block: tuple | None
    trace_us: float                # its duration in the trace
    group_launches: int            # the kernel's launches with its grid and block
    group_share: float             # their share of the kernel's time


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
    grid_size: float | None = None      # as ncu read it
    block_size: float | None = None
    grid: tuple | None = None           # the launch the profile timed
    block: tuple | None = None
    trace_us: float | None = None
    launches: int | None = None         # the kernel's launches of that grid and block ...
    share: float | None = None          # ... and their share of its time
    note: str | None = None             # where ncu measured other than the profile timed
    error: str | None = None            # why ncu gave nothing for it


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


# ------------------------------------------------------------------ which launches

def _launch_order(trace: Trace, g) -> tuple:
    """When the host launched it (its runtime call), then when it ran (graph replays launch many at once)."""
    return (trace.runtime[g.launch].ts if g.launch >= 0 else g.ts, g.ts)


def heaviest_launches(trace: Trace, kernel: str, max_groups: int = 2) -> list[Launch]:
    """The launches of `kernel` (a full name) to measure: its launches grouped by grid and block, the heaviest
    group's median launch, and the next group's where the heaviest holds under half the kernel's time."""
    function = function_name(kernel)
    same_function = sorted((g for g in trace.kernels if function_name(g.name) == function),
                           key=lambda g: _launch_order(trace, g))
    groups: dict[tuple, list[tuple[int, object]]] = {}
    for ordinal, g in enumerate(same_function):
        if g.name == kernel:
            groups.setdefault((g.grid, g.block), []).append((ordinal, g))
    total = sum(g.dur for members in groups.values() for _, g in members)
    chosen, covered = [], 0.0
    for (grid, block), members in sorted(groups.items(), key=lambda kv: -sum(g.dur for _, g in kv[1])):
        if len(chosen) == max_groups or (chosen and covered >= 0.5):
            break
        group_us = sum(g.dur for _, g in members)
        ordinal, g = sorted(members, key=lambda m: m[1].dur)[(len(members) - 1) // 2]
        share = group_us / total if total else 1.0
        chosen.append(Launch(kernel, function, ordinal, grid, block, g.dur, len(members), share))
        covered += share
    return chosen


# ------------------------------------------------------------------ running ncu

def window_argv(target: str, args: list[str], module: bool, skip: int, active: int | None) -> list[str]:
    """How to run the profiled program again with its recorded window marked for ncu (see main())."""
    window = ["--skip", str(skip)] + ([] if active is None else ["--steps", str(active)])
    return [sys.executable, "-m", "roofline.profiler.ncu_window", *window, *(["-m"] if module else []), "--", target,
            *args]


def command(ncu: str, program: list[str], launch: Launch) -> list[str]:
    metrics = ",".join(METRICS.values())
    return [ncu, "--profile-from-start", "off", "--kernel-name-base", "function",
            "--kernel-name", f"regex:(^|::){re.escape(launch.function)}$", "--launch-skip", str(launch.ordinal),
            "--launch-count", "1", "--metrics", metrics, "--csv", "--page", "raw", *program]


def raw_table(stdout: str) -> tuple[list[str], list[str], list[list[str]]]:
    """ncu's `--csv --page raw` output as (its columns, each column's unit, a row a kernel launched); no rows
    where it printed none (its own messages, which do not start with a quote, are left out)."""
    lines = [line for line in stdout.splitlines() if line.startswith('"')]
    if len(lines) < 3:
        return [], [], []
    header, units, *rows = csv.reader(io.StringIO("\n".join(lines)))
    return header, units, rows


def value(text: str, unit: str) -> float | None:
    """A figure of the raw page in the base unit (bytes, microseconds, ...): "3.072" in "Kbyte/block" is 3072.0;
    None where the cell holds no number."""
    try:
        return float(text.replace(",", "")) * _SCALE.get(unit.split("/")[0], 1.0)
    except ValueError:
        return None


def parse(stdout: str) -> dict | None:
    """The counters of the first kernel in ncu's `--csv --page raw` output, by METRICS name; None if none."""
    header, units, rows = raw_table(stdout)
    if not rows:
        return None
    first = rows[0]
    return {name: value(first[header.index(metric)], units[header.index(metric)]) if metric in header else None
            for name, metric in METRICS.items()}


def disagreement(launch: Launch, found: dict) -> str | None:
    """Why ncu's launch is not the one the profile timed, in words; None where they agree."""
    said = []
    if launch.grid and launch.block and found.get("grid_size") is not None and found.get("block_size") is not None:
        grid, block = math.prod(launch.grid), math.prod(launch.block)
        if (round(found["grid_size"]), round(found["block_size"])) != (grid, block):
            said.append(f"ncu measured {found['grid_size']:,.0f} blocks of {found['block_size']:,.0f} threads, "
                        f"the profile {grid:,} of {block:,}")
    ncu_us = found.get("duration_us")
    if ncu_us and launch.trace_us > 0:
        ratio = ncu_us / launch.trace_us
        if not DURATION_AGREES[0] <= ratio <= DURATION_AGREES[1]:
            said.append(f"ncu's {ncu_us:,.1f} us against the profile's {launch.trace_us:,.1f} us ({ratio:.2f}x)")
    return "; ".join(said) or None


def measure(program: list[str], launches: list[Launch], ncu: str | None = None) -> NcuRun:
    """Counters for each launch, running `program` (window_argv) under ncu once per launch."""
    ncu = ncu or binary()
    if ncu is None:
        raise FileNotFoundError("ncu (Nsight Compute) is not installed here")
    start = time.perf_counter()
    rows = []
    for launch in launches:
        try:
            done = subprocess.run(command(ncu, program, launch), capture_output=True, text=True, timeout=TIMEOUT_S)
            found = parse(done.stdout)
            error = None if found else (done.stdout[-600:] + done.stderr[-600:]).strip() or f"exit {done.returncode}"
        except subprocess.TimeoutExpired:
            found, error = None, f"ncu took over {TIMEOUT_S} s"
        rows.append(KernelCounters(launch.kernel, **(found or {}), grid=launch.grid, block=launch.block,
                                   trace_us=launch.trace_us, launches=launch.group_launches,
                                   share=launch.group_share, note=disagreement(launch, found) if found else None,
                                   error=error))
    return NcuRun(time.perf_counter() - start, rows)


def launch_label(row: dict) -> str:
    """Which launch a row (KernelCounters as a dict) measured: its grid and block, and how much of the kernel's
    time launches like it hold."""
    if row.get("grid") is None:
        return ""
    dims = lambda d: "x".join(str(v) for v in d) if d else "?"  # noqa: E731
    return (f"grid {dims(row['grid'])}, block {dims(row['block'])}: {row['launches']} launches, "
            f"{row['share']:.0%} of its time")


def row_note(row: dict) -> str:
    """The launch measured, where ncu parted from the profile, and ncu's error: a table's last column."""
    return "; ".join(s for s in (launch_label(row), row.get("note"), (row.get("error") or "")[-120:]) if s)
