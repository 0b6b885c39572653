"""Record what a PyTorch program does, with torch.profiler, and hand the trace to the analyses.

Three ways in, one recorder:
    with roofline.profile() as prof: ...          a region of your own code (prof.step() marks iterations)
    roofline.profile(fn, *args)                   one call of a function
    roofline profile script.py [args]             a whole program, run as __main__ (see `run_path`)

What is recorded: host ops with their shapes, the Python stack above every op,
GPU kernels, copies and memsets, CUDA runtime calls and synchronizations, and
(when asked) memory. Nothing is recorded outside the window: the profiler and
roofline's hooks start on entry (or after `skip` steps) and stop on exit (or
after `active` steps). Steps outside the window are timed instead (StepClock),
so that the report can take the profiler's own cost out of its numbers.

Module names: PyTorch's Python tracer names modules by class and a counter
("Linear_3"); while recording, a global module hook marks every module call with
its attribute path instead ("MLP.layers.3"), which is what a user can find.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import runpy
import sys
import tempfile
import threading
import time as _time
import warnings
from pathlib import Path

import torch
from torch._C._profiler import _RecordFunctionFast

from roofline.inspect import generated
from roofline.libraries import library_roots
from roofline.profiler.trace import LINE_MARK, MODULE_MARK

_active: "Profiler | None" = None


def step() -> None:
    """Mark the end of one iteration of the program being profiled; does nothing when none is."""
    if _active is not None:
        first = not _active.marked_by_program
        _active.marked_by_program = True
        if first and _active.steps:
            return   # optimizer.step() already counted this iteration (see _optimizer_steps); marks count from now
        _active.step()


class _ModulePaths:
    """Annotate each nn.Module call with the module's attribute path, from the outermost module called: in the
    trace, or (own_clock, for a window that records no CPU op) as [thread, start ns, end ns, path] in `ranges`."""

    def __init__(self, own_clock: bool = False):
        self.own_clock = own_clock
        self.ranges: list[list] = []
        self.pthread_ids: dict[int, int] = {}
        self._stack: list[tuple[torch.nn.Module, str, object]] = []
        self._names: dict[tuple[int, int], str] = {}
        self._handles = []
        self.roots: dict[int, torch.nn.Module] = {}   # the outermost modules called (a DDP wrapper, a model)

    def _child_name(self, parent: torch.nn.Module, child: torch.nn.Module) -> str:
        key = (id(parent), id(child))
        if key not in self._names:
            self._names[key] = next((name for name, m in parent.named_children() if m is child),
                                    type(child).__name__)
        return self._names[key]

    def _enter(self, module, args):
        if torch.compiler.is_compiling():
            return
        if self._stack:
            parent, parent_path, _ = self._stack[-1]
            path = f"{parent_path}.{self._child_name(parent, module)}"
        else:
            path = type(module).__name__
            self.roots.setdefault(id(module), module)
        if self.own_clock:
            native = threading.get_native_id()
            if native not in self.pthread_ids:
                self.pthread_ids[native] = threading.get_ident()
            annotation = (native, _time.time_ns())
        else:
            annotation = _RecordFunctionFast(MODULE_MARK + path)
            annotation.__enter__()
        self._stack.append((module, path, annotation))

    def _close(self, path: str, annotation) -> None:
        if self.own_clock:
            native, start = annotation
            self.ranges.append([native, start, _time.time_ns(), path])
        else:
            annotation.__exit__(None, None, None)

    def _exit(self, module, args, output):
        if torch.compiler.is_compiling():
            return
        # Unwind to this module: a module that raised inside a child leaves the child's entry behind.
        while self._stack:
            entered, path, annotation = self._stack.pop()
            self._close(path, annotation)
            if entered is module:
                break

    def __enter__(self):
        hooks = torch.nn.modules.module
        self._handles = [hooks.register_module_forward_pre_hook(self._enter),
                         hooks.register_module_forward_hook(self._exit, always_call=True)]
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles = []
        while self._stack:
            _, path, annotation = self._stack.pop()
            self._close(path, annotation)


_RESUMABLE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


class _LineMarks:
    """Mark, in the trace, each moment the user's code moves to another line, with its whole call stack.

    torch.profiler's Python tracer knows which functions ran, but not the line within each
    (it records a function's first line), and torch calls written as operators (`a @ b`)
    are no calls at all. So while recording, every line the user's code starts, and every
    return into it, adds a zero-length annotation naming the user's stack at that moment
    (interned: the annotation carries an id into `table()`). An op then belongs to the last
    mark before it on its thread; its backward, through the autograd sequence number, to
    the same. Library code is never marked: on Python 3.12+ sys.monitoring disables its
    line and return events at the first hit (an unwinding frame's event cannot be disabled:
    library frames that raise still cost a call); before, sys.settrace declines to trace them.
    """

    def __init__(self, own_clock: bool = False):
        self.roots = tuple(library_roots())
        self.stacks: dict[tuple, int] = {}   # a user stack -> its id
        # own_clock: a window that records no CPU op records no mark either; the marks are kept here instead, on
        # the wall clock that the trace's times are in: {thread's native id: ([time ns, ...], [stack id, ...])}.
        self.own_clock = own_clock
        self.own: dict[int, tuple[list, list]] = {}
        self.pthread_ids: dict[int, int] = {}   # own_clock: each marking thread's system id -> its pthread id
        self._library: dict[str, bool] = {}
        self._cwd = os.path.join(os.getcwd(), "")
        self._last = threading.local()
        self._tool = None
        self._previous_trace = None
        # A line event costs one mark, not a walk up the whole stack: while a frame runs, the frames that called it
        # stay at their lines, so the id of the user stack above a frame is kept with the frame until it returns
        # (or unwinds), and a stack is interned by (the id above, code, line).
        self._above: dict | None = {}           # a user frame -> the id of the user stack above it (-1: none)
        self._ids: dict[tuple, int] = {}        # (id above, code, line) -> stack id
        self._by_id: list[tuple] = []           # stack id -> the stack
        self._names: list[str] = []             # stack id -> its mark's name
        self._where: dict = {}                  # code -> (its file as shown, its function)

    def _is_library(self, filename: str) -> bool:
        known = self._library.get(filename)
        if known is None:
            known = self._library[filename] = filename.startswith("<") or filename.startswith(self.roots)
        return known

    def _user_frame(self, frame):
        """frame, or the nearest frame above it in the user's code (None where there is none)."""
        while frame is not None and self._is_library(frame.f_code.co_filename):
            frame = frame.f_back
        return frame

    def _stack_id(self, frame, line: int) -> int:
        """The id of the user's stack with `frame` (a user frame) at `line`."""
        kept = self._above
        above = kept.get(frame) if kept is not None else None
        if above is None:
            above = self._resolve_above(frame)
        return self._intern(above, frame.f_code, line)

    def _intern(self, above: int, code, line: int) -> int:
        """The id of the stack `above` (an id, -1: none) with `code` at `line` below it."""
        key = (above, code, line)
        sid = self._ids.get(key)
        if sid is None:
            where = self._where.get(code)
            if where is None:
                where = self._where[code] = (code.co_filename.removeprefix(self._cwd), code.co_name)
            stack = (self._by_id[above] if above >= 0 else ()) + ((where[0], line, where[1]),)
            sid = self.stacks.get(stack)
            if sid is None:
                sid = self.stacks[stack] = len(self._by_id)
                self._by_id.append(stack)
                self._names.append(f"{LINE_MARK}{sid}")
            self._ids[key] = sid
        return sid

    def _resolve_above(self, frame) -> int:
        """The id of the user stack above `frame`, kept with each frame on the way: a loop, not a recursion, since
        a window may open deep in a recursive program."""
        pending = []   # user frames above frame whose stack above is not known yet, innermost first
        caller = self._user_frame(frame.f_back)
        above = -1
        kept = self._above or {}
        while caller is not None:
            known = kept.get(caller)
            if known is not None:
                above = self._intern(known, caller.f_code, caller.f_lineno)
                break
            pending.append(caller)
            caller = self._user_frame(caller.f_back)
        for caller in reversed(pending):
            self._keep(caller, above)
            above = self._intern(above, caller.f_code, caller.f_lineno)
        self._keep(frame, above)
        return above

    def _keep(self, frame, above: int) -> None:
        kept = self._above   # None once the window closed: a thread still in a callback then keeps nothing
        if kept is not None and not frame.f_code.co_flags & _RESUMABLE:   # a generator's caller changes
            kept[frame] = above

    def _mark(self, sid: int) -> None:
        last = self._last
        if getattr(last, "sid", None) != sid:   # a loop re-running one line needs one mark
            last.sid = sid
            if self.own_clock:
                kept = getattr(last, "kept", None)
                if kept is None:
                    native = threading.get_native_id()
                    self.pthread_ids[native] = threading.get_ident()
                    kept = last.kept = self.own.setdefault(native, ([], []))
                kept[0].append(_time.time_ns())
                kept[1].append(sid)
            else:
                with _RecordFunctionFast(self._names[sid] if sid >= 0 else f"{LINE_MARK}{sid}"):
                    pass

    def mark(self, frame) -> None:
        """Mark the user's stack at `frame` (or at the nearest user frame above it), at its current line."""
        frame = self._user_frame(frame)
        if frame is not None:
            self._mark(self._stack_id(frame, frame.f_lineno))

    def leave(self) -> None:
        """Mark that this thread is now at no line of the program (roofline's own work follows): a stack id that
        names no stack, so that nothing after it is charged to the line before."""
        self._mark(-1)

    def _left(self, frame) -> None:
        """frame returned or unwound: what was kept with it goes (a frame held keeps its locals alive)."""
        kept = self._above
        if kept is not None:
            kept.pop(frame, None)

    # Python 3.12+: sys.monitoring, cheap, and independent of the profiler's own hooks.
    def _on_line(self, code, line):
        if self._is_library(code.co_filename):
            return sys.monitoring.DISABLE
        self._mark(self._stack_id(sys._getframe(1), line))

    def _on_return(self, code, offset, value):
        if self._is_library(code.co_filename):
            return sys.monitoring.DISABLE
        frame = sys._getframe(1)
        self._left(frame)
        self.mark(frame.f_back)

    def _on_unwind(self, code, offset, exception):   # a global event: it cannot be disabled where it fires
        if not self._is_library(code.co_filename):
            self._left(sys._getframe(1))

    # Before 3.12: sys.settrace, local tracing in the user's frames only.
    def _global_trace(self, frame, event, arg):
        return None if self._is_library(frame.f_code.co_filename) else self._local_trace

    def _local_trace(self, frame, event, arg):
        if event == "line":
            self._mark(self._stack_id(frame, frame.f_lineno))
        elif event == "return":   # also where the frame unwinds
            self._left(frame)
            self.mark(frame.f_back)
        return self._local_trace

    def __enter__(self):
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:
            free = [i for i in range(monitoring.PROFILER_ID + 1, 6) if monitoring.get_tool(i) is None]
            if free:
                self._tool = free[0]
                monitoring.use_tool_id(self._tool, "roofline")
                monitoring.register_callback(self._tool, monitoring.events.LINE, self._on_line)
                monitoring.register_callback(self._tool, monitoring.events.PY_RETURN, self._on_return)
                monitoring.register_callback(self._tool, monitoring.events.PY_UNWIND, self._on_unwind)
                monitoring.set_events(self._tool, monitoring.events.LINE | monitoring.events.PY_RETURN
                                      | monitoring.events.PY_UNWIND)
                monitoring.restart_events()   # lines another recording disabled count again
                return self
        self._previous_trace = sys.gettrace()
        sys.settrace(self._global_trace)
        threading.settrace(self._global_trace)
        frame = sys._getframe(1)
        while frame is not None:   # frames already running (the caller's) trace their lines from now on
            if not self._is_library(frame.f_code.co_filename):
                frame.f_trace = self._local_trace
            frame = frame.f_back
        return self

    def __exit__(self, *exc):
        if self._tool is not None:
            monitoring = sys.monitoring
            monitoring.set_events(self._tool, 0)
            monitoring.register_callback(self._tool, monitoring.events.LINE, None)
            monitoring.register_callback(self._tool, monitoring.events.PY_RETURN, None)
            monitoring.register_callback(self._tool, monitoring.events.PY_UNWIND, None)
            monitoring.free_tool_id(self._tool)
            self._tool = None
        else:
            sys.settrace(self._previous_trace)
            threading.settrace(self._previous_trace)
            frame = sys._getframe(1)
            while frame is not None:
                if frame.f_trace == self._local_trace:
                    frame.f_trace = None
                frame = frame.f_back
        # The frames still running let go. Not cleared but dropped: a thread paused inside a callback may yet
        # write into the dict it read, and no return event would ever take that frame out again.
        self._above = None

    def table(self) -> list:
        """The interned stacks, by id: [[file, line, function], ...] outermost first."""
        return [[list(f) for f in stack] for stack in self._by_id]


def run_facts(stacks: list | None = None, unprofiled_steps: dict | None = None,
              optimizers: list | None = None, window_steps: int | None = None,
              ddp_buckets: list | None = None, compiled_kernels: list | None = None,
              own_marks: dict | None = None) -> dict:
    """What the analysis needs to know about this process: how to tell the user's code from libraries,
    the user call stacks that the line marks refer to, the steps timed outside the window, what each
    optimizer updates (costs.ParameterSet), how many whole steps the window recorded (trace.load leaves
    out the work after the last of them: a program's tail is no step), DDP's gradient buckets (which
    parameters each all-reduce moves: distributed.comms), and the kernels torch.compile generated with the
    lines each fused (inspect.generated), where the process may run against where its GPU is attached
    (distributed.placement), and, for a window that records no op, the line, module and step marks roofline kept on
    the wall clock (trace.load places them)."""
    from roofline.distributed import placement
    from roofline.distributed.ledger import environment

    return {"version": 1, "cwd": os.getcwd(), "argv": sys.argv[:], "nccl_env": environment(),
            "placement": placement.facts(),
            "sys_path": [p or os.getcwd() for p in sys.path], "library_roots": library_roots(),
            "stacks": stacks or [], "unprofiled_steps": unprofiled_steps or {"wall_ms": [], "gpu_ms": []},
            "optimizers": optimizers or [], "window_steps": window_steps, "ddp_buckets": ddp_buckets or [],
            "compiled_kernels": compiled_kernels or [], **({"own_marks": own_marks} if own_marks else {})}


class _CompiledKernels:
    """The kernels torch.compile generates while the program runs, with the lines of the program each fused
    (inspect.generated's recording). Noted only where the program compiles: from the start where Inductor has
    compiled already, else from the program's first call of torch.compile (a torch.compile called before the
    profile began, whose graphs compile in it, goes unnoted). Inductor's modules take seconds to import, which a
    program that never compiles does not pay. Nothing here may fail the program: what goes wrong is a warning,
    and the kernels go unnoted."""

    def __init__(self):
        self._recording = contextlib.ExitStack()
        self._graphs: list | None = None
        self._compile = None   # torch.compile, while watched for its first call
        self._closed = False

    def __enter__(self) -> "_CompiledKernels":
        if "torch._inductor.graph" in sys.modules:   # (torch.profiler loads torch._inductor itself, not this)
            self._start()
        else:
            self._compile = compile_ = torch.compile

            @functools.wraps(compile_)
            def first_compile(*args, **kwargs):
                self._start()
                return compile_(*args, **kwargs)

            torch.compile = first_compile
        return self

    def _start(self) -> None:
        if self._graphs is None and not self._closed:   # (a torch.compile kept from the window, called after it)
            try:
                self._graphs = self._recording.enter_context(generated.recording(inspecting=False))
            except Exception as exc:   # noqa: BLE001 (Inductor's internals move between releases)
                self._graphs = []
                warnings.warn(f"roofline could not watch torch.compile's kernels: {exc!r}", stacklevel=3)

    def __exit__(self, *exc) -> None:
        self._closed = True
        if self._compile is not None:
            torch.compile, self._compile = self._compile, None
        self._recording.close()

    def kernels(self) -> list[dict]:
        """Each kernel noted, as the run facts keep it."""
        try:
            return [{"name": k.name, "graph": k.graph, "kind": k.kind,
                     "lines": [[x.file, x.line, x.code] for x in k.lines]}
                    for k in generated.kernels_of(self._graphs or [])]
        except Exception as exc:   # noqa: BLE001 (a wrapper file gone, or one Inductor wrote otherwise)
            warnings.warn(f"roofline could not read torch.compile's kernels: {exc!r}", stacklevel=2)
            return []


def _parameter_facts(optimizer) -> dict:
    """What an optimizer's step updates: its parameters' count, elements and (bytes-weighted) element size."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    numel = sum(p.numel() for p in params)
    nbytes = sum(p.numel() * p.element_size() for p in params)
    return {"class": type(optimizer).__name__, "tensors": len(params), "numel": numel,
            "itemsize": round(nbytes / numel) if numel else 4}


def _sync_if_cuda() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def _with_metadata(raw: Path, dest: Path, facts: dict) -> None:
    """Copy torch's JSON trace to dest (gzipped if dest ends in .gz), with {"roofline": facts} first."""
    import gzip
    import json
    import shutil

    opener = gzip.open if dest.suffix == ".gz" else open
    with open(raw, "rb") as src, opener(dest, "wb") as out:
        head = src.read(1)
        while head.isspace():
            head = src.read(1)
        if head != b"{":
            raise RuntimeError(f"torch.profiler wrote an unexpected trace format (starts with {head!r})")
        out.write(b'{"roofline": ' + json.dumps(facts).encode() + b",")
        shutil.copyfileobj(src, out, 1 << 20)


class StepClock:
    """The program timed without the profiler: wall clock, and CUDA events on the current stream, at the step
    boundaries outside the recorded window (profiler.overhead turns them into the unprofiled step time).

    A step counts when it ran wholly outside the window, except the program's first (its own warm-up:
    allocation, compilation) and the first after the window (the profiler stopping, roofline's hooks coming
    off). At most LIMIT steps are kept.
    """

    LIMIT = 256

    def __init__(self, window: tuple[int, float]):
        self.first, self.last = window   # the recorded window's first and last step (warm-up step included)
        self.wall_ms: list[float] = []
        self.spans_ns: list[tuple[int, int]] = []   # each timed step's start and end, time.time_ns()
        self._events: list[tuple] = []
        self._calls: list[dict] = []   # the flight recorder's calls, as snapshot() read them
        self._previous = None   # (perf_counter, time_ns, event or None) at the start of the running step, if it counts

    def _counts(self, step: int) -> bool:
        return step >= 1 and not self.first <= step <= self.last + 1

    def boundary(self, ended: int) -> None:
        """Step `ended` (0-based) ended and the next begins: called first thing, before the profiler's work."""
        if not (self._counts(ended) or self._counts(ended + 1)) or len(self.wall_ms) >= self.LIMIT:
            self._previous = None
            return
        now, now_ns, event = _time.perf_counter(), _time.time_ns(), None
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        if self._counts(ended) and self._previous is not None:
            self.wall_ms.append((now - self._previous[0]) * 1e3)
            self.spans_ns.append((self._previous[1], now_ns))
            self._events.append((self._previous[2], event))
        self._previous = (now, now_ns, event) if self._counts(ended + 1) else None

    def snapshot(self) -> None:
        """Read the flight recorder's calls of the steps timed so far, at the window's end: the program may end
        its process groups before facts() reads them again."""
        from roofline.distributed import ledger

        self._calls = ledger.read(self.spans_ns)

    def facts(self) -> dict:
        """{"wall_ms": [...], "gpu_ms": [...], "collectives": [...]}: collectives, the calls a process group's
        flight recorder kept in the timed steps (distributed.ledger; none outside a program of several ranks), as
        read now or at the snapshot, whichever timed a call. The GPU must have finished the events (the caller
        synchronized)."""
        from roofline.distributed import ledger

        gpu = [start.elapsed_time(end) for start, end in self._events if start is not None and end is not None]
        return {"wall_ms": self.wall_ms, "gpu_ms": gpu,
                "collectives": ledger.union(self._calls, ledger.read(self.spans_ns))}


def _experimental_config():
    """Kineto options: synchronization events on (the timeline needs them); external correlation off (each op
    would push an id to CUPTI; roofline links kernels to ops by thread and time instead); and, where torch has
    it, no Python event objects built at exit (roofline reads the exported trace)."""
    options = {"enable_cuda_sync_events": True, "disable_external_correlation": True, "trace_only": True}
    while True:
        try:
            return torch._C._profiler._ExperimentalConfig(**options)
        except TypeError:
            if len(options) == 1:
                raise
            options.popitem()   # an older torch: drop the newest option and try again


def _teardown_cupti_at_stop() -> None:
    """Have Kineto finalize CUPTI when the recording stops. Left subscribed (Kineto's default before its CUDA
    12.6+ change), CUPTI's callbacks keep slowing every launch after the window (GPT-2's host-bound steps after
    it ran slower than the program alone: benchmarks/results/h100-profile-models.md), and those steps are the
    program "without the profiler" that overhead.py scales to. The user's own setting
    stands; CUDA before 12.6 keeps CUPTI (finalizing it crashed a later CUDA graph's re-initialization there).
    Where this turns the finalize on, a throwaway recording is made first (_prime_cupti)."""
    if "TEARDOWN_CUPTI" in os.environ or not torch.cuda.is_available() or not torch.version.cuda:
        return
    if tuple(int(p) for p in torch.version.cuda.split(".")[:2]) >= (12, 6):
        os.environ["TEARDOWN_CUPTI"] = "1"
        _prime_cupti()


# Above Kineto's highest level of log (USDT, 5): torch 2.13's CPU build prints "USDT:... profiler_start" and
# "profiler_stop" on stderr at every recording's edges, twice a rank in a program of several
KINETO_QUIET = "6"


def _quiet_kineto_on_cpus() -> None:
    """Silence Kineto's log where no GPU is: nothing of CUPTI's to say there, only its recordings' edges. The user's
    own KINETO_LOG_LEVEL stands; with a GPU its errors (CUPTI's) are left to say what they say. Read by Kineto when
    it first starts a recording: set before the window's."""
    if "KINETO_LOG_LEVEL" not in os.environ and not torch.cuda.is_available():
        os.environ["KINETO_LOG_LEVEL"] = KINETO_QUIET


def _prime_cupti() -> None:
    """A recording of one launch, thrown away, that stops with CUPTI's finalize. The first recording to finalize
    CUPTI after one that left it subscribed (a torch.profiler recording made before TEARDOWN_CUPTI was set) holds
    no kernel: on an H200 (torch 2.11), roofline's windows after such a recording held 0, 7 and 3 of the 5, 7 and
    3 kernels launched in them, with or without a wait of 0.5 s before each; with TEARDOWN_CUPTI set from the
    start, or no recording before, all of them. So that loss falls on this recording, not the user's window.
    Not where CUDA has not started (no recording of GPU work came before; starting it here would pick a device for
    the program), where a stream is being captured into a CUDA graph, or under a recording already running."""
    if (not torch.cuda.is_initialized() or torch.cuda.is_current_stream_capturing()
            or torch._C._autograd._profiler_enabled()):
        return
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
                torch.ones(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except RuntimeError:   # a CUDA error here is the program's, and reaches it at its own next call
        pass


def _schedule(skip: int, active: int | None):
    """torch.profiler's schedule for 'skip `skip` steps, then record `active` (None: all the rest)'. There is
    always one, so that the trace marks each recorded step's range (ProfilerStep#N)."""
    forever = 1 << 62
    if skip == 0:   # recording from the start: no step to warm up in (torch warns of that; nothing to do about it)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")
            return torch.profiler.schedule(wait=0, warmup=0, active=active or forever, repeat=1)
    # The step before recording starts is a warm-up, so that the profiler's start-up cost falls outside.
    return torch.profiler.schedule(skip_first=skip - 1, wait=0, warmup=1, active=active or forever, repeat=1)


class Profiler:
    """One recording. Use as a context manager, or call `run(fn, *args, **kwargs)`.

    After the window closes, `trace_path` holds the Chrome/Perfetto trace, and `report`
    its analysis (a `roofline.profiler.Report`, made when first asked for).
    """

    def __init__(self, *, skip: int = 0, active: int | None = None, shapes: bool = True,
                 memory: bool = False, modules: bool = True, lines: bool = True, python_stack: bool = False,
                 ops: bool = True, trace: str | os.PathLike | None = None):
        if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
            raise ValueError(f"skip must be a non-negative int (steps to leave out), got {skip!r}")
        if active is not None and (not isinstance(active, int) or isinstance(active, bool) or active < 1):
            raise ValueError(f"active must be a positive int (steps to record) or None for all, got {active!r}")
        if not isinstance(ops, bool):
            raise ValueError(f"ops must be True or False, got {ops!r}")
        if not ops and (memory or python_stack):
            raise ValueError("ops=False records no CPU activity: not with memory or python_stack, which need it")
        if not ops and not torch.cuda.is_available():
            raise ValueError("ops=False records kernels and their launches alone (CUDA activity), with roofline's own "
                             "line, module and step marks: it needs a CUDA device, and none is here")
        self.skip, self.active = skip, active
        # ops=False: no CPU activity, so no op is recorded (and none of its shapes): what stretches a step whose host
        # paces it is recording every op (benchmarks/results/h200-profile-overhead.md)
        self.ops = ops
        self.shapes, self.memory, self.modules, self.lines = shapes and ops, memory, modules, lines
        self.python_stack = python_stack
        self._own_dir = None
        if trace is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="roofline-trace-")
            trace = Path(self._own_dir.name) / "trace.json"
        self.trace_path = Path(trace)
        self.steps = 0
        self.window_steps = 0            # the whole steps recorded (the warm-up step is not)
        self.marked_by_program = False   # set by the module-level step(); see _optimizer_steps
        self._report = None
        self._torch = None
        self._modules = None
        self._lines = None
        self._trace_ready = False    # the scheduled window closed (torch called on_trace_ready)
        self._lines_done = None      # the line marks, after the window
        self._modules_done = None    # the module paths, after the window (ops=False: their ranges)
        self._own_steps: list = []       # ops=False: the recorded steps' [start ns, end ns] (torch marks none)
        self._handshakes: list = []      # ops=False: after each, [wall ns before, after, thread's system id]
        self._handshake_events: dict = {}   # device -> the event _handshake records there
        self._step_start = 0
        self._exported = False
        self._previous = None
        self.clock = StepClock(self.window)
        self._optimizers: dict[int, dict] = {}   # id -> _parameter_facts, for every optimizer stepped in the window
        self._optimizer_hook = None
        self._in_window = False
        self._ddp_buckets: list = []   # distributed.comms.ddp_buckets of the DDP modules called in the window
        self._compiled = _CompiledKernels()

    @property
    def window(self) -> tuple[int, float]:
        """The recorded steps, first and last (0-based, the profiler's warm-up step included; inf: to the end)."""
        if self.skip == 0:
            return 0, math.inf if self.active is None else self.active - 1
        return self.skip - 1, math.inf if self.active is None else self.skip - 1 + self.active

    def _records(self, step: int) -> bool:
        """Whether step `step` (0-based) is recorded: in the window, and not the profiler's warm-up step."""
        first, last = self.window
        return first + (self.skip > 0) <= step <= last

    def _on_optimizer_step(self, optimizer, args, kwargs) -> None:
        # Registered for the whole run: a step hook that came and went at the window's edges would change
        # torch's hook table while torch iterates it (run_program marks steps from an optimizer hook).
        if self._in_window and id(optimizer) not in self._optimizers:
            self._optimizers[id(optimizer)] = _parameter_facts(optimizer)

    def _hooks_on(self) -> None:
        """roofline's own marks (module paths, source lines, optimizers' parameters): only in the window, where
        they are read."""
        self._in_window = True
        if self.modules and self._modules is None:
            self._modules = _ModulePaths(own_clock=not self.ops).__enter__()
        if self.lines and self._lines is None:
            self._lines = _LineMarks(own_clock=not self.ops).__enter__()

    def _hooks_off(self) -> None:
        self._in_window = False
        if self._modules is not None:
            from roofline.distributed.comms import ddp_buckets

            self._ddp_buckets = ddp_buckets(self._modules.roots.values())
            self._modules.__exit__()
            self._modules.roots.clear()   # kept past the window, it must not keep the program's model alive
            self._modules_done, self._modules = self._modules, None
        if self._lines is not None:
            self._lines.__exit__(None, None, None)
            self._lines_done, self._lines = self._lines, None

    # ------------------------------------------------------------------ recording
    def _activities(self):
        acts = [torch.profiler.ProfilerActivity.CPU] if self.ops else []
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        return acts

    def _on_trace_ready(self, prof) -> None:
        # Exported at exit instead, when the steps after the window have been timed too.
        self._trace_ready = True

    def _export(self, prof) -> None:
        """Write torch's trace with roofline's facts about the run added as a top-level "roofline" key."""
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        lines = self._lines or self._lines_done
        with tempfile.TemporaryDirectory(prefix="roofline-export-") as tmp:
            raw = Path(tmp) / "torch.json"
            prof.export_chrome_trace(str(raw))
            _with_metadata(raw, self.trace_path, run_facts(lines.table() if lines else None, self.clock.facts(),
                                                           list(self._optimizers.values()), self.window_steps,
                                                           self._ddp_buckets, self._compiled.kernels(),
                                                           None if self.ops else self._own_marks(lines)))
        self._exported = True

    def _handshake(self) -> None:
        """ops=False: a CUDA event recorded on this thread between two readings of the wall clock. The trace's
        cudaEventRecord in that span names the thread as the trace names its launches, which its system and
        pthread ids failed to match once (two H200 ranks under torchrun: no kernel tied to a line exactly). Not
        where CUDA is not started (this would start it) or a graph is being captured, nor past a CUDA error
        (the program's, which reaches it at its own next call)."""
        if not torch.cuda.is_initialized() or torch.cuda.is_current_stream_capturing():
            return
        try:
            device = torch.cuda.current_device()
            event = self._handshake_events.setdefault(device, torch.cuda.Event())
            before = _time.time_ns()
            event.record()
            self._handshakes.append([before, _time.time_ns(), threading.get_native_id()])
        except RuntimeError:
            pass

    def _own_marks(self, lines) -> dict:
        """ops=False: the marks roofline kept on the wall clock (trace.load puts them among the trace's events), by
        thread, with each thread's pthread id (without CPU activity Kineto may name a launch's thread by that) and
        the handshakes that name the stepping thread as the trace does, and the window's collective calls."""
        from roofline.distributed import ledger

        modules = self._modules or self._modules_done
        pthread_ids = {**(modules.pthread_ids if modules else {}), **(lines.pthread_ids if lines else {})}
        return {"lines": {str(tid): [times, ids] for tid, (times, ids) in (lines.own if lines else {}).items()},
                "modules": modules.ranges if modules else [], "steps": self._own_steps,
                "handshakes": self._handshakes,
                "pthread_ids": {str(k): v for k, v in pthread_ids.items()},
                # the collectives the window's steps called, as the flight recorder kept them: with no c10d op
                # recorded, their kinds and sizes (distributed.comms); none outside a program of several ranks
                "collectives": ledger.read(self._own_steps)}

    def __enter__(self) -> "Profiler":
        global _active
        if self._torch is not None:
            raise RuntimeError("this roofline Profiler has already been used; make a new one")
        _sync_if_cuda()   # a recording that just ended (torch.profiler's) finalizes CUPTI now, not inside this one
        config = _experimental_config()
        schedule = _schedule(self.skip, self.active)
        _teardown_cupti_at_stop()
        _quiet_kineto_on_cpus()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")
            self._torch = torch.profiler.profile(
                activities=self._activities(), schedule=schedule,
                on_trace_ready=self._on_trace_ready,
                record_shapes=self.shapes, profile_memory=self.memory,
                with_stack=self.python_stack, with_modules=self.python_stack, experimental_config=config)
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._optimizer_hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        if self.window[0] == 0:
            self._hooks_on()
        self._previous, _active = _active, self
        self._torch.__enter__()
        self._step_start = _time.time_ns()   # after the profiler started: its start-up is in no step
        self._compiled.__enter__()   # last: nothing after it can fail and leave torch.compile watched
        return self

    def step(self) -> None:
        """Mark the end of one iteration (to skip warm-up steps, and to report time per step)."""
        if self._torch is None:
            raise RuntimeError("Profiler.step() called outside the profiled window")
        ended = self.steps
        self.clock.boundary(ended)   # first, so that none of the profiler's work falls in a timed step
        if not self.ops and self._records(ended):   # torch marks no step without CPU activity: its range, kept here
            self._own_steps.append([self._step_start, _time.time_ns()])
            self._handshake()
        self.steps += 1
        self.window_steps += self._records(ended)
        if ended == self.window[1]:
            self._hooks_off()
            self.clock.snapshot()
        if self.steps == self.skip:
            # Recording starts now: let the skipped steps' queued GPU work finish first, so that the window
            # holds exactly the work launched in it, and a program that runs far ahead of the GPU is not
            # charged for what came before.
            _sync_if_cuda()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*clears events at the end of each cycle.*")
            self._torch.step()
        if self.steps == self.window[0]:
            self._hooks_on()
        self._step_start = _time.time_ns()   # the next step begins after the profiler's own work

    def __exit__(self, exc_type, exc, tb):
        global _active
        try:
            try:
                if not self.ops and self._records(self.steps):
                    # the program's tail after its last step mark, as torch's last step range holds it: trace.load
                    # leaves it out (keep_whole_steps)
                    self._own_steps.append([self._step_start, _time.time_ns()])
                if self._lines is not None:
                    self._lines.leave()   # what follows (the sync below) is roofline's, on no line of the program
                _sync_if_cuda()   # let queued GPU work finish inside the window, so its kernels are recorded
            finally:
                self._torch.__exit__(None, None, None)
                self._hooks_off()
                self._optimizer_hook.remove()
                _active = self._previous
                # Kineto finalizes CUPTI (TEARDOWN_CUPTI, set above) in the exit callback of the next CUDA runtime
                # call: a recording begun before any such call is wiped by it and holds no kernel (the second of
                # two torch.profiler recordings back to back did). A call now lets the finalize happen here. A CUDA
                # error it would raise is the program's, and reaches it at its own next sync: not here, where it
                # would hide the program's own exception and lose the recording.
                try:
                    _sync_if_cuda()
                except RuntimeError:
                    pass
            if self._trace_ready:
                self._export(self._torch)
        finally:
            self._compiled.__exit__(None, None, None)   # whatever failed above: torch.compile as it was
        return False

    @property
    def recorded(self) -> bool:
        """Whether the window produced a trace (it does not when fewer than `skip` steps ran)."""
        return self._exported

    @property
    def report(self):
        """The analysis of the trace (a `roofline.profiler.Report`), made on first use."""
        if self._report is None:
            from roofline.profiler.report import analyze

            if self._torch is None:
                raise RuntimeError("nothing was profiled yet: use the Profiler as a context manager or call run()")
            if not self._exported:
                raise RuntimeError(f"nothing was recorded: skip={self.skip} steps were to be left out, "
                                   f"but only {self.steps} were marked with step()")
            self._report = analyze(self.trace_path)
        return self._report

    def run(self, fn, *args, **kwargs):
        """Profile one call of fn(*args, **kwargs); returns this Profiler (see `report`)."""
        with self:
            fn(*args, **kwargs)
        return self


def profile(fn=None, /, *args, **kwargs):
    """Profile a region, a call, or (from the CLI) a program, and say where the time goes.

        with roofline.profile() as prof:          # options: skip, active, shapes, memory, modules, trace
            for batch in loader:
                train_step(batch); prof.step()
        prof.report.print()

        prof = roofline.profile(train_step, batch)   # one call; arguments go to the function
    """
    if fn is None:
        return Profiler(**kwargs)
    if not callable(fn):
        raise TypeError(f"roofline.profile() takes a callable or nothing, got {type(fn).__name__}")
    return Profiler().run(fn, *args, **kwargs)


# ---------------------------------------------------------------------- programs

class ProgramExit(Exception):
    """The profiled program ended with a nonzero status (or raised); the report was still made."""

    def __init__(self, status: int, error: BaseException | None):
        super().__init__(status)
        self.status, self.error = status, error


def _exit_status(exc: BaseException) -> int:
    if isinstance(exc, SystemExit):
        code = exc.code
        return 0 if code is None else code if isinstance(code, int) else 1
    if isinstance(exc, KeyboardInterrupt):
        return 130
    return 1


@contextlib.contextmanager
def _as_main(argv: list[str], path_entry: str | None):
    """sys.argv and sys.path as `python script.py` would set them; restored afterwards."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = argv
    if path_entry is not None:
        sys.path.insert(0, path_entry)
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def _program(target: str, args: list[str], module: bool):
    """(argv, sys.path entry, body): how `python script.py args` (or `python -m module args`) runs the target."""
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:
            raise FileNotFoundError(f"cannot find module {target!r}: {exc}") from None
        if found is None:
            raise FileNotFoundError(f"no module named {target!r}")
        return ([found.origin or target, *args], os.getcwd(),
                lambda: runpy.run_module(target, run_name="__main__", alter_sys=True))
    path = Path(target)
    if not path.is_file():
        raise FileNotFoundError(f"no such file: {target}")
    return [str(path), *args], str(path.resolve().parent), lambda: runpy.run_path(str(path), run_name="__main__")


def _run_marked(recorder, target: str, args: list[str], module: bool):
    """Run the target as __main__ inside `recorder` (a Profiler or a CudaProfilerRange), its steps marked by
    optimizer.step() or roofline.profiler.step(). Returns (status, error): the program's exit status, and the
    exception it ended with (None for a clean exit)."""
    argv, entry, body = _program(target, args, module)
    status, error = 0, None
    with _as_main(argv, entry), _optimizer_steps(recorder):
        with recorder:
            try:
                body()
            except BaseException as exc:  # the program's own ending, reported after the profile
                status, error = _exit_status(exc), None if isinstance(exc, SystemExit) else exc
    return status, error


def run_program(target: str, args: list[str], *, module: bool = False, **options):
    """Run a script (or with module=True a module) as __main__ under the profiler.

    Returns (profiler, status, error): the program's exit status, and the exception
    it ended with (None for a clean exit). The report covers what ran either way.
    """
    prof = Profiler(**options)
    return (prof, *_run_marked(prof, target, args, module))


class CudaProfilerRange:
    """The steps a Profiler(skip=, active=) records, marked for Nsight Compute instead of recorded:
    cudaProfilerStart where the recording would start, cudaProfilerStop where it would end. Under
    `ncu --profile-from-start off`, the launches ncu counts are then the trace's, in the trace's order, and a
    launch the profile timed can be named by its ordinal (profiler.ncu)."""

    def __init__(self, skip: int, active: int | None, start=None, stop=None):
        self.skip, self.active = skip, active
        self.steps = 0
        self.marked_by_program = False
        self.started = self.stopped = 0
        self._start = start or torch.cuda.profiler.start
        self._stop = stop or torch.cuda.profiler.stop
        self._on = False
        self._previous = None

    def _switch(self, on: bool) -> None:
        if on != self._on:
            _sync_if_cuda()   # the launches before the switch run, and are counted, on their side of it
            (self._start if on else self._stop)()
            self._on = on

    def __enter__(self) -> "CudaProfilerRange":
        global _active
        self._previous, _active = _active, self
        if self.skip == 0:
            self._switch(True)
        return self

    def step(self) -> None:
        self.steps += 1
        if self.steps == self.skip:
            self._switch(True)
        if self.active is not None and self.steps == self.skip + self.active:
            self._switch(False)

    def __exit__(self, *exc):
        global _active
        self._switch(False)
        _active = self._previous
        return False


def run_window(target: str, args: list[str], *, module: bool = False, skip: int = 0, active: int | None = None):
    """Run the program with its recorded window marked by a CudaProfilerRange (see profiler.ncu); returns
    (status, error) as run_program does."""
    return _run_marked(CudaProfilerRange(skip, active), target, args, module)


@contextlib.contextmanager
def _optimizer_steps(prof: Profiler):
    """Count each optimizer.step() as a step of the program, until the program marks one itself
    with roofline.profiler.step(). A training script then needs no change for `skip` to leave out
    its warm-up iterations. The program's first mark ends an iteration that the hook has already
    counted, so it is not counted again (see step())."""

    def on_step(optimizer, args, kwargs):
        if _active is prof and not prof.marked_by_program:
            prof.step()

    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(on_step)
    try:
        yield
    finally:
        handle.remove()
