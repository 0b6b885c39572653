"""layer_norm, rms_norm and add_rms_norm against float64 references: outputs and the gradients of x, weight,
bias and residual.

On a CPU the Triton kernels run through Triton's interpreter at small shapes; rows longer than one block (the
Welford pass, and the backward's separate row means) are reached by shrinking MAX_BLOCK. The `gpu` tests
repeat the checks at scale.
"""

import math
from functools import partial

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_checks import (DEVICE, DTYPES, SHAPES, as_tuple, assert_matches_float64, block_size_fixture, patched,
                        poisoned_passes)

import roofline.ops.norm as norm_module
from roofline.ops import add_rms_norm, layer_norm, rms_norm
from roofline.ops._launch import clear_plans
from roofline.ops.norm import add_rms_norm_reference


def _layer_norm(backend, x, w, b, eps=1e-5):
    return layer_norm(x, x.shape[-1:], w, b, eps, backend=backend)


def _rms_norm(backend, x, w, eps=None):
    return rms_norm(x, x.shape[-1:], w, eps, backend=backend)


def _add_rms_norm(backend, x, r, w, eps=None):
    return add_rms_norm(x, r, w, eps, backend=backend)


def _references():
    return {"layer_norm": lambda x, w, b, eps=1e-5: F.layer_norm(x, x.shape[-1:], w, b, eps),
            "rms_norm": lambda x, w, eps=None: F.rms_norm(x, x.shape[-1:], w, eps),
            "add_rms_norm": add_rms_norm_reference}


OURS = {"layer_norm": _layer_norm, "rms_norm": _rms_norm, "add_rms_norm": _add_rms_norm}
REFERENCES = _references()


def inputs(op, shape, dtype, weight=True, bias=True, param_dtype=None, device=DEVICE):
    """Fresh random arguments for `op` on rows of `shape`, the parameters near 1 and 0 as after training."""
    x = torch.randn(shape, device=device, dtype=dtype) * 2 + 0.5
    n = shape[-1]
    param_dtype = param_dtype or dtype
    w = (1 + 0.3 * torch.randn(n, device=device)).to(param_dtype) if weight else None
    b = (0.2 * torch.randn(n, device=device)).to(param_dtype) if bias else None
    if op == "layer_norm":
        return x, w, b
    if op == "rms_norm":
        return x, w
    return x, torch.randn(shape, device=device, dtype=dtype), w


def check(op, *args, backend="triton", eps=None, or_twice_torchs=False):
    rows = max(1, args[0].numel() // max(1, args[0].shape[-1]))
    scale = math.sqrt(max(rows, args[0].shape[-1]))       # dw, db sum over rows; dx over a row
    if eps is None and op != "layer_norm":   # the float64 reference would take float64's epsilon
        eps = torch.finfo(torch.float32).eps
    extra = () if eps is None else (eps,)
    return assert_matches_float64(partial(OURS[op], backend), REFERENCES[op], *args, *extra, grad_atol_scale=scale,
                                  or_twice_torchs=or_twice_torchs)


max_block = block_size_fixture(norm_module, "MAX_BLOCK", [norm_module.MAX_BLOCK, 64], ["one-block", "looped"])


@pytest.mark.parametrize("op", OURS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1), (5, 123), (2, 3, 257), (4, 1000)])
def test_matches_float64_reference(shape, dtype, op, max_block):
    check(op, *inputs(op, shape, dtype))


@pytest.mark.parametrize("rows", [1, 6])
def test_one_row_group_stores_the_parameter_gradients_itself(rows):
    """A backward whose rows fit one row group sums dw and db whole, in one launch and no scratch; more rows sum
    partial rows in a second launch. Both against float64 (the shapes above run both paths too)."""
    clear_plans()
    x, w, b = inputs("layer_norm", (rows, 300), torch.float32)
    check("layer_norm", x, w, b)
    (plan,) = norm_module._plan.plans.values()
    assert (plan.parts == 0) == (rows == 1) and (plan.groups == 1) == (rows == 1)


@pytest.mark.parametrize("op", OURS)
def test_without_weight_or_bias_and_with_fp32_parameters(op, max_block):
    check(op, *inputs(op, (6, 200), torch.float32, weight=False, bias=False))
    check(op, *inputs(op, (6, 200), torch.bfloat16, param_dtype=torch.float32))
    if op == "layer_norm":
        check(op, *inputs(op, (6, 200), torch.float16, weight=True, bias=False))


