"""Host time by source line: where the host's time goes, for when the GPU waits on it.

The GPU's time is attributed to lines through the kernels' launches; the host's is read from roofline's line
marks (capture._LineMarks). The program's main thread is at a line from one mark to the next: that time is
its Python, torch's dispatch and the launches of the line's ops, and any wait on the GPU (a synchronization,
not host work, so left out). While the main thread sits in `loss.backward()`, the autograd engine's thread
does the host work of the backward ops; that work is moved to the lines whose forward ops created them, as
the GPU's backward time is, and taken off the line that called backward().

The times are the profiled run's: torch.profiler stretches host work. Report.host_scale brings them to the
program's pace without the profiler, where steps outside the window were timed (overhead.py).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from roofline.profiler.attribution import Location, Resolver
from roofline.profiler.timeline import is_sync_call
from roofline.profiler.trace import Trace


@dataclass
class HostLine:
    location: Location
    host_us: float = 0.0          # host time at this line (main thread, waits excluded, its backward work added)
    backward_us: float = 0.0      # of which: the autograd engine's work for the ops this line created


def host_lines(trace: Trace, resolver: Resolver) -> list[HostLine]:
    """Host time per user line over the window, most first; empty without line marks."""
    tid = resolver.marked_tid
    if tid is None:
        return []
    times, ids = trace.marks[tid]
    stacks = trace.facts.get("stacks") or []
    lines: dict[Location, HostLine] = {}

    def row(loc: Location) -> HostLine:
        if loc not in lines:
            lines[loc] = HostLine(loc)
        return lines[loc]

    # The main thread's intervals between marks, and the line of each; the host's work ends with the last step
    # (after it, the profiler's own; the window may run on for the GPU's)
    end = max(e for _, e in trace.steps) if trace.steps else trace.end
    at: list[HostLine | None] = []
    for k, sid in enumerate(ids):
        stop = times[k + 1] if k + 1 < len(times) else end
        frames = stacks[sid] if 0 <= sid < len(stacks) else None
        target = row(Location(*frames[-1])) if frames else None
        if target is not None:
            target.host_us += max(stop - times[k], 0.0)
        at.append(target)

    def line_at(ts: float) -> HostLine | None:
        k = bisect.bisect_right(times, ts) - 1
        return at[k] if k >= 0 else None

    for call in trace.runtime:   # waits on the GPU are not host work
        if call.tid == tid and is_sync_call(call.name):
            target = line_at(call.ts)
            if target is not None:
                target.host_us -= call.end - call.ts

    def outermost_backward(i: int) -> bool:
        op = trace.ops[i]
        if op.tid == tid or op.annotation or not op.backward or op.seq < 0:
            return False
        parent = op.parent
        while parent >= 0:
            if trace.ops[parent].backward and trace.ops[parent].seq >= 0:
                return False
            parent = trace.ops[parent].parent
        return True

    # The engine's backward work (an autograd node's op and all it calls), to the lines of the forward ops.
    for i, op in enumerate(trace.ops):
        if not outermost_backward(i):
            continue
        stack = resolver.resolve(i)[0]
        if not stack:
            continue
        spent = op.end - op.ts
        caller = line_at(op.ts)
        if caller is not None:
            spent = min(spent, max(caller.host_us, 0.0))
            caller.host_us -= spent
        target = row(stack[-1])
        target.host_us += spent
        target.backward_us += spent
    return sorted((r for r in lines.values() if r.host_us > 0), key=lambda r: -r.host_us)
