"""rope against a float64 reference: both rotated outputs and the gradients of q and k, strided views,
fewer key heads than query heads, every layout of cos and sin."""

from functools import partial

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from ops_checks import DEVICE, DTYPES, assert_matches_float64, poisoned_passes

from roofline.ops import rope
from roofline.ops.rope import rope_reference


def angles(batch, seq, dim, per_batch=False, dtype=torch.float32, device=DEVICE, base=10000.0):
    """cos and sin tables as LLaMA builds them: the frequencies repeated over both halves."""
    inv_freq = 1.0 / base ** (torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim)
    positions = torch.arange(seq, device=device, dtype=torch.float64)
    if per_batch:
        positions = positions + torch.arange(batch, device=device)[:, None] * 7   # each sequence at an offset
    freqs = positions[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def check(q, k, cos, sin, backend="triton"):
    # cos and sin are fixed tables: compared as given, no gradient asked for them
    ours = partial(lambda q, k, backend: rope(q, k, cos, sin, backend=backend), backend=backend)
    reference = partial(lambda q, k: rope_reference(q, k, cos.double(), sin.double()))
    return assert_matches_float64(ours, reference, q, k)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1, 1, 2), (2, 4, 7, 64), (3, 8, 5, 128), (1, 3, 17, 96), (2, 2, 3, 6)])
def test_matches_float64_reference(shape, dtype):
    B, H, T, D = shape
    cos, sin = angles(B, T, D)
    check(torch.randn(shape, device=DEVICE, dtype=dtype), torch.randn(shape, device=DEVICE, dtype=dtype), cos, sin)


@pytest.mark.parametrize("heads", [(8, 2), (8, 1), (6, 6), (4, 8)])
def test_grouped_query_heads(heads):
    hq, hk = heads
    cos, sin = angles(2, 9, 32)
    check(torch.randn(2, hq, 9, 32, device=DEVICE), torch.randn(2, hk, 9, 32, device=DEVICE), cos, sin)


def test_strided_views_from_a_fused_projection():
    B, T, HQ, HK, D = 2, 11, 4, 2, 32
    qkv = torch.randn(B, T, (HQ + 2 * HK) * D, device=DEVICE)
    q = qkv[..., :HQ * D].view(B, T, HQ, D).transpose(1, 2)                   # (B, HQ, T, D), strided
    k = qkv[..., HQ * D:(HQ + HK) * D].view(B, T, HK, D).transpose(1, 2)
    assert not q.is_contiguous() and not k.is_contiguous()
    cos, sin = angles(B, T, D)
    check(q, k, cos, sin)
    # a view whose last dimension is strided is copied once, and still right
    check(torch.randn(B, HQ, T, 2 * D, device=DEVICE)[..., ::2], torch.randn(B, HK, T, D, device=DEVICE), cos, sin)


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "fused", "decode"])
def test_outputs_are_laid_out_as_the_torch_expression_lays_them_out(layout):
    """A swapped rope must hand attention the layout torch's expression would: attention kernels choose their
    paths (and cuDNN its bugs) by the layout of q and k."""
    B, T, HQ, HK, D = 2, 1 if layout == "decode" else 7, 4, 2, 16
    if layout == "contiguous":
        q, k = torch.randn(B, HQ, T, D, device=DEVICE), torch.randn(B, HK, T, D, device=DEVICE)
    else:
        qkv = torch.randn(B, T, (HQ + 2 * HK) * D, device=DEVICE)
        width = (HQ + HK) * D if layout == "fused" else HQ * D   # fused: views into one projection
        q = qkv[..., :HQ * D].view(B, T, HQ, D).transpose(1, 2)
        k = (qkv[..., HQ * D:width] if layout == "fused" else torch.randn(B, T, HK * D, device=DEVICE))
        k = k.reshape(B, T, HK, D).transpose(1, 2) if layout != "fused" else k.view(B, T, HK, D).transpose(1, 2)
    cos, sin = angles(B, T, D)
    for ours, theirs in zip(rope(q, k, cos, sin, backend="triton"), rope_reference(q, k, cos, sin)):
        assert [ours.stride(d) for d in range(4) if ours.shape[d] > 1] == \
            [theirs.stride(d) for d in range(4) if theirs.shape[d] > 1]
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)


