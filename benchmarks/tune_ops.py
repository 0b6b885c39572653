"""How roofline.ops' launch settings were chosen: times the alternatives on this GPU, side by side in one run.

    python benchmarks/tune_ops.py OUT_DIR [--only norm-forward cross-entropy softmax-long attention
                                                attention-forward attention-backward]

norm-forward   the norm forward kernel over (rows per program, warps) at row lengths 256 .. 16384 (256 MB bf16),
               rms_norm and layer_norm, CUDA graphs (the kernel alone), against the current rule
norm-backward  the norm backward kernels over (column block, row groups, warps, next-row prefetch), the same way
cross-entropy  the cross_entropy forward kernel at [8192 x 128256] bf16 over its block, warps and programs per
               SM, CUDA graphs; and the whole forward+backward as eager code calls it
softmax-long   softmax's kernels for rows longer than a block (read twice) over programs per SM and warps, at
               row lengths 32768, 65536 and 262144 (256 MB bf16), CUDA graphs
attention      flash_attention's tiles (rows held, rows walked, warps, pipeline stages) for each of its kernels
               (forward, dK/dV, dQ), one kernel's varied at a time with the others at their current tiles, at
               B4 H32 N4096 bf16, head_dim 64 and 128, causal and not, CUDA graphs; the Hopper forward's
               variants (attention_sm90.py: MMA partitions, in turns, ring slots) and SDPA's flash and cuDNN
               backends beside them
attention-forward  the same without the tile candidates: the current tiled forward, the Hopper forward's variants
               and SDPA's backends
attention-backward  the current tiled backward, the Hopper backward (attention_sm90.py) with two and three ring
               slots, and SDPA's backends; each backward's largest difference from the tiled one's gradients
(The host's time per call is benchmarks/host_overhead.py's.)

Writes OUT_DIR/tune.md and OUT_DIR/tune.json.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import sys
from dataclasses import astuple
from pathlib import Path

import torch
import torch.nn.functional as F

import triton

from roofline import bench, ops
from roofline.ops._launch import clear_plans

norm = importlib.import_module("roofline.ops.norm")
ce = importlib.import_module("roofline.ops.cross_entropy")
sm = importlib.import_module("roofline.ops.softmax")
att = importlib.import_module("roofline.ops.attention")
hopper = importlib.import_module("roofline.ops.attention_sm90")

BF16 = torch.bfloat16


@contextlib.contextmanager
def patched(module, **values):
    old = {k: getattr(module, k) for k in values}
    for k, v in values.items():
        setattr(module, k, v)
    clear_plans()   # plans hold the settings they were built with
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(module, k, v)
        clear_plans()


def _graph_us(fn, *args) -> float:
    return bench.time(fn, *args, cuda_graph=True, warn=False).median * 1e3


def norm_forward(lengths) -> list[dict]:
    out = []
    elements = 128 << 20   # 256 MB of bf16
    for n in lengths:
        rows = elements // n
        x = torch.randn(rows, n, device="cuda", dtype=BF16)
        w = torch.randn(n, device="cuda", dtype=BF16)
        b = torch.randn(n, device="cuda", dtype=BF16)
        current = norm.forward_config(rows, n)
        configs = {current}
        for block in {min(triton.next_power_of_2(n), largest) for largest in (8192, 16384)}:
            for per_program in (1, 2, 4, 8, 16):
                if per_program > 1 and (n > block or block * per_program > 8192):
                    continue
                tile = block * per_program
                for warps in (2, 4, 8, 16, 32):
                    if 8 <= tile // (32 * warps) <= 64:   # 8 (one 16-byte access) to 64 elements a thread
                        configs.add((block, per_program, warps))
        for rms in (True, False):
            for config in sorted(configs):
                with patched(norm, forward_config=lambda rows, n, c=config: c):
                    us = _graph_us(norm._forward, x, None, w, None if rms else b, 1e-6, rms)
                out.append(dict(op="rms_norm" if rms else "layer_norm", n=n, block=config[0],
                                rows_per_program=config[1], warps=config[2], us=us, current=config == current,
                                gbps=2 * x.numel() * 2 / us / 1e3))
                print(out[-1], flush=True)
        del x
    return out


def norm_backward(lengths) -> list[dict]:
    out = []
    elements = 128 << 20   # 256 MB of bf16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for n in lengths:
        rows = elements // n
        x = torch.randn(rows, n, device="cuda", dtype=BF16)
        dy = torch.randn_like(x)
        w = torch.randn(n, device="cuda", dtype=BF16)
        configs = {norm.backward_config(rows, n, rms, x.device) for rms in (True, False)}
        for largest in (8192, 16384):
            block = min(triton.next_power_of_2(n), largest)
            for per_sm in (2, 4, 8):
                groups = max(1, min(rows, per_sm * sms // triton.cdiv(n, block)))
                for warps in (8, 16, 32):
                    if 4 <= block // (32 * warps) <= 32:
                        configs.add((block, groups, warps))
        for rms in (True, False):
            _, _, mean, rstd = norm._forward(x, None, w, None, 1e-6, rms)
            current = norm.backward_config(rows, n, rms, x.device)
            for config in sorted(configs):
                current_prefetch = config[0] <= norm.BACKWARD_PREFETCH_BLOCK
                for prefetch in (False, True):
                    largest = config[0] if prefetch else 0   # the largest block that prefetches
                    with patched(norm, backward_config=lambda *args, c=config: c, BACKWARD_PREFETCH_BLOCK=largest):
                        us = _graph_us(norm._backward, dy, x, w, mean, rstd, None, rms, not rms)
                    out.append(dict(op="rms_norm" if rms else "layer_norm", n=n, block=config[0], groups=config[1],
                                    warps=config[2], prefetch=prefetch, us=us,
                                    current=config == current and prefetch == current_prefetch,
                                    gbps=3 * x.numel() * 2 / us / 1e3))
                    print(out[-1], flush=True)
        del x, dy
    return out


def cross_entropy() -> list[dict]:
    out = []
    rows, vocab = 8192, 128256
    logits = torch.randn(rows, vocab, device="cuda", dtype=BF16) * 2
    target = torch.randint(0, vocab, (rows,), device="cuda")
    current = (ce.BLOCK, ce.NUM_WARPS, ce.PROGRAMS_PER_SM)
    for block in (4096, 8192, 16384):
        for warps in (8, 16, 32):
            for per_sm in (1, 2):
                if not 8 <= block // (32 * warps) <= 32 or per_sm * warps > 64:
                    continue
                with patched(ce, BLOCK=block, NUM_WARPS=warps, PROGRAMS_PER_SM=per_sm):
                    us = _graph_us(ce._forward, logits, target, -100, "mean", 0.0, True, False)
                out.append(dict(block=block, warps=warps, per_sm=per_sm, us=us,
                                current=(block, warps, per_sm) == current))
                print(out[-1], flush=True)
    logits.requires_grad_()

    def fwd_bwd(check):
        ops.cross_entropy(logits, target, backend="triton", check_targets=check).backward()
        logits.grad = None

    for check in (True, False):
        m = bench.time(fwd_bwd, check, warn=False)
        out.append(dict(what=f"fwd+bwd as eager code calls it (CUDA events), check_targets={check}",
                        us=m.median * 1e3, host_us=(m.host_ms_per_call or 0) * 1e3))
        print(out[-1], flush=True)
    return out


def softmax_long(lengths=(32768, 65536, 262144)) -> list[dict]:
    """softmax's long-row kernels (rows read twice) over resident programs per SM and warps, 256 MB bf16."""
    out = []
    current = (sm.LONG_ROW_PROGRAMS_PER_SM, sm.LONG_ROW_WARPS)
    for n in lengths:
        x = torch.randn((128 << 20) // n, n, device="cuda", dtype=BF16)
        y = sm._forward_rows(x, False)
        dy = torch.randn_like(x)
        for per_sm in (1, 2, 4):
            for warps in (8, 16, 32):
                if per_sm * warps > 64:
                    continue
                with patched(sm, LONG_ROW_PROGRAMS_PER_SM=per_sm, LONG_ROW_WARPS=warps):
                    fwd = _graph_us(sm._forward_rows, x, False)
                    bwd = _graph_us(sm._backward_rows, y, dy, False)
                out.append(dict(n=n, per_sm=per_sm, warps=warps, fwd_us=fwd, bwd_us=bwd,
                                fwd_gbps=2 * x.numel() * 2 / fwd / 1e3, bwd_gbps=3 * x.numel() * 2 / bwd / 1e3,
                                current=(per_sm, warps) == current))
                print(out[-1], flush=True)
        del x, y, dy
    return out


def _tiles(*specs):
    """Tiles for each (held, walked, warps, stages), expanding a tuple in any place into each of its values."""
    out = []
    for spec in specs:
        grid = [()]
        for field in spec:
            grid = [g + (value,) for g in grid for value in (field if isinstance(field, tuple) else (field,))]
        out += [att.Tiles(*g) for g in grid]
    return out


# Around what FlashAttention-2 kernels use on Hopper: a 64- or 128-row block held, 32 to 128 rows a step.
BACKWARD_CANDIDATES = _tiles((64, 32, (4, 8), 2), (64, 64, 4, (2, 3)), (64, 64, 8, 2), (128, 32, 8, (2, 3)),
                             (128, 64, 8, (2, 3)), (64, 128, 8, 2))
ATTENTION_CANDIDATES = {
    "forward": _tiles((64, 64, 4, (2, 3, 4)), (64, 128, 4, (2, 3)), (128, 32, 4, 3), (128, 64, (4, 8), (3, 4)),
                      (128, 128, 8, (2, 3))),
    "dkdv": BACKWARD_CANDIDATES,
    "dq": BACKWARD_CANDIDATES,
}


def _attention_row(row: dict, call, work: float, current, inputs, sm90=None, **settings) -> dict:
    """row with the time of call() under attention.py's settings patched (and attention_sm90.py's: `sm90`), and
    the largest difference of its result (O for a forward, dQ, dK and dV for a backward) from the current
    settings' (a fast candidate must still be right); a candidate that does not compile or fit (shared memory,
    registers) is a result too."""
    try:
        with patched(att, **settings), patched(hopper, **(sm90 or {})):
            row["us"] = _graph_us(call)
            if row["kernel"] in ("forward", "backward"):
                ours = call() if row["kernel"] == "backward" else att._forward(*inputs)[:1]
                row["max_diff"] = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, current))
        row["tflops"] = work / row["us"] / 1e6
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
    print(row, flush=True)
    return row


