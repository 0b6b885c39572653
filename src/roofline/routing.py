"""Which implementation serves a call: roofline's kernel, or the torch code it would replace. Decided once per
call signature (shapes, strides, dtypes, device, whether a gradient is wanted and autocast is on, the other
arguments) by measuring both as eager code calls them, on this device, after checking them against each other on
a random input.

A kernel that is faster when timed alone can still lose where it is called: its host cost, or a shape its tiles
do not suit. So `roofline.patch` asks a Router for every call it could serve, and the router sends the call to
roofline only where that was measured to be faster here. Decisions are cached per device and software (device,
driver, CUDA, torch, triton, roofline) in cache_dir()/routes.json, as doctor caches ceilings: a later process
measures nothing it has measured before.

Policies: "faster" (measure; the default) and "always" (route every call roofline can serve: for tests, and for
users who have measured themselves). Whatever the policy, a call is left to torch
  - under torch.compile: Inductor fuses the torch expression with its neighbours, which an opaque kernel would
    prevent, and nothing can be measured while tracing;
  - when first seen during CUDA graph capture, where nothing can be measured (decided calls are captured as
    decided);
  - when roofline's result differs from torch's on a random input of the call's signature.

A signature that wants a gradient is measured with gradients laid out as the program's arrive: torch serves its
calls until a backward has passed through one of them (hooks on the outputs see the gradients' strides), or for
AWAIT_CALLS calls if none does. A measurement's backward with a layout the program never uses is not harmless:
torch 2.11 keeps cuDNN attention's backward graph under q's, k's and v's layouts only, and a graph built for the
measurement's gradient then served the program's own, differently laid out one (silently wrong gradients;
benchmarks/results/h100-host.md, found by a probe since removed:
`git show 95f5b89:benchmarks/sdpa_gradient_layout.py`).

Deciding costs host time on every call (a few microseconds: the signature's key and its look-up), which a
host-bound program (a decode step in eager mode) pays in full. So roofline's side is measured through a route,
as the program's calls reach it, and torch's as the unpatched program calls it; and patch gives each place it
catches calls a Route, and a route whose first SETTLE_CALLS calls torch served, every one, settles: it is taken
out, and later calls cost what they cost before patch.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import statistics
import time

import torch

import roofline
from roofline import device as _device
from roofline.ops import _eager_node, attention
from roofline.ops._common import capturing, hopper

POLICIES = ("faster", "always")
MEASURED_PER_OP = 32  # signatures measured per op and router; a program of ever new shapes leaves the rest to torch
DECISIONS_KEPT = 4096  # signatures kept per router
SETTLE_CALLS = 8     # decided calls after which a route that torch served throughout is taken out (Route)
AWAIT_CALLS = 64     # calls torch serves while no backward has shown a signature's gradient layouts (then: as outputs)
MARGIN = 0.97        # roofline must take at most this fraction of torch's time: a tie goes to torch
# What a routed call costs more inside a program than in the measurement's loop of back-to-back calls, over what
# torch's call costs more there: roofline's path (the route, the look-up, the entry point, the replay) is longer
# and meets colder caches between a program's other calls, and the calls after it can slow too. Added to roofline's
# side before the comparison: only a call that wins by more is routed (a tiny op wins by a few us or loses; a
# large one's time is its GPU's, where 10 us is nothing). Two decode ops won in the loop and made their model
# decode slower routed: GPT-2's layer_norm, and Llama's SwiGLU, whose call lost about three times as much in the
# model as the layer_norm's (measured: benchmarks/results/h100-models.md, "2026-11-26" and "2026-11-26, the route
# charge"). A charge of 5 us, about the first case's loss, let the second through; 10 keeps both out, and every
# route the benchmarks' training and prefill took wins by far more. patch charges it only where the program does not
# judge its routes itself (in_program=False): roofline.program_check's A/B of the model's own forwards replaces it.
IN_PROGRAM_US = 10.0
ROUNDS = 7           # alternating rounds of back-to-back calls; the median round counts
ROUND_S = 2e-3       # host and GPU time per round and implementation, about
CACHE = "routes.json"
MEASUREMENT = 4      # how decisions are made; cached ones made otherwise are made again (2: measured through a
                     # route; 3: IN_PROGRAM_US charged to roofline's side; 4: 10 us of it, not 5)
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3, torch.bfloat16: 2e-2}  # relative error, as a norm


TORCH_SERVED, OURS_SERVED = 1, 2   # Decision.served's bits


class _Awaited:
    """A signature that wants a gradient, awaiting the layouts of the gradients the program's backward passes to its
    outputs: hooks on the outputs of the calls torch serves meanwhile record their strides."""

    __slots__ = ("strides", "calls")

    def __init__(self):
        self.strides: list | None = None   # per output, the strides its gradient came with (None: no gradient)
        self.calls = 0

    def watch(self, output) -> None:
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        strides = [None] * len(outputs)
        for i, o in enumerate(outputs):
            if isinstance(o, torch.Tensor) and o.requires_grad:
                o.register_hook(functools.partial(self._seen, strides, i))

    def _seen(self, strides: list, i: int, grad: torch.Tensor) -> None:
        strides[i] = grad.stride()
        self.strides = strides


@dataclasses.dataclass
class Decision:
    """Who serves a signature's calls (ours: roofline), why, and the times measured (µs per call) if any."""
    ours: bool
    why: str
    signature: str = ""
    ours_us: float | None = None
    torch_us: float | None = None
    calls: int = 0
    # which sides served a call of it in this process (TORCH_SERVED | OURS_SERVED): not cached with it
    served: int = dataclasses.field(default=0, repr=False, compare=False)


