"""The eager launch path: a call signature seen before builds no plan and skips the checks it passed; what a
signature cannot hold (a misaligned pointer, a bool for an int) still gets the right result or the right
error; launches go straight to the compiled kernel on a GPU."""

import threading

import pytest
import torch
import torch.nn.functional as F
from ops_checks import DEVICE

from roofline import ops
from roofline.ops import _eager_node, _launch
from roofline.ops.norm import add_rms_norm_reference
from roofline.ops.rope import rope_reference



def _randn(*shape, grad=False, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, device=DEVICE, dtype=dtype) * scale).requires_grad_(grad)


def _norm_params(n, grad):
    return _randn(n, grad=grad), _randn(n, grad=grad)


def _rope_inputs(grad):
    angles = torch.rand(9, 16, device=DEVICE) * 6.28
    return _randn(2, 4, 9, 16, grad=grad), _randn(2, 2, 9, 16, grad=grad), angles.cos(), angles.sin()


def _int8_inputs(grad):
    q, scale = ops.quantize_int8(_randn(48, 64))
    return _randn(1, 64, grad=grad, dtype=torch.float16), q, scale


# name: (inputs(grad) -> args, roofline's call, the torch reference)
CALLS = {
    "softmax": (lambda g: (_randn(3, 5, 40, grad=g),), lambda x: ops.softmax(x, -1, backend="triton"),
                lambda x: F.softmax(x, -1)),
    "log_softmax": (lambda g: (_randn(6, 40, grad=g),), lambda x: ops.log_softmax(x, -1, backend="triton"),
                    lambda x: F.log_softmax(x, -1)),
    "layer_norm": (lambda g: (_randn(3, 5, 40, grad=g), *_norm_params(40, g)),
                   lambda x, w, b: ops.layer_norm(x, (40,), w, b, backend="triton"),
                   lambda x, w, b: F.layer_norm(x, (40,), w, b)),
    "rms_norm": (lambda g: (_randn(7, 40, grad=g), _randn(40, grad=g)),
                 lambda x, w: ops.rms_norm(x, (40,), w, 1e-6, backend="triton"),
                 lambda x, w: F.rms_norm(x, (40,), w, 1e-6)),
    "add_rms_norm": (lambda g: (_randn(7, 40, grad=g), _randn(7, 40, grad=g), _randn(40, grad=g)),
                     lambda x, r, w: ops.add_rms_norm(x, r, w, 1e-6, backend="triton"),
                     lambda x, r, w: add_rms_norm_reference(x, r, w, 1e-6)),
    "gelu": (lambda g: (_randn(5, 33, grad=g),), lambda x: ops.gelu(x, "tanh", backend="triton"),
             lambda x: F.gelu(x, approximate="tanh")),
    "swiglu": (lambda g: _randn(6, 2, 24, grad=g).unbind(1),
               lambda a, b: ops.swiglu(a, b, backend="triton"), lambda a, b: F.silu(a) * b),
    "rope": (_rope_inputs, lambda q, k, c, s: ops.rope(q, k, c, s, backend="triton"), rope_reference),
    "cross_entropy": (lambda g: (_randn(6, 37, grad=g), torch.randint(0, 37, (6,), device=DEVICE)),
                      lambda x, t: ops.cross_entropy(x, t, backend="triton"), F.cross_entropy),
    "flash_attention": (lambda g: (_randn(1, 2, 16, 32, grad=g), _randn(1, 2, 16, 32, grad=g),
                                   _randn(1, 2, 16, 32, grad=g)),
                        lambda q, k, v: ops.flash_attention(q, k, v, True, backend="triton"),
                        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    # a layer's weights as initialized (std 1/sqrt(K)): with unit ones the pre-activations reach |z| ~ 17, where the
    # tf32 matmuls' rounding (2^-11 of each product) can part gradients by more than TOL (one H100 run: 0.037)
    "linear": (lambda g: (_randn(2, 5, 32, grad=g), _randn(48, 32, grad=g, scale=32 ** -0.5), _randn(48, grad=g)),
               lambda x, w, b: ops.linear(x, w, b, "gelu", backend="triton"),
               lambda x, w, b: F.gelu(F.linear(x, w, b))),
    "int8_linear": (_int8_inputs, lambda x, q, s: ops.int8_linear(x, q, s, backend="triton"),
                    lambda x, q, s: F.linear(x.double(), q.double() * s.double()[:, None]).to(x.dtype)),
}
TOL = dict(atol=2e-2, rtol=2e-2)   # tf32 matmuls in linear and attention on a GPU; bf16 int8_linear


def _outputs(out):
    return out if isinstance(out, tuple) else (out,)


def _run(name, grad):
    """One call on fresh inputs, checked against torch: outputs and, with grad, every input's gradient."""
    make, ours, reference = CALLS[name]
    args = make(grad)
    out, ref = _outputs(ours(*args)), _outputs(reference(*args))
    for o, r in zip(out, ref):
        torch.testing.assert_close(o.float(), r.float(), **TOL)
    wrt = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if grad and wrt:
        cotangents = [torch.randn_like(o) for o in out]
        for a, b in zip(torch.autograd.grad(out, wrt, cotangents), torch.autograd.grad(ref, wrt, cotangents)):
            torch.testing.assert_close(a.float(), b.float(), **TOL)


def _built() -> int:
    return sum(_launch.plans_built().values())


@pytest.mark.parametrize("grad", [False, True], ids=["forward", "forward+backward"])
@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_signature_seen_before_builds_no_plan(name, grad):
    _run(name, grad)
    built = _built()
    assert built > 0, "the first call built no plan"
    _run(name, grad)   # fresh tensors, the same signature
    assert _built() == built, _launch.plans_built()


def _kernel_ops() -> list:
    import importlib
    import pkgutil

    from roofline.ops._runtime import KernelOp

    modules = [importlib.import_module(f"roofline.ops.{m.name}") for m in pkgutil.iter_modules(ops.__path__)
               if not m.name.startswith("_") and m.name != "cuda"]
    return list({id(v): v for m in modules for v in vars(m).values() if isinstance(v, KernelOp)}.values())


@pytest.mark.parametrize("name", sorted(CALLS))
def test_a_signature_seen_before_goes_straight_to_its_plan(name, monkeypatch):
    """seen() takes an error from a signature for arguments that make none, so a signature that fails on good
    arguments would cost its op the fast path without a word: each is made without an error, and the second call
    finds the plan the first kept (where the call runs in Python: on a GPU a replay may serve it)."""
    errors, found = [], []
    for op in _kernel_ops():
        def signature(*args, _made=op._signature):
            try:
                return _made(*args)
            except Exception as exc:
                errors.append(repr(exc))
                raise

        def seen(*args, _seen=op.seen):
            key, plan = _seen(*args)
            found.append(plan is not None)
            return key, plan

        monkeypatch.setattr(op, "_signature", signature)
        monkeypatch.setattr(op, "seen", seen)
    _run(name, False)
    assert found == [False] and not errors, errors
    _run(name, False)
    assert found[1:] in ([], [True]) and not errors, (found, errors)


def test_a_new_shape_builds_a_new_plan():
    ops.softmax(_randn(4, 40), backend="triton")
    built = _launch.plans_built()["softmax"]
    ops.softmax(_randn(4, 41), backend="triton")
    assert _launch.plans_built()["softmax"] == built + 1


@pytest.mark.eager_node   # the grad_fn's name is the C++ node's
def test_no_gradient_wanted_skips_autograd():
    x = _randn(3, 40, grad=True)
    with torch.no_grad():
        y = ops.layer_norm(x, (40,), backend="triton")
    assert y.grad_fn is None
    y = ops.layer_norm(x, (40,), backend="triton")
    assert y.grad_fn.name() == "roofline::layer_norm_backward"


def test_checks_still_run_for_what_a_signature_does_not_hold():
    x = _randn(3, 40)
    ops.softmax(x, 1, backend="triton")
    with pytest.raises(TypeError, match="dim must be an int"):
        ops.softmax(x, True, backend="triton")   # True == 1 as a dict key
    w = _randn(40)
    ops.layer_norm(x, (40,), w, eps=1.0, backend="triton")
    with pytest.raises(ValueError, match="eps"):
        ops.layer_norm(x, (40,), w, eps=True, backend="triton")
    with pytest.raises(ValueError, match="weight must have shape"):
        ops.layer_norm(x, (40,), _randn(41), eps=1.0, backend="triton")
    q, k, cos, sin = _rope_inputs(False)
    with torch.no_grad():
        ops.rope(q, k, cos.requires_grad_(), sin, backend="triton")   # no gradient wanted: allowed
    with pytest.raises(ValueError, match="no gradient flows to cos"):
        ops.rope(q, k, cos, sin, backend="triton")


def test_a_list_for_a_shape_takes_the_checked_path():
    x, w = _randn(3, 40), _randn(40)
    for _ in range(2):
        torch.testing.assert_close(ops.layer_norm(x, [40], w, backend="triton"), F.layer_norm(x, [40], w))


@pytest.mark.parametrize("name", ["layer_norm", "rms_norm", "gelu", "softmax"])
def test_a_misaligned_input_after_an_aligned_one(name):
    """A plan is built on aligned inputs; a call whose input starts 4 bytes into an allocation must not reuse a
    kernel compiled for aligned pointers (on a GPU it goes through the JIT)."""
    make, ours, reference = CALLS[name]
    args = make(False)
    ours(*args)
    x = args[0]
    shifted = torch.empty(x.numel() + 1, device=DEVICE, dtype=x.dtype)[1:].view(x.shape).copy_(x)
    assert shifted.data_ptr() % 16 != 0 and shifted.stride() == x.stride()
    for o, r in zip(_outputs(ours(shifted, *args[1:])), _outputs(reference(shifted, *args[1:]))):
        torch.testing.assert_close(o.float(), r.float(), **TOL)


def test_a_recording_is_told_only_of_its_own_threads_launches():
    # a program whose threads call ops at once (a server): one thread's launches are no part of the call another
    # thread is recording, which would otherwise replay them (or be refused for them)
    x = _randn(5, 33)
    ops.gelu(x, "tanh", backend="triton")   # compiled (or interpreted) once, before the recording
    told = []
    recorder = type("Recorder", (), dict(compiling=lambda self, launch: told.append("compiling"),
                                         launch=lambda self, launch, args: told.append("launch"),
                                         refuse=lambda self, reason: told.append(reason)))()
    _eager_node.recording.recorder = recorder
    try:
        other = threading.Thread(target=lambda: ops.gelu(_randn(5, 33), "tanh", backend="triton"))
        other.start()
        other.join()
        assert told == []
        ops.gelu(x, "tanh", backend="triton")   # this thread's own launch is told
        assert told
    finally:
        _eager_node.recording.recorder = None


def test_every_kernel_takes_its_constexprs_last():
    """Launch passes runtime arguments by position and the constexprs after them."""
    import importlib
    import inspect

    import triton

    kernels = {name: obj for module in ("softmax", "norm", "gelu", "swiglu", "rope", "cross_entropy", "attention",
                                        "linear")
               for name, obj in vars(importlib.import_module(f"roofline.ops.{module}")).items()
               if isinstance(obj, triton.runtime.KernelInterface) and name.endswith("_kernel")
               and not name.startswith("_")}
    assert len(kernels) >= 14, sorted(kernels)
    for name, kernel in kernels.items():
        while not inspect.isfunction(kernel):   # under autotuning, heuristics, the JIT or the interpreter
            kernel = kernel.fn
        flags = ["constexpr" in str(p.annotation) for p in inspect.signature(kernel).parameters.values()]
        assert flags == sorted(flags), name


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CALLS))
def test_launches_go_straight_to_the_compiled_kernel(name):
    """After a first call, every launch a plan made is direct (not the JIT), and three calls on fresh inputs
    give torch's results (a stale pointer or grid would not)."""
    for _ in range(3):
        _run(name, grad=True)
    launches = [launch for plans in _launch.Plans.registry for plan in plans.values()
                for launch in _launch_objects(plan)]
    called = [launch for launch in launches if launch.run != launch._first]
    assert called, "no launch was made through a plan"
    for launch in called:
        assert launch.run != launch.jit, f"{launch.kernel} launches through the JIT"


