"""cross_entropy against F.cross_entropy in float64: the loss and the logits' gradient, every reduction, label
smoothing, ignore_index, out-of-range targets.

On a CPU the Triton kernels run through Triton's interpreter at small shapes; rows of several blocks are
reached by shrinking BLOCK. The `gpu` tests repeat the checks at a language model's vocabulary size.
"""

import importlib
import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_checks import DEVICE, DTYPES, assert_matches_float64, block_size_fixture, patched, poisoned_passes

from roofline.ops import cross_entropy, wait_for_target_checks
from roofline.ops._target_check import CHECK_SLOTS, target_checks
from roofline.ops.cross_entropy import cross_entropy_reference

ce_module = importlib.import_module("roofline.ops.cross_entropy")   # the package's `cross_entropy` is the function


def targets(rows, classes, ignored=0.25, ignore_index=-100, device=DEVICE):
    t = torch.randint(0, classes, (rows,), device=device)
    t[torch.rand(rows, device=device) < ignored] = ignore_index
    return t


def check(logits, target, backend="triton", **options):
    reduction = options.get("reduction", "mean")
    # A mean's gradient is 1/rows the size of a sum's: scale the absolute tolerance with it.
    scale = 1.0 / logits.shape[0] if reduction == "mean" and logits.dim() == 2 else 1.0
    return assert_matches_float64(partial(cross_entropy, backend=backend, **options),
                                  partial(cross_entropy_reference, **options), logits, target,
                                  grad_atol_scale=scale)


block = block_size_fixture(ce_module, "BLOCK", [ce_module.BLOCK, 16], ["wide-blocks", "many-blocks"])
# A small input is done in one launch by one program (counts, losses, gradient, reduction), a mid-sized one in one
# launch of many programs (each counting, the last to finish reducing), a large one in three launches (count,
# persistent forward, reduction): (ALONE_BYTES, SPREAD_BYTES) that send these small inputs each way.
LAUNCHES = {"one-program": (ce_module.ALONE_BYTES, 0), "one-launch": (0, ce_module.SPREAD_BYTES),
            "three-launches": (0, 0)}


@pytest.fixture(params=list(LAUNCHES))
def launches(request, monkeypatch):
    alone, spread = LAUNCHES[request.param]
    monkeypatch.setattr(ce_module, "ALONE_BYTES", alone)
    monkeypatch.setattr(ce_module, "SPREAD_BYTES", spread)
    return request.param


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 5), (7, 50)])
def test_matches_float64_reference(shape, dtype, reduction, smoothing, block):
    logits = torch.randn(shape, device=DEVICE, dtype=dtype) * 3
    check(logits, targets(*shape), reduction=reduction, label_smoothing=smoothing)


@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_thousand_classes_match_float64_reference(dtype, reduction, block):
    """Rows of many blocks at either block size; smoothed, so that every class's term counts (the small shapes
    above check each smoothing on and off)."""
    logits = torch.randn(5, 1000, device=DEVICE, dtype=dtype) * 3
    check(logits, targets(5, 1000), reduction=reduction, label_smoothing=0.1)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("spread", [True, False], ids=["one-launch", "three-launches"])
