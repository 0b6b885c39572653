"""The ranks of one program, profiled each on its own and read together: how much of each step is communication,
how much of it the rank waits for (exposed: no compute of its own overlaps it), how close each collective comes to
the interconnect's measured ceiling, and which rank holds the others back, and at which line.

Each rank's trace is analyzed alone (profiler.report); then the ranks' collective calls are matched by their order
(every rank makes the same collectives in the same order, or the program would hang). A collective ends for all
ranks at once, when the last has arrived, so the ranks' clocks are aligned on the ends of their matched transfers
(the median offset: one host's clocks agree already, several hosts' need not), and each call's last rank to
arrive (to start its transfer: on a GPU, when its stream reached the NCCL kernel, which the host may have launched
long before) is the one the others waited for. Where its host spent more time than the others', line by line (from
the line marks, beside the other ranks' median), says where it lost the time.

The recorder slows every host, so the recorded waits can describe the recording: where NCCL timed the calls of the
steps outside the window (distributed.ledger), those say whether a rank holds the others back, and by how much,
and give each collective's transfer time.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field

from roofline.distributed import comms, ledger
from roofline.profiler.attribution import Location, Resolver
from roofline.profiler.overhead import measure as measure_overhead
from roofline.profiler.overhead import unprofiled_steps
from roofline.profiler.timeline import Timeline, analyze
from roofline.profiler.trace import Trace


# --------------------------------------------------------------------------- intervals

def _union(spans) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _length(spans) -> float:
    return sum(b - a for a, b in spans)


def _overlap(a, b) -> float:
    """The time two unions of spans share."""
    total, j = 0.0, 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        k = j
        while k < len(b) and b[k][0] < end:
            total += min(end, b[k][1]) - max(start, b[k][0])
            k += 1
    return total


# --------------------------------------------------------------------------- one rank

@dataclass
class HostSync:
    """A line at which a rank's host waits for its GPU (.item(), .cpu(), a synchronize), a step."""
    location: Location
    call: str
    calls: float                 # a step
    wait_ms: float               # the host blocked in them
    # the GPU's idle after them that the host's lead would have covered (timeline.SyncRow.gain_us): what the rank's
    # GPU wins without them, recorded
    gain_ms: float

    def to_dict(self) -> dict:
        return {"where": str(self.location), "call": self.call, "calls": self.calls, "wait_ms": self.wait_ms,
                "gain_ms": self.gain_ms}


