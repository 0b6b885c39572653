"""The ladder on several GPUs: `roofline ladder --nproc-per-node N FILE:TASK`.

    result = run("examples/ladder_tasks.py:gpt2", nproc=2)     # DDP, then FSDP2
    print_tables(result)

The task's training step is climbed on one GPU first (the reference, in a process of its own), then on N ranks
under each strategy (roofline.distributed.wrapping: DDP, then FSDP2), rung by rung as roofline.ladder climbs it,
less the rungs that would capture collectives in CUDA graphs (on one GPU too). Every rank trains on the task's batch, the same on
each, so that the data-parallel step computes the one-GPU step's gradients: each rung's loss is held against the
one-GPU run's at the same rung and step, which checks the gradients' reduction as well as the rung.

For each rung on N ranks:
  - the step time is the slowest rank's, step by step (a data-parallel step ends when its last rank does), with
    the median and 95% interval over the timed steps;
  - tokens/s per GPU, where the batch's first tensor holds token ids, and the scaling efficiency: the one-GPU step
    time over this one (each GPU processes the one-GPU run's batch, so this is tokens/s per GPU against one GPU's);
  - MFU: the step's model FLOPs (torch.utils.flop_counter, counted once on the step as written, forward and
    backward) a second on each GPU, over the GPU's dense bf16 peak from its datasheet;
  - the peak memory of the rank that held most.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
from dataclasses import dataclass, field

import torch

from roofline.bench.stats import median_ci
from roofline.distributed.launch import RankFailed, spawn
from roofline.distributed.wrapping import FSDP2_GROUPS, STRATEGIES
from roofline.ladder_results import LadderResult

COLLECTIVE_TIMEOUT_S = 1800.0   # a rung's warm-up compiles on every rank; one rank may wait at a collective that long
FEWER_UNITS = "fewer FSDP2 units"
ONE_UNIT = "FSDP2 as one unit"
BF16_REDUCE = "FSDP2 gradients reduced in bf16"
BUCKET_VIEWS = "gradients as DDP's buckets"
ONE_GRAPH = "one compiled graph under DDP"
OWN_RUNGS = (FEWER_UNITS, ONE_UNIT, BF16_REDUCE, BUCKET_VIEWS, ONE_GRAPH)   # climbed on ranks only, by one strategy


def _own_rungs(strategy: str) -> list:
    """The strategy's own rungs, climbed after the rungs both strategies climb. They change how the ranks share the
    work, not the step's math: on one GPU each is the last rung before them.
    FSDP2: the layers sharded in FSDP2_GROUPS units, each kept gathered from its forward to its backward; then the
    model as one unit (one all-gather and one reduce-scatter a step, its parameters gathered for the whole step:
    DDP's memory for them, FSDP2's for the gradients and the optimizer's state); then, under bf16, the gradients
    reduce-scattered in bf16, half the bytes of fp32 (they are computed in the parameters' bf16: the reduction adds
    its own rounding). On two H200s, the Llama-style model's step scaled best as one unit reducing in bf16
    (benchmarks/results/h200x2-distributed.md, "FSDP2 in fewer units").
    DDP: each gradient a view of its bucket, so the backward writes it where the all-reduce reads it: no copy into
    the bucket and back. Beside the default in the same process, DDP's GPT-2 step was faster with it on two H100s
    (benchmarks/results/h100x2-distributed.md, "Side by side"). Then, where the step is compiled, one graph:
    under DDP, torch.compile splits the model's graph at DDP's buckets (its DDPOptimizer), so that each bucket is
    reduced while the backward goes on; one graph keeps its fusions across them, and reduces every bucket after its
    backward. On two H200s, GPT-2 small's step split at the buckets scaled worse than as one graph
    (benchmarks/results/h200x2-distributed.md, "Compiled DDP" and "Reductions in bf16")."""
    from dataclasses import replace

    from roofline.ladder import Rung

    if strategy == "fsdp2":
        return [Rung(FEWER_UNITS, f"fully_shard(list(blocks[i:j]), reshard_after_forward=False)  # {FSDP2_GROUPS} "
                     "units, not one a block", lambda c: replace(c, fsdp2_groups=FSDP2_GROUPS)),
                Rung(ONE_UNIT, "fully_shard(model)  # alone: no unit a block", lambda c: replace(c, fsdp2_groups=1)),
                Rung(BF16_REDUCE, "MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)",
                     lambda c: replace(c, reduce_bf16=True),
                     refused=lambda c: None if c.precision == "bf16" else "not under bf16: the bf16 autocast rung "
                     "did not run")]
    return [Rung(BUCKET_VIEWS, "DistributedDataParallel(model, gradient_as_bucket_view=True)",
                 lambda c: replace(c, bucket_view=True)),
            Rung(ONE_GRAPH, "torch._dynamo.config.optimize_ddp = False  # not split at DDP's buckets",
                 lambda c: replace(c, one_graph=True),
                 refused=lambda c: None if c.compile else "nothing compiled: the torch.compile rung did not run")]


@dataclass
class ScalingLadder:
    task: str
    ranks: int
    reference: LadderResult                       # the same rungs on one GPU
    ladders: list[LadderResult] = field(default_factory=list)   # one a strategy, on `ranks` ranks
    flops: float | None = None                    # a step's model FLOPs on one GPU's batch
    tokens: int | None = None                     # tokens in that batch
    peak_tflops: float | None = None              # the GPU's dense bf16 peak (datasheet)
    failures: dict = field(default_factory=dict)  # strategy -> what stopped its ranks (RankFailed's message)

    def to_dict(self) -> dict:
        return {"task": self.task, "ranks": self.ranks, "flops": self.flops, "tokens": self.tokens,
                "peak_tflops": self.peak_tflops, "failures": self.failures, "reference": self.reference.to_dict(),
                "ladders": [ladder.to_dict() for ladder in self.ladders]}


def run(target: str, nproc: int, strategies=STRATEGIES, steps: int | None = None, skip=(),
        progress: bool = True) -> ScalingLadder:
    """Climb the ladder of the training task `target` names (FILE.py:TASK or module:TASK) on one GPU, then on
    `nproc` ranks of this host under each of `strategies`. A rank that fails stops the others, and its strategy's
    ladder with them: `failures` says which rank and how, and the next strategy climbs (RankFailed where the
    one-GPU run fails)."""
    if not isinstance(nproc, int) or nproc < 2:
        raise ValueError(f"nproc must be an int of at least 2 (ranks to start), got {nproc!r}")
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise ValueError(f"strategies must be some of {', '.join(STRATEGIES)}, got {list(strategies)!r}")
    options = dict(steps=steps, skip=tuple(skip), progress=progress)
    reference = spawn(climb_rank, 1, target, None, options, timeout_s=COLLECTIVE_TIMEOUT_S)[0]
    result = ScalingLadder(reference["result"].task, nproc, reference["result"], flops=reference["flops"],
                           tokens=reference["tokens"], peak_tflops=reference["peak_tflops"])
    for strategy in strategies:
        try:
            ranks = spawn(climb_rank, nproc, target, strategy, options, timeout_s=COLLECTIVE_TIMEOUT_S)
        except RankFailed as exc:
            result.failures[strategy] = str(exc)
            continue
        ladder = combine([r["result"] for r in ranks], strategy)
        scale(ladder, result)
        result.ladders.append(ladder)
    return result


def climb_rank(target: str, parallel: str | None, options: dict) -> dict:
    """One rank's climb (launch.spawn runs it in each rank's process, in the process group). The one-GPU
    reference (parallel None) also counts the step's FLOPs and tokens."""
    from roofline import device as _device
    from roofline import ladder
    from roofline.targets import load_name

    task = load_name(target, ladder.TrainTask)
    if not isinstance(task, ladder.TrainTask):
        raise ValueError(f"{target}: several ranks climb a training task (roofline.ladder.TrainTask) only")
    task = dataclasses.replace(task, steps=options["steps"] or task.steps, skip=(*task.skip, *options["skip"]))
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    rank = torch.distributed.get_rank()
    label = (f"{parallel} on {torch.distributed.get_world_size()} ranks" if parallel
             else "one GPU" if torch.cuda.is_available() else "one rank")

    def say(rung):
        if options["progress"] and rank == 0:
            print(f"rung: {rung.name} ({label})", file=sys.stderr, flush=True)

    # one GPU climbs the rungs several ranks climb (not those that would capture their collectives; on the ranks
    # they are listed as refused, and why)
    rungs = ladder.ladder_rungs(task)
    if parallel is None:
        rungs = [r for r in rungs if r.refused(ladder.Config(parallel="ddp")) is None]
    else:   # after the last rung that runs on ranks: on top of everything they climb
        last = max(i for i, r in enumerate(rungs) if r.refused(ladder.Config(parallel=parallel)) is None)
        rungs = [*rungs[:last + 1], *_own_rungs(parallel), *rungs[last + 1:]]
    out = {"result": ladder.run(task, device=device, rungs=rungs, progress=say, parallel=parallel)}
    if parallel is None:
        try:
            out["flops"], out["tokens"] = step_flops(task, device)
        except Exception as exc:   # no MFU, not no ladder
            print(f"roofline ladder: the step's FLOPs could not be counted, so no MFU: {type(exc).__name__}: {exc}",
                  file=sys.stderr)
            out["flops"], out["tokens"] = None, None
        sheet = _device.datasheet(torch.cuda.get_device_name(device)) if device.type == "cuda" else None
        out["peak_tflops"] = sheet.matmul_tflops.get("bf16") if sheet else None
    return out


