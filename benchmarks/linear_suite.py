"""roofline.ops.linear and int8_linear against cuBLAS, torch.compile and torchao, side by side in one run.

    python benchmarks/linear_suite.py OUT_DIR [--quick] [--only gemm epilogue int8 ladder]

gemm, epilogue and int8 in bf16, timed under CUDA graphs (the kernels alone; L2 flushed before each call),
outputs checked against the baseline before timing:
  gemm      linear without epilogue against F.linear (cuBLAS): 8192^3, and M in {1, 16, 128, 2048, 8192} over
            (N, K) in {(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)}
  epilogue  y = gelu(x W^T + b): linear(x, W, b, "gelu") against cuBLAS then eager bias+GeLU (F.gelu(F.linear()))
            and torch.compile of that expression; M in {2048, 8192}, (N, K) = (14336, 4096) and 8192^3
  int8      int8_linear (per channel, and per group of 128) against bf16 F.linear and torchao's int8 weight-only
            under torch.compile (where torchao imports; its failure is reported otherwise): M in {1, 16}, (N, K) in
            {(4096, 4096), (14336, 4096)}; and the SQNR of each against the bf16 layer
  ladder    the CUDA C++ matmul ladder (ops.matmul_ladder: naive, coalesced, shared_memory, register_tiled,
            vectorized), fp32 4096^3, against cuBLAS's fp32 matmul (tf32 off): TFLOP/s, % of cuBLAS and what each
            step bought
Writes OUT_DIR/linear.md (summary and every sweep) and OUT_DIR/linear.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from roofline import bench, ops
from roofline.bench import report
from roofline.ops import cuda as cuda_kernels
from roofline.ops.matmul_ladder import STEPS as LADDER_STEPS

BF16 = torch.bfloat16
OURS = "roofline (triton)"
OURS_GROUPED = "roofline (triton), groups of 128"
CUBLAS_FP32 = "cuBLAS fp32 (torch.mm)"
INT8_GROUP = 128
LLM_NK = [(4096, 4096), (14336, 4096), (4096, 14336), (128256, 4096)]


def _label(shape) -> str:
    return "x".join(map(str, shape))


def _sweep(name, shapes, providers, baseline, inputs, flops=None, bytes_=None, rtol=0.02, atol=0.02):
    by_x = {_label(s): s for s in shapes}
    return bench.Sweep(name=name, x_name="M x N x K", x_values=list(by_x), baseline=baseline,
                       inputs=lambda x, dev: inputs(*by_x[x], dev), providers=providers,
                       flops=flops, bytes=bytes_, rtol=rtol, atol=atol, description=name)


def _dense(m, n, k, dev, bias=False):
    x = torch.randn(m, k, device=dev, dtype=BF16)
    w = torch.randn(n, k, device=dev, dtype=BF16) / k ** 0.5
    return (x, w, torch.randn(n, device=dev, dtype=BF16)) if bias else (x, w)


def _gemm_flops(label, x, w, *rest):
    return 2 * x.shape[0] * w.shape[0] * x.shape[1]


def gemm_sweep(quick: bool) -> bench.Sweep:
    shapes = [(512, 512, 512)] if quick else [(8192, 8192, 8192)] + [(m, n, k) for m in (1, 16, 128, 2048, 8192)
                                                                     for n, k in LLM_NK]
    providers = [bench.Provider("cuBLAS (F.linear)", F.linear),
                 bench.Provider(OURS, lambda x, w: ops.linear(x, w, backend="triton"))]
    return _sweep("gemm bf16", shapes, providers, "cuBLAS (F.linear)", _dense, flops=_gemm_flops)


def epilogue_sweep(quick: bool) -> bench.Sweep:
    shapes = [(512, 512, 512)] if quick else [(2048, 14336, 4096), (8192, 14336, 4096), (8192, 8192, 8192)]
    eager = lambda x, w, b: F.gelu(F.linear(x, w, b))   # noqa: E731
    providers = [bench.Provider("cuBLAS + eager bias+gelu", eager),
                 bench.Provider("torch.compile", torch.compile(eager)),
                 bench.Provider(OURS, lambda x, w, b: ops.linear(x, w, b, "gelu", backend="triton"))]
    return _sweep("linear + bias + gelu bf16", shapes, providers, "cuBLAS + eager bias+gelu",
                  lambda m, n, k, dev: _dense(m, n, k, dev, bias=True), flops=_gemm_flops)


def _torchao_int8():
    """A provider running torchao's int8 weight-only linear under torch.compile, or the reason it cannot."""
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as e:   # noqa: BLE001 - any import failure is the result to report
        return None, f"torchao does not import: {type(e).__name__}: {e}"
    made = {}   # the weight tensor (held, so that its id is not reused) and its quantized, compiled layer

    def run(x, w, *quantized):
        if made.get("weight") is not w:   # quantized and compiled once per weight, in the warm-up
            layer = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
            layer.weight.data.copy_(w)
            quantize_(layer, Int8WeightOnlyConfig())
            made.update(weight=w, layer=torch.compile(layer, mode="max-autotune-no-cudagraphs"))
        return made["layer"](x)

    return run, None


