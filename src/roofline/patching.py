"""roofline.patch(model) (this module is roofline.patching, so the name roofline.patch stays the function): send a
model's norms, GELUs, SwiGLU gates, rotary embeddings, attention and cross-entropy loss to roofline's kernels where,
and only where, they are faster on this device (roofline.quantization swaps a model's weights to int8).

How calls are caught, in place (parameters, buffers, hooks and state-dict keys stay exactly as they were, so
optimizers, checkpoints and FSDP wrappers see no difference):
  - modules by class: nn.LayerNorm, nn.RMSNorm and nn.GELU whose type is exactly torch's (a user's subclass may
    have changed forward) get a subclass whose forward asks the model's Router;
  - hand-written norms and activations by name and behaviour: a class named *RMSNorm* with one weight (Hugging
    Face's Llama, Qwen, Mistral; gpt-fast) whose forward is checked on a random input to be the usual
    weight * normalized(x in fp32).to(x.dtype), and a class named *GELU* without parameters (Hugging Face's
    NewGELUActivation) checked to compute F.gelu, exact or tanh;
  - SwiGLU MLPs by structure: a module whose children gate_proj, up_proj, down_proj (Hugging Face, torchtitan) or
    w1, w3, w2 (gpt-fast, Meta's Llama) are nn.Linear layers, once its forward is checked on a random input to be
    down(silu(gate(x)) * up(x));
  - functions while the model's forward runs: torch.nn.functional.scaled_dot_product_attention and
    cross_entropy (the loss of a model that computes it in its forward, as nanoGPT's and Hugging Face's do,
    nn.CrossEntropyLoss included), and apply_rotary_pos_emb (Hugging Face's name and signature for rotate-half
    RoPE) in the Python modules that define the model's classes, once it is checked on a random input to be
    rotate-half RoPE. A name bound before the forward (from torch.nn.functional import cross_entropy) still calls
    torch's.

Every caught call goes through a route (roofline.routing.Route) to the model's Router, which serves it with
roofline's kernel only where that was measured faster for the call's signature (and checked against torch on a
random input), leaves it to torch otherwise, and counts who served what and why: print(patch(model)) after a
forward, or router(model).report(). A route whose first calls torch served, every one, settles: the module gets
its own forward back, the function its original, and later calls cost what they cost unpatched.
"""

from __future__ import annotations

import dataclasses
import sys
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from roofline import ops
from roofline.ops._common import DTYPES, interpreting
from roofline.ops.attention import HEAD_DIMS
from roofline.ops.rope import rope_reference
from roofline.program_check import ProgramCheck
from roofline.routing import IN_PROGRAM_US, SETTLE_CALLS, Route, Router

