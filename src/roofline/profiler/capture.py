"""Record what a PyTorch program does, with torch.profiler, and hand the trace to the analyses.

Three ways in, one recorder:
    with roofline.profile() as prof: ...          a region of your own code (prof.step() marks iterations)
    roofline.profile(fn, *args)                   one call of a function
    roofline profile script.py [args]             a whole program, run as __main__ (see `run_path`)

What is recorded: host ops with their shapes, the Python stack above every op,
GPU kernels, copies and memsets, CUDA runtime calls and synchronizations, and
(when asked) memory. Nothing is recorded, and nothing costs anything, outside
the window: the profiler starts on entry (or after `skip` steps) and stops on
exit (or after `active` steps).

Module names: PyTorch's Python tracer names modules by class and a counter
("Linear_3"); while recording, a global module hook marks every module call with
its attribute path instead ("MLP.layers.3"), which is what a user can find.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys
import tempfile
import warnings
from pathlib import Path

import torch

from roofline.profiler.trace import MODULE_MARK

_active: "Profiler | None" = None


def step() -> None:
    """Mark the end of one iteration of the program being profiled; does nothing when none is."""
    if _active is not None:
        _active.marked_by_program = True
        _active.step()


class _ModulePaths:
    """Annotate each nn.Module call with the module's attribute path, from the outermost module called."""

    def __init__(self):
        self._stack: list[tuple[torch.nn.Module, str, object]] = []
        self._names: dict[tuple[int, int], str] = {}
        self._handles = []

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
        handle = torch.ops.profiler._record_function_enter_new(MODULE_MARK + path, None)
        self._stack.append((module, path, handle))

    def _exit(self, module, args, output):
        if torch.compiler.is_compiling():
            return
        # Unwind to this module: a module that raised inside a child leaves the child's entry behind.
        while self._stack:
            entered, _, handle = self._stack.pop()
            torch.ops.profiler._record_function_exit._RecordFunction(handle)
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
            torch.ops.profiler._record_function_exit._RecordFunction(self._stack.pop()[2])


def _schedule(skip: int, active: int | None):
    """torch.profiler's schedule for 'skip `skip` steps, then record `active` (None: all the rest)'."""
    if skip == 0 and active is None:
        return None
    forever = 1 << 62
    if skip == 0:
        return torch.profiler.schedule(wait=0, warmup=0, active=active, repeat=1)
    # The step before recording starts is a warm-up, so that the profiler's start-up cost falls outside.
    return torch.profiler.schedule(skip_first=skip - 1, wait=0, warmup=1, active=active or forever, repeat=1)


class Profiler:
    """One recording. Use as a context manager, or call `run(fn, *args, **kwargs)`.

    After the window closes, `trace_path` holds the Chrome/Perfetto trace, and `report`
    its analysis (a `roofline.profiler.Report`, made when first asked for).
    """

    def __init__(self, *, skip: int = 0, active: int | None = None, shapes: bool = True,
                 memory: bool = False, modules: bool = True, trace: str | os.PathLike | None = None,
                 device=None):
        if not isinstance(skip, int) or isinstance(skip, bool) or skip < 0:
            raise ValueError(f"skip must be a non-negative int (steps to leave out), got {skip!r}")
        if active is not None and (not isinstance(active, int) or isinstance(active, bool) or active < 1):
            raise ValueError(f"active must be a positive int (steps to record) or None for all, got {active!r}")
        self.skip, self.active = skip, active
        self.shapes, self.memory, self.modules = shapes, memory, modules
        self.device = device
        self._own_dir = None
        if trace is None:
            self._own_dir = tempfile.TemporaryDirectory(prefix="roofline-trace-")
            trace = Path(self._own_dir.name) / "trace.json"
        self.trace_path = Path(trace)
        self.steps = 0
        self.marked_by_program = False   # set by the module-level step(); see _optimizer_steps
        self._report = None
        self._torch = None
        self._modules = None
        self._exported = False
        self._previous = None

    # ------------------------------------------------------------------ recording
    def _activities(self):
        acts = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        return acts

    def _export(self, prof) -> None:
        self.trace_path.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.trace_path))
        self._exported = True

    def __enter__(self) -> "Profiler":
        global _active
        if self._torch is not None:
            raise RuntimeError("this roofline Profiler has already been used; make a new one")
        config = torch._C._profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        schedule = _schedule(self.skip, self.active)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*warmup.*")
            self._torch = torch.profiler.profile(
                activities=self._activities(), schedule=schedule,
                on_trace_ready=self._export if schedule else None,
                record_shapes=self.shapes, profile_memory=self.memory,
                with_stack=True, with_modules=True, experimental_config=config)
        if self.modules:
            self._modules = _ModulePaths().__enter__()
        self._previous, _active = _active, self
        self._torch.__enter__()
        return self

    def step(self) -> None:
        """Mark the end of one iteration (to skip warm-up steps, and to report time per step)."""
        if self._torch is None:
            raise RuntimeError("Profiler.step() called outside the profiled window")
        self.steps += 1
        self._torch.step()

    def __exit__(self, exc_type, exc, tb):
        global _active
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                # Let queued GPU work finish inside the window, so its kernels are recorded.
                torch.cuda.synchronize()
        finally:
            self._torch.__exit__(None, None, None)
            if self._modules is not None:
                self._modules.__exit__()
            _active = self._previous
        if not self._exported and self.steps >= self.skip:
            self._export(self._torch)
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
            self._report = analyze(self.trace_path, device=self.device, steps=self.steps)
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


def run_program(target: str, args: list[str], *, module: bool = False, **options):
    """Run a script (or with module=True a module) as __main__ under the profiler.

    Returns (profiler, status, error): the program's exit status, and the exception
    it ended with (None for a clean exit). The report covers what ran either way.
    """
    if module:
        import importlib.util

        try:
            found = importlib.util.find_spec(target)
        except (ImportError, ValueError) as exc:
            raise FileNotFoundError(f"cannot find module {target!r}: {exc}") from None
        if found is None:
            raise FileNotFoundError(f"no module named {target!r}")
        argv, entry = [found.origin or target, *args], os.getcwd()
        body = lambda: runpy.run_module(target, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        path = Path(target)
        if not path.is_file():
            raise FileNotFoundError(f"no such file: {target}")
        argv, entry = [str(path), *args], str(path.resolve().parent)
        body = lambda: runpy.run_path(str(path), run_name="__main__")  # noqa: E731
    prof = Profiler(**options)
    status, error = 0, None
    with _as_main(argv, entry), _optimizer_steps(prof):
        with prof:
            try:
                body()
            except BaseException as exc:  # the program's own ending, reported after the profile
                status, error = _exit_status(exc), None if isinstance(exc, SystemExit) else exc
    return prof, status, error


@contextlib.contextmanager
def _optimizer_steps(prof: Profiler):
    """Count each optimizer.step() as a step of the program, until the program marks one itself
    with roofline.profiler.step(). A training script then needs no change for `skip` to leave out
    its warm-up iterations."""

    def on_step(optimizer, args, kwargs):
        if _active is prof and not prof.marked_by_program:
            prof.step()

    from torch.optim.optimizer import register_optimizer_step_post_hook

    handle = register_optimizer_step_post_hook(on_step)
    try:
        yield
    finally:
        handle.remove()
