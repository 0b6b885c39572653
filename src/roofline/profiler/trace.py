"""The trace model: one PyTorch profiler trace (Chrome/Perfetto JSON, as torch.profiler writes it),
read into flat lists of events with every link the analyses need already resolved:

    GPU activity --correlation--> runtime call --time nesting, same thread--> innermost host op
    host op --time nesting--> enclosing op (parent) and innermost Python frame (with file and line)
    backward op --autograd sequence number--> the forward op that created it

The file is read once, as a stream (gunzipped on the fly), event by event (`iter_events`):
at most a few MB of its text are held at a time, and no parsed document, so a trace of a
million events costs only the compact events.
"""

from __future__ import annotations

import bisect
import collections
import gzip
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# Annotations roofline adds while recording (see capture): module attribute paths, and user call stacks.
MODULE_MARK = "roofline.module: "
LINE_MARK = "roofline.line: "


# own marks come from the wall clock, the trace's host events from Kineto's: a few us of slack between them
CLOCK_SLACK_US = 10.0


class TraceError(ValueError):
    """The file is not a trace roofline can read."""


@dataclass(slots=True)
class Frame:
    """One Python function call the profiler's Python tracer saw (or an nn.Module call it named)."""
    name: str
    tid: int
    ts: float
    end: float
    file: str | None = None       # None for built-ins and module markers
    line: int = 0
    function: str = ""
    parent: int = -1              # index of the calling frame


@dataclass(slots=True)
class Op:
    """A host-side range: an aten op, an autograd node, or a user annotation (record_function)."""
    name: str
    tid: int
    ts: float
    end: float
    annotation: bool = False      # record_function / module mark rather than an operator
    shapes: list | None = None    # "Input Dims"
    dtypes: list | None = None    # "Input type"
    strides: list | None = None
    scalars: list | None = None   # "Concrete Inputs"
    seq: int = -1                 # autograd sequence number (links forward and backward)
    backward: bool = False        # recorded by the autograd engine ("Fwd thread id" set)
    parent: int = -1              # enclosing op on the same thread
    frame: int = -1               # innermost Python frame enclosing the op's start
    forward: int = -1             # for backward ops: the forward op with the same sequence number


@dataclass(slots=True)
class Runtime:
    """A CUDA runtime or driver call on the host (cudaLaunchKernel, cudaMemcpyAsync, cudaStreamSynchronize...)."""
    name: str
    tid: int
    ts: float
    end: float
    correlation: int = -1
    op: int = -1                  # innermost op enclosing the call
    frame: int = -1               # innermost Python frame enclosing the call


@dataclass(slots=True)
class GpuEvent:
    """Work the GPU did: a kernel, a memcpy or a memset."""
    kind: str                     # "kernel" | "memcpy" | "memset"
    name: str
    ts: float
    end: float
    device: int = 0
    stream: int = 0
    correlation: int = -1
    grid: tuple | None = None
    block: tuple | None = None
    registers: int | None = None
    shared_bytes: int | None = None
    bytes: int | None = None      # copies and memsets
    launch: int = -1              # index of the runtime call that launched it

    @property
    def dur(self) -> float:
        return self.end - self.ts


@dataclass(slots=True)
class Sync:
    """A host wait on the GPU that CUPTI recorded (Context/Stream/Event Sync, Stream Wait Event)."""
    name: str
    ts: float
    end: float
    stream: int = -1
    correlation: int = -1
    launch: int = -1              # the runtime call that waited (cudaStreamSynchronize...)


