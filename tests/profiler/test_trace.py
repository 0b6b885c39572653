"""The trace model: reading Chrome JSON event by event, and linking ops, launches, kernels and marks."""

import gzip
import json

import pytest

from roofline.profiler.trace import TraceError, iter_events, load, module_path, stack_at

from .synth import AUTOGRAD, MAIN, TraceBuilder, at


def test_object_form_keeps_other_keys_and_event_order():
    meta = {}
    text = json.dumps({"a": 1, "traceEvents": [{"name": "x"}, {"name": "y"}], "z": [1, 2]})
    assert [e["name"] for e in iter_events(text, meta)] == ["x", "y"]
    assert meta == {"a": 1, "z": [1, 2]}


@pytest.mark.parametrize("text, names", [
    ('[{"name": "x"}, {"name": "y"}]', ["x", "y"]),
    ('[{"name": "x"},\n]', ["x"]),               # Chrome tolerates a trailing comma
    ("[]", []),
    ('{"traceEvents": []}', []),
    ('  {"traceEvents": [ {"name": "x"} , 5 ] }  ', ["x"]),   # non-objects are skipped
])
def test_array_forms(text, names):
    assert [e["name"] for e in iter_events(text, {})] == names


@pytest.mark.parametrize("text, message", [
    ('{"traceEvents": [{"name": }]}', "not valid JSON"),
    ('{"other": 1}', "no traceEvents"),
    ('{"traceEvents": [{"a": 1} {"b": 2}]}', "expected ',' or ']'"),
    ("42", "expected '{'"),
])
def test_bad_text_is_one_clear_error(text, message):
    with pytest.raises(TraceError, match=message):
        list(iter_events(text, {}))


