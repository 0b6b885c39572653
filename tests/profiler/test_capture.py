"""Capture on this machine (CPU): real programs profiled, their ops tied to exact lines, modules and steps."""

import gc
import inspect
import statistics
import sys
import textwrap
import threading
import time
import weakref

import pytest
from rich.console import Console
import torch

import roofline
from roofline.profiler import capture, run_program
from roofline.profiler.trace import stack_at

TRAIN = textwrap.dedent('''\
    import sys
    import torch
    from torch import nn


    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 48)
            self.head = nn.Linear(48, 8)

        def forward(self, x):
            h = self.fc(x)
            return self.head(torch.relu(h) * 2)


    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(64, 32)
    w = torch.randn(32, 32)
    for _ in range(int(sys.argv[1])):
        y = x @ w @ w
        loss = (net(y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if len(sys.argv) > 2:
        raise SystemExit(int(sys.argv[2])) if sys.argv[2].isdigit() else RuntimeError(sys.argv[2])
    ''')


def _line(text: str, source: str = TRAIN) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if text in line)


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text(TRAIN)
    return path


def _by_line(report):
    return {(r.location.file.rsplit("/", 1)[-1], r.location.line): r for r in report.lines}


def test_ops_land_on_exact_lines_including_operators_and_backward(script):
    prof, status, error = run_program(str(script), ["4"], skip=1)
    assert (status, error) == (0, None) and prof.recorded
    report = prof.report
    assert report.attribution.device == "cpu" and report.attribution.attributed_share > 0.99
    rows = _by_line(report)
    matmul_line, fc_line = _line("y = x @ w @ w"), _line("h = self.fc(x)")
    assert rows[("train.py", matmul_line)].self_us > 0          # `@` is no call, yet its line is found
    # The Linear's forward (addmm) is on the line inside forward(); its backward is charged to the same line.
    fc = rows[("train.py", fc_line)]
    assert fc.self_us > 0 and fc.backward_us > 0
    names = {report.trace.ops[w.op].name for w in report.attribution.work
             if w.location and w.location.line == fc_line and w.op >= 0}
    assert "aten::addmm" in names
    assert report.to_dict()["totals"]["exact_share"] > 0.9


def test_module_paths_and_steps(script):
    prof, status, error = run_program(str(script), ["5"], skip=2)
    assert (status, error) == (0, None)   # the window opens inside optimizer.step()'s hooks: none may break
    report = prof.report
    modules = {m.path: m for m in report.modules}
    assert {"Net", "Net.fc", "Net.head"} <= set(modules)
    assert modules["Net.fc"].forward_us > 0 and modules["Net.fc"].backward_us > 0
    assert modules["Net"].total_us >= modules["Net.fc"].total_us + modules["Net.head"].total_us
    # Five optimizer steps, two skipped: the window holds the other three (torch's step ranges).
    assert prof.steps == 5 and report.steps == 3


def _recorded(length: int, skip: int, active: int | None) -> int:
    """The steps a window of `skip` and `active` holds of a program that runs `length` steps."""
    return len([i for i in range(skip, length) if active is None or i < skip + active])


def _profile_steps(length: int, skip: int, active: int | None):
    """A loop of `length` steps, each one mm of its own shape, then a tail (a cumsum) after the last mark."""
    a = torch.randn(8, 8)
    with roofline.profile(skip=skip, active=active) as prof:
        for _ in range(length):
            a @ a
            prof.step()
        a.cumsum(0)
    return prof


def _check_window(prof, length: int, skip: int, active: int | None) -> None:
    expected = _recorded(length, skip, active)
    if length < skip:
        assert not prof.recorded
        return
    report = prof.report
    names = [o.name for o in report.trace.ops]
    assert report.steps == expected and report.to_dict()["totals"]["steps"] == expected
    assert names.count("aten::mm") == expected   # the steps' own work: no more, no less
    if expected:
        assert "aten::cumsum" not in names and report.trace.tail_us >= 0   # the tail after the last step is no step
        assert report.timeline.step_us * expected <= report.timeline.window_us * 1.001


@pytest.mark.parametrize("length, skip, active", [(10, 3, None), (7, 5, None), (7, 3, None), (5, 0, None),
                                                  (6, 2, 3), (4, 2, 5), (3, 3, None), (0, 0, None)])
def test_the_window_counts_the_steps_it_holds(length, skip, active):
    """The issue's cases: 10 steps with skip 3 hold 7 (reported 8), 7 with skip 5 hold 2 (reported 3)."""
    _check_window(_profile_steps(length, skip, active), length, skip, active)