def test_the_launches_of_larger_inputs_match_float64_too(reduction, smoothing, spread, block, monkeypatch):
    monkeypatch.setattr(ce_module, "ALONE_BYTES", 0)
    monkeypatch.setattr(ce_module, "SPREAD_BYTES", ce_module.SPREAD_BYTES if spread else 0)
    logits = torch.randn(7, 50, device=DEVICE, dtype=torch.bfloat16) * 3
    check(logits, targets(7, 50), reduction=reduction, label_smoothing=smoothing)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_one_launch_of_many_programs_reduces_at_every_call_as_the_three_launches_do(reduction, monkeypatch):
    """Its last program sums the losses and sets the stream's ticket back to 0 for the next call; the sum runs in
    the order of the reduction launch's, so both give the same bits."""
    logits, t = torch.randn(37, 60, device=DEVICE) * 3, targets(37, 60)
    spread = ce_module.SPREAD_BYTES
    monkeypatch.setattr(ce_module, "ALONE_BYTES", 0)
    monkeypatch.setattr(ce_module, "SPREAD_BYTES", 0)
    three = cross_entropy(logits, t, reduction=reduction, backend="triton")
    monkeypatch.setattr(ce_module, "SPREAD_BYTES", spread)
    from roofline.ops._launch import clear_plans
    clear_plans()
    for _ in range(3):
        torch.testing.assert_close(cross_entropy(logits, t, reduction=reduction, backend="triton"), three,
                                   rtol=0, atol=0)
    [plan] = [p for p in ce_module._plan.plans.values() if p.spread]
    assert [int(ticket) for ticket, _ in plan.scratch.values()] == [0]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_ignore_index_inside_the_class_range_and_all_rows_ignored(reduction, block, launches):
    logits = torch.randn(9, 40, device=DEVICE)
    check(logits, targets(9, 40, ignored=0.5, ignore_index=3), reduction=reduction, ignore_index=3)
    # every row ignored: a mean of nothing is nan, as in torch; the gradient is zero
    check(logits, torch.full((9,), -100, device=DEVICE), reduction=reduction)


def test_one_row_and_int32_targets_and_strided_logits(block, launches):
    check(torch.randn(30, device=DEVICE), torch.tensor(4, device=DEVICE))
    logits = torch.randn(40, 12, device=DEVICE).t()        # (12, 40), column-major
    t32 = targets(12, 40).to(torch.int32)                   # torch itself takes only int64 (and uint8)
    assert_matches_float64(partial(cross_entropy, backend="triton"),
                           lambda x, t: cross_entropy_reference(x, t.long()), logits, t32, grad_atol_scale=1 / 12)
    check(logits, targets(12, 40), reduction="sum", label_smoothing=0.2)


class _LaunchCounter:
    """Stands in for a recorder (roofline.ops._eager_node.recording.recorder), which every launch tells."""

    def __init__(self):
        self.kernels = []

    def compiling(self, launch):
        pass

    def launch(self, launch, args):
        self.kernels.append(launch.kernel.fn.__name__ if hasattr(launch.kernel, "fn") else str(launch.kernel))

    def refuse(self, reason):
        pass

    def host(self, function, args):
        return function(*args)

    def attach(self, *node):
        pass


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_a_small_or_mid_sized_input_takes_one_launch_and_a_large_one_three(reduction, monkeypatch):
    from roofline.ops import _eager_node, _launch

    logits, t = torch.randn(6, 64, device=DEVICE, requires_grad=True), targets(6, 64)
    size = logits.numel() * logits.element_size()
    counter = _LaunchCounter()
    monkeypatch.setattr(_eager_node.recording, "recorder", counter)
    for alone, spread, mode in ((size, size, "alone"), (size - 1, size, "spread"), (size - 1, size - 1, "three")):
        monkeypatch.setattr(ce_module, "ALONE_BYTES", alone)
        monkeypatch.setattr(ce_module, "SPREAD_BYTES", spread)
        _launch.clear_plans()
        counter.kernels.clear()
        cross_entropy(logits, t, reduction=reduction, backend="triton")
        [plan] = ce_module._plan.plans.values()
        assert (plan.alone, plan.spread) == (mode == "alone", mode == "spread")
        if mode != "three":
            assert counter.kernels == ["cross_entropy_forward_kernel"]
        else:
            expected = ["target_stats_kernel", "cross_entropy_forward_kernel"]
            assert counter.kernels == expected + (["reduce_losses_kernel"] if reduction == "mean" else [])