def int8_sweep(quick: bool) -> bench.Sweep:
    shapes = [(1, 512, 512)] if quick else [(m, n, k) for m in (1, 16) for n, k in LLM_NK[:2]]

    def inputs(m, n, k, dev):
        x, w = _dense(m, n, k, dev)
        return (x, w, *ops.quantize_int8(w), *ops.quantize_int8(w, INT8_GROUP))

    torchao, why_not = _torchao_int8()
    providers = [bench.Provider("bf16 F.linear (cuBLAS)", lambda x, w, *q: F.linear(x, w)),
                 bench.Provider("torchao int8 weight-only + compile", torchao or (lambda *a: None), skip=why_not),
                 bench.Provider(OURS, lambda x, w, q, s, *g: ops.int8_linear(x, q, s, backend="triton")),
                 bench.Provider(OURS_GROUPED,
                                lambda x, w, q, s, qg, sg: ops.int8_linear(x, qg, sg, backend="triton"))]
    # the least traffic of the int8 kernel: the int8 weight, once (x and y are a few KB)
    return _sweep("int8 weight-only linear, decode", shapes, providers, "bf16 F.linear (cuBLAS)", inputs,
                  bytes_=lambda label, x, w, q, s, *g: q.numel() + s.numel() * 4, rtol=0.05, atol=0.1)


def int8_sqnr_lines(quick: bool) -> list[str]:
    """Signal-to-quantization-noise of int8_linear against the bf16 layer, at a language model's layer size,
    per channel and per group, on Gaussian and on heavy-tailed (Laplace) weights."""
    n = k = 512 if quick else 4096
    x = torch.randn(16, k, device="cuda", dtype=BF16)
    weights = {"Gaussian": torch.randn(n, k, device="cuda") * 0.02,
               "Laplace": torch.distributions.Laplace(0.0, 0.02).sample((n, k)).cuda()}
    lines = [f"SQNR of int8_linear against the bf16 layer (x 16x{k}, W {n}x{k}; the issue asks >= 40 dB):", "",
             "| weights | per channel | groups of 128 |", "|---|---|---|"]
    for name, w in weights.items():
        exact = F.linear(x, w.to(BF16)).double()
        cells = []
        for group in (None, INT8_GROUP):
            y = ops.int8_linear(x, *ops.quantize_int8(w, group), backend="triton").double()
            cells.append(f"{10 * torch.log10(exact.square().sum() / (y - exact).square().sum()).item():.1f} dB")
        lines.append(f"| {name} | {' | '.join(cells)} |")
    return lines


