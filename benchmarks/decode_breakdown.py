"""Where a decode step's GPU time goes under CUDA graphs: the Llama-style model of benchmarks/models.py at batch 1,
bf16 against int8 weight-only, with and without roofline.patch, its kernels grouped as matmul, attention and the
rest. It says how far int8 weights alone can take a decode step: the rest does not shrink with the weights.

    python benchmarks/decode_breakdown.py OUT_DIR [--modes bf16 int8 bf16+patch int8+patch] [--tokens 50]

Per mode: ms a token by CUDA events over `tokens` graph replays (after 20 to warm up), then torch.profiler's kernel
times over 20 more, per token: each group's time and kernel count, the matmuls' weight bytes over their time
(GB/s), and the idle time between kernels (events minus kernels). From bf16 and int8 it derives the bound: bf16's
time over int8's time without its matmuls (the speedup int8 weights would give if their matmuls took no time),
and the rate int8's matmuls would need for a given speedup (--target, default issue 16's 1.6x).
Writes OUT_DIR/decode_breakdown.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

MATMUL = ("nvjet", "gemv", "gemm", "cutlass", "splitkreduce", "int8_")   # cuBLAS's kernels and roofline's int8 ones
ATTENTION = ("sdpa", "flash", "fmha", "attention")
MODES = ("bf16", "int8", "bf16+patch", "int8+patch")
PROMPT, WARMUP, PROFILED = 64, 20, 20


def group_of(kernel: str) -> str:
    name = kernel.lower()
    if any(s in name for s in MATMUL):
        return "matmul"
    if any(s in name for s in ATTENTION):
        return "attention"
    return "other"


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of the weights the matmuls read: every nn.Linear's, every Int8Linear's int8 weights and scales."""
    from roofline.nn import Int8Linear

    total = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
        elif isinstance(module, Int8Linear):
            total += module.weight_int8.numel() + module.scale.numel() * module.scale.element_size()
    return total


def bound(bf16: dict, int8: dict, target: float) -> dict:
    """What int8 weights alone can give: bf16's time over int8's without its matmuls, and the matmul rate (GB/s of
    int8 weights) that `target` times bf16's speed needs, given int8's other kernels and idle time."""
    rest = int8["ms"] - int8["groups"]["matmul"]["ms"]
    budget = bf16["ms"] / target - rest
    return dict(most=bf16["ms"] / rest, target=target,
                matmul_ms_needed=budget, matmul_gbs_needed=int8["weight_bytes"] / budget / 1e6 if budget > 0 else None)


def measure(mode: str, tokens: int) -> dict:
    import models as bm   # benchmarks/models.py

    import roofline
    from roofline.decoding import Steps
    from torch.profiler import ProfilerActivity, profile

    model = bm.build("llama", False, torch.device("cuda")).to(torch.bfloat16).eval()
    if "int8" in mode:
        roofline.quantize_int8_weight_only(model)
    if "patch" in mode:
        roofline.patch(model)
    with torch.inference_mode():
        model.setup_cache(1, PROMPT + WARMUP + tokens + PROFILED + 1, torch.bfloat16)
        steps = Steps(model, 1, graphs=True)
        token = steps.prefill(torch.randint(0, model.config.vocab_size, (1, PROMPT), device="cuda"))
        position = PROMPT

        def run(n):
            nonlocal token, position
            for _ in range(n):
                token = steps(token, position).clone()
                position += 1
        run(WARMUP)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        run(tokens)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / tokens
        with profile(activities=[ProfilerActivity.CUDA]) as p:
            run(PROFILED)
            torch.cuda.synchronize()
    groups, top = {}, {}
    for e in p.events():
        if e.device_type.name != "CUDA":
            continue
        us = (e.time_range.end - e.time_range.start) / PROFILED
        g = groups.setdefault(group_of(e.name), dict(ms=0.0, kernels=0.0))
        g["ms"] += us / 1e3
        g["kernels"] += 1 / PROFILED
        top[e.name[:70]] = top.get(e.name[:70], 0.0) + us / 1e3
    busy = sum(g["ms"] for g in groups.values())
    wbytes = weight_bytes(model)
    matmul = groups.get("matmul", dict(ms=0.0, kernels=0))
    return dict(mode=mode, ms=ms, groups=groups, kernels=sum(g["kernels"] for g in groups.values()), idle_ms=ms - busy,
                weight_bytes=wbytes, matmul_gbs=wbytes / matmul["ms"] / 1e6 if matmul["ms"] else None,
                top=dict(sorted(top.items(), key=lambda kv: -kv[1])[:8]))


def markdown(rows: list[dict], limit: dict | None) -> str:
    lines = ["| mode | ms a token | matmul ms (kernels) | attention ms | other ms (kernels) | idle ms | matmul GB/s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        g = {k: r["groups"].get(k, dict(ms=0.0, kernels=0)) for k in ("matmul", "attention", "other")}
        lines.append(f"| {r['mode']} | {r['ms']:.3f} | {g['matmul']['ms']:.3f} ({g['matmul']['kernels']:.0f}) | "
                     f"{g['attention']['ms']:.3f} | {g['other']['ms']:.3f} ({g['other']['kernels']:.0f}) | "
                     f"{r['idle_ms']:.3f} | {r['matmul_gbs'] or 0:,.0f} |")
    if limit:
        needed = limit["matmul_gbs_needed"]
        lines += ["", f"int8 weights alone can give at most {limit['most']:.2f}x bf16 (their matmuls in no time). "
                  f"{limit['target']}x needs int8's matmuls in {limit['matmul_ms_needed']:.3f} ms a token"
                  + (f", {needed:,.0f} GB/s of weights." if needed else ": not reachable.")]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--tokens", type=int, default=50)
    parser.add_argument("--target", type=float, default=1.6)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for mode in args.modes:
        rows.append(measure(mode, args.tokens))
        print(json.dumps(rows[-1], indent=1), flush=True)
        torch.cuda.empty_cache()
    by_mode = {r["mode"]: r for r in rows}
    limit = bound(by_mode["bf16"], by_mode["int8"], args.target) if {"bf16", "int8"} <= by_mode.keys() else None
    (args.out / "decode_breakdown.json").write_text(json.dumps(dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, rows=rows, bound=limit), indent=1))
    text = markdown(rows, limit)
    (args.out / "decode_breakdown.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
