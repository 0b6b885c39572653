"""The data-parallel training step under each way of wrapping it, side by side in one process group: DDP's options,
torch.compile of DDP split at its buckets or whole, FSDP2's units, each against the same step on every GPU alone.

    python benchmarks/parallel_step.py OUT gpt2:single,ddp,ddp+nobcast+view gpt2:single,fsdp2,fsdp2+units3+keep
    python benchmarks/parallel_step.py OUT llama:single,fsdp2 --host-profile fsdp2 --rounds 8

Each MODEL:VARIANT,VARIANT,... set is one launch of --nproc ranks (roofline.distributed.spawn). Its variants are
built once, warmed up, then timed in rounds, in turns (one order, then the reverse): a step not timed, then
--steps steps. A step's time is the slowest rank's (CUDA events on each rank). Its scaling is a single variant's
step over its own (reference(): the one that compiles, patches, fuses and pins as it does, where the set holds it),
round by round: the median of the rounds' ratios with the sign test's 95% interval (roofline.bench.stats.speedup_ci).
Each compiled variant compiles its own graphs (own_classes). One launch, rounds interleaved: two launches of one
program differed by up to 5 ms a step on the lent machines, more than most of the effects measured here.

The step is examples/ddp_train.py's: bf16 autocast, fused AdamW, SDPA, each rank its own random batch of 8 x 1024
tokens (GPT-2 small) or 4 x 1024 (the Llama-style model of examples/models); on CPUs (gloo), a small GPT-2.

Variants, a strategy and its options joined by "+":
  single          the model alone on each GPU: nothing communicated; every set holds it, the reference
    +compile      torch.compile(model)
    +blocks       each block compiled on its own (block.compile()), the rest eager: under DDP each block's backward
                  is one graph whose gradients reach DDP's buckets as the backward goes, so they are reduced while
                  the blocks below still compute (Dynamo's DDP optimizer off: a block's parameters, over a
                  bucket's 25 MB, would split it)
  ddp             DistributedDataParallel as constructed by default: 25 MB buckets, buffers broadcast each forward
    +nobcast      broadcast_buffers=False (GPT-2's causal mask is a buffer: its broadcast joins the ranks at the
                  start of every forward)
    +view         gradient_as_bucket_view=True: the gradients are views of the buckets, not copied in and out
    +static       static_graph=True
    +bucketN      bucket_cap_mb=N
    +nosync       forward and backward under no_sync(): no gradient reduced (what DDP costs besides that)
    +bf16grads    the gradients all-reduced in bf16 (DDP's bf16_compress_hook): half the bytes
    +compile      torch.compile of the DDP module (as DDP's notes advise: the compiler splits its graph at buckets)
    +onegraph     +compile, with Dynamo's DDP optimizer off (optimize_ddp=False): one graph, its gradients reduced
                  when its backward returns them all (the ladder's rung "one compiled graph under DDP"); DDP around
                  torch.compile(model) is split as +compile is, since DDP's forward runs the compiled model
    +pyreducer    forward and backward compiled as one function, with compiled autograd tracing the backward and
                  DDP's Python reducer in it (optimize_ddp="python_reducer", torch's experimental mode): each
                  gradient's all-reduce is in the backward graph, which Inductor buckets and orders itself. Its
                  settings hold for the whole launch (set around each step alone, Inductor's graph failed its own
                  stride checks on torch 2.13): its set holds no other DDP variant
    +overlap      with +pyreducer: Inductor reorders the graph's collectives and computation so that they overlap
                  (reorder_for_compute_comm_overlap). DDP built with its Python reducer turns on Inductor's own
                  bucketing of the backward's all-reduces itself (_fuse_ddp_communication, buckets of bucket_cap_mb)
  ddp, fsdp2:
    +ctasN        the wrapper's collectives on an NCCL communicator of their own, at most N CTAs (thread blocks, an
                  SM each) a collective (ProcessGroupNCCL.Options().config.max_ctas, as Megatron sets it per
                  group): fewer SMs taken from the backward that the collectives overlap
    +hiprio       the wrapper's collectives on an NCCL communicator of their own whose CUDA stream has high
                  priority (is_high_priority_stream): the GPU starts a collective's blocks before the compute
                  kernels queued beside it
  any strategy:
    +patch        roofline.patch(model) before it is wrapped (the ladder's rung)
    +lce          the head and loss fused (roofline.ops.linear_cross_entropy, the models' loss="fused": the
                  ladder's rung)
    +pin          while the variant runs, every thread of each rank kept to its own physical cores (whole cores,
                  hyperthread siblings together, split evenly between the host's ranks): do the ranks' hosts slow
                  each other?
  fsdp2           fully_shard on each block, then the model; bf16 parameters, fp32 gradients reduced (the ladder's)
    +unitsK       the blocks in K units of consecutive blocks (roofline.distributed.wrapping.grouped)
    +keep         reshard_after_forward=False: each unit's parameters kept gathered from forward to backward
    +root         fully_shard on the model alone: one all-gather and one reduce-scatter a step
    +fp32         no mixed-precision policy (fp32 parameters gathered, autocast casts them)
    +bf16reduce   gradients reduce-scattered in bf16 (reduce_dtype=bfloat16): half the bytes of the default fp32
    +compile      each block compiled before it is sharded (torchtitan's order)
Writes OUT.json (every step of every round: the slowest rank's, and each rank's) and OUT.md (the table), and
prints the table.
"""

