"""softmax and log_softmax against a float64 reference, forward and backward.

On a CPU the Triton kernels run through Triton's interpreter at small shapes; rows longer than
one block (the two-pass online path) are reached by shrinking MAX_BLOCK. The `gpu` tests repeat
the checks at scale.
"""

import importlib
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_checks import SHAPES, block_size_fixture, patched, poisoned_passes

from roofline.ops import log_softmax, softmax
from roofline.ops.softmax import softmax_by_hand

softmax_module = importlib.import_module("roofline.ops.softmax")   # the package's `softmax` is the function

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# rtol, atol against the float64 reference; the atol of a gradient grows with the row (it sums over it).
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}
OPS = {"softmax": (softmax, F.softmax), "log_softmax": (log_softmax, F.log_softmax)}


def check(x, op, dim=-1, backend="triton", grad=True):
    ours, reference = OPS[op]
    x = x.detach().requires_grad_(grad)
    ref_x = x.detach().double().requires_grad_(grad)
    y = ours(x, dim, backend=backend)
    ref = reference(ref_x, dim=dim)
    assert y.dtype == x.dtype and y.shape == x.shape and y.device == x.device
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol, equal_nan=True)
    if grad and x.numel():
        dy = torch.randn_like(y)
        y.backward(dy)
        ref.backward(dy.double())
        n = x.shape[dim] if x.dim() else 1
        torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=rtol, atol=atol * max(1.0, math.sqrt(n)))


max_block = block_size_fixture(softmax_module, "MAX_BLOCK", [softmax_module.MAX_BLOCK, 64], ["one-block", "looped"])


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 1), (5, 123), (2, 3, 257), (4, 1000)])
def test_matches_float64_reference(shape, dtype, op, max_block):
    check(torch.randn(shape, device=DEVICE, dtype=dtype) * 3, op)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dim", [0, -2])
def test_any_dim_and_strided_inputs(op, dim, max_block):
    x = torch.randn(3, 70, 4, device=DEVICE)          # small: the interpreter runs one program per row
    check(x, op, dim)
    check(x.transpose(0, 2), op, dim)                   # non-contiguous
    check(x[:, ::2, 1:], op, dim)                      # sliced


@pytest.mark.parametrize("op", OPS)
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_poisoned_output_memory_is_overwritten(op, max_block):
    x = torch.randn(64, 200, device=DEVICE)
    for _ in poisoned_passes((64, 200)):
        check(x, op)


@pytest.mark.parametrize("op", OPS)
def test_extreme_values_behave_as_in_torch(op, max_block):
    inf = math.inf
    x = torch.tensor([[1e4, -1e4, 0.0, 5.0] * 40,                 # huge logits: no overflow
                      [-inf] * 160,                               # all -inf: nan, as torch
                      [-inf] * 100 + [0.0, 1.0] * 30,            # -inf for the first blocks, then finite
                      [0.0] * 80 + [inf] + [0.0] * 79,            # +inf: nan where torch has it
                      [0.0] * 80 + [math.nan] + [0.0] * 79],      # nan propagates
                     device=DEVICE)
    ours, reference = OPS[op]
    torch.testing.assert_close(ours(x, backend="triton"), reference(x.double(), dim=-1).float(), equal_nan=True)


def test_empty_and_zero_dim(max_block):
    for x in (torch.randn(0, 5, device=DEVICE), torch.randn(4, 0, device=DEVICE), torch.tensor(2.0, device=DEVICE)):
        for op, (ours, reference) in OPS.items():
            torch.testing.assert_close(ours(x, backend="triton"), reference(x, dim=-1), equal_nan=True)


def test_cuda_backend_needs_a_cuda_tensor(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="softmax: backend='cuda' needs x on a CUDA device, got x on cpu"):
        softmax(torch.randn(3), backend="cuda")


def test_by_hand_version_and_default_backend():
    x = torch.randn(9, 33, device=DEVICE)
    torch.testing.assert_close(softmax_by_hand(x), F.softmax(x, dim=-1))
    torch.testing.assert_close(softmax(x), F.softmax(x, dim=-1))


