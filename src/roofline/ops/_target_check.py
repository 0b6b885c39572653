"""The loss ops' check that every target is a class index or ignore_index, read without stopping the host.

cross_entropy and linear_cross_entropy count the targets out of range on the GPU, in their first kernel. Reading
that count at once is a host sync. Made in the middle of a training step's forward, it lets the GPU run dry while
the host launches the backward: on GPT-2's training step the fused head ran slower with the check than without
it (measured: benchmarks/results/h100-ladder.md). Made by a call without a gradient it cost a small loss several
times the host time of torch's (measured: benchmarks/results/h100-host.md). And reading it later through a copy to
pinned memory and an event still cost a small call, in Python's CUDA calls, more host time than torch's whole loss
(measured: benchmarks/results/h100-host.md, "Run of 2026-11-25 (later)"). So:

- The kernel that counts writes the count straight into a slot of pinned host memory, which the GPU reaches over
  the bus (pinned memory is mapped into every device's address space where addresses are unified, as on every
  64-bit CUDA system): the host sets the slot to -1 before the launch, and the count is there once it is not.
  A call's check costs a store and a load of host memory.
- `later` takes a slot for a call's count and hands the kernel its address; `poll` reads, at the next entry into
  either op, every count that has arrived, oldest first: usually the call's backward, or a later call. The
  ValueError is raised there, before that entry launches anything. Only when all CHECK_SLOTS slots hold counts
  still unwritten does a call wait (for the device: the count is written by then). Inside a CUDA graph's capture
  the ops skip their check (a graph would write the same slot at every replay), and the kernel writes the count
  to a scratch word on the device instead.
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

CHECK_SLOTS = 64   # calls whose counts may be in flight at once
UNWRITTEN = -1


class _Count:
    __slots__ = ("op", "slot", "counts", "device", "target", "classes", "ignore_index")

    def __init__(self, op, slot, counts, device, target, classes, ignore_index):
        # counts: the numpy view of the buffer whose element `slot` the kernel writes
        self.op, self.slot, self.counts, self.device, self.target = op, slot, counts, device, target
        self.classes, self.ignore_index = classes, ignore_index

    def written(self) -> bool:
        return self.counts[self.slot] != UNWRITTEN


class TargetChecks:
    """Counts in flight, oldest first, each in a slot of one int32 buffer in host memory (pinned where a GPU
    writes it), read through a numpy view of it: the hot path makes no tensor and calls no CUDA function."""

    def __init__(self):
        self._pending: deque[_Count] = deque()
        self._free = list(range(CHECK_SLOTS))
        self._host = {}   # pinned (for a GPU) or not: (a one-element view per slot, a numpy view of the buffer)
        self._lock = threading.Lock()   # backwards run on autograd's threads

    def later(self, op: str, device: torch.device, target: torch.Tensor, classes: int,
              ignore_index: int) -> torch.Tensor:
        """A slot for the count of a call on `device`, for its counting kernel to write: a later poll raises
        ValueError if the count finds a target out of range. The counts written by now are read first (as poll
        reads them, under the same lock): an earlier call's bad target raises before this call launches."""
        with self._lock:
            self._read_written()
            if not self._free:   # every slot in flight: wait for the oldest
                self._read(self._pending.popleft(), wait=True)
            slot = self._free.pop()
            views, counts = self._buffer(device.type == "cuda")
            counts[slot] = UNWRITTEN
            self._pending.append(_Count(op, slot, counts, device, target, classes, ignore_index))
            return views[slot]

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
        with self._lock:
            self._read_written()

    def _read_written(self) -> None:
        """Read the counts written so far, oldest first (under the lock)."""
        pending = self._pending
        while pending and pending[0].written():
            self._read(pending.popleft(), wait=False)

    def _buffer(self, pinned: bool):
        found = self._host.get(pinned)
        if found is None:
            host = torch.full((CHECK_SLOTS,), UNWRITTEN, dtype=torch.int32, pin_memory=pinned)
            found = self._host[pinned] = (list(host.split(1)), host.numpy())
        return found

    def _read(self, count: _Count, wait: bool) -> None:
        """Read a count written (waiting for its device if `wait`), free its slot, raise if it found a bad target.
        A count never written (its launch failed, and said so) is dropped."""
        if wait and not count.written() and count.device.type == "cuda":
            torch.cuda.synchronize(count.device)
        bad = int(count.counts[count.slot])
        self._free.append(count.slot)
        if bad > 0:
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


def poll_targets() -> tuple:
    """target_checks.poll() as a backward's host step (roofline.ops._eager_node.host_step), which its replays make
    again: it hands back no tensors."""
    target_checks.poll()
    return ()


def wait_for_target_checks() -> None:
    """Wait for the targets' check of every call of cross_entropy and linear_cross_entropy still in flight, and
    raise ValueError for the first that found a target out of range. A call's check is otherwise read without
    waiting, at its backward or at a later call of either op: call this after the last call of an evaluation loop
    (its loss is nan meanwhile)."""
    target_checks.wait()
