"""The least memory traffic of each row-wise op, in one place: benchmarks/ops_suite.py times the ops against it,
and the profiler places their eager calls (roofline::<op>, roofline::<op>_backward) on the roofline with it.

Traffic is counted in passes over a unit: the bytes of the op's first input (q's and k's together for rope).
"""

from __future__ import annotations

from typing import NamedTuple


class Passes(NamedTuple):
    forward: int
    backward: int


PASSES = {
    "softmax": Passes(2, 3),        # read x, write y; backward: read y and dy, write dx
    "log_softmax": Passes(2, 3),
    "layer_norm": Passes(2, 3),     # weights and per-row statistics are small beside x
    "rms_norm": Passes(2, 3),
    "add_rms_norm": Passes(4, 4),   # read x and r, write y and h; backward: read h, dy, dh, write dx (= d r)
    "gelu": Passes(2, 3),
    "swiglu": Passes(3, 5),         # read a and b, write y; backward: read a, b and dy, write da and db
    "cross_entropy": Passes(1, 1),  # read the logits once; backward: write their gradient once
    "rope": Passes(2, 2),           # read q and k, write them rotated; backward: the same on the gradients
}


def unit_inputs(op: str) -> int:
    """How many of the op's first inputs make up its unit of traffic."""
    return 2 if op == "rope" else 1
