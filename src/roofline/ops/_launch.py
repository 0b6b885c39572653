"""The eager launch path: launch plans, and Triton kernels launched straight through their compiled launchers.

An op called from eager Python pays host time on every call, and on a slow host that time, not the kernel, is
what the program waits for. `kernel[grid](...)` of a trivial Triton kernel costs more host time a call than
torch's `x + 1` (measured: benchmarks/results/h100-host.md, "Launching a trivial kernel"): the JIT binds the
arguments, computes every argument's specialization, hashes them into a cache key and looks the compiled kernel
up, before the C launcher it generated runs. Around that, our ops checked their arguments, reshaped views and
went through torch.autograd.Function.apply, whose Python wrapper alone costs more than a torch op.

What replaces it:

- A *plan* per call signature (shapes, strides, dtypes, device, options) holds everything derived from them:
  the launch grids, the constexprs and the chosen (autotuned) config. `Plans` keeps them by key, so that no
  heuristic, autotuner or argument check runs again for a signature it has seen: an entry point looks its
  call's signature up first and goes straight to the plan on a hit.
- `Launch` is one kernel of a plan. Its first call goes through Triton's JIT as usual (compiling or
  autotuning); later calls hand the arguments to the C launcher Triton generated for that compiled kernel,
  as Inductor's generated launchers do: grid, stream, function handle and metadata fixed, nothing bound or
  hashed. A kernel that takes no tensor descriptor is launched by roofline's own C++ instead (eager_node.cpp's
  `launch`: cuLaunchKernel with the kinds of its arguments fixed), skipping what Triton's launcher does on every
  call (a format string parsed over every argument, the metadata unpacked, the driver asked about every pointer):
  less host time a forward (measured: benchmarks/results/h100-host.md, "2026-11-25, last"). ROOFLINE_NATIVE_LAUNCH=0
  keeps Triton's launcher.

Specialization: Triton compiles a kernel for the values of its integer arguments (1, multiples of 16) and for
whether each pointer is 16-byte aligned. A plan's key fixes every integer a kernel takes. Pointers change from
call to call: a plan checks that its inputs' are 16-byte aligned (outputs come from torch's allocator, which
aligns them) and sends a call with a misaligned one through the JIT (`Launch.jit`), which specializes it anew;
a Launch's first call, whose compiled kernel all later direct calls reuse, is always an aligned one.

Under Triton's interpreter (the CPU tests) every launch goes through the JIT: the plans and their keys are the
same, so the tests check which plans are built.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import types
import warnings

import torch

from roofline.ops import _eager_node
from roofline.ops._common import interpreting, tma_descriptor, triton

NATIVE_LAUNCH = os.environ.get("ROOFLINE_NATIVE_LAUNCH", "1") == "1"   # see the module's docstring

PLAN_LIMIT = 4096   # plans one op keeps; past it the oldest go first (a program whose shapes never repeat)

class Plans(dict):
    """Plans of one op by key: `plans.get(key)` on the hot path, `plans.add(key, plan)` after a miss.
    `builds` counts the plans added, for the tests (a second call with a signature seen builds nothing)."""

    registry: list["Plans"] = []

    def __init__(self, name: str):
        super().__init__()
        self.name, self.builds = name, 0
        Plans.registry.append(self)

    def add(self, key, plan):
        if len(self) >= PLAN_LIMIT:
            del self[next(iter(self))]
        self[key] = plan
        self.builds += 1
        return plan


def plan_cache(name: str, key):
    """A plan builder made to build each plan once: build(*args) runs the first time key(*args) is made, and its
    plan is kept (in a Plans of this name, the decorated function's `plans`) for the calls after."""
    def decorate(build):
        plans = Plans(name)

        @functools.wraps(build)
        def plan(*args, **kwargs):
            k = key(*args, **kwargs)
            found = plans.get(k)
            return found if found is not None else plans.add(k, build(*args, **kwargs))

        plan.plans = plans
        return plan
    return decorate


def plans_built() -> dict[str, int]:
    """How many plans each op has built in this process."""
    return {plans.name: plans.builds for plans in Plans.registry}


def clear_plans() -> None:
    """Forget every plan (their kernels stay compiled), and the entry points' recorded calls, which ran plans:
    after changing a setting that plans were built from, such as a block size a test or a tuning run patches."""
    for plans in Plans.registry:
        plans.clear()
    _eager_node.forget_entries()


def tensor_key(t: torch.Tensor | None):
    """What a call signature holds of a tensor argument (None for an absent one): shape, strides, dtype,
    device. Raises AttributeError for what is not a tensor, which a signature then cannot hold."""
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


@contextlib.contextmanager
def _on_device(index: int):
    if index < 0 or torch.cuda.current_device() == index:
        yield
    else:
        with torch.cuda.device(index):
            yield


def _jit_function(kernel):
    """The JITFunction under autotuning and heuristics."""
    while not isinstance(kernel, triton.runtime.JITFunction):
        kernel = kernel.fn
    return kernel


class Launch:
    """kernel[grid](*args, **constexprs) with grid and constexprs fixed, on device `device` (an index; -1 on the
    CPU through the interpreter).

    Call it with the kernel's runtime arguments in order (every constexpr comes after them in the kernel's
    signature). `descriptors` maps positions of arguments that the kernel takes as TMA tensor descriptors to
    their block shapes (placeholders where an autotuner's pre-hook sets them), or to (block shape, shape,
    strides) to describe the tensor's memory as that shape, or to (block shape, shape or None, strides or None,
    shared-memory layout) for a Gluon kernel: at those positions pass the tensor (or None). The
    descriptors' shapes and strides are the first call's: every call of a Launch must pass tensors laid out
    alike (a plan's key holds their shapes and strides). Call `jit` instead where an input pointer is not
    16-byte aligned.
    """

    __slots__ = ("kernel", "grid", "device", "descriptors", "constexprs", "run", "direct", "config", "native",
                 "native_refusal")

    def __init__(self, kernel, grid, device: int, descriptors: dict | None = None, **constexprs):
        self.kernel, self.grid, self.device = kernel, grid, device
        self.descriptors, self.constexprs = descriptors or {}, constexprs
        self.direct = not interpreting()
        self.config = None   # the autotuner's choice, once known
        # what C++ needs to launch the compiled kernel itself (_native_launch), once known; else why it cannot
        self.native = None
        self.native_refusal = "not compiled yet" if self.direct else "its kernels run through Triton's interpreter"
        self.run = self._first

    def __call__(self, *args) -> None:
        recorder = _eager_node.recording.recorder
        if recorder is not None and self.run == self._first:
            recorder.compiling(self)
        self.run(*args)
        if recorder is not None:
            recorder.launch(self, args)

    def _jit_args(self, args) -> list:
        if not self.descriptors:
            return args
        args = list(args)
        for position, spec in self.descriptors.items():
            if args[position] is not None:
                # (block shape, [shape, strides, layout]): tma_descriptor's arguments after the tensor
                args[position] = tma_descriptor(args[position], *(spec if isinstance(spec, tuple) else (spec,)))
        return args

    def for_pointers(self, pointers: int):
        """This launch, where `pointers` (its inputs' data pointers or-ed together) are all 16-byte aligned, else
        its JIT path."""
        return self if pointers & 15 == 0 else self.jit

    def jit(self, *args) -> None:
        """A launch through Triton's JIT, which specializes on these very arguments (a misaligned pointer)."""
        recorder = _eager_node.recording.recorder
        if recorder is not None:
            recorder.refuse(f"{self.kernel} launched through Triton's JIT"
                            + ("" if self.direct else f" ({self.native_refusal})"))
        with _on_device(self.device):
            self.kernel[self.grid](*self._jit_args(args), **self.constexprs)

    def _first(self, *args) -> None:
        jit_args = self._jit_args(args)
        with _on_device(self.device):
            compiled = self.kernel[self.grid](*jit_args, **self.constexprs)
        self.config = getattr(self.kernel, "best_config", None)
        run = None
        if self.direct and compiled is not None:
            run, reason = self._direct_run(compiled, jit_args)
            if run is None:
                self.native_refusal = reason
                warnings.warn(f"roofline: {self.kernel} launches through Triton's JIT on every call ({reason})",
                              RuntimeWarning, stacklevel=2)
        self.run = (NATIVE_LAUNCH and run is not None and self._native_run()) or run or self.jit

    def _native_run(self):
        """A launch of the compiled kernel from roofline's C++ (eager_node.cpp's `launch`), or None where it takes a
        tensor descriptor (encoded per call: Triton's launcher does that) or the extension is not built."""
        if self.native is None or any(spec is not None for spec in self.native[5]):
            return None
        module = _eager_node.extension()
        if module is None:
            return None
        function, grid, block, shared, kinds, _ = self.native
        return functools.partial(module.launch, module.python_launch(function, grid, block, shared, "".join(kinds),
                                                                     self.device))

    def _grid_of(self, jit_args) -> tuple[int, int, int]:
        grid = self.grid
        if callable(grid):
            meta = dict(zip(self.kernel.arg_names, jit_args))
            meta.update(self.constexprs)
            if self.config is not None:
                meta.update(self.config.all_kwargs())
            grid = grid(meta)
        return (tuple(grid) + (1, 1))[:3]

    def _direct_run(self, compiled, jit_args):
        """(a function that launches `compiled`, what the JIT just ran, on the same grid with new arguments, None),
        or (None, why not) where this Triton's launcher is not the one this was written for."""
        if _hooked(triton.knobs.runtime.launch_enter_hook) or _hooked(triton.knobs.runtime.launch_exit_hook):
            return None, "a launch hook is set (a profiler of Triton's): the launches stay visible to it"
        params = _jit_function(self.kernel).params
        runtime = len(jit_args)
        if any(p.is_constexpr for p in params[:runtime]) or not all(p.is_constexpr for p in params[runtime:]):
            raise TypeError(f"{self.kernel}: Launch needs every constexpr after the runtime arguments")
        launcher = compiled.run   # loads the module on first use
        try:
            c_launch = launcher.launch
            if isinstance(c_launch, types.FunctionType):   # Triton's Python wrapper that expands descriptors
                c_launch = inspect.getclosurevars(c_launch).nonlocals["launcher"]
            if launcher.global_scratch_size or launcher.profile_scratch_size:
                return None, "the kernel needs scratch memory allocated per launch"
            descriptors = _descriptors(compiled, jit_args)
            expanders = _expanders(descriptors)
            cooperative, pdl = launcher.launch_cooperative_grid, launcher.launch_pdl
        except (AttributeError, KeyError, TypeError) as exc:
            return None, f"this Triton's launcher is not the one expected: {exc!r}"
        g0, g1, g2 = self._grid_of(jit_args)
        function, metadata, device = compiled.function, compiled.packed_metadata, self.device
        self.native, self.native_refusal = _native_launch(compiled, runtime, (g0, g1, g2), cooperative or pdl,
                                                          descriptors)
        tail = (None,) * (len(params) - runtime)
        stream = torch._C._cuda_getCurrentRawStream
        current = torch._C._cuda_getDevice

        def launch(*args):
            if current() == device:
                c_launch(g0, g1, g2, stream(device), function, cooperative, pdl, None, None, metadata, None, None,
                         None, *args, *tail)
            else:   # the kernel is loaded in its device's context: launch it there
                with torch.cuda.device(device):
                    c_launch(g0, g1, g2, stream(device), function, cooperative, pdl, None, None, metadata, None,
                             None, None, *args, *tail)

        if not any(expanders):
            return launch, None

        def expand_and_launch(*args):
            flat = []
            for arg, expand in zip(args, expanders):
                if expand is None:
                    flat.append(arg)
                else:
                    flat.extend(expand(arg))
            launch(*flat)

        return expand_and_launch, None


# Triton's argument types as the C++ node packs them (roofline/ops/eager_node.cpp): '-' is not passed
_ARGUMENT_KINDS = {"i1": "b", "i8": "b", "u1": "b", "u8": "b", "i16": "h", "u16": "h", "i32": "i", "u32": "i",
                   "i64": "l", "u64": "l", "fp32": "f", "f32": "f", "fp64": "d", "constexpr": "-"}


def _native_launch(compiled, runtime: int, grid, attributes: bool, descriptors: list):
    """((function, grid, threads, shared bytes, kinds, specs), None) for a compiled kernel that C++ can launch with
    cuLaunchKernel as Triton's launcher does, or (None, why not). kinds: per runtime argument, the kinds of the
    parameters it becomes (roofline/ops/eager_node.cpp); specs: per runtime argument, None or a TMA descriptor's
    (spec, shape, strides) from _descriptors, whose kinds are 'T', then the shape (i32) and strides (i64)."""
    num_warps, num_ctas, shared = compiled.packed_metadata
    if attributes or num_ctas != 1:
        return None, "it launches with a cooperative grid, a dependent launch or a cluster"
    kinds, specs = [], []
    for kind, descriptor in zip(list(compiled.src.signature.values())[:runtime], descriptors):
        if descriptor is not None:
            if descriptor[0] != "tma":
                return None, "it takes a tensor descriptor not lowered to the copy engine"
            rank = len(descriptor[2])
            kinds.append("T" + "i" * rank + "l" * rank)
            specs.append(descriptor[1:])
            continue
        if not isinstance(kind, str):
            return None, f"an argument of type {kind}"
        kinds.append("p" if kind.startswith("*") else _ARGUMENT_KINDS.get(kind, "?"))
        specs.append(None)
    if "?" in kinds:
        return None, f"argument types {list(compiled.src.signature.values())[:runtime]}"
    return (compiled.function, list(grid), 32 * num_warps, shared, kinds, specs), None


def _hooked(hook) -> bool:
    """Whether a launch hook would do anything: Triton 3.6 keeps an empty HookChain there, which the JIT calls on
    every launch (a direct launch skips it; a hook added after a plan's first call is not seen by that plan)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _descriptors(compiled, jit_args) -> list:
    """For each runtime argument, None, or for a TMA descriptor argument what the C launcher takes in its place
    (the shape and strides are the plan's, taken from the first call): ("tma", spec, shape, strides), where spec
    is fill_tma_descriptor's arguments after the address, or ("plain", shape, strides, nan) for one that was not
    lowered to the copy engine."""
    signature = list(compiled.src.signature.values())
    metas = iter(getattr(compiled.metadata, "tensordesc_meta", None) or ())
    from triton.backends.nvidia.driver import TMA_DTYPE_DEVICE_TO_HOST as host_type

    descriptors = []
    for arg, kind in zip(jit_args, signature):
        if not (isinstance(kind, str) and kind.startswith("tensordesc")):
            descriptors.append(None)
            continue
        shape, strides = [int(s) for s in arg.shape], [int(s) for s in arg.strides]
        meta = next(metas, None)
        if meta is None:
            descriptors.append(("plain", shape, strides, arg.padding == "nan"))
            continue
        if meta["fp4_padded"]:
            raise TypeError("fp4-padded descriptors are not expanded here")
        spec = (meta["swizzle"], meta["elem_size"], host_type[meta["elem_type"]], meta["block_size"], shape, strides,
                1 if arg.padding == "nan" else 0)
        descriptors.append(("tma", spec, shape, strides))
    return descriptors


def _expanders(descriptors) -> list:
    """For each runtime argument, None, or for a descriptor argument (see _descriptors) a function from the tensor
    to what the C launcher takes in its place."""
    fill = triton.runtime.driver.active.utils.fill_tma_descriptor
    expanders = []
    for d in descriptors:
        if d is None:
            expanders.append(None)
        elif d[0] == "plain":   # base, shape and strides, twice
            _, shape, strides, nan = d
            expanders.append(lambda t, s=shape, st=strides, nan=nan: (t, *s, *st, nan, *s, *st))
        else:
            _, spec, shape, strides = d
            expanders.append(lambda t, spec=spec, s=shape, st=strides: (fill(t.data_ptr(), *spec), *s, *st))
    return expanders
