"""What the benchmarks of recording share: torch.profiler as a recorder, and each recording checked for what it
holds.

A recording that asked for CUDA activity and holds no kernel measured nothing. That happened, unseen, to every
second recording of a process: Kineto finalizes CUPTI at a recording's end (TEARDOWN_CUPTI, which roofline sets) in
the exit callback of the next CUDA call, and a recording begun before one is wiped by it (on an H200, torch 2.11:
three torch.profiler recordings back to back held 14,320, 0 and 14,320 kernels; with a sync after each, 14,320 all
three). `recorded` makes that call after each recording and counts what it holds.
"""

import gzip
import json
import statistics
import tempfile
from pathlib import Path

import torch

from roofline.bench.steps import StepTimer
from roofline.profiler.capture import Profiler


def torch_profiler(*activities: str, **options):
    """A maker of torch.profiler recordings of `activities` ("CPU", "CUDA")."""
    return lambda: torch.profiler.profile(
        activities=[getattr(torch.profiler.ProfilerActivity, a) for a in activities], **options)


def trace_events(path: Path) -> list:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return json.load(f)["traceEvents"]


def kernels_recorded(recording) -> int | None:
    """How many kernels a finished recording's trace holds (None: a recorder that writes no trace)."""
    if isinstance(recording, Profiler):
        events = trace_events(recording.trace_path) if recording.recorded else []
    elif hasattr(recording, "export_chrome_trace"):
        with tempfile.TemporaryDirectory() as tmp:
            recording.export_chrome_trace(f"{tmp}/trace.json")
            events = trace_events(Path(tmp) / "trace.json")
    else:
        return None
    return sum(e.get("ph") == "X" and e.get("cat") == "kernel" for e in events)


def recorded(make, body):
    """body() run inside the recording make() opens: (what body returned, the kernels the recording holds)."""
    with make() as recording:
        result = body()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()   # CUPTI finalized now, outside the next recording (see the module's note)
    return result, kernels_recorded(recording)


def median_step_ms(step, steps: int, device) -> float:
    """The median of `steps` calls of step(), each timed by CUDA events between steps (wall clock on a CPU)."""
    timer = StepTimer(device)
    timer.mark()
    for _ in range(steps):
        step()
        timer.mark()
    return statistics.median(timer.samples_ms())
