"""Attribution: kernel -> op -> module -> user line, and the views over it."""

import pytest

from roofline.profiler import attribution
from roofline.profiler.trace import TraceError, load

from .synth import AUTOGRAD, PEAKS, TraceBuilder, at


def _trace(tmp_path, build):
    b = TraceBuilder()
    build(b)
    return load(b.write(tmp_path / "t.json"))


def _forward_backward(b):
    b.mark(0, at(10, "forward", "model.py"))
    b.module("Net", 1, 300)
    b.module("Net.fc", 2, 100)
    b.op("aten::addmm", 5, 50, seq=1, shapes=[[16], [4, 8], [8, 16]])
    b.kernel("gemm", 100, 40, launch_ts=10)
    b.mark(120, at(12, "forward", "model.py"))
    b.op("aten::relu", 130, 20, seq=2, shapes=[[4, 16]])
    b.kernel("elementwise_relu", 150, 10, launch_ts=135)
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 400, 50, tid=AUTOGRAD, seq=1, backward=True)
    b.op("aten::mm", 405, 30, tid=AUTOGRAD, shapes=[[4, 16], [16, 8]])
    b.kernel("gemm_bwd", 460, 60, launch_ts=410, tid=AUTOGRAD)
    b.kernel("orphan", 600, 5, launch_ts=590, tid=999)   # launched outside any op or mark: unattributable


def test_work_gets_op_module_line_and_pass(tmp_path):
    t = _trace(tmp_path, _forward_backward)
    a = attribution.attribute(t)
    by_name = {w.name: w for w in a.work}
    gemm, bwd, relu, orphan = by_name["gemm"], by_name["gemm_bwd"], by_name["elementwise_relu"], by_name["orphan"]
    assert t.ops[gemm.op].name == "aten::addmm" and gemm.module == "Net.fc" and not gemm.backward
    assert gemm.location == attribution.Location("model.py", 10, "forward") and gemm.exact
    assert relu.location.line == 12 and relu.module == "Net"
    # The backward kernel belongs to the forward line and module that created it.
    assert bwd.backward and bwd.location.line == 10 and bwd.module == "Net.fc" and t.ops[bwd.op].name == "aten::mm"
    assert orphan.stack == () and a.unattributed_us == pytest.approx(5)
    assert a.total_us == pytest.approx(40 + 10 + 60 + 5)
    assert a.attributed_share == pytest.approx(1 - 5 / 115)


def test_views(tmp_path):
    a = attribution.attribute(_trace(tmp_path, _forward_backward))
    rows = {r.location.line: r for r in attribution.lines(a)}
    assert rows[10].self_us == pytest.approx(100) and rows[10].backward_us == pytest.approx(60) and rows[10].count == 2
    assert rows[12].self_us == pytest.approx(10)
    assert rows[50].self_us == 0 and rows[50].total_us == pytest.approx(110)   # the caller's line: total only
    assert [r.location.line for r in attribution.lines(a)][:2] == [10, 12]

    mods = {m.path: m for m in attribution.modules(a)}
    assert mods["Net"].total_us == pytest.approx(110) and mods["Net"].self_us == pytest.approx(10)
    assert mods["Net.fc"].forward_us == pytest.approx(40) and mods["Net.fc"].backward_us == pytest.approx(60)
    assert mods["Net"].backward_us == pytest.approx(60)

    root = attribution.tree(a)
    assert root.total_us == pytest.approx(115) and root.self_us == pytest.approx(5)   # the orphan stays at the root
    (top,) = root.sorted_children()
    assert top.location.line == 50 and top.total_us == pytest.approx(110)
    assert [c.location.line for c in top.sorted_children()] == [10, 12]

    up = attribution.bottom_up(a)
    assert [c.location.line for c in up.sorted_children()] == [10, 12]
    assert up.sorted_children()[0].sorted_children()[0].location.line == 50   # its caller below it


def test_work_on_a_thread_without_user_code_takes_the_main_threads_line(tmp_path):
    def build(b):
        b.mark(0, at(20))
        b.op("aten::mul", 1, 10, shapes=[[4]])
        b.kernel("k_forward", 20, 5, launch_ts=2)
        b.mark(100, at(33))                         # loss.backward(): the autograd engine works meanwhile
        # AccumulateGrad has no forward op to inherit a line from (no sequence number)
        b.op("autograd::engine::evaluate_function: torch::autograd::AccumulateGrad", 110, 30, tid=AUTOGRAD)
        b.op("aten::add_", 112, 20, tid=AUTOGRAD, shapes=[[4], [4]])
        b.kernel("k_accumulate", 150, 5, launch_ts=113, tid=AUTOGRAD)

    a = attribution.attribute(_trace(tmp_path, build))
    acc = next(w for w in a.work if w.name == "k_accumulate")
    assert acc.location.line == 33 and not acc.exact     # inferred from the main thread, so not counted exact
    assert a.attributed_share == pytest.approx(1.0)
    assert next(w for w in a.work if w.name == "k_forward").exact


