"""The comparison every GPU course opens with: GeLU written five ways, against the bandwidth roofline.

    roofline bench examples/gelu_classic.py:sweep          # float32
    roofline bench examples/gelu_classic.py:sweep_bf16     # bfloat16

GeLU is elementwise: one read and one write per element is all the memory
traffic it needs, so the roofline is the device's copy bandwidth. The tanh
formula written by hand in eager PyTorch launches a kernel per operator and
moves the tensor through memory again each time; F.gelu, torch.compile of the
same formula, a Triton kernel and a CUDA C++ kernel each make one pass.
"""

import functools

import torch
import torch.nn.functional as F

from roofline import bench
from roofline.ops import cuda, gelu
from roofline.ops.gelu import gelu_tanh_by_hand


def _providers(device: torch.device) -> list[bench.Provider]:
    on_gpu = device.type == "cuda"
    no_cuda_cpp = cuda.unavailable_reason()
    if no_cuda_cpp is None:
        try:  # compile once, here, so the build's tens of seconds stay out of the sweep
            cuda.load("gelu", ("gelu_forward",))
        except Exception as exc:  # noqa: BLE001 - a failed build skips the provider, with its reason
            no_cuda_cpp = f"the CUDA C++ build failed: {str(exc).splitlines()[0][:200]}"
    return [
        bench.Provider("eager, by hand", gelu_tanh_by_hand),
        bench.Provider("F.gelu", functools.partial(F.gelu, approximate="tanh")),
        bench.Provider("compile(by hand)", torch.compile(gelu_tanh_by_hand)),
        bench.Provider("triton", functools.partial(gelu, approximate="tanh", backend="triton"),
                       skip=None if on_gpu else "Triton kernels need a CUDA GPU"),
        bench.Provider("cuda c++", functools.partial(gelu, approximate="tanh", backend="cuda"),
                       skip=None if on_gpu else (no_cuda_cpp or "CUDA C++ kernels need a CUDA GPU")),
    ]


def _sweep(dtype: torch.dtype) -> bench.Sweep:
    from roofline.device import resolve

    device = resolve(None)
    # 2^10 .. 2^28 elements on a GPU; the CPU stops at 2^24, where one eager pass already takes tens of ms.
    top = 28 if device.type == "cuda" else 24
    return bench.Sweep(
        name=f"gelu(tanh) {str(dtype).removeprefix('torch.')}",
        description=__doc__.split("\n\n")[0],
        x_name="elements",
        x_values=bench.geometric_sizes(2**10, 2**top, 4 if device.type == "cpu" else 2),
        inputs=lambda n, dev: (torch.randn(n, device=dev, dtype=dtype),),
        providers=_providers(device),
        baseline="F.gelu",
        bytes=lambda n, x: 2 * x.numel() * x.element_size(),  # read x once, write y once
    )


def sweep() -> bench.Sweep:
    return _sweep(torch.float32)


def sweep_bf16() -> bench.Sweep:
    return _sweep(torch.bfloat16)
