"""Host time per eager call: roofline's ops against the torch ops they replace, side by side in one run.

    python benchmarks/host_overhead.py OUT_DIR [--calls 1200] [--rounds 9] [--before FILE] [--no-sizes]

An op called from eager Python costs host time on every call, and where the GPU work is small the program
waits for the host. Three tables:

  host    tiny inputs, forward and forward+backward (torch.autograd.grad with a random cotangent): the host
          time per call, as `calls` back-to-back calls between two synchronizations take it; the GPU idles.
          The target is roofline at most 1.5x torch on every row.
  sizes   the same back-to-back calls from 2^10 to 2^24 elements: what eager code gets, host and GPU together,
          from host-bound to GPU-bound. The target is roofline at most 1.0x torch on every row.
  launch  a trivial Triton kernel through `kernel[grid](...)` and through roofline's Launch, torch's `x + 1`.

Providers alternate in rounds (ours, torch, ours, torch, ...), so that a drift of the host's speed falls on both;
each round gives one ratio, roofline's time over torch's. A row reports each provider's median time, the median of
the per-round ratios and its 95% interval (the sign test's over rounds, as roofline.bench.compare pairs them; 9
rounds by default, 6 at least). A forward+backward is mostly autograd's engine handing work to its device thread,
whose time swings by 10% from round to round on the H100 host: a ratio of 1.02 whose interval holds 1.0 says no
more than that the two cost the same. A row counts against a target only where its whole interval lies beyond
it. Every roofline op is checked against its torch op first, and the
plans built while timing are counted: a call with a signature seen before must build none. --before FILE adds
the roofline column of an earlier run's JSON (another checkout, same machine) beside this one.
Writes OUT_DIR/host_overhead.{json,md}.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from roofline import ops
from roofline.bench.stats import median_ci, min_rounds

try:
    from roofline.ops import _launch
except ImportError:   # a checkout from before the launch plans (a "before" run): no plans to count
    _launch = None
from roofline.ops.int8_linear import dequantize_int8
from roofline.ops.norm import add_rms_norm_reference
from roofline.ops.rope import rope_reference

BF16 = torch.bfloat16


@dataclass
class Case:
    """One op: inputs(shape, grad) -> tuple, roofline's call and the torch call it replaces, and the shapes of
    the sizes sweep by element count (None: not swept)."""
    name: str
    inputs: object
    ours: object
    torch: object
    tiny: tuple
    sweep: object = None


def _randn(shape, grad, scale=1.0):
    return (torch.randn(shape, device="cuda", dtype=BF16) * scale).requires_grad_(grad)


def _rows(elements: int, width: int = 1024) -> tuple[int, int]:
    width = min(width, elements)
    return elements // width, width


def _norm_inputs(shape, grad, bias=True):
    x = _randn(shape, grad)
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", dtype=BF16)).requires_grad_(grad)
    if not bias:
        return x, w
    return x, w, (0.1 * torch.randn(shape[-1], device="cuda", dtype=BF16)).requires_grad_(grad)


def _attention_inputs(shape, grad):
    b, h, n, d = shape
    return _randn((b, h, n, d), grad), _randn((b, h, n, d), grad), _randn((b, h, n, d), grad)


def _rope_inputs(shape, grad):
    b, hq, hk, t, d = shape
    angles = torch.rand(t, d, device="cuda") * 6.28
    return _randn((b, hq, t, d), grad), _randn((b, hk, t, d), grad), angles.cos().to(BF16), angles.sin().to(BF16)


def _linear_inputs(shape, grad, bias=True):
    m, n, k = shape
    x, w = _randn((m, k), grad), _randn((n, k), grad, k ** -0.5)
    return (x, w, _randn((n,), grad)) if bias else (x, w)


def _int8_inputs(shape, grad):
    """x, the int8 weight and its scales, and the bf16 weight they stand for (what the torch call reads)."""
    m, n, k = shape
    q, scale = ops.quantize_int8(torch.randn(n, k, device="cuda") * k ** -0.5)
    return _randn((m, k), grad), q, scale, dequantize_int8(q, scale).to(BF16)


def _ce_inputs(shape, grad):
    logits = _randn(shape, grad, 2.0)
    return logits, torch.randint(0, shape[-1], shape[:-1], device="cuda")


EPS = 1e-6
CASES = [
    Case("softmax", lambda s, g: (_randn(s, g),), lambda x: ops.softmax(x, -1), lambda x: F.softmax(x, -1),
         (8, 512), _rows),
    Case("layer_norm", _norm_inputs, lambda x, w, b: ops.layer_norm(x, x.shape[-1:], w, b, EPS),
         lambda x, w, b: F.layer_norm(x, x.shape[-1:], w, b, EPS), (8, 512), _rows),
    Case("rms_norm", functools.partial(_norm_inputs, bias=False), lambda x, w: ops.rms_norm(x, x.shape[-1:], w, EPS),
         lambda x, w: F.rms_norm(x, x.shape[-1:], w, EPS), (8, 512), _rows),
    Case("add_rms_norm (vs x + r, rms_norm)",
         lambda s, g: (_randn(s, g), *_norm_inputs(s, g, bias=False)), lambda x, r, w: ops.add_rms_norm(x, r, w, EPS),
         lambda x, r, w: add_rms_norm_reference(x, r, w, EPS), (8, 512), _rows),
    Case("gelu (tanh)", lambda s, g: (_randn(s, g),), lambda x: ops.gelu(x, "tanh"),
         lambda x: F.gelu(x, approximate="tanh"), (8, 512), _rows),
    Case("swiglu (vs silu(a) * b)", lambda s, g: (_randn(s, g), _randn(s, g)), ops.swiglu,
         lambda a, b: F.silu(a) * b, (8, 512), _rows),
    Case("rope (vs eager rotate-half)", _rope_inputs, ops.rope, rope_reference, (1, 8, 2, 16, 64)),
    Case("cross_entropy", _ce_inputs, ops.cross_entropy, F.cross_entropy, (8, 512),
         lambda e: _rows(e, 32768)),
    Case("cross_entropy, check_targets=False (no host sync)", _ce_inputs,
         lambda x, t: ops.cross_entropy(x, t, check_targets=False), F.cross_entropy, (8, 512)),
    Case("flash_attention (vs SDPA)", _attention_inputs, lambda q, k, v: ops.flash_attention(q, k, v, causal=True),
         lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), (1, 4, 128, 64)),
    Case("linear (vs F.linear)", _linear_inputs, ops.linear, F.linear, (8, 256, 256)),
    Case("linear + gelu (vs F.gelu(F.linear))", _linear_inputs, lambda x, w, b: ops.linear(x, w, b, "gelu"),
         lambda x, w, b: F.gelu(F.linear(x, w, b)), (8, 256, 256)),
    Case("int8_linear, 1 row (vs bf16 F.linear)", _int8_inputs, lambda x, q, s, w: ops.int8_linear(x, q, s),
         lambda x, q, s, w: F.linear(x, w), (1, 256, 256)),
]
SIZES = [1 << 10, 1 << 14, 1 << 18, 1 << 22, 1 << 24]


# --------------------------------------------------------------------------- timing

def _forward_backward(fn, args, cotangent):
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]

    def run():
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.grad(outs, wrt, cotangent(outs))
    return run


def _cotangents(outs):
    return tuple(torch.randn_like(o) for o in outs)


def _per_call_us(fn, calls: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def _side_by_side(fns: dict, calls: int, rounds: int) -> dict:
    """{name: [us per call, one per round]} over `rounds` rounds, the providers alternating within each round."""
    for fn in fns.values():   # warm-up: compilation, autotuning, plans, the allocator's cache
        for _ in range(20):
            fn()
    samples = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            samples[name].append(_per_call_us(fn, calls))
    return samples


def compared(samples: dict) -> dict:
    """A row's numbers from _side_by_side's samples of roofline and torch: each one's median us per call, the
    median of the per-round ratios (roofline / torch) and its 95% interval (sign test over rounds), and the
    rounds themselves."""
    ours, theirs = samples["roofline"], samples["torch"]
    low, ratio, high = median_ci([a / b for a, b in zip(ours, theirs)])
    return dict(roofline_us=statistics.median(ours), torch_us=statistics.median(theirs), ratio=ratio,
                ratio_low=low, ratio_high=high, roofline_rounds_us=list(ours), torch_rounds_us=list(theirs))


def beyond(rows: list[dict], target: float) -> list[dict]:
    """The rows whose whole interval lies over `target`: roofline costs more than it there, as far as the run
    can tell."""
    return [r for r in rows if r["ratio_low"] > target]


def _check(case: Case, args) -> None:
    """roofline's op against the torch op on these inputs (a wrong op must not be timed)."""
    ours, theirs = case.ours(*args), case.torch(*args)
    for a, b in zip(*(o if isinstance(o, tuple) else (o,) for o in (ours, theirs))):
        torch.testing.assert_close(a.float(), b.float(), atol=5e-2, rtol=5e-2)


