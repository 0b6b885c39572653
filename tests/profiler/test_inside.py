"""`roofline profile --inspect K`: the profile's heaviest Triton kernels matched to the launches the program made,
and each configuration launched seen as roofline inspect sees it. Here through Triton's interpreter (the kernels
compiled on this machine for sm_90); on a GPU, tests/profiler/test_examples_gpu.py runs it on a real profile, and
tests/test_cli.py checks what a profile without GPU kernels says."""

import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from roofline.inspect import kernels
from roofline.inspect.report import KernelReport
from roofline.profiler import inside
from roofline.profiler.kernels import KernelRow

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import inspect_kernels  # noqa: E402

pytestmark = pytest.mark.long   # compiles kernels in a process of its own: run first (conftest)


def _row(name: str, share: float) -> KernelRow:
    return KernelRow(name, name, "triton", count=4, total_us=1e3 * share, share=share)


ROWS = [_row("ampere_sgemm_128x64_nn", 0.5), _row("softmax_backward_kernel", 0.3), _row("softmax_forward_kernel", 0.2)]


@pytest.fixture(scope="module")
def both():
    """The softmax example's launches, and its two kernels looked inside (compiled once, for both tests)."""
    launched = kernels.launches(inspect_kernels.softmax_forward_and_backward)
    return launched, inside.look_inside(ROWS, launched, count=2, sms=132)


def test_the_heaviest_triton_kernels_are_matched_to_their_launches_and_inspected(both):
    launched, both = both
    assert [launch.name for launch in launched] == ["softmax_forward_kernel", "softmax_backward_kernel"]
    # the library's GEMM is no Triton launch of the program: the heaviest Triton kernels are the backward's, then
    # the forward's
    assert [x.kernel for x in both] == ["softmax_backward_kernel", "softmax_forward_kernel"]
    assert [x.share for x in both] == [0.3, 0.2]
    (report,) = both[0].reports
    assert isinstance(report, KernelReport) and report.name == "softmax_backward_kernel"
    assert report.resources.registers > 0 and report.occupancy.blocks > 0
    assert report.where.startswith("src/roofline/ops/softmax.py:") and report.arch == "sm_90"
    assert any(f.id == "small-grid" for f in report.findings)   # 8 rows: one block for 132 SMs
    as_json = json.loads(json.dumps([x.to_dict() for x in both]))
    assert as_json[0]["configurations"][0]["name"] == "softmax_backward_kernel"
    console = Console(width=80, record=True, force_terminal=False)
    inside.render(both, console, top=3)
    text = console.export_text()
    assert "Inside the heaviest Triton kernels" in text and "softmax_forward_kernel (20% of the GPU's time)" in \
        " ".join(text.split())
    assert max(len(line) for line in text.splitlines()) <= 80
    assert inside.look_inside([_row("ampere_sgemm_128x64_nn", 1.0)], launched, count=3) == []


def test_the_page_shows_each_configuration_inside_the_heaviest_kernels(both):
    import re

    from roofline.profiler import html

    section = "".join(html._inside(json.loads(json.dumps([x.to_dict() for x in both[1]]))))
    assert "Inside the heaviest Triton kernels" in section and section.count("<tr") == 1 + 2   # a row a kernel
    assert "softmax_forward_kernel" in section and "src/roofline/ops/softmax.py:" in section
    assert re.search(r"\d+ blocks? for 132 SMs", section)   # each one's small-grid finding, by its title
    assert html._inside([]) == []


def test_the_profile_s_findings_about_a_kernel_say_what_inspect_found_inside_it(both):
    from types import SimpleNamespace

    from roofline.profiler.findings import Finding

    _, both = both
    grid = Finding("small-grid", "softmax_backward_kernel fills 1 of 132 SMs", "It ran 4 times.", 1.0,
                   evidence={"kernel": "softmax_backward_kernel"})
    slow = Finding("below-roofline", "softmax at 10% of its roofline", "softmax ran 4 times.", 1.0,
                   ops=[SimpleNamespace(kernels={"softmax_forward_kernel": 10.0, "a_library_kernel": 5.0})])
    other = Finding("misaligned-matmul", "a matmul's K is not a multiple of 8", "Pad K.", 1.0,
                    ops=[SimpleNamespace(kernels={"softmax_forward_kernel": 10.0})])   # not about a kernel's speed
    inside.link([grid, slow, other], both)
    inside_backward = {f.id for f in both[0].reports[0].findings}
    assert grid.evidence["inside"] == {"softmax_backward_kernel": sorted(inside_backward)}
    assert "roofline inspect's view: inside softmax_backward_kernel, " in grid.message
    for f in both[0].reports[0].findings:
        assert f"{f.title} ({f.where})" in grid.message
    assert list(slow.evidence["inside"]) == ["softmax_forward_kernel"]
    assert "inside softmax_forward_kernel" in slow.message and "a_library_kernel" not in slow.message
    assert other.message == "Pad K." and "inside" not in other.evidence
    # a kernel that could not be compiled was not looked inside: the finding says so, not that nothing was found
    from roofline.inspect.report import Uncompiled

    failed = [inside.Inside("softmax_forward_kernel", 0.2, 200.0, [Uncompiled("softmax_forward_kernel", "x.py:1",
                                                                               "ptxas: out of resources")])]
    grid = Finding("small-grid", "t", "m.", 1.0, evidence={"kernel": "softmax_forward_kernel"})
    inside.link([grid], failed)
    assert "could not be compiled to look inside (ptxas: out of resources)" in grid.message
    assert "nothing to fix" not in grid.message and grid.evidence["inside"] == {"softmax_forward_kernel": []}
