"""linear_cross_entropy against F.cross_entropy(F.linear(...)): the loss and the gradients of x, weight and bias, in
one chunk and in several, every reduction, label smoothing, ignore_index, under autocast and torch.compile.

fp32 is held against float64 at fp32's tolerance; fp16 and bf16, whose matmuls round by construction, against
twice torch's own error in that dtype (DESIGN.md's rule for GEMMs). On a CPU the cross-entropy kernel runs through
Triton's interpreter and the matmuls are torch's; the `gpu` tests repeat the checks at a language model's sizes and
check the memory the op holds.
"""

import importlib
from functools import partial

import pytest
import torch
from ops_checks import DEVICE, assert_matches_float64, assert_within_twice_torchs_error, outputs_and_grads

from roofline.ops import linear_cross_entropy, wait_for_target_checks
from roofline.ops.linear_cross_entropy import linear_cross_entropy_reference

lce_module = importlib.import_module("roofline.ops.linear_cross_entropy")


def inputs(rows, hidden, classes, dtype=torch.float32, bias=True, ignored=0.2, lead=(), device=DEVICE):
    x = torch.randn(*lead, rows, hidden, device=device, dtype=dtype)
    weight = torch.randn(classes, hidden, device=device, dtype=dtype) * hidden ** -0.5 * 3
    b = torch.randn(classes, device=device, dtype=dtype) * 0.5 if bias else None
    target = torch.randint(0, classes, (*lead, rows), device=device)
    target[torch.rand(target.shape, device=device) < ignored] = -100
    return x, weight, target, b


def check_fp32(x, weight, target, bias, **options):
    reduction = options.get("reduction", "mean")
    scale = 1.0 / target.numel() if reduction == "mean" else 1.0
    ours = partial(_call, backend="triton", **options)
    reference = partial(_call, reference=True, **options)
    assert_matches_float64(ours, reference, x, weight, bias, target, grad_atol_scale=max(scale, 1e-2) * 10)


def _call(x, weight, bias, target, reference=False, **options):
    if reference:
        return linear_cross_entropy_reference(x, weight, target, bias, **{k: v for k, v in options.items()
                                                                          if k not in ("chunk_rows", "backend")})
    return linear_cross_entropy(x, weight, target, bias, **options)


@pytest.mark.parametrize("chunk_rows", [None, 16], ids=["one-chunk", "chunks"])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_fp32_matches_float64(reduction, smoothing, bias, chunk_rows):
    check_fp32(*inputs(37, 24, 50, bias=bias), reduction=reduction, label_smoothing=smoothing, chunk_rows=chunk_rows)


def test_leading_dimensions_and_ignore_index_inside_the_classes():
    x, weight, target, bias = inputs(9, 16, 40, lead=(2,), ignored=0.0)
    target[0, :3] = 7
    check_fp32(x, weight, target, bias, reduction="none", ignore_index=7, chunk_rows=16)
    check_fp32(x, weight, target, bias, ignore_index=7)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_reduced_loss_is_no_view(backend):
    """As F.cross_entropy's: FSDP2 warns of a module that returns a view (an in-place op on it would skip its
    hooks), and the ladder's FSDP2 rungs returned this loss."""
    x, weight, target, _ = inputs(9, 16, 40)
    assert not linear_cross_entropy(x, weight, target, backend=backend)._is_view()


