"""The Triton kernels a function launches, each compiled for a GPU: what `roofline inspect` looks inside.

`launches(fn)` runs fn once and notes every Triton kernel launch: the kernel, its arguments and constexprs as the
launch passed them (an autotuner's or heuristic's choice included), and its grid. On a GPU the launch compiled the
kernel already, and that very binary is inspected. Where kernels run through Triton's interpreter (a machine
without a GPU), nothing was compiled: `compiled` compiles the kernel for the GPU asked for, specialized on the
same arguments as Triton's JIT would specialize it there (which integers are 1 or divisible by 16, which pointers
are 16-byte aligned), with Triton's own ptxas. What it cannot know there is the configuration a GPU's autotuner
would pick: the launch's own (the interpreter's) is the one compiled, and the report says so. roofline's own
kernels take a few constexprs for the interpreter's sake (a bf16 tl.dot multiplied in fp32, which the
interpreter gets wrong otherwise): those are compiled as a GPU's launch takes them (roofline.ops._state.as_on_a_gpu).
"""

from __future__ import annotations

import inspect as _inspect
import sys
import threading
from dataclasses import dataclass, field

import torch

from roofline.inspect import occupancy
from roofline.ops._state import as_on_a_gpu

try:
    import triton
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:   # roofline works without Triton; inspecting Triton kernels does not
    triton = Autotuner = InterpretedFunction = JITFunction = TensorDescriptor = None


@dataclass
class Launch:
    """One kernel launch as the program made it."""
    kernel: object                       # the JITFunction or InterpretedFunction launched
    args: tuple = field(repr=False)
    kwargs: dict = field(repr=False)     # constexprs and compile options (num_warps, num_stages, ...)
    grid: tuple | None                   # None where a grid function could not be read again
    compiled: object = field(default=None, repr=False)   # the CompiledKernel a GPU ran; None under the interpreter
    # where the kernel keeps no Python function (Inductor's, compiled in its worker processes: their JITFunction
    # comes back with fn=None), its name and (file, line of its def) as the launcher knows them
    label: str | None = None
    source: tuple[str, int] | None = None

    @property
    def name(self) -> str:
        return self.label or self.kernel.fn.__name__

    @property
    def parameters(self) -> list[str]:
        return _parameters(self.kernel)

    @property
    def where(self) -> tuple[str, int]:
        if self.source is not None:
            return self.source
        fn = getattr(self.kernel, "fn", None)
        if fn is None:   # a kernel whose function stayed in a compile worker, and whose module could not be read
            return "?", 0
        return fn.__code__.co_filename, fn.__code__.co_firstlineno

    def unaligned(self) -> list[str]:
        """What kept Triton from vectorizing this launch's accesses, as its JIT specializes them: integer
        arguments not divisible by 16, pointers not 16-byte aligned."""
        named = list(zip(self.parameters, self.args))
        return unaligned_text([f"{n}={v}" for n, v in named
                               if isinstance(v, int) and not isinstance(v, bool) and v % 16 and v != 1],
                              [n for n, v in named if hasattr(v, "data_ptr") and v.data_ptr() % 16])


def unaligned_text(odd: list[str], misaligned: list[str]) -> list[str]:
    """The narrow-loads finding's reasons: integer arguments not divisible by 16, pointers not 16-byte aligned."""
    return ([f"integer arguments not divisible by 16 ({', '.join(odd)})"] if odd else []) + (
        [f"pointers not 16-byte aligned ({', '.join(misaligned)})"] if misaligned else [])


