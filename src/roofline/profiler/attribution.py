"""Attribution: every microsecond of device work -> the op that launched it -> its nn.Module -> the user's source line.

The unit is `Work`: one GPU kernel, copy or memset (for a CPU-only trace: the self time of
one host op). Each gets
    op       the innermost host op that launched it (aten::addmm, ...)
    stack    the user's frames above that op, outermost first (library frames left out): exact lines
             from roofline's line marks where a torch call from Python encloses the op, otherwise
             torch's Python tracer frames, which name functions but not the line within them
    module   the attribute path of the innermost module call around it ("MLP.layers.3")
    backward whether it ran in the backward pass; then op, stack and module are the forward op's,
             so a line's cost includes the gradients it caused.

Views over the attributed work: `lines` (flat, and bottom-up by leaf line), `modules`,
`tree` (top-down along the user's call path).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

from roofline.profiler.trace import Frame, Trace, module_path, stack_at

# Top-level packages whose frames are never "the user's line" when the trace carries no run facts.
_KNOWN_LIBRARIES = {"torch", "roofline", "triton", "typer", "click", "rich", "numpy", "functorch",
                    "transformers", "accelerate", "lightning", "pytorch_lightning", "liger_kernel", "torchao"}


@dataclass(frozen=True, slots=True)
class Location:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ({self.function})"


@dataclass(slots=True)
class Work:
    us: float
    kind: str                     # "kernel" | "memcpy" | "memset" | "cpu"
    name: str
    index: int                    # into trace.gpu, or trace.ops for "cpu"
    op: int = -1                  # innermost launching op (-1: unknown)
    stack: tuple = ()             # user Locations, outermost first
    module: str | None = None
    backward: bool = False
    exact: bool = False           # stack from roofline's line marks (exact lines), not function-level frames

    @property
    def location(self) -> Location | None:
        return self.stack[-1] if self.stack else None


@dataclass
class Attribution:
    work: list[Work]
    total_us: float
    unattributed_us: float
    device: str                   # "cuda" | "cpu": what `work` measures

    @property
    def attributed_share(self) -> float:
        return 1.0 - self.unattributed_us / self.total_us if self.total_us else 1.0


class _Classifier:
    """Tells user frames from library ones, using the run's sys.path and library roots when known."""

    def __init__(self, facts: dict | None):
        facts = facts or {}
        self.sys_path = [p for p in facts.get("sys_path", []) if p]
        self.roots = tuple(facts.get("library_roots", []))
        self.cache: dict[str, bool] = {}

    def _resolve(self, file: str) -> str | None:
        if os.path.isabs(file):
            return file if os.path.exists(file) else None
        for entry in self.sys_path:
            candidate = os.path.join(entry, file)
            if os.path.exists(candidate):
                return os.path.realpath(candidate)
        return None

    def is_library(self, file: str | None) -> bool:
        if file is None or file.startswith("<"):
            return True
        known = self.cache.get(file)
        if known is None:
            known = self.cache[file] = self._classify(file)
        return known

    def _classify(self, file: str) -> bool:
        top = file.split("/", 1)[0].removesuffix(".py")
        if top in _KNOWN_LIBRARIES or "site-packages/" in file or "dist-packages/" in file:
            return True
        path = self._resolve(file) if self.sys_path else None
        if path is not None:
            return path.startswith(self.roots)
        # No run facts, or the file is not on this machine: a package of the standard library is a library;
        # a bare file name is taken to be the user's script even if it shadows a stdlib module name.
        return "/" in file and top in sys.stdlib_module_names


def _main_thread(trace: Trace) -> int | None:
    counts: dict[int, int] = {}
    for f in trace.frames:
        counts[f.tid] = counts.get(f.tid, 0) + 1
    return max(counts, key=counts.get) if counts else None


