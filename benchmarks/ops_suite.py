"""roofline.ops against eager PyTorch, torch.compile and Liger-Kernel, measured side by side in one run.

    python benchmarks/ops_suite.py OUT_DIR [--quick] [--only NAME ...] [--parts PART ...]

Two parts, each forward and forward+backward (the backward through torch.autograd.grad, so every
provider computes the same gradients, weights' included):
  headline  one training-sized shape per op ([16384 x 4096] bf16; swiglu [16384 x 8192]; cross_entropy
            [8192 x 128256]; rope q [4, 32, 4096, 128] with 8 key heads), with the hand-written eager
            versions and CUDA C++ where they exist;
  rows      softmax, layer_norm and rms_norm over row lengths 256 .. 262144 at a fixed 256 MB input;
  attention flash_attention against SDPA's flash and cuDNN backends (TFLOP/s), CUDA events only.
Each part is timed twice: with CUDA events (a call as eager code makes it, the host's time included where the
host is slower than the GPU) and with CUDA graphs (the kernels alone).
Bytes are the least traffic (each input read once, each output written once), so GB/s over the measured
copy bandwidth is the fraction of the roofline. Writes per sweep OUT_DIR/ops/<name>.{json,md,png}, and
OUT_DIR/ops.md, OUT_DIR/ops.json with the headline table, peak memory of cross_entropy, and the rows
sweeps' worst ratio against the fastest peer. Liger-Kernel is a provider only where it imports.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from roofline import bench, ops
from roofline.bench import report
from roofline.ops import cuda
from roofline.ops.examples import EPS, EXAMPLES, randn
from roofline.ops.gelu import gelu_tanh_by_hand
from roofline.ops.norm import add_rms_norm_reference
from roofline.ops.softmax import softmax_by_hand
from roofline.ops.swiglu import swiglu_reference
from roofline.ops.traffic import PASSES, unit_inputs

try:
    from liger_kernel.transformers import functional as liger
except ImportError:  # not installed here: the Liger column says so
    liger = None

BF16 = torch.bfloat16
OURS = "roofline (triton)"
PARTS = ("headline", "headline_graphs", "rows", "rows_graphs", "attention")


# --------------------------------------------------------------------------- ops as providers

def _no_liger(name):
    return None if liger is not None else "Liger-Kernel is not installed here"


def _randn(shape, dev, grad=False, scale=1.0):
    return randn(shape, dev, BF16, grad, scale)


def _inputs(name: str):
    """The op's inputs in bf16, made as `roofline inspect OP` makes them (roofline.ops.examples)."""
    return lambda shape, dev, grad: EXAMPLES[name].inputs(shape, dev, BF16, grad)


class Op:
    """One op: how to make its inputs, its implementations, and its least traffic (roofline.ops.traffic, which
    the profiler uses too: passes over the bytes of its first input, or first two)."""

    def __init__(self, name, inputs, providers, forward=True, traffic=None,
                 cotangent=lambda args, dev: _randn(args[0].shape, dev), syncs=()):
        self.name, self.inputs, self.providers, self.forward = name, inputs, providers, forward
        traffic = traffic or name
        self.passes_fwd, self.passes_bwd = PASSES[traffic]
        self.pass_bytes = lambda args: sum(a.numel() * a.element_size() for a in args[:unit_inputs(traffic)])
        self.cotangent = cotangent
        self.syncs = syncs   # providers that wait on the host (a .item()): a CUDA graph cannot hold them


def _softmax_op():
    return Op("softmax", _inputs("softmax"), {
        "eager": lambda x: F.softmax(x, -1),
        "eager, by hand": softmax_by_hand,
        "compile": torch.compile(functools.partial(F.softmax, dim=-1)),
        "liger": (lambda x: liger.liger_softmax(x)) if liger else _no_liger,
        OURS: functools.partial(ops.softmax, backend="triton"),
        "cuda c++": functools.partial(ops.softmax, backend="cuda"),
    })


def _layer_norm_op():
    return Op("layer_norm", _inputs("layer_norm"), {
        "eager": lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS),
        "compile": torch.compile(lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS)),
        "liger": (lambda x, w, b: liger.liger_layer_norm(x, w, b, EPS)) if liger else _no_liger,
        OURS: lambda x, w, b: ops.layer_norm(x, x.shape[-1:], w, b, EPS, backend="triton"),
    })


