"""What recording costs a training step: roofline's profiler against the program alone, part by part.

    python benchmarks/profile_overhead.py OUT_DIR [--workloads launches mlp gpt2] [--rounds 5] [--recorders PART ...]

Three steps: a thousand in-place adds of one element (an op and a launch each, nothing else: the host's cost per op,
launch and line), examples/mlp_train.py's training step (batch x width, 4 layers, bf16 autocast, AdamW), and GPT-2
small's as examples/ddp_train.py runs it on one GPU (bf16 autocast, fused AdamW, SDPA, 8 x 1024 tokens; a two-layer
model on a CPU). Each step runs plain and under each way of recording it, in rounds, one of each a round, so that
drift hits all alike:
- torch.profiler with CPU activity only, CUDA activity only (CUPTI), both, and both with shapes; CUDA activity with
  the CPU's user scopes but none of its ops;
- on a GPU, CUDA activity with roofline's Kineto options, alone, with roofline's line and module hooks running and
  their marks unrecorded, and with the marks kept on the wall clock;
- roofline's line marks alone and its module paths alone, with no profiler;
- roofline.profile() with its defaults, with each of its own parts turned off (shapes, module paths, line marks),
  and all three; on a GPU roofline.profile(ops=False), which records no op, with and without its marks.
A sample is the median step of a recording, by CUDA events between steps where CUDA runs (the step as the program
sees it), else by wall clock; start-up and the trace's export are outside it. Each recording's kernels are counted
(recorders.py: one that asked for CUDA activity and holds none measured nothing); `--recorders` keeps those whose
names hold a given part.

Then the anatomy of one recorded step (from roofline's trace): how many ops, runtime and driver calls, kernels and
marks it holds. Writes profile_overhead.json and .md.
"""

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import statistics
import sys
import tempfile
from collections import Counter
from pathlib import Path
from unittest import mock

import torch
from torch import nn

import roofline
from roofline.bench.stats import median_ci
from roofline.profiler.capture import _LineMarks, _ModulePaths, _experimental_config, _teardown_cupti_at_stop
from roofline.profiler.trace import LINE_MARK, MODULE_MARK

from recorders import median_step_ms, recorded, torch_profiler, trace_events   # (benchmarks/, this script's folder)

ROOT = Path(__file__).resolve().parents[1]
COUNTED = ("cpu_op", "cuda_runtime", "cuda_driver", "kernel", "gpu_memcpy", "gpu_memset")