from __future__ import annotations

import argparse
import cProfile
import contextlib
import io
import json
import os
import pstats
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from roofline.bench.stats import median_ci, min_rounds, speedup_ci  # noqa: E402
from roofline.bench.steps import StepTimer  # noqa: E402
from roofline.distributed.wrapping import grouped, layers  # noqa: E402

EVERY = {"patch", "lce", "pin"}   # options of every strategy
NCCL = {"ctas", "hiprio"}   # settings of the communicator a wrapper's collectives run on: only NCCL's
OPTIONS = {"single": {"compile", "blocks"} | EVERY,
           "ddp": {"nobcast", "view", "static", "bucket", "nosync", "bf16grads", "compile", "onegraph", "pyreducer",
                   "blocks", "overlap"}
           | NCCL | EVERY,
           "fsdp2": {"units", "keep", "root", "fp32", "bf16reduce", "compile"} | NCCL | EVERY}
NUMBERED = ("bucket", "units", "ctas")   # options that take a number
COMPILED = {"compile", "onegraph", "pyreducer"}   # options that compile the step (one GPU's: compile)
BLOCKS = "blocks"   # compiles each block alone (one GPU's: blocks)
WARMUP_STEPS = 3   # compiles; DDP rebuilds its buckets in the order of the first backward, static_graph after two


def parse(variant: str) -> tuple[str, dict]:
    """'ddp+nobcast+bucket100' -> ('ddp', {'nobcast': True, 'bucket': 100})."""
    strategy, *parts = variant.split("+")
    if strategy not in OPTIONS:
        raise ValueError(f"variant {variant!r}: the strategy must be one of {', '.join(OPTIONS)}")
    options = {}
    for part in parts:
        name = part.rstrip("0123456789")
        number = part[len(name):]
        if name not in OPTIONS[strategy] or (number != "") != (name in NUMBERED) or number.startswith("0"):
            raise ValueError(f"variant {variant!r}: {part!r} is not an option of {strategy} "
                             f"({', '.join(sorted(OPTIONS[strategy]))}; {', '.join(NUMBERED)} take a positive "
                             "number)")
        options[name] = int(number) if number else True
    if "overlap" in options and "pyreducer" not in options:
        raise ValueError(f"variant {variant!r}: overlap reorders the Python reducer's collectives, in the compiled "
                         "backward: add +pyreducer")
    return strategy, options


