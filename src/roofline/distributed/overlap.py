"""The optimizer stepped bucket by bucket as DDP reduces the gradients, not after the whole backward.

    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    optimizer = overlap_optimizer(ddp, torch.optim.AdamW(model.parameters(), lr=3e-4, fused=True))
    loss.backward()        # each bucket's parameters stepped as soon as its all-reduce is done
    optimizer.step()       # steps what no bucket did (parameters DDP does not reduce); a plain step: nothing
    optimizer.zero_grad(set_to_none=True)

Why: under DDP a step's all-reduce can only hide behind the backward that is left once a bucket is ready. Where
the whole backward is one compiled graph (torch.compile with Dynamo's DDP optimizer off), every bucket is ready
only when it returns, and the all-reduce adds its whole time to the step. The optimizer, which waits for it, is
the work left: run on each bucket once that bucket is reduced, it overlaps the reduction of the buckets after it.

How: a DDP communication hook averages the bucket by all-reduce (as DDP does without a hook) and then runs the
user's own optimizer on the bucket's parameters alone (its param_groups narrowed to them for that call), so that
its class, hyperparameters (an LR scheduler's too), state and state_dict stay the user's. On CUDA the hook's step
runs on a stream that waits for the all-reduce, beside the next bucket's; DDP makes the backward's end wait for it.

What it cannot do: anything that needs every gradient before the step, such as clipping by the global norm; and
gradient accumulation must reduce only on the last micro-batch (DDP's no_sync() for the others), as it should
anyway. The gradients must be views of DDP's buckets (gradient_as_bucket_view=True), so that the bucket reduced is
the gradient the optimizer reads.
"""

from __future__ import annotations

import threading

import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook


class OverlappedOptimizer:
    """`optimizer`, stepped by DDP's buckets as they are reduced (overlap_optimizer). step() steps only the
    parameters with a gradient that no bucket stepped since the last step(); everything else (param_groups, state,
    state_dict, add_param_group, ...) is the optimizer's own."""

    def __init__(self, ddp: torch.nn.parallel.DistributedDataParallel, optimizer: torch.optim.Optimizer):
        self.optimizer = optimizer
        self._process_group = ddp.process_group
        self._stepped: set[int] = set()   # id() of the parameters a bucket stepped since the last step()
        self._lock = threading.Lock()     # gloo runs hooks' callbacks on its own threads: one narrowed step at a time

    def __getattr__(self, name):
        if name == "optimizer":   # not set yet (a copy being built): no recursion
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def step_only(self, params) -> None:
        """The optimizer's step on `params` alone: each param group narrowed to those of its parameters in
        `params` (the groups left empty left out), then put back."""
        wanted = {id(p) for p in params}
        with self._lock:
            groups = self.optimizer.param_groups
            narrowed = [{**group, "params": [p for p in group["params"] if id(p) in wanted]} for group in groups]
            self.optimizer.param_groups = [group for group in narrowed if group["params"]]
            try:
                if self.optimizer.param_groups:
                    self.optimizer.step()
            finally:   # the user's own groups back, as an LR scheduler holds and writes them
                self.optimizer.param_groups = groups
            self._stepped |= wanted

    def step(self, closure=None) -> None:
        if closure is not None:
            raise ValueError("closure: the buckets step without one; an optimizer that needs a closure (LBFGS) "
                             "cannot be overlapped")
        left = [p for group in self.optimizer.param_groups for p in group["params"]
                if p.grad is not None and id(p) not in self._stepped]
        if left:
            self.step_only(left)
        self._stepped = set()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none=set_to_none)


def _reduce_then_step(state, bucket):   # unannotated: DDP checks a hook's annotations, which are strings here
    """DDP's communication hook: the bucket (dist.GradBucket) averaged over the ranks, then its parameters stepped
    (state: the OverlappedOptimizer)."""
    params = bucket.parameters()

    def step(reduced: torch.futures.Future) -> torch.Tensor:   # on CUDA, on a stream that waits for the all-reduce
        state.step_only(params)
        return reduced.value()
    return allreduce_hook(state._process_group, bucket).then(step)


def overlap_optimizer(ddp: torch.nn.parallel.DistributedDataParallel,
                      optimizer: torch.optim.Optimizer) -> OverlappedOptimizer:
    """`optimizer` (over the parameters of the module `ddp` wraps) stepped by `ddp`'s gradient buckets as each is
    reduced; call before the first forward. Returns what the training loop steps and zeroes in its place."""
    if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
        raise TypeError(f"ddp must be a DistributedDataParallel module, got {type(ddp).__name__}")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    if not ddp.gradient_as_bucket_view:
        raise ValueError("ddp: build it with gradient_as_bucket_view=True, so that the bucket each hook reduces "
                         "is the gradient the optimizer then reads")
    reduced = {id(p) for p in ddp.module.parameters() if p.requires_grad}
    if not reduced & {id(p) for group in optimizer.param_groups for p in group["params"]}:
        raise ValueError("optimizer: none of its parameters is one of the module's that ddp reduces")
    overlapped = OverlappedOptimizer(ddp, optimizer)
    ddp.register_comm_hook(overlapped, _reduce_then_step)
    return overlapped