def test_backward_scales_only_the_rows_whose_incoming_gradient_is_not_one(launches):
    logits = torch.randn(6, 70, device=DEVICE, requires_grad=True)
    t = targets(6, 70)
    dloss = torch.tensor([1.0, 2.0, 1.0, -0.5, 0.0, 1.0], device=DEVICE)
    cross_entropy(logits, t, reduction="none", backend="triton").backward(dloss)
    ref = logits.detach().double().requires_grad_()
    cross_entropy_reference(ref, t, reduction="none").backward(dloss.double())
    torch.testing.assert_close(logits.grad.double(), ref.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("node", [pytest.param(True, marks=pytest.mark.eager_node), False],
                         ids=["C++ node", "autograd.Function"])
def test_the_forwards_gradient_becomes_logits_grad_without_a_copy_and_only_once(node, monkeypatch):
    """The gradient buffer the forward wrote is handed on: autograd moves it into logits.grad (it would copy one
    that the node still held), and a second backward through the same forward is refused, through the C++ node
    and through the autograd.Function used where that node cannot be built."""
    from roofline.ops import _eager_node, _launch

    if not node:
        monkeypatch.setattr(_eager_node, "extension", lambda: None)
    written = []
    forward = ce_module.CrossEntropyPlan.forward

    def noting_the_buffer(plan, *args):
        out = forward(plan, *args)
        written.append(out[1].data_ptr())
        return out

    monkeypatch.setattr(ce_module.CrossEntropyPlan, "forward", noting_the_buffer)
    _launch.clear_plans()   # (no replay of an earlier test's call, which would not run the plan's Python)
    logits, t = torch.randn(4, 20, device=DEVICE, requires_grad=True), targets(4, 20, ignored=0)
    loss = cross_entropy(logits, t, backend="triton")
    assert type(loss.grad_fn).__name__ == ("CppFunction" if node else "cross_entropy_rows_eagerBackward")
    (loss * 2).backward(retain_graph=True)
    assert logits.grad.data_ptr() == written[-1]
    ref = logits.detach().double().requires_grad_()
    (cross_entropy_reference(ref, t) * 2).backward()
    torch.testing.assert_close(logits.grad.double(), ref.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="second backward through the same forward"):
        loss.backward()


def test_without_grad_only_the_loss_is_computed():
    logits, t = torch.randn(5, 33, device=DEVICE), targets(5, 33)
    losses, gradient, _ = ce_module._cross_entropy_rows(logits, t, -100, "none", 0.0, False, True)
    assert gradient is None                                # no logits-sized buffer
    torch.testing.assert_close(losses, cross_entropy_reference(logits, t, reduction="none"))
    with torch.no_grad():
        x = logits.requires_grad_()
        torch.testing.assert_close(cross_entropy(x, t, backend="triton", reduction="sum"),
                                   cross_entropy_reference(logits, t, reduction="sum"))


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("compiled", [False, True])
def test_under_autocast_the_loss_is_fp32_as_torchs(reduction, compiled):
    # cross_entropy is on autocast's fp32 list: torch returns an fp32 loss from bf16 logits, and a bf16 gradient
    logits = (torch.randn(7, 45, device=DEVICE) * 3).to(torch.bfloat16)
    t = targets(7, 45)
    ours = partial(cross_entropy, backend="triton", reduction=reduction)
    if compiled:
        torch._dynamo.reset()
        ours = torch.compile(ours, fullgraph=True, backend="aot_eager")
    results = []
    for fn in (ours, partial(cross_entropy_reference, reduction=reduction)):
        x = logits.clone().requires_grad_()
        with torch.autocast(x.device.type, dtype=torch.bfloat16):
            loss = fn(x, t)
        loss.sum().backward()
        results.append((loss, x.grad))
    (loss, grad), (want, want_grad) = results
    assert loss.dtype == want.dtype == torch.float32 and grad.dtype == want_grad.dtype == torch.bfloat16
    torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, want_grad, rtol=1.6e-2, atol=1e-3)
    assert cross_entropy(logits, t, backend="triton").dtype == torch.bfloat16   # outside autocast: the logits'


@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_poisoned_gradient_memory_is_overwritten(block):
    logits = torch.randn(16, 300, device=DEVICE)
    t = targets(16, 300)
    for _ in poisoned_passes((16, 300)):   # the gradient buffer comes from NaN-filled memory
        check(logits, t, reduction="sum")