def test_cpu_trace_uses_self_time(tmp_path):
    def build(b):
        b.gpu = False
        b.mark(0, at(7))
        b.op("aten::linear", 10, 100)
        b.op("aten::addmm", 20, 70)
        b.op("aten::copy_", 30, 20)
    a = attribution.attribute(_trace(tmp_path, build))
    assert a.device == "cpu"
    assert {w.name: w.us for w in a.work} == pytest.approx({"aten::linear": 30, "aten::addmm": 50, "aten::copy_": 20})
    assert all(w.location.line == 7 for w in a.work)


@pytest.mark.parametrize("file, library", [
    ("train.py", False), ("queue.py", False),             # a bare script name is the user's, even if it shadows stdlib
    ("torch/nn/modules/module.py", True), ("roofline/profiler/capture.py", True),
    ("json/decoder.py", True), ("<frozen runpy>", True), (None, True),
    ("/opt/venv/lib/python3.12/site-packages/foo/bar.py", True), ("mypkg/model.py", False),
])
def test_library_frames(file, library):
    assert attribution._Classifier(None).is_library(file) is library


def test_library_roots_from_the_run(tmp_path):
    lib = tmp_path / "lib"
    (lib / "vendored").mkdir(parents=True)
    (lib / "vendored" / "x.py").write_text("")
    (tmp_path / "mine.py").write_text("")
    c = attribution._Classifier({"sys_path": [str(tmp_path), str(lib)], "library_roots": [str(lib) + "/"]})
    assert c.is_library("vendored/x.py") and not c.is_library("mine.py")


BASE_NS = 1_790_000_000_000_000_000   # the trace's baseTimeNanoseconds: its times are wall-clock ns less this, in us


def _no_op_window(b):
    """A window that records no op (capture's ops=False): launches and kernels from CUPTI, and roofline's own
    line, module and step marks on the wall clock in its facts."""
    ns = lambda us: BASE_NS + int(us * 1000)   # noqa: E731
    stacks = [at(10, "forward", "model.py"), at(12, "forward", "model.py"), at(20)]
    b.stacks.extend([list(map(list, s)) for s in stacks])
    b.facts["own_marks"] = {
        "lines": {"100": [[ns(0), ns(120), ns(300)], [0, 1, 2]]},
        "modules": [[100, ns(1), ns(290), "Net"], [100, ns(2), ns(110), "Net.fc"]],
        "steps": [[ns(0), ns(700)]]}
    b.kernel("gemm", 100, 40, launch_ts=10)                      # in Net.fc, at line 10
    b.kernel("elementwise_relu", 150, 10, launch_ts=135)         # in Net, at line 12
    b.kernel("gemm_bwd", 460, 60, launch_ts=410, tid=AUTOGRAD)   # the autograd engine's: main thread at line 20
    b.extra_meta["baseTimeNanoseconds"] = BASE_NS


def test_a_window_without_ops_ties_kernels_to_lines_and_modules_through_their_launches(tmp_path):
    t = _trace(tmp_path, _no_op_window)
    assert not [o for o in t.ops if not o.annotation] and t.steps == [(0.0, 700.0)]
    by_name = {w.name: w for w in attribution.attribute(t).work}
    gemm, relu, bwd = by_name["gemm"], by_name["elementwise_relu"], by_name["gemm_bwd"]
    assert (gemm.location.line, gemm.module, gemm.exact) == (10, "Net.fc", True)
    assert (relu.location.line, relu.module, relu.exact) == (12, "Net", True)
    # The autograd engine's launch: the line the main thread was at (inferred), in the backward pass.
    assert (bwd.location.line, bwd.module, bwd.exact, bwd.backward) == (20, None, False, True)
    assert not gemm.backward and gemm.op == -1 == relu.op   # no op launched them: no module's range either


def test_a_window_without_ops_needs_the_trace_s_clock(tmp_path):
    def build(b):
        _no_op_window(b)
        del b.extra_meta["baseTimeNanoseconds"]
    with pytest.raises(TraceError, match="baseTimeNanoseconds"):
        _trace(tmp_path, build)