class Router:
    """Routes calls between roofline and torch by measured decisions; counts every call by who served it and why.

    call(op, why_not, ours, theirs, *args, **kwargs): theirs(*args, **kwargs) is what the program would have run;
    why_not(*args, **kwargs) says why roofline cannot serve the call (None if it can); ours(*args, **kwargs) is
    roofline's version, which must return what theirs returns.
    """

    def __init__(self, policy: str = "faster", *, timer=None, persist: bool = True, charge_us: float = IN_PROGRAM_US):
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        self.policy = policy
        # added to roofline's side of a measurement (IN_PROGRAM_US); 0 where the program judges the routes itself
        # (program_check), so that every call that wins in the loop gets its trial in the program
        self.charge_us = charge_us
        self.decisions: dict[tuple, Decision] = {}
        self.measured: collections.Counter[str] = collections.Counter()   # signatures measured, by op
        self._awaited: dict[tuple, _Awaited] = {}   # signatures awaiting their gradients' layouts
        self._timer = timer or time_as_eager
        self._persist = persist
        self.held_back: set[str] = set()   # ops whose routed calls torch serves for now (program_check's trials)
        self.measurements = 0              # signatures timed so far: each takes milliseconds of the program's time
        self.taken_back: dict[str, str] = {}   # op -> why: the program ran slower with it (program_check)
        # Calls that were the first of their signature served by their side in this process (a cached decision's
        # both sides, a measured one's neither): they pay one-time costs (compiling, torch's plans for a new shape),
        # so program_check leaves out the steps that hold one
        self.first_calls = 0

    def call(self, op: str, why_not, ours, theirs, *args, **kwargs):
        return self.serve(op, why_not, ours, theirs, args, kwargs)[0]

    def serve(self, op: str, why_not, ours, theirs, args, kwargs) -> tuple[object, Decision | None]:
        """(the call's result, the decision that served it), or None for the decision where none could be made
        (under torch.compile, or first seen during CUDA graph capture): torch served that call."""
        if torch.compiler.is_compiling():
            return theirs(*args, **kwargs), None
        key = _key(op, args, kwargs)
        try:
            decision = self.decisions.get(key)
        except TypeError:   # an argument that cannot be hashed: no signature to decide for
            decision = self._note(op, "an argument that a signature cannot hold")
        if decision is None:
            decision = self._decide(key, why_not, ours, theirs, args, kwargs)
            if decision is None:   # no measurement possible now: torch serves, and a later call decides
                output = theirs(*args, **kwargs)
                awaited = self._awaited.get(key)
                if awaited is not None:
                    awaited.watch(output)
                return output, None
        held_back = decision.ours and self.held_back and key[0] in self.held_back
        side = OURS_SERVED if decision.ours and not held_back else TORCH_SERVED
        if not decision.served & side:
            decision.served |= side
            self.first_calls += 1
        if held_back:
            decision.calls += 1
            return theirs(*args, **kwargs), decision
        if decision.ours and not decision.calls:
            return self._first_call(decision, ours, theirs, args, kwargs), decision
        decision.calls += 1
        return (ours if decision.ours else theirs)(*args, **kwargs), decision

    @staticmethod
    def _first_call(decision: Decision, ours, theirs, args, kwargs):
        """The first call roofline serves under a decision: where roofline refuses the arguments (its checks raise
        before any launch) torch serves this call and the next ones alike, as patch never errs where torch would
        not. A decision the measurement made has seen such arguments already; policy 'always' has not."""
        try:
            result = ours(*args, **kwargs)
        except (TypeError, ValueError, NotImplementedError) as exc:
            decision.ours, decision.why = False, f"roofline raised {type(exc).__name__}: {exc}"
            result = theirs(*args, **kwargs)
        decision.calls += 1
        return result

    def take_back(self, op: str, why: str) -> None:
        """Send every signature of op that roofline serves back to torch, saying why (program_check's verdict), and
        every signature of it decided later."""
        self.taken_back[op] = why
        for key, decision in self.decisions.items():
            if key[0] == op and decision.ours:
                decision.ours, decision.why = False, why

    def report(self) -> list[dict]:
        """One row per signature that was called: op, signature, calls, served_by, why, and the times (µs)."""
        return [dict(op=key[0], signature=d.signature, calls=d.calls, served_by="roofline" if d.ours else "torch",
                     why=d.why, ours_us=d.ours_us, torch_us=d.torch_us)
                for key, d in self.decisions.items() if d.calls]

    def _decide(self, key, why_not, ours, theirs, args, kwargs) -> Decision | None:
        op, grad = key[0], key[1]
        signature = describe(args, grad)
        reason = why_not(*args, **kwargs) or self.taken_back.get(op)
        if reason is not None:
            decision = Decision(False, reason, signature)
        elif self.policy == "always":
            decision = Decision(True, "policy 'always'", signature)
        elif capturing():
            self._note(op, CAPTURING).calls += 1
            return None
        elif self.measured[op] >= MEASURED_PER_OP:
            decision = Decision(False, TOO_MANY, signature)
        else:
            cache_key = f"{op} {key[1:]!r} charged {self.charge_us:g} us"
            cached = _cached(cache_key, args) if self._persist else None
            if cached is not None:
                decision = Decision(**{**cached, "why": cached["why"] + " (measured by an earlier run)", "calls": 0})
            else:
                awaited = self._awaited.get(key) if grad else None
                if grad and (awaited is None or (awaited.strides is None and awaited.calls < AWAIT_CALLS)):
                    if awaited is None:
                        awaited = self._awaited[key] = _Awaited()
                    awaited.calls += 1
                    self._note(op, AWAITING).calls += 1
                    return None
                self._awaited.pop(key, None)
                self.measured[op] += 1
                strides = None if awaited is None else awaited.strides
                decision = self._measure(op, ours, theirs, args, kwargs, grad, signature, strides)
                decision.served = TORCH_SERVED | OURS_SERVED   # the measurement ran both at this signature
                if self._persist and decision.ours_us is not None:
                    _store(cache_key, args, decision)
        if len(self.decisions) < DECISIONS_KEPT:
            self.decisions[key] = decision
        else:   # a program of ever new shapes: count them under their op, decided alike, measured no more
            decision = self._note(op, f"beyond {DECISIONS_KEPT} signatures: " + decision.why, decision.ours)
        return decision

    def _note(self, op: str, why: str, ours: bool = False) -> Decision:
        """The decision that counts calls of op not kept under a signature of their own."""
        return self.decisions.setdefault((op, why), Decision(ours, why))

    def _measure(self, op: str, ours, theirs, args, kwargs, grad: bool, signature: str, strides=None) -> Decision:
        self.measurements += 1
        inputs = [_random_like(a) for a in args]
        run_ours, run_theirs = (_runner(fn, inputs, kwargs, grad, strides)
                                for fn in (_as_routed(op, ours, theirs, inputs, kwargs), theirs))
        expected = run_theirs()
        try:
            got = run_ours()
        except Exception as exc:  # noqa: BLE001 - any failure means roofline must not serve this signature
            return Decision(False, f"roofline raised {type(exc).__name__}: {exc}", signature)
        error = _mismatch(got, expected)
        if error is not None:
            return Decision(False, f"differs from torch on a random input: {error}", signature)
        ours_us, torch_us = self._timer(run_ours, run_theirs, _device_of(args))
        ratio, faster = torch_us / ours_us, ours_us + self.charge_us <= MARGIN * torch_us
        if faster:
            why = f"{ratio:.2f}x faster than torch here"
        elif ratio < 1:
            why = f"torch {1 / ratio:.2f}x as fast here"
        elif ours_us <= MARGIN * torch_us:
            why = (f"{ratio:.2f}x faster than torch in a loop, by less than the {self.charge_us:g} us a routed call "
                   "costs more in a program")
        else:
            why = f"only {ratio:.2f}x faster than torch"
        return Decision(faster, why, signature, round(ours_us, 2), round(torch_us, 2))