@dataclass
class Rank:
    rank: int
    trace: Trace = field(repr=False)
    calls: list[comms.Call]
    steps: int
    step_ms: float | None        # a recorded step's wall time
    compute_ms: float            # a step's: the union of the GPU's other work (or the host's ops, on a CPU)
    comm_ms: float               # a step's: the union of the transfers
    exposed_ms: float            # the part of comm_ms no compute overlaps
    # a step of the program as it runs unrecorded: the steps capture timed outside the window (CUDA events on a
    # GPU, else the wall clock); None where none were
    unprofiled_ms: float | None = None
    compute_spans: list = field(default_factory=list, repr=False)   # the window's, unions, on this rank's clock
    comm_spans: list = field(default_factory=list, repr=False)
    # a step's NCCL kernel time on streams that run the rank's computation too (a stream runs its kernels in
    # turn: there no transfer overlaps computation), those streams, and the line of the first call there
    serialized_ms: float = 0.0
    serialized_streams: list = field(default_factory=list)
    serialized_at: Location | None = None
    # FSDP2: a step's host time in its hooks (gathering each unit's parameters, reducing its gradients), how many
    # fully_shard units it has, and the line whose forward ran the first unit's hooks
    hooks_ms: float = 0.0
    hook_units: int = 0
    hooks_at: Location | None = None
    # the recorded steps' mean: what a step's compute, comm and hooks (each the window's over its steps) add up
    # within, where step_ms (their median) holds no spiked step
    mean_step_ms: float | None = None
    syncs: list[HostSync] = field(default_factory=list)   # the lines its host waits for its GPU at
    # torch.compile: the compiled graphs' forwards a step (AOTAutograd's CompiledFunction, one a graph each time it
    # runs), and the line that ran the first
    compiled_graphs: float = 0.0
    compiled_at: Location | None = None
    # a recorded step as the rank's own report holds it against the unrecorded one (profiler.overhead), and how
    # much longer it took: on a GPU the GPU's span of the window's steps, where the host's marks would give its
    # pace (it may run ahead). Where no step was timed outside the window: the steps' mean, and no stretch
    recorded_step_ms: float | None = None
    stretch: float | None = None

    @property
    def overlap(self) -> float | None:
        return 1 - self.exposed_ms / self.comm_ms if self.comm_ms > 0 else None

    @property
    def host_stretch(self) -> float | None:
        """The recorded steps' mean by the host's marks over the unrecorded step: what host time (FSDP2's hooks)
        is scaled back by to the program's own pace."""
        return self.mean_step_ms / self.unprofiled_ms if self.mean_step_ms and self.unprofiled_ms else None

    @property
    def not_computing_ms(self) -> float | None:
        """Unrecorded, the part of a step the GPU does not compute: its communication that no computation hides,
        its waits for other ranks, and its idle. The recorder stretches the host, not the GPU's kernels, so the
        recorded compute stands for the unrecorded one (on a CPU the recorded ops are the host's: None)."""
        if self.unprofiled_ms is None or not self.trace.gpu:
            return None
        return max(self.unprofiled_ms - self.compute_ms, 0.0)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "steps": self.steps, "step_ms": self.step_ms, "compute_ms": self.compute_ms,
                "comm_ms": self.comm_ms, "exposed_ms": self.exposed_ms, "overlap": self.overlap,
                "collectives": len(self.calls), "unprofiled_ms": self.unprofiled_ms, "stretch": self.stretch,
                "not_computing_ms": self.not_computing_ms, "serialized_ms": self.serialized_ms,
                "serialized_streams": self.serialized_streams, "fsdp2_hooks_ms": self.hooks_ms,
                "fsdp2_units": self.hook_units, "mean_step_ms": self.mean_step_ms,
                "recorded_step_ms": self.recorded_step_ms, "host_stretch": self.host_stretch,
                "host_syncs": [x.to_dict() for x in self.syncs], "compiled_graphs": self.compiled_graphs,
                "compiled_at": str(self.compiled_at) if self.compiled_at else None}


def _compute_spans(trace: Trace, calls: list[comms.Call]) -> list[tuple[float, float]]:
    """What the rank computes while it communicates or not: on a GPU every kernel, copy and memset but NCCL's;
    on a CPU the host's top-level ops that are no collective and run on no thread of gloo's."""
    if trace.gpu:
        return _union((g.ts, g.end) for g in trace.gpu if not comms.is_comm_kernel(g.name))
    called = {c.op for c in calls}
    comm_threads = {trace.ops[i].tid for i, op in enumerate(trace.ops) if op.annotation and op.name.startswith("gloo:")}
    return _union((op.ts, op.end) for i, op in enumerate(trace.ops)
                  if op.parent < 0 and not op.annotation and i not in called and op.tid not in comm_threads)


def _serialized(trace: Trace, calls: list[comms.Call]) -> tuple[float, list[int], Location | None]:
    """NCCL's kernel time (us) on the streams that run computation too, those streams, and the line of the first
    call whose transfer ran there."""
    comm: dict[int, float] = {}
    compute: set[int] = set()
    for g in trace.gpu:
        if g.kind == "kernel" and comms.is_comm_kernel(g.name):
            comm[g.stream] = comm.get(g.stream, 0.0) + g.end - g.ts
        elif g.kind == "kernel":
            compute.add(g.stream)
    shared = sorted(set(comm) & compute)
    if not shared:
        return 0.0, [], None
    starts = {g.ts for g in trace.gpu if g.stream in shared and comms.is_comm_kernel(g.name)}
    at = next((c.location for c in calls if c.on_gpu and c.start in starts), None)
    return sum(comm[s] for s in shared), shared, at


# The ranges FSDP2's hooks record around their work (torch.distributed.fsdp._fully_shard): each unit's
# "FSDP::pre_forward (blocks.3)", "FSDP::post_backward_reduce (blocks.3)", ... (the root unit's without a name).
# The collectives and copies they launch run inside them; what they add to a step is host time.
_FSDP_HOOK = re.compile(r"^FSDP::(root_pre_forward|pre_forward|post_forward|pre_backward|post_backward\w*|"
                        r"root_post_backward_callback)(?: \((.+?)\))?(?: \[pg=\d+\])?$")


