"""GeLU against a float64 reference, forward and backward, every backend that runs here.

On a CPU the Triton kernels run through Triton's interpreter at small shapes;
the `gpu` tests repeat the checks at scale and cover the CUDA C++ kernel.
"""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from roofline.ops import gelu
from roofline.ops.gelu import gelu_tanh_by_hand

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# rtol, atol against the float64 reference (output rounding of the dtype dominates).
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}


def check(x, approximate, backend, grad=True):
    """Forward and input gradient of gelu vs F.gelu in float64 on the same values."""
    x = x.detach().requires_grad_(grad)
    ref_x = x.detach().double().requires_grad_(grad)
    y = gelu(x, approximate, backend=backend)
    ref = F.gelu(ref_x, approximate=approximate)
    assert y.dtype == x.dtype and y.shape == x.shape and y.device == x.device
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(y.double(), ref, rtol=rtol, atol=atol)
    if grad and x.numel():
        dy = torch.randn_like(y)
        y.backward(dy)
        ref.backward(dy.double())
        torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=rtol, atol=2 * atol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1,), (5, 123, 123), (65537,), (3, 0, 7)])
def test_triton_matches_float64_reference(shape, approximate, dtype):
    check(torch.randn(shape, device=DEVICE, dtype=dtype) * 3, approximate, "triton")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_triton_on_strided_views(approximate):
    base = torch.randn(64, 130, device=DEVICE)
    check(base[:, 1:128:3], approximate, "triton")  # non-contiguous columns
    check(base.t(), approximate, "triton")  # transposed
    check(base.view(-1)[1:], approximate, "triton")  # offset: misaligned start


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_extreme_values_behave_as_in_torch(approximate):
    x = torch.tensor([-math.inf, math.inf, math.nan, -1e4, 1e4, -30.0, 30.0, 0.0, -0.0, 1e-30, -1e-30],
                     device=DEVICE)
    y = gelu(x, approximate, backend="triton")
    # torch's float64 result: its AVX-512 float32 CPU kernel (torch 2.13) returns nan for gelu(+inf), 'none' form.
    expected = F.gelu(x.double(), approximate=approximate).to(x.dtype)
    torch.testing.assert_close(y, expected, equal_nan=True)


def test_erf_form_keeps_its_digits_in_the_negative_tail():
    # Phi(x) from erfc directly: 1 + erf(x / sqrt 2) cancels to nothing down here (in float64 too, past x = -8).
    x = -torch.linspace(4.0, 12.0, 4097, device=DEVICE)
    y = gelu(x, backend="triton").double()
    ref = x.double() * 0.5 * torch.special.erfc(-x.double() / math.sqrt(2))
    assert ((y - ref).abs() / ref.abs()).max() < 1e-4


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_hand_written_tanh_formula_and_torch_backend(approximate):
    x = torch.randn(1000, device=DEVICE, dtype=torch.float64)
    torch.testing.assert_close(gelu_tanh_by_hand(x), F.gelu(x, approximate="tanh"))
    check(torch.randn(257, device=DEVICE), approximate, "torch")


def test_default_backend_follows_the_device():
    x = torch.randn(33, device=DEVICE)
    torch.testing.assert_close(gelu(x), F.gelu(x))


@settings(max_examples=20, deadline=None)
@given(
    shape=st.lists(st.integers(0, 40), min_size=1, max_size=3),
    dtype=st.sampled_from(DTYPES),
    approximate=st.sampled_from(["none", "tanh"]),
    transpose=st.booleans(),
    scale=st.sampled_from([0.1, 1.0, 10.0]),
)
def test_property_any_shape_dtype_and_stride(shape, dtype, approximate, transpose, scale):
    x = torch.randn(shape, device=DEVICE, dtype=dtype) * scale
    if transpose and x.dim() >= 2:
        x = x.transpose(0, -1)
    check(x, approximate, "triton")


@pytest.mark.parametrize("call, error, match", [
    (lambda: gelu([1.0, 2.0]), TypeError, "x must be a torch.Tensor, got list"),
    (lambda: gelu(torch.randn(3), approximate="fast"), ValueError, "approximate must be one of"),
    (lambda: gelu(torch.randn(3), backend="numpy"), ValueError, "backend must be one of"),
    (lambda: gelu(torch.arange(3), backend="triton"), TypeError, "dtype float32, float16 or bfloat16, got torch.int64"),
    (lambda: gelu(torch.randn(3, dtype=torch.float64), backend="triton"), TypeError, "got torch.float64"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_kernels_need_a_cuda_tensor_outside_the_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="backend='cuda' needs x on a CUDA device, got x on cpu"):
        gelu(torch.randn(3), backend="cuda")
    with pytest.raises(ValueError, match="backend='triton' needs x on a CUDA device.*TRITON_INTERPRET=1"):
        gelu(torch.randn(3), backend="triton")


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("backend", ["triton", "compile"])
def test_gpu_large_shapes(backend, approximate, dtype):
    check(torch.randn(4096, 4097, device="cuda", dtype=dtype) * 3, approximate, backend)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1,), (7,), (5, 123, 123), (65537,), (1 << 24,)])
def test_gpu_cuda_cpp_forward(shape, approximate, dtype):
    check(torch.randn(shape, device="cuda", dtype=dtype) * 3, approximate, "cuda", grad=False)


@pytest.mark.gpu
def test_gpu_cuda_cpp_writes_every_element_of_misaligned_views():
    base = torch.randn(10_001, device="cuda")
    for offset in (1, 2, 3):
        x = base[offset:]  # not 16-byte aligned: the scalar path
        poison = torch.full_like(x, math.nan)
        del poison  # the next allocation of this size reuses the NaN block
        check(x, "tanh", "cuda", grad=False)


@pytest.mark.gpu
def test_gpu_cuda_cpp_refuses_to_pretend_it_has_a_backward():
    x = torch.randn(10, device="cuda", requires_grad=True)
    with pytest.raises(NotImplementedError, match="forward pass only"):
        gelu(x, backend="cuda")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_compiles_fullgraph_through_the_kernels(approximate):
    """Registered with torch.library: torch.compile traces the op without a graph break, forward and backward."""
    x = torch.randn(6, 50, device=DEVICE, requires_grad=True)
    compiled = torch.compile(lambda t: gelu(t * 2, approximate, backend="triton").sum(), fullgraph=True,
                             backend="aot_eager")
    compiled(x).backward()
    ref_x = x.detach().double().requires_grad_()
    F.gelu(ref_x * 2, approximate=approximate).sum().backward()
    torch.testing.assert_close(x.grad.double(), ref_x.grad, rtol=1e-5, atol=1e-5)