class Route:
    """One place where patch catches calls (a module's forward, a module-level function): route(*args, **kwargs)
    serves a call through the router, as router.call(op, why_not, ours, theirs, ...) does.

    Once SETTLE_CALLS calls have been decided and torch served every one of them, the route settles: it calls
    on_settle() (which takes the route out: the module gets its own forward back, the function its original),
    so that a program roofline cannot speed up pays nothing per call for having been patched. A signature
    first seen after that goes to torch unmeasured."""

    def __init__(self, router: Router, op: str, why_not, ours, theirs, name: str, on_settle=None):
        self.router, self.op, self.why_not, self.ours, self.theirs = router, op, why_not, ours, theirs
        self.name, self.on_settle = name, on_settle
        self.decided = 0              # calls served under a decision
        self.served_ours = False      # whether roofline served any of them
        self.settled = False

    def reconsider(self) -> None:
        """Count calls afresh, as though none were served yet: after its op was taken back (program_check), a route
        whose calls torch now serves throughout settles as any other."""
        self.decided, self.served_ours = 0, False

    def __call__(self, *args, **kwargs):
        if self.settled:   # a caller that held on to the route (a name bound before it settled)
            return self.theirs(*args, **kwargs)
        result, decision = self.router.serve(self.op, self.why_not, self.ours, self.theirs, args, kwargs)
        if decision is not None:
            self.decided += 1
            self.served_ours = self.served_ours or decision.ours
            if self.decided >= SETTLE_CALLS and not self.served_ours:
                self.settled = True
                if self.on_settle is not None:
                    self.on_settle()
        return result


