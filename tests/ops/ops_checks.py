"""The check every op test makes: outputs and gradients against the same op in float64 on the same values."""

import contextlib
import math

import pytest
import torch
from hypothesis import strategies as st

from roofline.ops._launch import clear_plans

# The property tests' shapes: 1-3 dimensions of 1-40, at most 1000 elements. Under the interpreter a draw costs in
# proportion to its programs: uncapped (up to 64,000 elements) the norms' sweep took 7.3 minutes of CI's 20.
SHAPES = st.lists(st.integers(1, 40), min_size=1, max_size=3).filter(lambda shape: math.prod(shape) <= 1000)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# rtol, atol against the float64 reference, by the dtype compared (DESIGN.md's tolerances).
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (1e-3, 1e-3), torch.bfloat16: (1.6e-2, 1e-2)}


def poisoned_passes(shape, dtype=torch.float32):
    """One pass per yield, each right after a NaN-filled block of `shape` is freed: the op's outputs then come from
    memory that held NaN, which its kernels must overwrite. Three passes on a GPU, where the caching allocator may
    hand out another of its blocks first; one on a CPU, where malloc hands back the chunk just freed."""
    for _ in range(3 if DEVICE == "cuda" else 1):
        poison = torch.full(shape, math.nan, device=DEVICE, dtype=dtype)
        del poison
        yield


def as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@contextlib.contextmanager
def patched(module, name: str, value):
    """module.name = value inside the block (for tests that are not fixtures, such as hypothesis tests), with
    no launch plan built from the other value on either side of it."""
    saved = getattr(module, name)
    setattr(module, name, value)
    clear_plans()
    try:
        yield
    finally:
        setattr(module, name, saved)
        clear_plans()


def block_size_fixture(module, name: str, values, ids):
    """A fixture that runs each test once per value of the block-size constant module.name: the configured
    one, so rows fit one block, and a small one, so the interpreter's small rows take the looped path."""

    @pytest.fixture(params=values, ids=ids)
    def fixture(request, monkeypatch):
        monkeypatch.setattr(module, name, request.param)
        return request.param

    return fixture


def _grad_leaves(args):
    """args with each floating-point tensor replaced by a fresh leaf copy that requires grad."""
    return [a.detach().clone().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point() else a
            for a in args]