def test_layer_norm_over_several_trailing_dimensions(max_block):
    x, w, b = torch.randn(4, 6, 30, device=DEVICE), torch.randn(6, 30, device=DEVICE), torch.randn(6, 30, device=DEVICE)
    assert_matches_float64(lambda x, w, b: layer_norm(x, (6, 30), w, b, backend="triton"),
                           lambda x, w, b: F.layer_norm(x, (6, 30), w, b), x, w, b, grad_atol_scale=15)
    # a 2-D x normalized whole: one row, not a (rows, n) view of it as it stands
    x2 = torch.randn(6, 30, device=DEVICE)
    assert_matches_float64(lambda x, w, b: layer_norm(x, (6, 30), w, b, backend="triton"),
                           lambda x, w, b: F.layer_norm(x, (6, 30), w, b), x2, w, b, grad_atol_scale=15)


@pytest.mark.parametrize("op", OURS)
def test_strided_inputs_and_eps(op, max_block):
    args = list(inputs(op, (130, 40), torch.float32))
    args[0] = args[0].t()[:, 3:]                            # a transposed, offset view: (40, 127)
    if op == "add_rms_norm":
        args[1] = torch.randn(120, 130, device=DEVICE)[::3, 3:]   # another strided view of the same shape
    args[-1 if op == "add_rms_norm" else 1] = None if op != "layer_norm" else torch.randn(127, device=DEVICE)
    if op == "layer_norm":
        args[2] = torch.randn(127, device=DEVICE)
    check(op, *args, eps=0.1)


@pytest.mark.parametrize("op", OURS)
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_poisoned_output_memory_is_overwritten(op, max_block):
    args = inputs(op, (64, 200), torch.float32)
    for _ in poisoned_passes((4, 64, 200)):
        check(op, *args)


@pytest.mark.parametrize("op", OURS)
def test_nan_inf_and_constant_rows_as_in_torch(op, max_block):
    x = torch.randn(5, 300, device=DEVICE)
    x[0, 17] = math.nan
    x[1, 250] = math.inf
    x[2] = 3.0                                   # zero variance: rstd = 1/sqrt(eps)
    x[3, :5] = -math.inf
    args = (x,) + inputs(op, (5, 300), torch.float32)[1:]
    ours = as_tuple(OURS[op]("triton", *args))
    # The float64 reference on the CPU: there torch follows the formula (an infinite mean square scales the
    # finite elements of its row to 0); torch 2.11's CUDA rms_norm turns the whole row into nan.
    expected = as_tuple(REFERENCES[op](*(a.double().cpu() if a is not None else None for a in args)))
    for y, ref in zip(ours, expected):
        torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-5, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("op", ["layer_norm", "add_rms_norm"])
def test_rows_far_from_zero_are_as_accurate_as_torch(op, max_block):
    """A mean of 1e4 over spreads of 1: the looped path's Welford pass must not cancel catastrophically."""
    args = list(inputs(op, (8, 700), torch.float32))
    args[0] = args[0] + 1e4
    ours = as_tuple(OURS[op]("triton", *args))[0].double()
    torch_fp32 = as_tuple(REFERENCES[op](*args))[0].double()
    exact = as_tuple(REFERENCES[op](*(a.double() for a in args)))[0]
    # Both are a few ulps of the mean off (fp32 spacing near 1e4 is 1e-3), and by luck torch's can be half of
    # ours (1 run in ~60 failed a bare 2x); cancellation (E[x^2] - E[x]^2) would be wrong by whole units.
    slack = 2 * torch.finfo(torch.float32).eps * 1e4   # ~2 ulps of 1e4
    assert (ours - exact).abs().max() <= 2 * (torch_fp32 - exact).abs().max() + slack


@pytest.mark.parametrize("op", OURS)
def test_empty_tensors(op, max_block):
    for shape in [(0, 5), (3, 0, 5)]:
        check(op, *inputs(op, shape, torch.float32))


@pytest.mark.parametrize("op", ["rms_norm", "add_rms_norm"])
def test_default_eps_is_float32s_epsilon_as_in_torch(op):
    args = inputs(op, (3, 1), torch.bfloat16)       # one-element rows: eps decides the result
    for y, expected in zip(as_tuple(OURS[op]("triton", *args)), as_tuple(REFERENCES[op](*args))):
        torch.testing.assert_close(y, expected, rtol=1.6e-2, atol=1e-2)


@pytest.mark.parametrize("op", OURS)
def test_torch_backend_and_default_on_cpu(op):
    check(op, *inputs(op, (9, 33), torch.float32), backend="torch")
    check(op, *inputs(op, (9, 33), torch.float32), backend=None)