def test_unreadable_files(tmp_path):
    with pytest.raises(TraceError, match="no such trace file"):
        load(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00junk")
    with pytest.raises(TraceError, match="not UTF-8"):
        load(tmp_path / "bin.json")
    (tmp_path / "cut.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}')[:-6])
    with pytest.raises(TraceError, match="damaged gzip file"):
        load(tmp_path / "cut.json.gz")


def _linked(tmp_path, gz=False):
    b = TraceBuilder()
    b.mark(0, at(10))
    b.op("aten::linear", 5, 100, shapes=[[4, 8], [16, 8]])
    b.op("aten::addmm", 20, 50, shapes=[[16], [4, 8], [8, 16]], seq=7)
    b.module("Net.fc", 1, 120)
    b.kernel("gemm_kernel", 200, 30, launch_ts=30)
    b.mark(150, at(11))
    b.op("autograd::engine::evaluate_function: AddmmBackward0", 300, 80, tid=AUTOGRAD, seq=7, backward=True)
    b.op("aten::mm", 310, 40, tid=AUTOGRAD, shapes=[[4, 16], [16, 8]])
    b.kernel("gemm_bwd", 400, 20, launch_ts=320, tid=AUTOGRAD)
    return load(b.write(tmp_path / ("t.json.gz" if gz else "t.json")))


@pytest.mark.parametrize("gz", [False, True])
def test_links(tmp_path, gz):
    t = _linked(tmp_path, gz)
    names = [o.name for o in t.ops]
    linear, addmm, fc = names.index("aten::linear"), names.index("aten::addmm"), names.index("roofline.module: Net.fc")
    assert t.ops[addmm].parent == linear and t.ops[linear].parent == fc and t.ops[fc].parent == -1
    fwd_kernel, bwd_kernel = t.gpu
    assert t.runtime[fwd_kernel.launch].op == addmm           # the innermost op around the launch
    bwd_mm = names.index("aten::mm")
    assert t.runtime[bwd_kernel.launch].op == bwd_mm
    evaluate = t.ops[t.ops[bwd_mm].parent]
    assert evaluate.backward and evaluate.forward == addmm     # backward -> forward by sequence number
    assert module_path(t, addmm) == "Net.fc"
    assert stack_at(t, t.ops[addmm].tid, t.ops[addmm].ts) == [["train.py", 50, "<module>"], ["train.py", 10, "train"]]
    assert stack_at(t, t.ops[bwd_mm].tid, t.ops[bwd_mm].ts) is None   # no marks on the autograd thread
    assert t.wall_us == pytest.approx(420 - 1)                # first op (the module at 1) to the last end
    assert t.device_properties[0]["numSms"] == 132


def test_latest_forward_with_the_sequence_number(tmp_path):
    b = TraceBuilder()
    b.op("aten::mul", 0, 10, seq=3)
    b.op("aten::mul", 100, 10, seq=3)     # a second forward reusing the number (another thread's counter)
    b.op("MulBackward0", 150, 10, tid=AUTOGRAD, seq=3, backward=True)
    t = load(b.write(tmp_path / "t.json"))
    assert t.ops[2].forward == 1


def test_values_split_across_read_chunks(monkeypatch):
    """The reader holds a few characters at a time here: numbers, strings and events cut at any point decode whole."""
    from roofline.profiler import trace as trace_module

    monkeypatch.setattr(trace_module, "_CHUNK", 7)
    text = ('{"schemaVersion": 123456789, "traceEvents": [{"name": "a long name to cut", "ts": 1234.5678}, '
            '{"name": "b", "ts": 98765}], "tail": [1, 2.5e3, true, null]}')
    meta = {}
    events = list(iter_events(text, meta))
    assert events == [{"name": "a long name to cut", "ts": 1234.5678}, {"name": "b", "ts": 98765}]
    assert meta == {"schemaVersion": 123456789, "tail": [1, 2500.0, True, None]}


@pytest.mark.parametrize("gpu_tail_us", [0.0, 300.0])
def test_the_window_ends_with_the_last_step_not_the_profiler_s_own_work_after_it(tmp_path, gpu_tail_us):
    """The hook that marks the last step stops the recording inside optimizer.step(): that op runs on past the
    step's end (the profiler collecting its trace), which the window must not count as the step's idle (on two
    H200 ranks it made a recorded step 62.57 ms where the steps' mean was 48.85). GPU work launched within the
    steps still ends the window wherever it runs."""
    b = TraceBuilder()
    b.step(0, 1000, 0)
    b.step(1000, 1000, 1)
    b.op("Optimizer.step#AdamW.step", 1800, 700)   # 500 us past the last step: the profiler's own
    b.kernel("void fill_kernel", 1900, 90 + gpu_tail_us, launch_ts=1850)
    trace = load(b.write(tmp_path / "t.json"))
    assert trace.start == 0 and trace.end == pytest.approx(2000 + max(gpu_tail_us - 10, 0.0))


def test_the_window_opens_with_the_first_step_not_the_wait_before_it(tmp_path):
    """Before the first step the warm-up step's end may be recorded: capture's wait for the skipped steps' queued
    GPU work, and work they launched (on two H200 ranks under --no-ops, 74 ms of host idle that opened a window of
    874 ms, counted in its 15 steps). A range begun before the first step that runs into it stays, but does not
    open the window."""
    b = TraceBuilder()
    b.module("Net", 0, 3500)                                    # begun before the first step, runs into it
    b.runtime("cudaDeviceSynchronize", 100, 800)                # the wait before the first step
    b.kernel("void warm_up_kernel", 150, 700, launch_ts=50)     # the warm-up step's work
    b.step(1000, 1000, 0)
    b.step(2000, 1000, 1)
    b.kernel("void step_kernel", 1100, 500, launch_ts=1050)
    trace = load(b.write(tmp_path / "t.json"))
    assert trace.start == 1000 and trace.end == 3000
    assert [g.name for g in trace.gpu] == ["void step_kernel"]
    assert "cudaDeviceSynchronize" not in [r.name for r in trace.runtime]
    assert "roofline.module: Net" in [o.name for o in trace.ops]
