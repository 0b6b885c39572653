"""Where a batch-1 int8 decode step's matmul time goes, and what changes it: the int8 GEMV at the shapes of the
Llama-style model's decode step (benchmarks/models.py), three ways of turning int8 into fp32, each over a sweep of
configs, beside bf16 cuBLAS, int8_linear as called and a copy of the weight; then the whole step's matmuls as one
CUDA graph (16 layers and the LM head: 787 MB of int8 weights, so L2 holds none from one replay to the next):

    separate    q, k, v, o, gate, up, down: 7 GEMVs a layer, as the model's nn.Linear layers are
    fused       q/k/v as one, o, gate/up as one, down: 4 (what roofline.nn.SharedInput makes of them)
    adjacent    the GEMVs back to back;  interleaved: a torch kernel before each GEMV that follows one in the
                model (a norm, attention, an activation), as the step runs them

and programmatic dependent launch (PDL: the next kernel's programs start before this one ends) four ways:
    mode0 no PDL;  mode1 start the dependents at once, wait, then load;  mode2 start them, load W's first tile,
    then wait (W never depends on the kernel before);  mode3 load the tile, wait, never start them early.

    python benchmarks/gemv_probe.py OUT.json [--no-sweep | --chain-configs]

Results: benchmarks/results/h100-models.md (int8 GEMV section) and h100-gemv-probe.json.
"""
import argparse
import importlib
import json

import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from roofline import bench

lin = importlib.import_module("roofline.ops.int8_linear")
_gemv_loads, _int8_to_float32 = lin._gemv_loads, lin._int8_to_float32   # the library GEMV's K step and conversion
CONVERSIONS = ("magic", "via_bf16", "i2f")
# (N, K, a torch kernel before it in the model's step) for one layer, and the head
SEPARATE = [(2048, 2048, True), (512, 2048, False), (512, 2048, False), (2048, 2048, True), (5632, 2048, True),
            (5632, 2048, False), (2048, 5632, True)]
FUSED = [(3072, 2048, True), (2048, 2048, True), (11264, 2048, True), (2048, 5632, True)]
HEAD = (32000, 2048, True)
LAYERS = 16
SHAPES = sorted({(n, k) for n, k, _ in SEPARATE + FUSED + [HEAD]})


@triton.jit
def _to_float32(w, CONVERT: tl.constexpr):
    if CONVERT == 0:     # 2^23 + 128 + w from the bits, then exact subtraction (roofline's GEMV)
        return _int8_to_float32(w)
    if CONVERT == 1:     # through bf16, which Triton converts with byte permutes and packed half adds
        return w.to(tl.bfloat16).to(tl.float32)
    return w.to(tl.float32)   # the conversion instruction, I2F


@triton.jit
def gemv(x_ptr, w_ptr, scale_ptr, y_ptr, N, K, stride_w, CONVERT: tl.constexpr, MODE: tl.constexpr,
         EVEN_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """y[BLOCK_N columns] = x W^T * scale for one row x [K], int8 W [N, K]; MODE: the PDL variant (above)."""
    if MODE == 1 or MODE == 2:
        gdc_launch_dependents()
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + tl.minimum(cols, N - 1)[:, None].to(tl.int64) * stride_w + ks[None, :]
    if MODE >= 2:
        w = tl.load(w_ptrs, mask=ks[None, :] < K, other=0, eviction_policy="evict_first")
    if MODE >= 1:
        gdc_wait()
    if MODE < 2:
        w = tl.load(w_ptrs, mask=ks[None, :] < K, other=0, eviction_policy="evict_first")
    x = tl.load(x_ptr + ks, mask=ks < K, other=0.0, eviction_policy="evict_last")
    acc = _to_float32(w, CONVERT) * x.to(tl.float32)[None, :]
    for k in range(BLOCK_K, K, BLOCK_K):
        w_ptrs += BLOCK_K
        x, w = _gemv_loads(x_ptr, w_ptrs, k, ks, K, EVEN_K)
        acc += _to_float32(w, CONVERT) * x.to(tl.float32)[None, :]
    out = tl.sum(acc, axis=1) * tl.load(scale_ptr + tl.minimum(cols, N - 1))
    tl.store(y_ptr + cols, out.to(y_ptr.dtype.element_ty), mask=cols < N)


def configs():
    """(BLOCK_N, BLOCK_K, warps) with 8 to 128 weights a thread a step."""
    return [(bn, bk, warps) for bn in (1, 2, 4, 8, 16) for bk in (256, 512, 1024, 2048) for warps in (1, 2, 4, 8)
            if 8 <= bn * bk // (32 * warps) <= 128]


def launcher(x, q, s, y, config, convert=0, mode=0):
    bn, bk, warps = config
    n, k = q.shape
    pdl = dict(launch_pdl=True) if mode else {}
    return lambda: gemv[(triton.cdiv(n, bn),)](x, q, s, y, n, k, q.stride(0), CONVERT=convert, MODE=mode,
                                               EVEN_K=k % bk == 0, BLOCK_N=bn, BLOCK_K=bk, num_warps=warps,
                                               num_stages=1, **pdl)


def us(fn, **options) -> float:
    return bench.time(fn, cuda_graph=True, warn=False, **options).median * 1e3


def operands(n, k):
    x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
    q, s = lin.quantize_int8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16))
    return x, q, s, torch.empty(1, n, device="cuda", dtype=torch.bfloat16)


