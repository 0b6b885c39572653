"""The autograd node of an eager call, in C++ (eager_node.cpp), and the recorder that lets it run backwards
without Python.

A torch.autograd.Function costs an eager program twice: in the forward (its context object, saving tensors,
wrapping outputs) and, more, in the backward (the engine hands a Python node the GIL, four Python frames,
unpacking), where torch's own ops use C++ nodes. A small op's whole kernel time is less than that (measured:
benchmarks/results/h100-host.md, "Run of 2026-11-24"). Here the forward makes a C++ node (`attach`), and the
node's backward replays a record of what the op's Python backward did for the same signature (the layouts of the
saved tensors and the gradients): its aten calls and its kernel launches. The first backward of each signature
runs in Python, under `Recording`, which writes that record.

What a record may hold is checked while recording, and a backward that does something else is not recorded (it
runs in Python every time, as it did before): a launch through Triton's JIT (a misaligned pointer; the
interpreter), a kernel launched with a descriptor not lowered to the copy engine, scratch memory or a launch
attribute, an aten call that returns something other than tensors (a host sync: `.item()`), a tensor list, a tensor the backward did not get
through the dispatcher, one input passed twice. The op's Python backward must be a function of its signature:
the plan, the attributes its forward left on the context, and the saved tensors' and gradients' layouts. Ours
are: they branch on nothing else.

Built only where it serves, a machine with a CUDA device (ROOFLINE_EAGER_NODE=1 builds it anyway, for the CPU
tests through Triton's interpreter), once per torch version, saying so in one line; off with ROOFLINE_EAGER_NODE=0,
or where it cannot be built (no C++ compiler, no ninja): ops then use a torch.autograd.Function.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from roofline.ops._state import capturing

SOURCE = Path(__file__).with_name("eager_node.cpp")


class _Recording(threading.local):
    """The recording in progress on this thread (Recording), told of every launch this thread makes (_launch),
    or None. Per thread: a program with several threads calling ops (a server) records one call's launches while
    another thread launches its own, which are no part of that record."""
    recorder = None


recording = _Recording()


def unavailable_reason() -> str | None:
    """Why the node is not built here, or None where it is (or can be).

    It serves eager calls of Triton kernels on a GPU, so it is built only where a CUDA device is present (or where
    ROOFLINE_EAGER_NODE=1 asks for it: the CPU tests check it through Triton's interpreter), with a C++ compiler
    and ninja to build it."""
    setting = os.environ.get("ROOFLINE_EAGER_NODE")
    if setting == "0":
        return "switched off (ROOFLINE_EAGER_NODE=0)"
    if setting != "1" and not torch.cuda.is_available():
        return "no CUDA device here, so no eager GPU call for it to serve"
    if not any(shutil.which(c) for c in (os.environ.get("CXX", "c++"), "g++", "clang++")):
        return "no C++ compiler found (c++, g++ or clang++)"
    if _ninja_dir() is None:
        return "ninja is not installed (pip install ninja)"
    return None


def _ninja_dir() -> str | None:
    """The folder of a ninja executable: on PATH, or the one the ninja package (pip install ninja) carries."""
    found = shutil.which("ninja")
    if found:
        return str(Path(found).parent)
    try:
        import ninja
    except ImportError:
        return None
    return ninja.BIN_DIR if (Path(ninja.BIN_DIR) / "ninja").exists() else None


@functools.cache
def extension():
    """The compiled extension, or None where it is not built (unavailable_reason) or its build failed: ops then
    use a torch.autograd.Function."""
    return build() if unavailable_reason() is None else None


def build():
    """Build the extension once per source, torch version and C++ runtime into roofline's cache (saying so in one
    line), or load it from there; None if the build fails."""
    from roofline.device import cache_dir

    link = _shared_cxx_runtime()
    key = hashlib.sha256(f"{SOURCE.read_text()}|{torch.__version__}|{link}".encode()).hexdigest()[:16]
    name = f"roofline_eager_node_{key}"
    build_dir = cache_dir() / "eager_node" / key
    build_dir.mkdir(parents=True, exist_ok=True)
    first = not (build_dir / f"{name}.so").exists()
    if first:
        print(f"roofline: building its C++ autograd node for torch {torch.__version__} (once; about a minute) into "
              f"{build_dir} ...", end="", file=sys.stderr, flush=True)
    started = time.perf_counter()
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([_ninja_dir(), path])   # torch's build calls `ninja` by name
    try:
        from torch.utils.cpp_extension import load

        module = load(name=name, sources=[str(SOURCE)], build_directory=str(build_dir), extra_cflags=["-O2"],
                      extra_ldflags=link, verbose=False)
    except Exception as exc:   # a broken toolchain: the ops still work, through autograd.Function
        if first:
            print(" failed", file=sys.stderr)
        warnings.warn(f"roofline: the C++ autograd node could not be built ({exc}); eager backwards run in "
                      "Python", RuntimeWarning, stacklevel=3)
        return None
    finally:
        os.environ["PATH"] = path
    if first:
        print(f" done in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return module


def _shared_cxx_runtime() -> list[str]:
    """The link input naming the C++ runtime this process has loaded (torch's libstdc++), or none where none is
    mapped. A compiler that links libstdc++ statically (the GPU machine's CXX=/opt/gcc/bin/g++ did) gave the node
    a second runtime whose locale was never set up: the first number it formatted, in a failed check's message,
    crashed the process instead of raising."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {fields[5] for fields in (line.rstrip("\n").split(maxsplit=5) for line in maps)
                     if len(fields) == 6 and os.path.basename(fields[5]).startswith("libstdc++.so")}
    except OSError:   # not Linux
        return []
    return sorted(paths) if len(paths) == 1 and os.path.isfile(next(iter(paths))) else []   # one, still on disk


class EagerContext:
    """What an op's setup_context and backward rule get in place of autograd's ctx in eager mode. The attributes
    the forward sets (in __dict__) key the recorded backwards, with the plan."""

    __slots__ = ("plan", "to_save", "non_differentiable", "saved_tensors", "once", "__dict__")
    in_graph = False

    def __init__(self, plan):
        self.plan, self.to_save, self.non_differentiable, self.once = plan, (), (), False

    def save_for_backward(self, *tensors):
        self.to_save = tensors

    def hand_on(self, *tensors):
        """Save tensors that the backward hands on as gradients (buffers the forward wrote): the node lets go of
        them as its backward starts, so that autograd moves them into .grad rather than copying them, and runs
        once (a second backward through the same forward raises)."""
        self.to_save, self.once = tensors, True

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable = tensors

    def set_materialize_grads(self, value: bool) -> None:
        """Gradients that no loss reached come as None: the node never materializes them."""

    def copy(self) -> "EagerContext":
        """A context of its own for one backward: the nodes a recorded forward makes share the recorded call's."""
        ctx = EagerContext(self.plan)
        ctx.once = self.once
        ctx.__dict__.update(self.__dict__)
        return ctx


# Why a node's backward could not be recorded, by node name (the latest reason): for the tests and for a user
# asking why an op's backward still runs in Python.
refusals: dict[str, str] = {}


def attach(module, node_name: str, node_backward, ctx: EagerContext, args, output, sequence_nr: int = -1) -> None:
    """Make the outputs of an eager forward (a tensor or a tuple, None for absent ones) differentiable through a
    C++ node named node_name, whose backward in Python is node_backward (`backward` with the op's rule bound):
    recorded on a signature's first backward and replayed on later ones. sequence_nr: the node's autograd sequence
    number, where the forward's profiler record took one (-1: the next)."""
    try:
        table = ctx.plan.eager_programs
    except AttributeError:
        table = ctx.plan.eager_programs = {}
    key = tuple(ctx.__dict__.values())
    programs = table.get(key)
    if programs is None:
        programs = table[key] = module.Programs()
    recorder = recording.recorder
    if recorder is not None:   # a forward being recorded: its replays attach a node of their own
        recorder.attach(node_name, programs, node_backward, ctx, args, output)
    module.attach(node_name, programs, node_backward, ctx, args, output, ctx.non_differentiable, ctx.to_save,
                  ctx.once, sequence_nr)
    # The node holds ctx: a tensor left on it whose grad_fn is the node would be a cycle through C++ that Python's
    # collector cannot see (every saved activation of a training step, leaked)
    ctx.to_save = ctx.non_differentiable = ()


def backward(backward_rule, node_name: str, ctx: EagerContext, saved, grads, programs):
    """The node's backward in Python: the op's rule, recorded for later replays where `programs` is given (no
    record for this signature yet, grad mode off, no dispatch mode active)."""
    ctx = ctx.copy()
    ctx.saved_tensors = saved
    try:
        if programs is None or programs.full():
            return backward_rule(ctx, ctx.plan.backward, *grads)
        recording = Recording(saved + grads)
        with recording:
            result = backward_rule(ctx, ctx.plan.backward, *grads)
        program = recording.program(result)
        if not recording.cold:   # one that compiled a kernel is recorded next time instead
            programs.add(program)
            if recording.refusal is not None:
                refusals[node_name] = recording.refusal
        return result
    finally:
        ctx.saved_tensors = ()   # (no cycle through the node that holds the context it was copied from)


# Eager forwards replayed from C++ (ForwardPrograms in eager_node.cpp), the plans' and the entry points'; off with
# ROOFLINE_FORWARD_REPLAY=0. They cut forwards' host time below what the same forwards cost in Python, and a
# patched int8 Llama decodes faster eagerly with them than without (measured: benchmarks/results/h100-host.md,
# "2026-11-25, defaults").
REPLAY_FORWARDS = os.environ.get("ROOFLINE_FORWARD_REPLAY", "1") == "1"


def forward(op, plan, args: tuple):
    """plan.forward(*args), replayed from C++ where an earlier call with the same signature (every tensor's
    layout, every other argument's value, autocast's state) was recorded, else run in Python and recorded for the
    next calls.

    What an eager forward costs on the host beyond its kernels is Python: the plan's method, torch's allocation
    through its Python binding, the launcher's argument parsing. A replay makes the same aten calls through the
    dispatcher and launches the same kernels with cuLaunchKernel, as the backward node's replays do. A call made
    while the recording would not hold runs in Python and is not recorded: a dispatch mode active (replays happen
    without one), another device current than its tensors', a recording in progress.
    The op's forward must be a function of its signature (no host reads of tensor values, no state kept between
    calls), except for what it does through host_step, which a replay calls again."""
    try:
        replay = plan.forward_replay
    except AttributeError:
        plan.forward_programs = extension().ForwardPrograms()
        replay = plan.forward_replay = plan.forward_programs.replayer()
    output = replay(args, None)
    if output is None:
        return _record(op.names(args)[0], plan.forward_programs, lambda: plan.forward(*args), args, ())
    if output is False:
        return plan.forward(*args)
    return output


def _record(name: str, programs, run, args: tuple, keywords: tuple):
    """run(), recorded into `programs` as the forward of a call with arguments `args` (positional, then the values
    of the keyword arguments named `keywords`), where the recording holds; else run() alone."""
    devices = {a.device.index for a in args if isinstance(a, torch.Tensor) and a.is_cuda}
    device = next(iter(devices)) if devices else -1   # where the kernels launch: the current device's stream
    if not _recordable(programs, devices, device):
        return run()
    recording = Recording(tuple(a if isinstance(a, torch.Tensor) else None for a in args))
    with recording:
        output = run()
    single = isinstance(output, torch.Tensor)
    program = recording.program((output,) if single else output)
    if not recording.cold:   # one that compiled or tuned a kernel is recorded next time instead
        programs.add(program, args, keywords, single, device)
        if recording.refusal is not None:
            refusals[name] = recording.refusal
    return output


def _recordable(programs, devices: set, device: int) -> bool:
    """Whether a forward on these devices can be recorded now: recording has not stopped for its programs (too
    many recordings wasted: eager_node.cpp's ForwardPrograms), no recording in progress, no dispatch mode (a
    recording is one), its tensors on one device, which is the current one."""
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return not (programs.full() or recording.recorder is not None or _get_current_dispatch_mode() is not None
                or len(devices) > 1 or (device >= 0 and device != torch.cuda.current_device()))


def host_step(function, *args):
    """function(*args), host-side work of a forward whose result its signature does not fix (a slot for the
    targets' count, queued for a later check; a scratch buffer chosen by the current stream). Where the forward is
    being recorded, its program calls function again at each replay, with that call's tensors (the arguments that
    are the forward's tensors go by slot, the others as they are now) and takes its result (a tensor, or a tuple
    of tensors) as new tensors. function's own aten calls are not recorded: they are its business at each call."""
    recorder = recording.recorder
    if recorder is None:
        return function(*args)
    return recorder.host(function, args)


def forget_entries() -> None:
    """Forget every entry point's recorded calls (roofline.ops._launch.clear_plans: the plans they ran were built
    from settings that may have changed)."""
    for holder in _EntryPrograms.registry:
        holder.programs = None
        holder.others.clear()


ENTRY_DEVICES = ("cuda",)   # where entry points are recorded (the tests add the CPU, for plans made of torch ops)
_PLAIN = (torch.Tensor, torch.nn.Parameter)   # not a subclass, which may mean something else


def replayed_entry(function=None, *, settings=None):
    """entry_replay(function, settings=...) where forwards are replayed (the default), else function itself."""
    if function is None:
        return functools.partial(replayed_entry, settings=settings)
    return entry_replay(function, settings=settings) if REPLAY_FORWARDS else function


def entry_replay(function=None, *, settings=None):
    """The entry point `function` of an op (softmax(x, dim, *, backend)), replayed from C++ as a whole: an op's
    plan-level replay (forward) still runs the entry point's Python, its checks and its look-up of the call's
    signature, and for a call that wants a gradient its context and node, which cost as much as torch's whole op
    on a slow host.

    The first call with a signature (every tensor's layout, alignment and whether autograd records it, every other
    argument's value, keyword arguments by name, autocast's state) on a CUDA device, with backend None or
    "triton", runs the entry point in Python under a recording; later ones replay what it did: its aten calls
    through the dispatcher (in the grad mode each was made in), its kernels through cuLaunchKernel, and the
    attaching of the op's autograd node to their outputs, which then backpropagates as the recorded call's node
    does. Calls under torch.compile, a dispatch mode, a profiler (the Python path records the op under its name),
    functorch's transforms or a CUDA graph's capture being recorded, and tensor subclasses, run the entry point in
    Python, as before. The entry point must be a function of its signature: no host reads of tensor values,
    nothing kept between calls but plans, except through host_step (cross_entropy's check of its targets), which a
    replay calls again.

    settings, where given, returns what else the entry point's Python reads at a call (a module's switch set
    call by call: attention's Hopper kernels): each value keeps recorded calls of its own.

    replayed_entry, the decorator on the ops' entry points, applies it where replays are on (unless
    ROOFLINE_FORWARD_REPLAY=0) and leaves the entry point as it is otherwise: no wrapper on the hot path of a
    program that does not replay."""
    if function is None:
        return functools.partial(entry_replay, settings=settings)
    holder = _EntryPrograms(function)

    @functools.wraps(function)
    def entry(*args, **kwargs):
        if not _is_compiling():
            if settings is not None:
                holder.select(settings())
            replay = holder.replay
            if replay is not None:
                output = replay(args, kwargs)
                if output is not None and output is not False:
                    return output
                if output is False:
                    return function(*args, **kwargs)
            return holder.record(args, kwargs)
        return function(*args, **kwargs)

    entry.replays = holder
    return entry


# torch.compiler.is_compiling, one global read away (an entry point asks at every call); torch.compile's tracer
# knows the function itself, by whatever name it is called.
_is_compiling = torch.compiler.is_compiling


class _EntryPrograms:
    """An entry point's recorded calls (made at its first call that could be recorded), or None; and their replay
    (ForwardPrograms.replayer), or None."""

    __slots__ = ("function", "_programs", "replay", "name", "setting", "others")
    registry: list["_EntryPrograms"] = []   # every wrapped entry point's (clear_plans forgets their programs)

    def __init__(self, function):
        self.function, self.programs = function, None
        self.setting, self.others = None, {}   # the settings' value now, and the other values' recorded calls
        self.name = f"roofline::{function.__name__}"
        _EntryPrograms.registry.append(self)

    def select(self, setting) -> None:
        """The recorded calls of this value of the entry point's settings."""
        if setting != self.setting:
            self.others[self.setting] = self.programs
            self.setting = setting
            self.programs = self.others.pop(setting, None)

    @property
    def programs(self):
        return self._programs

    @programs.setter
    def programs(self, programs) -> None:
        self._programs = programs
        self.replay = None if programs is None else programs.replayer()

    def record(self, args: tuple, kwargs: dict):
        """The call run in Python, recorded where it can be (see entry_replay)."""
        if not self._wanted(args, kwargs):
            return self.function(*args, **kwargs)
        if self.programs is None:
            module = extension()
            if module is None:
                return self.function(*args, **kwargs)
            self.programs = module.ForwardPrograms(entry=True)
        return _record(self.name, self.programs, lambda: self.function(*args, **kwargs),
                       (*args, *kwargs.values()), tuple(kwargs))

    @staticmethod
    def _wanted(args: tuple, kwargs: dict) -> bool:
        """A call on plain CUDA tensors, with backend None or "triton" (torch's and torch.compile's backends launch
        what a recording cannot see, or gain nothing), outside a capture and functorch's transforms."""
        if not REPLAY_FORWARDS or kwargs.get("backend") not in (None, "triton"):
            return False
        tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
        return (bool(tensors) and all(type(t) in _PLAIN and t.device.type in ENTRY_DEVICES for t in tensors)
                and not capturing() and not torch._C._are_functorch_transforms_active())


# Calls that only allocate: the layout of what they make is fixed by the signature a program is recorded for
# (AllocationStep in eager_node.cpp)
_ALLOCATIONS = {torch.ops.aten.empty.memory_format, torch.ops.aten.empty_like.default,
                torch.ops.aten.empty_strided.default, torch.ops.aten.new_empty.default,
                torch.ops.aten.new_empty_strided.default}


class Recording(TorchDispatchMode):
    """Records a backward's (or a forward's) aten calls (as a dispatch mode) and its kernel launches (Launch
    reports them to recording.recorder, on its thread), then builds the C++ program that replays them."""

    def __init__(self, inputs: tuple):
        super().__init__()
        self.inputs = inputs
        self.tensors = [t for t in inputs if t is not None]   # every slot's tensor stays alive while recording
        self.slots = {id(t): i for i, t in enumerate(inputs) if t is not None}
        self.count = len(inputs)
        self.steps: list[tuple] = []
        self.attached = False   # an op's node was attached (a forward that makes a gradient)
        self.refusal = None if len(self.slots) == len(self.tensors) else "one tensor passed twice"
        self.cold = False   # a launch compiled or autotuned its kernel: what it did (timing runs) is no record
        self.paused = False   # in a host step, whose aten calls are its own

    def __enter__(self):
        recording.recorder = self
        return super().__enter__()

    def __exit__(self, *exc):
        recording.recorder = None
        return super().__exit__(*exc)

    def refuse(self, reason: str) -> None:
        if self.refusal is None:
            self.refusal = reason

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.refusal is None and not self.paused:
            self._aten(func, args, kwargs, out)
        return out

    def host(self, function, args: tuple):
        """function(*args) as a host step (host_step): called now, and again at each replay."""
        self.paused = True
        try:
            out = function(*args)
        finally:
            self.paused = False
        if self.refusal is None:
            results = out if isinstance(out, tuple) else (out,)
            if not all(isinstance(t, torch.Tensor) for t in results):
                self.refuse(f"host step {function} returns {type(out).__name__}")
                return out
            slots = [-1 if not isinstance(a, torch.Tensor) else self._slot(a) for a in args]
            if None in slots:
                self.refuse(f"host step {function} takes a tensor the recorded code did not make")
                return out
            for t in results:
                self._add(t)
            self.steps.append(("host", function, slots, [a if s < 0 else None for a, s in zip(args, slots)],
                               len(results)))
        return out

    def _aten(self, func, args, kwargs, out) -> None:
        positions = []
        for i, argument in enumerate(func._schema.arguments):
            if i < len(args) and not argument.kwarg_only:
                value = args[i]
            elif argument.name in kwargs:
                value = kwargs[argument.name]
            else:
                continue
            if isinstance(value, torch.Tensor):
                slot = self._slot(value)
                if slot is not None:
                    positions.append((i, slot))
            elif isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value):
                return self.refuse(f"{func} takes a tensor list")
        results = out if isinstance(out, tuple) else (out,)
        if not all(isinstance(t, torch.Tensor) for t in results) or len(results) != len(func._schema.returns):
            return self.refuse(f"{func} returns {type(out).__name__}")
        for t in results:
            self._add(t)
        overload = "" if func._overloadname == "default" else func._overloadname
        step = (func._schema.name, overload, tuple(args), dict(kwargs), positions, torch.is_grad_enabled())
        if func in _ALLOCATIONS and out.device.type in ("cuda", "cpu") and not out.is_pinned() \
                and not out.requires_grad:
            self.steps.append(("allocate", *step, out))   # made by the allocator directly at replay
        else:
            self.steps.append(("aten", *step))

    def attach(self, node_name: str, programs, node_backward, ctx: EagerContext, args, output) -> None:
        """An op's node attached to the outputs of its kernels (_eager_node.attach), with what ctx saves."""
        self.attached = True
        if self.refusal is not None:
            return
        outputs = output if isinstance(output, tuple) else (output,)
        # An output marked non-differentiable that the recorded code did not make (a word the plan holds, such as
        # cross_entropy's unread counts) is the same tensor at every call: the node needs to know only that it gets
        # no gradient, which an absent output (-1) tells it too.
        held = {id(t) for t in ctx.non_differentiable if id(t) not in self.slots}
        slots = {}
        for group, tensors in (("inputs", args), ("outputs", outputs), ("non_differentiable", ctx.non_differentiable),
                               ("saved", ctx.to_save)):
            slots[group] = [-1 if not isinstance(t, torch.Tensor) or (group in ("outputs", "non_differentiable")
                                                                       and id(t) in held)
                            else self.slots.get(id(t)) for t in tensors]
            if None in slots[group]:
                return self.refuse(f"{node_name}: a tensor of its node's {group} the recorded code did not make")
        self.steps.append(("attach", node_name, programs, node_backward, ctx, slots["inputs"], slots["outputs"],
                           slots["non_differentiable"], slots["saved"], ctx.once))

    def compiling(self, launch) -> None:
        """A Launch is about to make its first call, which compiles (or autotunes, timing runs of its own)."""
        self.cold = True

    def launch(self, launch, args) -> None:
        """A Launch ran these arguments through its compiled kernel."""
        if self.refusal is not None:
            return
        native = launch.native
        if native is None:
            return self.refuse(f"{launch.kernel} cannot be launched from C++ ({launch.native_refusal})")
        function, grid, block, shared, kinds, specs = native
        values = []
        for arg, kind, spec in zip(args, kinds, specs):
            if kind[0] in "pT":
                if not isinstance(arg, torch.Tensor):
                    return self.refuse(f"{launch.kernel} takes {type(arg).__name__} for a tensor")
                slot = self._slot(arg)
                source = arg if slot is None else slot
                if spec is None:
                    values.append(source)
                else:   # a TMA descriptor, then its shape and strides
                    descriptor, shape, strides = spec
                    values += [(source, *descriptor), *shape, *strides]
            elif kind == "-":
                values.append(None)
            elif kind in "fd":
                values.append(float(arg))
            else:
                values.append(int(arg))
        self.steps.append(("launch", function, grid, block, shared, "".join(kinds), values))

    def _slot(self, t: torch.Tensor):
        """t's slot, or None for a tensor from outside the backward (held by its plan, kept by the program).
        A tensor sharing memory with a slot but not made through the dispatcher (`.data`) cannot be replayed."""
        slot = self.slots.get(id(t))
        if slot is None:
            storage = t.untyped_storage().data_ptr()
            if any(s.untyped_storage().data_ptr() == storage for s in self.tensors if s.device == t.device):
                self.refuse("a tensor aliasing the backward's own, made outside the dispatcher")
        return slot

    def _add(self, t: torch.Tensor) -> None:
        self.slots.setdefault(id(t), self.count)
        self.tensors.append(t)
        self.count += 1

    def program(self, result):
        """The C++ program of what was recorded, for gradients `result`; one that says "run in Python" where
        the backward cannot be replayed."""
        module = extension()
        results = []
        for g in result:
            slot = None if g is None else self.slots.get(id(g))
            if g is not None and slot is None:
                self.refuse("a result the recorded code did not make")
            if g is not None and g.requires_grad and not self.attached:
                self.refuse("a result with a gradient not made by an op's node (torch.autograd.Function)")
            results.append(-1 if slot is None else slot)
        builder = module.ProgramBuilder(list(self.inputs))
        if self.refusal is None:
            try:
                for step in self.steps:
                    getattr(builder, step[0])(*step[1:])
            except (RuntimeError, TypeError, ValueError) as exc:
                self.refuse(f"not replayable: {exc}")
        return builder.finish(results, self.refusal is None, self.count)
