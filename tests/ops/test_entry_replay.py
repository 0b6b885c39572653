"""Entry points replayed from C++ as a whole (roofline.ops._eager_node.entry_replay, which the ops' entry points take
where ROOFLINE_FORWARD_REPLAY=1): a call is recorded at its
signature's first call and replayed after, with the results and gradients Python would give; whatever the record
cannot hold (a dispatch mode, a profiler, a subclass, torch.compile, another backend, autograd.Function) runs the
entry point in Python. The entry points here are made of torch ops, so that they replay on the CPU too; every op's
own is checked on a GPU."""

import pytest
import torch
from ops_checks import DEVICE
from test_eager_node import Seen, SinePlan, _rule, _save
from test_launch import CALLS, _run

from roofline import ops
from roofline.ops import _eager_node
from roofline.ops._runtime import KernelOp
from roofline.ops._eager_node import entry_replay
from roofline.ops._launch import clear_plans

pytestmark = pytest.mark.eager_node   # every test here checks the C++ node or its replays

RUNS: list[str] = []   # the entry points' runs in Python, by name


@entry_replay
def scaled_sine(x, factor=3.0, *, shape=None, backend=None):
    RUNS.append("scaled_sine")
    y = torch.sin(x) * factor
    return y if shape is None else y.reshape(shape)


@entry_replay
def sine_and_product(x, y):
    RUNS.append("sine_and_product")
    return torch.sin(x), torch.mm(x, y)


@entry_replay
def sines_into_new_memory(x):
    """Each kind of allocation a replay makes by the allocator directly, then filled."""
    RUNS.append("sines_into_new_memory")
    like = torch.sin(x, out=torch.empty_like(x))
    fresh = torch.cos(x, out=torch.empty(x.shape, dtype=x.dtype, device=x.device))
    new = torch.sin(x.flatten(), out=x.new_empty(x.numel()))
    strided = torch.empty_strided((x.shape[1], x.shape[0]), (1, x.shape[1]), dtype=x.dtype, device=x.device)
    return like, fresh, new, torch.cos(x.t(), out=strided)


TICKETS: list[tuple] = []   # the host step's calls: (the tensor it was given, the constant)
ISSUED = torch.zeros(1, dtype=torch.float64)   # advanced by the host step's own aten call


def next_ticket(x, step):
    """Host-side state a replay must consult at every call, as the loss ops' check of their targets does: a count
    kept in Python, raising past a limit, and aten calls of its own, which the program must not replay (an add_
    replayed as well would advance ISSUED twice a call)."""
    TICKETS.append((x, step))
    if len(TICKETS) * step > 10:
        raise ValueError("out of tickets")
    ISSUED.add_(step)
    return ISSUED.to(x.device, copy=True)


@entry_replay
def ticketed_sine(x, step=1):
    RUNS.append("ticketed_sine")
    return torch.sin(x) + _eager_node.host_step(next_ticket, x, step)


SETTING = ["sine"]   # what by_setting's Python reads besides its arguments


@entry_replay(settings=lambda: SETTING[0])
def by_setting(x):
    RUNS.append(SETTING[0])
    return torch.sin(x) if SETTING[0] == "sine" else torch.cos(x)


BROKEN = [None]   # what halves hands back instead of its two tensors


def halves(x):
    """Two tensors, as recorded; at a replay with BROKEN set, not what was recorded."""
    return {"none": None, "one": x.clone(), "list": [x, x], "numbers": (1, 2)}.get(BROKEN[0], (x * 0.5, x * 0.5))


@entry_replay
def halves_summed(x):
    RUNS.append("halves_summed")
    a, b = _eager_node.host_step(halves, x)
    return a + b


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Entry points recorded on this test's device, with nothing recorded yet."""
    monkeypatch.setattr(_eager_node, "ENTRY_DEVICES", ("cuda", "cpu"))
    monkeypatch.setattr(_eager_node, "REPLAY_FORWARDS", True)
    _eager_node.forget_entries()
    RUNS.clear()
    TICKETS.clear()
    ISSUED.zero_()