# AOTAutograd's autograd.Function around each graph torch.compile made: a host op each time a graph's forward runs
# (its backward is "CompiledFunctionBackward"). Dynamo's DDP optimizer splits a DDP model's graph at its buckets.
COMPILED_GRAPH = "CompiledFunction"


def _fsdp2_hooks(trace: Trace, resolver: Resolver) -> tuple[float, int, Location | None]:
    """(host us in FSDP2's hooks over the window, fully_shard units seen, the line the first unit's forward
    hooks ran at)."""
    spans, units, first = [], set(), None
    for i, op in enumerate(trace.ops):
        found = _FSDP_HOOK.match(op.name) if op.annotation else None
        if found is None:
            continue
        spans.append((op.ts, op.end))
        if found[1] == "pre_forward":
            units.add(found[2] or "")
            if first is None or op.ts < trace.ops[first].ts:
                first = i
    where = None
    if first is not None:
        stack = resolver.resolve(first)[0]
        where = stack[-1] if stack else None
    return _length(_union(spans)), len(units), where


def _compiled_graphs(trace: Trace, resolver: Resolver) -> tuple[int, Location | None]:
    """(the compiled graphs' forwards run in the window, the line that ran the first)."""
    runs = [i for i, op in enumerate(trace.ops) if op.name == COMPILED_GRAPH and not op.backward]
    if not runs:
        return 0, None
    stack = resolver.resolve(min(runs, key=lambda i: trace.ops[i].ts))[0]
    return len(runs), stack[-1] if stack else None


def _host_syncs(trace: Trace, timeline: Timeline, steps: int) -> list[HostSync]:
    """The program's lines at which the host waited for the GPU, a step (on a CPU, the host never waits for one)."""
    if not trace.gpu:
        return []
    return [HostSync(x.location, x.call, x.count / steps, x.wait_us / steps / 1e3, x.gain_us / steps / 1e3)
            for x in timeline.syncs if x.location is not None]


def rank_of(trace: Trace, rank: int) -> Rank:
    resolver = Resolver(trace)
    calls = comms.calls(trace, resolver)
    comm = _union((c.start, c.end) for c in calls)
    compute = _compute_spans(trace, calls)
    steps = len(trace.steps) or 1
    step_ms = statistics.median(e - s for s, e in trace.steps) / 1e3 if trace.steps else None
    mean_step_ms = statistics.fmean(e - s for s, e in trace.steps) / 1e3 if trace.steps else None
    exposed = _length(comm) - _overlap(comm, compute)
    timed = unprofiled_steps(trace)["gpu_ms" if trace.gpu else "wall_ms"]
    serialized, streams, at = _serialized(trace, calls)
    hooks, units, hooks_at = _fsdp2_hooks(trace, resolver)
    graphs, graphs_at = _compiled_graphs(trace, resolver)
    timeline = analyze(trace, resolver)
    overhead = measure_overhead(trace, timeline)
    return Rank(rank, trace, calls, len(trace.steps), step_ms, _length(compute) / steps / 1e3,
                _length(comm) / steps / 1e3, exposed / steps / 1e3, statistics.median(timed) if timed else None,
                compute, comm, serialized / steps / 1e3, streams, at, hooks / steps / 1e3, units, hooks_at,
                mean_step_ms, _host_syncs(trace, timeline, steps), graphs / steps, graphs_at,
                overhead.profiled_step_ms if overhead else mean_step_ms, overhead.inflation if overhead else None)


# --------------------------------------------------------------------------- the ranks together

@dataclass
class Straggler:
    rank: int
    last_at: int                 # the matched calls it arrived at last, recorded
    calls: int                   # the matched calls, recorded
    waited_ms: float             # a step: the others' wait for it, summed over them, recorded
    where: Location | None       # the line it spent the most time at beyond the other ranks', recorded
    where_ms: float              # that excess, a step
    compute_excess_ms: float = 0.0   # a step: its compute beyond the other ranks' median (a slower GPU, more work)
    held_ms: float | None = None     # a step, unrecorded: its lead over the next latest rank at each collective,
                                     # timed by NCCL outside the window (distributed.ledger); None where untimed

    @property
    def explained_ms(self) -> float:
        """What the straggler itself spent a step beyond the others, at a line or on its GPU (recorded)."""
        return max(self.where_ms, self.compute_excess_ms)

    @property
    def gain_ms(self) -> float:
        """What a step would win without the straggler's lead. Where NCCL timed the steps outside the window, the
        lead it held the others back by there. Else what it spent beyond the others, at most what they waited:
        the others' recorded wait alone can be far longer, since under the recorder every host is slower, and a
        small lead of one host's grows into long waits of the others' GPUs."""
        return self.held_ms if self.held_ms is not None else min(self.explained_ms, self.waited_ms)

    def to_dict(self) -> dict:
        return {"rank": self.rank, "last_at": self.last_at, "calls": self.calls, "waited_ms": self.waited_ms,
                "where": str(self.where) if self.where else None, "where_ms": self.where_ms,
                "compute_excess_ms": self.compute_excess_ms, "explained_ms": self.explained_ms,
                "held_ms": self.held_ms, "gain_ms": self.gain_ms}


