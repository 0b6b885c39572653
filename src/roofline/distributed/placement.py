"""Where a rank's process may run, against where its GPU is attached: the facts behind a straggler whose lead is
its host's.

    facts()             # in the rank's process: {"host", "cpus", "gpu", "gpu_cpus"}
    said(rank, facts)   # what the report tells of that rank's placement, or ""

A rank's host launches its GPU's work. Where its threads may run on CPUs far from its GPU (another NUMA node: each
launch and copy crosses the socket link), it can fall behind the others, and every rank then waits for it at the
next collective. The CPUs near a GPU are the system's own record of its PCI device (sysfs local_cpulist), what
`nvidia-smi topo -m` prints as its CPU affinity.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import torch

from roofline.device import pci_address

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
    try:
        return cpu_set((PCI_DEVICES / pci_address(device, domain_digits=4) / "local_cpulist").read_text())
    except (OSError, ValueError, RuntimeError):
        return None


def facts() -> dict:
    """This process's placement: its host, the CPUs it may run on, and its current CUDA device with the CPUs near
    it. The GPU is None on CPUs, and where the current device is not the local rank's: a program that picks its GPU
    by torch.device("cuda", LOCAL_RANK) without torch.cuda.set_device runs on a device this process cannot name."""
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    out = {"host": socket.gethostname(), "cpus": cpu_text(cpus), "gpu": None, "gpu_cpus": None}
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return out
    current = torch.cuda.current_device()
    if "LOCAL_RANK" in os.environ and int(os.environ["LOCAL_RANK"]) % torch.cuda.device_count() != current:
        return out
    try:
        device = torch.device("cuda", current)
        near = gpu_cpus(device)
        out.update(gpu=pci_address(device), gpu_cpus=cpu_text(near) if near else None)
    except RuntimeError:   # the device's properties unreadable: nothing said of its placement
        pass
    return out


def said(rank: int, facts: dict | None) -> str:
    """What the report says of the placement of `rank`, whose facts() these are (None: recorded before they were
    kept): the CPUs it may run on that are not near its GPU. "" where there is nothing to say: bound near its GPU,
    or on a machine of one NUMA node (the lent H200 hosts). Ranks merely sharing CPUs get no advice: pinning each
    to cores of its own gained nothing measurable on an H100 host of one node (benchmarks/results/
    h100x2-distributed.md)."""
    if not facts or not facts.get("cpus") or not facts.get("gpu_cpus"):
        return ""
    far = cpu_set(facts["cpus"]) - cpu_set(facts["gpu_cpus"])
    if not far:
        return ""
    return (f"Rank {rank}'s process may run on CPUs {facts['cpus']}, and its GPU ({facts['gpu']}) is attached near "
            f"CPUs {facts['gpu_cpus']}: on CPUs {cpu_text(far)} its launches cross to another NUMA node. torchrun "
            "--numa-binding node binds each rank near its GPU (PyTorch's notes report 1-10% gains, more for some "
            "programs).")