TORCH_SDPA = F.scaled_dot_product_attention
TORCH_CROSS_ENTROPY = F.cross_entropy
ROUTED_DTYPES = (torch.float16, torch.bfloat16)
MLP_NAMES = (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
ROPE_FUNCTION = "apply_rotary_pos_emb"
# gpt-fast's, torchtitan's and Meta's Llama's name for RoPE on complex numbers (pairs interleaved): not served
UNSERVED_ROPE_FUNCTIONS = ("apply_rotary_emb",)
UNSERVED_ROPE_WHY = "RoPE on interleaved pairs (complex form): roofline's rope serves the rotate-half convention"


# --------------------------------------------------------------------------- what roofline can serve

def why_not_kernel(x, *rest, **options) -> str | None:
    """Why roofline's kernel cannot take x (None if it can): it runs on CUDA tensors of fp32, fp16 and bf16 (and
    on the CPU through Triton's interpreter, which is how the tests run it)."""
    if not isinstance(x, torch.Tensor):
        return "the input is not a tensor"
    if not (x.is_cuda or interpreting()):
        return "not on a CUDA device"
    if x.dtype not in DTYPES:
        return f"dtype {x.dtype} (served: float32, float16, bfloat16)"
    return None


def why_not_swiglu(gate, up) -> str | None:
    if gate.shape != up.shape or gate.dtype != up.dtype:
        return "gate and up differ in shape or dtype"
    return why_not_kernel(gate)


def why_not_rope(q, k, cos, sin, *rest, **options) -> str | None:
    """Why ops.rope cannot give what apply_rotary_pos_emb(q, k, cos, sin) gives, or None if it can."""
    if rest or any(options.get(name, default) != default for name, default in
                   (("unsqueeze_dim", 1), ("position_ids", None))) or set(options) - {"unsqueeze_dim", "position_ids"}:
        return "arguments beyond (q, k, cos, sin)"
    if not all(isinstance(t, torch.Tensor) for t in (q, k, cos, sin)):
        return "an argument is not a tensor"
    if q.dim() != 4 or k.dim() != 4 or cos.dim() != 3 or sin.dim() != 3:
        return "not q, k (batch, heads, seq, head_dim) with cos, sin (batch or 1, seq, head_dim)"
    if q.dtype != k.dtype or cos.dtype != sin.dtype:
        return f"q in {q.dtype} and k in {k.dtype}, or cos in {cos.dtype} and sin in {sin.dtype}"
    return why_not_kernel(q) or why_not_kernel(cos)


def why_not_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False) -> str | None:
    """Why flash_attention cannot give what F.scaled_dot_product_attention(same arguments) gives, or None if it
    can (under autocast: with the arguments in the dtype autocast runs it in)."""
    tensors = _as_autocast_runs(query, key, value)
    query, key, value = tensors
    if not all(isinstance(t, torch.Tensor) for t in tensors):
        return "an input is not a tensor"
    if not all(t.is_cuda for t in tensors) and not interpreting():
        return "not on a CUDA device"
    if attn_mask is not None:
        return "attn_mask"
    if dropout_p != 0.0:
        return "dropout"
    if any(t.dim() != 4 for t in tensors):
        return "not 4-D (batch, heads, seq, head_dim)"
    if query.dtype not in ROUTED_DTYPES or key.dtype != query.dtype or value.dtype != query.dtype:
        return f"dtype {query.dtype} (routed: float16, bfloat16)"
    if query.shape[-1] not in HEAD_DIMS or key.shape[-1] != query.shape[-1] or value.shape != key.shape:
        return f"head_dim {query.shape[-1]} or k/v shapes (routed: head_dim in {HEAD_DIMS}, k and v alike)"
    if key.shape[0] != query.shape[0]:
        return "batch sizes differ"
    if key.shape[1] != query.shape[1] and not (enable_gqa and query.shape[1] % key.shape[1] == 0):
        return "key heads differ from query heads without enable_gqa"
    if is_causal and query.shape[2] != key.shape[2]:
        # SDPA aligns the causal mask top-left, flash_attention bottom-right: they agree only when Nq == Nk
        return "causal with query and key lengths that differ"
    return None


def why_not_cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                          reduction="mean", label_smoothing=0.0) -> str | None:
    """Why ops.cross_entropy cannot give what F.cross_entropy(same arguments) gives, or None if it can."""
    if weight is not None:
        return "class weights"
    if size_average is not None or reduce is not None:
        return "the deprecated size_average or reduce"
    if not isinstance(input, torch.Tensor) or input.dim() != 2 or input.numel() == 0:
        return "logits that are not a non-empty (N, C) tensor"
    if not isinstance(target, torch.Tensor) or target.dtype != torch.int64 or target.shape != input.shape[:1] \
            or target.device != input.device:
        return "targets that are not (N,) int64 class indices on the logits' device"
    if reduction not in ("mean", "sum", "none") or isinstance(ignore_index, bool) or not isinstance(ignore_index, int):
        return "a reduction or ignore_index that torch itself refuses"
    if isinstance(label_smoothing, bool) or not isinstance(label_smoothing, (int, float)) \
            or not 0.0 <= label_smoothing <= 1.0:
        return "a label_smoothing that torch itself refuses"
    return why_not_kernel(input)


