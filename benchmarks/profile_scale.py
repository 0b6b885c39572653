"""How long the analysis of a large trace takes, and how much memory it needs.

    python benchmarks/profile_scale.py OUT_DIR [--events 1000000]

Writes a synthetic torch.profiler trace shaped like a training loop (per iteration: a line
mark, a module range, an aten op with shapes, its cudaLaunchKernel and the kernel, a backward
op on the autograd thread, plus an occasional sync), gzipped, of about --events events; then
times `roofline.profiler.analyze` on it and records the peak resident memory of the process.
The issue's target: one million events in under a minute on a 2-core machine, without ever
holding the raw JSON twice. Writes profile_scale.json and prints one line.
"""

import argparse
import gzip
import json
import resource
import time
from pathlib import Path

MAIN, AUTOGRAD = 100, 200
KERNELS = ["void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>(int, T1, T2)",
           "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
           "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::sum_functor>>"]
OPS = [("aten::gelu", [[8192, 2048]], ["c10::BFloat16"]),
       ("aten::mm", [[8192, 2048], [2048, 2048]], ["c10::BFloat16", "c10::BFloat16"]),
       ("aten::sum", [[8192, 2048], [], [], []], ["c10::BFloat16", "ScalarList", "Scalar", ""])]


def write_trace(path: Path, events: int) -> int:
    """A trace of about `events` events; returns how many it holds."""
    stacks = [[["train.py", 90, "<module>"], ["train.py", 40 + k, "step"]] for k in range(12)]
    meta = {"roofline": {"version": 1, "cwd": "/work", "argv": ["train.py"], "sys_path": [],
                         "library_roots": ["/usr/lib/python3/"], "stacks": stacks},
            "schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132}]}
    written = 0
    with gzip.open(path, "wt", compresslevel=1) as out:
        out.write(json.dumps(meta)[:-1] + ', "traceEvents": [')
        t, gpu_t, corr, i = 0.0, 0.0, 0, 0
        while written < events:
            k = i % len(OPS)
            name, shapes, dtypes = OPS[k]
            corr += 1
            gpu_t = max(gpu_t, t + 12) + 2
            batch = [
                {"ph": "X", "cat": "user_annotation", "name": f"roofline.line: {i % len(stacks)}", "pid": 1, "tid": MAIN,
                 "ts": t, "dur": 0.5, "args": {}},
                {"ph": "X", "cat": "user_annotation", "name": f"roofline.module: Net.layers.{i % 24}", "pid": 1,
                 "tid": MAIN, "ts": t + 1, "dur": 14, "args": {}},
                {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": MAIN, "ts": t + 2, "dur": 10,
                 "args": {"Input Dims": shapes, "Input type": dtypes, "Concrete Inputs": [""] * len(shapes),
                          "Sequence number": i, "Fwd thread id": 0}},
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": MAIN, "ts": t + 5,
                 "dur": 4, "args": {"correlation": corr}},
                {"ph": "X", "cat": "kernel", "name": KERNELS[k], "pid": 0, "tid": 7, "ts": gpu_t, "dur": 9,
                 "args": {"device": 0, "stream": 7, "correlation": corr, "grid": [528, 1, 1], "block": [128, 1, 1]}},
                {"ph": "X", "cat": "cpu_op", "name": "autograd::engine::evaluate_function: GeluBackward0", "pid": 1,
                 "tid": AUTOGRAD, "ts": t + 3, "dur": 6, "args": {"Sequence number": i, "Fwd thread id": 1}},
            ]
            if i % 100 == 99:
                batch.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1,
                              "tid": MAIN, "ts": t + 15, "dur": 20, "args": {"correlation": -1}})
                t += 20
            for e in batch:
                out.write(("," if written else "") + json.dumps(e))
                written += 1
            t += 16
            gpu_t += 9
            i += 1
        out.write("]}")
    return written


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--events", type=int, default=1_000_000)
    opts = p.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    path = opts.out / "scale.trace.json.gz"
    events = write_trace(path, opts.events)
    with gzip.open(path, "rb") as f:
        raw_bytes = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 24), b""))
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    from roofline.profiler.report import analyze

    t0 = time.perf_counter()
    report = analyze(path)
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    report.to_dict()
    to_dict_s = time.perf_counter() - t1
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result = {"events": events, "raw_json_mb": raw_bytes / 1e6, "gzip_mb": path.stat().st_size / 1e6,
              "analyze_s": seconds, "to_dict_s": to_dict_s, "peak_rss_mb": peak_mb, "rss_before_mb": before_mb,
              "kernels": len(report.trace.gpu), "attributed_share": report.attribution.attributed_share}
    (opts.out / "profile_scale.json").write_text(json.dumps(result, indent=1))
    path.unlink()
    print(f"{events:,} events ({raw_bytes / 1e6:,.0f} MB of JSON): analyze {seconds:.1f} s, JSON form {to_dict_s:.1f} s, "
          f"peak RSS {peak_mb:,.0f} MB, attributed {report.attribution.attributed_share:.1%}")


if __name__ == "__main__":
    main()
