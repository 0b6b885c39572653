"""The optimization ladder, climbed on the user's own training step: each rung one known change, applied on top of
the ones before, timed and checked against the fp32 baseline's loss.

    task = TrainTask("gpt2", model=lambda: GPT2(GPT2Config()), batch=make_batch,
                     loss=lambda model, batch: model(*batch)[1])
    result = roofline.ladder.run(task)        # or: roofline ladder examples/ladder_tasks.py:gpt2
    print_table(result)

Training rungs: fp32 baseline, TF32, bf16 autocast, fused optimizer, roofline.patch, the LM head fused with its loss
(roofline.ops.linear_cross_entropy), torch.compile, torch.compile max-autotune, CUDA graphs. A rung that cannot apply
(TF32 and CUDA graphs without a GPU; the fused head where the task says not how to switch its model to it) is
listed as skipped with the reason. Every rung builds the model afresh from the same seed, runs `warmup` steps (compilation, capture,
patch's routing measurements), then times `steps` steps by CUDA events (the median and the sign test's 95%
interval); its loss after `check_steps` steps (for CUDA graphs, whose first steps run in the capture, the first
step after it outside the capture) is held against the baseline's at that step within the rung's tolerance, and
a rung that breaks numerics is marked, not hidden.
"""

from __future__ import annotations

import gc
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable

import torch

from roofline import generation_ladder
from roofline.bench.stats import median_ci
from roofline.bench.steps import CAPTURE_WARMUP, StepTimer, capture
from roofline.generation_ladder import GenerateConfig, GenerateTask, check_counts
from roofline.ladder_results import LadderResult, RungResult  # noqa: F401  (roofline.ladder.RungResult, as before)

# the loss after check_steps steps may differ from fp32's by this much, relatively, at each precision
LOSS_TOLERANCE = {"fp32": 1e-3, "tf32": 1e-2, "bf16": 3e-2}


@dataclass
class TrainTask:
    """A training step to climb the ladder with. model() builds the model (the runner seeds torch and sets the
    device first); batch(device) gives the step's inputs (the same every step, so that a CUDA graph can replay
    it); loss(model, batch) computes the loss to backpropagate."""
    name: str
    model: Callable[[], torch.nn.Module]
    batch: Callable[[torch.device], tuple]
    loss: Callable[[torch.nn.Module, tuple], torch.Tensor]
    lr: float = 3e-4
    warmup: int = 3
    steps: int = 20
    check_steps: int = 3
    skip: tuple[str, ...] = ()        # rungs this task leaves out (by name)
    # switches a model built by model() to roofline.ops.linear_cross_entropy for its LM head and loss; None: the
    # task has no LM head to fuse (that rung is skipped)
    fuse_head_loss: Callable[[torch.nn.Module], None] | None = None
    rungs: tuple = ()                 # the task's own rungs (task_rung), after the built-in ones

    def __post_init__(self):
        check_counts(self, ("warmup", "steps", "check_steps"), timed="steps")
        if self.check_steps > self.warmup + self.steps:
            raise ValueError(f"check_steps ({self.check_steps}) must not exceed warmup + steps "
                             f"({self.warmup + self.steps})")


@dataclass(frozen=True)
class Config:
    """How a rung runs the step: all the changes up to it."""
    precision: str = "fp32"         # fp32, tf32 or bf16 (autocast)
    fused_optimizer: bool = False
    patch: bool = False
    fused_head_loss: bool = False
    compile: str | None = None      # None, "default" or "max-autotune"
    graphs: bool = False
    changes: tuple[str, ...] = ()   # the task's own rungs applied (by name)
    parallel: str | None = None     # on several ranks: "ddp" or "fsdp2" (roofline.distributed.wrapping)
    fsdp2_groups: int | None = None  # FSDP2's units of layers, kept gathered (None: a unit a layer, resharded;
                                     # 1: the model one unit, fully_shard on it alone)
    reduce_bf16: bool = False       # FSDP2's gradients reduce-scattered in bf16 (MixedPrecisionPolicy's reduce_dtype)
    bucket_view: bool = False       # DDP's gradients as views of its buckets (gradient_as_bucket_view)
    one_graph: bool = False         # DDP compiled as one graph, not split at its buckets (optimize_ddp=False)


@dataclass(frozen=True)
class Rung:
    name: str
    change: str                     # the lines a user writes for it
    apply: Callable[[Config], Config]
    needs_cuda: bool = False
    needs_task: str | None = None   # the TrainTask field the rung needs set
    model_change: Callable[[torch.nn.Module], None] | None = None   # a task's rung: what it does to the model
    before: str | None = None       # a task's rung: the built-in rung it is climbed before (None: after them all)
    # why the rung cannot go on top of the rungs before it (the config they built), or None where it can
    refused: Callable[[Config], str | None] = lambda config: None