def ladder_sweep(quick: bool) -> bench.Sweep:
    size = 256 if quick else 4096
    torch.backends.cuda.matmul.allow_tf32 = False   # cuBLAS on the same fp32 CUDA cores as the ladder
    if cuda_kernels.unavailable_reason() is None:   # build the extension (a minute of nvcc) before any timing
        ops.matmul_ladder(torch.ones(1, 1, device="cuda"), torch.ones(1, 1, device="cuda"))

    def step(name):
        return bench.Provider(name, lambda a, b: ops.matmul_ladder(a, b, name))

    providers = [bench.Provider(CUBLAS_FP32, torch.mm)] + [step(name) for name in LADDER_STEPS]
    return _sweep("matmul ladder fp32", [(size, size, size)], providers, CUBLAS_FP32,
                  lambda m, n, k, dev: (torch.randn(m, k, device=dev), torch.randn(k, n, device=dev)),
                  flops=lambda label, a, b: 2 * a.shape[0] * a.shape[1] * b.shape[1], rtol=1e-4, atol=1e-3)


def ladder_lines(result) -> list[str]:
    """The ladder as a reader wants it: each step's TFLOP/s, its fraction of cuBLAS, and what it bought."""
    rows = {r.provider: r for r in result.rows if r.status == "ok"}
    cublas = rows.get(CUBLAS_FP32)
    lines = ["| step | median | TFLOP/s | % of cuBLAS fp32 | speed-up over the step before |", "|---|---|---|---|---|"]
    before = None
    for name in LADDER_STEPS:
        r = rows.get(name)
        if r is None or cublas is None:
            lines.append(f"| {name} | not measured | | | |")
            continue
        gain = f"{before.median_ms / r.median_ms:.1f}x" if before else ""
        lines.append(f"| {name} | {r.median_ms:.3f} ms | {r.tflops:.2f} | "
                     f"{100 * cublas.median_ms / r.median_ms:.1f} | {gain} |")
        before = r
    if cublas is not None:
        lines.append(f"| cuBLAS (torch.mm, tf32 off) | {cublas.median_ms:.3f} ms | {cublas.tflops:.2f} | 100 | |")
    return lines


def summary_lines(results) -> list[str]:
    lines = ["| sweep | M x N x K | ours (ms) | ours TFLOP/s | peer | peer (ms) | ours / peer (below 1: ours faster) |",
             "|---|---|---|---|---|---|---|"]
    for result in results:
        for x in dict.fromkeys(r.x for r in result.rows):
            rows = {r.provider: r for r in result.rows if r.x == x and r.status == "ok"}
            ours = rows.get(OURS)
            for peer, r in rows.items():
                if peer in (OURS, OURS_GROUPED) or ours is None:
                    continue
                tflops = f"{ours.tflops:,.0f}" if ours.tflops else ""
                lines.append(f"| {result.name} | {x} | {ours.median_ms:.4f} | {tflops} | {peer} | {r.median_ms:.4f} | "
                             f"{ours.median_ms / r.median_ms:.3f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="small shapes, for a smoke test")
    parser.add_argument("--only", nargs="*", default=["gemm", "epilogue", "int8", "ladder"], help="parts to run")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results, sections = [], []
    parts = dict(gemm=gemm_sweep, epilogue=epilogue_sweep, int8=int8_sweep, ladder=ladder_sweep)
    for part in args.only:
        sweep = parts[part](args.quick)
        result = sweep.run(rounds=3, progress=False, cuda_graph=True)
        results.append(result)
        table = report.to_markdown(result)
        if part == "ladder":
            table = "\n".join(ladder_lines(result)) + "\n\n" + table
        if part == "int8":
            table = "\n".join(int8_sqnr_lines(args.quick)) + "\n\n" + table
        sections.append(f"### {sweep.name}\n\n{table}")
        print(sections[-1], flush=True)
        report.write_json(result, args.out / f"{part}.json", samples=False)
        text = "\n".join(["### Ours against each peer", "", *summary_lines(results), "", *sections])
        (args.out / "linear.md").write_text(text)   # after each part: a run cut short keeps what it measured
    (args.out / "linear.json").write_text(json.dumps(
        {part: json.loads((args.out / f"{part}.json").read_text()) for part in args.only}, indent=1))
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
