"""Training on several GPUs of one host, measured: the ladder under DDP and FSDP2, and roofline profile's
communication figures against the step time they claim.

    python benchmarks/distributed.py OUT_DIR ladder --task gpt2 [--parallel ddp fsdp2] [--skip RUNG ...]
    python benchmarks/distributed.py OUT_DIR profile [--nproc 2] [--rounds 9]
    python benchmarks/distributed.py OUT_DIR fsdp2-advice [--repeats 3]
    python benchmarks/distributed.py OUT_DIR sync-advice [--rounds 9]

ladder: `roofline ladder --nproc-per-node N examples/ladder_tasks.py:TASK` (GPT-2 small or the Llama-style model,
their full sizes): every rung on one GPU, then on N ranks; tokens/s per GPU, scaling efficiency, MFU, peak memory
per rank, the loss against one GPU's. Writes OUT_DIR/ladder-TASK.md and .json.

profile: examples/ddp_train.py (GPT-2 small, bf16, DDP, 8 x 1024 tokens a rank):
  - timed unprofiled in one launch of N ranks, in turns (benchmarks/parallel_step.py, `--rounds` rounds): its step
    on each GPU alone (no DDP: nothing to communicate), under DDP, and under DDP with larger buckets; the step time
    the ranks add over one GPU, round by round, with the sign test's 95% interval, is what their communication
    costs the step (separate launches of one program moved by up to 5 ms a step on the lent machines);
  - profiled on N ranks (`roofline profile --nproc-per-node N --json`): each rank's exposed communication a step,
    held against that added time (issue 37's target: within 0.7-1.4x), and its profiled step against the
    unprofiled one (the profiler may stretch a step by 1.2x at most);
  - profiled again with rank 1 sleeping 20 ms after each step: is the straggler named, with its line?
  - profiled under FSDP2 (--fsdp2): its all-gathers' and reduce-scatters' transfer times and bus bandwidth;
  - profiled with kernels and launches alone (--no-ops, on GPUs): each rank's stretch beside the first profile's,
    and the share of GPU time on exact lines;
  - timed with DDP's buckets of 100 MB against its default 25 MB (in the same turns): what the exposed-communication
    finding's larger buckets gain.
Writes OUT_DIR/profile-ranks.md and .json.

fsdp2-advice: the fsdp2-hooks finding's estimate against its advice applied: examples/ddp_train.py under FSDP2 (a
unit a block) profiled (`roofline profile --nproc-per-node N --json`), and timed unprofiled a unit a block and with
the blocks in 4 groups kept gathered (--fsdp2-groups 4), `--repeats` times each, in turns; the finding's gain
against the difference of the medians. Writes OUT_DIR/fsdp2-advice.md and .json.

sync-advice: the host-sync findings' estimate against their advice applied: examples/ddp_train.py with rank 0
printing its loss every step (--log-every 1: loss.item(), a host sync on one rank) profiled; and unprofiled, in one
run, rank 0 printing in turns of TURN steps, printing then not (--log-in-turns), `--rounds` pairs of turns: what a
print costs the step after it, the median over the pairs with the sign test's 95% interval (separate runs moved
by 26-37 ms on one machine, where the print costs about 1 ms); the finding's gain (none where it estimates under
1% of a step) against it. Writes OUT_DIR/sync-advice.md and .json.

recording: what recording costs a rank's step: the same DDP GPT-2 step on N ranks, plain and under each way of
recording it (torch.profiler with CUDA activity only, with CPU and CUDA activity, roofline.profile() and it
without shapes, lines or modules), in rounds; each rank's median step (CUDA events between steps). Then the
cost of what profile leaves on outside its window (NCCL timing each collective, its flight recorder keeping them:
distributed.ledger), in launches of their own, plain and with it, in turns. Writes
OUT_DIR/recording.md and .json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from unittest import mock

import torch

from roofline.bench.stats import median_ci, min_rounds

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = str(ROOT / "examples" / "ddp_train.py")
STEPS = 30
TURN = 6   # sync-advice: steps a turn of printing, and of not
SLOW_MS = 20.0
LARGER_BUCKETS_MB = 100   # the exposed-communication finding's first advice, against DDP's default 25 MB
NO_REDUCTION = "ddp+nosync"   # DDP with every gradient's reduction left out: what it costs the same ranks


def ladder(out: Path, task: str, nproc: int, parallel: list[str], skip: list[str]) -> None:
    from roofline.distributed import ladder as ranks_ladder

    result = ranks_ladder.run(f"{ROOT}/examples/ladder_tasks.py:{task}", nproc, tuple(parallel), skip=tuple(skip))
    ranks_ladder.print_tables(result)
    header = (f"`roofline ladder --nproc-per-node {nproc} examples/ladder_tasks.py:{task}` on {_machine(nproc)}, "
              f"torch {torch.__version__}; a step's model FLOPs {result.flops / 1e12:.3g} TFLOP, {result.tokens} "
              f"tokens a GPU; MFU against {result.peak_tflops} TFLOP/s (dense bf16)\n\n")
    (out / f"ladder-{task}.md").write_text(header + ranks_ladder.markdown(result))
    (out / f"ladder-{task}.json").write_text(json.dumps(result.to_dict(), indent=1))


def _machine(nproc: int) -> str:
    if not torch.cuda.is_available():
        return f"{nproc} CPU processes (gloo)"
    return f"{nproc} x {torch.cuda.get_device_name(0)}, NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}"


def _ms(value) -> str:
    return "" if value is None else f"{value:.2f}"


def _train(nproc: int, *args: str) -> float:
    """examples/ddp_train.py's median step time (ms): on one GPU without DDP, or on nproc ranks by torchrun."""
    return float(_example(nproc, r"step time ([\d.]+) ms", "--steps", str(STEPS), *args).group(1))


