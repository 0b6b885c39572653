"""The C++ autograd node of eager calls: it behaves as a torch.autograd.Function does (saved tensors, version
checks, retain_graph, hooks, errors), and a backward recorded once replays without Python, giving the same
gradients; what cannot be replayed runs in Python."""

import gc
import shutil
import subprocess
import sys
import weakref

import pytest
import torch
import torch.nn.functional as F
from ops_checks import DEVICE
from test_launch import CALLS, _run
from torch.utils._python_dispatch import TorchDispatchMode

import roofline
from roofline import ops
from roofline.ops import _eager_node
from roofline.ops._runtime import KernelOp

pytestmark = pytest.mark.eager_node   # every test here checks the C++ node or its replays


class SinePlan:
    """A plan whose kernels are torch ops: sin(x) * factor forward, its backward with an allocation, a view and
    in-place ops, all through the dispatcher, so that a backward is replayable on any device."""

    def __init__(self):
        self.backwards = 0   # the Python backwards run

    def forward(self, x, factor):
        with torch.no_grad():
            return torch.sin(x) * factor

    def backward(self, dy, x, factor):
        self.backwards += 1
        with torch.no_grad():   # as a kernel: no autograd history, also under create_graph=True
            dx = torch.empty_like(x)
            torch.cos(x, out=dx)
            return dx.view(-1).mul_(factor).view(x.shape).mul_(dy)


PLAN = SinePlan()


