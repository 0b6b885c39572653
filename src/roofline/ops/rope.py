"""Rotary position embedding (RoPE), rotate-half convention: reference, Triton kernel, registration and
autograd, entry point.

    rope(x) = x * cos + rotate_half(x) * sin,      rotate_half([x1, x2]) = [-x2, x1]

over the last dimension (x1, x2 its halves), as LLaMA-style models apply it to queries and keys of shape
(batch, heads, seq, head_dim), with cos and sin in any layout that broadcasts against them: (seq, head_dim),
(batch or 1, seq, head_dim), (batch or 1, 1, seq, head_dim) as model code keeps them, a position or batch of 1
shared by all. The kernel reads one table for all heads; angles that differ by head go to the reference.

Memory-bound: read q and k once, write them rotated once; cos and sin are read once per position and shared
by every head. One program per (batch, position) rotates all of that position's query heads and key heads, so
k may have fewer heads than q (grouped-query attention). q and k may be strided views (the usual
`qkv.view(B, T, H, D).transpose(1, 2)`): the kernel takes their strides and reads them in place. The
backward pass is the same rotation by the negated angle: dx1 = dy1 cos1 + dy2 sin2, dx2 = dy2 cos2 - dy1 sin1.
"""

from __future__ import annotations

import torch

from roofline.ops._common import DTYPES, choose_backend, next_power_of_2, tl, triton
from roofline.ops._eager_node import replayed_entry
from roofline.ops._launch import Launch, plan_cache, tensor_key
from roofline.ops._runtime import KernelOp, torch_route

BACKENDS = ("torch", "triton", "compile")


# --------------------------------------------------------------------------- reference

