"""flash_attention's forward against attention in float64, by flash-attention's rule (DESIGN.md): our error is at
most twice that of torch's own attention in the same dtype, plus 1e-5 and the result's rounding. Odd lengths, Nq !=
Nk both ways, causal and not, grouped-query heads, every supported head dim, strided inputs.

On a CPU the Triton kernel runs through Triton's interpreter at small shapes; the `gpu` tests repeat the checks
at a language model's sizes.
"""

import importlib

import pytest
import torch
from ops_checks import DEVICE, DTYPES, assert_within_twice_torchs_error, outputs_and_grads, poisoned_passes

from roofline.ops.attention import HEAD_DIMS, attention_reference, flash_attention

attention_module = importlib.import_module("roofline.ops.attention")


def inputs(batch, heads, kv_heads, nq, nk, d, dtype, device=DEVICE):
    q = torch.randn(batch, heads, nq, d, device=device, dtype=dtype)
    k = torch.randn(batch, kv_heads, nk, d, device=device, dtype=dtype)
    v = torch.randn(batch, kv_heads, nk, d, device=device, dtype=dtype)
    return q, k, v


def check(q, k, v, causal=False, scale=None, grad=True):
    """Our output (and dQ, dK, dV) against float64, each within twice the error of torch's attention in q's
    dtype, plus 1e-5 and the result's rounding (ops_checks.assert_within_twice_torchs_error)."""
    if not grad:
        ours = [flash_attention(q, k, v, causal, scale, backend="triton")]
        exact = [attention_reference(q.double(), k.double(), v.double(), causal, scale)]
        theirs = [attention_reference(q, k, v, causal, scale)]
    else:
        dout = torch.randn_like(q)
        ours = outputs_and_grads(lambda *a: flash_attention(*a, causal, scale, backend="triton"), (q, k, v), dout)
        exact = outputs_and_grads(lambda *a: attention_reference(*a, causal, scale), (q, k, v), dout, torch.float64)
        theirs = outputs_and_grads(lambda *a: attention_reference(*a, causal, scale), (q, k, v), dout)
    assert_within_twice_torchs_error(("output", "dq", "dk", "dv"), ours, exact, theirs, q.dtype)
    return ours[0]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk,dtype", [(nq, nk, dtype) for nq, nk in [(1, 1), (113, 113), (1, 70)]
                                         for dtype in DTYPES if nq > 1 or dtype != torch.float16 or DEVICE == "cuda"])
def test_matches_float64_within_twice_torchs_error(nq, nk, causal, dtype):
    # fp16 takes bf16's code path, rounded finer: under the interpreter the one-query shapes (64 programs, ten
    # seconds or more each) leave it to the 113 x 113 case
    # Enough outputs that the largest error is not one lucky element of torch's (in bf16, a few queries' can
    # be: over 15 draws the ratio reached 1.94 with 2 x 8 heads of one query, 1.17 with 4 x 16).
    batch, heads = (4, 16) if nq == 1 else (2, 8)
    check(*inputs(batch, heads, heads, nq, nk, 64, dtype), causal)


@pytest.mark.sweep   # long under the interpreter: ROOFLINE_ALL_TESTS=1 (CI) runs it
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])   # fp16 takes bf16's code path, rounded finer
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("nq,nk", [(203, 113), (113, 203)])
def test_more_queries_than_keys_and_fewer_match_float64(nq, nk, causal, dtype):
    # 4 heads of 113 or 203 queries: over 28,000 outputs, for errors that are no one element's luck
    check(*inputs(1, 4, 4, nq, nk, 64, dtype), causal)


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_every_head_dim(d):
    check(*inputs(1, 2, 1, 70, 90, d, torch.float16), causal=True)


@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_grouped_query_heads(kv_heads):
    check(*inputs(2, 4, kv_heads, 65, 129, 32, torch.bfloat16), causal=True)


@pytest.mark.parametrize("scale", [0.3, -0.3])
def test_strided_inputs_and_a_given_scale(scale):
    # (batch, seq, heads, d) storage, as a projection writes it, seen as (batch, heads, seq, d)
    q = torch.randn(2, 77, 4, 64, device=DEVICE, dtype=torch.float16).transpose(1, 2)
    kv = torch.randn(2, 2, 91, 2, 64, device=DEVICE, dtype=torch.float16)
    k, v = kv[:, 0].transpose(1, 2), kv[:, 1].transpose(1, 2)
    check(q, k, v, causal=False, scale=scale)


def test_queries_that_see_no_key_get_zeros():
    q, k, v = inputs(1, 1, 1, 100, 30, 32, torch.float32)
    out = check(q, k, v, causal=True)     # bottom-right: queries 0..69 see no key
    assert torch.equal(out[:, :, :70], torch.zeros_like(out[:, :, :70]))
    assert out[:, :, 70:].abs().sum() > 0


@pytest.mark.parametrize("held,walked", [(16, 16), (32, 16), (16, 32)])
@pytest.mark.parametrize("nq,nk", [(53, 61), (61, 53)])
def test_tiles_smaller_than_the_lengths_and_poisoned_memory(monkeypatch, held, walked, nq, nk):
    # Several blocks each way, so that the unmasked and masked loops both run, and the causal diagonal cuts
    # blocks of either size at an offset (nk - nq) that is no multiple of them.
    monkeypatch.setattr(attention_module, "tiles", lambda kernel, dtype, d: attention_module.Tiles(held, walked, 4, 1))
    for _ in poisoned_passes((1, 3, max(nq, nk), 64)):
        for causal in (True, False):
            out = check(*inputs(1, 3, 1, nq, nk, 64, torch.float32), causal=causal)
            assert not out.isnan().any()