def sweep(n, k) -> dict:
    """Each conversion over every config, alone (L2 flushed before each call), checked first."""
    x, q, s, y = operands(n, k)
    dequantized = lin.dequantize_int8(q, s)
    w = dequantized.to(torch.bfloat16)
    exact = F.linear(x.double(), dequantized.double())
    row = dict(n=n, k=k, weight_mb=n * k / 1e6, cublas_bf16=us(lambda: F.linear(x, w)),
               int8_linear=us(lambda: lin.int8_linear(x, q, s)), copy_int8=us(lambda: q.clone()))
    for convert, name in enumerate(CONVERSIONS):
        times = {}
        for config in configs():
            run = launcher(x, q, s, y, config, convert)
            y.fill_(float("nan"))
            run()
            error = ((y.double() - exact).abs().max() / exact.abs().max()).item()
            if not error < 1e-2:
                raise AssertionError(f"{name} {config} at {n}x{k}: relative error {error}")
            times[config] = us(run, warmup_ms=5, rep_ms=25)
        best = sorted(times, key=times.get)
        row[name] = {str(c): times[c] for c in best[:5]}
        row[name + "_best"] = list(best[0])
    return row


def replay_us(calls: list) -> float:
    """Microseconds a replay of the calls as one CUDA graph (L2 not flushed: the weights are larger than it); the
    calls and the memory their tensors held are let go after."""
    def step():
        for call in calls:
            call()
    time = us(step, flush=False, warmup_ms=20, rep_ms=200)
    calls.clear()
    torch.cuda.empty_cache()
    return time


def chain(layer, variant, interleaved, best) -> float:
    """The step's matmuls in one graph: microseconds a replay."""
    calls = []   # each call holds its tensors
    for n, k, torch_before in [item for _ in range(LAYERS) for item in layer] + [HEAD]:
        x = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
        if interleaved and torch_before:
            source = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
            calls.append(lambda source=source, x=x: torch.mul(source, 1.0, out=x))
        if variant == "cublas_bf16":
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            calls.append(lambda x=x, w=w: F.linear(x, w))
            continue
        q = torch.randint(-127, 128, (n, k), device="cuda", dtype=torch.int8)
        s = torch.rand(n, device="cuda") * 0.01
        y = torch.empty(1, n, device="cuda", dtype=torch.bfloat16)
        if variant == "int8_linear":
            calls.append(lambda x=x, q=q, s=s: lin.int8_linear(x, q, s))
        elif variant == "picked":   # the library's kernel at best[(n, k)], a (BLOCK_N, BLOCK_K, warps)
            calls.append(forced(x, q, s, y, best[(n, k)]))
        elif variant.startswith("mode"):
            calls.append(launcher(x, q, s, y, best[(n, k)]["magic"], 0, int(variant[-1])))
        else:
            calls.append(launcher(x, q, s, y, best[(n, k)][variant], CONVERSIONS.index(variant)))

    return replay_us(calls)


