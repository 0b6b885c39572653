"""Where a rank's process may run, against where its GPU is attached: the facts behind a straggler whose lead is
its host's.

    facts()                   # in the rank's process: {"host", "cpus", "gpu", "gpu_cpus"}
    said(rank, placements)    # what the report tells of rank's placement beside the others', or ""

A rank's host launches its GPU's work. Where its threads may run on CPUs far from its GPU (another NUMA node: each
launch and copy crosses the socket link), it can fall behind the others, and every rank then waits for it at the
next collective. The CPUs near a GPU are the system's own record of its
PCI device (sysfs local_cpulist), what `nvidia-smi topo -m` prints as its CPU affinity.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

PCI_DEVICES = Path("/sys/bus/pci/devices")


def cpu_set(text: str) -> set[int]:
    """"0-3,8,10-11" (the kernel's CPU list) -> {0, 1, 2, 3, 8, 10, 11}."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def cpu_text(cpus) -> str:
    """{0, 1, 2, 3, 8, 10, 11} -> "0-3,8,10-11"."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def gpu_cpus(device: torch.device) -> set[int] | None:
    """The CPUs the system says are near the CUDA device (its PCI device's local_cpulist: on a machine of one NUMA
    node, every CPU); None where it does not say."""
    from roofline.device import pci_address

    try:
        return cpu_set((PCI_DEVICES / pci_address(device, domain_digits=4) / "local_cpulist").read_text())
    except (OSError, ValueError, RuntimeError):
        return None


def facts() -> dict:
    """This process's placement: its host, the CPUs it may run on, and its current CUDA device with the CPUs near
    it (None on CPUs, or where the system does not say)."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    out = {"host": socket.gethostname(), "cpus": cpu_text(cpus), "gpu": None, "gpu_cpus": None}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        from roofline.device import pci_address

        device = torch.device("cuda", torch.cuda.current_device())
        near = gpu_cpus(device)
        out.update(gpu=pci_address(device), gpu_cpus=cpu_text(near) if near else None)
    return out


def said(rank: int, placements: dict[int, dict]) -> str:
    """What the report says of `rank`'s placement (placements: each rank's facts(), by rank; a rank recorded
    before these facts were kept has none): the CPUs it may run on that are not near its GPU. "" where there is
    nothing to say: bound near its GPU, or on a machine of one NUMA node (the lent H200 hosts: pinning each rank
    to cores of its own gained nothing measurable on an H100 host of one node, benchmarks/results/
    h100x2-distributed.md, so ranks merely sharing CPUs get no advice)."""
    mine = placements.get(rank)
    if not mine or not mine.get("cpus") or not mine.get("gpu_cpus"):
        return ""
    far = cpu_set(mine["cpus"]) - cpu_set(mine["gpu_cpus"])
    if not far:
        return ""
    return (f"Rank {rank}'s process may run on CPUs {mine['cpus']}, and its GPU ({mine['gpu']}) is attached near CPUs "
            f"{mine['gpu_cpus']}: on CPUs {cpu_text(far)} its launches cross to another NUMA node. torchrun "
            "--numa-binding node binds each rank near its GPU (PyTorch's notes report 1-10% gains, more for some "
            "programs).")
