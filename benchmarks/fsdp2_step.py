"""Why FSDP2's GPT-2 small step is slow on two GPUs: the step under each way of sharding, timed, with the host's
profile and the step's synchronizations and device allocations.

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/fsdp2_step.py --variant fsdp2
    python benchmarks/fsdp2_step.py --variant single          # one GPU, no sharding
    python benchmarks/fsdp2_step.py --all OUT.json            # every variant, in turns, and rank 0's host profile

The step is examples/ddp_train.py's (bf16 autocast, fused AdamW, SDPA, 8 x 1024 tokens a rank for GPT-2 small,
4 x 1024 for the Llama-style model of examples/models). Variants:
  single        one GPU, no data parallelism
  ddp           DistributedDataParallel
  fsdp2         fully_shard on each block, then the model; bf16 parameters, fp32 gradients reduced (as the ladder)
  fsdp2-gK      fully_shard on groups of K consecutive blocks, then the model
  ...-keep      each group's parameters kept gathered from forward to backward (reshard_after_forward=False)
  fsdp2-root    fully_shard on the model alone: one all-gather and one reduce-scatter a step
  fsdp2-fp32    blocks and model, no mixed-precision policy (fp32 parameters gathered, autocast casts them)
Each prints one JSON line: the median step (CUDA events, steps after the tenth), the device allocations and
allocator retries over the timed steps, the host synchronizations torch's sync debug mode saw in one step
(where in the program they came from), and with --host-profile, the host's own time by function over 10 steps.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402
from examples.models.llama import Llama, LlamaConfig  # noqa: E402
from roofline.distributed.wrapping import grouped, layers  # noqa: E402

VARIANTS = ("single", "ddp", "fsdp2", "fsdp2-keep", "fsdp2-g2", "fsdp2-g3", "fsdp2-g3-keep", "fsdp2-g4",
            "fsdp2-g4-keep", "fsdp2-g6", "fsdp2-root", "fsdp2-fp32")
MODELS = {"gpt2": (lambda: GPT2(GPT2Config(attention="sdpa")), 8), "llama": (lambda: Llama(LlamaConfig()), 4)}
STEPS = 30


def build(model_name: str, variant: str, device: torch.device):
    torch.manual_seed(0)
    with device:
        model = MODELS[model_name][0]()
    if variant == "single":
        return model, model
    if variant == "ddp":
        return model, torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy() if variant == "fsdp2-fp32" else \
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = layers(model)
    per_unit = int(variant.split("-g")[1].split("-")[0]) if "-g" in variant else 1   # gK: K blocks a unit
    if variant != "fsdp2-root":
        for unit in grouped(blocks, -(-len(blocks) // per_unit)):
            fully_shard(unit if len(unit) > 1 else unit[0], mp_policy=policy,
                        reshard_after_forward=not variant.endswith("-keep"))
    return model, fully_shard(model, mp_policy=policy)


def run(model_name: str, variant: str, host_profile: bool) -> dict:
    several = "RANK" in os.environ
    if several:
        dist.init_process_group("nccl")
    rank = dist.get_rank() if several else 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
    torch.cuda.set_device(device)
    model, step_module = build(model_name, variant, device)
    batch = MODELS[model_name][1]
    optimizer = torch.optim.AdamW(step_module.parameters(), lr=3e-4, fused=True)
    generator = torch.Generator(device).manual_seed(rank)

    def step():
        idx = torch.randint(0, model.config.vocab_size, (batch, 1024), device=device, generator=generator)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_module(idx, targets=idx)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    marks = []
    for i in range(STEPS):
        if i == 10:
            torch.cuda.synchronize()
            before = torch.cuda.memory_stats()
        step()
        marks.append(torch.cuda.Event(enable_timing=True))
        marks[-1].record()
    torch.cuda.synchronize()
    after = torch.cuda.memory_stats()
    times = [a.elapsed_time(b) for a, b in zip(marks[10:], marks[11:])]
    result = {"model": model_name, "variant": variant, "rank": rank, "step_ms": statistics.median(times),
              "device_allocs": after["num_device_alloc"] - before["num_device_alloc"],
              "device_frees": after["num_device_free"] - before["num_device_free"],
              "alloc_retries": after["num_alloc_retries"] - before["num_alloc_retries"],
              "peak_gib": after["allocated_bytes.all.peak"] / 2**30, "syncs": synchronizations(step)}
    if host_profile:
        profiler = cProfile.Profile()
        torch.cuda.synchronize()
        profiler.enable()
        for _ in range(10):
            step()
        torch.cuda.synchronize()
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumtime").print_stats(40)
        result["host_profile"] = text.getvalue()
    if several:
        dist.destroy_process_group()
    return result


def synchronizations(step) -> list[str]:
    """Where one step made the host wait for the GPU: torch's sync debug mode warns at each such call; the frame
    outside torch that made it."""
    seen = []
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
        torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    for w in caught:
        if "synchroniz" in str(w.message):
            seen.append(f"{Path(w.filename).name}:{w.lineno}: {str(w.message)[:120]}")
    return seen


def all_variants(out: Path, rounds: int, plan: list[str], profiled: list[str]) -> None:
    """Each MODEL:VARIANT of `plan`, in turns (`rounds` times each), then rank 0's host profile of `profiled`."""
    rows = []
    for round_ in range(rounds):
        for item in plan:
            rows.append(dict(_launch(*item.split(":")), round=round_))
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "host_profile"}), flush=True)
    for item in profiled:
        rows.append(dict(_launch(*item.split(":"), "--host-profile"), round="host-profile"))
        print(f"--- rank 0's host profile, {item} (10 steps)\n{rows[-1].get('host_profile', rows[-1])}", flush=True)
    out.write_text(json.dumps(rows, indent=1))


def _launch(model: str, variant: str, *extra: str) -> dict:
    launch = [sys.executable, __file__] if variant == "single" else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__]
    done = subprocess.run([*launch, "--model", model, "--variant", variant, *extra], capture_output=True, text=True,
                          timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"model": model, "variant": variant, "error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(lines[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=tuple(MODELS), default="gpt2")
    parser.add_argument("--variant", choices=VARIANTS)
    parser.add_argument("--plan", nargs="+", default=[f"gpt2:{v}" for v in VARIANTS], metavar="MODEL:VARIANT")
    parser.add_argument("--profiled", nargs="*", default=["gpt2:fsdp2", "gpt2:ddp"], metavar="MODEL:VARIANT")
    parser.add_argument("--host-profile", action="store_true")
    parser.add_argument("--all", type=Path, metavar="OUT_JSON")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    if args.all:
        return all_variants(args.all, args.rounds, args.plan, args.profiled)
    try:
        result = run(args.model, args.variant, args.host_profile)
    except Exception:
        traceback.print_exc()
        raise
    if result["rank"] == 0:
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
