"""The loss ops' check that every target is a class index or ignore_index, read without stopping the host.

cross_entropy and linear_cross_entropy count the targets out of range on the GPU, in their first kernel (stats[1]).
Reading that count at once is a host sync. Made in the middle of a training step's forward, it lets the GPU run dry
while the host launches the backward: on GPT-2's step at 8 x 1024 tokens, the fused head with the check took 32.4
ms against 29.3 without it (benchmarks/results/h100-ladder.md). Made by a call without a gradient it cost a small
loss 2.3-3.3x the host time of torch's (benchmarks/results/h100-host.md). So no call waits for it:

- `later` records the count: it goes to pinned host memory behind an event, and `poll` reads it at the first later
  entry into either op at which the GPU has written it: the call's backward, usually, or a later call. The
  ValueError is raised there, before that entry launches anything. Only when all CHECK_SLOTS slots hold counts
  still unwritten does a call wait, for the oldest. Inside a CUDA graph's capture nothing is read (the ops skip
  their check there, and poll queries no event): counts in flight are read after it. With the check read later,
  the fused head's step took 23.1 ms in a later run of the same ladder.
- `wait` (roofline.ops.wait_for_target_checks) waits for every count in flight and raises for the first bad one:
  for the last call of an evaluation loop, which no later call follows.

A bad target's loss and gradient rows are nan meanwhile (the kernels are safe with any target), so that a call whose
error has not been raised yet still gives a result that says so. torch's own CUDA kernel stops the process with a
device-side assert instead, also reported after the call returned.
"""

from __future__ import annotations

import threading
from collections import deque

import torch

CHECK_SLOTS = 8   # calls whose counts may be in flight at once


class _Count:
    __slots__ = ("op", "slot", "event", "stats", "target", "classes", "ignore_index")

    def __init__(self, op, slot, event, stats, target, classes, ignore_index):
        # event: reached once the count is in the slot's row of pinned memory; None on the CPU, where stats (the
        # count itself) is written before the launch returns
        self.op, self.slot, self.event, self.stats, self.target = op, slot, event, stats, target
        self.classes, self.ignore_index = classes, ignore_index


class TargetChecks:
    """Counts in flight, oldest first. Every slot's count lands in one pinned [CHECK_SLOTS, 2] buffer, read through
    a numpy view of it: the hot path makes no tensor views and calls no tensor methods but the copy."""

    def __init__(self):
        self._pending: deque[_Count] = deque()
        self._free = list(range(CHECK_SLOTS))
        self._host = self._rows = self._counts = None   # the pinned buffer, its rows, its numpy view (GPU only)
        self._events = [None] * CHECK_SLOTS
        self._lock = threading.Lock()   # backwards run on autograd's threads

    def later(self, op: str, stats: torch.Tensor, target: torch.Tensor, classes: int, ignore_index: int) -> None:
        """Have a later poll raise ValueError if the count in stats finds a target out of range."""
        with self._lock:
            if not self._free:   # every slot in flight: wait for the oldest
                self._read(self._pending.popleft(), wait=True)
            slot = self._free.pop()
            event = None
            if stats.is_cuda:
                if self._host is None:
                    self._host = torch.empty(CHECK_SLOTS, 2, dtype=torch.int32, pin_memory=True)
                    self._rows, self._counts = list(self._host), self._host.numpy()
                if self._events[slot] is None:
                    self._events[slot] = torch.cuda.Event()
                event = self._events[slot]
                self._rows[slot].copy_(stats, non_blocking=True)
                index = stats.device.index
                # behind the copy, on its stream: the current device's, unless stats is on another one
                event.record(None if index == torch.cuda.current_device() else torch.cuda.current_stream(index))
            self._pending.append(_Count(op, slot, event, stats if event is None else None, target, classes,
                                        ignore_index))

    def wait(self) -> None:
        """Wait for every count in flight; raise ValueError for the oldest that found a target out of range."""
        with self._lock:
            while self._pending:
                self._read(self._pending.popleft(), wait=True)

    def poll(self) -> None:
        """Raise ValueError for the oldest count the GPU has written that found a target out of range; forget every
        count written. Costs nothing with none pending."""
        if not self._pending:
            return
        if self._pending[0].event is not None and torch.cuda.is_current_stream_capturing():
            return   # no event is queried inside a CUDA graph's capture: the counts are read after it
        with self._lock:
            while self._pending and (self._pending[0].event is None or self._pending[0].event.query()):
                self._read(self._pending.popleft(), wait=False)

    def _read(self, count: _Count, wait: bool) -> None:
        """Read a count written (waiting for it if `wait`), free its slot, raise if it found a bad target."""
        if count.event is None:
            bad = int(count.stats[1])
        else:
            if wait:
                count.event.synchronize()
            bad = int(self._counts[count.slot, 1])
        self._free.append(count.slot)
        if bad:
            raise_for_target_out_of_range(count.op, count.target, count.classes, count.ignore_index)


def raise_for_target_out_of_range(op: str, target: torch.Tensor, classes: int, ignore_index: int) -> None:
    when = (f" (found after that call of {op} returned: the targets are checked without waiting for the GPU, and "
            "that call's loss for the row is nan)")
    bad = (((target < 0) | (target >= classes)) & (target != ignore_index)).nonzero()
    if not len(bad):   # the tensor changed since the call
        raise ValueError(f"{op}: a target was not a class index in [0, {classes}) and not ignore_index "
                         f"({ignore_index}){when}")
    index = int(bad[0, 0])
    raise ValueError(f"{op}: target[{index}] = {int(target[index])} is not a class index in [0, {classes}) and not "
                     f"ignore_index ({ignore_index}){when}")


target_checks = TargetChecks()


def wait_for_target_checks() -> None:
    """Wait for the targets' check of every call of cross_entropy and linear_cross_entropy still in flight, and
    raise ValueError for the first that found a target out of range. A call's check is otherwise read without
    waiting, at its backward or at a later call of either op: call this after the last call of an evaluation loop
    (its loss is nan meanwhile)."""
    target_checks.wait()