def _plans() -> int | None:
    return sum(_launch.plans_built().values()) if _launch is not None else None


def host_table(calls: int, rounds: int) -> list[dict]:
    rows = []
    for case in CASES:
        for grad in (False, True):
            args = case.inputs(case.tiny, grad)
            if not grad:
                _check(case, args)
            fns = {"roofline": functools.partial(case.ours, *args), "torch": functools.partial(case.torch, *args)}
            if grad:
                fns = {name: _forward_backward(fn.func, fn.args, _cotangents) for name, fn in fns.items()}
            for fn in fns.values():
                fn()
            before = _plans()
            row = compared(_side_by_side(fns, calls, rounds))
            rows.append(dict(op=case.name, pass_="forward+backward" if grad else "forward", shape=list(case.tiny),
                             **row, plans_built_while_timing=None if before is None else _plans() - before))
            print(f"{case.name:42s} {rows[-1]['pass_']:17s} roofline {row['roofline_us']:7.1f} us  torch "
                  f"{row['torch_us']:7.1f} us  {_ratio(row)}", flush=True)
    return rows


def sizes_table(calls: int, rounds: int) -> list[dict]:
    rows = []
    for case in CASES:
        if case.sweep is None:
            continue
        for elements in SIZES:
            shape = case.sweep(elements)
            for grad in (False, True):
                args = case.inputs(shape, grad)
                fns = {"roofline": functools.partial(case.ours, *args), "torch": functools.partial(case.torch, *args)}
                if grad:
                    fns = {name: _forward_backward(fn.func, fn.args, _cotangents) for name, fn in fns.items()}
                n = max(20, min(calls, int(calls * (1 << 14) / elements)))   # fewer calls of the larger sizes
                row = compared(_side_by_side(fns, n, rounds))
                rows.append(dict(op=case.name, pass_="forward+backward" if grad else "forward", shape=list(shape),
                                 elements=elements, **row))
                print(f"{case.name:42s} 2^{elements.bit_length() - 1:<3d}{rows[-1]['pass_']:17s} roofline "
                      f"{row['roofline_us']:9.1f} us  torch {row['torch_us']:9.1f} us  {_ratio(row)}", flush=True)
    return rows


