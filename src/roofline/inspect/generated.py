"""The kernels torch.compile generated for a function: each with the user's lines it fused, its time and its code.

Inductor can note, for each kernel it writes, the stack traces of the operations the kernel holds (its provenance
tracking, off by default). `generated(fn)` turns that on for one call of fn, keeps the module each compiled graph
became (its kernels' source), then runs fn again under torch.profiler, each graph's call inside a range of its
own, and reads every kernel's time there:

- a Triton kernel (GPU): its launches' device time, by its name;
- a C++ kernel (CPU): its own profiler range, `graph_N_NAME`, which Inductor writes where asked (cpp's
  enable_kernel_profile);
- a call Inductor leaves to a library (extern_kernels.mm, a fallback aten op): the k-th such call of a graph is
  the k-th op of its name within that graph's range.

The lines come from Dynamo's stack traces: each operation's innermost frame in the user's code (not torch's,
roofline's or another library's), so that nn.Linear's matmul is charged to the line that called the layer. A
backward kernel is charged to the forward lines whose gradients it computes. On a GPU each Triton kernel's binary
is kept too (Inductor's store_cubin), for the SASS view of report.analyze. These are Inductor's internals
(torch._inductor.debug's provenance tables, GraphLowering.compile_to_module): tested with torch 2.13.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import re
import statistics
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from roofline.libraries import library_roots

if TYPE_CHECKING:
    from roofline.inspect import kernels

_LOCK = threading.Lock()    # over _Patch's state
_RANGE = "roofline::graph "                # + a number: a graph's calls' range in the profile
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in [^\n]*\n([^\n]*)')
GRAPH_PREFIX = re.compile(r"^graph_\d+_")   # C++ kernels' profiler ranges: graph_N_<kernel name> (or the name)


@dataclass(frozen=True)
class Line:
    """A line of the user's code."""
    file: str
    line: int
    code: str

    def __str__(self) -> str:
        return f"{Path(self.file).name}:{self.line}"


def compact(lines: list[Line]) -> str:
    """"model.py:7,9,12 utils.py:3": lines grouped by file; "-" for none."""
    files: dict[str, list[int]] = {}
    for x in lines:
        files.setdefault(Path(x.file).name, []).append(x.line)
    return " ".join(f"{name}:{','.join(map(str, numbers))}" for name, numbers in files.items()) or "-"


@dataclass
class GeneratedKernel:
    """One kernel of a compiled graph."""
    name: str                  # as Inductor named it (a graph's code may call one kernel at several places: an
                               # entry for each, with its own lines)
    graph: int                 # its graph, in the order compiled: a forward before its backward
    kind: str                  # "triton", "cpp", or "library" (a call Inductor leaves to a library: mm, conv, ...)
    lines: list[Line]          # the user's lines whose operations it holds
    code: str | None           # its generated source; None for a library call
    calls: float = 0.0         # a run of the function
    ms: float | None = None    # a run: device time on a GPU, CPU time on a CPU; None where the profile lacks it
    launch: kernels.Launch | None = field(default=None, repr=False)   # a Triton kernel a GPU compiled: its binary
    report: object = None      # report.KernelReport (or Uncompiled) of that binary

    @property
    def label(self) -> str:
        """Its name as the profiler shows it: a library call as its aten op (aten::mm)."""
        return _aten_name(self.name) if self.kind == "library" else self.name

    def to_dict(self) -> dict:
        return {"name": self.name, "graph": self.graph, "kind": self.kind, "calls": self.calls, "ms": self.ms,
                "lines": [{"file": x.file, "line": x.line, "code": x.code} for x in self.lines],
                "config": self.launch.kwargs if self.launch else {}, "code": self.code,
                "report": self.report.to_dict() if self.report is not None else None}


@dataclass
class _Graph:
    index: int                            # in its recording, in the order compiled
    path: str                             # the module's file: Inductor's wrapper, with its kernels' source
    module: object = field(repr=False)
    traces: dict[str, list[str]]          # "kernel:handle" -> the stack traces of the operations it holds
    range: str | None = None              # its calls' profiler range, where an inspection asked for one


