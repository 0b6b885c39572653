"""The interconnect's ceilings against a plain loop: does doctor's all_reduce busbw (bench.time_collective) read what
a hand-written timed loop of dist.all_reduce reads, at 256 MiB to 1 GiB, in the same process group?

    python benchmarks/interconnect.py OUT_DIR [--nproc N]

Writes OUT_DIR/interconnect.md and .json. The target (issue 37): within 3% at every size.
"""

import argparse
import json
from pathlib import Path

import torch
import torch.distributed as dist

from roofline.bench.collective import bus_factor, time_collective
from roofline.distributed import spawn

SIZES = (256 << 20, 512 << 20, 1 << 30)


def plain_loop_and_timer(sizes, iters: int = 20, repeats: int = 3):
    """Per size: the all_reduce's busbw from a plain loop of dist.all_reduce (events around `iters` calls after 5
    warm-up calls, the median of `repeats` loops), and from time_collective, interleaved, `repeats` times each."""
    n = dist.get_world_size()
    out = []
    for size in sizes:
        x = torch.empty(size // 2, dtype=torch.bfloat16, device="cuda")
        plain, ours = [], []
        for _ in range(repeats):
            for _ in range(5):
                dist.all_reduce(x)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            for _ in range(iters):
                dist.all_reduce(x)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end) / iters
            plain.append(size / (ms * 1e-3) / 1e9 * bus_factor("all_reduce", n))
            ours.append(time_collective("all_reduce", size).busbw_gbps)
        out.append({"nbytes": size, "plain_busbw": sorted(plain)[repeats // 2], "timer_busbw": sorted(ours)[repeats // 2],
                    "plain_all": plain, "timer_all": ours})
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count())
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = spawn(plain_loop_and_timer, args.nproc, SIZES)[0]
    lines = [f"all_reduce bf16 over {args.nproc} x {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
             f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}", "",
             "| size | plain loop busbw GB/s | time_collective busbw GB/s | ratio | within 3% |", "|---|---|---|---|---|"]
    for r in rows:
        ratio = r["timer_busbw"] / r["plain_busbw"]
        r["ratio"] = ratio
        lines.append(f"| {r['nbytes'] >> 20} MiB | {r['plain_busbw']:.1f} | {r['timer_busbw']:.1f} | {ratio:.3f} | "
                     f"{'yes' if abs(ratio - 1) <= 0.03 else 'NO'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    (args.out / "interconnect.md").write_text(text)
    (args.out / "interconnect.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