@pytest.mark.sweep
@pytest.mark.parametrize("active", [None, 1, 2, 4])
@pytest.mark.parametrize("skip", [0, 1, 2, 3, 5, 8])
@pytest.mark.parametrize("length", [1, 2, 4, 7])
def test_every_window_counts_the_steps_it_holds(length, skip, active):
    _check_window(_profile_steps(length, skip, active), length, skip, active)


def test_a_program_s_tail_after_its_last_optimizer_step_is_no_step(tmp_path):
    """Through run_program and optimizer.step(), as `roofline profile` counts steps."""
    path = tmp_path / "tail.py"
    path.write_text(TRAIN + "torch.randn(16).cumsum(0)\n")
    prof, status, _ = run_program(str(path), ["7"], skip=3)
    names = [o.name for o in prof.report.trace.ops]
    assert status == 0 and prof.report.steps == 4 and names.count("aten::addmm") == 2 * 4
    assert "aten::cumsum" not in names


def test_trace_carries_roofline_facts(script, tmp_path):
    import gzip
    import json

    trace = tmp_path / "t.json.gz"
    prof, _, _ = run_program(str(script), ["2"], trace=trace)
    data = json.loads(gzip.decompress(trace.read_bytes()))
    assert data["roofline"]["argv"][0] == str(script) and data["roofline"]["stacks"]
    assert any(e.get("name", "").startswith("roofline.line: ") for e in data["traceEvents"])
    assert prof.trace_path == trace


def test_program_exit_status_and_raised_error_still_give_a_report(script):
    prof, status, error = run_program(str(script), ["2", "3"])
    assert status == 3 and error is None and prof.report.attribution.work
    prof, status, error = run_program(str(script), ["2", "boom"])
    assert status == 1 and isinstance(error, RuntimeError) and str(error) == "boom"
    assert prof.report.attribution.work


def test_nothing_recorded_when_too_few_steps(script):
    prof, status, _ = run_program(str(script), ["2"], skip=5)
    assert status == 0 and not prof.recorded
    with pytest.raises(RuntimeError, match="skip=5"):
        prof.report