# --------------------------------------------------------------------------- roofline's side of each call

def _layer_norm(x, normalized_shape, weight, bias, eps):
    return ops.layer_norm(x, normalized_shape, weight, bias, eps, backend="triton")


def _rms_norm(x, normalized_shape, weight, eps):
    return ops.rms_norm(x, normalized_shape, weight, eps, backend="triton")


def _gelu(x, approximate):
    return ops.gelu(x, approximate, backend="triton")


def _torch_gelu(x, approximate):
    return F.gelu(x, approximate=approximate)


def _swiglu(gate, up):
    return ops.swiglu(gate, up, backend="triton")


def _rms_norm_rounded_first(x, normalized_shape, weight, eps):
    """RMSNorm as Hugging Face's Llama, Qwen and Mistral, gpt-fast and Meta's Llama write it by hand: normalized in
    fp32, rounded to x's dtype, then scaled by the weight (so the result takes the promoted dtype)."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _rms_norm_as_written(x, normalized_shape, weight, eps):
    return ops.rms_norm(x, normalized_shape, weight, eps, backend="triton").to(torch.promote_types(x.dtype,
                                                                                                  weight.dtype))


def _silu_times(gate, up):
    return F.silu(gate) * up


def _rope(q, k, cos, sin, *rest, **options):
    """What q * cos + rotate_half(q) * sin gives: in the promoted dtype, as torch computes it. Under autocast,
    Llama's q and k come from the projections in bf16 and its cos and sin in fp32, and torch's result is fp32:
    q and k are made fp32 first (the kernel then computes what torch computes, and writes fp32)."""
    wider = torch.promote_types(q.dtype, cos.dtype)
    if q.dtype != wider:
        q, k = q.to(wider), k.to(wider)
    return ops.rope(q, k, cos, sin, backend="triton")


def _cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None, reduction="mean",
                   label_smoothing=0.0):
    # Targets checked as the op checks them: without waiting for the GPU (roofline.ops._target_check). torch's CUDA kernel stops the process with a device-side assert instead.
    return ops.cross_entropy(input, target, ignore_index, reduction, label_smoothing, backend="triton")


def _flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    query, key, value = _as_autocast_runs(query, key, value)
    return ops.flash_attention(query, key, value, bool(is_causal), scale, backend="triton")


def _as_autocast_runs(*tensors):
    """The tensors as autocast hands them to an op it runs in lower precision (scaled_dot_product_attention is
    one): floating-point tensors cast to autocast's dtype where autocast is on for their device, else as given.
    roofline's ops are not autocast's, so a route casts as torch's op would have been cast."""
    first = tensors[0]
    if not isinstance(first, torch.Tensor) or not torch.is_autocast_enabled(first.device.type):
        return tensors
    dtype = torch.get_autocast_dtype(first.device.type)
    return tuple(t.to(dtype) if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in tensors)


# --------------------------------------------------------------------------- the swapped modules' forwards

def _layer_norm_forward(self, x):
    return self._roofline_route(x, self.normalized_shape, self.weight, self.bias, self.eps)


def _rms_norm_forward(self, x):
    return self._roofline_route(x, self.normalized_shape, self.weight, self.eps)


def _gelu_forward(self, x):
    return self._roofline_route(x, self.approximate)


def _handwritten_gelu_forward(self, x):
    return self._roofline_route(x, self._roofline_approximate)


def _handwritten_rms_norm_forward(self, x):
    return self._roofline_route(x, self.weight.shape, self.weight, self._roofline_eps)


def _swiglu_forward(self, x):
    gate, up, down = (getattr(self, name) for name in self._roofline_mlp)
    return down(self._roofline_route(gate(x), up(x)))


