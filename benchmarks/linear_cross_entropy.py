"""linear_cross_entropy against eager F.linear + F.cross_entropy, torch.compile of the same, and Liger-Kernel's
fused version: forward+backward time and the memory each holds, side by side in one run.

    python benchmarks/linear_cross_entropy.py OUT_DIR [--shape 8192 4096 128256] [--chunks 1024 2048]

Each provider computes the loss and the gradients of x and W (loss.backward(), the cotangent 1, as training does),
bf16. Checked first: its loss and gradients against fp32 math on the same bf16 inputs, each at most twice eager
bf16's error (relative RMS) plus 1e-3. Time: CUDA events around each call (its host time included), caches flushed,
median of the calls, and the speedup of roofline's over each peer by bench.compare (interleaved rounds, the sign
test's 95% interval). Memory: the peak above what was allocated before the call, the gradients included, and
beyond the gradients (what the method holds besides dx and dW, which every provider returns). The
matmuls' floor: 3 x 2 N H V flops at the bf16 rate doctor measured (or the one given by --tflops).
Writes OUT_DIR/linear_cross_entropy.{json,md}.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from roofline import bench, device, ops
from roofline.ops.linear_cross_entropy import chunk_rows_for, linear_cross_entropy_reference

try:
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
except ImportError:   # not installed here: its row says so
    liger_fused_linear_cross_entropy = None

BF16 = torch.bfloat16


def eager_upcast(x, w, t):
    """The loss as transformers' causal language models compute it: the logits upcast to fp32 first."""
    return F.cross_entropy(F.linear(x, w).float(), t)


def providers(chunks: list[int]) -> dict:
    eager = linear_cross_entropy_reference
    found = {"eager (F.linear + F.cross_entropy)": eager,
             "eager, logits upcast to fp32": eager_upcast,
             "torch.compile": torch.compile(eager)}
    if liger_fused_linear_cross_entropy is not None:
        found["liger"] = lambda x, w, t: liger_fused_linear_cross_entropy(x, w, t)
    found["roofline"] = functools.partial(ops.linear_cross_entropy, backend="triton")
    for chunk in chunks:
        found[f"roofline, chunk_rows={chunk}"] = functools.partial(ops.linear_cross_entropy, backend="triton",
                                                                   chunk_rows=chunk)
    return found


def step(fn, x, w, t):
    """One training step's worth: the loss, then loss.backward() into x.grad and w.grad."""
    x.grad = w.grad = None
    fn(x, w, t).backward()


def results_of(fn, x, w, t):
    step(fn, x, w, t)
    with torch.no_grad():
        loss = fn(x, w, t)
    return [loss.float(), x.grad.float(), w.grad.float()]