@settings(max_examples=20, deadline=None)
@given(
    shape=SHAPES,
    dtype=st.sampled_from(DTYPES),
    op=st.sampled_from(sorted(OPS)),
    data=st.data(),
    transpose=st.booleans(),
    scale=st.sampled_from([0.1, 1.0, 30.0]),
    block=st.sampled_from([16, softmax_module.MAX_BLOCK]),
)
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_property_any_shape_dim_dtype_and_stride(shape, dtype, op, data, transpose, scale, block):
    x = torch.randn(shape, device=DEVICE, dtype=dtype) * scale
    if transpose and x.dim() >= 2:
        x = x.transpose(0, -1)
    dim = data.draw(st.integers(-x.dim(), x.dim() - 1))
    with patched(softmax_module, "MAX_BLOCK", block):
        check(x, op, dim)


@pytest.mark.parametrize("call, error, match", [
    (lambda: softmax([1.0, 2.0]), TypeError, "softmax: x must be a torch.Tensor, got list"),
    (lambda: softmax(torch.randn(3, 4), dim=2), IndexError, "dim 2 is out of range for x with 2 dimensions"),
    (lambda: log_softmax(torch.randn(3, 4), dim=-3), IndexError, "log_softmax: dim -3 is out of range"),
    (lambda: softmax(torch.randn(3), dim=1.0), TypeError, "dim must be an int, got float"),
    (lambda: softmax(torch.randn(3), dim=None), TypeError, "dim must be an int, got NoneType"),
    (lambda: softmax(torch.randn(3), backend="numpy"), ValueError, "backend must be one of"),
    (lambda: softmax(torch.arange(3), backend="triton"), TypeError, "got torch.int64"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4096, 4096), (5, 123, 123), (64, 65537), (2, 262144), (1, 1 << 20)])
def test_gpu_large_shapes(shape, dtype, op):
    check(torch.randn(shape, device="cuda", dtype=dtype) * 3, op)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1,), (7,), (5, 123, 123), (64, 65537), (4096, 4096), (2, 262144), (3, 1000)])
def test_gpu_cuda_cpp_forward(shape, dtype):
    check(torch.randn(shape, device="cuda", dtype=dtype) * 3, "softmax", backend="cuda", grad=False)


@pytest.mark.gpu
def test_gpu_cuda_cpp_extreme_values_misaligned_rows_and_refusals():
    x = torch.randn(5, 160, device="cuda")
    x[0] = torch.tensor([1e4, -1e4, 0.0, 5.0] * 40)
    x[1] = -math.inf
    x[2, :100] = -math.inf
    x[3, 80] = math.inf
    x[4, 80] = math.nan
    torch.testing.assert_close(softmax(x, backend="cuda"), F.softmax(x.double(), -1).float(), equal_nan=True)
    base = torch.randn(10_001, device="cuda")
    for offset in (1, 2, 3):   # rows that start off 16-byte alignment: one element per access
        check(base[offset:offset + 9_990].view(10, 999), "softmax", backend="cuda", grad=False)
    check(torch.randn(3, 70, 4, device="cuda"), "softmax", dim=1, backend="cuda", grad=False)
    with pytest.raises(NotImplementedError, match="forward pass only"):
        softmax(torch.randn(4, 8, device="cuda", requires_grad=True), backend="cuda")
    with pytest.raises(ValueError, match="backend='cuda' has softmax only"):
        log_softmax(torch.randn(4, 8, device="cuda"), backend="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("op", OPS)
def test_gpu_compile_backend(op):
    check(torch.randn(512, 1000, device="cuda"), op, backend="compile")


@pytest.mark.parametrize("op", OPS)
def test_compiles_fullgraph_through_the_kernels(op):
    """Registered with torch.library: torch.compile traces the op without a graph break, forward and backward."""
    ours, reference = OPS[op]
    x = torch.randn(6, 50, 3, device=DEVICE, requires_grad=True)
    compiled = torch.compile(lambda t: ours(t, 1, backend="triton").sin(), fullgraph=True, backend="aot_eager")
    y = compiled(x)
    y.sum().backward()
    ref_x = x.detach().double().requires_grad_()
    reference(ref_x, dim=1).sin().sum().backward()
    torch.testing.assert_close(y.double(), reference(ref_x.detach(), dim=1).sin(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=1e-5, atol=1e-5)