def test_a_window_without_ops_reports_its_lines_modules_and_steps(tmp_path):
    from rich.console import Console

    from roofline.profiler.report import analyze

    b = TraceBuilder()
    _no_op_window(b)
    report = analyze(b.write(tmp_path / "t.json"), peaks=PEAKS)
    rows = {r.location.line: r for r in report.lines}
    assert rows[10].self_us == pytest.approx(40) and rows[12].self_us == pytest.approx(10)
    assert report.timeline.steps == 1
    console = Console(record=True, width=120)
    report.print(console)
    report.write_html(tmp_path / "r.html")
    text = console.export_text()
    assert "model.py:10" in text and "Net.fc" in text and "Recorded without ops" in text
    assert "Recorded without ops" in (tmp_path / "r.html").read_text() and not report.totals["ops_recorded"]
    assert report.to_dict()["ops"] == []   # no module's range passes for an op


def test_a_window_without_ops_leaves_out_the_program_s_tail(tmp_path):
    """capture keeps the tail after the last step mark as a last, partial step, as torch's last step range holds
    it; trace.load leaves out what was launched after the last whole step."""
    def build(b):
        _no_op_window(b)
        b.facts["own_marks"]["steps"].append([BASE_NS + 700_000, BASE_NS + 900_000])
        b.facts["window_steps"] = 1
        b.kernel("after_the_last_step", 820, 30, launch_ts=800)
    t = _trace(tmp_path, build)
    assert t.steps == [(0.0, 700.0)] and "after_the_last_step" not in {g.name for g in t.gpu}


def test_a_window_without_ops_finds_the_thread_kineto_names_by_its_pthread_id(tmp_path):
    """Without CPU activity Kineto may name a launch's thread by the low 32 bits of its pthread id (signed), where
    roofline's marks name it by its system id: the marks go to the name the launches use."""
    ident = 0x7F3A_9C4F_E740   # a pthread id as threading.get_ident() gives it; its low 32 bits read negative
    low = ident & 0xFFFFFFFF
    as_kineto = low - (1 << 32)

    def build(b):
        _no_op_window(b)
        b.facts["own_marks"]["pthread_ids"] = {"100": ident}
        for e in b.events:
            if e.get("cat") == "cuda_runtime" and e["tid"] == 100:
                e["tid"] = as_kineto
    t = _trace(tmp_path, build)
    gemm = next(w for w in attribution.attribute(t).work if w.name == "gemm")
    assert (gemm.location.line, gemm.module, gemm.exact) == (10, "Net.fc", True)
    assert as_kineto in t.marks and 100 not in t.marks


def test_a_window_without_ops_finds_its_main_thread_by_the_handshake(tmp_path):
    """Where the trace names the launching thread by neither its system nor its pthread id (two H200 ranks under
    torchrun: no kernel tied to a line exactly, all of it called backward), the cudaEventRecord that capture made
    between two readings of the wall clock, after the step, names it."""
    ns = lambda us: BASE_NS + int(us * 1000)   # noqa: E731

    def build(b):
        _no_op_window(b)
        for event in b.events:   # the main thread's launches under another name
            if event.get("cat") == "cuda_runtime" and event["tid"] == 100:
                event["tid"] = 4242
        b.runtime("cudaEventRecord", 702, 3, tid=4242)
        b.runtime("cudaEventRecord", 740, 1, tid=AUTOGRAD)   # another thread's, past the span
        handshakes = [[ns(701), ns(704.5), 100]]
        for t in (800, 900):   # spans that hold another thread's records too (two to its one): they tell nothing
            for offset, tid in ((1, AUTOGRAD), (2, 4242), (3, AUTOGRAD)):
                b.runtime("cudaEventRecordWithFlags", t + offset, 0.5, tid=tid)
            handshakes.append([ns(t), ns(t + 4), 100])
        b.facts["own_marks"]["handshakes"] = handshakes

    by_name = {w.name: w for w in attribution.attribute(_trace(tmp_path, build)).work}
    assert (by_name["gemm"].location.line, by_name["gemm"].exact, by_name["gemm"].backward) == (10, True, False)
    assert (by_name["elementwise_relu"].location.line, by_name["elementwise_relu"].exact) == (12, True)
    assert (by_name["gemm_bwd"].location.line, by_name["gemm_bwd"].backward) == (20, True)