# How model code keeps its angle tables: (seq, dim); (1 or batch, seq, dim); with a heads dimension of 1 to
# broadcast over (buffers of (1, 1, seq, dim), or (batch, 1, seq, dim) from position ids); transposed storage.
LAYOUTS = {
    "seq": lambda c: c[0], "one": lambda c: c[:1], "batch": lambda c: c,
    "one-one": lambda c: c[:1, None], "batch-one": lambda c: c[:, None],
    "strided": lambda c: c.transpose(0, 1).contiguous().transpose(0, 1)[:, None],
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_of_the_angle_tables_and_their_dtype(layout):
    """Forward and both gradients against float64, for every layout that broadcasts against q and k."""
    B, T, D = 3, 6, 16
    cos, sin = (LAYOUTS[layout](t) for t in angles(B, T, D, per_batch=True))
    q, k = torch.randn(B, 2, T, D, device=DEVICE, dtype=torch.bfloat16), torch.randn(B, 1, T, D, device=DEVICE,
                                                                                     dtype=torch.bfloat16)
    check(q, k, cos, sin)                                          # fp32 tables, bf16 activations
    check(q, k, cos.to(torch.bfloat16), sin.to(torch.bfloat16))


def test_one_position_or_per_head_angles_broadcast_as_torch_does():
    """A table of one position, shared by every position of q (it broadcasts), and angles that differ by head
    (the reference computes those: the kernel reads one table for all heads)."""
    B, H, T, D = 2, 3, 5, 8
    q, k = torch.randn(B, H, T, D, device=DEVICE), torch.randn(B, H, T, D, device=DEVICE)
    cos, sin = angles(B, 1, D)
    check(q, k, cos[:, None], sin[:, None])
    per_head = torch.randn(B, H, T, D, device=DEVICE)
    check(q, k, per_head.cos(), per_head.sin())
    with pytest.raises(ValueError, match="cos must broadcast against q"):
        rope(q, k[:, :1], per_head.cos(), per_head.sin())   # angles for 3 heads, and k has 1


def test_gradient_of_only_one_output_and_poisoned_outputs():
    cos, sin = angles(2, 5, 8)
    q = torch.randn(2, 3, 5, 8, device=DEVICE, requires_grad=True)
    k = torch.randn(2, 1, 5, 8, device=DEVICE, requires_grad=True)
    ref_q = q.detach().double().requires_grad_()
    rope_reference(ref_q, k.detach().double(), cos.double(), sin.double())[0].sum().backward()
    for _ in poisoned_passes((4, 3, 5, 8)):
        q.grad = k.grad = None
        q_rot, _ = rope(q, k, cos, sin, backend="triton")
        q_rot.sum().backward()
        torch.testing.assert_close(q.grad.double(), ref_q.grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(k.grad, torch.zeros_like(k))


def test_empty_and_torch_backends():
    cos, sin = angles(2, 0, 8)
    check(torch.randn(2, 3, 0, 8, device=DEVICE), torch.randn(2, 1, 0, 8, device=DEVICE), cos, sin)
    cos, sin = angles(2, 5, 8)
    check(torch.randn(2, 3, 5, 8, device=DEVICE), torch.randn(2, 1, 5, 8, device=DEVICE), cos, sin, backend="torch")
    check(torch.randn(2, 3, 5, 8, device=DEVICE), torch.randn(2, 1, 5, 8, device=DEVICE), cos, sin, backend=None)


@settings(max_examples=20, deadline=None)
@given(B=st.integers(1, 3), HQ=st.integers(1, 6), HK=st.integers(1, 6), T=st.integers(1, 9),
       half=st.integers(1, 20), dtype=st.sampled_from(DTYPES), transpose=st.booleans(),
       per_batch=st.booleans())
@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
def test_property_any_shape_dtype_and_stride(B, HQ, HK, T, half, dtype, transpose, per_batch):
    D = 2 * half
    if transpose:   # (B, T, H, D) memory seen as (B, H, T, D)
        q = torch.randn(B, T, HQ, D, device=DEVICE, dtype=dtype).transpose(1, 2)
        k = torch.randn(B, T, HK, D, device=DEVICE, dtype=dtype).transpose(1, 2)
    else:
        q, k = torch.randn(B, HQ, T, D, device=DEVICE, dtype=dtype), torch.randn(B, HK, T, D, device=DEVICE,
                                                                                 dtype=dtype)
    cos, sin = angles(B, T, D, per_batch=per_batch)
    check(q, k, cos, sin)


Q, K = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
C, S = angles(2, 5, 8, device="cpu")


@pytest.mark.parametrize("call, error, match", [
    (lambda: rope([1.0], K, C, S), TypeError, "rope: q must be a torch.Tensor, got list"),
    (lambda: rope(Q, None, C, S), TypeError, "rope: k must be a torch.Tensor, got NoneType"),
    (lambda: rope(Q[0], K, C, S), ValueError, r"q and k must be \(batch, heads, seq, head_dim\)"),
    (lambda: rope(Q, K[..., :6], C, S), ValueError, "k must match q in batch, seq and head_dim"),
    (lambda: rope(Q, K.double(), C, S), ValueError, "k must match q in dtype and device"),
    (lambda: rope(Q[..., :7], K[..., :7], C[..., :7], S[..., :7]), ValueError, "head_dim must be even"),
    (lambda: rope(Q, K, C[:4], S), ValueError, r"cos must broadcast against q \[2, 4, 5, 8\]"),
    (lambda: rope(Q, K, C, S.expand(3, 5, 8)), ValueError, r"sin must broadcast"),
    (lambda: rope(Q, K, C[..., :4], S), ValueError, r"with head_dim 8.*got \[5, 4\]"),
    (lambda: rope(Q, K, C[None, None, None], S), ValueError, r"cos must broadcast"),
    (lambda: rope(Q, K, C.to(torch.int32), S), TypeError, "cos must be float32"),
    (lambda: rope(Q, K, C.requires_grad_(), S), ValueError, "no gradient flows to cos"),
    (lambda: rope(Q.long(), K.long(), C, S, backend="triton"), TypeError, "takes q of dtype"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_compiles_fullgraph_through_the_kernel():
    cos, sin = angles(2, 5, 16)
    compiled = torch.compile(lambda q, k: rope(q * 2, k, cos, sin, backend="triton"), fullgraph=True,
                             backend="aot_eager")
    assert_matches_float64(compiled, lambda q, k: rope_reference(q * 2, k, cos.double(), sin.double()),
                           torch.randn(2, 4, 5, 16, device=DEVICE), torch.randn(2, 2, 5, 16, device=DEVICE))


def test_compiled_outputs_have_the_layout_the_kernel_gives():
    """The registered op's fake outputs must be laid out as the real ones are, or a compiled graph reads them
    with the wrong strides."""
    cos, sin = angles(2, 5, 16)
    q = torch.randn(2, 5, 4, 16, device=DEVICE).transpose(1, 2)     # (batch, heads, seq, dim) views of
    k = torch.randn(2, 5, 2, 16, device=DEVICE).transpose(1, 2)     # (batch, seq, heads, dim) memory
    compiled = torch.compile(lambda q, k: rope(q, k, cos, sin, backend="triton"), fullgraph=True, backend="aot_eager")
    got, eager = compiled(q, k), rope(q, k, cos, sin, backend="triton")
    assert [t.stride() for t in got] == [t.stride() for t in eager] == [q.stride(), k.stride()]
    for a, b in zip(got, eager):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(4, 32, 4096, 128, 8), (2, 12, 1000, 64, 12), (1, 5, 123, 96, 1)])
def test_gpu_large_shapes(shape, dtype):
    B, HQ, T, D, HK = shape
    cos, sin = angles(B, T, D, device="cuda")
    check(torch.randn(B, HQ, T, D, device="cuda", dtype=dtype), torch.randn(B, HK, T, D, device="cuda", dtype=dtype),
          cos, sin)