def test_compiles_fullgraph_through_the_kernels():
    compiled = torch.compile(lambda q, k, v: flash_attention(q * 2, k, v, True, backend="triton"), fullgraph=True,
                             backend="aot_eager")
    q, k, v = inputs(1, 2, 1, 40, 50, 32, torch.float32)
    dout = torch.randn_like(q)
    ours = outputs_and_grads(compiled, (q, k, v), dout)
    exact = outputs_and_grads(lambda q, k, v: attention_reference(q * 2, k, v, True), (q, k, v), dout, torch.float64)
    for o, e in zip(ours, exact):
        torch.testing.assert_close(o.double(), e, rtol=1e-4, atol=1e-5)


def test_the_pre_pass_pads_the_hopper_backwards_per_query_values_with_zeros():
    """The pre-pass for the Hopper backward: delta = rowsum(dO O) and the log-sum-exp in base 2, in rows padded to
    whole blocks, zeros past the queries (the backward reads whole blocks: no garbage may weigh in), and its
    blocks cover the Hopper backward's (a multiple of them)."""
    from roofline.ops import attention_sm90

    assert attention_module.DELTA_BLOCK % attention_sm90.BWD_BLOCK_M == 0
    q, k, v = inputs(2, 3, 3, 70, 70, 64, torch.float32)
    o, do = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(2, 3, 70, device=DEVICE)
    padded = 128   # 70 queries in whole blocks of 64
    delta, lse2 = (torch.full((6, padded), float("nan"), device=DEVICE) for _ in range(2))
    plan = attention_module.AttentionPlan(q, k, False, 0.125)
    plan._per_query_launch(do.stride())(o, do, delta, lse, lse2, 3, 70, padded)
    torch.testing.assert_close(delta[:, :70], (o * do).sum(-1).reshape(6, 70), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse2[:, :70], lse.reshape(6, 70) * attention_module.LOG2E)
    assert torch.equal(delta[:, 70:], torch.zeros(6, 58, device=DEVICE))
    assert torch.equal(lse2[:, 70:], torch.zeros(6, 58, device=DEVICE))


def test_empty_and_torch_backend():
    q, k, v = inputs(1, 2, 2, 0, 5, 32, torch.float32)
    assert flash_attention(q, k, v, backend="triton").shape == (1, 2, 0, 32)
    q, k, v = inputs(1, 2, 2, 4, 0, 32, torch.float32)
    assert torch.equal(flash_attention(q, k, v, backend="triton"), torch.zeros_like(q))
    q, k, v = inputs(1, 2, 1, 9, 9, 16, torch.float64, device="cpu")
    torch.testing.assert_close(flash_attention(q, k, v, causal=True), attention_reference(q, k, v, True))


Q, K, V = inputs(1, 4, 2, 8, 8, 64, torch.float16)


@pytest.mark.parametrize("call,error,match", [
    (lambda: flash_attention(Q, K, V[..., :32], backend="triton"), ValueError, "k and v must have the same shape"),
    (lambda: flash_attention(Q, K[:, :, :, :32], V[:, :, :, :32], backend="triton"), ValueError, "head_dim 32 but q"),
    (lambda: flash_attention(Q, K[:, :1].expand(1, 3, 8, 64), V[:, :1].expand(1, 3, 8, 64), backend="triton"),
     ValueError, r"key heads \(3\) must divide the query heads \(4\)"),
    (lambda: flash_attention(Q, K.float(), V, backend="triton"), TypeError, "must share a dtype"),
    (lambda: flash_attention(Q[0], K, V, backend="triton"), ValueError, "q must be"),
    (lambda: flash_attention(Q[..., :48], K[..., :48], V[..., :48], backend="triton"), ValueError,
     r"head_dim in \(32, 64, 96, 128, 256\), got 48"),
    (lambda: flash_attention(Q, K, V, causal=1, backend="triton"), TypeError, "causal must be a bool"),
    (lambda: flash_attention(Q, K, V, scale=float("nan"), backend="triton"), ValueError, "scale must be"),
    (lambda: flash_attention(Q, K.int(), V, backend="triton"), TypeError, "must share a dtype"),
    (lambda: flash_attention(Q, "k", V, backend="triton"), TypeError, "k must be a torch.Tensor"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 16, 4, 1023, 1023, 128), (1, 8, 8, 4096, 4096, 64), (1, 4, 1, 203, 2048, 96)])
def test_gpu_language_model_sizes(shape, causal, dtype):
    batch, heads, kv_heads, nq, nk, d = shape
    check(*inputs(batch, heads, kv_heads, nq, nk, d, dtype, device="cuda"), causal)


@pytest.mark.gpu
def test_gpu_gradients_repeat_bit_for_bit():
    # no atomic adds in the backward: the same gradients from run to run (attention.py's docstring says so)
    q, k, v = inputs(2, 8, 2, 1000, 1000, 128, torch.bfloat16, device="cuda")
    dout = torch.randn_like(q)
    first, second = (outputs_and_grads(lambda *a: flash_attention(*a, True, backend="triton"), (q, k, v), dout)
                     for _ in range(2))
    for a, b in zip(first, second):
        assert torch.equal(a, b)