def _x(*shape, dtype=torch.float64):
    return torch.randn(*shape, dtype=dtype, device=DEVICE)


def test_a_recorded_entry_point_replays_without_python_on_fresh_inputs():
    for _ in range(4):
        x = _x(5, 7)
        torch.testing.assert_close(scaled_sine(x), torch.sin(x) * 3.0, rtol=0, atol=0)
    assert RUNS == ["scaled_sine"] and scaled_sine.replays.programs.replayed() == 3
    for _ in range(3):
        x, y = _x(4, 3), _x(3, 6)
        sine, product = sine_and_product(x, y)
        torch.testing.assert_close(sine, torch.sin(x), rtol=0, atol=0)
        torch.testing.assert_close(product, x @ y, rtol=0, atol=0)
    assert RUNS.count("sine_and_product") == 1


def test_each_value_of_an_entry_point_s_settings_replays_its_own_recorded_calls():
    """A module's switch set call by call (flash_attention's Hopper forward, timed beside the tiled one): a call
    recorded under one value is never replayed under another."""
    x = _x(3, 4)
    for setting in ("sine", "cosine") * 4:
        SETTING[0] = setting
        expected = torch.sin(x) if setting == "sine" else torch.cos(x)
        torch.testing.assert_close(by_setting(x), expected, rtol=0, atol=0)
    SETTING[0] = "sine"
    assert RUNS == ["sine", "cosine"]   # each value recorded once, then replayed


def test_the_replay_builtin_refuses_what_is_not_a_call():
    scaled_sine(_x(2, 3))
    replay = scaled_sine.replays.replay
    assert replay((_x(9, 9),), None) is None   # a signature never recorded: record one
    for args in (([_x(2, 3)], {}), ((_x(2, 3),), [])):
        with pytest.raises(TypeError, match=r"replay\(args: tuple, kwargs: dict \| None\)"):
            replay(*args)


def test_past_its_limit_an_entry_point_forgets_the_signature_unused_the_longest():
    """A process that has called an op with many signatures (another model's, every prefill length) still replays
    the signatures it calls now: the least recently used one makes room, and comes back by being recorded again."""
    scaled_sine(_x(1, 3))
    limit = scaled_sine.replays.programs.limit
    shapes = [(rows, 3) for rows in range(1, limit + 6)]
    for shape in shapes[1:]:
        scaled_sine(_x(*shape))
    assert RUNS.count("scaled_sine") == limit + 5 and scaled_sine.replays.programs.size() == limit
    replayed = scaled_sine.replays.programs.replayed()
    for shape in reversed(shapes[5:]):   # the last `limit` recorded: each replayed, none recorded again
        x = _x(*shape)
        torch.testing.assert_close(scaled_sine(x), torch.sin(x) * 3.0, rtol=0, atol=0)
    assert RUNS.count("scaled_sine") == limit + 5
    assert scaled_sine.replays.programs.replayed() == replayed + limit
    x = _x(*shapes[0])   # forgotten: recorded again, in place of the one unused the longest (the last shape)
    torch.testing.assert_close(scaled_sine(x), torch.sin(x) * 3.0, rtol=0, atol=0)
    scaled_sine(_x(*shapes[0]))
    assert RUNS.count("scaled_sine") == limit + 6
    scaled_sine(_x(*shapes[-1]))
    assert RUNS.count("scaled_sine") == limit + 7 and scaled_sine.replays.programs.size() == limit