def _as_routed(op: str, ours, theirs, inputs, kwargs) -> Route:
    """ours, as a patched program's calls reach it: through a route and a router's look-up of the call's decision
    (the signature's key, built on every call). That host time is paid on top of roofline's op, and torch's
    unpatched call does not pay it: at GPT-2's decode shape roofline's layer_norm measured faster than torch's
    as an op, and the patched module slower than the unpatched one (measured: benchmarks/results/h100-models.md,
    "2026-11-25, defaults")."""
    probe = Router("always", persist=False)
    probe.decisions[_key(op, inputs, kwargs)] = Decision(True, "being measured")
    return Route(probe, op, _nothing_against, ours, theirs, "(measurement)")


def _nothing_against(*args, **kwargs) -> None:
    return None


CAPTURING = ("first seen during CUDA graph capture, where nothing can be measured: torch serves it until a call "
             "outside capture decides")
TOO_MANY = f"more than {MEASURED_PER_OP} signatures measured for this op: left to torch unmeasured"
AWAITING = ("wants a gradient: torch serves it until a backward shows the layouts its gradients arrive in, which "
            "the measurement then uses")


def _key(op: str, args, kwargs) -> tuple:
    """What a decision is kept under: op, whether a gradient is wanted, whether autocast is on (it changes what
    torch's side returns), each tensor argument's shape, strides, dtype and device, and the other arguments'
    values. Paid on every call, so built in C++ (eager_node.cpp's route_key, a fraction of this Python's cost),
    here where the extension cannot be built."""
    module = _eager_node.extension()
    if module is not None:
        return module.route_key(op, args, kwargs or None, torch._C._is_any_autocast_enabled())
    key = [op, False, torch._C._is_any_autocast_enabled()]
    grad = False
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, torch.Tensor):
            key += (value.shape, value.stride(), value.dtype, value.device)
            grad = grad or value.requires_grad
        else:
            key.append(tuple(value) if isinstance(value, list) else value)
    if kwargs:
        key.append(tuple(kwargs))
    key[1] = grad and torch.is_grad_enabled()
    return tuple(key)