@dataclass
class Trace:
    frames: list[Frame] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    runtime: list[Runtime] = field(default_factory=list)
    gpu: list[GpuEvent] = field(default_factory=list)
    syncs: list[Sync] = field(default_factory=list)
    steps: list[tuple[float, float]] = field(default_factory=list)   # ProfilerStep#N ranges
    marks: dict = field(default_factory=dict)    # tid -> ([ts, ...], [stack id, ...]): roofline's line marks
    meta: dict = field(default_factory=dict)                         # the file's other top-level keys
    path: str | None = None
    start: float = 0.0
    end: float = 0.0
    tail_us: float = 0.0          # host time after the window's last whole step, left out (see keep_whole_steps)

    @property
    def kernels(self) -> list[GpuEvent]:
        return [g for g in self.gpu if g.kind == "kernel"]

    @property
    def wall_us(self) -> float:
        return self.end - self.start

    @property
    def facts(self) -> dict:
        """What roofline noted about the process that recorded the trace (capture.run_facts); {} where nothing was
        noted (another profiler's trace)."""
        return self.meta.get("roofline") or {}

    @property
    def device_properties(self) -> list[dict]:
        return self.meta.get("deviceProperties") or []


# ----------------------------------------------------------------------- reading

_WS = re.compile(r"[ \t\n\r]*")


_CHUNK = 1 << 22               # characters read at a time: the most of the raw JSON ever held


def _open_stream(path: Path):
    """The trace as a text stream (gunzipped on the fly when it starts with gzip's magic number)."""
    try:
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
        return gzip.open(path, "rt", encoding="utf-8") if gz else open(path, encoding="utf-8")
    except OSError as exc:
        raise TraceError(f"cannot read trace {path}: {exc.strerror or exc}") from None


class _Reader:
    """JSON values decoded one at a time from a text stream, holding only a window of the text.

    A value that runs past the window's end fails to decode, or (a number) stops at it: either
    way more text is read and the value decoded again.
    """

    def __init__(self, stream, source: str):
        self.stream, self.source = stream, source
        self.buf, self.pos, self.offset, self.eof = "", 0, 0, False
        self.decoder = json.JSONDecoder()
        self.more()

    def more(self) -> bool:
        if self.eof:
            return False
        try:
            chunk = self.stream.read(_CHUNK)
        except (OSError, EOFError, UnicodeDecodeError) as exc:
            what = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else f"a damaged gzip file ({exc})"
            raise TraceError(f"{self.source} is not a readable JSON trace: {what}") from None
        self.eof = not chunk
        self.offset += self.pos
        self.buf, self.pos = self.buf[self.pos:] + chunk, 0
        return not self.eof

    def skip_ws(self) -> None:
        while True:
            self.pos = _WS.match(self.buf, self.pos).end()
            if self.pos < len(self.buf) or not self.more():
                return

    def peek(self) -> str:
        self.skip_ws()
        return self.buf[self.pos: self.pos + 1]

    def expect(self, char: str) -> None:
        if self.peek() != char:
            self.fail(f"expected {char!r}")
        self.pos += 1

    def fail(self, what: str):
        raise TraceError(f"{self.source} is not a Chrome/Perfetto JSON trace: {what} at character "
                         f"{self.offset + self.pos}")

    def value(self):
        self.skip_ws()
        while True:
            try:
                value, end = self.decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                if self.more():
                    continue
                raise TraceError(f"{self.source} is not valid JSON: {exc.msg} at character "
                                 f"{self.offset + exc.pos}") from None
            if end == len(self.buf) and self.more():
                continue              # a number (or literal) may go on in the next chunk
            self.pos = end
            return value