def task_rung(name: str, change: str, model_change: Callable[[torch.nn.Module], None], before: str | None = None,
              needs_cuda: bool = False) -> Rung:
    """A rung of the task's own (TrainTask.rungs, GenerateTask.rungs): model_change(model) changes the model built
    for it and for every rung after it, in place; `change` is the lines a user writes for it. It is climbed before
    the built-in rung named `before`, or after them all."""
    return Rung(name, change, lambda c: replace(c, changes=(*c.changes, name)), needs_cuda=needs_cuda,
                model_change=model_change, before=before)


def ladder_rungs(task) -> tuple[Rung, ...]:
    """The rungs `task` climbs: the built-in ones of its kind, with the task's own placed where they ask."""
    built_in = GENERATION_RUNGS if isinstance(task, GenerateTask) else TRAINING_RUNGS
    names = {r.name for r in built_in}
    for r in task.rungs:
        if r.before is not None and r.before not in names:
            raise ValueError(f"task rung {r.name!r}: no built-in rung named {r.before!r} to go before")
    ordered = []
    for rung in built_in:
        ordered += [r for r in task.rungs if r.before == rung.name] + [rung]
    return (*ordered, *(r for r in task.rungs if r.before is None))


TRAINING_RUNGS = (
    Rung("fp32 baseline", "(as written)", lambda c: c),
    Rung("TF32", "torch.set_float32_matmul_precision('high')", lambda c: replace(c, precision="tf32"),
         needs_cuda=True),
    Rung("bf16 autocast", "with torch.autocast(device_type, dtype=torch.bfloat16): loss = ...",
         lambda c: replace(c, precision="bf16")),
    Rung("fused optimizer", "torch.optim.AdamW(params, fused=True)", lambda c: replace(c, fused_optimizer=True)),
    Rung("roofline.patch", "roofline.patch(model)", lambda c: replace(c, patch=True)),
    Rung("fused linear + cross-entropy",
         "loss = roofline.ops.linear_cross_entropy(hidden, lm_head.weight, targets)",
         lambda c: replace(c, fused_head_loss=True), needs_task="fuse_head_loss"),
    Rung("torch.compile", "model = torch.compile(model)", lambda c: replace(c, compile="default")),
    Rung("compile max-autotune", "model = torch.compile(model, mode='max-autotune')",
         lambda c: replace(c, compile="max-autotune"), needs_cuda=True,
         refused=lambda c: "not climbed on several ranks: its CUDA graphs would hold the collectives of DDP or "
                           "FSDP2" if c.parallel else None),
    Rung("CUDA graphs", "step = capture(step)  # the whole step replayed as one graph (roofline.bench.steps)",
         lambda c: replace(c, graphs=True), needs_cuda=True,
         refused=lambda c: "not climbed on several ranks: a captured step would hold the collectives of DDP or "
                           "FSDP2" if c.parallel else "torch.compile's max-autotune mode replays CUDA graphs itself "
                           "(its cudagraph trees cannot be captured again)" if c.compile == "max-autotune" else None),
)
GENERATION_RUNGS = (   # cumulative too; int8 weight-only turns graphs off (int8 eager follows CUDA graphs)
    Rung("bf16 eager", "(as written: bf16 weights, a static KV cache, one token a step)", lambda c: c),
    Rung("CUDA graphs", "each decode step captured and replayed: roofline.decoding.Steps(model, 1, graphs=True)",
         lambda c: replace(c, graphs=True), needs_cuda=True),
    Rung("int8 weight-only", "roofline.quantize_int8_weight_only(model)  # eager again",
         lambda c: replace(c, int8=True, graphs=False)),
    Rung("int8 + CUDA graphs", "both", lambda c: replace(c, int8=True, graphs=True), needs_cuda=True),
    Rung("speculative decoding", "tokens, stats = roofline.decoding.speculative(steps, draft_steps, prompt, n, k)",
         lambda c: replace(c, speculative=True), needs_task="draft"),
)


