"""On a GPU: what roofline's window records, where CUPTI's state between recordings matters."""

import gzip
import json

import pytest
import torch

import roofline

pytestmark = pytest.mark.gpu


def _kernels(path) -> int:
    with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
        return sum(e.get("ph") == "X" and e.get("cat") == "kernel" for e in json.load(f)["traceEvents"])


@pytest.mark.parametrize("ops", [True, False], ids=["ops", "no-ops"])
def test_windows_back_to_back_each_hold_their_kernels(ops):
    """Kineto finalizes CUPTI after a recording at the next CUDA call; a window opened before one was wiped by that
    finalize and held no kernel. Each of three windows in a row, and one after a torch.profiler recording, holds
    exactly the kernels launched in it."""
    x = torch.zeros(1, device="cuda")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]):
        x.add_(1)
    counts = []
    for launches in (5, 7, 3):
        with roofline.profile(ops=ops) as prof:
            for _ in range(launches):
                x.add_(1)
        counts.append(_kernels(prof.trace_path))
    assert counts == [5, 7, 3]