def iter_events(stream, meta: dict, source: str = "trace"):
    """Yield the trace's events one at a time from a text stream (or a string); the other top-level keys go
    in `meta`. Accepts the Chrome trace object form ({"traceEvents": [...], ...}) and the bare array form."""
    r = _Reader(io.StringIO(stream) if isinstance(stream, str) else stream, source)

    def array():
        r.expect("[")
        if r.peek() == "]":
            r.pos += 1
            return
        while True:
            event = r.value()
            if isinstance(event, dict):
                yield event
            c = r.peek()
            if c == ",":
                r.pos += 1
                if r.peek() == "]":   # tolerate a trailing comma, as Chrome does
                    r.pos += 1
                    return
            elif c == "]":
                r.pos += 1
                return
            else:
                r.fail("expected ',' or ']' between events")

    if r.peek() == "[":
        yield from array()
        return
    r.expect("{")
    found = False
    while r.peek() != "}":
        if not r.peek():
            r.fail("unexpected end")
        key = r.value()
        if not isinstance(key, str):
            r.fail("expected a key")
        r.expect(":")
        if key == "traceEvents":
            found = True
            yield from array()
        else:
            meta[key] = r.value()
        c = r.peek()
        if c == ",":
            r.pos += 1
        elif c != "}":
            r.fail("expected ',' or '}'")
    if not found:
        raise TraceError(f"{source} has no traceEvents: not a Chrome/Perfetto trace")


_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_GPU_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
_RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}


def _int(value, default=-1) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _tid(event) -> int:
    # Kineto writes thread ids as numbers; GPU rows sometimes as "stream 7" strings.
    tid = event.get("tid", 0)
    if isinstance(tid, str):
        digits = re.sub(r"\D", "", tid)
        return int(digits) if digits else hash(tid)
    return int(tid)


def _add(trace: Trace, e: dict) -> None:
    ph = e.get("ph")
    if ph != "X":
        return
    cat = e.get("cat", "")
    name = e.get("name", "")
    try:
        ts = float(e["ts"])
        end = ts + float(e.get("dur", 0.0))
    except (KeyError, TypeError, ValueError):
        return
    args = e.get("args") or {}
    if cat == "cpu_op" or cat == "user_annotation" or cat == "operator":
        if cat == "user_annotation" and name.startswith("ProfilerStep#"):
            trace.steps.append((ts, end))
            return
        if name.startswith(LINE_MARK):
            times, ids = trace.marks.setdefault(_tid(e), ([], []))
            times.append(ts)
            ids.append(_int(name[len(LINE_MARK):]))
            return
        trace.ops.append(Op(
            name, _tid(e), ts, end, annotation=cat == "user_annotation" or name.startswith(MODULE_MARK),
            shapes=args.get("Input Dims"), dtypes=args.get("Input type"), strides=args.get("Input Strides"),
            scalars=args.get("Concrete Inputs"), seq=_int(args.get("Sequence number")),
            backward=bool(args.get("Fwd thread id"))))
    elif cat == "python_function":
        found = _FRAME.match(name)
        frame = Frame(name, _tid(e), ts, end)
        if found:
            frame.file, frame.line, frame.function = found[1], int(found[2]), found[3]
        trace.frames.append(frame)
    elif cat in _GPU_KINDS:
        kind = _GPU_KINDS[cat]
        g = GpuEvent(kind, name, ts, end, device=_int(args.get("device"), 0), stream=_int(args.get("stream"), 0),
                     correlation=_int(args.get("correlation")))
        if kind == "kernel":
            g.grid, g.block = _dims(args.get("grid")), _dims(args.get("block"))
            g.registers = _int(args.get("registers per thread"), None)
            g.shared_bytes = _int(args.get("shared memory"), None)
        else:
            g.bytes = _int(args.get("bytes"), None)
        trace.gpu.append(g)
    elif cat in _RUNTIME_CATS:
        trace.runtime.append(Runtime(name, _tid(e), ts, end, correlation=_int(args.get("correlation"))))
    elif cat == "cuda_sync":
        trace.syncs.append(Sync(name, ts, end, stream=_int(args.get("stream")),
                                correlation=_int(args.get("correlation"))))


def _dims(value) -> tuple | None:
    if isinstance(value, (list, tuple)) and all(isinstance(v, (int, float)) for v in value):
        return tuple(int(v) for v in value)
    return None