def test_run_as_module(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text("import torch\nprint(torch.ones(8).sum().item())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    prof, status, _ = run_program("pkg.job", [], module=True)
    assert status == 0 and any(r.location.file.endswith("job.py") for r in prof.report.lines)


def test_missing_program():
    with pytest.raises(FileNotFoundError, match="no such file"):
        run_program("does/not/exist.py", [])
    with pytest.raises(FileNotFoundError, match="no module named"):
        run_program("no_such_module_anywhere", [], module=True)


def test_tracing_hooks_are_restored_after_the_window(script):
    before = sys.gettrace()
    run_program(str(script), ["1"])
    assert sys.gettrace() is before
    if sys.version_info >= (3, 12):
        assert sys.monitoring.get_tool(sys.monitoring.PROFILER_ID) is None


class _Marked(capture._LineMarks):
    """_LineMarks with the stacks it marks written down, in order (no profiler needed)."""

    def __init__(self):
        super().__init__()
        self.marked = []

    def _mark(self, sid):
        super()._mark(sid)
        self.marked.append([(function, line) for _, line, function in self._by_id[sid]])


def _leaf():
    return torch.zeros(1)


def _caller_a():
    return _leaf()


def _caller_b():
    x = 1
    return _leaf() + x


def _numbers(n):
    for i in range(n):
        yield torch.tensor(i)


def test_line_marks_name_each_call_s_own_stack():
    """The stack above a frame is kept with the frame: a function called from two places, a frame made again at
    an address just freed, a generator resumed from two lines each get the stack they run under."""
    here = sys._getframe().f_code.co_name
    with _Marked() as marks:
        for _ in range(3):   # the same frames, made again and again at the same few addresses
            _caller_a()
            _caller_b()
        numbers = _numbers(2)
        next(numbers)
        next(numbers)
    leaves = [stack[-2:] for stack in marks.marked if stack[-1][0] == "_leaf"]
    a_line, b_line = _caller_a.__code__.co_firstlineno + 1, _caller_b.__code__.co_firstlineno + 2
    assert leaves == [[("_caller_a", a_line), ("_leaf", _leaf.__code__.co_firstlineno + 1)],
                      [("_caller_b", b_line), ("_leaf", _leaf.__code__.co_firstlineno + 1)]] * 3
    resumed = [stack[-2][1] for stack in marks.marked if stack[-1][0] == "_numbers" and stack[-2][0] == here]
    source, first = inspect.getsourcelines(test_line_marks_name_each_call_s_own_stack)
    lines = [first + i for i, text in enumerate(source) if text.strip() == "next(numbers)"]
    assert sorted(set(resumed)) == lines   # each resumption under the line that asked for the next value
    assert all(stack[0][0] == here for stack in marks.marked)   # every stack from the test's frame down


def test_line_marks_open_deep_in_a_recursion():
    """A window that opens near the recursion limit resolves the stack above it without recursing itself."""
    depth = sys.getrecursionlimit() - 60

    def down(n, marks):
        if n:
            return down(n - 1, marks)
        with marks:
            return torch.zeros(1)

    marks = _Marked()
    down(depth, marks)
    deepest = max(len(stack) for stack in marks.marked)
    assert deepest > depth and all(f == "down" for f, _ in marks.marked[0][-depth:])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without CUDA")
def test_a_window_without_ops_needs_cuda():
    with pytest.raises(ValueError, match="ops=False .* needs a CUDA device"):
        roofline.profile(ops=False)


def test_line_and_module_marks_on_their_own_clock():
    """For a window that records no op: marks kept on the wall clock, per thread, in order, none in the trace."""
    before = time.time_ns()
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())
    with capture._LineMarks(own_clock=True) as lines, capture._ModulePaths(own_clock=True) as modules:
        net(torch.randn(2, 4))
        worker = threading.Thread(target=_caller_a)
        worker.start()
        worker.join()
    after = time.time_ns()
    main = lines.own[threading.get_native_id()]
    assert set(lines.own) == {threading.get_native_id(), worker.native_id}
    for times, ids in lines.own.values():
        assert times == sorted(times) and before <= times[0] and times[-1] <= after and len(ids) == len(times)
        assert all(0 <= sid < len(lines.table()) for sid in ids)
    assert any(lines.table()[sid][-1][2] == "test_line_and_module_marks_on_their_own_clock" for sid in main[1])
    paths = [(path, tid) for tid, start, end, path in modules.ranges if before <= start <= end <= after]
    assert paths == [("Sequential.0", threading.get_native_id()), ("Sequential.1", threading.get_native_id()),
                     ("Sequential", threading.get_native_id())]


def test_line_marks_let_go_of_frames_that_returned_or_raised():
    class Held:
        pass

    def returns():
        held = Held()
        return weakref.ref(held)

    def raises(refs):
        held = Held()
        refs.append(weakref.ref(held))
        raise ValueError("unwound")

    refs = []
    with _Marked() as marks:
        for _ in range(50):
            refs.append(returns())
            with pytest.raises(ValueError):
                raises(refs)
        gc.collect()
        assert all(ref() is None for ref in refs)   # no frame kept with its locals
        assert len(marks._above) <= 3   # this test's frame, and pytest's raises() context above it at most
    assert marks._above is None


def test_context_manager_and_function_forms():
    x = torch.randn(128, 128)
    with roofline.profile() as prof:
        for _ in range(3):
            (x @ x).sum()
            prof.step()
    assert prof.recorded and prof.steps == 3 and prof.report.attribution.work
    called = roofline.profile(lambda a: (a @ a).relu(), x)
    assert any(o.name == "aten::mm" for o in called.report.trace.ops)
    with pytest.raises(TypeError, match="callable"):
        roofline.profile(42)


@pytest.mark.parametrize("kwargs, message", [({"skip": -1}, "skip"), ({"skip": 1.5}, "skip"),
                                             ({"active": 0}, "active"), ({"active": True}, "active"),
                                             ({"ops": "no"}, "ops"), ({"ops": False, "memory": True}, "memory")])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        roofline.profile(**kwargs)


def test_step_outside_a_window():
    capture.step()   # no profiler active: nothing happens
    prof = roofline.profile()
    with pytest.raises(RuntimeError, match="outside"):
        prof.step()


def test_steps_outside_the_window_are_timed_without_roofline_s_hooks():
    """Ten steps of a known length, skip 3 and record 3: steps 1 (0 is the program's warm-up) and 7-9 (6 is the
    profiler stopping) are timed; roofline's line and module hooks run only in the window, steps 2-5."""
    hooked = []
    with roofline.profile(skip=3, active=3) as prof:
        for _ in range(10):
            hooked.append(prof._lines is not None and prof._modules is not None)
            end = time.perf_counter() + 0.004
            while time.perf_counter() < end:
                pass
            prof.step()
    assert hooked == [False, False, True, True, True, True, False, False, False, False]
    assert prof.window == (2, 5) and len(prof.clock.wall_ms) == 4
    assert all(4.0 <= ms < 40.0 for ms in prof.clock.wall_ms), prof.clock.wall_ms
    report = prof.report
    timed = report.trace.meta["roofline"]["unprofiled_steps"]
    # CUDA events beside the wall clock where CUDA runs (the suite on a GPU machine has it running by now)
    events = torch.cuda.is_available() and torch.cuda.is_initialized()
    assert timed["wall_ms"] == prof.clock.wall_ms and len(timed["gpu_ms"]) == (4 if events else 0)
    o = report.overhead
    assert o is not None and o.steps == 4 and o.step_ms == pytest.approx(statistics.median(timed["wall_ms"]))
    assert report.totals["unprofiled"]["step_ms"] == o.step_ms and report.timeline.steps == 3


@pytest.mark.parametrize("skip, active, counted", [(0, None, []), (0, 2, [3, 4, 5]), (1, 2, [4, 5]),
                                                   (2, None, []), (4, 1, [1, 2])])
def test_which_steps_the_clock_times(skip, active, counted):
    clock = capture.StepClock(roofline.profile(skip=skip, active=active).window)
    assert [s for s in range(6) if clock._counts(s)] == counted


def test_an_optimizer_s_parameters_cost_its_unrecorded_tensor_lists():
    params = [torch.nn.Parameter(torch.randn(16, 8)) for _ in range(40)]   # too many for the profiler's lists
    optimizer = torch.optim.AdamW(params, fused=True)
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    with roofline.profile() as prof:
        for _ in range(3):
            optimizer.step()
            prof.step()
    facts = prof.report.trace.meta["roofline"]["optimizers"]
    assert facts == [{"class": "AdamW", "tensors": 40, "numel": 40 * 128, "itemsize": 4}]
    (row,) = [o for o in prof.report.ops if o.name == "aten::_fused_adamw_"]
    assert row.shapes[0] == []   # what the profiler recorded of the parameter list
    assert row.rule == "optimizer" and row.count == 3 and row.bytes == 3 * 7 * 40 * 128 * 4
    assert "40 parameters" in row.note


def test_the_window_s_edges_leave_torch_s_optimizer_hooks_alone():
    # run_program marks steps from an optimizer hook: a hook added or removed when the window opens or closes
    # would change torch's table while torch iterates it ("OrderedDict mutated during iteration" on torch 2.11)
    from torch.optim.optimizer import _global_optimizer_post_hooks

    weight = torch.nn.Parameter(torch.randn(4))
    weight.grad = torch.ones(4)
    optimizer = torch.optim.SGD([weight], lr=0.1)
    seen = []
    with roofline.profile(skip=2, active=2) as prof:
        for _ in range(6):
            optimizer.step()
            seen.append(tuple(_global_optimizer_post_hooks))
            prof.step()
    assert len(set(seen)) == 1 and len(seen[0]) >= 1


def test_the_priming_recording_keeps_out_of_the_programs_way(monkeypatch):
    """No priming recording where CUDA has not started, a stream is being captured, or a recording runs: each
    would change the program (a device picked, a graph broken, a profiler started inside another)."""
    from roofline.profiler import capture

    def no_recording(*args, **kwargs):
        raise AssertionError("a priming recording was made")

    monkeypatch.setattr(capture.torch.profiler, "profile", no_recording)
    for started, capturing, recording in ((False, False, False), (True, True, False), (True, False, True)):
        monkeypatch.setattr(capture.torch.cuda, "is_initialized", lambda: started)
        monkeypatch.setattr(capture.torch.cuda, "is_current_stream_capturing", lambda: capturing)
        monkeypatch.setattr(capture.torch._C._autograd, "_profiler_enabled", lambda: recording)
        capture._prime_cupti()
    monkeypatch.setattr(capture.torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(capture.torch._C._autograd, "_profiler_enabled", lambda: False)
    with pytest.raises(AssertionError, match="priming recording"):   # and one where none of them holds
        capture._prime_cupti()


@pytest.mark.parametrize("cuda, user, expected", [("13.0", None, "1"), ("12.6", None, "1"), ("12.4", None, None),
                                                  ("13.0", "0", "0")])
def test_cupti_is_finalized_when_recording_stops(monkeypatch, cuda, user, expected):
    """Left subscribed, CUPTI slows every launch after the window, the steps that stand for the program without
    the profiler; the user's own TEARDOWN_CUPTI stands, and CUDA before 12.6 keeps CUPTI."""
    from roofline.profiler import capture

    monkeypatch.setenv("TEARDOWN_CUPTI", "")   # recorded, so that the test's own setting is undone after it
    monkeypatch.delenv("TEARDOWN_CUPTI")
    if user is not None:
        monkeypatch.setenv("TEARDOWN_CUPTI", user)
    monkeypatch.setattr(capture.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(capture.torch.version, "cuda", cuda)
    primed = []
    monkeypatch.setattr(capture, "_prime_cupti", lambda: primed.append(True))
    capture._teardown_cupti_at_stop()
    assert capture.os.environ.get("TEARDOWN_CUPTI") == expected
    # a recording thrown away first, exactly where the finalize was turned on here
    assert primed == ([True] if expected == "1" else [])


def test_the_window_s_own_sync_at_exit_is_on_no_line_of_the_program():
    """What runs after the program's last line in the window (roofline's own synchronization at exit) is charged
    to no line: the last mark names no stack."""
    x = torch.randn(16, 16)
    with roofline.profile() as prof:
        y = x @ x
        y.sum()
    trace = prof.report.trace
    (tid, (times, ids)), = trace.marks.items()
    assert ids[-1] == -1 and stack_at(trace, tid, times[-1] + 1.0) is None
    assert stack_at(trace, tid, times[-2])[-1][2] == "test_the_window_s_own_sync_at_exit_is_on_no_line_of_the_program"


def test_a_failing_sync_after_the_window_hides_neither_the_program_s_error_nor_the_recording(monkeypatch, tmp_path):
    """The sync after the recording stops only lets Kineto finalize CUPTI: a CUDA error it raised would be the
    program's (its next sync raises it), and must not replace the program's own exception or lose the trace."""
    calls = []

    def sync():   # the window's syncs in order: before it, at its end (inside), after the recording stopped
        calls.append(len(calls))
        if len(calls) == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
    monkeypatch.setattr(capture, "_sync_if_cuda", sync)
    prof = roofline.profile(trace=tmp_path / "t.json")
    with pytest.raises(ValueError, match="the program's own"):
        with prof:
            torch.ones(3).sum()
            raise ValueError("the program's own")
    assert calls == [0, 1, 2] and prof.recorded and (tmp_path / "t.json").exists()


@pytest.mark.parametrize("skip, active, length, timed", [(1, 2, 4, 0), (1, 2, 6, 2), (3, 2, 7, 2), (5, 2, 7, 3),
                                                         (1, 2, 7, 3)])
def test_the_hint_when_too_few_steps_are_timed_outside_the_window_holds(skip, active, length, timed):
    """What the report tells a window with too few steps timed outside it (skip 5 or more steps, or run 4 or more
    after the recorded ones) is what StepClock times: either is enough (steps before and after the window add up,
    so less of both can be enough too: here it is not)."""
    from roofline.profiler.overhead import MIN_TIMED, sentence

    window = capture.Profiler(skip=skip, active=active).window
    clock = capture.StepClock(window)
    for ended in range(length):
        clock.boundary(ended)
    assert len(clock.wall_ms) == timed
    hint = sentence({"steps": active}, gpu=False)
    assert f"skip {MIN_TIMED + 2} or more steps" in hint and f"{MIN_TIMED + 1} or more steps after the recorded" in hint
    after = length - 1 - window[1]
    if skip >= MIN_TIMED + 2 or after >= MIN_TIMED + 1:
        assert timed >= MIN_TIMED
    else:
        assert timed < MIN_TIMED


def test_two_steps_timed_are_too_few_to_say_what_the_profiler_cost():
    """One slow step among two (DDP's second rebuilds its buckets) would be half the median: no figure at all."""
    with roofline.profile(skip=3, active=2) as prof:
        for _ in range(7):
            torch.ones(8).sum()
            prof.step()
    assert len(prof.clock.wall_ms) == 2 and prof.report.overhead is None
    console = Console(record=True, width=100)
    prof.report.print(console)
    assert "fewer than 3 steps ran outside the recorded window" in " ".join(console.export_text().split())