def launch_table(calls: int, rounds: int) -> list[dict]:
    import triton
    import triton.language as tl

    @triton.jit
    def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)

    x = torch.randn(1024, device="cuda")
    y = torch.empty_like(x)
    fns = {"kernel[grid](...) (Triton's JIT launch)": lambda: add_one[(1,)](x, y, 1024, BLOCK=1024),
           "torch x + 1": lambda: x + 1,
           "torch.empty_like(x)": lambda: torch.empty_like(x)}
    if _launch is not None:
        direct = _launch.Launch(add_one, (1,), x.device.index, BLOCK=1024)
        fns["roofline Launch (the compiled kernel's C launcher)"] = lambda: direct(x, y, 1024)
    try:
        from liger_kernel.transformers import functional as liger
        w, b = torch.ones(512, device="cuda", dtype=BF16), torch.zeros(512, device="cuda", dtype=BF16)
        xs = torch.randn(8, 512, device="cuda", dtype=BF16)
        fns["Liger-Kernel layer_norm [8 x 512] bf16"] = lambda: liger.liger_layer_norm(xs, w, b, EPS)
        fns["Liger-Kernel rms_norm [8 x 512] bf16"] = lambda: liger.liger_rms_norm(xs, w, EPS)
    except ImportError:
        print("Liger-Kernel is not installed here: its rows are left out")
    us = {name: statistics.median(s) for name, s in _side_by_side(fns, calls, rounds).items()}
    for name, t in us.items():
        print(f"{name:55s} {t:7.2f} us")
    return [dict(call=name, us=t) for name, t in us.items()]


# --------------------------------------------------------------------------- report

def _ratio(row: dict) -> str:
    return f"{row['ratio']:.2f} ({row['ratio_low']:.2f}-{row['ratio_high']:.2f})"


