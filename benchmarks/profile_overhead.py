"""How much slower the MLP example runs inside roofline's profiler than without it.

    python benchmarks/profile_overhead.py OUT_DIR [--steps 20] [--repeats 5]

Times the same training steps plainly and inside `roofline.profile()` (the window only,
as the user sees it: host time from the first step to the synchronized end), alternately,
and reports the median of each and their ratio. The issue's target: at most 1.5x.
"""

import argparse
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


def main():
    p = argparse.ArgumentParser()
    p.add_argument("out", type=Path)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    opts = p.parse_args()
    gpu = torch.cuda.is_available()
    device = "cuda" if gpu else "cpu"
    batch, width = (8192, 2048) if gpu else (256, 256)
    torch.manual_seed(0)
    model = load_example().build(width, 4).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, target = torch.randn(batch, width, device=device), torch.randn(batch, width, device=device)

    def run():
        for _ in range(opts.steps):
            with torch.autocast(device, dtype=torch.bfloat16, enabled=gpu):
                loss = nn.functional.mse_loss(model(x), target)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        if gpu:
            torch.cuda.synchronize()

    def timed(profiled: bool) -> float:
        if not profiled:
            t0 = time.perf_counter()
            run()
            return time.perf_counter() - t0
        with roofline.profile():
            t0 = time.perf_counter()
            run()
            seconds = time.perf_counter() - t0
        return seconds

    run()  # warm-up
    plain, profiled = [], []
    for _ in range(opts.repeats):
        plain.append(timed(False))
        profiled.append(timed(True))
    result = {"device": torch.cuda.get_device_name() if gpu else "cpu", "steps": opts.steps, "batch": batch,
              "width": width, "plain_ms_per_step": [s / opts.steps * 1e3 for s in plain],
              "profiled_ms_per_step": [s / opts.steps * 1e3 for s in profiled]}
    result["ratio"] = statistics.median(profiled) / statistics.median(plain)
    opts.out.mkdir(parents=True, exist_ok=True)
    (opts.out / "profile_overhead.json").write_text(json.dumps(result, indent=1))
    print(f"{result['device']}: plain {statistics.median(plain) / opts.steps * 1e3:.2f} ms/step, "
          f"profiled {statistics.median(profiled) / opts.steps * 1e3:.2f} ms/step, ratio {result['ratio']:.2f}x")


if __name__ == "__main__":
    main()