def relative_rms(a, b) -> float:
    return ((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def speedup(peer, fn, x, w, t) -> list[float]:
    """fn's speedup over peer: bench.compare's ratio and the sign test's 95% interval (interleaved rounds)."""
    c = bench.compare(functools.partial(step, peer), functools.partial(step, fn), x, w, t, rep_ms=300, rounds=10,
                      warn=False)
    return [c.speedup.ratio, c.speedup.low, c.speedup.high]


def peak_extra_bytes(fn, x, w, t) -> int:
    step(fn, x, w, t)                       # warm-up: compile and autotune outside the measurement
    x.grad = w.grad = None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn(x, w, t).backward()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--shape", type=int, nargs=3, default=[8192, 4096, 128256], metavar=("N", "H", "V"))
    parser.add_argument("--chunks", type=int, nargs="*", default=[2048], help="chunk_rows to time besides the "
                        "default")
    parser.add_argument("--tflops", type=float, default=None, help="bf16 matmul rate for the floor (default: "
                        "doctor's measured ceiling)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    n, h, v = args.shape
    torch.manual_seed(0)
    x = torch.randn(n, h, device="cuda", dtype=BF16).requires_grad_()
    w = (torch.randn(v, h, device="cuda", dtype=BF16) * h ** -0.5).requires_grad_()
    t = torch.randint(0, v, (n,), device="cuda")
    tflops, source = args.tflops, "--tflops"
    if tflops is None:
        ceilings = device.ceilings(torch.device("cuda"))
        tflops, source = ceilings.tflops(BF16), ceilings.source
    floor_ms = 3 * 2 * n * h * v / (tflops * 1e12) * 1e3
    found = providers(args.chunks)

    # fp32 math on the bf16 inputs: what every provider is held against (eager bf16's own error sets the bar)
    exact = results_of(lambda x, w, t: linear_cross_entropy_reference(x.float(), w.float(), t), x, w, t)
    rows, bar = [], None
    for name, fn in found.items():
        errors = [relative_rms(o, e) for o, e in zip(results_of(fn, x, w, t), exact)]
        bar = bar or errors   # eager's, the first provider
        ok = all(err <= 2 * b + 1e-3 for err, b in zip(errors, bar))
        rows.append(dict(provider=name, errors=errors, ok=ok))
        torch.cuda.empty_cache()
    del exact
    torch.cuda.empty_cache()

    ours = found["roofline"]
    gradient_bytes = (x.numel() + w.numel()) * 2   # dx and dW, which every provider returns
    for row in rows:
        fn = found[row["provider"]]
        peak = peak_extra_bytes(fn, x, w, t)
        row["peak_extra_gib"] = peak / 2 ** 30
        row["beyond_gradients_gib"] = (peak - gradient_bytes) / 2 ** 30
        m = bench.time(step, fn, x, w, t, rep_ms=1500, warmup_ms=300, warn=False)
        row["ms"] = m.median
        if fn is not ours:
            row["roofline_speedup"] = speedup(fn, ours, x, w, t)
        if row["provider"].startswith("roofline"):   # each chunking against the peer it must match
            row["vs_compile"] = speedup(found["torch.compile"], fn, x, w, t)
        print(row, flush=True)
        torch.cuda.empty_cache()
    summary = dict(shape=dict(N=n, H=h, V=v), dtype="bf16", device=torch.cuda.get_device_name(),
                   torch=torch.__version__, default_chunk_rows=chunk_rows_for(v, 2, n), matmul_tflops=tflops, matmul_tflops_source=source,
                   matmul_floor_ms=floor_ms, rows=rows)
    (args.out / "linear_cross_entropy.json").write_text(json.dumps(summary, indent=1))
    text = markdown(summary)
    (args.out / "linear_cross_entropy.md").write_text(text)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


def markdown(summary: dict) -> str:
    s = summary["shape"]
    lines = [f"### linear_cross_entropy {s['N']} x {s['H']} x {s['V']} bf16, forward+backward ({summary['device']})",
             "", f"The three matmuls alone: {summary['matmul_floor_ms']:.1f} ms at {summary['matmul_tflops']:.0f} "
             f"TFLOP/s ({summary['matmul_tflops_source']}). Default chunk: {summary['default_chunk_rows']} rows.", "",
             "| provider | ms | roofline's speedup (95% CI) | over torch.compile (95% CI) | peak extra GiB | "
             "beyond dx, dW GiB | error loss / dx / dW (rel. RMS) | ok |",
             "|---|---|---|---|---|---|---|---|"]

    def cell(ratio):
        return f"{ratio[0]:.3f}x ({ratio[1]:.3f}-{ratio[2]:.3f})" if ratio else "-"

    for r in summary["rows"]:
        errors = " / ".join(f"{e:.1e}" for e in r["errors"])
        lines.append(f"| {r['provider']} | {r['ms']:.2f} | {cell(r.get('roofline_speedup'))} | "
                     f"{cell(r.get('vs_compile'))} | {r['peak_extra_gib']:.2f} | "
                     f"{r['beyond_gradients_gib']:.2f} | {errors} | "
                     f"{'ok' if r['ok'] else 'FAILS'} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
