"""KernelOp: eager calls go straight to the kernels, torch.compile sees one registered op."""

import importlib

import pytest
import torch
import torch.nn.functional as F
from ops_checks import DEVICE

from roofline.ops import softmax

softmax_module = importlib.import_module("roofline.ops.softmax")


def test_eager_calls_skip_the_registered_op(monkeypatch):
    def refuse(*args):
        raise AssertionError("the registered op ran in eager mode")

    monkeypatch.setattr(softmax_module._softmax_rows, "forward_op", refuse)
    x = torch.randn(4, 33, device=DEVICE, requires_grad=True)
    softmax(x, backend="triton").sum().backward()
    assert x.grad is not None


def test_compiled_graph_holds_the_registered_op():
    graphs = []

    def keep_graph(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(4, 33, device=DEVICE)
    out = torch.compile(lambda t: softmax(t, backend="triton") * 2, fullgraph=True, backend=keep_graph)(x)
    torch.testing.assert_close(out, torch.softmax(x, -1) * 2)
    targets = [node.target for gm in graphs for node in gm.graph.nodes]
    assert torch.ops.roofline.softmax_rows.default in targets, targets


def test_a_signature_goes_straight_to_its_plan_once_a_call_passed_the_checks():
    op = softmax_module._softmax_rows
    x = torch.randn(4, 33, device=DEVICE)
    key, plan = op.seen(x, -1, "triton", False)
    assert key is not None and plan is None   # not called yet
    softmax(x, backend="triton")
    assert op.seen(torch.randn(4, 33, device=DEVICE), -1, "triton", False)[1] is not None   # fresh tensors
    assert op.seen(torch.randn(4, 34, device=DEVICE), -1, "triton", False)[1] is None       # another shape
    assert op.seen(x, -1, "triton", True)[1] is None                                         # log_softmax


def test_arguments_that_make_no_signature_are_left_to_the_checks():
    norm_module = importlib.import_module("roofline.ops.norm")
    x = torch.randn(4, 8, device=DEVICE)
    # a list cannot be hashed, a list where a tensor goes has no shape: neither is an error of seen's
    assert norm_module._norm_rows.seen("layer_norm", x, [8], None, None, None, 1e-5, "triton") == (None, None)
    assert softmax_module._softmax_rows.seen([1.0], -1, "triton", False) == (None, None)
    torch.testing.assert_close(norm_module.layer_norm(x, [8], backend="triton"), F.layer_norm(x, [8]))
    with pytest.raises(TypeError, match="softmax: x must be a torch.Tensor"):
        softmax([1.0], backend="triton")


def test_the_compile_backend_compiles_whatever_the_arguments(monkeypatch):
    from roofline.ops import _runtime

    calls = []
    monkeypatch.setattr(_runtime, "compiled", lambda fn: lambda *args: calls.append(fn) or "compiled")
    assert _runtime.torch_route("compile", F.gelu, torch.randn(0), nothing_to_launch=True) == "compiled"
    assert calls == [F.gelu]
    assert _runtime.torch_route("torch", F.gelu, torch.ones(1)).item() == F.gelu(torch.ones(1)).item()
    assert _runtime.torch_route("triton", F.gelu, torch.ones(0), nothing_to_launch=True).numel() == 0
    assert _runtime.torch_route("triton", F.gelu, torch.ones(1)) is None   # the kernels' route


def test_an_empty_input_gets_torch_s_result_with_its_gradient_function():
    from roofline.ops import gelu

    x = torch.randn(0, 8, device=DEVICE, requires_grad=True)
    y = gelu(x, backend="triton")
    assert y.shape == (0, 8) and y.grad_fn is not None
    y.sum().backward()
    assert x.grad.shape == (0, 8)


def test_the_interpreter_s_dot_settings_and_the_gpu_s():
    from roofline.ops import _state

    gpu = {torch.float32: "ieee", torch.float16: "tf32", torch.bfloat16: "tf32"}
    for dtype, precision in gpu.items():
        settings = _state.dot_settings(dtype, fp32="ieee")
        upcast = _state.interpreting() and dtype == torch.bfloat16   # the interpreter's bf16 tl.dot is wrong
        assert settings == {"PRECISION": "ieee" if upcast else precision, "UPCAST": upcast}
        # what roofline inspect compiles for a GPU from a launch made here
        assert _state.as_on_a_gpu(settings, dtype) == {"PRECISION": precision, "UPCAST": False}
    assert _state.as_on_a_gpu({"ROUND_TF32": False, "BLOCK": 64}, torch.float32) == {"ROUND_TF32": True, "BLOCK": 64}
    assert _state.as_on_a_gpu({"ROUND_TF32": False}, torch.bfloat16) == {"ROUND_TF32": False}
