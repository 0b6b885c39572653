"""The timeline: when the GPU was busy, when it sat idle, and why.

Busy time is the union of all GPU activity (kernels, copies, memsets, on every stream).
Each idle gap is put down to one cause, from what the host was doing when the GPU ran dry:

    sync     the host was blocked in a synchronization (cudaStreamSynchronize from .item(),
             .cpu(), a blocking copy...) when the GPU finished; afterwards the queue was empty,
             so the GPU waited for the host to launch again (what removing it would save: SyncRow.gain_us).
    launch   the next kernel was launched only after the GPU went idle, and the gap is short
             (< LAUNCH_GAP_US): the host issues kernels more slowly than the GPU runs them.
    host     the same, with a longer gap: the host was busy with other work (Python, data).
    gpu      the next work was already queued: the GPU waited on itself (events, dependencies).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from roofline.profiler.attribution import Location, Resolver
from roofline.profiler.kernels import category
from roofline.profiler.trace import Trace

LAUNCH_GAP_US = 50.0          # idle gaps shorter than this, after a late launch, count as launch overhead
SYNC_TOLERANCE_US = 5.0       # a sync that returned this close before the GPU went idle still explains the gap


def is_sync_call(name: str) -> bool:
    """Whether a CUDA runtime/driver call blocks the host until the GPU catches up."""
    if "Synchronize" in name:
        return True
    # cudaMemcpy (not ...Async) and the driver's synchronous copies block; the Async ones block only from
    # pageable memory, which the memory table shows.
    return name in ("cudaMemcpy", "cudaMemcpy2D", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cudaMemset")


@dataclass
class SyncRow:
    """Host synchronizations from one source line (one call name)."""
    call: str
    location: Location | None
    stack: tuple = ()
    count: int = 0
    wait_us: float = 0.0          # host time blocked in the call
    idle_us: float = 0.0          # GPU idle right after it, before the host launched again
    # The idle that goes away without the sync: per sync, min(idle after it, host wait). The host was that far
    # ahead of the GPU; without the sync it stays ahead and launches the next work that much earlier. A host
    # that barely waits was the bottleneck anyway, and the GPU would idle regardless.
    gain_us: float = 0.0


@dataclass
class Region:
    """A stretch where the GPU repeatedly waited on kernel launches."""
    start: float
    end: float
    kernels: int = 0
    busy_us: float = 0.0
    idle_us: float = 0.0
    locations: dict = field(default_factory=dict)   # Location -> kernels launched from it

    @property
    def span_us(self) -> float:
        return self.end - self.start


@dataclass
class Bins:
    """The window cut into equal bins: per bin, GPU busy time by kernel category and idle time by cause
    (what the HTML timeline draws; a million events become a few hundred numbers)."""
    start: float
    width_us: float
    busy: dict                    # category -> [us per bin]
    idle: dict                    # cause -> [us per bin]


def _spread(row: list, a: float, b: float, start: float, width: float) -> None:
    """Add the interval [a, b) to the bins of `row` it overlaps."""
    n = len(row)
    i = max(int((a - start) // width), 0)
    while a < b and i < n:
        edge = start + (i + 1) * width
        row[i] += min(b, edge) - a
        a, i = edge, i + 1


@dataclass
class Timeline:
    window_us: float
    busy_us: float
    idle_us: dict                 # cause -> us: sync, launch, host, gpu
    syncs: list[SyncRow]
    launch_regions: list[Region]
    gaps: int                     # how many idle gaps
    steps: int = 0
    step_us: float | None = None  # mean wall time of a recorded step
    bins: Bins | None = None

    @property
    def idle_total_us(self) -> float:
        return sum(self.idle_us.values())


def busy_intervals(trace: Trace) -> list[tuple[float, float, int]]:
    """Merged GPU busy intervals: (start, end, index of the GPU event that starts it)."""
    order = sorted(range(len(trace.gpu)), key=lambda i: trace.gpu[i].ts)
    merged: list[list] = []
    for i in order:
        g = trace.gpu[i]
        if merged and g.ts <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], g.end)
        else:
            merged.append([g.ts, g.end, i])
    return [tuple(m) for m in merged]


def analyze(trace: Trace, resolver: Resolver | None = None, bins: int = 400) -> Timeline:
    resolver = resolver or Resolver(trace)
    busy = busy_intervals(trace)
    window = trace.wall_us
    steps = len(trace.steps)
    step_us = sum(e - s for s, e in trace.steps) / steps if steps else None
    idle = {"sync": 0.0, "launch": 0.0, "host": 0.0, "gpu": 0.0}
    if not busy:
        return Timeline(window, 0.0, idle, [], [], 0, steps, step_us)
    width = max(window, 1e-3) / bins
    binned = Bins(trace.start, width, {}, {cause: [0.0] * bins for cause in idle})
    for g in trace.gpu:
        _spread(binned.busy.setdefault(category(g.name, g.kind), [0.0] * bins), g.ts, g.end, trace.start, width)

    syncs = sorted((i for i, c in enumerate(trace.runtime) if is_sync_call(c.name)),
                   key=lambda i: trace.runtime[i].end)
    sync_ends = [trace.runtime[i].end for i in syncs]
    rows: dict[tuple, SyncRow] = {}

    def sync_row(call_index: int) -> SyncRow:
        call = trace.runtime[call_index]
        stack = resolver.for_runtime(call_index)[0]
        key = (call.name, stack[-1] if stack else None)
        if key not in rows:
            rows[key] = SyncRow(call.name, key[1], stack)
        return rows[key]

    for i in syncs:
        row = sync_row(i)
        row.count += 1
        row.wait_us += trace.runtime[i].end - trace.runtime[i].ts

    # Gaps: before the first busy interval, between intervals, and after the last.
    edges = [(trace.start, busy[0][0], busy[0][2])]
    edges += [(busy[k][1], busy[k + 1][0], busy[k + 1][2]) for k in range(len(busy) - 1)]
    edges.append((busy[-1][1], trace.end, -1))
    regions: list[Region] = []
    region: Region | None = None
    gaps = 0
    for a, b, next_event in edges:
        if b <= a:
            continue
        gaps += 1
        gap = b - a
        # A sync in progress when the GPU went idle (returning at or after that moment, give or take the
        # tolerance) caused the gap up to the next launched work. The window's trailing gap has no next work.
        k = bisect.bisect_left(sync_ends, a - SYNC_TOLERANCE_US)
        cause_sync = None
        for j in range(k, len(syncs) if next_event >= 0 else 0):
            call = trace.runtime[syncs[j]]
            if call.ts <= a + SYNC_TOLERANCE_US:
                cause_sync = syncs[j]
                break
            if call.ts > b:           # later syncs (by end) start after this gap: host threads sync in turn
                break
        launch = trace.gpu[next_event].launch if next_event >= 0 else -1
        if cause_sync is not None:
            cause = "sync"
            row, call = sync_row(cause_sync), trace.runtime[cause_sync]
            row.idle_us += gap
            row.gain_us += min(gap, call.end - call.ts)
        elif next_event < 0 or launch < 0 or a == trace.start:   # the window opens with host work
            cause = "host"
        elif trace.runtime[launch].ts >= a:
            cause = "launch" if gap < LAUNCH_GAP_US else "host"
        else:
            cause = "gpu"
        idle[cause] += gap
        _spread(binned.idle[cause], a, b, trace.start, width)
        if cause == "launch":
            if region is None:
                region = Region(a, b)
            region.end = b
            region.idle_us += gap
        elif region is not None:
            regions.append(region)
            region = None
    if region is not None:
        regions.append(region)
    _fill_regions(trace, resolver, regions)
    busy_us = sum(e - s for s, e, _ in busy)
    sync_rows = sorted(rows.values(), key=lambda r: -(r.idle_us + r.wait_us))
    return Timeline(window, busy_us, idle, sync_rows, regions, gaps, steps, step_us, binned)


def _fill_regions(trace: Trace, resolver: Resolver, regions: list[Region]) -> None:
    """Count each region's kernels, busy time and launching lines; keep the regions worth a look."""
    if not regions:
        return
    starts = [r.start for r in regions]
    for g in trace.gpu:
        k = bisect.bisect_right(starts, g.ts) - 1
        if k < 0 or g.ts > regions[k].end:      # the kernel that ends the last gap belongs too
            continue
        region = regions[k]
        region.kernels += 1
        region.busy_us += g.dur
        if g.launch >= 0:
            stack = resolver.for_runtime(g.launch)[0]
            loc = stack[-1] if stack else None
            region.locations[loc] = region.locations.get(loc, 0) + 1
    # A region is a stretch of many short kernels, not one pair of kernels with a short gap between.
    regions[:] = sorted((r for r in regions if r.kernels >= 10), key=lambda r: -r.idle_us)