def step_flops(task, device: torch.device) -> tuple[float, int | None]:
    """(FLOPs, tokens) of one training step as the task writes it: its forward and backward counted by
    torch.utils.flop_counter (matmuls and attention; elementwise work is not model FLOPs), and the token ids in its
    batch's first tensor (None where that is not an integer tensor)."""
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    with torch.device(device):
        model = task.model()
    batch = task.batch(device)
    with FlopCounterMode(display=False) as counter:
        task.loss(model, batch).backward()
    del model
    gc.collect()
    first = batch[0] if batch and isinstance(batch[0], torch.Tensor) else None
    tokens = first.numel() if first is not None and not first.is_floating_point() else None
    return float(counter.get_total_flops()), tokens


def combine(ranks: list[LadderResult], strategy: str) -> LadderResult:
    """The ranks' ladders as one: each rung's step times the slowest rank's, step by step (a data-parallel step
    ends when its last rank does; the maximum of the ranks' jitter lifts the median a little above any one
    rank's); its peak memory the largest rank's; its losses rank 0's (every rank trains on the same batch). A rung
    that failed on a rank ended that rank's climb (ladder.run raises on several ranks), so every rung here ran on
    every rank."""
    from roofline import ladder

    rungs = []
    for per_rank in zip(*(r.rungs for r in ranks)):
        # rank 0's rung, less its loss check: scale() holds the loss against one GPU's
        rung = dataclasses.replace(per_rank[0], loss=None, loss_step=None, loss_error=None)
        if rung.median_ms is not None:
            rung.samples_ms = [max(step) for step in zip(*(r.samples_ms for r in per_rank))]
            rung.low_ms, rung.median_ms, rung.high_ms = median_ci(rung.samples_ms)
            rung.peak_gib = max((r.peak_gib for r in per_rank if r.peak_gib is not None), default=None)
            rung.warmup_s = max(r.warmup_s for r in per_rank)
        rungs.append(rung)
    combined = LadderResult(ranks[0].task, f"{len(ranks)} x {ranks[0].device}", rungs, ranks=len(ranks),
                            parallel=strategy)
    ladder.compare(combined.rungs, check_steps=None)
    return combined