def model_and_batch(model_name: str, device: torch.device):
    from examples.models.gpt2 import GPT2, GPT2Config
    from examples.models.llama import Llama, LlamaConfig

    if device.type == "cpu":   # a dry run over gloo
        return GPT2(GPT2Config(vocab_size=96, max_seq=64, n_layer=4, n_head=2, d_model=32)), (2, 16)
    if model_name == "gpt2":
        return GPT2(GPT2Config(attention="sdpa")), (8, 1024)
    return Llama(LlamaConfig()), (4, 1024)


def build(model_name: str, variant: str, device: torch.device):
    """(what a step calls: forward and backward of a batch, returning the loss; the model under it; the context a
    step runs in; batch shape)."""
    strategy, options = parse(variant)
    torch.manual_seed(0)
    with device:
        model, shape = model_and_batch(model_name, device)
    if options.get("lce"):
        model.config.loss = "fused"
    if options.get("patch"):
        import roofline

        roofline.patch(model)
    if (COMPILED | {BLOCKS}) & set(options):
        own_classes(model, variant)
    if options.get(BLOCKS):
        for block in layers(model):
            block.compile()
    ids = [device.index] if device.type == "cuda" else None
    if strategy == "single":
        return (forward_backward(torch.compile(model) if options.get("compile") else model), model,
                contextlib.nullcontext, shape)
    if strategy == "ddp":
        if options.get("pyreducer"):   # read by DDP when it is built (its C++ reducer left out), by Dynamo at compile
            torch._dynamo.config.optimize_ddp = "python_reducer"
            torch._dynamo.config.compiled_autograd = True
            torch._inductor.config.reorder_for_compute_comm_overlap = bool(options.get("overlap"))
        ddp = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=ids, process_group=communicator(options),
            broadcast_buffers=not options.get("nobcast"),
            gradient_as_bucket_view=bool(options.get("view")), static_graph=bool(options.get("static")),
            bucket_cap_mb=options.get("bucket", 25))
        if options.get("bf16grads"):
            from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import bf16_compress_hook

            ddp.register_comm_hook(None, bf16_compress_hook)
        def context():   # Dynamo reads optimize_ddp where it compiles: at the first steps, and at any recompile
            stack = contextlib.ExitStack()
            if options.get("nosync"):
                stack.enter_context(ddp.no_sync())
            if options.get("onegraph") or options.get(BLOCKS):
                stack.enter_context(torch._dynamo.config.patch(optimize_ddp=False))
            return stack
        if options.get("pyreducer"):   # compiled autograd compiles a backward called inside a compiled function
            return torch.compile(forward_backward(ddp)), model, context, shape
        compiled = options.get("compile") or options.get("onegraph")
        return forward_backward(torch.compile(ddp) if compiled else ddp), model, context, shape
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy() if options.get("fp32") or device.type == "cpu" else \
        MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                             reduce_dtype=torch.bfloat16 if options.get("bf16reduce") else torch.float32)
    group = communicator(options)
    mesh = {"mesh": DeviceMesh.from_group(group, device.type)} if group is not None else {}
    blocks = layers(model)
    if options.get("compile"):
        for block in blocks:
            block.compile()
    if not options.get("root"):
        for unit in grouped(blocks, options.get("units", len(blocks))):
            fully_shard(unit if len(unit) > 1 else unit[0], mp_policy=policy,
                        reshard_after_forward=not options.get("keep"), **mesh)
    return forward_backward(fully_shard(model, mp_policy=policy, **mesh)), model, contextlib.nullcontext, shape


def forward_backward(module):
    """A step's work on a batch of token ids: the module's loss (the model's own, targets the inputs), and its
    backward."""
    def run(idx):
        loss = module(idx, targets=idx)[1]
        loss.backward()
        return loss
    return run


def communicator(options: dict):
    """The process group a wrapper's collectives run on: the default one, or with +ctasN / +hiprio a new NCCL
    group of every rank with those settings (each rank builds the variants in the same order, as new_group asks)."""
    if not NCCL & set(options):
        return None
    settings = dist.ProcessGroupNCCL.Options(is_high_priority_stream=bool(options.get("hiprio")))
    if "ctas" in options:
        settings.config.max_ctas = options["ctas"]
    return dist.new_group(backend="nccl", pg_options=settings)


