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


def test_a_window_without_ops_names_the_main_thread_by_its_handshakes_as_by_its_ids():
    """ops=False: after each step capture records a CUDA event between two readings of the wall clock, and the
    trace's cudaEventRecord there names the stepping thread as the trace names its launches. In one process its
    ids already match a launching thread (on two H200 ranks under torchrun they matched none, and every line's
    time was called backward): the handshakes must name the same one. The forward's kernels are on exact lines."""
    import threading

    from roofline.profiler import trace as trace_module

    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(), torch.nn.Linear(256, 256)).cuda()
    x = torch.randn(64, 256, device="cuda")
    with roofline.profile(ops=False, skip=2) as prof:
        for _ in range(6):
            model(x).square().mean().backward()   # the forward's launches on this thread
            prof.step()
    report = prof.report
    trace, own = report.trace, report.trace.facts["own_marks"]
    base = trace.meta["baseTimeNanoseconds"]
    assert len(own["handshakes"]) == 4
    shaken = trace_module._handshaken(trace, own["handshakes"], lambda ns: (ns - base) / 1e3)
    main = max(trace.marks, key=lambda tid: len(trace.marks[tid][0]))   # the thread the line marks went to
    assert shaken == {threading.get_native_id(): main}
    forward = [w for w in report.attribution.work if not w.backward and trace.gpu[w.index].launch >= 0]
    assert forward and all(w.exact for w in forward)