def load(path: str | Path) -> Trace:
    """Read a torch.profiler trace (.json or .json.gz) into the linked trace model."""
    path = Path(path)
    if not path.exists():
        raise TraceError(f"no such trace file: {path}")
    trace = Trace(path=str(path))
    with _open_stream(path) as stream:
        for event in iter_events(stream, trace.meta, source=str(path)):
            _add(trace, event)
    place_own_marks(trace)
    keep_whole_steps(trace)
    link(trace)
    return trace


def place_own_marks(trace: Trace) -> None:
    """A window that records no op (capture's ops=False) records no mark either: roofline kept its line, module and
    step marks on the wall clock (facts' "own_marks"). Here they join the trace's events, as the marks recorded in
    the trace would: a trace's time plus its baseTimeNanoseconds is the same wall clock, in microseconds."""
    own = trace.facts.get("own_marks")
    if not own:
        return
    base = trace.meta.get("baseTimeNanoseconds")
    if not isinstance(base, int):
        raise TraceError(f"{trace.path}: roofline's own marks need the trace's baseTimeNanoseconds, which it lacks")

    def us(ns: int) -> float:
        return (ns - base) / 1e3

    # The marks name a thread by its system id. Without CPU activity Kineto may name the thread of a launch by
    # its pthread id instead, as its threadId() does: the low 32 bits, signed. The name the launches use is taken;
    # where none of those is one, the name capture's handshakes found (_handshaken).
    launching = {r.tid for r in trace.runtime}
    pthread_ids = {int(k): v for k, v in (own.get("pthread_ids") or {}).items()}
    shaken = _handshaken(trace, own.get("handshakes") or [], us)

    def thread(tid) -> int:
        tid = int(tid)
        low = pthread_ids.get(tid, tid) & 0xFFFFFFFF
        found = next((t for t in (tid, low - (1 << 32) if low >= 1 << 31 else low, low) if t in launching), None)
        return found if found is not None else shaken.get(tid, tid)

    for tid, (times, ids) in (own.get("lines") or {}).items():
        kept_times, kept_ids = trace.marks.setdefault(thread(tid), ([], []))
        kept_times.extend(us(t) for t in times)
        kept_ids.extend(ids)
    for tid, start, end, path in own.get("modules") or []:
        trace.ops.append(Op(MODULE_MARK + path, thread(tid), us(start), us(end), annotation=True))
    trace.steps.extend((us(start), us(end)) for start, end in own.get("steps") or [])


def _handshaken(trace: Trace, handshakes: list, us) -> dict[int, int]:
    """System thread id -> the trace's name for that thread, by the cudaEventRecord calls inside capture's
    handshakes ([wall ns before, after, system thread id]): the name most of a thread's handshakes hold. A span
    that holds records of several threads tells nothing."""
    records = sorted((r.ts, r.end, r.tid) for r in trace.runtime if r.name.startswith("cudaEventRecord"))
    starts = [ts for ts, _, _ in records]
    votes: dict[int, collections.Counter] = {}
    for before, after, native in handshakes:
        low, high = us(before) - CLOCK_SLACK_US, us(after) + CLOCK_SLACK_US
        inside = {tid for ts, end, tid in records[bisect.bisect_left(starts, low):bisect.bisect_right(starts, high)]
                  if end <= high}
        if len(inside) == 1:
            votes.setdefault(int(native), collections.Counter())[inside.pop()] += 1
    return {native: counted.most_common(1)[0][0] for native, counted in votes.items()}