@dataclasses.dataclass(frozen=True)
class Swap:
    """How a module is routed: op, the forward swapped in (which calls self._roofline_route), and the route's
    why_not, ours and theirs (see Router.call). restore: once the route settles (torch served every call),
    the module gets its own forward back; not where theirs is faster than the module's own forward (a
    hand-written GELU formula of several kernels, whose torch side is F.gelu's one)."""
    op: str
    forward: object
    why_not: object
    ours: object
    theirs: object
    restore: bool = True


MODULE_SWAPS = {nn.LayerNorm: Swap("layer_norm", _layer_norm_forward, why_not_kernel, _layer_norm, F.layer_norm),
                nn.RMSNorm: Swap("rms_norm", _rms_norm_forward, why_not_kernel, _rms_norm, F.rms_norm),
                nn.GELU: Swap("gelu", _gelu_forward, why_not_kernel, _gelu, _torch_gelu)}
HANDWRITTEN_GELU = Swap("gelu", _handwritten_gelu_forward, why_not_kernel, _gelu, _torch_gelu, restore=False)
HANDWRITTEN_RMS_NORM = Swap("rms_norm", _handwritten_rms_norm_forward, why_not_kernel, _rms_norm_as_written,
                            _rms_norm_rounded_first)
SWIGLU_MLP = Swap("swiglu", _swiglu_forward, why_not_swiglu, _swiglu, _silu_times)
_SUBCLASSES: dict[tuple, type] = {}


def _swap_forward(name: str, module: nn.Module, swap: Swap, router: Router, report: "PatchReport",
                  **attributes) -> None:
    """Change module's class to a subclass of its own whose forward is swap.forward (one subclass per class and
    forward, named as the class), with a route of its own through the router."""
    cls = type(module)
    key = (cls, swap.forward, tuple(attributes.items()))
    if key not in _SUBCLASSES:
        _SUBCLASSES[key] = type(cls.__name__, (cls,), {"forward": swap.forward, "__module__": cls.__module__,
                                                       "__qualname__": cls.__qualname__, **attributes})
    module.__class__ = _SUBCLASSES[key]
    module._roofline_router = router
    module._roofline_route = Route(router, swap.op, swap.why_not, swap.ours, swap.theirs, name or "(model)",
                                   _restorer(module, cls) if swap.restore else None)
    report.swapped.append((name, swap.op))
    report.routes.append(module._roofline_route)


def _restorer(module: nn.Module, cls: type):
    """A function that gives module its class, and so its own forward, back (a weak reference: the route it is
    given to belongs to the module)."""
    ref = weakref.ref(module)

    def restore():
        target = ref()
        if target is not None:
            target.__class__ = cls
    return restore


# --------------------------------------------------------------------------- checks before a swap

def _close(got, want, tolerance: float) -> bool:
    got, want = (t if isinstance(t, tuple) else (t,) for t in (got, want))
    return len(got) == len(want) and all(
        a.shape == b.shape and ((a.double() - b.double()).norm() <= tolerance * b.double().norm()).item()
        for a, b in zip(got, want))


def _why_forward_is_not(module: nn.Module, weight: torch.Tensor, expected, tolerance: float,
                        description: str) -> str | None:
    """None if module.forward(x) is expected(x) (its dtype, and its value within tolerance) for a random x of
    [2, 3, the weight's input width] in the weight's dtype and device; else why not."""
    if weight.device.type == "meta":
        return "parameters on the meta device: its forward cannot be checked"
    x = torch.randn(2, 3, weight.shape[-1], dtype=weight.dtype, device=weight.device)
    with torch.no_grad():
        try:
            got = module.forward(x)
        except Exception as exc:  # noqa: BLE001 - a forward that needs more than x is not one we can serve
            return f"forward(x) raised {type(exc).__name__}"
        want = expected(x)
    if not isinstance(got, torch.Tensor) or got.dtype != want.dtype or not _close(got, want, tolerance):
        return f"its forward is not {description}"
    return None