def _rms_norm_op():
    return Op("rms_norm", _inputs("rms_norm"), {
        "eager": lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS),
        "compile": torch.compile(lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS)),
        # in_place=False: Liger's default writes dx over dy, which would change the next provider's input
        "liger": (lambda x, w: liger.liger_rms_norm(x, w, EPS, in_place=False)) if liger else _no_liger,
        OURS: lambda x, w: ops.rms_norm(x, x.shape[-1:], w, EPS, backend="triton"),
    })


def _add_rms_norm_op():
    return Op("add_rms_norm", _inputs("add_rms_norm"), {
        "eager": lambda x, r, w: add_rms_norm_reference(x, r, w, EPS),
        "compile": torch.compile(lambda x, r, w: add_rms_norm_reference(x, r, w, EPS)),
        "liger": (lambda x, r, w: liger.liger_fused_add_rms_norm(x, r, w, EPS, in_place=False)) if liger else _no_liger,
        OURS: lambda x, r, w: ops.add_rms_norm(x, r, w, EPS, backend="triton"),
    })


def _gelu_op():
    tanh = functools.partial(F.gelu, approximate="tanh")
    return Op("gelu_tanh", _inputs("gelu"), {
        "eager": tanh,
        "eager, by hand": gelu_tanh_by_hand,
        "compile": torch.compile(tanh),
        OURS: functools.partial(ops.gelu, approximate="tanh", backend="triton"),
        "cuda c++": functools.partial(ops.gelu, approximate="tanh", backend="cuda"),
    }, traffic="gelu")


def _swiglu_op():
    return Op("swiglu", _inputs("swiglu"), {
        "eager": swiglu_reference,
        "compile": torch.compile(swiglu_reference),
        OURS: functools.partial(ops.swiglu, backend="triton"),
        # last: Liger's backward writes the gradients over its inputs a and b, so every provider after it
        # would be checked on changed inputs (the timings do not depend on the values)
        "liger": (lambda a, b: liger.liger_swiglu(a, b)) if liger else _no_liger,
    })


def _cross_entropy_op():
    return Op("cross_entropy", _inputs("cross_entropy"), {
        "eager": F.cross_entropy,
        "compile": torch.compile(F.cross_entropy),
        "liger": (lambda x, t: liger.liger_cross_entropy(x, t)) if liger else _no_liger,
        OURS: functools.partial(ops.cross_entropy, backend="triton"),
        # without the eager range check of the targets, which costs a device-to-host sync
        "roofline, check_targets=False": functools.partial(ops.cross_entropy, backend="triton", check_targets=False),
    }, forward=False,   # the logits read once, their gradient written once
        cotangent=lambda args, dev: torch.ones((), device=dev),   # loss.backward(): the cotangent is 1
        syncs=("liger", OURS))   # Liger counts the targets with .item(); roofline checks their range


def _rope_op():
    from roofline.ops.rope import rope_reference

    return Op("rope", _inputs("rope"), {
        "eager": rope_reference,
        "compile": torch.compile(rope_reference),
        OURS: functools.partial(ops.rope, backend="triton"),
        # last: Liger rotates q and k in place
        "liger": (lambda q, k, cos, sin: liger.liger_rope(q, k, cos, sin)) if liger else _no_liger,
    },
        cotangent=lambda args, dev: (_randn(args[0].shape, dev), _randn(args[1].shape, dev)))


# --------------------------------------------------------------------------- sweeps

def _cuda_cpp_skip(name: str) -> str | None:
    reason = cuda.unavailable_reason()
    if reason is None:
        try:   # build once here, so its tens of seconds stay out of the timings
            cuda.load(name, (f"{name}_forward",))
        except Exception as exc:  # noqa: BLE001 - a failed build skips the provider, with its reason
            reason = f"the CUDA C++ build failed: {str(exc).splitlines()[0][:200]}"
    return reason


