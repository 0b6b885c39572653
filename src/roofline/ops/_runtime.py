"""The op runtime: what turns an op's math (its reference, kernels and plan) into an op. KernelOp registers the
forward and backward with torch.library for torch.compile, runs eager calls through their plans (and autograd's
C++ node, roofline.ops._eager_node), and keeps the plan of each call signature an entry point has checked, so
that the next call with it goes straight to its plan. torch_route takes the backends on torch's side (the
reference, eager or under torch.compile).

An op's file then holds its math and what is its own: the reference, the kernels, the plan (built once a key,
_launch.plan_cache), the schema'd forward and backward over the plan, and the entry point's checks. softmax.py
reads top to bottom as the model."""

from __future__ import annotations

import functools

import torch
from torch.autograd import profiler as _autograd_profiler

from roofline.ops import _eager_node
from roofline.ops._launch import Plans

_is_compiling = torch.compiler.is_compiling   # one global read away: seen() asks at every call


@functools.cache
def compiled(fn):
    """torch.compile(fn), made once per function. Default dynamism: one recompile to a dynamic-shape kernel when a
    size changes (dynamic=False would recompile per size and, past the recompile limit, fall back to eager)."""
    return torch.compile(fn)


def torch_route(backend: str, reference, *args, nothing_to_launch: bool = False):
    """A call on torch's side of an op's backends: torch.compile(reference)(*args) for "compile" (whatever the
    arguments); reference(*args) for "torch", and where the kernels have nothing to launch for (torch's result
    then, with its shape and grad_fn). None for a kernel backend, whose route the entry point takes."""
    if backend == "compile":
        return compiled(reference)(*args)
    if backend == "torch" or nothing_to_launch:
        return reference(*args)
    return None