@dataclass
class Merged:
    ranks: list[Rank]
    offsets_us: list[float]      # each rank's clock against rank 0's (aligned on the ends of matched transfers)
    matched: int                 # collective calls matched across every rank
    mismatch: str | None         # why the ranks' calls could not all be matched, where they could not
    straggler: Straggler | None
    waits_ms: list[float]        # a step, each rank's wait for later ranks at matched calls (in the order of ranks)
    ledger: ledger.Ledger | None = None   # the steps outside the window, their calls timed by NCCL

    @property
    def world(self) -> int:
        """The ranks read (a rank that wrote no trace is not among them)."""
        return len(self.ranks)

    def to_dict(self) -> dict:
        return {"schema": "roofline.ranks/1", "world_size": self.world, "offsets_us": self.offsets_us,
                "matched": self.matched, "mismatch": self.mismatch, "waits_ms": self.waits_ms,
                "ranks": [r.to_dict() for r in self.ranks],
                "unrecorded": self.ledger.to_dict() if self.ledger else None,
                "straggler": self.straggler.to_dict() if self.straggler else None,
                "collectives": collective_rows(self), "host_syncs": host_sync_rows(self), "lanes": lanes(self)}


def _offsets(ranks: list[Rank], matched: int) -> list[float]:
    """Each rank's clock minus rank 0's: the median over matched calls of the difference of their transfers' ends."""
    if not matched:
        return [0.0] * len(ranks)
    return [statistics.median(r.calls[i].end - ranks[0].calls[i].end for i in range(matched)) for r in ranks]


def _line_times(trace: Trace, spans: list[tuple[float, float]]) -> dict[Location, float]:
    """Host time at each of the program's lines (its innermost user frame) within the spans, from the line marks
    of the program's main thread: a line's time runs from its mark to the next. One sweep over both, sorted."""
    tid = Resolver(trace).marked_tid
    if tid is None or not spans:
        return {}
    times, ids = trace.marks[tid]
    stacks = trace.facts.get("stacks") or []
    spans = _union(spans)
    out: dict[Location, float] = {}
    j = 0
    for k in range(len(times) - 1):
        a, b = times[k], times[k + 1]
        while j < len(spans) and spans[j][1] <= a:
            j += 1
        inside, m = 0.0, j
        while m < len(spans) and spans[m][0] < b:
            inside += min(b, spans[m][1]) - max(a, spans[m][0])
            m += 1
        stack = stacks[ids[k]] if 0 <= ids[k] < len(stacks) else None
        if inside > 0 and stack:
            loc = Location(*stack[-1])
            out[loc] = out.get(loc, 0.0) + inside
    return out


def _arrival(call: comms.Call) -> float:
    """When a rank arrived at a collective: on a GPU when its stream reached NCCL's kernel (the host runs ahead);
    over gloo when the host called it (gloo's worker thread may start the transfer later, as a loaded host
    schedules it)."""
    return call.start if call.on_gpu else call.arrived