def test_recording_stops_once_recordings_are_wasted():
    """Calls of ever new shapes (each prefill length) would be recorded, at several times a call's cost, and never
    replayed: once waste_limit recordings were forgotten unused, new signatures run in Python unrecorded, and the
    signatures recorded keep replaying."""
    scaled_sine(_x(1, 3))
    programs = scaled_sine.replays.programs
    limit, waste = programs.limit, programs.waste_limit
    for rows in range(2, limit + waste + 1):   # each once: past the limit, each evicts one never replayed
        assert not programs.full()
        scaled_sine(_x(rows, 3))
    assert programs.full() and programs.size() == limit
    runs, replayed = len(RUNS), programs.replayed()
    x = _x(limit + waste + 1, 3)
    for _ in range(2):   # a new signature: Python both times, not recorded
        torch.testing.assert_close(scaled_sine(x), torch.sin(x) * 3.0, rtol=0, atol=0)
    assert len(RUNS) == runs + 2 and programs.size() == limit
    y = _x(limit + waste, 3)   # the last one recorded still replays
    torch.testing.assert_close(scaled_sine(y), torch.sin(y) * 3.0, rtol=0, atol=0)
    assert len(RUNS) == runs + 2 and programs.replayed() == replayed + 1


def test_a_host_step_runs_again_at_every_replay_with_that_calls_tensors():
    """host_step's function is called by each replay (with the call's own tensor, and the recorded constant), its
    result taken fresh; its own aten calls are not part of the program; an exception it raises stops the replay."""
    x, y = _x(5), _x(5)
    torch.testing.assert_close(ticketed_sine(x, 2), torch.sin(x) + 2, rtol=0, atol=0)   # recorded
    for expected, t in ((4, y), (6, x), (8, y), (10, x)):   # replayed: a new ticket each call
        torch.testing.assert_close(ticketed_sine(t, 2), torch.sin(t) + expected, rtol=0, atol=0)
        assert TICKETS[-1][0] is t and TICKETS[-1][1] == 2
    assert RUNS == ["ticketed_sine"] and ticketed_sine.replays.programs.replayed() == 4
    with pytest.raises(ValueError, match="out of tickets"):
        ticketed_sine(x, 2)
    assert RUNS == ["ticketed_sine"] and len(TICKETS) == 6


def test_a_host_step_returning_other_than_it_was_recorded_with_raises():
    """A replay checks what a host step hands back (a clear error, never a crash on a non-tensor)."""
    x = _x(4)
    for _ in range(3):
        torch.testing.assert_close(halves_summed(x), x, rtol=0, atol=0)
    assert halves_summed.replays.programs.replayed() == 2
    try:
        for kind in ("none", "one", "list", "numbers"):
            BROKEN[0] = kind
            with pytest.raises(RuntimeError, match="a host step returned"):
                halves_summed(x)
    finally:
        BROKEN[0] = None


def test_replayed_allocations_have_the_recorded_layouts_and_honour_the_deterministic_fill():
    """torch.empty, empty_like, new_empty and empty_strided are made by the allocator directly at replay: with the
    layouts the Python call gives (empty_like keeps a transposed input's strides), fresh memory at each call, and
    the NaN fill of torch.use_deterministic_algorithms where that is on (the recorded call runs then)."""
    for x in (_x(6, 5), _x(5, 6).t()):
        outputs = []
        for _ in range(3):
            outputs.append(sines_into_new_memory(x))
            for got, python in zip(outputs[-1], sines_into_new_memory.__wrapped__(x)):   # as Python makes them
                torch.testing.assert_close(got, python, rtol=0, atol=0)
                assert got.stride() == python.stride() and got.dtype == x.dtype and got.device == x.device
        pointers = {t.data_ptr() for out in outputs for t in out}
        assert len(pointers) == 4 * len(outputs)   # nothing shared between calls
    assert RUNS.count("sines_into_new_memory") == 2 + 6   # recorded once per layout, and the Python references
    assert sines_into_new_memory.replays.programs.replayed() == 4

    @entry_replay
    def uninitialized(x):
        return torch.empty_like(x)

    x = _x(4, 4)
    uninitialized(x)
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert uninitialized(x).isnan().all()
    finally:
        torch.use_deterministic_algorithms(was)
    assert uninitialized.replays.programs.replayed() == 1