_SHORT = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def describe(args, grad: bool) -> str:
    """A call's tensors as a reader wants them: '[8, 1024, 768] bf16, [768] bf16 (forward+backward)'."""
    tensors = [f"{list(a.shape)} {_SHORT.get(a.dtype, a.dtype)}" for a in args if isinstance(a, torch.Tensor)]
    return ", ".join(tensors) + (" (forward+backward)" if grad else " (forward)")


def _device_of(args) -> torch.device:
    return next(a.device for a in args if isinstance(a, torch.Tensor))


def _random_like(a):
    """A fresh random tensor with a's shape, strides, dtype, device and requires_grad (integer tensors and
    everything else as given)."""
    if not isinstance(a, torch.Tensor) or not a.is_floating_point():
        return a
    try:
        out = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device).normal_()
    except RuntimeError:   # overlapping strides (an expanded tensor): contiguous instead
        out = torch.randn(a.shape, dtype=a.dtype, device=a.device)
    return out.requires_grad_(a.requires_grad)


def _runner(fn, inputs, kwargs, grad: bool, strides=None):
    """A callable making one call as the program makes it and returning (outputs, gradients): the forward, and
    with grad the backward too (random cotangents laid out with `strides`, per output, as the program's gradients
    arrived, else as the outputs; the gradients of every input that requires one)."""
    def forward():
        outputs = fn(*inputs, **kwargs)
        return outputs if isinstance(outputs, tuple) else (outputs,)

    if not grad:
        return lambda: (forward(), ())
    wrt = [a for a in inputs if isinstance(a, torch.Tensor) and a.requires_grad]
    cotangents = None

    def forward_backward():
        nonlocal cotangents
        outputs = forward()
        if cotangents is None:
            generator = torch.Generator(outputs[0].device).manual_seed(0)
            cotangents = [_cotangent(o, strides[i] if strides is not None and i < len(strides) else None, generator)
                          for i, o in enumerate(outputs)]
        return outputs, torch.autograd.grad(outputs, wrt, cotangents)
    return forward_backward


def _cotangent(output: torch.Tensor, strides, generator) -> torch.Tensor:
    """A random gradient for `output`, laid out with `strides` where given (and non-overlapping: an expanded
    gradient cannot be filled in place), else as the output, as a program's gradients usually arrive."""
    if strides is not None and len(strides) == output.dim():
        try:
            return torch.empty_strided(output.shape, strides, dtype=output.dtype,
                                       device=output.device).normal_(generator=generator)
        except RuntimeError:
            pass
    return torch.empty_like(output).normal_(generator=generator)