def test_extreme_logits_behave_as_in_torch(block, launches):
    inf = math.inf
    logits = torch.randn(5, 40, device=DEVICE)
    logits[0] = torch.tensor([1e4, -1e4] * 20)
    logits[1, 5:] = -inf                       # -inf away from the target: a finite loss
    logits[2, 7] = inf
    logits[3, 9] = math.nan
    logits[4] = -1e4
    t = torch.tensor([0, 1, 3, 3, 2], device=DEVICE)
    for reduction in ("none", "sum"):
        for smoothing in (0.0, 0.1):
            ours = cross_entropy(logits, t, reduction=reduction, label_smoothing=smoothing, backend="triton")
            ref = cross_entropy_reference(logits.double(), t, reduction=reduction, label_smoothing=smoothing)
            torch.testing.assert_close(ours.double(), ref, rtol=1e-5, atol=1e-4, equal_nan=True)


def test_out_of_range_targets_give_nan_and_a_clear_error_without_waiting(launches):
    """A call without a gradient does not wait for the targets' count either: the bad row's loss is nan as it
    returns, and the ValueError comes from wait_for_target_checks(), or from the next call of either loss op,
    before it launches anything."""
    logits = torch.randn(4, 10, device=DEVICE)
    for bad in (10, -1, 1 << 40):
        t = torch.tensor([1, bad, 2, 3], device=DEVICE)
        losses = cross_entropy(logits, t, backend="triton", reduction="none")
        assert torch.isnan(losses[1]) and torch.isfinite(losses[[0, 2, 3]]).all()
        with pytest.raises(ValueError, match=rf"target\[1\] = {bad} is not a class index in \[0, 10\).*found after"):
            wait_for_target_checks()
    assert torch.isnan(cross_entropy(logits, torch.tensor([1, 10, 2, 3], device=DEVICE), backend="triton"))
    if DEVICE == "cuda":
        torch.cuda.synchronize()   # where the GPU has not counted yet, a later call raises instead
    good = torch.tensor([1, 2, 3, 4], device=DEVICE)
    with pytest.raises(ValueError, match=r"target\[1\] = 10 .*found after that call of cross_entropy"):
        cross_entropy(logits, good, backend="triton")
    wait_for_target_checks()   # nothing left in flight: returns
    assert not target_checks._pending


def test_unchecked_targets_and_compiled_calls_give_nan(launches):
    logits = torch.randn(4, 10, device=DEVICE)
    unchecked = cross_entropy(logits, torch.tensor([1, 10, 2, -7], device=DEVICE), backend="triton",
                              reduction="none", check_targets=False)
    assert torch.isnan(unchecked[[1, 3]]).all() and torch.isfinite(unchecked[[0, 2]]).all()
    compiled = torch.compile(partial(cross_entropy, backend="triton", reduction="none"), fullgraph=True,
                             backend="aot_eager")
    losses = compiled(logits, torch.tensor([1, 10, 2, -7], device=DEVICE))
    assert torch.isnan(losses[1]) and torch.isnan(losses[3]) and torch.isfinite(losses[[0, 2]]).all()
    wait_for_target_checks()   # none of them was checked
    assert not target_checks._pending


def test_with_a_gradient_the_check_raises_at_the_backward_without_stopping_the_forward(launches):
    """A call that makes a gradient does not wait for the targets' count: its backward (or, without one, the next
    call) raises, before handing on a gradient or launching anything."""
    logits = torch.randn(4, 10, device=DEVICE, requires_grad=True)
    bad = torch.tensor([1, 2, 12, 3], device=DEVICE)
    loss = cross_entropy(logits, bad, backend="triton")
    assert torch.isnan(loss)   # (a read of the loss waits for the GPU: the count is written by now)
    with pytest.raises(ValueError, match=r"target\[2\] = 12 is not a class index.*found after that call"):
        loss.backward()
    assert logits.grad is None and not target_checks._pending
    cross_entropy(logits, bad, backend="triton")   # never backpropagated: the next call raises, before its kernels
    if DEVICE == "cuda":
        torch.cuda.synchronize()   # where the GPU has not counted yet, a later call raises instead
    good = torch.tensor([1, 2, 3, 4], device=DEVICE)
    with pytest.raises(ValueError, match=r"target\[2\] = 12.*found after that call"):
        cross_entropy(logits, good, backend="triton")
    # good targets: on a GPU more calls than slots, so that counts in flight are read and their slots reused; the
    # interpreter writes each count at once, and the next call reads it
    for _ in range(CHECK_SLOTS + 8 if DEVICE == "cuda" else 3):
        cross_entropy(logits, good, backend="triton").backward()
    assert len(target_checks._free) == CHECK_SLOTS and not target_checks._pending


