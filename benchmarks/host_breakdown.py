"""Where the host time of an eager forward+backward goes: roofline's op against torch's, layer_norm, rms_norm and
flash_attention at tiny shapes (the GPU idles; every microsecond is the host's).

    python benchmarks/host_breakdown.py

Per op and provider, us a call (median of 5 rounds of back-to-back calls): the forward without and with a gradient
wanted, forward+backward (torch.autograd.grad), and 8 forwards then one backward over all of them (autograd's
per-call cost spread, as in a training step); torch's `x * 2` gives autograd's own cost. Then roofline's ops with
every kernel launch stubbed out (what Python, allocation and autograd cost alone), with cProfile's top functions,
and torch.profiler's CPU view of both providers' forward+backward (self time per range). Needs a CUDA GPU.
"""

import cProfile
import io
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from roofline import ops
from roofline.ops import _launch

BF16 = torch.bfloat16


def per_call_us(fn, calls=1000, rounds=5) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def cases() -> dict:
    """name: (roofline's call, torch's call, the tensors to differentiate, a cotangent)."""
    x, w, b = (torch.randn(*shape, device="cuda", dtype=BF16, requires_grad=True)
               for shape in ((8, 512), (512,), (512,)))
    g = torch.randn(8, 512, device="cuda", dtype=BF16)
    q, k, v = (torch.randn(1, 4, 128, 64, device="cuda", dtype=BF16, requires_grad=True) for _ in range(3))
    go = torch.randn(1, 4, 128, 64, device="cuda", dtype=BF16)
    return {
        "layer_norm": (lambda: ops.layer_norm(x, (512,), w, b, 1e-6), lambda: F.layer_norm(x, (512,), w, b, 1e-6),
                       (x, w, b), g),
        "rms_norm": (lambda: ops.rms_norm(x, (512,), w, 1e-6), lambda: F.rms_norm(x, (512,), w, 1e-6), (x, w), g),
        "attention": (lambda: ops.flash_attention(q, k, v, True),
                      lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), go),
        "x * 2": (lambda: x * 2, lambda: x * 2, (x,), g),
    }


def times(fn, wrt, cotangent) -> dict[str, float]:
    def chain():
        outputs = [fn() for _ in range(8)]
        torch.autograd.grad(outputs, wrt, [cotangent] * 8)

    with torch.no_grad():
        no_grad = per_call_us(fn)
    return {"forward, no grad": no_grad, "forward, grad wanted": per_call_us(fn),
            "forward+backward": per_call_us(lambda: torch.autograd.grad(fn(), wrt, cotangent)),
            "8 forwards, one backward, per op": per_call_us(chain, calls=200) / 8}


def main() -> None:
    all_cases = cases()
    for name, (ours, theirs, wrt, cotangent) in all_cases.items():
        for who, fn in (("roofline", ours), ("torch", theirs)):
            print(name, who, {k: round(v, 1) for k, v in times(fn, wrt, cotangent).items()}, flush=True)

    launch, jit = _launch.Launch.__call__, _launch.Launch.jit   # every plan is built: stub the launches out
    _launch.Launch.__call__ = _launch.Launch.jit = lambda self, *args: None
    try:
        for name in ("layer_norm", "rms_norm", "attention"):
            ours, _, wrt, cotangent = all_cases[name]
            stubbed = per_call_us(lambda: torch.autograd.grad(ours(), wrt, cotangent))
            print(f"{name} roofline, kernels stubbed out: forward+backward {stubbed:.1f} us", flush=True)
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(2000):
                torch.autograd.grad(ours(), wrt, cotangent)
            profiler.disable()
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(14)
            print(out.getvalue(), flush=True)
    finally:
        _launch.Launch.__call__, _launch.Launch.jit = launch, jit

    for name in ("layer_norm", "attention"):
        ours, theirs, wrt, cotangent = all_cases[name]
        for who, fn in (("roofline", ours), ("torch", theirs)):
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(200):
                    torch.autograd.grad(fn(), wrt, cotangent)
                torch.cuda.synchronize()
            print(name, who)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16, max_name_column_width=60),
                  flush=True)


if __name__ == "__main__":
    main()
