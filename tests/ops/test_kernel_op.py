"""KernelOp: eager calls go straight to the kernels, torch.compile sees one registered op."""

import importlib

import torch
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