def _step_fn(task: TrainTask, config: Config, device: torch.device, changes: dict):
    """The model, and one training step (returning the loss, detached) as the config runs it; changes: the task's
    rungs' model changes by name."""
    import roofline

    torch.manual_seed(0)
    with torch.device(device):
        model = task.model()
    if config.fused_head_loss:
        task.fuse_head_loss(model)
    if config.patch:
        roofline.patch(model)
    for name in config.changes:
        changes[name](model)
    if config.parallel:
        from roofline.distributed.wrapping import wrap

        if config.compile is not None:
            # a rung compiles as a program of its own would: Dynamo's guards pass for this rung's model, of the
            # same classes as the last rung's, and its graph would run again, compiled with or without DDP's
            # bucket splitting as that rung was
            torch._dynamo.reset()
        forward = wrap(model, config.parallel, device, bf16=config.precision == "bf16", compile_mode=config.compile,
                       groups=config.fsdp2_groups, bucket_view=config.bucket_view, reduce_bf16=config.reduce_bf16)
    else:
        forward = model if config.compile is None else torch.compile(
            model, mode=None if config.compile == "default" else config.compile)
    kind = {"fused": True} if config.fused_optimizer else {"foreach": device.type == "cuda"}
    optimizer = torch.optim.AdamW(model.parameters(), lr=task.lr, capturable=config.graphs, **kind)
    batch = task.batch(device)
    autocast = config.precision == "bf16"

    def step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast, cache_enabled=not config.graphs):
            loss = task.loss(forward, batch)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step


def _climb_one(task: TrainTask, rung: Rung, config: Config, device: torch.device, changes: dict) -> RungResult:
    result = RungResult(rung.name, rung.change, asdict(config), "ok",
                        tolerance=LOSS_TOLERANCE[config.precision])
    previous_precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high" if config.precision == "tf32" else "highest")
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    # Dynamo reads it when it compiles a frame (at the first steps, and at any recompile): for the whole rung
    split = torch._dynamo.config.optimize_ddp if config.one_graph else None
    if config.one_graph:
        torch._dynamo.config.optimize_ddp = False
    try:
        step = _step_fn(task, config, device, changes)
        losses = []
        start = time.perf_counter()
        if config.graphs:
            run = capture(step)   # its warm-up steps change the weights as steps do: counted as steps
            losses += [None] * CAPTURE_WARMUP
        else:
            run = step
        while len(losses) < task.warmup:
            losses.append(run().clone())
        if device.type == "cuda":
            torch.cuda.synchronize()
            result.warmup_peak_gib = torch.cuda.max_memory_allocated() / 2**30
            torch.cuda.reset_peak_memory_stats()
        result.warmup_s = time.perf_counter() - start
        timer = StepTimer(device)
        timer.mark()
        for _ in range(task.steps):
            losses.append(run().clone())
            timer.mark()
        result.samples_ms = timer.samples_ms()
        result.low_ms, result.median_ms, result.high_ms = median_ci(result.samples_ms)
        if device.type == "cuda":
            result.peak_gib = torch.cuda.max_memory_allocated() / 2**30
        result.losses = [None if x is None else float(x) for x in losses]
    except Exception as exc:   # a rung that fails to build or run is reported, and the ladder goes on
        if config.parallel:   # ... but not on one rank of several: the others would wait for it at a collective
            raise RuntimeError(f"rung {rung.name!r} failed: {type(exc).__name__}: {exc}") from exc
        result.status, result.reason = "failed", f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        torch.set_float32_matmul_precision(previous_precision)
        if config.one_graph:
            torch._dynamo.config.optimize_ddp = split
    return result


def run(task: TrainTask | GenerateTask, device=None, rungs=None, progress: Callable | None = None,
        parallel: str | None = None) -> LadderResult:
    """Climb the ladder on `task`: a training step's rungs (TRAINING_RUNGS), each change on top of the ones before
    it, or a generation's (GENERATION_RUNGS). parallel: this process is one rank of several, each rung's model
    wrapped in "ddp" or "fsdp2" (roofline.distributed.ladder runs the ranks and puts their results together)."""
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    generating = isinstance(task, GenerateTask)
    if rungs is None:
        rungs = ladder_rungs(task)
    changes = {r.name: r.model_change for r in rungs if r.model_change is not None}
    if parallel and generating:
        raise ValueError("parallel: a generation ladder runs on one GPU")
    config, results = GenerateConfig() if generating else Config(parallel=parallel), []
    for rung in rungs:
        if rung.name in task.skip:
            results.append(RungResult(rung.name, rung.change, asdict(config), "skipped", "left out by the task"))
            continue
        if rung.needs_cuda and device.type != "cuda":
            results.append(RungResult(rung.name, rung.change, asdict(config), "skipped", "needs a CUDA device"))
            continue
        if rung.needs_task and getattr(task, rung.needs_task) is None:
            results.append(RungResult(rung.name, rung.change, asdict(config), "skipped",
                                      f"the task gives no {rung.needs_task}"))
            continue
        refused = rung.refused(config)
        if refused:
            results.append(RungResult(rung.name, rung.change, asdict(config), "skipped", refused))
            continue
        config = rung.apply(config)
        if progress:
            progress(rung)
        if generating:
            reference = next((r.generations for r in results if r.median_ms is not None), None)
            results.append(generation_ladder.climb_one(task, rung, config, device, changes, reference))
        else:
            results.append(_climb_one(task, rung, config, device, changes))
    if generating:
        generation_ladder.compare(results, task.check_tokens, task.agreement)
    else:   # on several ranks the loss is held against one GPU's (distributed.ladder.scale)
        compare(results, None if parallel else task.check_steps)
    return LadderResult(task.name, str(device), results, "generate" if generating else "train",
                        parallel=parallel)