def _specialized(value):
    """What tells one launch's kernel from another's: a tensor's dtype and whether it is 16-byte aligned (what
    Triton's JIT compiles into the kernel), a tensor descriptor's dtype and block, any other value itself (an
    integer passed by position may be a constexpr)."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), value.data_ptr() % 16 == 0
    if _is_descriptor(value):
        return "descriptor", str(value.base.dtype), tuple(value.block_shape)
    try:
        hash(value)
        return value
    except TypeError:
        return repr(value)


def _is_descriptor(value) -> bool:
    return TensorDescriptor is not None and isinstance(value, TensorDescriptor)


def _parameters(kernel) -> list[str]:
    """A JITFunction's or InterpretedFunction's parameter names, in order."""
    return [p.name for p in kernel.params] if hasattr(kernel, "params") else list(kernel.arg_names)


def _grid(grid, kernel, args, kwargs) -> tuple | None:
    """The launch's grid, as three ints; a callable grid gets the arguments as the JIT binds them (defaults
    filled in). None where it cannot be read (the launch itself ran: this must not fail it)."""
    try:
        if callable(grid):
            bound = _inspect.signature(kernel.fn).bind(*args, **{k: v for k, v in kwargs.items()
                                                                 if k in _parameters(kernel)})
            bound.apply_defaults()
            grid = grid({**bound.arguments, **kwargs})
        return tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    except Exception:   # a grid function of the user's that wants more than the JIT gives it
        return None


_CAPTURING = threading.Lock()   # Triton's classes are patched while a function runs: one capture at a time


def launches(fn, *args, **kwargs) -> list[Launch]:
    """Run fn(*args, **kwargs) once and return the Triton launches it made, in order (the first launch of each
    kernel and constexpr configuration: a kernel launched again alike adds nothing to inspect)."""
    if triton is None:
        raise RuntimeError("inspecting kernels needs Triton (pip install triton)")
    with _CAPTURING:
        return _launches(fn, args, kwargs)


def _launches(fn, args, kwargs) -> list[Launch]:
    seen: dict[tuple, Launch] = {}
    jit_run, interpreted_run = JITFunction.run, InterpretedFunction.run

    def note(kernel, compiled, given, grid, kw):   # given: the launch's arguments
        if benchmarking:
            return
        config = tuple(sorted((k, _specialized(v)) for k, v in kw.items()))
        key = (id(kernel), config, tuple(map(_specialized, given)), None if compiled is None else id(compiled))
        if key not in seen:
            seen[key] = Launch(kernel, given, kw, _grid(grid, kernel, given, kw), compiled)

    def on_jit(self, *args, grid, warmup, **kw):
        compiled = jit_run(self, *args, grid=grid, warmup=warmup, **kw)
        if not warmup:
            note(self, compiled, args, grid, kw)
        return compiled

    def on_interpreted(self, *args, grid, warmup, **kw):
        out = interpreted_run(self, *args, grid=grid, warmup=warmup, **kw)
        if not warmup:
            note(self, None, args, grid, kw)
        return out

    def timing(self, *args, **kw):   # an autotuner timing its configs: trials, not the program's launches
        benchmarking.append(self)
        try:
            return bench(self, *args, **kw)
        finally:
            benchmarking.pop()

    # roofline's ops launch a kernel they have launched before from C++, past Triton's JIT: with their plans
    # forgotten, the function's launches go through the JIT again, where they are seen
    from roofline.ops._launch import clear_plans

    clear_plans()
    bench, benchmarking = Autotuner._bench, []
    JITFunction.run, InterpretedFunction.run, Autotuner._bench = on_jit, on_interpreted, timing
    try:
        fn(*args, **kwargs)
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    finally:
        JITFunction.run, InterpretedFunction.run, Autotuner._bench = jit_run, interpreted_run, bench
    return list(seen.values())


def target(arch: str | None = None):
    """The GPU to compile for: `arch` ("sm_90"), else this machine's GPU, else the H100's sm_90."""
    from triton.backends.compiler import GPUTarget

    if arch is None:
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            arch = f"sm_{major}{minor}"
        else:
            arch = "sm_90"
    known = occupancy.limits(arch)   # an arch whose limits roofline knows, or a ValueError naming them
    return GPUTarget("cuda", int(known.arch.removeprefix("sm_")), 32)


def compiled(found: list[Launch], gpu) -> list[dict]:
    """Each launch's kernel compiled for `gpu` (a GPUTarget) as Triton's JIT compiles it there, as
    {"asm": {"ttir", "ttgir", "llir", "ptx": text, "cubin": bytes}, "metadata": {...}, "here": bool}, or
    {"error": why} for a kernel that could not be: the binary the GPU ran where the launch compiled one for it
    ("here": False), else compiled here, in a process of its own where Triton compiles rather than interprets
    (the interpreter patches triton.language as it runs kernels, and does not always undo it)."""
    out: list[dict | None] = [None] * len(found)
    todo, specs = [], []
    for k, launch in enumerate(found):
        if launch.compiled is not None and getattr(launch.compiled.metadata, "target", None) == gpu:
            out[k] = {**_as_dict(launch.compiled), "here": False}
            continue
        if _roofline_s_interpreted(launch):   # (a user's kernel keeps its constexprs, whatever their names)
            launch.kwargs = as_on_a_gpu(launch.kwargs, _first_dtype(launch.args))   # the report shows what compiled
        try:
            specs.append(_spec(launch))
            todo.append(k)
        except ValueError as exc:
            out[k] = {"error": str(exc)}
    if todo:
        for k, result in zip(todo, _compile_elsewhere(specs, gpu)):
            out[k] = {**result, "here": True} if "error" not in result else result
    return out


def _roofline_s_interpreted(launch: Launch) -> bool:
    """Whether the launch is one of roofline.ops' kernels run through the interpreter."""
    return (InterpretedFunction is not None and isinstance(launch.kernel, InterpretedFunction)
            and getattr(launch.kernel.fn, "__module__", "").startswith("roofline.ops."))


