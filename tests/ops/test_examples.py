"""roofline.ops.examples: each op called at a shape, as `roofline inspect OP` and benchmarks/ops_suite.py call it.
Each example's output through Triton equals the op's torch path on the same inputs (its inputs fit the op), and a
shape the op cannot take is named before anything runs."""

import dataclasses

import pytest
import torch
from ops_checks import DEVICE

from roofline.ops.examples import EXAMPLES, run

# a small shape of each op's kind (under the interpreter: seconds)
SMALL = {"softmax": (3, 70), "log_softmax": (3, 70), "layer_norm": (3, 70), "rms_norm": (3, 70),
         "add_rms_norm": (3, 70), "gelu": (3, 70), "swiglu": (3, 70), "cross_entropy": (3, 70), "rope": (1, 5, 32),
         "flash_attention": (1, 2, 17, 32), "linear": (17, 24, 40)}


def test_every_op_of_roofline_ops_that_launches_kernels_has_an_example():
    import roofline.ops as ops

    ours = set(ops.__all__) - {"wait_for_target_checks", "quantize_int8", "int8_linear", "linear_cross_entropy",
                                "matmul_ladder"}
    assert set(EXAMPLES) == ours == set(SMALL)


@pytest.mark.parametrize("name", sorted(SMALL))
def test_each_example_runs_the_op_as_its_torch_path_does(name):
    example = EXAMPLES[name]
    args = example.inputs(SMALL[name], DEVICE, torch.float32, False)
    ours, theirs = (example.call(*args, backend=b) for b in ("triton", "torch"))
    for o, t in zip(*((x if isinstance(x, tuple) else (x,)) for x in (ours, theirs))):
        torch.testing.assert_close(o, t, rtol=1e-4, atol=1e-4)


def test_the_backward_runs_and_reaches_every_input_that_wants_a_gradient(monkeypatch):
    made, example = [], EXAMPLES["add_rms_norm"]   # two outputs, each given a cotangent

    def inputs(*args):
        made.extend(example.inputs(*args))
        return tuple(made)

    monkeypatch.setitem(EXAMPLES, "add_rms_norm", dataclasses.replace(example, inputs=inputs))
    out, residual = run("add_rms_norm", (4, 70), device=DEVICE, dtype=torch.float32, backward=True)
    assert out.shape == residual.shape == (4, 70) and len(made) == 3
    assert all(t.grad is not None and t.grad.abs().sum() > 0 for t in made)


@pytest.mark.parametrize("name, shape, said", [
    ("flash_attention", (1, 2, 17), "4 sizes (batch x heads x seq x head_dim), got 3"),
    ("rms_norm", (4, 0), "positive sizes"),
    ("linear", (4, 4), "3 sizes (M x N x K"),
])
def test_a_shape_the_op_cannot_take_is_named(name, shape, said):
    with pytest.raises(ValueError, match=r"^shape: ") as raised:
        run(name, shape, device=DEVICE)
    assert said in str(raised.value)
    with pytest.raises(ValueError, match="op: one of add_rms_norm, cross_entropy"):
        run("rmsnorm", (4, 4), device=DEVICE)
