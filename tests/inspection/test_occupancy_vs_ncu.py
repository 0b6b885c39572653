"""The occupancy calculator against Nsight Compute's own figures for 16 Triton kernels of roofline.ops on an H100
(ncu 2025.3, `--page raw`, examples/inspect_kernels.py:ops_tour; benchmarks/results/h100-inspect.md): from the
registers, threads and shared memory ncu read for each launch, the calculator must give ncu's theoretical
occupancy and the blocks each resource allows."""

import sys
from pathlib import Path

import pytest

from roofline.inspect import occupancy

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import inspect_vs_ncu  # noqa: E402

ROWS = inspect_vs_ncu.parse((Path(__file__).parent / "fixtures" / "ncu-ops-tour-raw.csv").read_text())


def test_the_fixture_holds_the_tour_s_kernels_and_torch_s_own():
    names = [r["name"] for r in ROWS]
    assert len(names) == 17 and names[0].startswith("void at::")   # torch's randn, then the tour's 16
    assert names[1:4] == ["norm_forward_kernel", "norm_backward_kernel", "norm_parameter_grads_kernel"]
    assert names[-4:] == ["attention_forward_kernel", "attention_delta_kernel", "attention_dkdv_kernel",
                          "attention_dq_kernel"]


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}-{r['name'][:24]}" for i, r in enumerate(ROWS)])
def test_the_calculator_gives_ncu_s_theoretical_occupancy_and_limits(row):
    got = occupancy.occupancy("sm_90", int(row["threads"]), int(row["registers"]), int(row["shared bytes"]))
    assert 100 * got.occupancy == pytest.approx(row["occupancy %"])
    for limit in ("registers", "warps", "blocks"):
        assert got.by[limit] == row[f"blocks by {limit}"], limit
    # ncu's shared-memory limit is under the carveout the driver chose for the launch; where shared memory is
    # what limits the blocks (the attention kernels), the driver chose the largest, and the two agree
    if got.limiter == "shared memory" or row["blocks by shared memory"] == min(got.by.values()):
        assert got.by["shared memory"] == row["blocks by shared memory"]