def assert_matches_float64(ours, reference, *args, grad_atol_scale=1.0, out_atol_scale=1.0, or_twice_torchs=False):
    """Run ours(*args) and reference(*args upcast to float64) and compare every output, then, with a random
    cotangent for each output, every gradient of the floating-point tensor arguments.

    The tolerance of each comparison is that of the least precise dtype among the one compared and the
    arguments' (an fp32 weight's gradient computed from bf16 activations is as good as bf16); a gradient's atol is
    multiplied by grad_atol_scale (gradients that sum over a row grow with it). or_twice_torchs: an output or a
    gradient outside that tolerance still passes within twice the error of the reference run in the arguments' own
    dtypes (torch's op), for draws the tolerance cannot know are ill-conditioned (a layer_norm row of 2 elements
    close together: the output and dx divide by their tiny deviation, and torch's fp32 misses the tolerance too).
    Returns our outputs.
    """
    leaves = _grad_leaves(args)
    ref_leaves = [a.detach().double().requires_grad_() if isinstance(a, torch.Tensor) and a.is_floating_point()
                  else a for a in leaves]
    arg_dtypes = [a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]

    def tolerance(dtype):
        return max(TOL[d] for d in [dtype, *arg_dtypes])

    outs, ref_outs = as_tuple(ours(*leaves)), as_tuple(reference(*ref_leaves))
    assert len(outs) == len(ref_outs)
    torch_leaves = _grad_leaves(args) if or_twice_torchs else None
    torch_outs = as_tuple(reference(*torch_leaves)) if or_twice_torchs else None
    for k, (out, ref) in enumerate(zip(outs, ref_outs)):
        assert out.shape == ref.shape and out.device == ref.device, (out.shape, ref.shape)
        rtol, atol = tolerance(out.dtype)
        try:
            torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol * out_atol_scale, equal_nan=True)
        except AssertionError:
            if not or_twice_torchs:
                raise
            assert_within_twice_torchs_error((f"output {k}",), [out.detach()], [ref.detach()],
                                             [torch_outs[k].detach()], out.dtype)
    grads_of = [i for i, a in enumerate(leaves) if isinstance(a, torch.Tensor) and a.requires_grad]
    differentiable = [(o, r) for o, r in zip(outs, ref_outs) if o.requires_grad]
    if not grads_of or not differentiable or not any(o.numel() for o, _ in differentiable):
        return outs if len(outs) > 1 else outs[0]
    cotangents = [torch.randn_like(o) for o, _ in differentiable]
    ours_grads = torch.autograd.grad([o for o, _ in differentiable], [leaves[i] for i in grads_of], cotangents,
                                     allow_unused=True)
    ref_grads = torch.autograd.grad([r for _, r in differentiable], [ref_leaves[i] for i in grads_of],
                                    [c.double() for c in cotangents], allow_unused=True)
    torch_grads = None
    if or_twice_torchs:
        torch_differentiable = [t for t, o in zip(torch_outs, outs) if o.requires_grad]
        torch_grads = torch.autograd.grad(torch_differentiable, [torch_leaves[i] for i in grads_of],
                                          [c.to(t.dtype) for c, t in zip(cotangents, torch_differentiable)],
                                          allow_unused=True)
    for k, (i, g, ref) in enumerate(zip(grads_of, ours_grads, ref_grads)):
        assert (g is None) == (ref is None), f"argument {i}: gradient {'missing' if g is None else 'unexpected'}"
        if g is None:
            continue
        assert g.dtype == leaves[i].dtype and g.shape == leaves[i].shape, f"argument {i}"
        rtol, atol = tolerance(g.dtype)
        try:
            torch.testing.assert_close(g.double(), ref, rtol=rtol, atol=atol * grad_atol_scale, equal_nan=True,
                                       msg=lambda m, i=i: f"gradient of argument {i}: {m}")
        except AssertionError:
            if torch_grads is None:
                raise
            assert_within_twice_torchs_error((f"gradient of argument {i}",), [g], [ref], [torch_grads[k]], g.dtype)
    return outs if len(outs) > 1 else outs[0]



def outputs_and_grads(fn, tensors, dout, dtype=None):
    """fn(*tensors)'s output and each tensor's gradient for the cotangent dout, on copies (in dtype if given);
    a None among tensors stays None, and so does its gradient."""
    leaves = [None if t is None else t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors]
    out = fn(*leaves)
    out.backward(dout.to(out.dtype))
    return [out.detach()] + [None if t is None else t.grad for t in leaves]


def assert_within_twice_torchs_error(names, ours, exact, theirs, dtype, norm: tuple[str, ...] = ()):
    """DESIGN.md's rule for kernels whose rounding differs from torch's by construction (attention, GEMMs): each
    of ours is at most twice as far from the float64 result as torch's own in `dtype`, plus 1e-5. Entries whose
    float64 result is None are skipped. The distance is the largest elementwise error, or for the names in `norm`
    the error's 2-norm: for small results, whose largest error is a few roundings and swings from draw to draw (a
    70-element bias gradient: 2.5% of fresh draws over twice torch's by chance; a 48-element one summed over 60 rows
    in bf16: 1 in 150).

    The largest error also gets two roundings of the largest float64 value to `dtype`, the allowance
    flash-attention's own tests add (`2 * (ref + 0.3 - 0.3 - ref).abs().max()`). A result stored in bf16 is off by
    up to half a unit in its last place, so torch's largest error can be a lucky draw at the top of the range: one
    query's dQ (4,096 values) once measured 0.0121 against torch's 0.00499, where 44 fresh draws here gave both
    0.003-0.005 and ratios of 1.09 at most."""
    for name, o, e, t in zip(names, ours, exact, theirs):
        if e is None:
            continue
        assert o.shape == e.shape and o.dtype == dtype, name
        if name in norm:
            distance, rounding = (lambda d: d.norm()), 0.0
        else:
            distance, rounding = (lambda d: d.abs().max()), 2 * torch.finfo(dtype).eps * e.abs().max().item()
        our_error = distance(o.double() - e).item()
        their_error = distance(t.double() - e).item()
        assert our_error <= 2 * their_error + 1e-5 + rounding, \
            f"{name}: error {our_error:.3g}, torch's in {dtype}: {their_error:.3g}"