def generated(fn, *args, runs: int = 3, **kwargs) -> list[GeneratedKernel]:
    """Call fn(*args, **kwargs) once, compiling what it compiles with torch.compile (fn compiles its own
    functions or modules, or is one; `torch.compile(fn)` inspects a function of plain eager code), then `runs`
    times more under the profiler. Returns every kernel of every graph, in each graph's order, with its time a
    run."""
    with recording() as graphs:
        fn(*args, **kwargs)
    return timed(graphs, fn, args, kwargs, runs)


def timed(graphs: list[_Graph], fn, args=(), kwargs=None, runs: int = 3) -> list[GeneratedKernel]:
    """The kernels of the graphs `recording` kept, each timed over `runs` more calls of fn."""
    if runs < 1:
        raise ValueError(f"runs must be at least 1, got {runs}")
    found = kernels_of(graphs)
    if found:
        _time(found, {g.range: g.index for g in graphs if g.range}, fn, args, kwargs or {}, runs)
    return found


@contextlib.contextmanager
def recording(inspecting: bool = True):
    """Within it, each graph torch.compile compiles is kept (a list of _Graph, yielded), with its kernels' lines:
    Inductor's provenance tracking on, and its caches off (a graph read from a cache is not compiled, and so notes
    nothing). Recordings may be open in several threads, or one inside another: they share one patch of Inductor,
    made by the first to open and undone by the last to close, and each keeps every graph compiled while it is
    open.

    inspecting (roofline inspect): Dynamo's caches are cleared first, so that every graph is compiled here; each
    graph's call goes in a profiler range of its own, for `timed`; each Triton launcher keeps its binary
    (Inductor's store_cubin, which costs host time at every launch). Without it (a profiled program), only the
    kernels' lines, and each C++ kernel in a profiler range of its own (a record-function handle a call)."""
    graphs: list[_Graph] = []
    with _LOCK:
        _Patch.open(graphs, inspecting)
    try:
        if inspecting:
            torch._dynamo.reset()
        yield graphs
    finally:
        with _LOCK:
            _Patch.close(graphs)


class _Patch:
    """The one patch of Inductor that the open recordings share (class state, under _LOCK): its settings, and
    GraphLowering.compile_to_module wrapped to hand each compiled graph to every open recording."""
    recordings: list[tuple[list, bool]] = []   # (graphs, inspecting) of each open recording
    undo: contextlib.ExitStack | None = None
    ranges = 0                                   # graphs put in a range so far: each range's name is its own

    @classmethod
    def open(cls, graphs: list, inspecting: bool) -> None:
        from torch._functorch import config as functorch_config
        from torch._inductor import config
        from torch._inductor.graph import GraphLowering

        if cls.undo is None:
            undo = contextlib.ExitStack()
            with contextlib.ExitStack() as failing:   # a patch half made is undone at once
                failing.push(undo)
                # Settings this torch's Inductor lacks are left out. enable_kernel_profile: each C++ kernel in a
                # profiler range of its own.
                wanted = {"trace.provenance_tracking_level": 1, "fx_graph_cache": False,
                          "fx_graph_remote_cache": False, "cpp.enable_kernel_profile": True}
                undo.enter_context(config.patch(_known(config, wanted)))
                undo.enter_context(functorch_config.patch(_known(functorch_config, {"enable_autograd_cache": False})))
                original = GraphLowering.compile_to_module

                @functools.wraps(original)
                def keeping(self, *args, **kwargs):
                    return _keeping(original, self, *args, **kwargs)

                GraphLowering.compile_to_module = keeping
                undo.callback(setattr, GraphLowering, "compile_to_module", original)
                failing.pop_all()
            cls.undo = undo
        if inspecting and not any(inspects for _, inspects in cls.recordings):
            # each launcher keeps its CompiledKernel (and its launches bypass the static launcher, which keeps none)
            cls.undo.enter_context(config.patch(_known(config, {"triton.store_cubin": True})))
        cls.recordings.append((graphs, inspecting))

    @classmethod
    def close(cls, graphs: list) -> None:
        cls.recordings = [r for r in cls.recordings if r[0] is not graphs]
        if not cls.recordings and cls.undo is not None:
            undo, cls.undo = cls.undo, None
            undo.close()


def _known(config, settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k in config.get_config_copy()}