def test_each_signature_is_recorded_once():
    """A layout, dtype, constant, keyword or keyword order of its own is another signature; a shape given as a
    list or a tuple of the same ints is the same."""
    calls = [
        lambda: (_x(5, 7), {}),
        lambda: (_x(7, 5).t(), {}),                                  # transposed
        lambda: (_x(5, 7, dtype=torch.float32), {}),                 # another dtype
        lambda: (_x(5, 7), dict(factor=2.0)),                        # another constant, by keyword
        lambda: (_x(5, 7), dict(shape=(35,))),                       # a shape
        lambda: (_x(5, 7), dict(shape=(35,), backend=None)),         # another keyword
        lambda: (_x(5, 7), dict(backend=None, shape=(35,))),         # the same in another order
    ]
    for make in calls:
        for _ in range(2):
            x, kwargs = make()
            y = torch.sin(x) * kwargs.get("factor", 3.0)
            expected = y if "shape" not in kwargs else y.reshape(kwargs["shape"])
            torch.testing.assert_close(scaled_sine(x, **kwargs), expected, rtol=0, atol=0)
    assert len(RUNS) == len(calls)
    x = _x(5, 7)
    torch.testing.assert_close(scaled_sine(x, shape=[35]), (torch.sin(x) * 3.0).reshape(35), rtol=0, atol=0)
    assert len(RUNS) == len(calls)   # [35] is (35,)
    scaled_sine(x, backend="triton")
    scaled_sine(x, backend="".join(["tri", "ton"]))   # an equal str, another object: the same signature
    assert len(RUNS) == len(calls) + 1


SINE_PLAN = SinePlan()


def _sine_forward(x: torch.Tensor, factor: float) -> torch.Tensor:
    return SINE_PLAN.forward(x, factor)


def _sine_backward(dy: torch.Tensor, x: torch.Tensor, factor: float) -> torch.Tensor:
    return SINE_PLAN.backward(dy, x, factor)


SINE = KernelOp("test_entry_sine", forward=_sine_forward, forward_fake=lambda x, factor: torch.empty_like(x),
                backward=_sine_backward, backward_fake=lambda dy, x, factor: torch.empty_like(x), setup_context=_save,
                backward_rule=_rule, plan=lambda x, factor: SINE_PLAN)


@entry_replay
def sine_op(x, factor=3.0):
    """An entry point around a KernelOp, as roofline's are: views before the op, its node, a view after."""
    RUNS.append("sine_op")
    rows = x.reshape(-1, x.shape[-1])
    grad = torch.is_grad_enabled() and rows.requires_grad
    return SINE.eager(SINE_PLAN, grad, rows, factor).view(x.shape)


def test_a_call_that_wants_a_gradient_replays_with_the_ops_node():
    """The record of a call that wants a gradient attaches the op's node to the replayed outputs; the gradient
    flows through it (its backward replayed too) and through the views around it, to the input."""
    sine_op.replays.programs = None
    SINE_PLAN.__dict__.pop("eager_programs", None)
    backwards = SINE_PLAN.backwards
    for _ in range(4):
        x = _x(3, 2, 5).requires_grad_()
        y = sine_op(x)
        assert y.grad_fn.name() == "ViewBackward0"
        assert y.grad_fn.next_functions[0][0].name() == "roofline::test_entry_sine_backward"
        dy = torch.randn_like(y)
        (dx,) = torch.autograd.grad(y, x, dy)
        torch.testing.assert_close(dx, torch.cos(x.detach()) * 3.0 * dy)
    assert RUNS == ["sine_op"] and sine_op.replays.programs.replayed() == 3
    assert SINE_PLAN.backwards == backwards + 1   # the first backward, recorded; then replayed by the nodes
    with torch.no_grad():   # whether autograd records is part of the signature
        assert sine_op(x).grad_fn is None
    assert sine_op(x.detach()).grad_fn is None   # the same signature: no gradient wanted
    assert len(RUNS) == 2