def _why_not_swiglu_mlp(module: nn.Module, names) -> str | None:
    """None if module's forward is down(silu(gate(x)) * up(x)) on a random input; else why not."""
    gate, up, down = (getattr(module, name) for name in names)
    return _why_forward_is_not(module, gate.weight, lambda x: down(F.silu(gate(x)) * up(x)),
                               1e-5 if gate.weight.dtype == torch.float32 else 2e-2,
                               f"{names[2]}(silu({names[0]}(x)) * {names[1]}(x))")


def _handwritten_rms_norm_eps(module: nn.Module) -> float | None:
    """The epsilon of a module that looks like a hand-written RMSNorm (a class named so, one 1-D weight and no
    children, its epsilon as variance_epsilon or eps), or None."""
    weight = getattr(module, "weight", None)
    if "rmsnorm" not in type(module).__name__.lower() or not isinstance(weight, nn.Parameter) or weight.dim() != 1 \
            or next(module.children(), None) is not None:
        return None
    eps = next((getattr(module, n) for n in ("variance_epsilon", "eps") if isinstance(getattr(module, n, None), float)),
               None)
    return eps


def _why_not_handwritten_rms_norm(module: nn.Module, eps: float) -> str | None:
    """None if module's forward is _rms_norm_rounded_first on a random input; else why not."""
    weight = module.weight
    return _why_forward_is_not(module, weight, lambda x: _rms_norm_rounded_first(x, weight.shape, weight, eps),
                               1e-6, "weight * rms_normalized(x in fp32).to(x.dtype)")


def _handwritten_gelu_approximation(module: nn.Module) -> str | None:
    """For a module that looks like a hand-written GELU (a class named so, with no parameters or children, as
    Hugging Face's NewGELUActivation and GELUTanh), the F.gelu approximation its forward computes on a random
    input ("tanh" or "none"), or None if neither."""
    if "gelu" not in type(module).__name__.lower() or next(module.parameters(), None) is not None \
            or next(module.children(), None) is not None:
        return None
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3
    try:
        with torch.no_grad():
            got = module.forward(x)
    except Exception:  # noqa: BLE001 - a forward that needs more than x is not an activation we can serve
        return None
    for approximate in ("tanh", "none"):
        if isinstance(got, torch.Tensor) and _close(got, F.gelu(x, approximate=approximate), 1e-6):
            return approximate
    return None


def _why_not_rope_function(fn) -> str | None:
    """None if fn(q, k, cos, sin) is rotate-half RoPE on a random input; else why not."""
    generator = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 5, 8, generator=generator), torch.randn(1, 2, 5, 8, generator=generator)
    cos, sin = torch.randn(1, 5, 8, generator=generator), torch.randn(1, 5, 8, generator=generator)
    try:
        got = fn(q, k, cos, sin)
    except Exception as exc:  # noqa: BLE001 - a different signature: not a function we can serve
        return f"{ROPE_FUNCTION}(q, k, cos, sin) raised {type(exc).__name__}"
    if not isinstance(got, tuple) or not _close(got, rope_reference(q, k, cos, sin), 1e-5):
        return f"{ROPE_FUNCTION} is not rotate-half RoPE"
    return None


# --------------------------------------------------------------------------- functions routed during a forward

class FunctionRoutes:
    """The module-level functions a patched model's forward calls through its router: each (namespace, name) is
    set to its route before the forward and put back after it (an exception included; nested forwards too).
    A route that settled (torch served every call) is dropped once the outermost forward is over."""

    def __init__(self):
        self.routes: list[tuple[object, str, Route, object]] = []   # namespace, name, route, function set there
        self._saved: list[list] = []

    def add(self, namespace, name: str, route: Route) -> None:
        def routed(*args, **kwargs):
            return route(*args, **kwargs)
        routed.__name__ = routed.__qualname__ = getattr(route.theirs, "__name__", name)
        self.routes.append((namespace, name, route, routed))

    def enter(self, module, args):
        if torch.compiler.is_compiling():   # the hooks are traced too: Inductor gets the model's own calls
            return
        self._saved.append([getattr(namespace, name) for namespace, name, _, _ in self.routes])
        for namespace, name, _, routed in self.routes:
            setattr(namespace, name, routed)

    def exit(self, module, args, output):
        if torch.compiler.is_compiling():
            return
        for (namespace, name, _, _), original in zip(self.routes, self._saved.pop()):
            setattr(namespace, name, original)
        if not self._saved:
            self.routes = [entry for entry in self.routes if not entry[2].settled]