def _keeping(compile_to_module, self, *args, **kwargs):
    """GraphLowering.compile_to_module, and the module handed to every open recording with the kernels its compile
    noted. Inductor notes them in a table its compile may swap for a fresh one, and puts back after: the kernels
    of this graph are those of a fresh table, or those added to the same one. What is noted is for reading: no
    error of its own fails the compile."""
    from torch._inductor import debug

    before = getattr(debug, "_inductor_kernel_stack_trace", None)
    if before is None:
        warnings.warn("this torch's Inductor notes no kernel provenance: its kernels are listed without the lines "
                      "they fused", stacklevel=2)
    known = set(before or ())
    module = compile_to_module(self, *args, **kwargs)
    try:
        table = getattr(debug, "_inductor_kernel_stack_trace", None) or {}
        noted = {k: list(v) for k, v in table.items() if table is not before or k not in known}
        path = getattr(module, "__file__", None)
        with _LOCK:
            recordings = list(_Patch.recordings)
            name = None
            if path and any(inspects for _, inspects in recordings):
                name = f"{_RANGE}{_Patch.ranges}"
                _Patch.ranges += 1
                module.call = _in_range(module.call, name)   # compile_fx takes module.call after this
            for graphs, _ in recordings:
                if path:
                    graphs.append(_Graph(len(graphs), path, module, noted, name))
    except Exception as exc:   # noqa: BLE001 (Inductor's internals move between releases)
        warnings.warn(f"roofline could not note the kernels of a compiled graph: {exc!r}", stacklevel=2)
    return module


def _in_range(call, name: str):
    def ranged(*args, **kwargs):
        with torch.profiler.record_function(name):
            return call(*args, **kwargs)
    return ranged


def kernels_of(graphs: list[_Graph]) -> list[GeneratedKernel]:
    """The kernels of the graphs `recording` kept, untimed."""
    return [k for g in graphs for k in _kernels(g)]


def _kernels(graph: _Graph) -> list[GeneratedKernel]:
    """The graph's kernels in the order Inductor wrote them, each with its lines, code and (on a GPU) binary."""
    sources = _sources(graph.path)
    # a torch whose Inductor notes no provenance: the kernels of the wrapper, without lines or library calls
    noted = graph.traces or {name: [] for name in sources}
    found = []
    for key, traces in sorted(noted.items(), key=lambda kv: _handle(kv[0])):
        name = key.rpartition(":")[0] if ":" in key else key
        kind, code = sources.get(name, ("library", None))
        kernel = GeneratedKernel(name, graph.index, kind, _user_lines(traces), code)
        if kind == "triton":
            _keep_binary(kernel, getattr(graph.module, name, None))
        found.append(kernel)
    return found


def _handle(key: str) -> int:
    """The order Inductor noted a kernel in: "name:3" -> 3 (0 where the key has no number)."""
    number = key.rpartition(":")[2]
    return int(number) if ":" in key and number.isdigit() else 0