class SineAndWordPlan(SinePlan):
    """Its forward hands back a word it holds beside the result, marked non-differentiable: the same tensor at every
    call, as cross_entropy's unread counts are."""

    def __init__(self):
        super().__init__()
        self.word = torch.zeros(2, dtype=torch.int32, device=DEVICE)

    def forward(self, x, factor):
        return super().forward(x, factor), self.word


WORD_PLAN = SineAndWordPlan()


def _word_forward(x: torch.Tensor, factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    return WORD_PLAN.forward(x, factor)


def _save_and_mark_the_word(ctx, inputs, output):
    _save(ctx, inputs, output)
    ctx.mark_non_differentiable(output[1])


WORD_SINE = KernelOp("test_entry_word_sine", forward=_word_forward,
                     forward_fake=lambda x, factor: (torch.empty_like(x), x.new_empty(2, dtype=torch.int32)),
                     backward=_sine_backward, backward_fake=lambda dy, x, factor: torch.empty_like(x),
                     setup_context=_save_and_mark_the_word, backward_rule=_rule, plan=lambda x, factor: WORD_PLAN)


@entry_replay
def sine_beside_a_held_word(x, factor=3.0):
    RUNS.append("sine_beside_a_held_word")
    return WORD_SINE.eager(WORD_PLAN, torch.is_grad_enabled() and x.requires_grad, x, factor)[0]


def test_a_call_whose_node_has_an_output_the_plan_holds_replays():
    for _ in range(4):
        x = _x(3, 4).requires_grad_()
        dy = torch.randn(3, 4, dtype=torch.float64, device=DEVICE)
        (dx,) = torch.autograd.grad(sine_beside_a_held_word(x), x, dy)
        torch.testing.assert_close(dx, torch.cos(x.detach()) * 3.0 * dy)
    assert RUNS == ["sine_beside_a_held_word"] and sine_beside_a_held_word.replays.programs.replayed() == 3


def test_a_replayed_node_backpropagates_twice_and_into_a_second_order_gradient():
    sine_op.replays.programs = None
    for _ in range(3):
        x = _x(4, 3).requires_grad_()
        y = sine_op(x)
        (dx,) = torch.autograd.grad(y.sum(), x, create_graph=True)   # the node's Python backward, with a graph
        torch.testing.assert_close(dx, torch.cos(x.detach()) * 3.0)
        y.sum().backward()
        torch.testing.assert_close(x.grad, torch.cos(x.detach()) * 3.0)
    assert len(RUNS) == 1


def test_an_entry_point_whose_gradient_comes_from_autograd_function_is_not_replayed():
    """An op without the node (torch.autograd.Function) attaches nothing a record could hold: its calls that
    want a gradient run in Python every time."""

    @entry_replay
    def through_function(x):
        RUNS.append("through_function")
        return torch.sin(x)   # aten's own autograd, seen by no recording

    for _ in range(3):
        x = _x(3).requires_grad_()
        (dx,) = torch.autograd.grad(through_function(x).sum(), x)
        torch.testing.assert_close(dx, torch.cos(x.detach()))
    assert RUNS == ["through_function"] * 3
    assert "not made by an op's node" in _eager_node.refusals["roofline::through_function"]


def test_dispatch_modes_profilers_and_subclasses_see_the_python_entry_point():
    x = _x(3, 3)
    scaled_sine(x)
    with Seen() as seen:
        scaled_sine(x)
    assert "aten.sin.default" in seen.ops and len(RUNS) == 2
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        scaled_sine(x)
    assert len(RUNS) == 3

    class Marked(torch.Tensor):
        pass

    marked = x.as_subclass(Marked)
    for _ in range(2):
        assert type(scaled_sine(marked)) is Marked   # as torch ops give it
    assert len(RUNS) == 5
    scaled_sine(torch.nn.Parameter(x, requires_grad=False))   # a Parameter is a tensor to C++ (weights are)
    assert len(RUNS) == 5


def test_autocast_is_part_of_the_signature():
    """Under autocast the record holds the calls autocast made (the product in bfloat16), replayed as they are;
    outside it, the same layouts have a record of their own."""
    x, y = _x(4, 8, dtype=torch.float32), _x(8, 2, dtype=torch.float32)
    for _ in range(2):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            sine, product = sine_and_product(x, y)
            expected = x @ y
        assert product.dtype == torch.bfloat16 and sine.dtype == torch.float32
        torch.testing.assert_close(product, expected, rtol=0, atol=0)
    for _ in range(2):
        assert sine_and_product(x, y)[1].dtype == torch.float32
    assert len(RUNS) == 2


def test_other_backends_and_torch_compile_run_the_python_entry_point():
    x = _x(6)
    for _ in range(2):
        scaled_sine(x, backend="torch")
    assert len(RUNS) == 2
    compiled = torch.compile(lambda t: scaled_sine(t) + 1, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x), torch.sin(x) * 3.0 + 1)


