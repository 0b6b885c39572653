"""Host time per eager call with Triton's generated launcher against roofline's own C++ launch
(ROOFLINE_NATIVE_LAUNCH, roofline/ops/_launch.py), in one process: the two modes alternate round by round (the
plans rebuilt at each switch), torch's op beside them. Tiny shapes, so that every microsecond is the host's.

    python benchmarks/launch_ab.py          (a CUDA GPU)
"""
import statistics

import torch
import torch.nn.functional as F
from host_overhead import _per_call_us

from roofline import ops
from roofline.ops import _launch

ROUNDS, CALLS = 7, 1000


def cases() -> dict:
    bf = torch.bfloat16
    x = torch.randn(8, 512, device="cuda", dtype=bf)
    w = torch.randn(512, device="cuda", dtype=bf)
    g, u = torch.randn(8, 512, device="cuda", dtype=bf), torch.randn(8, 512, device="cuda", dtype=bf)
    t = torch.randint(0, 512, (8,), device="cuda")
    xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
    return {
        "softmax": (lambda: ops.softmax(x, -1), lambda: F.softmax(x, -1)),
        "gelu": (lambda: ops.gelu(x, "tanh"), lambda: F.gelu(x, approximate="tanh")),
        "rms_norm": (lambda: ops.rms_norm(x, (512,), w, 1e-5), lambda: F.rms_norm(x, (512,), w, 1e-5)),
        "swiglu": (lambda: ops.swiglu(g, u), lambda: F.silu(g) * u),
        "cross_entropy": (lambda: ops.cross_entropy(x, t), lambda: F.cross_entropy(x, t)),
        "rms_norm fwd+bwd": (lambda: ops.rms_norm(xg, (512,), wg, 1e-5).sum().backward(),
                             lambda: F.rms_norm(xg, (512,), wg, 1e-5).sum().backward()),
        "gelu fwd+bwd": (lambda: ops.gelu(xg, "tanh").sum().backward(),
                         lambda: F.gelu(xg, approximate="tanh").sum().backward()),
    }


def main() -> None:
    print(f"{'op':18s} {'triton launcher':>16s} {'C++ launch':>11s} {'torch':>8s}   us a call, median of {ROUNDS} rounds")
    for name, (ours, theirs) in cases().items():
        samples = {"triton": [], "native": [], "torch": []}
        for round_ in range(ROUNDS):
            for mode in ("triton", "native", "torch") if round_ % 2 else ("native", "triton", "torch"):
                if mode != "torch":
                    _launch.NATIVE_LAUNCH = mode == "native"
                    _launch.clear_plans()
                    for _ in range(20):
                        ours()
                samples[mode].append(_per_call_us(ours if mode != "torch" else theirs, CALLS))
        m = {mode: statistics.median(s) for mode, s in samples.items()}
        print(f"{name:18s} {m['triton']:16.2f} {m['native']:11.2f} {m['torch']:8.2f}")


if __name__ == "__main__":
    main()