def _first_dtype(args) -> torch.dtype | None:
    """The dtype of a launch's first tensor (or tensor descriptor's)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.dtype
        if _is_descriptor(a):
            return a.base.dtype
    return None


def _as_dict(kernel) -> dict:
    meta = kernel.metadata
    return {"asm": {k: v for k, v in kernel.asm.items() if k in ("ttir", "ttgir", "llir", "ptx", "cubin")},
            "metadata": {"name": meta.name, "num_warps": meta.num_warps, "num_stages": meta.num_stages,
                         "shared": meta.shared, "num_ctas": getattr(meta, "num_ctas", 1),
                         "arch": f"sm_{meta.target.arch}"}}


def _stand_in(value, kernel_name: str):
    """An argument as another process rebuilds it for the JIT's specialization: a tensor as its dtype and its
    pointer's alignment, a tensor descriptor as those and its shape, strides and block, any other value as is."""
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.dtype).removeprefix("torch."), value.data_ptr() % 16)
    if _is_descriptor(value):
        return ("descriptor", _stand_in(value.base, kernel_name), list(value.shape), list(value.strides),
                list(value.block_shape), getattr(value, "padding", "zero"))
    try:
        import pickle

        pickle.dumps(value)
    except Exception as exc:
        raise ValueError(f"kernel {kernel_name}: an argument of type {type(value).__name__} cannot be passed to "
                         "the process that compiles it") from exc
    return ("value", value)


def _spec(launch: Launch) -> dict:
    """What another process needs to compile the launch's kernel: where the kernel is defined (a module imported
    by name is imported so again; a file loaded by path, as a FILE:FUNCTION target is, is loaded by path), and its
    arguments as stand-ins."""
    fn = launch.kernel.fn
    return {"module": fn.__module__ if fn.__module__ in sys.modules and fn.__module__ != "__main__" else None,
            "file": fn.__code__.co_filename, "name": fn.__name__, "qualname": fn.__qualname__,
            "debug": bool(getattr(launch.kernel, "debug", False)),
            "args": [_stand_in(a, fn.__name__) for a in launch.args],
            "kwargs": {k: _stand_in(v, fn.__name__) for k, v in launch.kwargs.items()}}


def _compile_elsewhere(specs: list[dict], gpu) -> list[dict]:
    import os
    import pickle
    import subprocess
    import tempfile

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    with tempfile.TemporaryDirectory(prefix="roofline-inspect-") as folder:
        asked, answer = os.path.join(folder, "asked.pkl"), os.path.join(folder, "compiled.pkl")
        with open(asked, "wb") as f:   # files, not pipes: what the kernels' modules print cannot mix in
            pickle.dump((specs, (gpu.backend, gpu.arch, gpu.warp_size)), f)
        done = subprocess.run([sys.executable, "-c", "from roofline.inspect.kernels import _child; _child()",
                               asked, answer], capture_output=True, env=env, timeout=1800)
        if done.returncode != 0 or not os.path.exists(answer):
            raise RuntimeError("compiling the kernels for the GPU failed:\n"
                               + done.stderr.decode(errors="replace")[-3000:])
        with open(answer, "rb") as f:
            return pickle.load(f)


def _child() -> None:
    """compiled()'s other process: argv[1] holds the specs and the target; argv[2] gets each kernel compiled, or
    the error that stopped it."""
    import pickle

    from triton.backends.compiler import GPUTarget

    with open(sys.argv[1], "rb") as f:
        specs, gpu = pickle.load(f)
    from triton.compiler import make_backend

    gpu = GPUTarget(*gpu)
    backend, modules, results = make_backend(gpu), {}, []
    for spec in specs:
        try:
            results.append(_compile_one(spec, gpu, backend, modules))
        except Exception as exc:   # one kernel that does not compile leaves the others theirs
            results.append({"error": f"{type(exc).__name__}: {exc}"[:2000]})
    with open(sys.argv[2], "wb") as f:
        pickle.dump(results, f)


def _compile_one(spec: dict, gpu, backend, modules: dict) -> dict:
    import importlib
    import importlib.util

    from triton.compiler import ASTSource, compile
    from triton.runtime.jit import create_function_from_signature

    where = spec["module"] or spec["file"]
    if where not in modules:
        if spec["module"] is not None:
            modules[where] = importlib.import_module(spec["module"])
        else:
            loaded = importlib.util.spec_from_file_location(f"_roofline_inspected_{len(modules)}", spec["file"])
            modules[where] = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(modules[where])
    kernel = getattr(modules[where], spec["name"], None)
    while kernel is not None and not isinstance(kernel, JITFunction):   # under an autotuner or heuristics
        kernel = getattr(kernel, "fn", None)
    if kernel is None or kernel.fn.__qualname__ != spec["qualname"]:
        raise ValueError(f"kernel {spec['qualname']} is not a global of {spec['file']}: only a module's kernels "
                         "can be compiled for a GPU this machine does not have")

    def real(value):
        if value[0] == "value":
            return value[1]
        if value[0] == "descriptor":
            return TensorDescriptor(real(value[1]), value[2], value[3], value[4], value[5])
        dtype = getattr(torch, value[1])
        size = torch.empty(0, dtype=dtype).element_size()
        return torch.empty(32, dtype=dtype)[value[2] // size:]   # the same alignment, 16-byte or not

    args = [real(a) for a in spec["args"]]
    kwargs = {k: real(v) for k, v in spec["kwargs"].items()}
    kwargs.setdefault("debug", spec["debug"])
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return _as_dict(compile(ASTSource(kernel, signature, constexprs, attrs), target=gpu, options=options.__dict__))