def _straggler(ranks: list[Rank], matched: int, offsets: list[float],
               timed: ledger.Ledger | None) -> tuple[Straggler | None, list[float]]:
    """The rank that holds the others back, and each rank's wait a step (ms), recorded. Where NCCL timed the
    steps outside the window, they say whether a rank holds the others back (the recorder's stretch can make one
    look late); else the recorded calls do. Either way one rank must make most of the waits (ledger.dominant):
    ranks that take turns arriving last are noise; recorded, it must also hold the others back most in most steps."""
    n, steps = len(ranks), max(ranks[0].steps, 1)
    waits, caused, lasts = [0.0] * n, [0.0] * n, []
    by_step: dict[int, list[float]] = {}   # a step of rank 0's -> what each rank held the others back in it
    for i in range(matched):
        arrived = [_arrival(r.calls[i]) - offsets[k] for k, r in enumerate(ranks)]
        last = max(range(n), key=lambda k: arrived[k])
        lasts.append(last)
        held = sum(arrived[last] - a for a in arrived)
        for k in range(n):
            waits[k] += arrived[last] - arrived[k]
        caused[last] += held
        step = next((j for j, (start, end) in enumerate(ranks[0].trace.steps)
                     if start <= ranks[0].calls[i].arrived < end), None)
        if step is not None:
            by_step.setdefault(step, [0.0] * n)[last] += held
    waits = [w / steps / 1e3 for w in waits]
    culprit = timed.straggler if timed is not None else ledger.dominant(caused) if n > 1 else None
    # Recorded alone, it must also hold the others back most in most steps (or, with no steps marked, arrive last
    # at most calls): one long hiccup can make three quarters of the waits (two gloo ranks of examples/ddp_train.py,
    # no rank slowed, named one rank or the other in 5 runs of 6, once a rank last at 4 calls of 10). By steps, not
    # calls: a rank late once a step, to the first of several collectives, is last at few of them
    if timed is None and culprit is not None:
        most = ([max(range(n), key=held.__getitem__) for held in by_step.values()] if by_step else lasts)
        if 2 * most.count(culprit) <= len(most):
            culprit = None
    if culprit is None:
        return None, waits
    # Where it lost the time: the line at which its host spent the most beyond the other ranks' (the median), over
    # the window. Not only before the calls it held up: on a GPU the host runs ahead, and the GPU's wait for it
    # comes later than the line that made it.
    lines = [_line_times(r.trace, [(r.trace.start, r.trace.end)]) for r in ranks]
    excess = {loc: t - statistics.median([lines[k].get(loc, 0.0) for k in range(n) if k != culprit])
              for loc, t in lines[culprit].items()}
    where = max(excess, key=excess.get) if excess else None
    others = statistics.median(r.compute_ms for k, r in enumerate(ranks) if k != culprit)
    return Straggler(ranks[culprit].rank, lasts.count(culprit), matched, caused[culprit] / steps / 1e3, where,
                     (excess[where] if where else 0.0) / steps / 1e3, max(ranks[culprit].compute_ms - others, 0.0),
                     timed.held_ms[culprit] if timed is not None else None), waits


def merge(traces: dict[int, Trace]) -> Merged:
    """The ranks' traces ({rank: trace}) read together.

    Calls are matched by their order on every rank, as far as they agree in kind and size: a program whose ranks
    call different collectives at once (tensor or pipeline parallel groups beside data parallel ones) is matched
    up to its first disagreement, and the report says where."""
    ranks = [rank_of(t, rank) for rank, t in sorted(traces.items())]
    counts = [len(r.calls) for r in ranks]
    matched = min(counts) if ranks else 0
    mismatch = None
    if len(set(counts)) > 1:
        mismatch = f"the ranks recorded {', '.join(map(str, counts))} collective calls; the first {matched} compared"
    for i in range(matched):
        shapes = {(r.calls[i].kind, r.calls[i].nbytes) for r in ranks}
        if len(shapes) > 1:
            said = " and ".join(f"{kind} of {nbytes or '?'} bytes" for kind, nbytes in sorted(shapes, key=str))
            mismatch = f"call {i + 1} is {said} on different ranks (other process groups?): the first {i} compared"
            matched = i
            break
    offsets = _offsets(ranks, matched)
    timed = ledger.match([_unrecorded_calls(r.trace) for r in ranks])
    straggler, waits = _straggler(ranks, matched, offsets, timed)
    return Merged(ranks, offsets, matched, mismatch, straggler, waits, timed)


def _unrecorded_calls(trace: Trace) -> list[dict]:
    return (trace.facts.get("unprofiled_steps") or {}).get("collectives") or []


LANE_BINS = 400   # the ranks' timeline: bins over the recorded window