# --------------------------------------------------------------------------- patch

@dataclasses.dataclass
class PatchReport:
    """What patch(model) swapped (qualified name, what), what it looked at and left (qualified name, why), the
    routes it made (one per swapped module or function; a route whose calls torch served throughout settles, and
    is taken out), and the model's router, whose report() says who served each call signature since, and why."""
    swapped: list[tuple[str, str]]
    left: list[tuple[str, str]]
    router: Router
    routes: list[Route] = dataclasses.field(default_factory=list)
    check: ProgramCheck | None = None   # the A/B of each op's routes in the running program, and its verdicts

    def settled(self) -> list[str]:
        """The routes taken out: torch served each of their first calls (routing.SETTLE_CALLS)."""
        return [route.name for route in self.routes if route.settled]

    def __str__(self) -> str:
        lines = [f"swapped {len(self.swapped)}: " + ", ".join(f"{name or '(model)'} {what}"
                                                             for name, what in self.swapped)]
        lines += [f"left {name or '(model)'}: {why}" for name, why in self.left]
        for row in self.router.report():
            times = "" if row["ours_us"] is None else f" ({row['ours_us']:.1f} vs torch {row['torch_us']:.1f} us)"
            signature = f" {row['signature']}" if row["signature"] else ""
            lines.append(f"{row['op']}{signature}: {row['calls']} calls to {row['served_by']}, "
                         f"{row['why']}{times}")
        if self.check is not None:
            lines += [str(verdict) for verdict in self.check.verdicts.values()]
        settled = self.settled()
        if settled:
            lines.append(f"settled, torch served their first {SETTLE_CALLS} calls and every later one goes "
                         f"straight to it: {', '.join(settled)}")
        return "\n".join(lines)