# The Hopper forward's settings (MMA partitions, in turns, slots beyond the default ring, O rescaled under S)
SM90_VARIANTS = [(1, False, 0, False), (2, False, 0, False), (2, True, 0, False), (2, False, 1, False),
                 (2, True, 1, False), (2, False, 0, True), (2, True, 0, True)]


# The Hopper backward's slots in its ring (more fit at head dim 128 only just: 227 KiB a block)
SM90_BACKWARD_STAGES = [2, 3]


def attention(head_dims, candidates=ATTENTION_CANDIDATES, hopper_kernels=("forward",)) -> list[dict]:
    # the tiled kernels wherever a row does not say otherwise: by default flash_attention takes the Hopper ones at
    # this length and head dim 128
    with patched(att, SM90_ATTENTION=False):
        return _attention(head_dims, candidates, hopper_kernels)


def _attention(head_dims, candidates, hopper_kernels) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = []
    batch, heads, n = 4, 32, 4096
    for d in head_dims:
        q, k, v = (torch.randn(batch, heads, n, d, device="cuda", dtype=BF16) for _ in range(3))
        do = torch.randn_like(q)
        scale = d ** -0.5
        for causal in (False, True):
            flops = 4 * batch * heads * n * n * d * (0.5 if causal else 1.0)
            o, lse = att._forward(q, k, v, causal, scale)
            backward = (lambda: att._backward(do, q, k, v, o, lse, causal, scale), 2.5 * flops)
            calls = {"forward": (lambda: att._forward(q, k, v, causal, scale), flops), "dkdv": backward, "dq": backward}
            for kernel, tried in candidates.items():
                current = att.TILES[kernel][d]
                call, work = calls[kernel]
                for tiles in [current] + [t for t in tried if t != current]:
                    row = dict(kernel=kernel, d=d, causal=causal, tiles=list(astuple(tiles)), current=tiles == current,
                               timed="backward (delta, dK/dV, dQ)" if kernel != "forward" else "forward")
                    out.append(_attention_row(row, call, work, (o, ), (q, k, v, causal, scale),
                                              TILES={**att.TILES, kernel: {**att.TILES[kernel], d: tiles}}))
            tried = hopper_kernels if hopper.supports(q, k, scale) else ()
            grads = backward[0]() if "backward" in tried else None
            for stages in SM90_BACKWARD_STAGES if "backward" in tried else ():   # Gluon's, against the tiled one
                tiles = ["sm90 backward", hopper.BWD_BLOCK_M, hopper.BWD_BLOCK_N,
                         hopper.LOAD_WARPS + hopper.MMA_WARPS, stages]
                row = dict(kernel="backward", d=d, causal=causal, tiles=tiles, current=False,
                           timed="backward (per-query values, delta, dK/dV/dQ, dQ rounded)")
                out.append(_attention_row(row, *backward, grads, (q, k, v, causal, scale), SM90_ATTENTION=True,
                                          sm90={"BWD_STAGES": {**hopper.BWD_STAGES, d: stages},
                                                "ROUTED_HEAD_DIMS": hopper.HEAD_DIMS}))
            for parts, turns, more, early in SM90_VARIANTS if "forward" in tried else ():   # Gluon's
                stages = {head_d: n + more for head_d, n in hopper.STAGES.items()}
                name = (f"sm90 ({parts} MMA partition{'s' if parts > 1 else ''}{', in turns' if turns else ''}"
                        f"{', O rescaled under S' if early else ''})")
                tiles = [name, hopper.BLOCK_M, hopper.BLOCK_N, hopper.LOAD_WARPS + hopper.MMA_WARPS, stages[d]]
                row = dict(kernel="forward", d=d, causal=causal, tiles=tiles, current=False, timed="forward")
                out.append(_attention_row(row, *calls["forward"], (o, ), (q, k, v, causal, scale), SM90_ATTENTION=True,
                                          sm90={"MMA_PARTS": parts, "PINGPONG": turns, "STAGES": stages,
                                                "RESCALE_UNDER_S": early, "ROUTED_HEAD_DIMS": hopper.HEAD_DIMS}))
            for name, backend in (("sdpa flash", SDPBackend.FLASH_ATTENTION),
                                  ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION)):
                leaves = [t.detach().requires_grad_() for t in (q, k, v)]

                def forward(leaves=leaves, backend=backend):
                    with sdpa_kernel(backend):
                        return F.scaled_dot_product_attention(*leaves, is_causal=causal)

                def backward(leaves=leaves):
                    torch.autograd.grad(forward(leaves), leaves, do)

                with torch.no_grad():
                    fwd = _graph_us(forward)
                fwd_bwd = _graph_us(backward)
                out.append(dict(kernel=name, d=d, causal=causal, fwd_us=fwd, fwd_tflops=flops / fwd / 1e6,
                                bwd_us=fwd_bwd - fwd, bwd_tflops=2.5 * flops / (fwd_bwd - fwd) / 1e6))
                print(out[-1], flush=True)
        del q, k, v, do
    return out