@settings(max_examples=20, deadline=None)
@given(
    op=st.sampled_from(sorted(OURS)),
    shape=SHAPES,
    dtype=st.sampled_from(DTYPES),
    transpose=st.booleans(),
    with_weight=st.booleans(),
    block=st.sampled_from([16, 8192]),
)
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_property_any_shape_dtype_and_stride(op, shape, dtype, transpose, with_weight, block):
    args = list(inputs(op, shape, dtype, weight=with_weight, bias=with_weight))
    if transpose and args[0].dim() >= 2:
        args[0] = args[0].transpose(0, -1).contiguous().transpose(0, -1)   # same shape, column-major
    with patched(norm_module, "MAX_BLOCK", block):   # any draw: an ill-conditioned one is held to torch's own error
        check(op, *args, or_twice_torchs=True)


def test_an_ill_conditioned_layer_norm_gradient_is_held_to_twice_torchs_error():
    """A CI draw of the property test: rows of 2 elements in fp32, no weight. Where two elements are close, the
    output and dx divide by their tiny deviation, and both torch's fp32 and ours miss the fixed tolerance (in CI,
    ours by 5.1e-4 where 2.5e-4 was allowed); ours is held to twice torch's error there."""
    torch.manual_seed(21)
    x = torch.randn(25, 25, 2) * 2 + 0.5
    with pytest.raises(AssertionError, match="not close"):
        check("layer_norm", x, None, None)
    check("layer_norm", x, None, None, or_twice_torchs=True)


X = torch.randn(4, 8)


@pytest.mark.parametrize("call, error, match", [
    (lambda: layer_norm([1.0], 1), TypeError, "layer_norm: x must be a torch.Tensor, got list"),
    (lambda: layer_norm(X, 7), ValueError, r"normalized_shape \[7\] must be the trailing dimensions of x"),
    (lambda: layer_norm(X, (2, 4, 8)), ValueError, "must be the trailing dimensions"),
    (lambda: layer_norm(X, "8"), TypeError, "normalized_shape must be an int or a sequence of ints, got str"),
    (lambda: layer_norm(X, None), TypeError, "normalized_shape must be an int or a sequence of ints"),
    (lambda: layer_norm(X, 8, torch.ones(7)), ValueError, r"weight must have shape \[8\]"),
    (lambda: layer_norm(X, 8, None, torch.ones(8, 1)), ValueError, r"bias must have shape \[8\]"),
    (lambda: layer_norm(X, 8, torch.ones(8, dtype=torch.int32)), TypeError, "weight must be float32"),
    (lambda: layer_norm(X, 8, "w"), TypeError, "weight must be a torch.Tensor or None, got str"),
    (lambda: layer_norm(X, 8, eps=-1.0), ValueError, "eps must be a number >= 0"),
    (lambda: layer_norm(X, 8, eps=math.nan), ValueError, "eps must be a number >= 0"),
    (lambda: layer_norm(X.long(), 8, backend="triton"), TypeError, "got torch.int64"),
    (lambda: rms_norm(X, 8, backend="cuda"), ValueError, "backend must be one of"),
    (lambda: rms_norm(X, 8, torch.ones(8, device="meta")), ValueError, "weight is on meta but x is on cpu"),
    (lambda: add_rms_norm(X, X[:, :4]), ValueError, "residual must match x in shape, dtype and device"),
    (lambda: add_rms_norm(X, X.double()), ValueError, "residual must match x"),
    (lambda: add_rms_norm(X, 1.0), TypeError, "residual must be a torch.Tensor, got float"),
    (lambda: add_rms_norm(X, X, torch.ones(4)), ValueError, r"weight must have shape \[8\]"),
    (lambda: add_rms_norm(torch.tensor(1.0), torch.tensor(1.0)), ValueError, "at least one dimension"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


@pytest.mark.parametrize("op", OURS)
def test_compiles_fullgraph_through_the_kernels(op):
    """Registered with torch.library: torch.compile traces the op without a graph break, forward and backward."""
    args = inputs(op, (6, 50), torch.float32)
    compiled = torch.compile(partial(OURS[op], "triton"), fullgraph=True, backend="aot_eager")
    assert_matches_float64(compiled, REFERENCES[op], *args, grad_atol_scale=10)


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("op", OURS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 4096), (5, 123, 123), (64, 65537), (2, 262144), (3, 1 << 20)])
def test_gpu_large_shapes(shape, dtype, op):
    check(op, *inputs(op, shape, dtype, device="cuda"))


@pytest.mark.gpu
@pytest.mark.parametrize("op", OURS)
def test_gpu_compile_backend(op):
    check(op, *inputs(op, (512, 1000), torch.float32, device="cuda"), backend="compile")