def keep_whole_steps(trace: Trace) -> None:
    """Leave out what ran before the window's first step and after its last whole step.

    A window that runs to the program's end (no `active` count, or a program shorter than it) closes at exit, so
    torch's last step range holds the program's tail, after its last step mark: no step, and per-step figures
    would count it as one. capture writes how many whole steps it recorded ("window_steps"); the ranges before
    the last are those. Host events that start after the last whole step are dropped, and GPU work with them
    (GPU work launched within the steps stays, wherever it ran). Traces without that fact keep their steps.
    Before the first step, the warm-up step's end may be recorded: capture's wait there for the skipped steps'
    queued GPU work (74 ms of host idle that opened a two-rank window of 874 ms once). Host events that end
    before the first step are dropped, and GPU work with them; each thread's last mark before it moves to its
    start (the line its first work is on, with no time before the step).
    """
    n = trace.facts.get("window_steps")
    if isinstance(n, int) and not isinstance(n, bool) and len(trace.steps) > n:
        trace.steps.sort()
        partial, trace.steps = trace.steps[n:], trace.steps[:n] if n else []
        if not n:
            return   # no whole step: the window is the region, not steps
        cut = trace.steps[-1][1]
        trace.tail_us = max(end for _, end in partial) - cut
        _keep(trace, lambda e: e.ts < cut, lambda g: g.ts < cut)
        for times, ids in trace.marks.values():
            keep = [k for k, t in enumerate(times) if t < cut]
            times[:], ids[:] = [times[k] for k in keep], [ids[k] for k in keep]
    if trace.steps:
        head = min(start for start, _ in trace.steps)
        _keep(trace, lambda e: e.end > head - CLOCK_SLACK_US, lambda g: g.ts >= head)
        for times, ids in trace.marks.values():
            order = sorted(range(len(times)), key=times.__getitem__)
            times[:], ids[:] = [times[k] for k in order], [ids[k] for k in order]
            before = bisect.bisect_left(times, head)
            if before:
                times[:before], ids[:before] = [head], [ids[before - 1]]


def _keep(trace: Trace, kept, kept_unlaunched) -> None:
    """Keep the host events that `kept` (a test of an event) and the GPU work they launched, and the GPU work with
    no recorded launch that `kept_unlaunched`."""
    trace.ops = [o for o in trace.ops if kept(o)]
    trace.frames = [f for f in trace.frames if kept(f)]
    runtime = [r for r in trace.runtime if kept(r)]
    launched = {r.correlation for r in trace.runtime if r.correlation >= 0}
    kept_launches = {r.correlation for r in runtime if r.correlation >= 0}
    trace.runtime = runtime
    trace.gpu = [g for g in trace.gpu
                 if g.correlation in kept_launches or (g.correlation not in launched and kept_unlaunched(g))]
    trace.syncs = [y for y in trace.syncs if kept(y)]


# ----------------------------------------------------------------------- linking

class _Nesting:
    """For events on one thread, sorted by start: which range innermost encloses a given time."""

    def __init__(self, items: list, indices: list[int]):
        # Ranges nest (a call stack), so a sweep with a stack gives each range its parent,
        # and a lookup walks parents from the last range starting at or before t.
        self.starts = [items[i].ts for i in indices]
        self.indices = indices
        self.items = items
        self.parent = [-1] * len(indices)
        stack: list[int] = []
        for k, i in enumerate(indices):
            ts = items[i].ts
            while stack and items[indices[stack[-1]]].end <= ts:
                stack.pop()
            self.parent[k] = stack[-1] if stack else -1
            stack.append(k)

    def enclosing(self, t: float, inclusive_end: bool = False) -> int:
        """Index (into items) of the innermost range with ts <= t < end, or -1."""
        k = bisect.bisect_right(self.starts, t) - 1
        while k >= 0:
            end = self.items[self.indices[k]].end
            if t < end or (inclusive_end and t <= end):
                return self.indices[k]
            k = self.parent[k]
        return -1


def _by_thread(items) -> dict[int, list[int]]:
    threads: dict[int, list[int]] = {}
    for i, item in enumerate(items):
        threads.setdefault(item.tid, []).append(i)
    for indices in threads.values():
        # Outer ranges first when two start together, so the inner one nests inside.
        indices.sort(key=lambda i: (items[i].ts, -items[i].end))
    return threads