def markdown(results: dict) -> str:
    lines = []
    for part, title, column, key in (
            ("norm-forward", "norm forward kernel (CUDA graphs, 256 MB bf16): us by rows per program and warps",
             "rows / program", "rows_per_program"),
            ("norm-backward", "norm backward kernels (CUDA graphs, 256 MB bf16 x and dy; layer_norm with a bias; "
             "prefetch: the next row's loads issued before this row is reduced)", "row groups", "groups")):
        if part not in results:
            continue
        lines += [f"### {title}", "", f"| op | row length | block | {column} | warps | prefetch | us | GB/s | "
                  "current rule |", "|---|---|---|---|---|---|---|---|---|"]
        for r in results[part]:
            lines.append(f"| {r['op']} | {r['n']} | {r['block']} | {r[key]} | {r['warps']} | "
                         f"{'yes' if r.get('prefetch') else ''} | {r['us']:.1f} | {r['gbps']:,.0f} | "
                         f"{'yes' if r['current'] else ''} |")
        lines.append("")
    if "cross-entropy" in results:
        lines += ["### cross_entropy [8192 x 128256] bf16 forward kernel (CUDA graphs)", "",
                  "| block | warps | programs / SM | us | current |", "|---|---|---|---|---|"]
        for r in results["cross-entropy"]:
            if "what" not in r:
                lines.append(f"| {r['block']} | {r['warps']} | {r['per_sm']} | {r['us']:.1f} | "
                             f"{'yes' if r['current'] else ''} |")
        lines += [""] + [f"- {r['what']}: {r['us']:.1f} us (host {r['host_us']:.1f} us)"
                         for r in results["cross-entropy"] if "what" in r] + [""]
    if "softmax-long" in results:
        lines += ["### softmax's long-row kernels (CUDA graphs, 256 MB bf16; rows read twice)", "",
                  "| row length | programs / SM | warps | fwd us | fwd GB/s | bwd us | bwd GB/s | current |",
                  "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['n']} | {r['per_sm']} | {r['warps']} | {r['fwd_us']:.1f} | {r['fwd_gbps']:,.0f} | "
                  f"{r['bwd_us']:.1f} | {r['bwd_gbps']:,.0f} | {'yes' if r['current'] else ''} |"
                  for r in results["softmax-long"]] + [""]
    for part in ("attention", "attention-forward", "attention-backward"):
        if part not in results:
            continue
        title = {"attention": "flash_attention tiles (B4 H32 N4096 bf16, CUDA graphs): one kernel's tiles varied, "
                              "the others current; the backward timed whole (delta, dK/dV, dQ)",
                 "attention-forward": "flash_attention's forward (B4 H32 N4096 bf16, CUDA graphs): the current "
                                      "tiles, and the Hopper forward's settings",
                 "attention-backward": "flash_attention's backward (B4 H32 N4096 bf16, CUDA graphs): the current "
                                       "tiles, and the Hopper backward's ring slots"}[part]
        lines += [f"### {title}", "",
                  "| kernel | head_dim | causal | held, walked, warps, stages | us | TFLOP/s | max abs difference from "
                  "the current | current |", "|---|---|---|---|---|---|---|---|"]
        for r in results[part]:
            if "tiles" not in r:
                continue
            timing = f"{r['us']:.1f} | {r['tflops']:.0f}" if "us" in r else f"{r['error']} | "
            diff = f"{r['max_diff']:.3g}" if "max_diff" in r else ""
            lines.append(f"| {r['kernel']} | {r['d']} | {r['causal']} | {', '.join(map(str, r['tiles']))} | "
                         f"{timing} | {diff} | {'yes' if r['current'] else ''} |")
        lines += ["", "| SDPA backend | head_dim | causal | fwd us | fwd TFLOP/s | bwd us | bwd TFLOP/s |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['kernel']} | {r['d']} | {r['causal']} | {r['fwd_us']:.1f} | {r['fwd_tflops']:.0f} | "
                  f"{r['bwd_us']:.1f} | {r['bwd_tflops']:.0f} |" for r in results[part] if "tiles" not in r]
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--only", nargs="*", default=["norm-forward", "cross-entropy"])
    parser.add_argument("--lengths", nargs="*", type=int, default=[256, 1024, 4096, 16384, 65536],
                        help="row lengths of norm-forward and norm-backward")
    parser.add_argument("--head-dims", nargs="*", type=int, default=[128, 64], help="head dims of attention")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results = {}
    for part in args.only:
        print(f"=== {part}", flush=True)
        results[part] = {"norm-forward": lambda: norm_forward(args.lengths),
                         "norm-backward": lambda: norm_backward(args.lengths), "cross-entropy": cross_entropy,
                         "softmax-long": softmax_long, "attention": lambda: attention(args.head_dims),
                         # the current tiled forward, the Hopper forward's variants and SDPA's backends only
                         "attention-forward": lambda: attention(args.head_dims, {"forward": []}),
                         # the current tiled backward, the Hopper backward's ring slots and SDPA's backends only
                         "attention-backward": lambda: attention(args.head_dims, {"dkdv": []}, ("backward", ))}[part]()
        (args.out / "tune.json").write_text(json.dumps(results, indent=1))
        (args.out / "tune.md").write_text(markdown(results))
    print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
