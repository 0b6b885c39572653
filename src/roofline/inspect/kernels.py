"""The Triton kernels a function launches, each compiled for a GPU: what `roofline inspect` looks inside.

`launches(fn)` runs fn once and notes every Triton kernel launch: the kernel, its arguments and constexprs as the
launch passed them (an autotuner's or heuristic's choice included), and its grid. On a GPU the launch compiled the
kernel already, and that very binary is inspected. Where kernels run through Triton's interpreter (a machine
without a GPU), nothing was compiled: `compile_for` compiles the kernel for the GPU asked for, specialized on the
same arguments as Triton's JIT would specialize it there (which integers are 1 or divisible by 16, which pointers
are 16-byte aligned), with Triton's own ptxas. What it cannot know there is the configuration a GPU's autotuner
would pick: the launch's own (the interpreter's) is the one compiled, and the report says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

try:
    import triton
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
except ImportError:   # roofline works without Triton; inspecting Triton kernels does not
    triton = Autotuner = InterpretedFunction = JITFunction = None


@dataclass
class Launch:
    """One kernel launch as the program made it."""
    kernel: object                       # the JITFunction or InterpretedFunction launched
    args: tuple = field(repr=False)
    kwargs: dict = field(repr=False)     # constexprs and compile options (num_warps, num_stages, ...)
    grid: tuple
    compiled: object = field(default=None, repr=False)   # the CompiledKernel a GPU ran; None under the interpreter

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__

    @property
    def parameters(self) -> list[str]:
        """The kernel's parameter names, in order."""
        kernel = self.kernel
        return [p.name for p in kernel.params] if hasattr(kernel, "params") else list(kernel.arg_names)

    @property
    def where(self) -> tuple[str, int]:
        code = self.kernel.fn.__code__
        return code.co_filename, code.co_firstlineno


def _specialized(value):
    """What Triton's JIT compiles an argument's value into (another value of the same makes the same kernel): a
    tensor's dtype and whether it is 16-byte aligned, whether an integer is 1 or divisible by 16."""
    if isinstance(value, torch.Tensor):
        return str(value.dtype), value.data_ptr() % 16 == 0
    if isinstance(value, int) and not isinstance(value, bool):
        return value == 1, value % 16 == 0
    return repr(value)


def _grid(grid, names: list[str], args, kwargs) -> tuple:
    if callable(grid):
        grid = grid({**dict(zip(names, args)), **kwargs})
    return tuple(int(g) for g in grid) + (1,) * (3 - len(grid))


def launches(fn, *args, **kwargs) -> list[Launch]:
    """Run fn(*args, **kwargs) once and return the Triton launches it made, in order (the first launch of each
    kernel and constexpr configuration: a kernel launched again alike adds nothing to inspect)."""
    if triton is None:
        raise RuntimeError("inspecting kernels needs Triton (pip install triton)")
    seen: dict[tuple, Launch] = {}
    jit_run, interpreted_run = JITFunction.run, InterpretedFunction.run

    def note(kernel, compiled, args, grid, kw):
        if benchmarking:
            return
        config = tuple(sorted((k, repr(v)) for k, v in kw.items()))
        key = (id(kernel), config, tuple(map(_specialized, args)), None if compiled is None else id(compiled))
        if key not in seen:
            launch = Launch(kernel, args, kw, (), compiled)
            launch.grid = _grid(grid, launch.parameters, args, kw)
            seen[key] = launch

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
            return GPUTarget("cuda", major * 10 + minor, 32)
        arch = "sm_90"
    text = str(arch).removeprefix("sm_").rstrip("a")
    if not text.isdigit():
        raise ValueError(f"arch must look like sm_90, got {arch!r}")
    return GPUTarget("cuda", int(text), 32)


def compiled(found: list[Launch], gpu) -> list[dict]:
    """Each launch's kernel compiled for `gpu` (a GPUTarget) as Triton's JIT compiles it there, as
    {"asm": {"ttir", "ttgir", "llir", "ptx": text, "cubin": bytes}, "metadata": {...}}: the binary the GPU ran where
    the launch compiled one for it, else compiled here, in a process of its own where Triton compiles rather than
    interprets (the interpreter patches triton.language as it runs kernels, and does not always undo it)."""
    out: list[dict | None] = [None] * len(found)
    todo = []
    for k, launch in enumerate(found):
        if launch.compiled is not None and getattr(launch.compiled.metadata, "target", None) == gpu:
            out[k] = _as_dict(launch.compiled)
        else:
            todo.append(k)
    if todo:
        for k, result in zip(todo, _compile_elsewhere([_spec(found[k]) for k in todo], gpu)):
            out[k] = result
    return out


