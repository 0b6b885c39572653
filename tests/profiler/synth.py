"""Synthetic torch.profiler traces, written as the Chrome JSON that torch exports, for testing the analyses.

Times are in microseconds. A builder keeps the host clock per thread simple: the test says when
each op, launch and kernel happens.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from roofline.profiler.costs import Peaks
from roofline.profiler.trace import LINE_MARK, MODULE_MARK

H100 = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "numSms": 132, "totalGlobalMem": 85017493504}
# Round ceilings, so expected numbers are easy to compute by hand.
PEAKS = Peaks(gbps=3000.0, matmul_tflops={"bf16": 700.0, "fp16": 700.0, "tf32": 350.0, "fp32": 50.0},
              vector_tflops=50.0, source="measured")
MAIN, AUTOGRAD = 100, 200


class TraceBuilder:
    def __init__(self, gpu: bool = True):
        self.events: list[dict] = []
        self.stacks: list[list] = []
        self.gpu = gpu
        self._corr = 0
        self._seq = 0
        self.unprofiled_steps: dict | None = None   # {"wall_ms": [...], "gpu_ms": [...]}, as capture's StepClock
        self.facts: dict = {}                        # more of capture's facts (optimizers, ...)
        self.extra_meta: dict = {}                   # more top-level keys of torch's trace (baseTimeNanoseconds)

    # ------------------------------------------------------------------ host
    def mark(self, ts: float, stack: list[tuple], tid: int = MAIN) -> None:
        """The user's code is now at the last (file, line, function) of `stack` (outermost first)."""
        entry = [list(f) for f in stack]
        if entry not in self.stacks:
            self.stacks.append(entry)
        self.events.append({"ph": "X", "cat": "cpu_op", "name": f"{LINE_MARK}{self.stacks.index(entry)}",
                            "pid": 1, "tid": tid, "ts": ts, "dur": 0.5, "args": {}})

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN, shapes=None, dtypes=None, scalars=None,
           seq: int | None = None, backward: bool = False, cat: str = "cpu_op") -> None:
        args = {"External id": len(self.events)}
        if shapes is not None:
            args["Input Dims"] = shapes
            args["Input type"] = dtypes or ["float"] * len(shapes)
            args["Concrete Inputs"] = scalars or [""] * len(shapes)
        if seq is not None:
            args["Sequence number"] = seq
            args["Fwd thread id"] = 1 if backward else 0
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur,
                            "args": args})

    def module(self, path: str, ts: float, dur: float, tid: int = MAIN) -> None:
        self.op(MODULE_MARK + path, ts, dur, tid=tid, cat="user_annotation")

    def step(self, ts: float, dur: float, n: int) -> None:
        self.op(f"ProfilerStep#{n}", ts, dur, cat="user_annotation")

    def runtime(self, name: str, ts: float, dur: float, tid: int = MAIN) -> int:
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": name, "pid": 1, "tid": tid, "ts": ts,
                            "dur": dur, "args": {"correlation": self._corr}})
        return self._corr

    # ------------------------------------------------------------------ device
    def kernel(self, name: str, ts: float, dur: float, launch_ts: float | None = None, tid: int = MAIN,
               grid=(1024, 1, 1), stream: int = 7) -> None:
        """A kernel, launched by a cudaLaunchKernel on `tid` (5 us long) at launch_ts (default: 10 us before)."""
        launch_ts = ts - 10 if launch_ts is None else launch_ts
        corr = self.runtime("cudaLaunchKernel", launch_ts, 5.0, tid=tid)
        self.events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
                            "args": {"device": 0, "stream": stream, "correlation": corr, "grid": list(grid),
                                     "block": [128, 1, 1], "registers per thread": 32, "shared memory": 0}})

    def memcpy(self, direction: str, memory: str, ts: float, dur: float, nbytes: int, launch_ts: float,
               tid: int = MAIN) -> None:
        corr = self.runtime("cudaMemcpyAsync", launch_ts, 5.0, tid=tid)
        src, dst = (memory, "Device") if direction == "HtoD" else ("Device", memory)
        self.events.append({"ph": "X", "cat": "gpu_memcpy", "name": f"Memcpy {direction} ({src} -> {dst})",
                            "pid": 0, "tid": 7, "ts": ts, "dur": dur,
                            "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": nbytes}})

    # ------------------------------------------------------------------ output
    def to_dict(self) -> dict:
        meta = {"roofline": {"version": 1, "cwd": "/work", "argv": ["train.py"], "sys_path": [],
                             "library_roots": ["/usr/lib/python3/"], "stacks": self.stacks,
                             **({"unprofiled_steps": self.unprofiled_steps} if self.unprofiled_steps else {}),
                             **self.facts},
                "schemaVersion": 1, "deviceProperties": [H100] if self.gpu else []}
        return {**meta, "traceEvents": self.events, "traceName": "synthetic", **self.extra_meta}

    def write(self, path: Path) -> Path:
        text = json.dumps(self.to_dict())
        if str(path).endswith(".gz"):
            path.write_bytes(gzip.compress(text.encode()))
        else:
            path.write_text(text)
        return path


def at(line: int, function: str = "train", file: str = "train.py") -> list[tuple]:
    """A user stack: main() in train.py calling `function`, now at `line`."""
    return [(file, 50, "<module>"), (file, line, function)]