@pytest.mark.parametrize("reduction", ["mean", "none"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_within_twice_torchs_error(dtype, reduction):
    x, weight, target, bias = inputs(40, 32, 70)
    call = partial(linear_cross_entropy, target=target, reduction=reduction, backend="triton", chunk_rows=16)
    reference = partial(linear_cross_entropy_reference, target=target, reduction=reduction)
    dout = torch.rand(target.shape if reduction == "none" else (), device=DEVICE) + 0.5

    def run(fn, dtype):
        return outputs_and_grads(lambda x, w, b: fn(x, w, bias=b), (x, weight, bias), dout, dtype)

    names = ("loss", "dx", "dweight", "dbias")
    assert_within_twice_torchs_error(names, run(call, dtype), run(reference, torch.float64), run(reference, dtype),
                                     dtype, norm=names)


def test_only_the_gradients_wanted_are_computed():
    x, weight, target, bias = inputs(20, 16, 30)
    expected = linear_cross_entropy_reference(x.double(), weight.double(), target, bias.double())
    with torch.no_grad():
        loss = linear_cross_entropy(x.requires_grad_(), weight, target, bias, backend="triton", chunk_rows=16)
    assert not loss.requires_grad
    torch.testing.assert_close(loss.double(), expected, rtol=1e-5, atol=1e-5)
    x.requires_grad_(False)
    frozen_head = weight.clone()                  # fine-tuning under a frozen head: only x wants a gradient
    x_leaf = x.clone().requires_grad_()
    linear_cross_entropy(x_leaf, frozen_head, target, backend="triton", chunk_rows=16).backward()
    x_ref = x.double().requires_grad_()
    linear_cross_entropy_reference(x_ref, weight.double(), target).backward()
    torch.testing.assert_close(x_leaf.grad.double(), x_ref.grad, rtol=1e-5, atol=1e-6)
    assert frozen_head.grad is None
    head = weight.clone().requires_grad_()        # only the weight
    linear_cross_entropy(x, head, target, bias, backend="triton").backward()
    head_ref = weight.double().requires_grad_()
    linear_cross_entropy_reference(x.double(), head_ref, target, bias.double()).backward()
    torch.testing.assert_close(head.grad.double(), head_ref.grad, rtol=1e-5, atol=1e-6)


def test_gradients_are_scaled_by_the_incoming_one_and_a_second_backward_is_refused():
    x, weight, target, _ = inputs(20, 16, 30, bias=False)
    x.requires_grad_()
    loss = linear_cross_entropy(x, weight, target, backend="triton", chunk_rows=16)
    (loss * 3).backward(retain_graph=True)
    x_ref = x.detach().double().requires_grad_()
    (linear_cross_entropy_reference(x_ref, weight.double(), target) * 3).backward()
    torch.testing.assert_close(x.grad.double(), x_ref.grad, rtol=1e-5, atol=1e-6)
    with pytest.raises(RuntimeError, match="a second backward through the same forward"):
        loss.backward()


def test_out_of_range_targets_are_nan_and_a_clear_error_unless_unchecked():
    x, weight, target, _ = inputs(40, 8, 10, ignored=0.0)
    target[33] = 10
    losses = linear_cross_entropy(x, weight, target, backend="triton", reduction="none", chunk_rows=16)
    assert torch.isnan(losses[33]) and torch.isfinite(losses[:33]).all() and torch.isfinite(losses[34:]).all()
    with pytest.raises(ValueError, match=r"target\[33\] = 10 is not a class index in \[0, 10\).*found after"):
        wait_for_target_checks()   # (a call without a gradient does not wait for the count either)
    losses = linear_cross_entropy(x, weight, target, backend="triton", reduction="none", check_targets=False)
    assert torch.isnan(losses[33]) and torch.isfinite(losses[:33]).all() and torch.isfinite(losses[34:]).all()
    # With a gradient the forward does not wait for the count: the backward raises, before handing gradients on.
    x.requires_grad_()
    loss = linear_cross_entropy(x, weight, target, backend="triton", chunk_rows=16)
    assert torch.isnan(loss)   # (a read of the loss waits for the GPU: the count is written by now)
    with pytest.raises(ValueError, match=r"linear_cross_entropy: target\[33\] = 10.*found after that call"):
        loss.backward()
    assert x.grad is None


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_compiles_fullgraph_through_the_op(reduction):
    x, weight, target, bias = inputs(24, 16, 30)
    compiled = torch.compile(partial(_call, backend="triton", reduction=reduction, chunk_rows=16), fullgraph=True,
                             backend="aot_eager")
    assert_matches_float64(compiled, partial(_call, reference=True, reduction=reduction), x, weight, bias, target,
                           grad_atol_scale=10)


def test_under_autocast_the_matmuls_take_its_dtype_and_the_loss_is_fp32():
    x, weight, target, bias = inputs(24, 16, 30)
    leaves = [t.clone().requires_grad_() for t in (x, weight, bias)]
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
        loss = linear_cross_entropy(*leaves[:2], target, leaves[2], backend="triton", chunk_rows=16)
        expected = linear_cross_entropy_reference(x, weight, target, bias)
    assert loss.dtype == torch.float32
    loss.backward()
    assert [t.grad.dtype for t in leaves] == [torch.float32] * 3
    exact = linear_cross_entropy_reference(x.double(), weight.double(), target, bias.double())
    assert abs(loss.double() - exact) <= 2 * abs(expected.double() - exact) + 1e-3


def test_under_autocast_weights_in_its_dtype_meet_fp32_activations_as_f_linear_does():
    """FSDP2 with bf16 parameters gives the head a bf16 weight while the norm before it gives fp32 under autocast:
    F.linear takes that, and so must the fused head."""
    x, weight, target, bias = inputs(24, 16, 30)
    weight, bias = weight.bfloat16(), bias.bfloat16()
    with torch.autocast(torch.device(DEVICE).type, dtype=torch.bfloat16):
        loss = linear_cross_entropy(x, weight, target, bias, backend="triton", chunk_rows=16)
        expected = torch.nn.functional.cross_entropy(torch.nn.functional.linear(x, weight, bias), target)
    exact = linear_cross_entropy_reference(x.double(), weight.double(), target, bias.double())
    assert loss.dtype == torch.float32
    assert abs(loss.double() - exact) <= 2 * abs(expected.double() - exact) + 1e-3


X, W, T = torch.randn(4, 8), torch.randn(10, 8), torch.tensor([1, 2, 3, 4])


@pytest.mark.parametrize("call, error, match", [
    (lambda: linear_cross_entropy([1.0], W, T), TypeError, "linear_cross_entropy: x must be a torch.Tensor"),
    (lambda: linear_cross_entropy(X, W[0], T), TypeError, r"weight must be a 2-d torch.Tensor"),
    (lambda: linear_cross_entropy(X, W[:, :7], T), ValueError, r"x's last dimension must be weight's hidden size 7"),
    (lambda: linear_cross_entropy(X, W.double(), T), ValueError, "weight must have x's dtype and device"),
    (lambda: linear_cross_entropy(X, W, T, torch.randn(9)), ValueError, r"bias must be None or a tensor of shape \[10\]"),
    (lambda: linear_cross_entropy(X, W, T.float()), TypeError, "target must hold class indices"),
    (lambda: linear_cross_entropy(X, W, T[:3]), ValueError, r"target must have shape \[4\] for x of shape \[4, 8\]"),
    (lambda: linear_cross_entropy(X, W, T, reduction="avg"), ValueError, "reduction must be one of"),
    (lambda: linear_cross_entropy(X, W, T, label_smoothing=2), ValueError, r"label_smoothing must be a number"),
    (lambda: linear_cross_entropy(X, W, T, ignore_index=1.0), TypeError, "ignore_index must be an int"),
    (lambda: linear_cross_entropy(X, W, T, chunk_rows=0), ValueError, "chunk_rows must be None or a positive int"),
    (lambda: linear_cross_entropy(X.long(), W.long(), T, backend="triton"), TypeError, "takes x of dtype"),
])
def test_bad_input_is_named_before_any_launch(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_chunks_hold_a_bounded_number_of_rows():
    assert lce_module.chunk_rows_for(128256, 2, 8192) == 1024   # 256 MB of bf16 logits
    assert lce_module.chunk_rows_for(50, 4, 37) == 37            # a small input: one chunk
    assert lce_module.chunk_rows_for(10 ** 9, 2, 8192) == 128    # at least CHUNK_ALIGN rows


# --------------------------------------------------------------------------- on a GPU

@pytest.mark.gpu
@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_gpu_language_model_sizes(reduction):
    x, weight, target, _ = inputs(2048, 1024, 32000, bias=False, device="cuda")
    dout = torch.rand(target.shape if reduction == "none" else (), device="cuda") + 0.5
    call = partial(linear_cross_entropy, target=target, reduction=reduction, backend="triton", chunk_rows=512)
    reference = partial(linear_cross_entropy_reference, target=target, reduction=reduction)
    assert_within_twice_torchs_error(["loss", "dx", "dweight"],
                                     outputs_and_grads(call, (x, weight), dout, torch.bfloat16),
                                     outputs_and_grads(reference, (x, weight), dout, torch.float64),
                                     outputs_and_grads(reference, (x, weight), dout, torch.bfloat16), torch.bfloat16)


@pytest.mark.gpu
def test_gpu_memory_is_the_gradients_and_one_chunk():
    x, weight, target, _ = inputs(8192, 2048, 65536, dtype=torch.bfloat16, bias=False, device="cuda")
    x.requires_grad_(), weight.requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    held = torch.cuda.memory_allocated()
    linear_cross_entropy(x, weight, target).backward()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - held
    chunk = lce_module.chunk_rows_for(65536, 2, 8192) * 65536 * 2
    expected = x.numel() * 2 + weight.numel() * 2 + chunk
    assert extra <= expected * 1.05 + (32 << 20), (extra, expected)


@pytest.mark.gpu
def test_gpu_a_cuda_graph_captures_it_with_the_targets_unchecked():
    x, weight, target, _ = inputs(300, 64, 1000, bias=False, device="cuda")
    expected = linear_cross_entropy(x, weight, target)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):   # warm-up outside the capture, as torch.cuda.graph asks
        linear_cross_entropy(x, weight, target)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):   # the check's host sync would end the capture with an error
        loss = linear_cross_entropy(x, weight, target)
    graph.replay()
    torch.testing.assert_close(loss, expected)
