"""Where the int8 decode kernel's time goes: its time against the weight's size (N = 4096, K = 1024 .. 16384, and
N = 14336), M = 1 and 16, for int8_linear as called and for each of the kernel's configs launched alone, beside
bf16 cuBLAS and a clone of the int8 weight (what moving those bytes costs). CUDA graphs, the kernels alone.

    python benchmarks/int8_probe.py OUT.json

Results: benchmarks/results/h100-linear.md (the probe section); its JSON is in git history:
`git show 9358745:benchmarks/results/h100-linear-int8-probe.json`.
"""
import importlib
import json
import sys

import torch
import torch.nn.functional as F
import triton

from roofline import bench

lin = importlib.import_module("roofline.ops.int8_linear")
SHAPES = ((4096, 1024), (4096, 2048), (4096, 4096), (4096, 8192), (4096, 16384), (14336, 4096))   # (N, K)


def us(fn, *args) -> float:
    return bench.time(fn, *args, cuda_graph=True, warn=False).median * 1e3


def main(out_path: str) -> None:
    jit = lin.int8_decode_kernel.fn.fn   # the kernel under the autotuner and the heuristics: one config at a time
    out = []
    for m in (1, 16):
        for n, k in SHAPES:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
            q, s = lin.quantize_int8(w)
            y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            row = dict(m=m, n=n, k=k, cublas_bf16=us(F.linear, x, w), ours=us(lin.int8_linear, x, q, s),
                       read_int8=us(lambda: q.view(torch.int32).sum()), copy_int8=us(lambda: q.clone()))
            for c in lin.INT8_DECODE:
                bn, bk = c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
                def launch(c=c, bn=bn, bk=bk):
                    jit[(triton.cdiv(n, bn), 1)](x, q, s, None, y, None, None, m, n, k, 1, x.stride(0), q.stride(0),
                                                 y.stride(0), HAS_BIAS=False, GROUP_K=0, SPLIT_K=1, PRECISION="tf32",
                                                 UPCAST=False, EVEN_K=k % bk == 0, BLOCK_M=16, BLOCK_N=bn, BLOCK_K=bk,
                                                 num_warps=c.num_warps, num_stages=c.num_stages)
                row[f"{bn}x{bk} s{c.num_stages} w{c.num_warps}"] = us(launch)
            out.append(row)
            print(json.dumps({a: (round(b, 2) if isinstance(b, float) else b) for a, b in row.items()}), flush=True)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
