"""Running a model's steps: a whole step captured as one CUDA graph, and step times taken by CUDA events.

    run = capture(step)          # step() warmed up on a side stream, captured; run() replays it
    timer = StepTimer(device)
    timer.mark()
    for _ in range(n):
        run()
        timer.mark()
    timer.samples_ms()           # one time per step, no synchronization between steps
"""

import time

import torch

CAPTURE_WARMUP = 3   # calls before the capture: every lazy decision (kernels compiled, plans built, routes) made


class StepTimer:
    """Times consecutive steps by CUDA events recorded between them (no synchronization in between), or by the
    wall clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = torch.device(device).type == "cuda"
        self.marks = []

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def samples_ms(self) -> list[float]:
        if self.cuda:
            torch.cuda.synchronize()
            return [a.elapsed_time(b) for a, b in zip(self.marks, self.marks[1:])]
        return [(b - a) * 1e3 for a, b in zip(self.marks, self.marks[1:])]


def capture(step):
    """step() captured as a CUDA graph after CAPTURE_WARMUP calls on a side stream; returns a callable replaying
    it and returning the captured call's output (the graph's static tensors). Everything step() reads must stay
    where it is (the same tensors, updated in place), and an optimizer must be built with capturable=True."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(CAPTURE_WARMUP):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        output = step()

    def replay():
        graph.replay()
        return output
    # The graph reads and writes the memory of whatever step() reads (a model's weights, its KV cache). Held here,
    # it lives as long as the replay does: a caller that keeps only the replay (benchmarks/models.py's generation
    # did) would otherwise free it, and the replays would run on memory handed to other tensors.
    replay.step = step
    return replay