class Resolver:
    """Finds, for a host op (or a Python frame), the user's stack, module and pass, with memos:
    a trace of a million events has far fewer distinct stacks."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.classify = _Classifier(trace.meta.get("roofline"))
        self._frame_stacks: dict[int, tuple] = {-1: ()}
        self._marked: dict[tuple, tuple] = {}
        self._resolved: dict[int, tuple] = {}
        self._main_tid = _main_thread(trace)
        self._frame_tids = {f.tid for f in trace.frames}
        self._main_frames = None
        self._marked_tid = max(trace.marks, key=lambda t: len(trace.marks[t][0])) if trace.marks else None
        self._records_no_op = bool(trace.facts.get("own_marks"))   # capture's ops=False

    @property
    def marked_tid(self) -> int | None:
        """The thread with the most line marks: the program's main thread."""
        return self._marked_tid

    def frame_stack(self, fi: int) -> tuple:
        """User Locations of the Python frames from the outermost down to frame `fi` (function level)."""
        frames, memo = self.trace.frames, self._frame_stacks
        pending = []
        while fi not in memo:
            pending.append(fi)
            fi = frames[fi].parent
        stack = memo[fi]
        for f in reversed(pending):
            frame: Frame = frames[f]
            if not self.classify.is_library(frame.file):
                stack = stack + (Location(frame.file, frame.line, frame.function),)
            memo[f] = stack
        return stack

    def _frame_for(self, op_index: int) -> int:
        """The Python frame around an op; for ops on threads without Python (the autograd engine's),
        the main thread's frame at that moment (e.g. the loss.backward() call)."""
        op = self.trace.ops[op_index]
        if op.tid in self._frame_tids or self._main_tid is None:
            return op.frame
        if self._main_frames is None:
            from roofline.profiler.trace import _by_thread, _Nesting
            self._main_frames = _Nesting(self.trace.frames, _by_thread(self.trace.frames)[self._main_tid])
        return self._main_frames.enclosing(op.ts)

    def _marked_at(self, tid: int, ts: float, infer: bool = True) -> tuple[tuple, bool] | None:
        """(stack, exact) from the line marks of thread `tid` at `ts`; for a thread that runs no user code (the
        autograd engine's, say), where `infer`, the line the program's main thread was on then, e.g.
        loss.backward(), inferred, so not counted as exact. None where no mark says."""
        found = stack_at(self.trace, tid, ts)
        exact = found is not None
        if not found and infer and tid not in self.trace.marks and self._marked_tid is not None:
            found = stack_at(self.trace, self._marked_tid, ts)
        if not found:
            return None
        key = tuple(map(tuple, found))
        if key not in self._marked:
            self._marked[key] = tuple(Location(f, line, fn) for f, line, fn in found)
        return self._marked[key], exact

    def _stack_around(self, op_index: int) -> tuple[tuple, bool]:
        op = self.trace.ops[op_index]
        return self._marked_at(op.tid, op.ts) or (self.frame_stack(self._frame_for(op_index)), False)

    def resolve(self, op_index: int) -> tuple:
        """(stack, exact, module, backward) for work launched inside op `op_index`; a backward op
        takes the stack and module of the forward op that created it."""
        if op_index in self._resolved:
            return self._resolved[op_index]
        ops = self.trace.ops
        i, backward_op = op_index, -1
        while i >= 0:
            if ops[i].backward and ops[i].seq >= 0:
                backward_op = i
                break
            i = ops[i].parent
        source = op_index
        if backward_op >= 0 and ops[backward_op].forward >= 0:
            source = ops[backward_op].forward
        out = (*self._stack_around(source), module_path(self.trace, source), backward_op >= 0)
        self._resolved[op_index] = out
        return out

    def for_runtime(self, call_index: int) -> tuple:
        """(stack, exact, module, backward) for a runtime call (a launch, a synchronization)."""
        call = self.trace.runtime[call_index]
        op = self.launching_op(call_index)
        if op >= 0:
            return self.resolve(op)
        # No op launched it (a window that records none, or a kernel launched from Python): the line its thread was
        # at when it launched, and the module whose call encloses the launch. A thread with no marks, outside any
        # annotation, is another's (a data loader's, NCCL's), except where the window records no op: there it is
        # the autograd engine's, and the launch is the backward's.
        module = module_path(self.trace, call.op) if call.op >= 0 else None
        marked = self._marked_at(call.tid, call.ts, infer=self._records_no_op or call.op >= 0)
        if marked:
            stack, exact = marked
            return stack, exact, module, self._records_no_op and not exact
        return self.frame_stack(call.frame), False, module, False

    def launching_op(self, call_index: int) -> int:
        """The innermost op around a runtime call that is no annotation (a module's range or a record_function
        launches nothing), or -1."""
        op = self.trace.runtime[call_index].op
        while op >= 0 and self.trace.ops[op].annotation:
            op = self.trace.ops[op].parent
        return op