def test_targets_are_counted_and_checked_over_several_steps_of_the_count(launches):
    with patched(ce_module, "STATS_BLOCK", 16):   # 53 rows: four steps of the one-program count
        logits = torch.randn(53, 30, device=DEVICE)
        check(logits, targets(53, 30, ignored=0.4), reduction="mean")
        t = targets(53, 30)
        t[47] = 30   # past the first steps, in the last, partial one
        cross_entropy(logits, t, backend="triton")
        with pytest.raises(ValueError, match=r"target\[47\] = 30 is not a class index"):
            wait_for_target_checks()


def test_empty_and_torch_backends():
    check(torch.randn(0, 5, device=DEVICE), torch.zeros(0, dtype=torch.long, device=DEVICE), reduction="sum")
    check(torch.randn(9, 33, device=DEVICE), targets(9, 33), backend="torch")
    check(torch.randn(9, 33, device=DEVICE), targets(9, 33), backend=None)


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 20), classes=st.integers(1, 70), dtype=st.sampled_from(DTYPES),
       reduction=st.sampled_from(["mean", "sum", "none"]), smoothing=st.sampled_from([0.0, 0.05, 1.0]),
       ignored=st.sampled_from([0.0, 0.3, 1.0]), block=st.sampled_from([16, 4096]), scale=st.sampled_from([1.0, 20.0]))
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_property_any_shape_dtype_reduction(rows, classes, dtype, reduction, smoothing, ignored, block, scale):
    logits = torch.randn(rows, classes, device=DEVICE, dtype=dtype) * scale
    with patched(ce_module, "BLOCK", block):
        check(logits, targets(rows, classes, ignored), reduction=reduction, label_smoothing=smoothing)


L, T = torch.randn(4, 8), torch.tensor([1, 2, 3, 4])


