"""Checks shared by the tests of modules and of roofline.patch."""

import torch
from torch import nn


def same_outputs_and_grads(ours: nn.Module, theirs: nn.Module, *inputs, rtol=1e-5, atol=1e-5):
    """ours(*inputs) and theirs(*inputs) agree, and so do the gradients of the inputs and the parameters."""
    a = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    b = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ya, yb = ours(*a), theirs(*b)
    torch.testing.assert_close(ya, yb, rtol=rtol, atol=atol)
    ya.sum().backward()
    yb.sum().backward()
    for x, y in zip(a, b):
        if x.is_floating_point():
            torch.testing.assert_close(x.grad, y.grad, rtol=rtol, atol=atol)
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}")