def _binned(spans, start: float, width: float, bins: int) -> list[float]:
    """The share of each of `bins` bins of `width` (from `start`) that the spans (a union, sorted) cover."""
    out = [0.0] * bins
    for a, b in spans:
        first, last = max(int((a - start) // width), 0), min(int((b - start) // width), bins - 1)
        for i in range(first, last + 1):
            lo, hi = start + i * width, start + (i + 1) * width
            out[i] += max(min(b, hi) - max(a, lo), 0.0) / width
    return [round(min(x, 1.0), 3) for x in out]


def lanes(merged: Merged, bins: int = LANE_BINS) -> dict | None:
    """Every rank's recorded window side by side, on rank 0's clock: for each bin, the share its compute and its
    communication took (the HTML report's ranks timeline); None where no rank recorded a span."""
    shifted = [[(a - off, b - off) for a, b in spans] for r, off in zip(merged.ranks, merged.offsets_us)
               for spans in (r.compute_spans, r.comm_spans)]
    ends = [x for spans in shifted for span in spans for x in span]
    if not ends:
        return None
    start, end = min(ends), max(ends)
    width = max(end - start, 1e-3) / bins
    return {"start_us": start, "bin_us": width,
            "ranks": [{"rank": r.rank, "compute": _binned(shifted[2 * k], start, width, bins),
                       "comm": _binned(shifted[2 * k + 1], start, width, bins)} for k, r in enumerate(merged.ranks)]}


def collective_rows(merged: Merged) -> list[dict]:
    """The collectives grouped by kind, size and line: calls a rank and a step, their time (the median rank's total
    a step, recorded, waits included), and their median call's transfer time and bus bandwidth: each call's
    shortest time over the ranks (the last rank to arrive waits for none: its time is the transfer's), unrecorded
    where NCCL timed the steps outside the window, else recorded (where the ranks made as many calls; else the
    median call's, its wait included). Over gloo, a 257 KiB all_reduce's median call had read 45 ms, its wait."""
    groups: dict[tuple, list[list[comms.Call]]] = {}
    for k, r in enumerate(merged.ranks):
        for c in r.calls:
            key = (c.kind, c.nbytes, str(c.location) if c.location else None)
            groups.setdefault(key, [[] for _ in merged.ranks])[k].append(c)
    steps = max(merged.ranks[0].steps, 1) if merged.ranks else 1
    rows = []
    for (kind, nbytes, where), per_rank in groups.items():
        totals = [sum(c.us for c in calls) for calls in per_rank]
        every = [c for calls in per_rank for c in calls]
        median_call = sorted(every, key=lambda c: c.us)[len(every) // 2]
        transfers = merged.ledger.transfers.get((kind, nbytes)) if merged.ledger else None
        call_us = statistics.median(transfers) * 1e3 if transfers else _recorded_transfer_us(per_rank, median_call)
        busbw = comms.busbw_gbps(kind, nbytes, call_us, merged.world)
        rows.append({"kind": kind, "bytes": nbytes, "where": where, "owner": comms.owners(per_rank[0]),
                     "calls": len(per_rank[0]) / steps,
                     "ms": statistics.median(totals) / steps / 1e3, "call_us": call_us, "busbw_gbps": busbw,
                     "unrecorded": bool(transfers), "on_gpu": median_call.on_gpu,
                     "asynchronous": median_call.asynchronous})
    return sorted(rows, key=lambda row: -row["ms"])


def _recorded_transfer_us(per_rank: list[list[comms.Call]], median_call: comms.Call) -> float:
    """The median over the calls of each call's shortest time over the ranks, where every rank made as many (the
    n-th of each rank's is one call); else the median call's, its wait included."""
    if len({len(calls) for calls in per_rank}) != 1 or not per_rank[0]:
        return median_call.us
    return statistics.median(min(c.us for c in call) for call in zip(*per_rank))


def host_sync_rows(merged: Merged) -> list[dict]:
    """The lines at which hosts waited for their GPUs, across the ranks: which ranks wait there, and a step: the
    calls (the median of those ranks), each of those ranks' wait in them and the GPU idle after them that it would
    win without them (lists in the order of "ranks"), the largest gain first."""
    groups: dict[tuple, dict[int, HostSync]] = {}
    for r in merged.ranks:
        for x in r.syncs:
            groups.setdefault((str(x.location), x.call), {})[r.rank] = x
    rows = [{"where": where, "call": call, "ranks": sorted(per_rank), "every_rank": len(per_rank) == merged.world,
             "calls": statistics.median(x.calls for x in per_rank.values()),
             "wait_ms": [x.wait_ms for _, x in sorted(per_rank.items())],
             "gain_ms": [x.gain_ms for _, x in sorted(per_rank.items())]}
            for (where, call), per_rank in groups.items()]
    return sorted(rows, key=lambda row: -max(row["gain_ms"]))