def test_clearing_the_plans_forgets_the_recorded_calls():
    """A test or a tuning run that patches a setting and clears the plans gets calls that build plans anew, not
    replays of the kernels built before."""
    x = _x(2, 3)
    scaled_sine(x)
    scaled_sine(x)
    clear_plans()
    assert scaled_sine.replays.programs is None
    scaled_sine(x)
    assert len(RUNS) == 2


def test_with_replays_off_every_call_runs_in_python(monkeypatch):
    monkeypatch.setattr(_eager_node, "REPLAY_FORWARDS", False)
    for _ in range(3):
        scaled_sine(_x(2, 2))
    assert len(RUNS) == 3 and scaled_sine.replays.programs is None


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(set(CALLS) - {"cross_entropy"}))
def test_gpu_every_entry_point_replays_with_torchs_results(name, monkeypatch):
    """Each op's entry point, replayed (as ROOFLINE_FORWARD_REPLAY=1 has it), is recorded at its first warm call
    (the first compiles) and replayed after, with fresh inputs each time, with and without a gradient; _run checks
    every call's outputs and gradients against torch's."""
    entry = entry_replay(getattr(getattr(ops, name), "__wrapped__", getattr(ops, name)))
    monkeypatch.setattr(ops, name, entry)
    for grad in (False, True) * 4:
        _run(name, grad)
    assert f"roofline::{name}" not in _eager_node.refusals, _eager_node.refusals.get(f"roofline::{name}")
    assert entry.replays.programs.replayed() >= 4


@pytest.mark.gpu
def test_gpu_replayed_allocations_come_from_torchs_caching_allocator():
    """What a replay allocates directly is torch's CUDA memory as torch.empty makes it: counted by the caching
    allocator while it lives, given back when it dies, on the stream of the call."""
    x = torch.randn(1024, 1024, device="cuda")
    sines_into_new_memory(x)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    outputs = sines_into_new_memory(x)
    assert sines_into_new_memory.replays.programs.replayed() == 1
    assert torch.cuda.memory_allocated() - before == 4 * x.numel() * x.element_size()
    for got, python in zip(outputs, sines_into_new_memory.__wrapped__(x)):
        torch.testing.assert_close(got, python, rtol=0, atol=0)
    del outputs, got, python
    assert torch.cuda.memory_allocated() == before
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = torch.randn(1024, 1024, device="cuda")
        outputs = sines_into_new_memory(y)
        torch.testing.assert_close(outputs[0], torch.sin(y), rtol=0, atol=0)
    stream.synchronize()
    assert sines_into_new_memory.replays.programs.replayed() == 2