class KernelOp:
    """A forward implementation and its backward, differentiable, and visible to torch.compile as one op.

    Under torch.compile a call goes through torch.library custom ops, roofline::<name> and
    roofline::<name>_backward, so that torch.compile(fullgraph=True) holds them without a graph break. In
    eager mode, `eager(plan, grad, *args)` runs plan.forward(*args) straight away when no gradient is wanted.
    Otherwise it attaches a C++ autograd node to the outputs (roofline.ops._eager_node), whose backward calls
    plan.backward through the backward rule the first time a signature is seen and replays what it did
    afterwards, without Python. Where that node cannot be built, the call goes through a
    torch.autograd.Function entered at torch's C entry point (Function.apply's Python wrapper costs a call more
    host time than a torch op). torch.library's Python dispatch costs several times a small op's host time:
    eager calls never take it.

    forward(*args) and backward(...) run the kernels (their type annotations give the ops' schemas; each finds
    its plan and calls it); forward_fake and backward_fake give outputs' shapes without running anything;
    setup_context(ctx, inputs, output) keeps what the backward needs; backward_rule(ctx, run_backward, *grads)
    returns a gradient per input, calling run_backward, which is the plan's backward in eager mode and the
    registered op under compile. ctx.in_graph says which: under compile a tensor kept for the backward must go
    through ctx.save_for_backward (one only held on ctx is not kept alive by the compiled graph).
    signature(*entry point's args): the key of a call's signature (seen()), everything the entry point's checks
    look at; AttributeError or TypeError where the arguments make none.
    public_name(args): the user-facing op an eager call is (norm_rows serves layer_norm, rms_norm and
    add_rms_norm), which names its backward node (roofline::<op>_backward) and, under a profiler, its forward
    (roofline::<op>).
    """

    def __init__(self, name, *, forward, forward_fake, backward, backward_fake, setup_context, backward_rule,
                 plan, signature=None, backward_mutates: tuple[str, ...] = (), public_name=None,
                 replay_forward: bool = True):
        self.name = name
        self.plan = plan   # plan(*forward args): the plan that runs them
        self._signature = signature
        self.calls = Plans(f"{name} calls")   # the plans of calls as the entry points saw them, checks passed
        # eager forwards replayed from C++ (_eager_node.forward) unless ROOFLINE_FORWARD_REPLAY=0; not for a
        # forward with effects beyond its outputs (the loss ops' check of their targets)
        self.replay_forward = replay_forward and _eager_node.REPLAY_FORWARDS
        self.forward_op = torch.library.custom_op(f"roofline::{name}", forward, mutates_args=())
        self.forward_op.register_fake(forward_fake)
        self.backward_op = torch.library.custom_op(f"roofline::{name}_backward", backward,
                                                   mutates_args=backward_mutates)
        self.backward_op.register_fake(backward_fake)
        def setup_in_graph(ctx, inputs, output):
            ctx.in_graph = True
            setup_context(ctx, inputs, output)

        self.forward_op.register_autograd(lambda ctx, *grads: backward_rule(ctx, self.backward_op, *grads),
                                          setup_context=setup_in_graph)
        self.node_name = f"roofline::{name}_backward"
        self._public_name = public_name or (lambda args: name)
        self._names: dict[str, tuple[str, str]] = {}   # public name -> (forward record's, backward node's)
        self._setup_context = setup_context
        self._node_backward = functools.partial(_eager_node.backward, backward_rule, self.node_name)

        def eager_forward(ctx, plan, *args):
            # An output that gets no gradient gets None, not a zero tensor of its size (cross_entropy's
            # gradient buffer would cost a 2 GB fill).
            ctx.set_materialize_grads(False)
            ctx.in_graph = False
            ctx.plan = plan
            output = plan.forward(*args)
            setup_context(ctx, args, output)
            return output

        def eager_backward(ctx, *grads):
            return None, *backward_rule(ctx, ctx.plan.backward, *grads)

        # made with its name, so that its backward node is <name>_eagerBackward (autograd names it at creation)
        Eager = type(f"{name}_eager", (torch.autograd.Function,), dict(
            forward=staticmethod(eager_forward), backward=staticmethod(eager_backward)))
        self._eager = Eager
        # torch's C entry point of Function.apply, bound to Eager: what Function.apply calls after its Python
        # checks, which matter only under functorch transforms (vmap, grad), checked for on each call
        self._apply = super(torch.autograd.Function, Eager).apply

    def eager(self, plan, grad: bool, *args):
        """An eager call of the forward through `plan`, differentiable if `grad` (some input requires grad
        and grad mode is on)."""
        if _autograd_profiler._is_profiler_enabled:   # a global's read: nothing on the hot path
            return self._eager_recorded(plan, grad, args)
        return self._eager_call(plan, grad, args, -1)

    def _eager_call(self, plan, grad: bool, args, sequence_nr: int):
        """eager()'s work; sequence_nr: the autograd sequence number a profiler record reserved for the node."""
        if not grad:
            return self._forward(plan, args)
        if torch._C._are_functorch_transforms_active():
            return self._eager.apply(plan, *args)
        node = _eager_node.extension()
        if node is None:
            return self._apply(plan, *args)
        return self._eager_with_node(node, plan, args, sequence_nr)

    def names(self, args) -> tuple[str, str]:
        """(roofline::<op>, roofline::<op>_backward) for an eager call with these arguments."""
        public = self._public_name(args)
        found = self._names.get(public)
        if found is None:
            found = self._names[public] = (f"roofline::{public}", f"roofline::{public}_backward")
        return found

    def _forward(self, plan, args):
        """plan.forward(*args), replayed from C++ where this op's forwards are (and the extension is built)."""
        if self.replay_forward and _eager_node.extension() is not None:
            return _eager_node.forward(self, plan, args)
        return plan.forward(*args)

    def _eager_with_node(self, node, plan, args, sequence_nr: int):
        ctx = _eager_node.EagerContext(plan)
        output = self._forward(plan, args)
        self._setup_context(ctx, args, output)
        _eager_node.attach(node, self.names(args)[1], self._node_backward, ctx, args, output, sequence_nr)
        return output

    def _eager_recorded(self, plan, grad: bool, args):
        """eager() while a profiler runs: the forward recorded as `roofline::<name>` with its inputs, and linked
        to its backward node by the node's sequence number, as the profiler links aten ops to theirs."""
        extension, record_name = _eager_node.extension(), self.names(args)[0]
        if extension is None:   # no compiler: the record, unlinked
            with torch._C._profiler._RecordFunctionFast(record_name, [a for a in args if isinstance(a, torch.Tensor)]):
                return self._eager_call(plan, grad, args, -1)
        with_node = grad and not torch._C._are_functorch_transforms_active()
        sequence_nr = extension.reserve_sequence_number() if with_node else -1
        record = extension.ForwardRecord(record_name, args, sequence_nr)
        try:
            return self._eager_call(plan, grad, args, sequence_nr)
        finally:
            record.end()

    def seen(self, *args):
        """(key, plan) for an entry point's call with these arguments: the call's signature, as `signature` makes
        it of them, and the plan that ran a call with that signature after the entry point's checks (None: no
        call yet). (None, None) under torch.compile, and where the arguments make no signature (something else
        where a tensor goes, a value that cannot be hashed): the entry point then checks them."""
        if _is_compiling():
            return None, None
        if self._signature is None:
            raise TypeError(f"KernelOp {self.name}: seen() needs a signature= to make call signatures with")
        try:
            key = self._signature(*args)
            return key, self.calls.get(key)
        except (AttributeError, TypeError):
            return None, None

    def keep(self, key, plan) -> None:
        """Keep `plan` for later calls with the signature `key` (None: a call seen() made no signature of)."""
        if key is not None:
            self.calls.add(key, plan)

    def call(self, key, keep: bool, grad: bool, *args):
        """A call whose arguments the entry point checked: the registered op under torch.compile, else its plan
        (built or found by self.plan), kept under the call's signature `key` when `keep` (the plan takes the
        entry point's tensors as they are, so that the next call with that signature can go straight to it)."""
        if torch.compiler.is_compiling():
            return self.forward_op(*args)
        plan = self.plan(*args)
        if keep:
            self.keep(key, plan)
        return self.eager(plan, grad, *args)

    def __call__(self, *args):
        if torch.compiler.is_compiling():
            return self.forward_op(*args)
        return self.eager(self.plan(*args), torch.is_grad_enabled(), *args)