@pytest.mark.parametrize("call, error, match", [
    (lambda: cross_entropy([1.0], T), TypeError, "cross_entropy: logits must be a torch.Tensor, got list"),
    (lambda: cross_entropy(L, [1, 2, 3, 4]), TypeError, "target must be a torch.Tensor of class indices"),
    (lambda: cross_entropy(L, T.float()), TypeError, "target must hold class indices .* got torch.float32"),
    (lambda: cross_entropy(L, T[:3]), ValueError, r"target must have shape \[4\] for logits of shape \[4, 8\]"),
    (lambda: cross_entropy(L.view(2, 2, 8), T), ValueError, r"logits must be \(N, C\) or \(C,\)"),
    (lambda: cross_entropy(L, T.to("meta")), ValueError, "target is on meta but logits is on cpu"),
    (lambda: cross_entropy(L, T, reduction="avg"), ValueError, "reduction must be one of"),
    (lambda: cross_entropy(L, T, label_smoothing=1.5), ValueError, r"label_smoothing must be a number in \[0, 1\]"),
    (lambda: cross_entropy(L, T, ignore_index=1.0), TypeError, "ignore_index must be an int, got float"),
    (lambda: cross_entropy(L.long(), T, backend="triton"), TypeError, "takes logits of dtype"),
    (lambda: cross_entropy(L, T, backend="cuda"), ValueError, "backend must be one of"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_compiles_fullgraph_through_the_kernels():
    logits, t = torch.randn(6, 50, device=DEVICE), targets(6, 50)
    compiled = torch.compile(lambda x, t: cross_entropy(x * 2, t, backend="triton", label_smoothing=0.1),
                             fullgraph=True, backend="aot_eager")
    assert_matches_float64(compiled, lambda x, t: cross_entropy_reference(x * 2, t, label_smoothing=0.1),
                           logits, t, grad_atol_scale=1 / 6)


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("compiler", ["eager", "aot_eager", "inductor"])
def test_gpu_compiled_gradients(compiler, reduction):
    # The compiled path once gave zero gradients on the GPU and right ones on the CPU interpreter.
    torch._dynamo.reset()   # one lambda's code object for every case: past 8 compiles dynamo gives up
    logits, t = torch.randn(6, 50, device="cuda"), targets(6, 50, device="cuda")
    compiled = torch.compile(lambda x, t: cross_entropy(x, t, backend="triton", reduction=reduction) * 2,
                             fullgraph=True, backend=compiler)
    assert_matches_float64(compiled, lambda x, t: cross_entropy_reference(x, t, reduction=reduction) * 2,
                           logits, t, grad_atol_scale=1 / 3 if reduction == "mean" else 2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [8, 256, 4096], ids=["one-program", "one-launch", "three-launches"])
def test_gpu_a_cuda_graph_captures_it_with_the_targets_unchecked(rows):
    logits, t = torch.randn(rows, 5000, device="cuda"), targets(rows, 5000, device="cuda")
    expected = cross_entropy(logits, t)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture, as torch.cuda.graph asks
        cross_entropy(logits, t)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # the check's host sync would end the capture with an error
        loss = cross_entropy(logits, t)
    for _ in range(3):   # a spread launch's ticket is back at 0 after each replay
        loss.fill_(float("nan"))
        graph.replay()
        torch.testing.assert_close(loss, expected)


@pytest.mark.gpu
def test_gpu_one_launch_of_many_programs_keeps_a_ticket_per_stream():
    """Calls on two streams at once each count on their own stream's ticket."""
    logits, t = torch.randn(256, 5000, device="cuda"), targets(256, 5000, device="cuda")
    expected = cross_entropy_reference(logits, t)
    streams = [torch.cuda.Stream() for _ in range(2)]
    losses = []
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(20):
        for stream in streams:
            with torch.cuda.stream(stream):
                losses.append(cross_entropy(logits, t))
    torch.cuda.synchronize()
    for loss in losses:
        torch.testing.assert_close(loss, expected)
    [plan] = [p for p in ce_module._plan.plans.values() if p.spread]
    assert len(plan.scratch) == 2 and all(int(ticket) == 0 for ticket, _ in plan.scratch.values())


@pytest.mark.gpu
def test_gpu_a_captured_step_writes_no_checks_slot():
    """A whole training step captured as a CUDA graph (the ladder's and models.py's graphs modes) runs the op's
    backward, which reads the counts in flight, inside the capture: that reads host memory only. And the graph's
    counting kernel writes to the plan's own word, never to a slot of the checks: its replays must not overwrite
    the count of an eager call made between them."""
    logits = torch.randn(64, 1000, device="cuda", requires_grad=True)
    t = targets(64, 1000, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture, as torch.cuda.graph asks
        cross_entropy(logits, t).backward()
        cross_entropy(logits, t)     # a gradient made, no backward: its count stays in flight
    torch.cuda.current_stream().wait_stream(side)
    logits.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        cross_entropy(logits, t).backward()
    graph.replay()
    bad = t.clone()
    bad[5] = 1000
    with torch.no_grad():
        assert torch.isnan(cross_entropy(logits, bad))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    with pytest.raises(ValueError, match=r"target\[5\] = 1000 is not a class index"):
        wait_for_target_checks()
    assert not target_checks._pending and torch.isfinite(logits.grad).all()


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [8, 256, 4096], ids=["one-program", "one-launch", "three-launches"])
def test_gpu_replayed_forwards_check_their_targets_at_every_call(rows):
    """Forwards without a gradient replay from C++ after their signature's first call. The check's slot and a
    spread launch's scratch are host steps, taken anew by each replay: a bad target among replayed calls gives its
    call a nan loss and makes the next call raise, and the stream's ticket is back at 0 after every call."""
    logits, t = torch.randn(rows, 5000, device="cuda"), targets(rows, 5000, device="cuda")
    expected = cross_entropy_reference(logits, t)
    for _ in range(2):   # the first compiles its kernels (timing runs are no record), the second is recorded
        cross_entropy(logits, t)
    replayed = cross_entropy.replays.programs.replayed()
    assert replayed == 0
    for _ in range(CHECK_SLOTS + 5):   # more calls than slots: each replay frees the slots of counts written
        torch.testing.assert_close(cross_entropy(logits, t), expected)
    assert cross_entropy.replays.programs.replayed() == replayed + CHECK_SLOTS + 5
    bad = t.clone()
    bad[rows // 2] = 5000
    assert torch.isnan(cross_entropy(logits, bad))   # replayed too; reading the loss waits for the count
    with pytest.raises(ValueError, match=rf"target\[{rows // 2}\] = 5000 is not a class index.*found after"):
        cross_entropy(logits, t)
    assert cross_entropy.replays.programs.replayed() == replayed + CHECK_SLOTS + 7
    torch.testing.assert_close(cross_entropy(logits, t), expected)
    wait_for_target_checks()
    assert not target_checks._pending and len(target_checks._free) == CHECK_SLOTS
    spread = [p for p in ce_module._plan.plans.values() if p.spread]
    assert all(int(ticket) == 0 for plan in spread for ticket, _ in plan.scratch.values())


@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 128256), (5, 65537), (3000, 32000)])
def test_gpu_vocabulary_sizes(shape, dtype, reduction):
    check(torch.randn(shape, device="cuda", dtype=dtype) * 3, targets(*shape, device="cuda"), reduction=reduction,
          label_smoothing=0.1 if reduction == "none" else 0.0)


@pytest.mark.gpu
def test_gpu_compile_backend_and_peak_memory_is_one_gradient_buffer():
    logits = torch.randn(2048, 32000, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    t = targets(2048, 32000, device="cuda")
    check(logits, t, backend="compile")
    ref = logits.detach().float().requires_grad_()
    cross_entropy_reference(ref, t).backward()
    for _ in range(5):   # compiled, recorded, then replayed from C++ (forward and backward)
        logits.grad = None
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        cross_entropy(logits, t, backend="triton").backward()
        extra = torch.cuda.max_memory_allocated() - before
        assert extra <= logits.numel() * logits.element_size() + (1 << 20), extra
        torch.testing.assert_close(logits.grad.float(), ref.grad, atol=2e-6, rtol=2e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("rows", [8, 256, 4096], ids=["one-program", "one-launch", "three-launches"])
def test_gpu_forward_and_backward_replay_from_cpp(rows, monkeypatch):
    """With a gradient, the whole call replays from C++ after its signature's first calls, in every launch mode:
    the entry point's forward and the node's backward, no Python of either. Fresh logits at each call give the
    float64 loss and gradient."""
    from roofline.ops import _launch

    _launch.clear_plans()
    backwards = []
    backward = ce_module.CrossEntropyPlan.backward
    monkeypatch.setattr(ce_module.CrossEntropyPlan, "backward",
                        lambda plan, *args: backwards.append(1) or backward(plan, *args))
    t = targets(rows, 5000, device="cuda")
    dloss = torch.tensor(1.5, device="cuda")
    for _ in range(5):
        logits = torch.randn(rows, 5000, device="cuda", requires_grad=True)
        loss = cross_entropy(logits, t)
        (grad,) = torch.autograd.grad(loss, logits, dloss)
        ref = logits.detach().double().requires_grad_()
        want = cross_entropy_reference(ref, t)
        want.backward(dloss.double())
        torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double(), ref.grad, rtol=1e-4, atol=1e-6 / rows)
    assert cross_entropy.replays.programs.replayed() >= 3
    assert len(backwards) <= 2   # the first call's (compiling) and the recorded one


@pytest.mark.gpu
def test_gpu_a_replayed_backward_raises_for_its_calls_bad_target():
    logits = torch.randn(300, 5000, device="cuda", requires_grad=True)
    t = targets(300, 5000, device="cuda")
    for _ in range(3):   # the third forward and backward are replays
        cross_entropy(logits, t).backward()
    bad = t.clone()
    bad[123] = -7
    loss = cross_entropy(logits, bad)
    torch.cuda.synchronize()   # the count is written: the backward's check reads it
    with pytest.raises(ValueError, match=r"target\[123\] = -7 is not a class index"):
        loss.backward()
    assert not target_checks._pending