def _fwd_bwd(fn):
    """fn's forward and backward: the gradients of every input that requires grad, for a random cotangent."""
    def run(*args):
        *inputs, dy = args
        out = fn(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        cotangents = dy if isinstance(dy, tuple) else (dy,) * len(outs)
        wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
        return torch.autograd.grad(outs, wrt, cotangents[:len(outs)])
    return run


def _in_float64(fn):
    """fn on float64 copies of the inputs (the same requires_grad): the reference the providers are checked
    against."""
    def run(*args):
        def wide(a):
            if isinstance(a, tuple):
                return tuple(wide(t) for t in a)
            if isinstance(a, torch.Tensor) and a.is_floating_point():
                return a.detach().double().requires_grad_(a.requires_grad)
            return a
        return fn(*(wide(a) for a in args))
    return run


def sweep(op: Op, backward: bool, shapes: list[tuple[int, ...]], x_name: str, x_of=lambda s: s[-1],
          graphs: bool = False) -> bench.Sweep:
    by_x = {x_of(s): s for s in shapes}

    def inputs(x, dev):
        args = op.inputs(by_x[x], dev, backward)
        if not backward:
            return args
        return (*args, op.cotangent(args, dev))

    def nbytes(x, *args):
        return (op.passes_fwd + (op.passes_bwd if backward else 0)) * op.pass_bytes(args)

    providers = []
    for name, fn in op.providers.items():
        skip = fn(name) if fn is _no_liger else None
        if name == "cuda c++":
            skip = "forward only" if backward else _cuda_cpp_skip(op.name.removesuffix("_tanh"))
        if graphs and name in op.syncs:
            skip = "waits on the host (.item()): a CUDA graph cannot hold it"
        providers.append(bench.Provider(name, _fwd_bwd(fn) if backward and not skip else fn, skip=skip))
    # The check before timing guards against broken outputs (precision is tested against float64 in
    # tests/ops). fwd+bwd is checked against eager PyTorch run in float64, every provider, eager's bf16 run
    # too. A weight's gradient sums 10^4 to 10^6 rows whose inputs were rounded to bf16 (x + residual is, by
    # torch's definition of the op): near its zeros every bf16 implementation is off by a few percent of its
    # typical size, so atol counts in units of each gradient's root-mean-square. rope's eager reference
    # multiplies in bf16 (as Hugging Face's LLaMA does): near zero it rounds to a different bf16 value than
    # fp32 math does, by more than bf16's default atol.
    rtol, atol = (0.1, 0.05) if backward else (0.016, 0.05) if op.name == "rope" else (None, None)
    return bench.Sweep(
        name=f"{op.name} {'fwd+bwd' if backward else 'fwd'} bf16", x_name=x_name, x_values=list(by_x),
        inputs=inputs, providers=providers, baseline="eager", bytes=nbytes, rtol=rtol, atol=atol,
        reference=_in_float64(_fwd_bwd(op.providers["eager"])) if backward else None, atol_per_rms=backward,
        description=f"{op.name}, {'forward and backward' if backward else 'forward'}, bf16")


def headline_sweeps(quick: bool, graphs: bool = False) -> list[bench.Sweep]:
    rows = 2048 if quick else 16384
    plan = [(_softmax_op(), (rows, 4096)), (_layer_norm_op(), (rows, 4096)), (_rms_norm_op(), (rows, 4096)),
            (_add_rms_norm_op(), (rows, 4096)), (_gelu_op(), (rows, 4096)), (_swiglu_op(), (rows, 8192)),
            (_cross_entropy_op(), (1024 if quick else 8192, 128256)),
            (_rope_op(), (1 if quick else 4, 4096, 128))]
    out = []
    for op, shape in plan:
        for backward in (False, True):
            if backward or op.forward:
                out.append(sweep(op, backward, [shape], "shape", x_of=lambda s: "x".join(map(str, s)),
                                 graphs=graphs))
    return out


def row_sweeps(quick: bool) -> list[bench.Sweep]:
    elements = (16 << 20) if quick else (128 << 20)          # 256 MB of bf16
    lengths = [256 << (2 * i) for i in range(6)]              # 256 .. 262144
    shapes = [(elements // n, n) for n in lengths]
    return [sweep(op, backward, shapes, "row length")
            for op in (_softmax_op(), _layer_norm_op(), _rms_norm_op()) for backward in (False, True)]


ATTENTION_HEADLINE = (4, 32, 4096, 128)   # batch, heads, sequence, head_dim: the issue's shape


def _attention_providers(causal: bool, head_dims) -> dict:
    """SDPA's flash and cuDNN backends and flash_attention as it is by default (ours); on a Hopper GPU, where every
    head dim swept is one flash_attention routes to its Hopper kernels at long sequences, also flash_attention with
    its tiled kernels only (ROOFLINE_SM90_ATTENTION=0, switched call by call): both ways as eager code calls them,
    in the same turns (an eager backward runs the plan its forward was given, so the switch at the forward chooses
    both kernels)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from roofline.ops import attention

    def sdpa(backend):
        def run(q, k, v):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return run

    def flash(sm90: bool | None):
        def run(q, k, v):
            before, attention.SM90_ATTENTION = attention.SM90_ATTENTION, sm90
            try:
                return ops.flash_attention(q, k, v, causal, backend="triton")
            finally:
                attention.SM90_ATTENTION = before
        return run

    hopper = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    if hopper:
        from roofline.ops import attention_sm90

        hopper = set(head_dims) <= set(attention_sm90.ROUTED_HEAD_DIMS)
    return {"sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
            OURS: flash(None),
            **({OURS + ", tiled kernels": flash(False)} if hopper else {})}


def attention_sweeps(quick: bool) -> list[bench.Sweep]:
    """flash_attention against SDPA's FlashAttention-2 and cuDNN backends, bf16: the headline shape, causal and
    not, forward and forward+backward; and sequence lengths 512 .. 16384 at 16384 tokens (batch = 16384 / seq)
    and 2048 = heads x head_dim, head_dim 64 and 128, causal, forward; and forward+backward by sequence, 1024 ..
    8192, head_dim 128, causal. FLOPs: 4 B H Nq Nk D forward (half of it causal), 2.5 times that backward."""
    out = []

    def make(name, shapes, causal, backward, x_of):
        by_x = {x_of(s): s for s in shapes}

        def inputs(x, dev):
            b, h, n, d = by_x[x]
            qkv = tuple(_randn((b, h, n, d), dev, backward) for _ in range(3))
            return (*qkv, _randn((b, h, n, d), dev)) if backward else qkv

        def flops(x, *args):
            b, h, n, d = args[0].shape
            forward = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
            return forward * (3.5 if backward else 1.0)

        providers = [bench.Provider(p, _fwd_bwd(fn) if backward else fn)
                     for p, fn in _attention_providers(causal, {s[3] for s in shapes}).items()]
        # bf16 attention from different kernels agrees to a few bf16 ulps; gradients less closely
        rtol, atol = (0.05, 0.05) if backward else (0.02, 0.02)
        out.append(bench.Sweep(name=name, x_name="shape", x_values=list(by_x), inputs=inputs, providers=providers,
                               baseline="sdpa flash", flops=flops, rtol=rtol, atol=atol, description=name))

    headline = (1, 8, 1024, 128) if quick else ATTENTION_HEADLINE
    label = lambda s: "x".join(map(str, s))   # noqa: E731
    for causal in (False, True):
        for backward in (False, True):
            make(f"attention {'causal ' if causal else ''}{'fwd+bwd' if backward else 'fwd'} bf16", [headline],
                 causal, backward, label)
    tokens = 2048 if quick else 16384
    for d in (64, 128):
        shapes = [(max(1, tokens // n), 32 if d == 64 else 16, n, d) for n in (512, 1024, 2048, 4096, 8192, 16384)]
        make(f"attention causal fwd bf16, head_dim {d}, by sequence", shapes, True, False, lambda s: s[2])
    # where flash_attention takes its Hopper kernels (attention_sm90.ROUTED_MIN_LENGTH): both ways, each length
    shapes = [(max(1, tokens // n), 16, n, 128) for n in (1024, 2048, 4096, 8192)]
    make("attention causal fwd+bwd bf16, head_dim 128, by sequence", shapes, True, True, lambda s: s[2])
    return out


# --------------------------------------------------------------------------- reporting

def _best_peer(rows, x) -> tuple[str, float] | None:
    peers = [(r.provider, r.median_ms) for r in rows if r.x == x and r.status == "ok"
             and not r.provider.startswith(("roofline", "eager, by hand"))]
    return min(peers, key=lambda p: p[1]) if peers else None


def ratio_lines(result) -> list[dict]:
    """Per size: our time, the fastest peer's, and ours over theirs (below 1: we are faster)."""
    out = []
    for x in dict.fromkeys(r.x for r in result.rows):
        ours = next((r for r in result.rows if r.x == x and r.provider == OURS and r.status == "ok"), None)
        best = _best_peer(result.rows, x)
        out.append(dict(x=x, ours_ms=ours.median_ms if ours else None, ours_gbps=ours.gbps if ours else None,
                        ours_tflops=ours.tflops if ours else None,
                        ours_pct=ours.pct_of_roofline if ours else None, best_peer=best[0] if best else None,
                        best_peer_ms=best[1] if best else None,
                        ratio=(ours.median_ms / best[1]) if ours and best else None,
                        peers={r.provider: r.median_ms for r in result.rows
                               if r.x == x and r.status == "ok" and r.provider != OURS}))
    return out


def attention_memory(dev, lengths=(1024, 4096, 16384), heads: int = 8, d: int = 128) -> list[dict]:
    """Peak memory above the inputs during forward+backward of attention, bf16, one sequence of `heads` heads:
    flash_attention's grows as N (the output, the log-sum-exp and the gradients), the naive one's as N^2 (the
    scores and the weights, kept for the backward)."""
    from roofline.ops.attention import attention_reference

    out = []
    for n in lengths:
        for name, fn in ((OURS, lambda q, k, v: ops.flash_attention(q, k, v, True, backend="triton")),
                         ("naive (scores in memory)", lambda q, k, v: attention_reference(q, k, v, True))):
            q, k, v, do = (_randn((1, heads, n, d), dev, grad=i < 3) for i in range(4))
            fn(q, k, v).backward(do)   # warm-up: compile outside the measurement
            torch.cuda.synchronize()
            q.grad = k.grad = v.grad = None
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fn(q, k, v).backward(do)
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - before
            out.append(dict(provider=name, seq=n, heads=heads, head_dim=d, peak_extra_bytes=peak,
                            bytes_per_head_per_token=peak / heads / n))
            del q, k, v, do
            torch.cuda.empty_cache()
    return out


def cross_entropy_memory(dev, rows: int, vocab: int = 128256) -> list[dict]:
    """Peak memory above the inputs during forward+backward, per provider (torch.cuda.max_memory_allocated)."""
    op = _cross_entropy_op()
    out = []
    logits_bytes = rows * vocab * 2
    for name, fn in op.providers.items():
        if fn is _no_liger:
            continue
        logits, target = op.inputs((rows, vocab), dev, True)
        fn(logits, target).backward()   # warm-up: compile and autotune outside the measurement
        logits.grad = None
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn(logits, target).backward()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        out.append(dict(provider=name, peak_extra_bytes=peak, logits_buffers=peak / logits_bytes))
        del logits, target
        torch.cuda.empty_cache()
    return out


def _liger_version() -> str | None:
    if liger is None:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("liger_kernel")
    except PackageNotFoundError:   # installed with --target: no metadata on the path
        return "installed"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--quick", action="store_true", help="small shapes, for a smoke test")
    parser.add_argument("--only", nargs="*", default=None, help="run only sweeps whose name contains one of these")
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="run only these parts")
    args = parser.parse_args(argv)
    dev = torch.device("cuda")
    sweep_dir = args.out / "ops"
    sweep_dir.mkdir(parents=True, exist_ok=True)
    summary = dict(liger=_liger_version(), memory=[])
    # The headline shapes run twice: with CUDA events (a call as eager code makes it, host time included where
    # the host is slower than the GPU) and with CUDA graphs (the kernels alone).
    plan = [("headline", s, False) for s in headline_sweeps(args.quick)]
    plan += [("headline_graphs", s, True) for s in headline_sweeps(args.quick, graphs=True)]
    plan += [("rows", s, False) for s in row_sweeps(args.quick)]
    plan += [("rows_graphs", s, True) for s in row_sweeps(args.quick)]
    plan += [("attention", s, False) for s in attention_sweeps(args.quick)]
    for part, s, graphs in plan:
        if part not in args.parts or args.only and not any(o in s.name for o in args.only):
            continue
        result = s.run(rounds=3, progress=False, cuda_graph=graphs)
        stem = s.name.replace(" ", "_").replace("+", "-") + ("_graphs" if graphs else "")
        report.write_json(result, sweep_dir / f"{stem}.json", samples=False)
        (sweep_dir / f"{stem}.md").write_text(report.to_markdown(result))
        if part.startswith("rows") or "by sequence" in s.name:
            report.plot(result, sweep_dir / f"{stem}.png")
        print(report.to_markdown(result), flush=True)
        for line in ratio_lines(result):
            summary.setdefault(part, []).append(dict(sweep=s.name, **line))
        failed = [f"{r.provider} at {r.x}: {r.reason}" for r in result.rows if r.status == "failed"]
        for f in failed:
            print(f"  FAILED {f}", flush=True)
        summary.setdefault("failed", []).extend(f"{s.name}{' (graphs)' if graphs else ''}: {f}" for f in failed)
    if "headline" in args.parts and (not args.only or any("cross_entropy" in o for o in args.only)):
        summary["memory"] = cross_entropy_memory(dev, 1024 if args.quick else 8192)
    if "attention" in args.parts and (not args.only or any("attention" in o for o in args.only)):
        summary["attention_memory"] = attention_memory(dev, (256, 1024) if args.quick else (1024, 4096, 16384))
    (args.out / "ops.json").write_text(json.dumps(summary, indent=1, default=str))
    (args.out / "ops.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0


def _fmt(v, spec):
    return "" if v is None else format(v, spec)


def markdown(summary: dict) -> str:
    lines = []
    for part, title in (("headline", "CUDA events: a call as eager code makes it"),
                        ("headline_graphs", "CUDA graphs: the kernels alone")):
        lines += [f"### Headline shapes (bf16), {title}: roofline's Triton kernels against the fastest peer", "",
                  "| sweep | shape | ours (ms) | ours (GB/s) | % of copy bw | fastest peer | peer (ms) | ours / peer |",
                  "|---|---|---|---|---|---|---|---|"]
        for h in summary.get(part, []):
            lines.append(f"| {h['sweep']} | {h['x']} | {_fmt(h['ours_ms'], '.4f')} | {_fmt(h['ours_gbps'], ',.0f')} | "
                         f"{_fmt(h['ours_pct'], '.0f')} | {h['best_peer'] or ''} | {_fmt(h['best_peer_ms'], '.4f')} | "
                         f"{_fmt(h['ratio'], '.3f')} |")
        lines.append("")
    lines += ["### Row-length sweeps at 256 MB: worst ratio ours / fastest peer (above 1.05 misses the target)",
              "", "| sweep | timed with | worst row length | ours / peer | peer there |", "|---|---|---|---|---|"]
    for part, timing in (("rows", "CUDA events"), ("rows_graphs", "CUDA graphs")):
        for name in dict.fromkeys(r["sweep"] for r in summary.get(part, [])):
            rs = [r for r in summary[part] if r["sweep"] == name and r["ratio"] is not None]
            if rs:
                w = max(rs, key=lambda r: r["ratio"])
                lines.append(f"| {name} | {timing} | {w['x']} | {w['ratio']:.3f} | {w['best_peer']} |")
    if summary.get("attention"):
        lines += ["", "### flash_attention against SDPA's flash and cuDNN backends (bf16, CUDA events; ours / theirs "
                  "below 1: ours faster)", "",
                  "| sweep | x | ours (ms) | ours (TFLOP/s) | sdpa flash (ms) | ours / flash | sdpa cudnn (ms) | "
                  "ours / cudnn |", "|---|---|---|---|---|---|---|---|"]
        for h in summary["attention"]:
            flash, cudnn = (h["peers"].get(p) for p in ("sdpa flash", "sdpa cudnn"))
            ratio = lambda peer: h["ours_ms"] / peer if h["ours_ms"] and peer else None   # noqa: E731
            lines.append(f"| {h['sweep']} | {h['x']} | {_fmt(h['ours_ms'], '.4f')} | "
                         f"{_fmt(h['ours_tflops'], ',.0f')} | {_fmt(flash, '.4f')} | {_fmt(ratio(flash), '.3f')} | "
                         f"{_fmt(cudnn, '.4f')} | {_fmt(ratio(cudnn), '.3f')} |")
    if summary.get("attention_memory"):
        lines += ["", "### attention fwd+bwd, causal, bf16: peak memory above the inputs", "",
                  "| provider | heads x seq x head_dim | peak extra (MB) | bytes per head per token |",
                  "|---|---|---|---|"]
        lines += [f"| {m['provider']} | {m['heads']} x {m['seq']} x {m['head_dim']} | "
                  f"{m['peak_extra_bytes'] / 1e6:,.1f} | {m['bytes_per_head_per_token']:,.0f} |"
                  for m in summary["attention_memory"]]
    if summary.get("memory"):
        lines += ["", "### cross_entropy [8192 x 128256] bf16 fwd+bwd: peak memory above the inputs", "",
                  "| provider | peak extra (MB) | logits-sized buffers |", "|---|---|---|"]
        for m in summary["memory"]:
            lines.append(f"| {m['provider']} | {m['peak_extra_bytes'] / 1e6:,.0f} | {m['logits_buffers']:.2f} |")
    if summary.get("failed"):
        lines += ["", "### Providers that failed", ""] + [f"- {f}" for f in summary["failed"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