def attribute(trace: Trace, resolver: Resolver | None = None) -> Attribution:
    """Attribute all of the trace's device work (GPU events; host ops' self time for a CPU-only trace)."""
    resolver = resolver or Resolver(trace)
    work: list[Work] = []
    if trace.gpu:
        device = "cuda"
        for gi, g in enumerate(trace.gpu):
            w = Work(g.dur, g.kind, g.name, gi)
            if g.launch >= 0:
                w.op = resolver.launching_op(g.launch)
                w.stack, w.exact, w.module, w.backward = resolver.for_runtime(g.launch)
            work.append(w)
    else:
        device = "cpu"
        child_us = [0.0] * len(trace.ops)
        for op in trace.ops:
            if op.parent >= 0:
                child_us[op.parent] += op.end - op.ts
        for i, op in enumerate(trace.ops):
            if op.annotation:
                continue
            w = Work(max(op.end - op.ts - child_us[i], 0.0), "cpu", op.name, i, op=i)
            w.stack, w.exact, w.module, w.backward = resolver.resolve(i)
            work.append(w)
    total = sum(w.us for w in work)
    unattributed = sum(w.us for w in work if not w.stack)
    return Attribution(work, total, unattributed, device)


# --------------------------------------------------------------------------- views

@dataclass
class LineRow:
    location: Location
    self_us: float = 0.0          # work whose innermost user line is this one
    total_us: float = 0.0         # work with this line anywhere on its user stack
    backward_us: float = 0.0      # part of self_us that ran in the backward pass
    count: int = 0                # kernels (or ops) with this line innermost


def lines(attr: Attribution) -> list[LineRow]:
    """The flat view: one row per source line, by self time (the line that launched the work)."""
    rows: dict[Location, LineRow] = {}
    for w in attr.work:
        if not w.stack:
            continue
        for loc in set(w.stack):
            rows.setdefault(loc, LineRow(loc)).total_us += w.us
        row = rows[w.stack[-1]]
        row.self_us += w.us
        row.count += 1
        if w.backward:
            row.backward_us += w.us
    return sorted(rows.values(), key=lambda r: (-r.self_us, -r.total_us))


@dataclass
class ModuleRow:
    path: str
    self_us: float = 0.0          # in this module and not in a child module
    total_us: float = 0.0         # in this module or its children
    forward_us: float = 0.0       # of total_us: the forward pass
    backward_us: float = 0.0      # of total_us: the backward of its forward ops


def modules(attr: Attribution) -> list[ModuleRow]:
    """Work per nn.Module attribute path; forward and backward (the backward of a module's forward ops)."""
    rows: dict[str, ModuleRow] = {}
    for w in attr.work:
        if w.module is None:
            continue
        parts = w.module.split(".")
        for k in range(1, len(parts) + 1):
            row = rows.setdefault(".".join(parts[:k]), ModuleRow(".".join(parts[:k])))
            row.total_us += w.us
            if w.backward:
                row.backward_us += w.us
            else:
                row.forward_us += w.us
        rows[w.module].self_us += w.us
    return sorted(rows.values(), key=lambda r: r.path)


@dataclass
class Node:
    """A node of the top-down tree: one user line reached by one call path."""
    location: Location | None     # None for the root
    total_us: float = 0.0
    self_us: float = 0.0
    children: dict = field(default_factory=dict)

    def child(self, loc: Location) -> "Node":
        node = self.children.get(loc)
        if node is None:
            node = self.children[loc] = Node(loc)
        return node

    def sorted_children(self) -> list["Node"]:
        return sorted(self.children.values(), key=lambda n: -n.total_us)


def tree(attr: Attribution) -> Node:
    """The top-down view: user call paths from the outermost frame down to the launching line."""
    root = Node(None)
    for w in attr.work:
        _add_path(root, w.stack, w.us)
    return root


def _add_path(root: Node, path, us: float) -> None:
    """Charge `us` to every node along `path` from root, and as self time to its last."""
    node = root
    node.total_us += us
    for loc in path:
        node = node.child(loc)
        node.total_us += us
    node.self_us += us


def bottom_up(attr: Attribution, depth: int = 3) -> Node:
    """The bottom-up view: launching lines first, each with the call paths that reached it (callers below)."""
    root = Node(None)
    for w in attr.work:
        if w.stack:
            _add_path(root, reversed(w.stack[-depth - 1:]), w.us)
    return root
