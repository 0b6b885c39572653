"""The HTML report: its content from a known analysis, and the page rendered by a real (headless) Chromium."""

import re

import pytest
import browser

from roofline.profiler.costs import Peaks
from roofline.profiler.report import analyze

from .synth import PEAKS, TraceBuilder, at
from .test_findings import _copies, _elementwise, _grid

EVIL = "<script>alert(1)</script>.py"


@pytest.fixture
def report(tmp_path):
    b = TraceBuilder()
    b.op("ProfilerStep#1", 0, 2000, cat="user_annotation")
    _copies("Pageable")(b)
    _grid(33)(b)
    _elementwise(5)(b)
    b.mark(1900, at(7, "evil", EVIL))
    b.op("aten::mul", 1901, 5, shapes=[[1 << 20], [1 << 20]])
    b.kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor<float>>", 1950, 30, launch_ts=1902)
    return analyze(b.write(tmp_path / "t.json"), peaks=PEAKS)


def test_page_holds_every_section_and_finding(report, tmp_path):
    path = tmp_path / "r.html"
    report.write_html(path)
    page = path.read_text()
    for section in ("Summary", "Findings", "Timeline", "Roofline", "Top-down: call paths", "Source lines",
                    "Ops on the roofline", "Kernels", "Modules", "Memory operations", "Host synchronizations"):
        assert f"<h2>{section}</h2>" in page
    assert len(report.findings) >= 3
    for f in report.findings:
        assert f'data-id="{f.id}"' in page
    assert '<svg id="timeline"' in page and '<svg id="roofline"' in page
    assert page.count('<circle class="op"') == len([o for o in report.ops if o.flops and o.bytes and o.us])
    assert "roofline profile: train.py" in page          # the program, from the trace's facts


def test_page_is_self_contained_and_escapes_what_it_shows(report, tmp_path):
    path = tmp_path / "r.html"
    report.write_html(path)
    page = path.read_text()
    assert "<script>alert(1)</script>" not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.py" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)   # nothing loaded from anywhere
    assert page.count("<script>") == 1


@pytest.mark.browser
def test_chromium_renders_the_page_without_script_errors(report, tmp_path):
    path = tmp_path / "r.html"
    report.write_html(path)
    dom, log = browser.dom(path.as_uri() + "#selftest")
    body = re.search(r"<body[^>]*>", dom)[0]
    assert 'data-ready="1"' in body and "data-script-error" not in body, body
    assert "Uncaught" not in log
    # Every sortable column was clicked twice without an error; each table ends sorted ascending by its last column.
    headers, tables = len(re.findall(r"<th[ >]", dom)), dom.count('<table class="sortable"')
    assert f'data-selftest="{headers} {tables}"' in body and headers > 30 and tables == 7
    assert dom.count('class="card finding"') == len(report.findings)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;.py" in dom and "<script>alert(1)" not in dom


@pytest.mark.browser
def test_cpu_only_report_renders(tmp_path):
    b = TraceBuilder(gpu=False)
    b.mark(0, at(5))
    b.op("aten::mm", 1, 500, shapes=[[512, 512], [512, 512]])
    path = tmp_path / "cpu.html"
    analyze(b.write(tmp_path / "cpu.json"), peaks=PEAKS).write_html(path)
    dom, _ = browser.dom(path.as_uri())
    body = re.search(r"<body[^>]*>", dom)[0]
    assert 'data-ready="1"' in body and "data-script-error" not in body and "No GPU activity in this trace" in dom


def test_a_cpu_s_measured_ceilings_draw_their_roof(tmp_path):
    """After `roofline doctor` on a CPU its matmul ceiling is under 0.1 TFLOP/s: the chart once rounded it to 0 and
    crashed on the logarithm of its ridge."""
    b = TraceBuilder(gpu=False)
    b.mark(0, at(5))
    b.op("aten::mm", 1, 500, shapes=[[512, 512], [512, 512]])
    cpu = Peaks(gbps=17.9, matmul_tflops={"fp32": 0.041}, vector_tflops=0.041, source="measured")
    path = tmp_path / "cpu.html"
    analyze(b.write(tmp_path / "cpu.json"), peaks=cpu).write_html(path)
    assert "fp32 0 TFLOP/s" not in path.read_text() and "DRAM 18 GB/s" in path.read_text()
