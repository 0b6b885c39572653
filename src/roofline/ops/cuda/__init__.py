"""CUDA C++ kernels compiled with torch.utils.cpp_extension.load_inline, once.

Sources live beside this file as .cu files. A build is cached on disk under
roofline's cache directory, keyed by the source text, the torch build and the GPU
architecture, so a process tree compiles each extension once and later
processes load it in well under a second.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
from pathlib import Path

import torch

from roofline.device import cache_dir

SOURCE_DIR = Path(__file__).parent


def unavailable_reason() -> str | None:
    """Why CUDA C++ kernels cannot be built and run here, or None when they can."""
    if not torch.cuda.is_available():
        return "CUDA C++ kernels need a CUDA GPU"
    if torch.version.cuda is None:
        return "this torch build has no CUDA"
    from torch.utils.cpp_extension import CUDA_HOME

    if CUDA_HOME is None and shutil.which("nvcc") is None:
        return "nvcc (the CUDA toolkit) was not found"
    return None


def refuse_gradients(op: str, x: torch.Tensor) -> None:
    """The CUDA C++ kernels are forward passes only (the classic comparison's entries): say so rather than
    return a result that autograd cannot differentiate."""
    if x.requires_grad and torch.is_grad_enabled():
        raise NotImplementedError(
            f"{op}(backend='cuda') has a forward pass only (it is the CUDA C++ entry of the classic comparison); "
            "use backend='triton' where gradients are needed")


@functools.cache
def load(name: str, functions: tuple[str, ...]):
    """Build (or load the cached build of) SOURCE_DIR/<name>.cu and return the extension module.

    The .cu file holds the kernels and the host functions; `functions` are the
    host functions to bind, each declared in the file as `torch::Tensor f(...)`.
    """
    reason = unavailable_reason()
    if reason:
        raise RuntimeError(reason)
    from torch.utils.cpp_extension import load_inline

    source = (SOURCE_DIR / f"{name}.cu").read_text()
    headers = "".join(p.read_text() for p in sorted(SOURCE_DIR.glob("*.cuh")))   # included by the sources
    major, minor = torch.cuda.get_device_capability()
    arch = f"{major}{minor}"
    key = hashlib.sha256(f"{source}|{headers}|{torch.__version__}|{torch.version.cuda}|{arch}".encode()).hexdigest()[:16]
    build_dir = cache_dir() / "cuda" / f"{name}-{key}"
    build_dir.mkdir(parents=True, exist_ok=True)
    declarations = "\n".join(_declaration(source, f) for f in functions)
    # Build for this GPU only: compiling for every architecture torch knows triples the build time.
    os.environ.setdefault("TORCH_CUDA_ARCH_LIST", f"{major}.{minor}")
    return load_inline(
        name=f"roofline_{name}_{key}",
        cpp_sources=[declarations],
        cuda_sources=[source],
        functions=list(functions),
        build_directory=str(build_dir),
        extra_cuda_cflags=["-O3", "--generate-line-info"],
        extra_include_paths=[str(SOURCE_DIR)],
        verbose=False,
    )


def _declaration(source: str, function: str) -> str:
    """The C++ declaration of a host function, read off its definition in the .cu source."""
    for line in source.splitlines():
        if line.startswith("torch::Tensor ") and f" {function}(" in line:
            return line.rstrip(" {") + ";"
    raise ValueError(f"no host function 'torch::Tensor {function}(...)' on one line in {source[:40]}...")
