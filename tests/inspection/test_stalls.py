"""Nsight Compute's source counters read back: where a kernel's warps waited, line by line (`roofline inspect
--ncu`). The fixture is ncu 2025.3's `--page source --print-source cuda,sass --csv` for the first three launches
of examples/inspect_kernels.py:ops_tour on an H100 (layer_norm's forward, backward and parameter gradients), each
launch a section for Triton's library file and one for roofline's norm.py, trimmed to two instruction rows a
line (benchmarks/results/h100-inspect.md)."""

from pathlib import Path

from rich.console import Console

from roofline.inspect import stalls

PAGE = (Path(__file__).parent / "fixtures" / "ncu-source-cuda-sass.csv").read_text()


def test_the_page_splits_into_launches_with_each_line_s_samples_and_reasons():
    launches = stalls.parse(PAGE)
    assert [k.name for k in launches] == ["norm_forward_kernel", "norm_backward_kernel",
                                          "norm_parameter_grads_kernel"]
    assert [k.samples for k in launches] == [104, 109, 39]
    for k in launches:   # a line's samples are its stall reasons' samples
        assert all(x.samples == sum(x.reasons.values()) for x in k.lines)
        assert {Path(x.file).name for x in k.lines} == {"norm.py", "standard.py"}
    # its own file's lines, found by the file's name wherever the binary was compiled
    forward = launches[0].of_file("/another/checkout/src/roofline/ops/norm.py")
    assert forward.samples == 87 and {Path(x.file).name for x in forward.lines} == {"norm.py"}
    top = max(forward.lines, key=lambda x: x.samples)
    assert (top.line, top.samples, top.top_reason) == (77, 26, "long_sb") and top.source == "return x.to(tl.float32)"
    # the weight's 16-bit loads over rows of 1000: L2 sectors beyond a coalesced access's
    weight = next(x for x in forward.lines if x.line == 129)
    assert "tl.load(w_ptr + offs" in weight.source and weight.excess_sectors == 28160
    assert list(forward.reasons())[0] == "long_sb"


def test_a_kernel_launched_twice_in_a_row_is_two_launches():
    sections = PAGE.split('"File Path"')   # the first launch: a section for standard.py, one for norm.py
    first = '"File Path"' + '"File Path"'.join(sections[1:3])
    twice = stalls.parse(first + first)
    assert [k.name for k in twice] == ["norm_forward_kernel"] * 2 and twice[0].samples == twice[1].samples == 104


class _Report:
    def __init__(self, name, num_warps=4, blocks=64):
        self.name, self.num_warps, self.blocks = name, num_warps, blocks
        self.file, self.stalls = "/here/src/roofline/ops/norm.py", None
        self.lines = []   # report.LineRow: its SASS line by line (which lines wait on an mbarrier)


def test_a_report_takes_the_launch_of_its_own_block_and_grid_not_a_trial_s_or_another_configuration_s():
    raw = ('"ID","Kernel Name","launch__block_size","launch__grid_size"\n"","","",""\n'
           '"0","k","256","64"\n"1","k","128","64"\n"2","k","128","16"\n')
    assert stalls.parse_launches(raw) == [("k", 256, 64), ("k", 128, 64), ("k", 128, 16)]
    launches = [stalls.KernelStalls("k", [], threads, blocks) for _, threads, blocks in stalls.parse_launches(raw)]
    small, large, other = _Report("k", blocks=16), _Report("k", blocks=64), _Report("k", num_warps=2)
    assert stalls.attach([small, large, other], launches) == 2
    assert (small.stalls.threads, small.stalls.blocks) == (128, 16)
    assert (large.stalls.threads, large.stalls.blocks) == (128, 64) and other.stalls is None


def test_a_source_page_without_the_samples_column_is_a_clear_error():
    import pytest

    with pytest.raises(ValueError, match="no column 'Warp Stall Sampling \\(All Samples\\)'"):
        stalls.parse(PAGE.replace("Warp Stall Sampling (All Samples)", "Samples"))


def test_each_report_gets_its_own_launch_s_lines_in_launch_order():
    reports = [_Report("norm_forward_kernel"), _Report("softmax_forward_kernel"),
               _Report("norm_parameter_grads_kernel")]
    assert stalls.attach(reports, stalls.parse(PAGE)) == 2
    assert reports[0].stalls.samples == 87 and reports[1].stalls is None
    assert reports[2].stalls.name == "norm_parameter_grads_kernel" and reports[2].stalls.samples > 0
    assert all(Path(x.file).name == "norm.py" for x in reports[2].stalls.lines)
    as_json = reports[0].stalls.to_dict()
    assert as_json["samples"] == 87 and as_json["lines"][0]["line"] == 77 and as_json["lines"][0]["top_reason"] == \
        "long_sb" and list(as_json["reasons"])[0] == "long_sb"


def test_the_terminal_shows_the_lines_where_warps_waited_at_80_columns():
    from roofline.inspect.report import _render_stalls

    console = Console(width=80, record=True, force_terminal=False)
    _render_stalls(stalls.parse(PAGE)[0].of_file("norm.py"), console, top=4)
    text = console.export_text()
    assert "where its warps waited (ncu, 87 samples)" in " ".join(text.split())
    assert "norm.py:77" in text and "norm.py:129" in text and "28,160" in text
    assert "waiting on global or local memory" in text
    assert max(len(line) for line in text.splitlines()) <= 80


