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


def test_a_window_without_ops_ties_the_forward_s_kernels_to_their_lines_exactly():
    """ops=False: the forward's kernels launch on the main thread, whose line marks say exactly where; on two
    H200 ranks under torchrun no kernel was tied to a line exactly (every line's time called backward) until the
    handshake named the main thread as the trace does. The backward's launches (the autograd engine's) are
    inferred, at the line of backward()."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
    x = torch.randn(64, 256, device="cuda")
    with roofline.profile(ops=False, skip=2) as prof:
        for _ in range(6):
            loss = model(x).square().mean()   # the forward: its launches on this thread
            loss.backward()
            prof.step()
    work = prof.report.attribution.work
    forward = [w for w in work if not w.backward]
    assert forward and all(w.exact for w in forward)
    assert sum(w.us for w in work if w.exact) > 0.3 * sum(w.us for w in work)