def link(trace: Trace) -> None:
    """Resolve every cross-reference (parents, frames, launches, forward ops) in place."""
    frame_nest = {tid: _Nesting(trace.frames, idx) for tid, idx in _by_thread(trace.frames).items()}
    for nest in frame_nest.values():
        for k, i in enumerate(nest.indices):
            trace.frames[i].parent = nest.indices[nest.parent[k]] if nest.parent[k] >= 0 else -1
    op_nest = {tid: _Nesting(trace.ops, idx) for tid, idx in _by_thread(trace.ops).items()}
    for nest in op_nest.values():
        for k, i in enumerate(nest.indices):
            trace.ops[i].parent = nest.indices[nest.parent[k]] if nest.parent[k] >= 0 else -1

    def frame_at(tid, t):
        nest = frame_nest.get(tid)
        return nest.enclosing(t) if nest else -1

    for op in trace.ops:
        op.frame = frame_at(op.tid, op.ts)
    for call in trace.runtime:
        nest = op_nest.get(call.tid)
        call.op = nest.enclosing(call.ts) if nest else -1
        call.frame = frame_at(call.tid, call.ts)

    forward_by_seq: dict[int, list[int]] = {}
    for i, op in enumerate(trace.ops):
        if op.seq >= 0 and not op.backward and not op.annotation:
            forward_by_seq.setdefault(op.seq, []).append(i)
    for op in trace.ops:
        if op.backward and op.seq in forward_by_seq:
            # Sequence numbers count per forward thread; with several, take the latest forward before.
            candidates = [i for i in forward_by_seq[op.seq] if trace.ops[i].ts <= op.ts]
            if candidates:
                op.forward = max(candidates, key=lambda i: trace.ops[i].ts)

    for times, ids in trace.marks.values():
        order = sorted(range(len(times)), key=times.__getitem__)
        times[:], ids[:] = [times[k] for k in order], [ids[k] for k in order]

    launch_by_corr = {c.correlation: i for i, c in enumerate(trace.runtime) if c.correlation >= 0}
    for g in trace.gpu:
        g.launch = launch_by_corr.get(g.correlation, -1)
    for s in trace.syncs:
        s.launch = launch_by_corr.get(s.correlation, -1)

    # The window: all recorded work, and the marked steps (whose host time counts even where nothing ran). With
    # steps, host work ends with the last one: what runs on after it in a host range begun within it is the
    # profiler's own (the hook that marks the step stops the recording and collects the trace), which the window
    # would otherwise count as the last step's idle. GPU work still ends it.
    times = [t for items in (trace.ops, trace.gpu, trace.runtime) for t in
             (min((x.ts for x in items), default=None), max((x.end for x in items), default=None)) if t is not None]
    times += [t for step in trace.steps for t in step]
    trace.start, trace.end = (min(times), max(times)) if times else (0.0, 0.0)
    if trace.steps:   # a host range begun before the first step (a Python frame) does not open it
        trace.start = min([start for start, _ in trace.steps] + [g.ts for g in trace.gpu])
        trace.end = max([end for _, end in trace.steps] + [g.end for g in trace.gpu])


# ----------------------------------------------------------------------- queries

def module_path(trace: Trace, op_index: int) -> str | None:
    """The attribute path of the innermost module whose call encloses the op (see capture's module marks)."""
    i = op_index
    while i >= 0:
        op = trace.ops[i]
        if op.annotation and op.name.startswith(MODULE_MARK):
            return op.name[len(MODULE_MARK):]
        i = op.parent
    return None


def stack_at(trace: Trace, tid: int, ts: float) -> list | None:
    """The user's call stack on thread `tid` at time `ts`: its last line mark before then, or None."""
    found = trace.marks.get(tid)
    if not found:
        return None
    times, ids = found
    k = bisect.bisect_right(times, ts) - 1
    stacks = trace.facts.get("stacks") or []
    if k < 0 or not 0 <= ids[k] < len(stacks):
        return None
    return stacks[ids[k]]