def _import(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mlp_step(device: str, batch: int, width: int):
    """examples/mlp_train.py's step: (step function, what it is)."""
    torch.manual_seed(0)
    model = _import(ROOT / "examples/mlp_train.py", "mlp_train").build(width, 4).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, target = torch.randn(batch, width, device=device), torch.randn(batch, width, device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            loss = nn.functional.mse_loss(model(x), target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return step, f"examples/mlp_train.py, {batch} x {width}, 4 layers"


def gpt2_step(device: str):
    """GPT-2 small's step as examples/ddp_train.py takes it on one GPU (a two-layer model on a CPU)."""
    sys.path.insert(0, str(ROOT))
    from examples.ddp_train import TINY
    from examples.models.gpt2 import GPT2, GPT2Config

    gpu = device == "cuda"
    torch.manual_seed(0)
    with torch.device(device):
        model = GPT2(GPT2Config() if gpu else GPT2Config(**TINY))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=gpu)
    batch, seq = (8, 1024) if gpu else (2, 16)
    idx = torch.randint(0, model.config.vocab_size, (batch, seq), device=device)

    def step():
        with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
            loss = model(idx, targets=idx)[1]
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    what = "GPT-2 small, 8 x 1024 tokens, bf16 autocast, fused AdamW" if gpu else "GPT-2 two layers, 2 x 16 tokens"
    return step, what


def launches_step(device: str, count: int = 1000):
    """`count` in-place adds on one element: an op, a kernel and a launch each, with nothing else to time."""
    x = torch.zeros(1, device=device)

    def step():
        for _ in range(count):
            x.add_(1)
    return step, f"{count} in-place adds of one element (the host's cost per op and per launch)"


class _UserScopesOnly(torch.autograd.profiler.profile):
    """torch's profiler recording CUDA activity and, on the CPU side, only user scopes (record_function, the
    profiler's steps), none of the ops: what a window that records no op would cost. torch.profiler has no option
    for it; its C++ entry takes the scopes to record."""

    def __init__(self):
        gpu = torch.cuda.is_available()
        super().__init__(use_device="cuda" if gpu else None, use_kineto=True)

    def _start_trace(self):
        self.entered = True
        torch.autograd.profiler._run_on_profiler_start()
        torch.autograd._enable_profiler(self.config(), self.kineto_activities,
                                        {torch._C._profiler.RecordScope.USER_SCOPE})


@contextlib.contextmanager
def _cuda_and_marks(own_clock: bool = False):
    """CUDA activity alone with roofline's Kineto options, and roofline's line and module hooks running: their
    marks unrecorded (no CPU activity), the floor of a window that keeps its own marks instead of recording ops;
    or (own_clock) kept on the wall clock, as roofline.profile(ops=False) keeps them."""
    with torch_profiler("CUDA", experimental_config=_experimental_config())() as recording, \
            _LineMarks(own_clock), _ModulePaths(own_clock):
        yield recording


def _kernels_and_launches():
    """CUDA activity with roofline's Kineto options, its CUPTI kinds cut to kernels and their launches (runtime and
    driver calls): no copies, memsets or CUPTI's own overhead records. torch 2.13 and later take such a filter."""
    launches = ["CONCURRENT_KERNEL", "CUDA_RUNTIME", "CUDA_DRIVER"]
    return torch.profiler.profile(activities=[{torch.profiler.ProfilerActivity.CUDA: launches}],
                                  experimental_config=_experimental_config())


@contextlib.contextmanager
def _per_thread_buffers():
    """CUDA activity with roofline's Kineto options, CUPTI writing each thread's records into buffers of its own
    (Kineto's CUPTI_PER_THREAD_BUFFER_ENABLED, read from the file KINETO_CONFIG names when a recording starts)."""
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "kineto.conf"
        conf.write_text("CUPTI_PER_THREAD_BUFFER_ENABLED=true\n")
        with mock.patch.dict(os.environ, {"KINETO_CONFIG": str(conf)}), \
                torch_profiler("CUDA", experimental_config=_experimental_config())() as recording:
            yield recording


def recorders(gpu: bool) -> dict:
    """{name: a context manager's maker}, plain first."""
    both = ("CPU", "CUDA") if gpu else ("CPU",)
    out = {"plain": contextlib.nullcontext, "torch.profiler, CPU only": torch_profiler("CPU")}
    if gpu:
        out["torch.profiler, CUDA only"] = torch_profiler("CUDA")
        out["torch.profiler, CPU+CUDA"] = torch_profiler(*both)
    out["torch.profiler, CPU+CUDA, shapes" if gpu else "torch.profiler, CPU, shapes"] = torch_profiler(
        *both, record_shapes=True)
    out["torch.profiler, " + ("CUDA and " if gpu else "") + "user scopes, no op"] = _UserScopesOnly
    if gpu:
        # the parts of roofline.profile(ops=False), one at a time
        out["torch.profiler, CUDA only, roofline's Kineto options"] = torch_profiler(
            "CUDA", experimental_config=_experimental_config())
        out["the same, roofline's marks unrecorded"] = _cuda_and_marks
        out["the same, roofline's marks on the wall clock"] = lambda: _cuda_and_marks(True)
        # ways CUPTI might cost a launch less (benchmarks/results/h200-profile-overhead.md: what Kineto turns on)
        if hasattr(torch.profiler.profiler, "_parse_activities"):
            out["the same, kernels and launches alone"] = _kernels_and_launches
        out["the same, per-thread CUPTI buffers"] = _per_thread_buffers
    out["no profiler, roofline's line marks alone (wall clock)"] = lambda: _LineMarks(own_clock=True)
    out["no profiler, roofline's module paths alone (wall clock)"] = lambda: _ModulePaths(own_clock=True)
    out.update({
        "roofline.profile()": lambda: roofline.profile(),
        "roofline, shapes=False": lambda: roofline.profile(shapes=False),
        "roofline, modules=False": lambda: roofline.profile(modules=False),
        "roofline, lines=False": lambda: roofline.profile(lines=False),
        "roofline, none of the three": lambda: roofline.profile(shapes=False, modules=False, lines=False),
    })
    if gpu:
        out["roofline.profile(ops=False)"] = lambda: roofline.profile(ops=False)
        out["roofline.profile(ops=False), lines=False"] = lambda: roofline.profile(ops=False, lines=False)
        out["roofline.profile(ops=False), modules=False"] = lambda: roofline.profile(ops=False, modules=False)
        out["roofline.profile(ops=False), neither"] = lambda: roofline.profile(ops=False, lines=False, modules=False)
    return out


def anatomy(step, steps: int) -> dict:
    """What one recorded step holds, counted in roofline's trace of `steps` steps (after one to warm up)."""
    with roofline.profile(skip=1, active=steps) as prof:
        for _ in range(steps + 1):
            step()
            prof.step()
    events = trace_events(prof.trace_path)
    kinds = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    per_step = {k: v / steps for k, v in kinds.items() if k in COUNTED}
    # roofline's marks are zero-length record functions: torch writes them among the ops
    for prefix, name in ((LINE_MARK, "line marks"), (MODULE_MARK, "module marks")):
        count = sum(e.get("cat") == "cpu_op" and e["name"].startswith(prefix) for e in events)
        per_step[name] = count / steps
        per_step["cpu_op"] -= count / steps
    runtime = Counter(e["name"] for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver"))
    per_step["runtime and driver calls, the most frequent"] = {k: v / steps for k, v in runtime.most_common(8)}
    return per_step


def measure(name: str, step, what: str, steps: int, rounds: int, only: list[str] | None = None) -> dict:
    gpu = torch.cuda.is_available()
    for _ in range(3):   # warm-up: kernels chosen, memory allocated
        step()
    makers = {k: v for k, v in recorders(gpu).items()
              if k == "plain" or not only or any(part in k for part in only)}
    samples = {k: [] for k in makers}
    kernels = {k: [] for k in makers}
    for _ in range(rounds):
        for k, make in makers.items():
            ms, count = recorded(make, lambda: median_step_ms(step, steps, "cuda" if gpu else "cpu"))
            samples[k].append(ms)
            kernels[k].append(count)
    variants = {}
    for k, s in samples.items():
        # each round's sample over plain's in the same round: drift between rounds, large where the host paces
        # the step, cancels; the interval is the sign test's over the rounds (at least 6 for 95%)
        paired = [x / base for x, base in zip(s, samples["plain"])]
        low, ratio, high = median_ci(paired) if rounds >= 6 else (min(paired), statistics.median(paired), max(paired))
        variants[k] = {"ms_per_step": s, "median_ms_per_step": statistics.median(s), "ratios": paired,
                       "ratio": ratio, "ratio_interval": [low, high],
                       "kernels_per_step": None if kernels[k][0] is None else [n / steps for n in kernels[k]]}
    counts = anatomy(step, min(steps, 5))
    return {"workload": name, "what": what, "clock": "CUDA events" if gpu else "wall clock", "steps": steps,
            "rounds": rounds, "variants": variants, "ratio": variants.get("roofline.profile()", {}).get("ratio"),
            "per_step": counts}


def markdown(w: dict) -> str:
    interval = "95% interval" if w["rounds"] >= 6 else "min-max"
    rows = [f"### {w['what']}", "", f"{w['rounds']} rounds of {w['steps']} steps a recording; a sample is a "
            f"recording's median step ({w['clock']}); vs plain: the median of each round's sample over plain's "
            f"in that round, with its {interval} over the rounds.", "",
            f"| recording | median ms/step | min-max ms/step | vs plain | {interval} | kernels recorded a step |",
            "|---|---:|---:|---:|---:|---:|"]
    for name, v in w["variants"].items():
        counts = v["kernels_per_step"]
        held = "" if counts is None else f"{min(counts):,.0f}" + (
            "" if min(counts) == max(counts) else f"-{max(counts):,.0f}")
        rows.append(f"| {name} | {v['median_ms_per_step']:.2f} | {min(v['ms_per_step']):.2f}-"
                    f"{max(v['ms_per_step']):.2f} | {v['ratio']:.2f}x | {v['ratio_interval'][0]:.2f}-"
                    f"{v['ratio_interval'][1]:.2f} | {held} |")
    counts = dict(w["per_step"])
    calls = counts.pop("runtime and driver calls, the most frequent", {})
    rows += ["", "A recorded step holds " + ", ".join(f"{v:,.0f} {k}" for k, v in counts.items())
             + (" (the most frequent calls: " + ", ".join(f"{k} {v:,.0f}" for k, v in calls.items()) + ")"
                if calls else "") + "."]
    return "\n".join(rows) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--workloads", nargs="+", choices=("launches", "mlp", "gpt2"),
                   default=["launches", "mlp", "gpt2"])
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--recorders", nargs="+", metavar="PART",
                   help="time only the recorders whose names hold one of these parts (and the plain step)")
    opts = p.parse_args()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    # Every recording stops CUPTI at its end, as roofline's does (capture._teardown_cupti_at_stop): else a torch
    # recording timed before roofline's first would leave CUPTI's callbacks on every later launch, plain's too.
    _teardown_cupti_at_stop()
    results = []
    for name in opts.workloads:
        if name == "launches":
            step, what = launches_step(device)
        elif name == "mlp":   # the main job's size, where the host under the profiler falls behind the GPU
            step, what = mlp_step(device, *((8192, 2048) if gpu else (256, 256)))
        else:
            step, what = gpt2_step(device)
        results.append(measure(name, step, what, opts.steps, opts.rounds, opts.recorders))
    result = {"device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__,
              "python": platform.python_version(),   # 3.12+ marks lines by sys.monitoring, before by sys.settrace
              "workloads": results}
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "profile_overhead.json").write_text(json.dumps(result, indent=1))
    text = "\n".join(markdown(w) for w in results)
    (opts.out / "profile_overhead.md").write_text(text)
    print(f"{result['device']}, torch {torch.__version__}\n\n{text}")


if __name__ == "__main__":
    main()