def _save(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.factor = inputs[1]
    ctx.raise_in_backward = False


def _rule(ctx, run_backward, dy, *_others):   # _others: gradients of outputs beside the result
    (x,) = ctx.saved_tensors
    if ctx.raise_in_backward:
        raise ValueError("raised in the backward")
    if dy is None:   # no loss reached the output (gradcheck tries it)
        return None, None
    return run_backward(dy, x, ctx.factor), None


def _forward(x: torch.Tensor, factor: float) -> torch.Tensor:
    return PLAN.forward(x, factor)


def _backward(dy: torch.Tensor, x: torch.Tensor, factor: float) -> torch.Tensor:
    return PLAN.backward(dy, x, factor)


SINE = KernelOp("test_sine", forward=_forward, forward_fake=lambda x, factor: torch.empty_like(x),
                backward=_backward, backward_fake=lambda dy, x, factor: torch.empty_like(x),
                setup_context=_save, backward_rule=_rule, plan=lambda x, factor: PLAN)


def sine(x, factor=3.0):
    return SINE.eager(PLAN, True, x, factor)


def _x(*shape):
    return torch.randn(*shape, dtype=torch.float64, device=DEVICE, requires_grad=True)


def _expected(x, dy, factor=3.0):
    return torch.cos(x.detach()) * factor * dy


def test_the_node_is_torchs_c_node_named_after_the_op():
    y = sine(_x(4, 5))
    assert y.grad_fn.name() == "roofline::test_sine_backward"
    assert type(y.grad_fn).__name__ == "CppFunction"
    assert y.grad_fn.next_functions[0][0] is not None and y.grad_fn.next_functions[1] == (None, 0)


def test_a_recorded_backward_replays_without_python():
    x = _x(6, 7)
    sine(x).backward(torch.ones(6, 7, dtype=torch.float64, device=DEVICE))
    before = PLAN.backwards
    for _ in range(3):
        x, dy = _x(6, 7), torch.randn(6, 7, dtype=torch.float64, device=DEVICE)
        (dx,) = torch.autograd.grad(sine(x), x, dy)
        torch.testing.assert_close(dx, _expected(x, dy))
    assert PLAN.backwards == before, "a backward with a recorded signature ran in Python"


def test_a_new_signature_is_recorded_once():
    x = _x(3, 9)
    dy = torch.randn(9, 3, dtype=torch.float64, device=DEVICE).t()   # non-contiguous: another signature
    torch.autograd.grad(sine(x), x, dy)
    before = PLAN.backwards
    x = _x(3, 9)
    dy = torch.randn(9, 3, dtype=torch.float64, device=DEVICE).t()
    (dx,) = torch.autograd.grad(sine(x), x, dy)
    torch.testing.assert_close(dx, _expected(x, dy))
    assert PLAN.backwards == before


def test_gradcheck_through_the_replay():
    x = _x(3, 4)
    assert torch.autograd.gradcheck(sine, (x,))


class Seen(TorchDispatchMode):
    """A dispatch mode that notes the aten calls it sees."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_create_graph_and_dispatch_modes_see_the_python_backward():
    x = _x(5)
    torch.autograd.grad(sine(x), x, torch.ones(5, dtype=torch.float64, device=DEVICE))   # recorded
    before = PLAN.backwards
    x = _x(5)
    y = sine(x)
    seen = Seen()
    with seen:
        (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert PLAN.backwards == before + 1 and "aten.cos.out" in seen.ops
    torch.testing.assert_close(dx, _expected(x, 1.0))
    (dx,) = torch.autograd.grad(sine(x), x, torch.ones_like(y), create_graph=True)
    assert PLAN.backwards == before + 2
    torch.testing.assert_close(dx, _expected(x, 1.0))


def test_saved_tensors_are_checked_and_freed_as_autograd_does():
    x = _x(4)
    h = x * 1
    y = sine(h)
    h.add_(1)   # modifies what the backward needs
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
    y = sine(_x(4))
    y.sum().backward(retain_graph=True)
    y.sum().backward()   # kept for a second time
    with pytest.raises(RuntimeError, match="retain_graph"):
        y.sum().backward()


@pytest.mark.parametrize("backward", [False, True], ids=["forward", "forward+backward"])
def test_outputs_and_what_they_saved_are_freed(backward):
    """softmax saves its output: the node must not keep it (nor itself) alive through its context."""
    x = torch.randn(4, 33, device=DEVICE, requires_grad=True)
    y = ops.softmax(x, -1, backend="triton")
    if backward:
        y.sum().backward(retain_graph=True)
    output = weakref.ref(y)
    del y
    gc.collect()
    assert output() is None


def test_saved_tensor_hooks_apply():
    packed = []

    def pack(t):
        packed.append(t.shape)
        return t.clone()

    x = _x(3, 2)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = sine(x)
    assert packed == [torch.Size([3, 2])]
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(dx, _expected(x, 1.0))


def _attached(x, factor, *, outputs=None, non_differentiable=(), **attrs):
    """sine(x, factor) through attach as KernelOp.eager calls it, the context carrying `attrs`; `outputs`: what
    the forward returns (its result and other tensors)."""
    ctx = _eager_node.EagerContext(PLAN)
    out = PLAN.forward(x, factor)
    _save(ctx, (x, factor), out)
    ctx.__dict__.update(attrs)
    ctx.mark_non_differentiable(*non_differentiable)
    outputs = outputs(out) if outputs else out
    _eager_node.attach(_eager_node.extension(), SINE.node_name, SINE._node_backward, ctx, (x, factor), outputs)
    return outputs


def test_an_error_in_the_backward_arrives_as_itself():
    y = _attached(_x(3), 7.0, raise_in_backward=True)
    with pytest.raises(ValueError, match="raised in the backward"):
        y.sum().backward()


_host_checks = []   # what each call of the checked sine's host step does: "pass" or "raise"


def _host_check():
    if _host_checks.pop(0) == "raise":
        raise ValueError("raised by a host step")
    return ()


def _checked_rule(ctx, run_backward, dy, *_others):
    _eager_node.host_step(_host_check)   # as cross_entropy's backward checks its targets
    return _rule(ctx, run_backward, dy)


CHECKED_SINE = KernelOp("test_checked_sine", forward=_forward, forward_fake=lambda x, factor: torch.empty_like(x),
                        backward=_backward, backward_fake=lambda dy, x, factor: torch.empty_like(x),
                        setup_context=_save, backward_rule=_checked_rule, plan=lambda x, factor: PLAN)


def test_a_host_steps_error_in_a_replayed_backward_arrives_as_itself():
    _host_checks[:] = ["pass"] * 3 + ["raise", "pass"]
    for _ in range(2):   # recorded
        CHECKED_SINE.eager(PLAN, True, _x(5), 3.0).sum().backward()
    before = PLAN.backwards
    CHECKED_SINE.eager(PLAN, True, _x(5), 3.0).sum().backward()
    assert PLAN.backwards == before and len(_host_checks) == 2   # replayed: the host step ran, no Python backward
    with pytest.raises(ValueError, match="raised by a host step"):
        CHECKED_SINE.eager(PLAN, True, _x(5), 3.0).sum().backward()
    x = _x(5)
    CHECKED_SINE.eager(PLAN, True, x, 3.0).sum().backward()   # and the next replays as before
    torch.testing.assert_close(x.grad, _expected(x, 1.0))
    assert PLAN.backwards == before and not _host_checks


def test_an_output_marked_non_differentiable_gets_no_gradient():
    other = torch.zeros(4, dtype=torch.float64, device=DEVICE)
    x = _x(4)
    out, kept = _attached(x, 2.0, outputs=lambda out: (out, other), non_differentiable=(other,))
    assert out.requires_grad and not kept.requires_grad
    (dx,) = torch.autograd.grad(out, x, torch.ones_like(out))
    torch.testing.assert_close(dx, _expected(x, 1.0, 2.0))


@pytest.mark.parametrize("name", sorted(CALLS))
def test_every_op_gets_the_node(name):
    make, ours, _ = CALLS[name]
    out = ours(*make(True))
    out = out if isinstance(out, tuple) else (out,)
    assert out[0].grad_fn.name().startswith("roofline::"), out[0].grad_fn


def test_under_the_interpreter_backwards_stay_in_python_and_say_why():
    if DEVICE == "cuda":
        pytest.skip("on a GPU the kernels launch from C++: test_ops_replay_on_the_gpu")
    for _ in range(2):
        _run("gelu", True)
    assert "Triton's interpreter" in _eager_node.refusals["roofline::gelu_backward"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CALLS))
def test_ops_replay_on_the_gpu(name):
    """Each op's backward, recorded on the first call, replays on the next ones with fresh inputs and gives
    torch's gradients (_run checks every gradient)."""
    for _ in range(3):
        _run(name, True)
    make, ours, _ = CALLS[name]
    node = (ours(*make(True)),)[0]
    node = (node if isinstance(node, tuple) else (node,))[0].grad_fn.name()
    assert node not in _eager_node.refusals, _eager_node.refusals[node]


@pytest.mark.gpu
def test_a_replay_launches_on_the_current_stream():
    x = torch.randn(64, 512, device="cuda", requires_grad=True)
    for _ in range(2):
        ops.layer_norm(x, (512,), backend="triton").sum().backward()
    side = torch.cuda.Stream()
    x.grad = None
    with torch.cuda.stream(side):
        dy = torch.randn(64, 512, device="cuda")
        y = ops.layer_norm(x, (512,), backend="triton")
        y.backward(dy)
    side.synchronize()
    ref = x.detach().clone().requires_grad_()
    F.layer_norm(ref, (512,)).backward(dy)
    torch.testing.assert_close(x.grad, ref.grad, atol=1e-4, rtol=1e-4)


# --------------------------------------------------------------------------- forwards replayed from C++

class CountedSinePlan(SinePlan):
    """SinePlan counting the forwards that run in Python."""

    def __init__(self):
        super().__init__()
        self.forwards = 0

    def forward(self, x, factor):
        self.forwards += 1
        return super().forward(x, factor)


REPLAYED_PLAN = CountedSinePlan()


def _forward_replayed(x: torch.Tensor, factor: float) -> torch.Tensor:
    return REPLAYED_PLAN.forward(x, factor)


REPLAYED = KernelOp("test_sine_replayed", forward=_forward_replayed, forward_fake=lambda x, factor: torch.empty_like(x),
                    backward=_backward, backward_fake=lambda dy, x, factor: torch.empty_like(x), setup_context=_save,
                    backward_rule=_rule, plan=lambda x, factor: REPLAYED_PLAN)


@pytest.fixture
def replayed(monkeypatch):
    """A sine op whose eager forwards are replayed from C++ (as ROOFLINE_FORWARD_REPLAY=1 has every op's), and its
    plan, with nothing recorded yet."""
    monkeypatch.setattr(REPLAYED, "replay_forward", True)
    REPLAYED_PLAN.forwards = 0
    REPLAYED_PLAN.__dict__.pop("forward_programs", None)
    REPLAYED_PLAN.__dict__.pop("forward_replay", None)
    return REPLAYED, REPLAYED_PLAN


def test_a_recorded_forward_replays_without_python(replayed):
    op, plan = replayed
    for _ in range(4):
        x = torch.randn(6, 7, dtype=torch.float64, device=DEVICE)
        torch.testing.assert_close(op.eager(plan, False, x, 3.0), torch.sin(x) * 3.0, rtol=0, atol=0)
    assert plan.forwards == 1   # the first call, recorded
    for other in ((torch.randn(6, 7, dtype=torch.float64, device=DEVICE), 2.0),       # another constant
                  (torch.randn(7, 6, dtype=torch.float64, device=DEVICE).t(), 3.0),   # another layout
                  (torch.randn(6, 7, dtype=torch.float32, device=DEVICE), 3.0)):      # another dtype
        for _ in range(2):
            torch.testing.assert_close(op.eager(plan, False, *other), torch.sin(other[0]) * other[1], rtol=0,
                                       atol=0)
    assert plan.forwards == 4   # each new signature recorded once, then replayed


def test_a_replayed_forward_gets_the_node_and_its_gradient(replayed):
    op, plan = replayed
    for _ in range(3):
        x, dy = _x(5, 4), torch.randn(5, 4, dtype=torch.float64, device=DEVICE)
        y = op.eager(plan, True, x, 3.0)
        assert y.grad_fn.name().startswith("roofline::test_sine_replayed")
        (dx,) = torch.autograd.grad(y, x, dy)
        torch.testing.assert_close(dx, _expected(x, dy))
    assert plan.forwards == 1


def test_a_forward_with_an_argument_a_replay_cannot_compare_runs_in_python_unrecorded(replayed):
    op, plan = replayed
    for _ in range(3):
        x = torch.randn(3, dtype=torch.float64, device=DEVICE)
        torch.testing.assert_close(op.eager(plan, False, x, torch.tensor(2.0).item() * 1j), torch.sin(x) * 2j)
    assert plan.forwards == 3 and plan.forward_programs.size() == 1   # kept, unreplayable: never recorded again


def test_dispatch_modes_see_the_python_forward_and_autocast_has_records_of_its_own(replayed):
    op, plan = replayed
    x = torch.randn(4, 4, dtype=torch.float64, device=DEVICE)
    op.eager(plan, False, x, 3.0)

    with Seen() as seen:
        op.eager(plan, False, x, 3.0)
    assert "aten.sin.default" in seen.ops and plan.forwards == 2
    for _ in range(2):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            op.eager(plan, False, x, 3.0)
    assert plan.forwards == 3   # recorded under autocast, then replayed
    op.eager(plan, False, x, 3.0)
    assert plan.forwards == 3


def test_an_op_whose_kernels_run_in_the_interpreter_is_recorded_once_and_says_why(monkeypatch):
    """A forward whose first call compiled its kernel is recorded at the next call instead (what a first call
    runs, an autotuner's timing runs among it, is no record); under Triton's interpreter that record cannot
    replay, and later calls run in Python, with torch's results."""
    if DEVICE == "cuda":
        pytest.skip("on a GPU the kernels launch from C++: test_gpu_forwards_replay")
    from roofline.ops.gelu import _gelu

    monkeypatch.setattr(_gelu, "replay_forward", True)
    _eager_node.refusals.pop("roofline::gelu", None)
    for _ in range(3):
        _run("gelu", False)
    assert "Triton's interpreter" in _eager_node.refusals["roofline::gelu"]


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(set(CALLS) - {"cross_entropy"}))
def test_gpu_forwards_replay(name, monkeypatch):
    """With forwards replayed (ROOFLINE_FORWARD_REPLAY=1), each op's forward, with and without a gradient, is
    recorded on its first warm call and replays on later ones with fresh inputs, giving torch's outputs and
    gradients."""
    import importlib

    for module, op in (("softmax", "_softmax_rows"), ("norm", "_norm_rows"), ("gelu", "_gelu"),
                       ("swiglu", "_swiglu_rows"), ("rope", "_rope"), ("attention", "_attention"),
                       ("linear", "_linear"), ("int8_linear", "_int8_linear")):
        monkeypatch.setattr(getattr(importlib.import_module(f"roofline.ops.{module}"), op), "replay_forward", True)
    for grad in (False, True) * 3:   # compiled, recorded, replayed: _run checks each call's outputs and gradients
        _run(name, grad)
    assert f"roofline::{name}" not in _eager_node.refusals, _eager_node.refusals[f"roofline::{name}"]