def _as_dict(kernel) -> dict:
    meta = kernel.metadata
    return {"asm": {k: v for k, v in kernel.asm.items() if k in ("ttir", "ttgir", "llir", "ptx", "cubin")},
            "metadata": {"name": meta.name, "num_warps": meta.num_warps, "num_stages": meta.num_stages,
                         "shared": meta.shared, "num_ctas": getattr(meta, "num_ctas", 1),
                         "arch": f"sm_{meta.target.arch}"}}


def _spec(launch: Launch) -> dict:
    """What another process needs to compile the launch's kernel: where the kernel is defined, and its arguments
    with each tensor replaced by what the JIT specializes on (its dtype and its pointer's alignment)."""
    fn = launch.kernel.fn

    def stand_in(value):
        if isinstance(value, torch.Tensor):
            return ("tensor", str(value.dtype).removeprefix("torch."), value.data_ptr() % 16)
        if value is None or isinstance(value, (bool, int, float, str)):
            return ("value", value)
        raise ValueError(f"kernel {fn.__name__}: an argument of type {type(value).__name__} cannot be compiled "
                         "for another GPU here")

    # a module imported by name is imported so again; a file loaded by path (a FILE:FUNCTION target) is loaded
    return {"module": fn.__module__ if fn.__module__ in sys.modules else None, "file": fn.__code__.co_filename,
            "name": fn.__name__, "args": [stand_in(a) for a in launch.args],
            "kwargs": {k: stand_in(v) for k, v in launch.kwargs.items()}}


def _compile_elsewhere(specs: list[dict], gpu) -> list[dict]:
    import os
    import pickle
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(p or os.getcwd() for p in sys.path)
    done = subprocess.run([sys.executable, "-c", "from roofline.inspect.kernels import _child; _child()"],
                          input=pickle.dumps((specs, (gpu.backend, gpu.arch, gpu.warp_size))), capture_output=True,
                          env=env, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError("compiling the kernels for the GPU failed:\n" + done.stderr.decode(errors="replace")[-3000:])
    return pickle.loads(done.stdout)


def _child() -> None:
    """compiled()'s other process: specs and a target on stdin, the compiled kernels pickled to stdout."""
    import importlib
    import importlib.util
    import pickle

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile, make_backend
    from triton.runtime.jit import create_function_from_signature

    specs, gpu = pickle.loads(sys.stdin.buffer.read())
    gpu = GPUTarget(*gpu)
    backend = make_backend(gpu)
    results = []
    for spec in specs:
        if spec["module"] is not None:
            module = importlib.import_module(spec["module"])
        else:
            loaded = importlib.util.spec_from_file_location("_roofline_inspected", spec["file"])
            module = importlib.util.module_from_spec(loaded)
            loaded.loader.exec_module(module)
        kernel = getattr(module, spec["name"], None)
        if kernel is None:
            raise ValueError(f"kernel {spec['name']} is not a global of {spec['file']}: only a module's kernels "
                             "can be compiled for a GPU this machine does not have")
        while not isinstance(kernel, JITFunction):   # under an autotuner or heuristics
            kernel = kernel.fn

        def real(value):
            if value[0] == "value":
                return value[1]
            dtype = getattr(torch, value[1])
            size = torch.empty(0, dtype=dtype).element_size()
            return torch.empty(32, dtype=dtype)[value[2] // size:]   # the same alignment, 16-byte or not

        args = [real(a) for a in spec["args"]]
        kwargs = {k: real(v) for k, v in spec["kwargs"].items()}
        binder = create_function_from_signature(kernel.signature, kernel.params, backend)
        bound, specialization, options = binder(*args, **kwargs)
        options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
        results.append(_as_dict(compile(ASTSource(kernel, signature, constexprs, attrs), target=gpu,
                                        options=options.__dict__)))
    sys.stdout.buffer.write(pickle.dumps(results))
