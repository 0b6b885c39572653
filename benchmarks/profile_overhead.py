"""How much slower the MLP example runs inside roofline's profiler than without it, and which capture option costs what.

    python benchmarks/profile_overhead.py OUT_DIR [--steps 20] [--repeats 7]

Times the same training steps plainly, inside a bare `torch.profiler.profile` (CPU and CUDA
activities, nothing else: the floor any torch-based profiler pays), inside `roofline.profile()`
with its defaults, and with each of its capture options turned off in turn. Variants run in
rounds, one of each per round, so drift hits all alike. Each sample is the host time from the
first step to the synchronized end, inside the window (start-up and trace export excluded,
as the user sees a training loop). Writes profile_overhead.json and profile_overhead.md.
The issue's target: roofline's defaults at most 1.5x plain.
"""

import argparse
import contextlib
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch
from torch import nn

import roofline

ROOT = Path(__file__).resolve().parents[1]


def load_example():
    spec = importlib.util.spec_from_file_location("mlp_train", ROOT / "examples/mlp_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bare_torch_profiler():
    acts = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


VARIANTS = {
    "plain": contextlib.nullcontext,
    "torch.profiler, bare": bare_torch_profiler,
    "roofline.profile()": lambda: roofline.profile(),
    "roofline, shapes=False": lambda: roofline.profile(shapes=False),
    "roofline, modules=False": lambda: roofline.profile(modules=False),
    "roofline, lines=False": lambda: roofline.profile(lines=False),
}


def measure(batch: int, width: int, steps: int, repeats: int) -> dict:
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    torch.manual_seed(0)
    model = load_example().build(width, 4).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, target = torch.randn(batch, width, device=device), torch.randn(batch, width, device=device)

    def run():
        for _ in range(steps):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
                loss = nn.functional.mse_loss(model(x), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if gpu:
            torch.cuda.synchronize()

    def timed(make_context) -> float:
        with make_context():
            t0 = time.perf_counter()
            run()
            return (time.perf_counter() - t0) / steps * 1e3

    run()  # warm-up: kernels chosen, memory allocated
    samples = {name: [] for name in VARIANTS}
    for _ in range(repeats):
        for name, make_context in VARIANTS.items():
            samples[name].append(timed(make_context))
    plain = statistics.median(samples["plain"])
    variants = {name: {"ms_per_step": s, "median_ms_per_step": statistics.median(s),
                       "ratio": statistics.median(s) / plain} for name, s in samples.items()}
    return {"batch": batch, "width": width, "variants": variants, "ratio": variants["roofline.profile()"]["ratio"]}


def markdown(size: dict) -> str:
    rows = [f"{size['batch']}x{size['width']}:", "", "| capture | median ms/step | min-max ms/step | vs plain |",
            "|---|---:|---:|---:|"]
    for name, v in size["variants"].items():
        rows.append(f"| {name} | {v['median_ms_per_step']:.2f} | {min(v['ms_per_step']):.2f}-"
                    f"{max(v['ms_per_step']):.2f} | {v['ratio']:.2f}x |")
    return "\n".join(rows) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=7)
    opts = p.parse_args()
    gpu = torch.cuda.is_available()
    # The main job's size, where the host under the profiler falls behind the GPU; and a wider model whose
    # steps the GPU takes long enough that the profiler's host cost hides behind them.
    sizes = [(8192, 2048), (8192, 4096)] if gpu else [(256, 256)]
    result = {"device": torch.cuda.get_device_name() if gpu else "cpu", "steps": opts.steps, "repeats": opts.repeats,
              "sizes": [measure(b, w, opts.steps, opts.repeats) for b, w in sizes]}
    result["ratio"] = result["sizes"][0]["ratio"]
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "profile_overhead.json").write_text(json.dumps(result, indent=1))
    text = "\n".join(markdown(size) for size in result["sizes"])
    (opts.out / "profile_overhead.md").write_text(text)
    print(f"{result['device']}, {opts.steps} steps x {opts.repeats} rounds\n{text}")


if __name__ == "__main__":
    main()