def _sources(path: str) -> dict[str, tuple[str, str]]:
    """{kernel name: (kind, source)} from Inductor's wrapper module, where each kernel is written as
    `NAME = async_compile.triton('NAME', '''source''', ...)` or `async_compile.cpp_pybinding([...], '''source''')`."""
    out = {}
    for node in ast.parse(Path(path).read_text()).body:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Attribute)
                and getattr(node.value.func.value, "id", None) == "async_compile"
                and isinstance(node.targets[0], ast.Name)):
            continue
        strings = [a.value for a in node.value.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if strings:
            how = node.value.func.attr
            out[node.targets[0].id] = ("cpp" if how.startswith("cpp") else how, max(strings, key=len).strip("\n"))
    return out


def _user_lines(traces: list[str]) -> list[Line]:
    """Each stack trace's innermost frame in the user's code (its innermost frame where all are a library's)."""
    lines = {}
    for trace in traces:
        frames = [Line(f, int(n), code.strip()) for f, n, code in _FRAME.findall(trace)]
        if frames:
            user = [x for x in frames if not _library(x.file)]
            lines[(user or frames)[-1]] = None
    return sorted(lines, key=lambda x: (x.file, x.line))


@functools.cache
def _library(file: str) -> bool:
    """torch's, roofline's, the standard library's or an installed package's file (roofline's op is charged to
    the line that called it)."""
    roots = tuple(library_roots())
    return file.startswith(roots) or str(Path(file).resolve()).startswith(roots)


def _keep_binary(kernel: GeneratedKernel, autotuner) -> None:
    """A Triton kernel's binary and the configuration it runs with (XBLOCK, ...), from Inductor's autotuner (one
    launcher once tuned). Its grid is worked out at each call, and is not kept."""
    from roofline.inspect import kernels   # here, not at import: Triton takes a third of a second to load, which
                                           # a profile that never meets a Triton kernel should not pay

    launchers = getattr(autotuner, "launchers", None) or []
    if launchers and getattr(launchers[0], "bin", None) is not None:
        launcher = launchers[0]
        config = {**launcher.config.kwargs, "num_warps": launcher.config.num_warps,
                  "num_stages": launcher.config.num_stages}
        kernel.launch = kernels.Launch(launcher.fn, (), config, None, launcher.bin, label=kernel.name,
                                       source=_def_line(getattr(autotuner, "filename", None), kernel.name))


def _def_line(file: str | None, name: str) -> tuple[str, int] | None:
    """(file, the line of `def name(`) in Inductor's module of the kernel; None where it cannot be read (the
    kernel's function then says where it is)."""
    try:
        lines = Path(file).read_text().splitlines() if file else []
    except OSError:
        return None
    return next(((file, i) for i, line in enumerate(lines, 1) if line.lstrip().startswith(f"def {name}(")), None)


def _time(found: list[GeneratedKernel], ranges: dict[str, int], fn, args, kwargs, runs: int) -> None:
    """Each kernel's calls and time a run, from `runs` calls of fn under the profiler: the median of its calls'
    times, by its calls a run (a median, since a loaded machine stretches a call now and then). ranges: each
    graph's profiler range, to its index."""
    from torch.profiler import ProfilerActivity, profile

    gpu = torch.cuda.is_available()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    fn(*args, **kwargs)   # warm: the first call after compiling may still tune or load
    if gpu:
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        for _ in range(runs):
            fn(*args, **kwargs)
        if gpu:
            torch.cuda.synchronize()
    times: dict[int, list[float]] = {i: [] for i in range(len(found))}   # by index in `found`, us
    for event in prof.events():
        if event.name in ranges:
            _one_call(found, ranges[event.name], event, times)
    for i, k in enumerate(found):
        if times[i]:
            k.calls = len(times[i]) / runs
            k.ms = statistics.median(times[i]) * k.calls / 1e3


def _one_call(found: list[GeneratedKernel], graph: int, event, times: dict[int, list[float]]) -> None:
    """The times of a graph's kernels in one call of the graph (its range in the profile): a Triton kernel's on
    the GPU, a C++ kernel's range's, a library call's on the GPU where it ran there, else on the CPU."""
    named: dict[str, list[int]] = {}     # Triton and C++ kernels by name, in the order the graph calls them
    library: dict[str, list[int]] = {}   # library calls by profiler name, likewise
    for i, k in enumerate(found):
        if k.graph == graph:
            table, key = (library, _aten_name(k.name)) if k.kind == "library" else (named, k.name)
            table.setdefault(key, []).append(i)
    for inner in (event, *_within(event)):
        for kernel in inner.kernels:   # a GPU's kernels launched right under this op
            if kernel.name in named:
                times[_next_call(named[kernel.name])].append(kernel.duration)
        name = GRAPH_PREFIX.sub("", inner.name)
        if name in named and found[named[name][0]].kind == "cpp":   # a C++ kernel's own range
            times[_next_call(named[name])].append(inner.cpu_time_total)
        elif library.get(name):
            times[library[name].pop(0)].append(inner.device_time_total or inner.cpu_time_total)


def _next_call(calls: list[int]) -> int:
    """Which entry a kernel's launch belongs to, where the graph's code calls one kernel at several places (each
    place an entry, with its own lines): the k-th launch the k-th place; launches beyond them (a kernel called in a
    loop) the last place."""
    return calls.pop(0) if len(calls) > 1 else calls[0]


def _within(event):
    """The profiler events under `event`, depth first, not descending into a library call (an aten op's own
    inner ops belong to it)."""
    for child in event.cpu_children:
        yield child
        if not child.name.startswith("aten::"):
            yield from _within(child)


def _aten_name(name: str) -> str:
    """The profiler's name of a library call Inductor writes as extern_kernels.mm or aten.sort.default."""
    op = name.removeprefix("extern_kernels.").removeprefix("torch.ops.").removeprefix("aten.").split(".")[0]
    return f"aten::{op}"