def scale(ladder: LadderResult, result: ScalingLadder) -> None:
    """Each rung of a ladder on several ranks against the same rung on one GPU: scaling efficiency, tokens/s per
    GPU, MFU, and its loss against the one-GPU run's at the same step (within the rung's tolerance, or marked)."""
    alone = {r.rung: r for r in result.reference.rungs if r.median_ms is not None}
    before = None   # the last rung one GPU climbed too: a strategy's own rungs are it on one GPU
    for rung in ladder.rungs:
        if rung.median_ms is None:
            continue
        own = rung.rung in OWN_RUNGS
        one = alone.get(before if own else rung.rung)
        before = before if own else rung.rung
        seconds = rung.median_ms / 1e3
        if result.tokens:
            rung.tokens_per_s = result.tokens / seconds
        if result.flops and result.peak_tflops:
            rung.mfu = result.flops / seconds / (result.peak_tflops * 1e12)
        if one is None:
            rung.reason = "not timed on one GPU: no scaling or loss to compare"
            continue
        rung.scaling = one.median_ms / rung.median_ms
        # the step the one-GPU ladder checks (the task's check_steps): later, a model trained on one batch
        # over and over has a loss near zero, whose relative error says nothing
        step = one.loss_step - 1 if one.loss_step else None
        if step is None or step >= len(rung.losses) or rung.losses[step] is None:
            rung.reason = "loss not checked: the one-GPU run checked none at a step both ran"
            continue
        rung.loss, rung.loss_step = rung.losses[step], step + 1
        rung.loss_error = abs(rung.loss - one.losses[step]) / max(abs(one.losses[step]), 1e-12)
        rung.status = "ok" if rung.loss_error <= rung.tolerance else "numerics"


def print_tables(result: ScalingLadder, console=None) -> None:
    from rich.console import Console

    from roofline import ladder

    console = console or Console()
    ladder.print_table(result.reference, console)
    for each in result.ladders:
        ladder.print_table(each, console, changes=False)
    for strategy, why in result.failures.items():
        console.print(f"[red]{strategy} on {result.ranks} ranks stopped:[/red] {why}", highlight=False)
    if result.flops:
        peak = f" of the GPU's dense bf16 peak, {result.peak_tflops:,.0f} TFLOP/s" if result.peak_tflops else ""
        console.print(f"MFU: a step's {result.flops / 1e9:,.4g} GFLOP of model FLOPs (torch.utils.flop_counter) a "
                      f"second on each GPU{peak}; scaling: the one-GPU step time over the rung's (each GPU the "
                      "one-GPU batch); numerics: the loss against the one-GPU run's at the same rung and step",
                      highlight=False)


def markdown(result: ScalingLadder) -> str:
    from roofline import ladder

    parts = [f"### one GPU\n\n{ladder.markdown(result.reference)}"]
    parts += [f"### {each.parallel}, {each.ranks} ranks\n\n{ladder.markdown(each)}" for each in result.ladders]
    parts += [f"### {strategy}, {result.ranks} ranks\n\nstopped: {why}\n" for strategy, why in result.failures.items()]
    return "\n".join(parts)