def _launch_objects(value, depth=0):
    """The Launch objects a plan holds (in attributes, dicts, tuples, and plans it holds)."""
    if isinstance(value, _launch.Launch):
        yield value
    elif depth < 3 and isinstance(value, (dict, tuple)):
        for item in (value.values() if isinstance(value, dict) else value):
            yield from _launch_objects(item, depth + 1)
    elif depth < 3 and type(value).__name__.endswith("Plan"):
        for item in vars(value).values():
            yield from _launch_objects(item, depth + 1)


@pytest.mark.eager_node
@pytest.mark.parametrize("args, error, match", [
    ((torch.zeros(2), 3), ValueError, "argument 0 of a kernel launch on cuda:0 is a tensor on cpu"),
    (("x", 3), TypeError, "argument 0 of a kernel launch must be a tensor, got str"),
    ((None, "y"), TypeError, "cannot be interpreted as an integer"),
    ((None,), TypeError, "the kernel takes 2 arguments, got 1"),
])
def test_a_launch_from_cpp_refuses_what_the_kernel_cannot_take(args, error, match):
    # (ROOFLINE_NATIVE_LAUNCH=1) checked before the driver is reached: a CPU tensor's address would fault on the GPU
    module = _eager_node.extension()
    spec = module.python_launch(0, [1, 1, 1], 128, 0, "pi", 0)
    with pytest.raises(error, match=match):
        module.launch(spec, *args)
    with pytest.raises(RuntimeError, match="kinds 'pbhilfd-'"):
        module.python_launch(0, [1, 1, 1], 128, 0, "pT", 0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CALLS))
def test_gpu_launches_from_cpp_give_torchs_results(name, monkeypatch):
    """With ROOFLINE_NATIVE_LAUNCH=1, every launch without a tensor descriptor goes through roofline's C++, and
    three calls on fresh inputs give torch's results."""
    monkeypatch.setattr(_launch, "NATIVE_LAUNCH", True)
    _launch.clear_plans()   # plans built before would keep Triton's launcher
    try:
        for _ in range(3):
            _run(name, grad=True)
        launches = [launch for plans in _launch.Plans.registry for plan in plans.values()
                    for launch in _launch_objects(plan) if launch.run != launch._first]
        native = [launch for launch in launches if getattr(launch.run, "func", None) is _eager_node.extension().launch]
        plain = [launch for launch in launches if launch.native is not None
                 and all(spec is None for spec in launch.native[5])]
        assert native == plain, [launch.kernel for launch in plain if launch not in native]
    finally:
        _launch.clear_plans()