_CLASSES: dict[tuple[type, str], type] = {}


def own_classes(model: torch.nn.Module, variant: str) -> None:
    """Each module of the model's own code (not torch's) made an instance of a subclass of its class for this
    variant alone. Dynamo keeps its compiled frames by code object, and its guards on a module check its class: the
    variants of one launch would otherwise share the first compiled variant's graphs. Compiled around DDP after the
    model had been compiled alone, a frame's cached graph passed its guards and ran without DDP's bucket splitting
    (warm-ups of 0.1-0.4 s on the H100s, against 33 s)."""
    for module in model.modules():
        cls = type(module)
        if cls.__module__.startswith("torch."):
            continue
        key = (cls, variant)
        if key not in _CLASSES:
            _CLASSES[key] = type(cls.__name__, (cls,), {"__qualname__": f"{cls.__qualname__}[{variant}]"})
        module.__class__ = _CLASSES[key]


def stepper(model_name: str, variant: str, device: torch.device, generator: torch.Generator):
    run, model, context, (batch, seq) = build(model_name, variant, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=device.type == "cuda")

    def step():
        idx = torch.randint(0, model.config.vocab_size, (batch, seq), device=device, generator=generator)
        with context(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            run(idx)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def physical_cores(cpus) -> dict[tuple, list[int]]:
    """`cpus` (logical CPUs) grouped by physical core, (package, core id): hyperthread siblings together."""
    cores: dict[tuple, list[int]] = {}
    for cpu in sorted(cpus):
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            key = (int((base / "physical_package_id").read_text()), int((base / "core_id").read_text()))
        except OSError:
            key = (0, cpu)
        cores.setdefault(key, []).append(cpu)
    return cores


def own_cores(local_rank: int, local_ranks: int) -> set[int]:
    """The cores a rank keeps to under +pin: the host's physical cores (physical_cores) in `local_ranks` even runs,
    this rank's run."""
    cores = physical_cores(os.sched_getaffinity(0))
    ordered = [cores[key] for key in sorted(cores)]
    per_rank = max(len(ordered) // local_ranks, 1)
    mine = ordered[local_rank * per_rank:(local_rank + 1) * per_rank] or ordered
    return {cpu for core in mine for cpu in core}


@contextlib.contextmanager
def pinned(cores: set[int] | None):
    """Every thread of this process (the autograd engine's and NCCL's too) kept to `cores` for the block."""
    if cores is None:
        yield
        return
    threads = lambda: [int(tid) for tid in os.listdir("/proc/self/task")]  # noqa: E731
    own = os.sched_getaffinity(0)
    before = {}
    for tid in threads():
        with contextlib.suppress(OSError):   # a thread that ended meanwhile
            before[tid] = os.sched_getaffinity(tid)   # NCCL's threads keep to their GPU's cores: put back as they were
            os.sched_setaffinity(tid, cores)
    try:
        yield
    finally:
        for tid in threads():   # those started meanwhile inherited `cores`: they get this thread's own
            with contextlib.suppress(OSError):
                os.sched_setaffinity(tid, before.get(tid, own))


def measure_set(model_name: str, variants: list[str], rounds: int, steps: int, host_profile: list[str]) -> dict:
    """On each rank (in the process group): every variant built and warmed up, then timed in rounds, in turns.
    Returns this rank's step times, per variant a list of rounds."""
    rank = dist.get_rank()
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    generator = torch.Generator(device).manual_seed(rank)
    cores = own_cores(int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    # each compiled variant adds an entry to the same frames' caches (own_classes): past the limit Dynamo would run
    # the later ones eager, silently
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 2 * len(variants))
    pin = {v: cores if parse(v)[1].get("pin") else None for v in variants}
    steps_of, warmup_s, syncs = {}, {}, {}
    for variant in variants:
        steps_of[variant] = stepper(model_name, variant, device, generator)
        start = time.perf_counter()
        for _ in range(WARMUP_STEPS):
            steps_of[variant]()
        _wait(device)
        warmup_s[variant] = time.perf_counter() - start
        syncs[variant] = synchronizations(steps_of[variant]) if device.type == "cuda" else []
    times = {variant: [] for variant in variants}
    for round_ in range(rounds):
        for variant in (variants if round_ % 2 == 0 else variants[::-1]):
            with pinned(pin[variant]):
                steps_of[variant]()   # not timed: the caches and memory the last variant left
                timer = StepTimer(device)
                timer.mark()
                for _ in range(steps):
                    steps_of[variant]()
                    timer.mark()
                times[variant].append(timer.samples_ms())
    profiles = {}
    for variant in host_profile:
        profiler = cProfile.Profile()
        _wait(device)
        profiler.enable()
        for _ in range(10):
            steps_of[variant]()
        _wait(device)
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(25)
        profiles[variant] = text.getvalue()
    return {"rank": rank, "times": times, "warmup_s": warmup_s, "syncs": syncs, "host_profiles": profiles,
            "cores": sorted(cores), "host_cpus": len(os.sched_getaffinity(0))}


def _wait(device: torch.device) -> None:
    """The host waits for the GPU's work so far (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize()


def synchronizations(step) -> list[str]:
    """Where one step made the host wait for the GPU (torch's sync debug mode warns at each): file:line."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            step()
        torch.cuda.synchronize()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]


def summarize(ranks: list[dict], variants: list[str]) -> dict:
    """Per variant: the slowest rank's step, step by step; its median and interval; scaling against its
    reference (reference()), round by round."""
    slowest = {v: [[max(per_rank) for per_rank in zip(*(r["times"][v][i] for r in ranks))]
                   for i in range(len(ranks[0]["times"][v]))] for v in variants}
    out = {}
    for variant in variants:
        flat = [t for round_ in slowest[variant] for t in round_]
        low, median, high = median_ci(flat)
        row = {"median_ms": median, "low_ms": low, "high_ms": high, "rounds_ms": slowest[variant],
               "warmup_s": max(r["warmup_s"][variant] for r in ranks), "syncs": ranks[0]["syncs"][variant]}
        base_name = reference(variant, variants)
        if base_name is not None:
            row["reference"] = base_name
            base = [t for round_ in slowest[base_name] for t in round_]
            sizes = [len(round_) for round_ in slowest[variant]]
            speed = speedup_ci(base, flat, rounds=(sizes, sizes))
            row.update(scaling=speed.ratio, scaling_low=speed.low, scaling_high=speed.high)
        out[variant] = row
    return out


def reference(variant: str, variants: list[str]) -> str | None:
    """What a variant's scaling is measured against: the single variant of the set with the same options that
    apply to one GPU (compiled where it compiles, one graph or split; patched, fused loss, pinned alike), else plain
    single; None for the single variants themselves."""
    strategy, options = parse(variant)
    if strategy == "single":
        return None
    wanted = {"compile" if name in COMPILED else name for name in options} & OPTIONS["single"]
    # the single variant doing most of what this one does and nothing else; compiling counts most (a compiled
    # variant against the eager model says little): ddp+compile+pin, without single+compile+pin, is held against
    # single+compile
    fits = [v for v in variants if parse(v)[0] == "single" and set(parse(v)[1]) <= wanted]
    return max(fits, key=lambda v: (("compile" in parse(v)[1]) == ("compile" in wanted), len(parse(v)[1])),
               default="single")


def table(sets: list[dict]) -> str:
    lines = ["| model | variant | step ms (95% CI) | scaling (95% CI) | against | warm-up s | host syncs |",
             "|---|---|---|---|---|---|---|"]
    for each in sets:
        for variant, row in each["variants"].items():
            scaling = f"{row['scaling']:.3f} ({row['scaling_low']:.3f}-{row['scaling_high']:.3f})" \
                if "scaling" in row else ""
            lines.append(f"| {each['model']} | {variant} | {row['median_ms']:.2f} ({row['low_ms']:.2f}-"
                         f"{row['high_ms']:.2f}) | {scaling} | {row.get('reference', '')} | {row['warmup_s']:.1f} | "
                         f"{len(row['syncs'])} |")
    return "\n".join(lines)


def main() -> None:
    from roofline.distributed import spawn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="OUT.json and OUT.md are written")
    parser.add_argument("sets", nargs="+", metavar="MODEL:VARIANT,VARIANT,...")
    parser.add_argument("--nproc", type=int, default=max(torch.cuda.device_count(), 2))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6, help="timed steps a variant a round")
    parser.add_argument("--host-profile", nargs="*", default=[], metavar="VARIANT",
                        help="rank 0's host profile (cProfile) of 10 steps of these, after the rounds")
    args = parser.parse_args()
    if args.rounds < min_rounds(0.95):
        parser.error(f"--rounds: at least {min_rounds(0.95)}, for the sign test's 95% interval over rounds")
    plans = []
    for item in args.sets:
        model_name, _, names = item.partition(":")
        variants = names.split(",")
        if model_name not in ("gpt2", "llama") or not names:
            parser.error(f"{item!r}: MODEL:VARIANT,... with MODEL gpt2 or llama")
        for variant in variants:
            try:
                nccl = NCCL & set(parse(variant)[1])
            except ValueError as exc:
                parser.error(str(exc))
            if nccl and not torch.cuda.is_available():
                parser.error(f"variant {variant!r}: {', '.join(sorted(nccl))} set NCCL's communicator, and without "
                             "GPUs the ranks talk over gloo")
        if "single" not in variants:
            parser.error(f"{item!r}: every set needs the single variant, the reference of its scaling")
        ddp = [v for v in variants if parse(v)[0] == "ddp"]
        if any("pyreducer" in parse(v)[1] for v in ddp) and len(ddp) > 1:
            parser.error(f"{item!r}: +pyreducer sets torch's settings for its whole launch, and DDP reads them: "
                         f"{', '.join(v for v in ddp if 'pyreducer' not in parse(v)[1])} would run with its Python "
                         "reducer; give it a set without other DDP variants")
        plans.append((model_name, variants))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sets = []
    for model_name, variants in plans:
        print(f"--- {model_name}: {', '.join(variants)} on {args.nproc} ranks", flush=True)
        started = time.perf_counter()
        try:
            ranks = spawn(measure_set, args.nproc, model_name, variants, args.rounds, args.steps,
                          [v for v in args.host_profile if v in variants], timeout_s=900.0)
        except Exception as exc:   # the next set still runs
            print(f"failed: {type(exc).__name__}: {exc}", flush=True)
            sets.append({"model": model_name, "variants": {}, "error": f"{type(exc).__name__}: {exc}"})
            continue
        one = {"model": model_name, "nproc": args.nproc, "seconds": time.perf_counter() - started,
               "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU (gloo)",
               "variants": summarize(ranks, variants), "host_profiles": ranks[0]["host_profiles"],
               "cores_under_pin": [r["cores"] for r in ranks],
               "ranks_ms": [r["times"] for r in ranks]}
        sets.append(one)
        print(table([one]), flush=True)
        for variant, text in one["host_profiles"].items():
            print(f"--- rank 0's host profile, {variant} (10 steps)\n{text}", flush=True)
        args.out.with_suffix(".json").write_text(json.dumps(sets, indent=1))   # after each set: a cut call keeps it
    header = (f"{args.nproc} ranks of {sets[0].get('device', '?')}, torch {torch.__version__}, {args.rounds} rounds "
              f"of {args.steps} steps a variant, in turns; median of every step (the slowest rank's) with its 95% "
              f"interval; scaling: median over rounds of the reference's step over the variant's, sign-test interval\n\n")
    args.out.with_suffix(".md").write_text(header + table(sets) + "\n")


if __name__ == "__main__":
    main()