def patch(model: nn.Module, *, layer_norm: bool = True, rms_norm: bool = True, gelu: bool = True,
          swiglu: bool = True, rope: bool = True, attention: bool = True, cross_entropy: bool = True,
          policy: str = "faster", in_program: bool = True) -> PatchReport:
    """Route model's norms, GELUs, SwiGLU gates, rotary embeddings, attention and cross-entropy losses (those
    asked for) through a Router that serves each call signature with roofline's kernel only where it measured
    faster on this device (policy="faster"), or wherever roofline can serve it (policy="always"). In place; see
    the module's docstring for what is caught and how.

    in_program (policy "faster"): each op roofline serves is then judged by the program itself, an A/B of the
    model's own forwards with its routes on and off (roofline.program_check); an op that does not make the program
    faster goes back to torch, and the report says so with the figures. A call is then routed wherever it wins in
    the loop; with in_program=False, only where it wins by routing.IN_PROGRAM_US, the loop's measured blind spot.

    Returns a PatchReport: what was swapped and what was left, with why. Calling it again swaps nothing more
    (the model keeps its router and policy).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"patch: model must be a torch.nn.Module, got {type(model).__name__}")
    existing = router(model)
    judged = in_program and policy == "faster"
    routes_router = existing or Router(policy, charge_us=0.0 if judged else IN_PROGRAM_US)
    wanted = {"layer_norm": layer_norm, "rms_norm": rms_norm, "gelu": gelu}
    report = PatchReport([], [], routes_router)
    for name, module in model.named_modules():
        if hasattr(module, "_roofline_router"):
            continue
        swap = MODULE_SWAPS.get(type(module))
        if swap is not None and wanted[swap.op]:
            _swap_forward(name, module, swap, routes_router, report)
        elif gelu and type(module) is not nn.GELU and (approximate := _handwritten_gelu_approximation(module)):
            _swap_forward(name, module, HANDWRITTEN_GELU, routes_router, report, _roofline_approximate=approximate)
        elif rms_norm and (eps := _handwritten_rms_norm_eps(module)) is not None:
            _swap_if_same(name, module, _why_not_handwritten_rms_norm(module, eps), HANDWRITTEN_RMS_NORM,
                          routes_router, report, _roofline_eps=eps)
        elif swiglu:
            _patch_mlp(name, module, routes_router, report)
    if existing is None:
        routes = FunctionRoutes()
        if attention:
            _route_function(routes, F, "scaled_dot_product_attention",
                            Route(routes_router, "attention", why_not_flash, _flash, TORCH_SDPA,
                                  "scaled_dot_product_attention"), report, ("", "scaled_dot_product_attention"))
        if cross_entropy:
            _route_function(routes, F, "cross_entropy",
                            Route(routes_router, "cross_entropy", why_not_cross_entropy, _cross_entropy,
                                  TORCH_CROSS_ENTROPY, "cross_entropy"), report, ("", "cross_entropy"))
        if rope:
            _patch_rope(model, routes, routes_router, report)
        model._roofline_router = routes_router
        if routes.routes:
            model.register_forward_pre_hook(routes.enter)
            model.register_forward_hook(routes.exit, always_call=True)
        if judged and report.routes:
            report.check = ProgramCheck(routes_router, report.routes)
            model.register_forward_pre_hook(report.check)
    return report


def _route_function(routes: FunctionRoutes, namespace, name: str, route: Route, report: PatchReport,
                    listed_as: tuple[str, str]) -> None:
    routes.add(namespace, name, route)
    report.swapped.append(listed_as)
    report.routes.append(route)


def _swap_if_same(name: str, module: nn.Module, why: str | None, swap: Swap, routes_router: Router,
                  report: PatchReport, **attributes) -> None:
    """Swap module's forward where its check found nothing (why is None), else report why it was left."""
    if why is None:
        _swap_forward(name, module, swap, routes_router, report, **attributes)
    else:
        report.left.append((name, why))


def _patch_mlp(name: str, module: nn.Module, routes_router: Router, report: PatchReport) -> None:
    names = next((names for names in MLP_NAMES if all(type(getattr(module, n, None)) is nn.Linear for n in names)),
                 None)
    if names is not None:
        _swap_if_same(name, module, _why_not_swiglu_mlp(module, names), SWIGLU_MLP, routes_router, report,
                      _roofline_mlp=names)


def _patch_rope(model: nn.Module, routes: FunctionRoutes, routes_router: Router, report: PatchReport) -> None:
    namespaces = {type(m).__module__: sys.modules.get(type(m).__module__) for m in model.modules()}
    for module_name, namespace in namespaces.items():
        for name in UNSERVED_ROPE_FUNCTIONS:
            if callable(getattr(namespace, name, None)):
                report.left.append((f"{module_name}.{name}", UNSERVED_ROPE_WHY))
        original = getattr(namespace, ROPE_FUNCTION, None)
        if not callable(original):
            continue
        why = _why_not_rope_function(original)
        if why is None:
            _route_function(routes, namespace, ROPE_FUNCTION,
                            Route(routes_router, "rope", why_not_rope, _rope, original,
                                  f"{module_name}.{ROPE_FUNCTION}"), report,
                            (f"{module_name}.{ROPE_FUNCTION}", "rope"))
        else:
            report.left.append((f"{module_name}.{ROPE_FUNCTION}", why))


def router(model: nn.Module) -> Router | None:
    """The Router patch(model) installed (with its decisions and counts), or None if model is not patched."""
    return model.__dict__.get("_roofline_router")