def test_the_page_puts_each_line_s_samples_beside_its_source():
    import re

    from roofline.inspect import html, occupancy, sass
    from roofline.inspect.report import KernelReport

    own = stalls.parse(PAGE)[0].of_file("norm.py")
    first = 75   # the kernel's source as the fixture's lines 75-79 of norm.py name it
    source = [next((x.source for x in own.lines if x.line == n), "") for n in range(first, first + 5)]
    report = KernelReport("norm_forward_kernel", "norm.py:75", "sm_90", (64, 1, 1), 4, 3, {},
                          sass.Resources(48, 0, 0, 0), 2048, occupancy.occupancy("sm_90", 128, 48, 2048), sass.Mix(),
                          [], [], False, 132, file="/here/src/roofline/ops/norm.py", source=source,
                          first_line=first, stalls=own)
    page = html._kernel(report, "k0")
    assert "warp samples (ncu)" in page and "most often waiting on" in page
    row = re.search(r"<tr[^>]*><td>77</td>.*?</tr>", page)[0]
    assert f'data-v="{26 / 87}"' in row and "30%" in row and "waiting on global or local memory" in row
    report.stalls = None   # without --ncu, no such columns
    assert "warp samples" not in html._kernel(report, "k0")


def test_the_counters_become_findings_at_their_lines():
    from roofline.inspect.report import stall_findings

    report = _Report("norm_forward_kernel")
    stalls.attach([report], stalls.parse(PAGE))
    found = {f.id: f for f in stall_findings(report)}
    assert set(found) == {"stall", "uncoalesced"}   # no shared-memory wavefront beyond the ideal in layer_norm's
    # line 77 holds 26 of the kernel's 87 samples, all waiting for its load
    assert found["stall"].where.endswith("norm.py:77") and "30%" in found["stall"].title
    assert "global" in found["stall"].message and "num_stages" in found["stall"].message
    # rows of 1000 bf16: loads of one element a thread where a thread holds 8 (not 16-divisible, not vectorized)
    u = found["uncoalesced"]
    assert u.where.endswith("norm.py:70") and "6.2x" in u.title
    assert "86,240 of the kernel's 102,688" in u.message and "line 70 `x = tl.load(x_row + offs" in u.message


def _line(n, samples, reasons, sectors=0, excess=0, wavefronts=0, conflicts=0):
    return stalls.LineStalls("k.py", n, f"line_{n}()", samples, reasons, 1, excess, sectors, wavefronts, conflicts)


def test_bank_conflicts_and_a_stall_at_a_line_that_is_not_the_busiest():
    from roofline.inspect.report import stall_findings

    report = _Report("k")
    report.stalls = stalls.KernelStalls("k", [_line(3, 60, {"math": 40, "selected": 20}, wavefronts=4096),
                                              _line(4, 40, {"short_sb": 30, "not_selected": 10}, wavefronts=12288,
                                                    conflicts=8192)])
    found = {f.id: f for f in stall_findings(report)}
    # line 3's warps compute (nothing to fix); line 4's wait on shared memory, whose accesses are split 3 ways
    assert set(found) == {"stall", "bank-conflicts"}
    assert found["stall"].where.endswith("norm.py:4") and "30%" in found["stall"].title
    assert "bank conflicts" in found["stall"].message
    assert found["bank-conflicts"].where.endswith("norm.py:4") and "2.0x" in found["bank-conflicts"].title
    assert "8,192 of the kernel's 16,384" in found["bank-conflicts"].message
    report.stalls.lines[1].shared_excess = 2048   # a seventh more wavefronts than the 14,336 needed: under the bar
    report.stalls.lines[1].reasons = {"short_sb": 10, "not_selected": 30}   # a tenth of the samples
    assert stall_findings(report) == []


def test_exact_access_counts_speak_without_samples_and_busy_warps_give_no_stall():
    from roofline.inspect.report import stall_findings

    report = _Report("k")
    report.stalls = stalls.KernelStalls("k", [_line(7, 0, {}, sectors=5000, excess=4000)])
    assert [f.id for f in stall_findings(report)] == ["uncoalesced"]   # ncu caught no warp of a short kernel
    report.stalls = stalls.KernelStalls("k", [_line(7, 90, {"selected": 50, "math": 40}, sectors=1000)])
    assert stall_findings(report) == []


def test_a_wait_on_an_mbarrier_is_named_as_such_not_as_memory():
    """Hopper's try-wait on an mbarrier (SYNCS.PHASECHK) stalls as long scoreboard: at such a line the finding
    and the table say the warps wait for the copy engine's bytes or other warps, with advice for a
    warp-specialized kernel's partitions; a plain load's long scoreboard keeps its own words."""
    import io

    from rich.console import Console

    from roofline.inspect import sass
    from roofline.inspect.report import LineRow, _render_stalls, mbarrier_lines, stall_findings

    report = _Report("k")
    report.file = "/here/k.py"
    report.lines = [LineRow("/elsewhere/k.py", 82, "mbarrier.wait(v_empty.index(slot), phase ^ 1)", sass.Mix(),
                            mbarrier_waits=1), LineRow("/elsewhere/k.py", 90, "x = tl.load(p)", sass.Mix())]
    report.stalls = stalls.KernelStalls("k", [_line(82, 30, {"long_sb": 27, "selected": 3}),
                                              _line(90, 70, {"long_sb": 25, "math": 45})])
    assert mbarrier_lines(report) == {("k.py", 82)}
    (found,) = stall_findings(report)
    assert found.where.endswith("k.py:82") and "mbarrier" in found.title and "27%" in found.title
    assert "warp-specialized" in found.message and "more stages in flight" in found.message
    out = io.StringIO()
    _render_stalls(report.stalls, Console(file=out, width=80), top=4, barriers=mbarrier_lines(report))
    text = " ".join(out.getvalue().split())
    assert "waiting at an mbarrier" in text and "waiting on global or local memory" in text
    report.lines[0].mbarrier_waits = 0   # the same samples at a plain load: memory's words and advice
    (found,) = stall_findings(report)
    assert "global" in found.message and "warp-specialized" not in found.message