def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_reference(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """The rotation in eager PyTorch, cos and sin broadcast over the heads."""
    cos, sin = _over_heads(cos), _over_heads(sin)
    return (q * cos + rotate_half(q) * sin).to(q.dtype), (k * cos + rotate_half(k) * sin).to(k.dtype)


def _over_heads(t: torch.Tensor) -> torch.Tensor:
    """cos or sin as broadcast against (batch, heads, seq, head_dim): a (batch, seq, head_dim) table gains the
    heads' dimension, which every other layout has or broadcasts to as it is."""
    return t.unsqueeze(1) if t.dim() == 3 else t


def _broadcast_shape(t: torch.Tensor) -> tuple[int, ...]:
    """(batch, heads, seq, head_dim) of cos or sin as broadcast against q: fewer dimensions padded on the left."""
    t = _over_heads(t)
    return (1,) * (4 - t.dim()) + tuple(t.shape)


def _by_position(t: torch.Tensor, batch: int, seq: int, dim: int) -> torch.Tensor | None:
    """cos or sin as a (batch, seq, head_dim) view, stride 0 along what it is shared by; None where its angles
    differ by head (the kernel reads one table for every head)."""
    if t.dim() == 4:
        if t.shape[1] != 1:
            return None
        t = t[:, 0]
    return t.expand(batch, seq, dim)


# --------------------------------------------------------------------------- Triton kernel

if triton is not None:

    @triton.jit
    def _rotate_heads(x_ptr, out_ptr, b, t, H, stride_b, stride_h, stride_t, out_b, out_h, out_t,
                      c1, c2, s1, s2, cols, dmask, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
        """Rotate every head of x at (b, t) into out (both strided; unit last strides)."""
        heads = tl.arange(0, BLOCK_H)[:, None]
        mask = (heads < H) & dmask
        src = x_ptr + b * stride_b + t * stride_t + heads * stride_h + cols
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
        dst = out_ptr + b * out_b + t * out_t + heads * out_h + cols
        tl.store(dst, (x1 * c1 - x2 * s1).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(dst + HALF, (x2 * c2 + x1 * s2).to(out_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def rope_kernel(q_ptr, k_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, T, HQ, HK,
                    q_sb, q_sh, q_st, k_sb, k_sh, k_st, qo_sb, qo_sh, qo_st, ko_sb, ko_sh, ko_st,
                    c_sb, c_st, s_sb, s_st,
                    HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
                    BACKWARD: tl.constexpr):
        pid = tl.program_id(0)
        b = (pid // T).to(tl.int64)
        t = (pid % T).to(tl.int64)
        cols = tl.arange(0, BLOCK_D)[None, :]
        dmask = cols < HALF
        c_row = cos_ptr + b * c_sb + t * c_st + cols
        s_row = sin_ptr + b * s_sb + t * s_st + cols
        c1 = tl.load(c_row, mask=dmask, other=0.0).to(tl.float32)
        c2 = tl.load(c_row + HALF, mask=dmask, other=0.0).to(tl.float32)
        s1 = tl.load(s_row, mask=dmask, other=0.0).to(tl.float32)
        s2 = tl.load(s_row + HALF, mask=dmask, other=0.0).to(tl.float32)
        if BACKWARD:   # the transpose of the rotation: swap the sines' halves and negate them
            s1, s2 = -s2, -s1
        _rotate_heads(q_ptr, qo_ptr, b, t, HQ, q_sb, q_sh, q_st, qo_sb, qo_sh, qo_st, c1, c2, s1, s2, cols, dmask,
                      HALF, BLOCK_HQ)
        _rotate_heads(k_ptr, ko_ptr, b, t, HK, k_sb, k_sh, k_st, ko_sb, ko_sh, ko_st, c1, c2, s1, s2, cols, dmask,
                      HALF, BLOCK_HK)


def _contiguous_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def _dimension_order(strides) -> list[int]:
    """A tensor's dimensions from outermost to innermost in memory (stride descending, ties in logical order):
    the order in which torch's elementwise ops lay out their results, so that a rotated q has the layout that
    q * cos + rotate_half(q) * sin would have."""
    return sorted(range(len(strides)), key=lambda d: -strides[d])


def _dense_strides(shape, order) -> tuple[int, ...]:
    """The strides of a dense tensor of `shape` whose dimensions lie in memory in `order` (outermost first)."""
    strides, step = [0] * len(shape), 1
    for d in reversed(order):
        strides[d] = step
        step *= shape[d]
    return tuple(strides)


def _output_like(t: torch.Tensor) -> torch.Tensor:
    """An empty tensor with t's shape and dtype, dense, with t's dimension order."""
    return torch.empty_permuted(t.shape, _dimension_order(t.stride()), dtype=t.dtype, device=t.device)


def _angle_strides(t: torch.Tensor, q: torch.Tensor) -> tuple[int, int]:
    """(batch, position) strides of cos or sin in any layout that broadcasts against q with one table for every
    head: 0 along a batch or position they are shared by."""
    view = _by_position(t, q.shape[0], q.shape[2], q.shape[3])
    return view.stride(0), view.stride(1)


class RopePlan:
    """The launches for q and k of given shapes and strides (unit last strides), cos and sin of given strides,
    on one device. The forward's outputs are dense in q's and k's dimension order (the layout torch's expression
    gives them, which is the layout attention kernels downstream are tuned for); the backward takes the
    gradients contiguous (made so if need be) and gives them contiguous."""

    def __init__(self, q_shape, q_strides, k_shape, k_strides, angle_strides, device: torch.device):
        B, HQ, T, D = q_shape
        HK = k_shape[1]
        self.q_order, self.k_order = _dimension_order(q_strides), _dimension_order(k_strides)
        q_out, k_out = _dense_strides(q_shape, self.q_order), _dense_strides(k_shape, self.k_order)
        q_dense, k_dense = _contiguous_strides(q_shape), _contiguous_strides(k_shape)
        self.forward_args = (T, HQ, HK, *q_strides[:3], *k_strides[:3], *q_out[:3], *k_out[:3], *angle_strides)
        self.backward_args = (T, HQ, HK, *q_dense[:3], *k_dense[:3], *q_dense[:3], *k_dense[:3], *angle_strides)
        half = D // 2
        settings = dict(HALF=half, BLOCK_D=next_power_of_2(half), BLOCK_HQ=next_power_of_2(HQ),
                        BLOCK_HK=next_power_of_2(HK), num_warps=4)
        index = device.index if device.type == "cuda" else -1
        self.forward_launch = Launch(rope_kernel, (B * T,), index, BACKWARD=False, **settings)
        self.backward_launch = Launch(rope_kernel, (B * T,), index, BACKWARD=True, **settings)

    @staticmethod
    def _rotate(launch: Launch, q, k, cos, sin, q_out, k_out, args):
        launch.for_pointers(q.data_ptr() | k.data_ptr() | cos.data_ptr() | sin.data_ptr())(
            q, k, cos, sin, q_out, k_out, *args)
        return q_out, k_out

    def forward(self, q, k, cos, sin):
        q_out = torch.empty_permuted(q.shape, self.q_order, dtype=q.dtype, device=q.device)
        k_out = torch.empty_permuted(k.shape, self.k_order, dtype=k.dtype, device=k.device)
        return self._rotate(self.forward_launch, q, k, cos, sin, q_out, k_out, self.forward_args)

    def backward(self, dq, dk, cos, sin):
        dq, dk = (t if t.is_contiguous() else t.contiguous() for t in (dq, dk))
        return self._rotate(self.backward_launch, dq, dk, cos, sin, torch.empty_like(dq), torch.empty_like(dk),
                            self.backward_args)


def _angles(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[int, ...]:
    return (*_angle_strides(cos, q), *_angle_strides(sin, q))


@plan_cache("rope", key=lambda q, k, cos, sin: (q.shape, q.stride(), k.shape, k.stride(), _angles(q, cos, sin),
                                                q.dtype, cos.dtype, sin.dtype, q.device))
def _plan(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> RopePlan:
    """The plan for q, k, cos and sin with unit last strides."""
    return RopePlan(q.shape, q.stride(), k.shape, k.stride(), _angles(q, cos, sin), q.device)


def _unit_last_stride(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _forward(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor,
                                                                                            torch.Tensor]:
    q, k, cos, sin = (_unit_last_stride(t) for t in (q, k, cos, sin))
    return _plan(q, k, cos, sin).forward(q, k, cos, sin)


def _backward(dq: torch.Tensor, dk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor,
                                                                                               torch.Tensor]:
    cos, sin = _unit_last_stride(cos), _unit_last_stride(sin)
    return _plan(dq, dk, cos, sin).backward(dq, dk, cos, sin)


def _save_angles(ctx, inputs, output):
    ctx.save_for_backward(inputs[2], inputs[3])
    ctx.shapes = inputs[0].shape, inputs[1].shape


def _backward_rule(ctx, run_backward, dq, dk):
    cos, sin = ctx.saved_tensors
    q_shape, k_shape = ctx.shapes
    # An output that reached no loss gets None: rotate zeros for it, so one launch serves both.
    dq = dq if dq is not None else cos.new_zeros(q_shape, dtype=dk.dtype)
    dk = dk if dk is not None else cos.new_zeros(k_shape, dtype=dq.dtype)
    dq_in, dk_in = run_backward(dq, dk, cos, sin)
    return dq_in, dk_in, None, None


_rope = KernelOp("rope", forward=_forward,
                 forward_fake=lambda q, k, cos, sin: (_output_like(_unit_last_stride(q)),
                                                      _output_like(_unit_last_stride(k))),
                 backward=_backward,
                 backward_fake=lambda dq, dk, cos, sin: (torch.empty(dq.shape, dtype=dq.dtype, device=dq.device),
                                                         torch.empty(dk.shape, dtype=dk.dtype, device=dk.device)),
                 setup_context=_save_angles, backward_rule=_backward_rule, plan=_plan,
                 signature=lambda q, k, cos, sin, backend: (type(q), tensor_key(q), tensor_key(k), tensor_key(cos),
                                                            cos.requires_grad, tensor_key(sin), sin.requires_grad,
                                                            backend))


# --------------------------------------------------------------------------- entry point

def _check(q, k, cos, sin) -> None:
    for name, t in (("k", k), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"rope: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(f"rope: q and k must be (batch, heads, seq, head_dim), got q {list(q.shape)} and "
                         f"k {list(k.shape)}")
    B, _, T, D = q.shape
    if (k.shape[0], k.shape[2], k.shape[3]) != (B, T, D):
        raise ValueError(f"rope: k must match q in batch, seq and head_dim (it may have fewer heads): q is "
                         f"{list(q.shape)}, k {list(k.shape)}")
    if D % 2:
        raise ValueError(f"rope: head_dim must be even (the rotation pairs its halves), got {D}")
    if k.dtype != q.dtype or k.device != q.device:
        raise ValueError(f"rope: k must match q in dtype and device: q is {q.dtype} on {q.device}, "
                         f"k {k.dtype} on {k.device}")
    heads = {q.shape[1], k.shape[1]}
    for name, t in (("cos", cos), ("sin", sin)):
        b, h, t_, d = _broadcast_shape(t) if t.dim() <= 4 else (0,) * 4
        if not (b in (1, B) and t_ in (1, T) and d == D and (h == 1 or heads == {h})):
            raise ValueError(f"rope: {name} must broadcast against q {list(q.shape)} and k {list(k.shape)} with "
                             f"head_dim {D}: (seq, head_dim), (batch or 1, seq, head_dim) or (batch or 1, 1, seq, "
                             f"head_dim), got {list(t.shape)}")
        if t.device != q.device:
            raise ValueError(f"rope: {name} is on {t.device} but q is on {q.device}")
        if t.dtype not in DTYPES:
            raise TypeError(f"rope: {name} must be float32, float16 or bfloat16, got {t.dtype}")
        if t.requires_grad and torch.is_grad_enabled():
            raise ValueError(f"rope: no gradient flows to {name}; pass it detached (it is a fixed table of angles)")


@replayed_entry
def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *,
         backend: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(q, k) rotated by the angles whose cosines and sines are `cos` and `sin` (rotate-half convention).

    q: (batch, heads, seq, head_dim); k: the same but possibly fewer heads; both may be strided views.
    cos, sin: any layout that broadcasts against q and k: (seq, head_dim), (batch or 1, seq, head_dim),
        (batch or 1, 1, seq, head_dim); any float dtype; no gradient. Angles that differ by head (a heads
        dimension over 1) are computed by the reference.
    backend: "triton" (the default on CUDA), "torch" (rope_reference; the default on CPU), "compile".
    Returns tensors with q's and k's shapes and dtype, laid out as the torch expression lays them out (dense, in
    q's and k's dimension order: a transposed view gives a transposed result, as q * cos would); fp32 math.
    """
    key, plan = _rope.seen(q, k, cos, sin, backend)
    if plan is not None:
        return _rope.eager(plan, torch.is_grad_enabled() and (q.requires_grad or k.requires_grad), q, k, cos, sin)
    backend = choose_backend("rope", q, backend, BACKENDS, arg="q")
    _check(q, k, cos, sin)
    # angles that differ by head are the reference's to compute
    done = torch_route(backend, rope_reference, q, k, cos, sin, nothing_to_launch=q.numel() == 0 or k.numel() == 0
                       or any(t.dim() == 4 and t.shape[1] != 1 for t in (cos, sin)))
    if done is not None:
        return done
    given = (q, k, cos, sin)
    q, k, cos, sin = (_unit_last_stride(t) for t in given)
    # kept only where cos and sin need no gradient: then the checks pass whatever the grad mode
    keep = all(a is b for a, b in zip(given, (q, k, cos, sin))) and not (cos.requires_grad or sin.requires_grad)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad)
    return _rope.call(key, keep, grad, q, k, cos, sin)