def _verdict(rows: list[dict], target: float) -> list[str]:
    """The lines under a table: how many rows lie over the target as far as the run can tell, and which."""
    over = beyond(rows, target)
    lines = [f"Rows whose whole 95% interval lies over {target}: **{len(over)} of {len(rows)}**"
             + ("." if not over else ":")]
    lines += [f"- {r['op']}, {r['pass_']}" + (f", 2^{r['elements'].bit_length() - 1}" if "elements" in r else "")
              + f": {_ratio(r)}" for r in over]
    point = [r for r in rows if r["ratio"] > target >= r["ratio_low"]]
    if point:
        lines.append(f"- Over {target} by the median alone, their interval holding it: {len(point)}.")
    return ["", *lines]


def markdown(result: dict, before: dict | None) -> str:
    env = result["environment"]
    lines = [f"# Host time per eager call ({env['gpu']})", "",
             f"{env['date']}; torch {env['torch']}, triton {env['triton']}, Python {env['python']}; "
             f"`{env['command']}`. {env['rounds']} rounds of back-to-back calls, providers alternating: each "
             "provider's median time, and the median of the per-round ratios with its 95% interval (sign test "
             "over rounds).", ""]
    earlier = {(r["op"], r["pass_"]): r["roofline_us"] for r in (before or {}).get("host", [])}
    lines += ["## Tiny inputs: host time per call (target: roofline / torch <= 1.5)", ""]
    head = ("| op | pass | shape | roofline (us) | torch (us) | roofline / torch (95% interval) | plans built while "
            "timing |")
    if earlier:
        head += " roofline before (us) |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for r in result["host"]:
        line = (f"| {r['op']} | {r['pass_']} | {'x'.join(map(str, r['shape']))} | {r['roofline_us']:.1f} | "
                f"{r['torch_us']:.1f} | {_ratio(r)} | {r['plans_built_while_timing']} |")
        if earlier:
            old = earlier.get((r["op"], r["pass_"]))
            line += f" {old:.1f} |" if old is not None else " |"
        lines.append(line)
    lines += _verdict(result["host"], 1.5)
    if result.get("sizes"):
        lines += ["", "## Back-to-back eager calls by size: time per call (target: roofline / torch <= 1.0)", "",
                  "| op | pass | elements | shape | roofline (us) | torch (us) | roofline / torch (95% interval) |",
                  "|---|---|---|---|---|---|---|"]
        for r in result["sizes"]:
            lines.append(f"| {r['op']} | {r['pass_']} | 2^{r['elements'].bit_length() - 1} | "
                         f"{'x'.join(map(str, r['shape']))} | {r['roofline_us']:.1f} | {r['torch_us']:.1f} | "
                         f"{_ratio(r)} |")
        lines += _verdict(result["sizes"], 1.0)
    lines += ["", "## Launching a trivial kernel", "", "| call | us per call |", "|---|---|"]
    lines += [f"| {r['call']} | {r['us']:.2f} |" for r in result["launch"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--calls", type=int, default=1200, help="back-to-back calls per round")
    parser.add_argument("--rounds", type=int, default=9, help="rounds (at least 6, for the ratios' intervals)")
    parser.add_argument("--before", type=Path, help="an earlier run's host_overhead.json, for a 'before' column")
    parser.add_argument("--no-sizes", action="store_true", help="skip the sweep by size")
    args = parser.parse_args(argv)
    if args.rounds < min_rounds(0.95):
        parser.error(f"--rounds: at least {min_rounds(0.95)} for a 95% interval of the ratios, got {args.rounds}")
    if not torch.cuda.is_available():
        print("host_overhead needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton
    args.out.mkdir(parents=True, exist_ok=True)
    result = dict(environment=dict(
        gpu=torch.cuda.get_device_name(), date=time.strftime("%Y-%m-%d"), torch=torch.__version__,
        triton=triton.__version__, python=sys.version.split()[0], rounds=args.rounds,
        command="python benchmarks/host_overhead.py " + " ".join(argv if argv is not None else sys.argv[1:])))
    print("== launching a trivial kernel")
    result["launch"] = launch_table(args.calls, args.rounds)
    print("== tiny inputs: host time per call")
    result["host"] = host_table(args.calls, args.rounds)
    if not args.no_sizes:
        print("== back-to-back eager calls by size")
        result["sizes"] = sizes_table(args.calls, args.rounds)
    before = json.loads(args.before.read_text()) if args.before and args.before.exists() else None
    (args.out / "host_overhead.json").write_text(json.dumps(result, indent=1))
    (args.out / "host_overhead.md").write_text(markdown(result, before))
    print(markdown(result, before))
    return 0


if __name__ == "__main__":
    sys.exit(main())
