"""swiglu against a float64 reference, forward and both gradients; chunked projections read in place."""

import math
from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_checks import DEVICE, DTYPES, SHAPES, assert_matches_float64, poisoned_passes

from roofline.ops import swiglu
from roofline.ops.swiglu import _as_rows, swiglu_reference


def check(gate, up, backend="triton"):
    return assert_matches_float64(partial(swiglu, backend=backend), swiglu_reference, gate, up)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1), (5, 23, 13), (2, 3, 257), (4097,)])
def test_matches_float64_reference(shape, dtype):   # (5, 23, 13): 115 rows of 13, a program each here
    check(torch.randn(shape, device=DEVICE, dtype=dtype) * 3, torch.randn(shape, device=DEVICE, dtype=dtype))


def test_halves_of_a_fused_projection_are_read_in_place():
    projection = torch.randn(3, 5, 2 * 300, device=DEVICE)
    gate, up = projection.chunk(2, dim=-1)
    assert _as_rows(gate).data_ptr() == gate.data_ptr()          # a view, not a copy
    check(gate, up)
    # and the gradient reaches the projection through the views
    p = projection.detach().requires_grad_()
    swiglu(*p.chunk(2, dim=-1), backend="triton").sum().backward()
    q = projection.detach().double().requires_grad_()
    swiglu_reference(*q.chunk(2, dim=-1)).sum().backward()
    torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-5, atol=1e-5)


def test_other_strided_views():
    base = torch.randn(40, 64, device=DEVICE)
    check(base.t(), torch.randn(64, 40, device=DEVICE))            # strided last dimension: copied
    check(base[:39:3, 1:], base[1::3, :-1])                        # strided rows and offset starts
    x = torch.randn(4, 6, 10, device=DEVICE).transpose(0, 1)[:, :, 2:]   # no single row stride fits
    check(x, torch.randn(x.shape, device=DEVICE))


def test_poisoned_output_memory_is_overwritten():
    gate, up = torch.randn(64, 300, device=DEVICE), torch.randn(64, 300, device=DEVICE)
    for _ in poisoned_passes((3, 64, 300)):
        check(gate, up)


def test_extreme_values_behave_as_in_torch():
    inf, nan = math.inf, math.nan
    gate = torch.tensor([-inf, inf, nan, -1e4, 1e4, -90.0, 90.0, 0.0, -0.0, 1.0, 2.0], device=DEVICE)
    up = torch.tensor([1.0, 2.0, 1.0, 3.0, -3.0, 1.0, 1.0, inf, 5.0, nan, -inf], device=DEVICE)
    torch.testing.assert_close(swiglu(gate, up, backend="triton"),
                               swiglu_reference(gate.double(), up.double()).float(), equal_nan=True)


def test_empty_and_torch_backends():
    check(torch.randn(0, 5, device=DEVICE), torch.randn(0, 5, device=DEVICE))
    check(torch.randn(9, 33, device=DEVICE), torch.randn(9, 33, device=DEVICE), backend="torch")
    check(torch.randn(9, 33, device=DEVICE), torch.randn(9, 33, device=DEVICE), backend=None)


@settings(max_examples=20, deadline=None)
@given(shape=SHAPES, dtype=st.sampled_from(DTYPES),
       transpose=st.booleans(), scale=st.sampled_from([0.1, 1.0, 30.0]))
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_property_any_shape_dtype_and_stride(shape, dtype, transpose, scale):
    gate = torch.randn(shape, device=DEVICE, dtype=dtype) * scale
    up = torch.randn(shape, device=DEVICE, dtype=dtype)
    if transpose and gate.dim() >= 2:
        gate, up = gate.transpose(0, -1), up.transpose(0, -1)
    check(gate, up)


G = torch.randn(4, 8)


@pytest.mark.parametrize("call, error, match", [
    (lambda: swiglu([1.0], G), TypeError, "swiglu: gate must be a torch.Tensor, got list"),
    (lambda: swiglu(G, None), TypeError, "swiglu: up must be a torch.Tensor, got NoneType"),
    (lambda: swiglu(G, G[:, :4]), ValueError, "up must match gate in shape, dtype and device"),
    (lambda: swiglu(G, G.half()), ValueError, "up must match gate"),
    (lambda: swiglu(G.long(), G.long(), backend="triton"), TypeError, "takes gate of dtype"),
    (lambda: swiglu(G, G, backend="cuda"), ValueError, "backend must be one of"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_compiles_fullgraph_through_the_kernels():
    projection = torch.randn(6, 2 * 50, device=DEVICE)
    compiled = torch.compile(lambda p: swiglu(*p.chunk(2, -1), backend="triton"), fullgraph=True,
                             backend="aot_eager")
    assert_matches_float64(compiled, lambda p: swiglu_reference(*p.chunk(2, -1)), projection)


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(16384, 8192), (5, 123, 123), (3, 65537), (1 << 24,)])
def test_gpu_large_shapes(shape, dtype):
    check(torch.randn(shape, device="cuda", dtype=dtype) * 3, torch.randn(shape, device="cuda", dtype=dtype))


@pytest.mark.gpu
def test_gpu_fused_projection_and_compile_backend():
    gate, up = torch.randn(4096, 2 * 4096, device="cuda", dtype=torch.bfloat16).chunk(2, -1)
    check(gate, up)
    check(gate, up, backend="compile")