def _example(nproc: int, said: str, *args: str) -> re.Match:
    """examples/ddp_train.py run with args, on one GPU (nproc 1: no DDP) or on nproc ranks by torchrun: where its
    output matches the pattern `said`."""
    launch = [sys.executable, EXAMPLE] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), EXAMPLE]
    done = subprocess.run([*launch, *args], capture_output=True, text=True, timeout=600)
    found = re.search(said, done.stdout, re.MULTILINE)
    if done.returncode or not found:
        raise RuntimeError(f"{' '.join(launch)} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return found


def _profile(nproc: int, json_path: Path, *args: str, options: tuple = ()) -> dict:
    """The profile's merged report of examples/ddp_train.py with `args` (`options`: roofline profile's own),
    with rank 0's totals beside it ("totals")."""
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", "--nproc-per-node", str(nproc), "--skip", "8",
                           "--steps", "10", *options, "--json", str(json_path), EXAMPLE, "--steps", "20", *args],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "120"})
    (json_path.with_suffix(".txt")).write_text(done.stdout + done.stderr)
    if done.returncode:
        raise RuntimeError(f"roofline profile failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    report = json.loads(json_path.read_text())
    return {**report["ranks"], "totals": report["totals"]}


def _in_turns(out: Path, nproc: int, rounds: int) -> dict:
    """benchmarks/parallel_step.py's set of examples/ddp_train.py's step alone on each GPU, under DDP, under DDP
    with no gradient reduced (no_sync: the ranks still meet at each forward's buffer broadcast), and under DDP with
    larger buckets, timed in one launch, in turns: its variants' summaries (each round's steps, the slowest
    rank's). DDP against no_sync is what the reduction costs, a lag that comes with it included."""
    stem = out / "profile-turns"
    variants = f"gpt2:single,ddp,{NO_REDUCTION},ddp+bucket{LARGER_BUCKETS_MB}"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "parallel_step.py"), str(stem), variants,
                           "--nproc", str(nproc), "--rounds", str(rounds)], capture_output=True, text=True,
                          timeout=900)
    if done.returncode:
        raise RuntimeError(f"parallel_step.py {variants} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return json.loads(stem.with_suffix(".json").read_text())[0]["variants"]


def added_ms(turns: dict, variant: str, over: str = "single") -> tuple[float, float, float]:
    """(low, median, high): the step time `variant` adds over `over` (the step alone on each GPU), round by round
    (each round's median step against the same round's of `over`), with the sign test's 95% interval."""
    rounds = zip(turns[variant]["rounds_ms"], turns[over]["rounds_ms"])
    return median_ci([statistics.median(many) - statistics.median(one) for many, one in rounds])


def profile(out: Path, nproc: int, rounds: int) -> None:
    turns = _in_turns(out, nproc, rounds)
    one, many = turns["single"]["median_ms"], turns["ddp"]["median_ms"]
    added_low, added, added_high = added_ms(turns, "ddp")
    reduction_low, reduction, reduction_high = added_ms(turns, "ddp", over=NO_REDUCTION)
    ranks = _profile(nproc, out / "profile-ranks.json")
    slow = _profile(nproc, out / "profile-straggler.json", "--slow-rank", "1", "--slow-ms", str(SLOW_MS))
    fsdp = _profile(nproc, out / "profile-fsdp2.json", "--fsdp2")
    # kernels and launches alone: on a GPU only
    bare = _profile(nproc, out / "profile-noops.json", options=("--no-ops",)) if torch.cuda.is_available() else None
    larger = f"ddp+bucket{LARGER_BUCKETS_MB}"
    bucket_added = added_ms(turns, larger)
    lines = [f"examples/ddp_train.py (GPT-2 small, bf16 autocast, fused AdamW, SDPA, 8 x 1024 tokens a rank) on "
             f"{_machine(nproc)}, torch {torch.__version__}", "",
             f"Unprofiled, in one launch, {rounds} rounds in turns (benchmarks/parallel_step.py; every step the "
             f"slowest rank's): each GPU alone, no DDP, {one:.2f} ms; {nproc} ranks under DDP {many:.2f} ms (every step's "
             f"median); the ranks add {added:.2f} ms a step (each round's median less its own alone, the median over "
             f"rounds, 95% interval {added_low:.2f}-{added_high:.2f}); scaling "
             f"{turns['ddp']['scaling']:.3f} ({turns['ddp']['scaling_low']:.3f}-{turns['ddp']['scaling_high']:.3f}).",
             "",
             "| rank | unrecorded step ms (profile) | recorded step ms | stretch | compute ms | comm ms | "
             "exposed ms, recorded | not computing ms, unrecorded |", "|---|---|---|---|---|---|---|---|"]
    for r in ranks["ranks"]:
        lines.append(f"| {r['rank']} | {_ms(r['unprofiled_ms'])} | {r['step_ms']:.2f} | {r['step_ms'] / many:.2f}x "
                     f"vs the steps in turns | {r['compute_ms']:.2f} | {r['comm_ms']:.2f} | {r['exposed_ms']:.2f} | "
                     f"{_ms(r['not_computing_ms'])} |")
    found = {f["id"]: f for f in ranks["findings"]}
    exposed = found.get("exposed-communication")
    ratio = exposed["gain_ms"] / added if exposed and added > 0 else None
    # the ratio's interval from the added time's: the estimate is one profile's figure
    span = (exposed["gain_ms"] / added_high, exposed["gain_ms"] / added_low) if ratio and added_low > 0 else None
    lines += ["", "Findings: " + ("; ".join(f"{f['title']} ({f['gain_ms']:.2f} ms, {f['where']})"
                                            for f in ranks["findings"]) or "none"), "",
              "The exposed-communication finding's estimate against the time the ranks add: "
              + (f"{exposed['gain_ms']:.2f} ms against {added:.2f} ms, {ratio:.2f}x"
                 + (f" ({span[0]:.2f}-{span[1]:.2f}x over the added time's interval)" if span else "")
                 + f" ({'within' if 0.7 <= ratio <= 1.4 else 'OUTSIDE'} 0.7-1.4x)" if ratio else "no finding"), "",
              "Against what the gradients' reduction costs the same ranks (DDP against DDP under no_sync(), in the "
              "same turns: the reduction and whatever comes with it, such as a rank that falls behind only while "
              f"DDP reduces): {reduction:.2f} ms (95% interval {reduction_low:.2f}-{reduction_high:.2f})"
              + (f", the estimate {exposed['gain_ms'] / reduction:.2f}x of it" if exposed and reduction > 0 else "")
              + ".", ""]
    timed = ranks.get("unrecorded")
    lines += ["Outside the window, NCCL's timing (distributed.ledger): " + (
        f"{timed['calls']} calls of {timed['steps']} steps; a step's comm " + ", ".join(map(_ms, timed["comm_ms"]))
        + " ms, waits " + ", ".join(map(_ms, timed["waits_ms"])) + " ms, held back by each rank "
        + ", ".join(map(_ms, timed["held_ms"])) + " ms (rank by rank)" if timed else "none (no call timed)"), "",
              "Without a planted straggler: " + ("no straggler named" if "straggler" not in found else
                                                 f"{found['straggler']['title']}, {found['straggler']['gain_ms']:.2f} "
                                                 "ms a step (none was planted: the machine's own, or a false "
                                                 "finding)"), ""]
    s = slow.get("straggler")
    slow_gain = next((f["gain_ms"] for f in slow["findings"] if f["id"] == "straggler"), None)
    named = bool(s and s["rank"] == 1 and s["where"] and "ddp_train.py" in s["where"] and slow_gain)
    lines += [f"Planted straggler (rank 1 sleeps {SLOW_MS:g} ms after each step): "
              + (f"named rank {s['rank']} at {s['where']}, the others waited {s['waited_ms']:.2f} ms a step "
                 f"recorded, {_ms(s.get('held_ms'))} ms unrecorded (NCCL's timing); the finding's gain "
                 f"{_ms(slow_gain)} ms" if s else "NOT found")
              + f" ({'right' if named else 'WRONG'}).", "",
              "FSDP2 (the same model, each block sharded): its collectives, a rank's calls a step, the median "
              "call's transfer time and bus bandwidth (unrecorded where NCCL timed them):", "",
              "| collective | bytes | calls | us a call | busbw GB/s | timed outside the window |", "|---|---|---|---|---|---|",
              *(f"| {c['kind']} | {c['bytes']} | {c['calls']:g} | {c['call_us']:.0f} | {_ms(c['busbw_gbps'])} | "
                f"{'yes' if c.get('unrecorded') else 'no'} |" for c in fsdp["collectives"]), "",
              *_stretch_lines([("every op", ranks), ("--no-ops", bare)]),
              f"DDP's buckets of {LARGER_BUCKETS_MB} MB against its default 25 MB, unprofiled, in the same turns: "
              f"{turns[larger]['median_ms']:.2f} against {many:.2f} ms a step; they add {bucket_added[1]:.2f} ms over "
              f"each GPU alone (95% interval {bucket_added[0]:.2f}-{bucket_added[2]:.2f}).", ""]
    (out / "profile-ranks.md").write_text("\n".join(lines))
    (out / "profile-ranks-summary.json").write_text(json.dumps(
        {"turns": turns, "added_ms": [added_low, added, added_high],
         "reduction_ms": [reduction_low, reduction, reduction_high], "estimate_ratio": ratio,
         "estimate_ratio_interval": span, "ranks": ranks["ranks"], "findings": ranks["findings"], "unrecorded": timed,
         "straggler": s, "straggler_named": named, "false_straggler": "straggler" in found,
         "larger_buckets_added_ms": list(bucket_added),
         "no_ops": {"ranks": bare["ranks"], "totals": bare["totals"]} if bare else None}, indent=1))
    print("\n".join(lines))


def _stretch_lines(reports: list[tuple[str, dict | None]]) -> list[str]:
    """Each recording's stretch of every rank's step (its own report's: the recorded step over the unrecorded one),
    and the share of rank 0's GPU time its report ties to exact lines."""
    rows = [f"| {name} | {', '.join(_x(r['stretch']) for r in report['ranks'])} | "
            f"{report['totals']['exact_share']:.1%} |" for name, report in reports if report is not None]
    return ["Each recording, a launch of its own: its stretch of each rank's step, as the rank's report says it (the "
            "target: 1.2x at most), and rank 0's GPU time on exact lines:", "",
            "| recording | stretch, rank by rank | rank 0's GPU time on exact lines |", "|---|---|---|", *rows, ""]


def _x(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def fsdp2_advice(out: Path, nproc: int, repeats: int) -> None:
    per_block, grouped = [], []
    for _ in range(repeats):   # in turns: a drift of the machine moves both
        per_block.append(_train(nproc, "--fsdp2"))
        grouped.append(_train(nproc, "--fsdp2", "--fsdp2-groups", "4"))
    measured = statistics.median(per_block) - statistics.median(grouped)
    ranks = _profile(nproc, out / "profile-fsdp2-hooks.json", "--fsdp2")
    finding = next((f for f in ranks["findings"] if f["id"] == "fsdp2-hooks"), None)
    ratio = finding["gain_ms"] / measured if finding and measured > 0 else None
    lines = [f"examples/ddp_train.py --fsdp2 (GPT-2 small, bf16, 8 x 1024 tokens a rank) on {_machine(nproc)}, torch "
             f"{torch.__version__}", "",
             f"Unprofiled, {repeats} runs each in turns (a run's step: the median of steps 6 to {STEPS}): a unit a "
             f"block {statistics.median(per_block):.2f} ms ({', '.join(f'{t:.2f}' for t in per_block)}); 4 groups kept "
             f"gathered {statistics.median(grouped):.2f} ms ({', '.join(f'{t:.2f}' for t in grouped)}): the advice "
             f"gains {measured:.2f} ms a step.", "",
             "| rank | FSDP2 units | hooks ms a step, recorded | recorded step ms | unrecorded step ms | "
             "not computing ms, unrecorded |", "|---|---|---|---|---|---|",
             *(f"| {r['rank']} | {r['fsdp2_units']} | {r['fsdp2_hooks_ms']:.2f} | {r['step_ms']:.2f} | "
               f"{_ms(r['unprofiled_ms'])} | {_ms(r['not_computing_ms'])} |" for r in ranks["ranks"]), "",
             "The fsdp2-hooks finding: " + (f"{finding['title']}, estimated gain {finding['gain_ms']:.2f} ms against "
                                            f"{measured:.2f} ms measured"
                                            + (f", {ratio:.2f}x" if ratio else "") if finding else "NOT found"), ""]
    (out / "fsdp2-advice.md").write_text("\n".join(lines))
    (out / "fsdp2-advice.json").write_text(json.dumps(
        {"per_block_ms": per_block, "grouped_ms": grouped, "measured_gain_ms": measured, "finding": finding,
         "estimate_ratio": ratio, "ranks": ranks["ranks"]}, indent=1))
    print("\n".join(lines))


def _print_in_turns(nproc: int, rounds: int) -> list[tuple[float, float]]:
    """examples/ddp_train.py --log-in-turns TURN on nproc ranks: each pair of turns' median step after a print and
    after none (ms)."""
    found = _example(nproc, r"the print in turns.*?: ([\d./ ]+)$", "--log-in-turns", str(TURN),
                     "--steps", str(5 + 2 * TURN * rounds + 1))   # a turn's last print shows in the step after
    return [tuple(map(float, pair.split("/"))) for pair in found.group(1).split()]


def sync_advice(out: Path, nproc: int, rounds: int) -> None:
    pairs = _print_in_turns(nproc, rounds)
    low, measured, high = median_ci([a - b for a, b in pairs])
    after_print, after_none = (statistics.median(side) for side in zip(*pairs))
    ranks = _profile(nproc, out / "profile-sync.json", "--log-every", "1")
    finding = next((f for f in ranks["findings"] if f["id"].startswith("host-sync")), None)
    rows = [x for x in ranks["host_syncs"] if "ddp_train.py" in x["where"]]
    lines = [f"examples/ddp_train.py --log-every 1 (rank 0 prints its loss each step; GPT-2 small, bf16, DDP, 8 x 1024 "
             f"tokens a rank) on {_machine(nproc)}, torch {torch.__version__}", "",
             f"Unprofiled, one run, rank 0 printing in turns of {TURN} steps, printing then not, {len(pairs)} pairs "
             f"of turns (the first 2 steps of a turn left out): a step after a print {after_print:.2f} ms, after "
             f"none {after_none:.2f} ms; the print costs {measured:.2f} ms a step (95% interval {low:.2f} to "
             f"{high:.2f}; the pairs' differences: {', '.join(f'{a - b:.2f}' for a, b in pairs)}).", "",
             "| line | call | ranks | calls a step | host wait ms | GPU idle it costs ms |", "|---|---|---|---|---|---|",
             *(f"| {x['where']} | {x['call']} | {', '.join(map(str, x['ranks']))} | {x['calls']:g} | "
               f"{', '.join(map(_ms, x['wait_ms']))} | {', '.join(map(_ms, x['gain_ms']))} |" for x in rows), "",
             "The host-sync finding: " + (f"{finding['title']}, estimated gain {finding['gain_ms']:.2f} ms against "
                                          f"{measured:.2f} ms measured" if finding else
                                          f"none (its estimate under 1% of a step) against {measured:.2f} ms "
                                          "measured"), ""]
    (out / "sync-advice.md").write_text("\n".join(lines))
    (out / "sync-advice.json").write_text(json.dumps(
        {"pairs_ms": pairs, "measured_gain_ms": measured, "interval_ms": [low, high], "finding": finding,
         "host_syncs": rows, "ranks": ranks["ranks"]}, indent=1))
    print("\n".join(lines))


def _recorders() -> dict:
    import contextlib

    import roofline
    from recorders import torch_profiler

    return {"plain": contextlib.nullcontext, "torch.profiler CUDA only": torch_profiler("CUDA"),
            "torch.profiler CPU+CUDA": torch_profiler("CPU", "CUDA"),
            "torch.profiler CPU+CUDA, shapes": torch_profiler("CPU", "CUDA", record_shapes=True),
            "roofline.profile()": roofline.profile, "roofline, shapes=False": lambda: roofline.profile(shapes=False),
            "roofline, lines=False": lambda: roofline.profile(lines=False),
            "roofline, modules=False": lambda: roofline.profile(modules=False)}


def recorded_steps(rounds: int, steps: int, only: list[str] | None = None) -> dict:
    """On each rank: examples/ddp_train.py's step (GPT-2 small, DDP, bf16, fused AdamW, 8 x 1024 tokens), `steps`
    steps plain and under each recorder (or those named in `only`), in `rounds` rounds; {recorder: [median step
    ms of each round]}."""
    sys.path.insert(0, str(ROOT))
    from examples.models.gpt2 import GPT2, GPT2Config

    device = torch.device("cuda", torch.cuda.current_device())
    torch.manual_seed(0)
    with device:
        model = GPT2(GPT2Config())
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index])
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=3e-4, fused=True)
    idx = torch.randint(0, model.config.vocab_size, (8, 1024), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = ddp(idx, targets=idx)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for _ in range(5):
        step()
    from recorders import median_step_ms, recorded

    recorders = {k: v for k, v in _recorders().items() if only is None or k in only}
    out = {"ms": {k: [] for k in recorders}, "kernels": {k: [] for k in recorders}}
    for _ in range(rounds):
        for name, recorder in recorders.items():
            ms, kernels = recorded(recorder, lambda: median_step_ms(step, steps, device))
            out["ms"][name].append(ms)
            out["kernels"][name].append(kernels)
    return out


LEDGER_TURNS = 3   # launches of each, in turns: two launches of one program differ by several ms a step here


def recording(out: Path, nproc: int, rounds: int = 3, steps: int = 10) -> None:
    from roofline.distributed import ledger, spawn

    ranks = spawn(recorded_steps, nproc, rounds, steps)
    plain = max(statistics.median(r["ms"]["plain"]) for r in ranks)
    lines = [f"What recording costs a step: DDP GPT-2 small (bf16, 8 x 1024 tokens a rank) on {_machine(nproc)}; "
             f"{steps} steps a recording, {rounds} rounds; each rank's median over rounds of its median step", "",
             "| recording | " + " | ".join(f"rank {i} ms" for i in range(nproc))
             + " | slowest vs plain | kernels recorded (fewest of any rank's recordings) |",
             "|---|" + "---|" * (nproc + 2)]
    for name in ranks[0]["ms"]:
        medians = [statistics.median(r["ms"][name]) for r in ranks]
        counts = [n for r in ranks for n in r["kernels"][name] if n is not None]
        lines.append(f"| {name} | " + " | ".join(f"{m:.2f}" for m in medians) + f" | {max(medians) / plain:.2f}x | "
                     + (f"{min(counts):,}" if counts else "") + " |")
    # What roofline profile leaves on outside its window: NCCL timing each call, its flight recorder keeping them.
    # A process group reads them when it is made: launches of their own, plain and with them in turns.
    turns: dict[str, list[float]] = {"plain": [], "calls timed by NCCL (profile's ledger)": []}
    for _ in range(LEDGER_TURNS):
        for name, settings in zip(turns, ({}, ledger.ENV)):
            with mock.patch.dict(os.environ, settings):   # restored after, added names removed
                launched = spawn(recorded_steps, nproc, 1, steps, ["plain"])
            turns[name].append(max(statistics.median(r["ms"]["plain"]) for r in launched))
    ratios = [b / a for a, b in zip(*turns.values())]
    lines += ["", f"Launches of their own, in turns ({LEDGER_TURNS} each; the slowest rank's median step, ms): "
              + "; ".join(f"{name} {', '.join(f'{t:.2f}' for t in times)}" for name, times in turns.items())
              + f". The ledger against plain, turn by turn: {', '.join(f'{r:.3f}x' for r in ratios)} (median "
              f"{statistics.median(ratios):.3f}x)."]
    (out / "recording.md").write_text("\n".join(lines) + "\n")
    (out / "recording.json").write_text(json.dumps({"ranks": ranks, "ledger_turns": turns}, indent=1))
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("what", choices=("ladder", "profile", "fsdp2-advice", "sync-advice", "recording"))
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count(), help="ranks (on CPUs, ladder and "
                        "profile run gloo processes: a dry run of the small models; recording needs GPUs)")
    parser.add_argument("--task", default="gpt2", choices=("gpt2", "llama"))
    parser.add_argument("--parallel", nargs="+", default=["ddp", "fsdp2"])
    parser.add_argument("--skip", nargs="*", default=[], help="rungs to leave out, by name")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=9, help="sync-advice: pairs of turns; profile: rounds of its "
                        "steps in turns (6 at least: the 95%% interval needs them)")
    args = parser.parse_args()
    if args.what in ("sync-advice", "profile") and args.rounds < min_rounds(0.95):
        parser.error(f"--rounds: at least {min_rounds(0.95)}, for a 95% interval")
    if args.nproc < 2:
        parser.error("--nproc: 2 ranks at least (default: the GPUs here)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "ladder":
        ladder(args.out, args.task, args.nproc, args.parallel, args.skip)
    elif args.what == "recording":
        recording(args.out, args.nproc)
    elif args.what == "fsdp2-advice":
        fsdp2_advice(args.out, args.nproc, args.repeats)
    elif args.what == "sync-advice":
        sync_advice(args.out, args.nproc, args.rounds)
    else:
        profile(args.out, args.nproc, args.rounds)


if __name__ == "__main__":
    main()
