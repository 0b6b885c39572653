"""GPT-2 small trained with DistributedDataParallel, a process a GPU, as a user's data-parallel script does.

    torchrun --nproc-per-node 2 examples/ddp_train.py --steps 20
    roofline profile --nproc-per-node 2 --skip 5 examples/ddp_train.py --steps 20
    python examples/ddp_train.py --steps 20      # the same step on one GPU, with no DDP: nothing to communicate

bf16 autocast, fused AdamW, SDPA, 8 x 1024 tokens a rank (each rank its own random batch). DDP reduces the
gradients in buckets while the backward runs; --bucket-cap-mb sets their size (DDP's default: 25), --slow-rank R
makes rank R sleep --slow-ms after each step (a planted straggler: a rank that loads its data late), --log-every N
makes rank 0 print the loss every N steps (a host sync on one rank), and --log-in-turns N in turns of N steps,
printing then not: the print's cost measured in one run. --compile split|whole|blocks compiles it three ways
(split at DDP's buckets, one graph, or each block alone: see --help). On CPUs it trains a two-layer model of the
same code over gloo in seconds. Rank 0 prints the median step time of the steps after the first five (CUDA events
between steps, no synchronization in the loop but the prints').
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from examples.models.gpt2 import GPT2, GPT2Config  # noqa: E402

TINY = dict(vocab_size=96, max_seq=64, n_layer=2, n_head=2, d_model=32)
WARM = 5         # steps before the timed ones
SETTLING = 2     # steps of a turn not timed: the host's lead over its GPU builds up again after a print
COMPILES = ("split", "whole", "blocks")


def main(argv=None):
    gpu = torch.cuda.is_available()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8 if gpu else 2)
    p.add_argument("--seq", type=int, default=1024 if gpu else 16)
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--fsdp2", action="store_true", help="FSDP2 instead of DDP: each block sharded, then the model "
                   "(bf16 parameters for the compute, fp32 gradients reduced)")
    p.add_argument("--fsdp2-groups", type=int, default=0, help="with --fsdp2: shard the blocks in this many groups, "
                   "each kept gathered from its forward to its backward (roofline profile's fsdp2-hooks advice)")
    p.add_argument("--compile", choices=COMPILES, default=None,
                   help="torch.compile the model: split (the DDP module compiled, its graph split at DDP's buckets, "
                   "as DDP's notes advise), whole (the same with Dynamo's DDP optimizer off: one graph, its "
                   "gradients reduced after its backward), blocks (each block compiled alone, DDP's buckets reduced "
                   "as the blocks' backwards finish); on one GPU: split and whole compile the model, blocks its "
                   "blocks")
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-ms", type=float, default=20.0)
    p.add_argument("--log-every", type=int, default=0, help="rank 0 prints the loss every N steps: loss.item() "
                   "waits for its GPU (a host sync on one rank)")
    p.add_argument("--log-in-turns", type=int, default=0, metavar="N", help="rank 0 prints the loss in turns of N "
                   "steps, printing then not, after the first five; it then prints each pair of turns' median step "
                   "after a print and after none")
    args = p.parse_args(argv)
    if args.log_in_turns and (args.log_every or args.log_in_turns <= SETTLING):
        p.error(f"--log-in-turns: more than {SETTLING} steps a turn, without --log-every")
    if args.fsdp2_groups < 0 or (args.fsdp2_groups and not args.fsdp2):
        p.error("--fsdp2-groups: a positive number of groups, with --fsdp2")
    if args.compile and args.fsdp2:
        p.error("--compile: with DDP or one GPU, not --fsdp2")

    several = "RANK" in os.environ   # started by torchrun (or roofline profile --nproc-per-node)
    if several:
        dist.init_process_group("nccl" if gpu else "gloo")
    rank = dist.get_rank() if several else 0
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if gpu else torch.device("cpu")
    if gpu:
        torch.cuda.set_device(device)
    torch.manual_seed(0)   # the same weights on every rank (DDP also broadcasts rank 0's)
    with device:
        model = GPT2(GPT2Config() if gpu else GPT2Config(**TINY))
    if several and args.fsdp2:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if gpu else None, reduce_dtype=torch.float32)
        groups = args.fsdp2_groups or len(model.h)   # the blocks in that many runs, as even as they divide
        size, extra = divmod(len(model.h), groups)
        start = 0
        for g in range(min(groups, len(model.h))):
            end = start + size + (g < extra)
            # a list of blocks is one unit (a slice of the ModuleList would be a module of its own, never called)
            unit = list(model.h[start:end])
            fully_shard(unit if len(unit) > 1 else unit[0], mp_policy=policy,
                        reshard_after_forward=not args.fsdp2_groups)
            start = end
        ddp = fully_shard(model, mp_policy=policy)
    elif several:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if gpu else None,
                                                        bucket_cap_mb=args.bucket_cap_mb)
    else:
        ddp = model
    ddp = _compiled(ddp, model, args.compile)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-4, fused=gpu)
    generator = torch.Generator(device).manual_seed(rank)   # each rank its own data
    vocab = model.config.vocab_size
    marks = []
    for step in range(args.steps):
        idx = torch.randint(0, vocab, (args.batch, args.seq), device=device, generator=generator)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu):
            loss = ddp(idx, targets=idx)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if rank == args.slow_rank:
            time.sleep(args.slow_ms / 1e3)   # a rank late to every next collective
        marks.append(_mark(gpu))   # before a print: its whole cost falls in the next step's time
        if rank == 0 and _prints(step, args):
            print(f"step {step + 1}: loss {loss.item():.4f}")
    if rank == 0:
        world = dist.get_world_size() if several else 1
        print(f"final loss {loss.item():.4f} after {args.steps} steps on {world} rank{'s' if world > 1 else ''}")
        times = _elapsed_ms(marks, gpu)   # times[j]: step j + 1, after step j's print if it printed
        if times[WARM - 1:]:
            print(f"step time {statistics.median(times[WARM - 1:]):.2f} ms (the median of steps 6 to {args.steps})")
        if args.log_in_turns:
            pairs = _turns(times, args.log_in_turns)
            print("the print in turns, a step after a print / after none (ms): "
                  + " ".join(f"{a:.3f}/{b:.3f}" for a, b in pairs))
    if several:
        # the ranks leave together: once, under a loaded CI machine, rank 1 (which prints nothing) was aborted at
        # gloo's teardown (SIGABRT, "terminate called without an active exception") while rank 0 still ran
        dist.barrier()
        dist.destroy_process_group()


def _compiled(module, model, how: str | None):
    """module (the model, or DDP around it) compiled as --compile says."""
    if how is None:
        return module
    if how == "blocks":
        for block in model.h:
            block.compile()
    else:
        module = torch.compile(module)
    # Dynamo reads it where it compiles, at the first step: off, a frame compiled inside DDP's forward is one graph
    torch._dynamo.config.optimize_ddp = how == "split"
    return module


def _prints(step: int, args) -> bool:
    if args.log_every:
        return (step + 1) % args.log_every == 0
    return bool(args.log_in_turns) and step >= WARM and (step - WARM) // args.log_in_turns % 2 == 0


def _turns(times: list[float], n: int) -> list[tuple[float, float]]:
    """Each pair of turns' medians: the steps after a print, the steps after none (the first SETTLING of each
    turn left out). A print waits for the GPU at a step's end, and the GPU then idles at the next step's start."""
    pairs = []
    for start in range(WARM, len(times) - 2 * n + 1, 2 * n):
        after_print = times[start + SETTLING:start + n]
        after_none = times[start + n + SETTLING:start + 2 * n]
        pairs.append((statistics.median(after_print), statistics.median(after_none)))
    return pairs


def _mark(gpu: bool):
    if not gpu:
        return time.perf_counter()
    event = torch.cuda.Event(enable_timing=True)
    event.record()
    return event


def _elapsed_ms(marks: list, gpu: bool) -> list[float]:
    if gpu:
        torch.cuda.synchronize()
        return [a.elapsed_time(b) for a, b in zip(marks, marks[1:])]
    return [(b - a) * 1e3 for a, b in zip(marks, marks[1:])]


if __name__ == "__main__":
    main()