def test_a_profile_sees_the_op_and_its_backward_under_their_names_linked():
    """Under a profiler the forward is recorded as roofline::<name>, with its inputs' shapes and the sequence
    number of the node it makes, so that the trace links the backward to it as it links aten ops."""
    x = _x(6, 5)
    sine(x).sum().backward()   # the node and its program exist: the profiled call is a steady-state one
    x.grad = None
    with roofline.profile() as prof:
        sine(x).sum().backward()
    trace = prof.report.trace
    (forward,) = [i for i, o in enumerate(trace.ops) if o.name == "roofline::test_sine"]
    (backward,) = [o for o in trace.ops if o.name == "roofline::test_sine_backward"]
    assert trace.ops[forward].shapes[0] == [6, 5] and trace.ops[forward].seq >= 0
    assert backward.backward and backward.seq == trace.ops[forward].seq and backward.forward == forward
    torch.testing.assert_close(x.grad, _expected(x, torch.ones_like(x)))


def test_a_profile_places_roofline_ops_on_the_roofline_forward_and_backward():
    x = torch.randn(16, 64, device=DEVICE, requires_grad=True)
    weight = torch.randn(64, device=DEVICE, requires_grad=True)
    ops.rms_norm(x, (64,), weight, backend="triton").sum().backward()
    with roofline.profile() as prof:
        ops.rms_norm(x, (64,), weight, backend="triton").sum().backward()
    rows = {(o.name, o.backward): o for o in prof.report.ops}
    forward, backward = rows[("roofline::rms_norm", False)], rows[("roofline::rms_norm_backward", True)]
    assert (forward.rule, forward.bytes) == ("roofline", 2 * 16 * 64 * 4)
    assert (backward.rule, backward.bytes) == ("roofline", 3 * 16 * 64 * 4) and backward.count == 1


def test_a_record_past_its_limits_raises_naming_them():
    """A failed check in the node raises (on the GPU machine a compiler that linked a second C++ runtime into the
    node made the first number formatted in such a message crash the process); the 69 parameters of the Hopper
    attention backward's launch are taken."""
    builder = _eager_node.extension().ProgramBuilder([])
    with pytest.raises(RuntimeError, match="more than 96 arguments"):
        builder.launch(0, [1, 1, 1], 32, 0, "i" * 97, [0] * 97)
    builder.launch(0, [1, 1, 1], 32, 0, "i" * 69, [0] * 69)


@pytest.mark.skipif(sys.platform != "linux" or shutil.which("ldd") is None, reason="reads the build with ldd")
def test_the_node_shares_the_processes_cxx_runtime():
    """Linked to libstdc++.so, not to a static copy of its own (a compiler that linked one gave the node a second
    runtime whose first formatted number crashed the process)."""
    linked = subprocess.run(["ldd", _eager_node.extension().__file__], capture_output=True, text=True, check=True)
    assert "libstdc++.so" in linked.stdout