def library_pick(n, k) -> tuple:
    """(BLOCK_N, BLOCK_K, warps) that int8_linear's autotuner picks for one row at N x K (timed alone)."""
    x, q, s, _ = operands(n, k)
    lin.int8_linear(x, q, s)
    torch.cuda.synchronize()
    config = next(c for key, c in lin.int8_gemv_kernel.cache.items() if tuple(key[:2]) == (n, k))
    return config.kwargs["BLOCK_N"], config.kwargs["BLOCK_K"], config.num_warps


def forced(x, q, s, y, config):
    """The library's GEMV kernel launched with this config, past its autotuner."""
    bn, bk, warps = config
    n, k = q.shape
    return lambda: lin.int8_gemv_kernel.fn[(triton.cdiv(n, bn),)](
        x, q, s, None, y, n, k, q.stride(0), HAS_BIAS=False, UPCAST=False, BLOCK_N=bn, BLOCK_K=bk,
        num_warps=warps, num_stages=1)


def picked_chain(picks) -> float:
    """The fused step's matmuls, interleaved as the step runs them, each shape at picks[(n, k)]: us a replay."""
    return chain(FUSED, "picked", True, picks)


def chain_configs() -> dict:
    """Each shape's config chosen in the chain instead of alone: the library's picks, then each shape's every
    config (the library's and the sweep's) with the others at their picks, then the chain-best picks against the
    library's, alternating."""
    shapes = sorted({(n, k) for n, k, _ in FUSED + [HEAD]})
    picks = {shape: library_pick(*shape) for shape in shapes}
    candidates = sorted({(c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps) for c in lin.INT8_GEMV}
                        | set(configs()))
    result = dict(library_picks={f"{n}x{k}": list(c) for (n, k), c in picks.items()}, per_shape={})
    best = dict(picks)
    for n, k in shapes:
        times = {}
        for config in candidates:
            if config[1] > max(256, triton.next_power_of_2(k)):
                continue
            times[config] = picked_chain({**picks, (n, k): config})
        best[(n, k)] = min(times, key=times.get)
        result["per_shape"][f"{n}x{k}"] = {str(c): round(t, 1) for c, t in sorted(times.items(), key=lambda i: i[1])}
        print(f"{n}x{k}: library {picks[(n, k)]} {times.get(picks[(n, k)], float('nan')):.1f} us, best {best[(n, k)]} "
              f"{times[best[(n, k)]]:.1f} us", flush=True)
    result["chain_picks"] = {f"{n}x{k}": list(c) for (n, k), c in best.items()}
    result["library"], result["chain_best"] = [], []
    for _ in range(4):   # alternating: the host's and the GPU's drift falls on both
        result["library"].append(picked_chain(picks))
        result["chain_best"].append(picked_chain(best))
    print("library picks", [round(t, 1) for t in result["library"]], "chain picks",
          [round(t, 1) for t in result["chain_best"]], "us", flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out")
    parser.add_argument("--no-sweep", action="store_true", help="chains only, each conversion at its best config "
                        "of the last sweep (the 'best' of benchmarks/results/h100-gemv-probe.json)")
    parser.add_argument("--chain-configs", action="store_true", help="only: each shape's config chosen in the "
                        "fused, interleaved chain against the autotuner's pick alone (chain_configs)")
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.chain_configs:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), **chain_configs()), f, indent=1)
        return
    result = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  shapes=[], chains={})
    if args.no_sweep:
        with open("benchmarks/results/h100-gemv-probe.json") as f:
            result["shapes"] = json.load(f)["shapes"]
    else:
        for n, k in SHAPES:
            result["shapes"].append(sweep(n, k))
            print(json.dumps(result["shapes"][-1]), flush=True)
    best = {(r["n"], r["k"]): {c: tuple(r[c + "_best"]) for c in CONVERSIONS} for r in result["shapes"]}
    for label, layer in (("separate", SEPARATE), ("fused", FUSED)):
        for interleaved in (False, True):
            for variant in ("cublas_bf16", "int8_linear", *CONVERSIONS, "mode1", "mode2", "mode3"):
                key = f"{label} {'interleaved' if interleaved else 'adjacent'} {variant}"
                result["chains"][key] = [chain(layer, variant, interleaved, best) for _ in range(2)]
                print(key, [round(t, 1) for t in result["chains"][key]], "us", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
