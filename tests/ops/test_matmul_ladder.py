"""The CUDA C++ matmul ladder: every step against float64 on odd shapes, into a poisoned output; bad input.

The kernels need nvcc and a GPU, so their checks are `gpu` tests; the argument checks run everywhere (they come
before any build or launch).
"""

import pytest
import torch

from roofline.ops.matmul_ladder import STEPS, matmul_ladder

# M, K, N: single elements, primes, edges of every tile size (32, 128, and 8 along K), K = 0; rows a multiple of
# 4 floats wide with ragged tiles (the vectorized step's 16-byte path up to the edges)
SHAPES = [(1, 1, 1), (1, 4095, 17), (17, 33, 1), (31, 7, 129), (127, 9, 255), (128, 8, 128), (129, 257, 131),
          (300, 1000, 77), (5, 0, 6), (129, 20, 260), (3, 12, 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("m,k,n", SHAPES, ids=[f"{m}x{k}x{n}" for m, k, n in SHAPES])
def test_gpu_every_step_matches_float64(step, m, k, n):
    a = torch.randn(m, k, device="cuda")
    b = torch.randn(k, n, device="cuda")
    out = torch.full((m, n), float("nan"), device="cuda")   # an element left unwritten stays nan and fails
    result = matmul_ladder(a, b, step, out=out)
    assert result.data_ptr() == out.data_ptr()
    exact = a.double() @ b.double()
    # fp32 sums of k products, in whatever order: within k ulps of the largest partial sum, as torch's own are
    bound = 2 * torch.finfo(torch.float32).eps * max(k, 1) * (a.double().abs() @ b.double().abs())
    assert not out.isnan().any()
    assert ((out.double() - exact).abs() <= bound + 1e-30).all(), (out.double() - exact).abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("step", STEPS)
def test_gpu_takes_views_by_copying_them(step):
    a = torch.randn(64, 70, device="cuda").t()   # [70, 64], transposed
    b = torch.randn(64, 90, device="cuda")[:, ::2]   # [64, 45], strided
    torch.testing.assert_close(matmul_ladder(a, b, step), (a.double() @ b.double()).float(), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_vectorized_step_takes_operands_not_16_byte_aligned():
    # contiguous views one float into their storage: rows a multiple of 4 floats wide, bases 4 bytes off
    a = torch.randn(33 * 64 + 1, device="cuda")[1:].view(33, 64)
    b = torch.randn(64 * 132 + 1, device="cuda")[1:].view(64, 132)
    out = torch.full((34 * 132 + 1,), float("nan"), device="cuda")[1:33 * 132 + 1].view(33, 132)
    matmul_ladder(a, b, "vectorized", out=out)
    torch.testing.assert_close(out, (a.double() @ b.double()).float(), rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_refuses_gradients():
    a = torch.randn(4, 4, device="cuda", requires_grad=True)
    with pytest.raises(NotImplementedError, match="no backward"):
        matmul_ladder(a, torch.randn(4, 4, device="cuda"))
    with torch.no_grad():
        assert matmul_ladder(a, torch.eye(4, device="cuda")).shape == (4, 4)


@pytest.mark.parametrize("a,b,out,error,match", [
    (torch.ones(2, 2), torch.ones(2, 2), None, ValueError, "a must be on a CUDA device, got cpu"),
    ([[1.0]], torch.ones(1, 1), None, TypeError, "a must be a torch.Tensor"),
    (torch.ones(2), torch.ones(2, 2), None, ValueError, r"a must be 2-D, got shape \[2\]"),
    (torch.ones(2, 2), torch.ones(2, 2, dtype=torch.float16), None, TypeError, "b must be float32"),
    (torch.ones(3, 4), torch.ones(5, 6), None, ValueError, r"a's columns \(4\) must equal b's rows \(5\)"),
    (torch.ones(3, 4), torch.ones(4, 6), torch.empty(6, 3), ValueError,
     r"out must be a contiguous float32 tensor of shape \[3, 6\]"),
    (torch.ones(1, 1), torch.ones(1, 65535 * 32 + 1), None, ValueError, "at most 2097120 rows or columns"),
])
def test_bad_input_is_refused_before_any_build(a, b, out, error, match):
    with pytest.raises(error, match=match):
        matmul_ladder(a, b, out=out)


def test_an_unknown_step_is_refused():
    with pytest.raises(ValueError, match="step must be one of"):
        matmul_ladder(torch.ones(2, 2), torch.ones(2, 2), "tiled")


@pytest.mark.gpu
def test_gpu_operands_on_different_devices_are_refused():
    with pytest.raises(ValueError, match="b must be on a CUDA device, got cpu"):
        matmul_ladder(torch.ones(2, 2, device="cuda"), torch.ones(2, 2))