def compare(results: list[RungResult], check_steps: int | None) -> None:
    """Speedups over the rung before and over the baseline; with check_steps, each loss against the baseline's."""
    timed = [r for r in results if r.median_ms is not None]
    if not timed:
        return
    base = timed[0]
    for before, r in zip([None] + timed[:-1], timed):
        r.vs_baseline = base.median_ms / r.median_ms
        r.vs_previous = before.median_ms / r.median_ms if before else None
        if check_steps is None:
            continue
        # the check_steps-th step, or the first after it that both ran outside a capture
        step = next((i for i in range(check_steps - 1, min(len(r.losses), len(base.losses)))
                     if r.losses[i] is not None and base.losses[i] is not None), None)
        if step is None:
            r.reason = "loss not checked: no step after the check's ran outside a CUDA graph's capture"
            continue
        r.loss, r.loss_step = r.losses[step], step + 1
        r.loss_error = abs(r.loss - base.losses[step]) / max(abs(base.losses[step]), 1e-12)
        if r.loss_error > r.tolerance:
            r.status = "numerics"


def _columns(result: LadderResult) -> tuple[str, ...]:
    if result.kind == "generate":
        return ("ms/token (95% CI)", "tokens/s", "vs before", "vs baseline", "held GiB", "set-up s",
                "tokens = baseline's", "agreement", "guesses kept (k); draft's tokens")
    if result.ranks > 1:
        unit = "GPU" if "cpu" not in result.device else "rank"   # gloo processes on CPUs: a rank is no GPU
        return ("ms/step (95% CI)", "vs before", "vs baseline", f"tokens/s/{unit}", "scaling", "MFU", "peak GiB/rank",
                "warm-up s", "loss", f"vs one {unit}")
    return ("ms/step (95% CI)", "vs before", "vs baseline", "peak GiB", "warm-up s", "loss", "numerics")


def _cells(result: LadderResult, r: RungResult, rich: bool) -> list[str]:
    """A timed rung's cells under _columns(result)."""
    def red(text):
        return f"[red]{text}[/red]" if rich else text

    common = [f"{r.median_ms:,.3f} ({r.low_ms:,.3f}-{r.high_ms:,.3f})" if result.kind == "generate"
              else f"{r.median_ms:,.2f} ({r.low_ms:,.2f}-{r.high_ms:,.2f})"]
    speedups = [f"{r.vs_previous:.2f}x" if r.vs_previous else "", f"{r.vs_baseline:.2f}x"]
    memory = [f"{r.peak_gib:.2f}" if r.peak_gib is not None else "", f"{r.warmup_s:.1f}"]
    if result.kind == "generate":
        matched = f"{r.tokens_matched} of {len(r.tokens)}" if r.tokens_matched is not None else ""
        accepted = f"{r.acceptance:.0%} (k={r.draft_k}); {r.draft_share:.0%} of tokens" \
            if r.acceptance is not None else ""
        agreement = f"{r.agreement:.1%}" if r.agreement is not None else ""
        return [*common, f"{r.tokens_per_s:,.0f}", *speedups, *memory, matched,
                agreement if r.status == "ok" else red(agreement), accepted]
    if result.ranks > 1:
        speedups += [f"{r.tokens_per_s:,.0f}" if r.tokens_per_s else "", f"{r.scaling:.2f}" if r.scaling else "",
                     f"{r.mfu:.1%}" if r.mfu is not None else ""]
    if r.loss is None:
        return [*common, *speedups, *memory, "", r.reason or ""]
    numerics = "ok" + (f" ({r.loss_error:.1e} <= {r.tolerance:.0e})" if r.loss_error is not None else "") \
        if r.status == "ok" else red(f"off by {r.loss_error:.1e}")
    return [*common, *speedups, *memory, f"{r.loss:.4f} (step {r.loss_step})", numerics]