def _mismatch(got, expected) -> str | None:
    """How roofline's (outputs, gradients) differ from torch's, or None: in number, shape, dtype, the outputs'
    memory layout (a swap must hand the code after it what torch would: kernels downstream choose their paths by
    layout), or in value beyond TOLERANCE: each result's dtype's, or that of a coarser dtype that torch's outputs
    have. Gradients flow back through the outputs: where autocast ran the op in bf16 on fp32 inputs, the inputs'
    gradients are fp32 tensors with bf16's error (torch's own differ from float64 by about 1e-3 there)."""
    (outputs, grads), (torch_outputs, torch_grads) = got, expected
    coarsest = max((TOLERANCE.get(o.dtype, 1e-6) for o in torch_outputs), default=0.0)
    if len(outputs) != len(torch_outputs) or len(grads) != len(torch_grads):
        return f"{len(outputs)} results where torch gives {len(torch_outputs)}"
    for i, (a, b) in enumerate(zip(outputs, torch_outputs)):
        if any(a.stride(d) != b.stride(d) for d in range(a.dim()) if a.shape[d] > 1):
            return f"result {i} is laid out with strides {a.stride()}, torch's with {b.stride()}"
    for i, (a, b) in enumerate(zip((*outputs, *grads), (*torch_outputs, *torch_grads))):
        if a.shape != b.shape or a.dtype != b.dtype:
            return f"result {i} is {list(a.shape)} {a.dtype}, torch's {list(b.shape)} {b.dtype}"
        error = ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
        if not error <= max(TOLERANCE.get(b.dtype, 1e-6), coarsest if i >= len(outputs) else 0.0):
            return f"relative error {error:.2g} in result {i}"
    return None


def time_as_eager(run_ours, run_theirs, device: torch.device) -> tuple[float, float]:
    """µs per call of each, as back-to-back eager calls take them (host and device, whichever is slower),
    alternating rounds so that a drift of the machine falls on both; the median round of each."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for run in (run_ours, run_theirs):   # warm up: compile, autotune, build plans
        run(), run()
    sync()
    start = time.perf_counter()
    run_theirs()
    sync()
    calls = max(1, min(200, int(ROUND_S / max(time.perf_counter() - start, 1e-7))))
    samples = {run_ours: [], run_theirs: []}
    for round_ in range(ROUNDS):
        for run in (run_ours, run_theirs) if round_ % 2 else (run_theirs, run_ours):
            sync()
            start = time.perf_counter()
            for _ in range(calls):
                run()
            sync()
            samples[run].append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples[run_ours]), statistics.median(samples[run_theirs])


def kernel_settings() -> str:
    """The switches that choose which of roofline's kernels a routed call runs, as text ("" where only the tiled
    kernels serve): measured decisions and the program's verdicts are kept under them, since a decision of
    attention's made with the tiled kernels says nothing of the Hopper ones (ROOFLINE_SM90_ATTENTION: auto, the
    default, takes them at long sequences only; 1 at every length), which run on a Hopper GPU only."""
    setting = attention.SM90_ATTENTION
    if setting is False or not _hopper_present():
        return ""
    return "Hopper attention" if setting is True else "Hopper attention at long sequences"


@functools.cache
def _hopper_present() -> bool:
    return torch.cuda.is_available() and any(hopper(torch.device("cuda", i)) for i in range(torch.cuda.device_count()))


def _cache_name(args) -> str:
    d = _device_of(args)
    settings = kernel_settings()
    return (f"{_device.cache_key(d)} | triton {_device.info(d).triton} | roofline {roofline.__version__} | "
            f"measured {MEASUREMENT}" + (f" | {settings}" if settings else ""))


def _cached(key: str, args) -> dict | None:
    return _device.read_cache(CACHE).get(_cache_name(args), {}).get(key)


def _store(key: str, args, decision: Decision) -> None:
    name = _cache_name(args)
    entries = _device.read_cache(CACHE).get(name, {})
    entries[key] = {k: v for k, v in dataclasses.asdict(decision).items() if k != "served"}
    _device.write_cache(CACHE, name, entries)