# Short headers where the table is too wide for the terminal (roofline.tables); the rest fold.
_SHORT = {"ms/step (95% CI)": "ms/step", "ms/token (95% CI)": "ms/token", "vs before": "vs prev",
          "vs baseline": "vs base", "warm-up s": "warm s", "tokens = baseline's": "same tokens",
          "tokens/s/GPU": "tok/s/GPU", "peak GiB/rank": "peak GiB", "vs one GPU": "vs 1 GPU",
          "tokens/s/rank": "tok/s/rank", "vs one rank": "vs 1 rank"}


def print_table(result: LadderResult, console=None, changes: bool = True) -> None:
    from rich.console import Console

    from roofline.tables import Column, Row, show

    console = console or Console()
    headers = _columns(result)
    columns = [Column("rung", justify="left", fold=True)] + [
        Column(h, _SHORT.get(h), justify="left" if h == headers[-1] else "right",
               fold=h in (headers[0], headers[-1], "loss", "agreement")) for h in headers]
    rows = [Row([r.rung, *[""] * (len(headers) - 1), f"[dim]{r.status}: {r.reason}[/dim]"]) if r.median_ms is None
            else Row([r.rung, *_cells(result, r, rich=True)]) for r in result.rungs]
    show(console, f"ladder: {result.task}" + (f", {result.parallel}" if result.parallel else "")
         + f" on {result.device}", columns, rows)
    if not changes:
        return
    console.print("each rung's change, on top of the ones above it:")
    for r in result.rungs:
        console.print(f"  {r.rung}: [cyan]{r.change}[/cyan]", highlight=False)


def markdown(result: LadderResult) -> str:
    columns = ("rung", "change", *_columns(result), "status")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in result.rungs:
        if r.median_ms is None:
            cells = [""] * len(_columns(result)) + [f"{r.status}: {r.reason}"]
        else:
            cells = [*_cells(result, r, rich=False), r.status]
        lines.append(f"| {r.rung} | `{r.change}` | " + " | ".join(cells) + " |")
    for r in result.rungs:
        if r.k_sweep_ms:
            kept = r.k_sweep_acceptance or {}
            lines.append(f"\n{r.rung}, each k timed once (ms a token, guesses kept): " + "; ".join(
                f"k={k}: {ms:.3f}" + (f", {kept[k]:.0%}" if k in kept else "") for k, ms in r.k_sweep_ms.items()))
    return "\n".join(lines) + "\n"


def waterfall(result: LadderResult, path) -> str:
    """A waterfall of the step time each rung removed (matplotlib, written to `path`): the baseline's bar, a
    floating bar per timed rung from the time before it to its own (green where it removed time, red where it
    added some), and the last rung's time; a rung whose loss broke numerics is hatched. Returns the path."""
    import matplotlib

    matplotlib.use("Agg")   # files only: never needs a display
    import matplotlib.pyplot as plt

    timed = [r for r in result.rungs if r.median_ms is not None]
    if not timed:
        raise ValueError("no rung was timed: nothing to plot")
    fig, ax = plt.subplots(figsize=(1.2 * len(timed) + 2.5, 4.5))
    names, before = [], None
    for i, r in enumerate(timed):
        names.append(r.rung)
        if before is None:
            ax.bar(i, r.median_ms, color="#7f7f7f")
            ax.text(i, r.median_ms, f"{r.median_ms:.1f} ms", ha="center", va="bottom", fontsize=8)
        else:
            low, high = sorted((before, r.median_ms))
            ax.bar(i, high - low, bottom=low, color="#2ca02c" if r.median_ms <= before else "#d62728",
                   hatch="//" if r.status == "numerics" else None)
            ax.text(i, high, f"{before / r.median_ms:.2f}x", ha="center", va="bottom", fontsize=8)
        before = r.median_ms
    last = timed[-1]
    ax.bar(len(timed), last.median_ms, color="#1f77b4")
    ax.text(len(timed), last.median_ms, f"{last.median_ms:.1f} ms\n{timed[0].median_ms / last.median_ms:.2f}x",
            ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(timed) + 1), [*names, "result"], rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("ms per token (median)" if result.kind == "generate" else "ms per training step (median)")
    ax.set_title(f"ladder: {result.task}" + (f", {result.parallel}" if result.parallel else "")
                 + f" on {result.device}", fontsize=10)
    ax.margins(y=0.12)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return str(path)
