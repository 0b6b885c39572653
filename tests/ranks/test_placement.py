"""distributed.placement: the kernel's CPU lists read and written, and what is said of a rank's placement."""

import os

import pytest
import torch

from roofline.distributed import placement


@pytest.mark.parametrize("text, cpus", [("0-3,8,10-11", {0, 1, 2, 3, 8, 10, 11}), ("5", {5}), ("", set()),
                                        ("0-1\n", {0, 1})])
def test_cpu_lists_read_and_written_back(text, cpus):
    assert placement.cpu_set(text) == cpus
    assert placement.cpu_set(placement.cpu_text(cpus)) == cpus
    assert placement.cpu_text(cpus) == text.strip()


def test_this_process_s_facts():
    facts = placement.facts()
    if hasattr(os, "sched_getaffinity"):
        assert placement.cpu_set(facts["cpus"]) == os.sched_getaffinity(0)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        assert facts["gpu"] is not None
    else:
        assert facts["gpu"] is None and facts["gpu_cpus"] is None


def test_a_gpu_s_cpus_are_the_system_s_record_of_its_pci_device(tmp_path, monkeypatch):
    device = tmp_path / "0000:1b:00.0"   # sysfs writes the PCI domain in 4 digits (NVML in 8)
    device.mkdir()
    (device / "local_cpulist").write_text("16-31\n")
    monkeypatch.setattr(placement, "PCI_DEVICES", tmp_path)
    monkeypatch.setattr(placement, "pci_address", lambda d, domain_digits=8: f"{0:0{domain_digits}x}:1b:00.0")
    assert placement.gpu_cpus(torch.device("cuda", 0)) == set(range(16, 32))
    monkeypatch.setattr(placement, "pci_address", lambda d, domain_digits=8: f"{0:0{domain_digits}x}:2c:00.0")
    assert placement.gpu_cpus(torch.device("cuda", 0)) is None   # no record: nothing said


def test_a_gpu_this_process_cannot_name_is_left_unsaid(monkeypatch):
    """A rank that runs on torch.device("cuda", LOCAL_RANK) without set_device: its current device is another."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(placement, "pci_address", lambda d, domain_digits=8: f"0000:{d.index}b:00.0")
    monkeypatch.setattr(placement, "gpu_cpus", lambda d: set(range(16 * d.index, 16 * d.index + 16)))
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert placement.facts()["gpu"] is None
    monkeypatch.setenv("LOCAL_RANK", "0")
    assert placement.facts()["gpu"] == "0000:0b:00.0" and placement.facts()["gpu_cpus"] == "0-15"


def test_what_is_said_of_a_rank_s_placement():
    near = {"host": "a", "cpus": "16-31", "gpu": "00000000:1b:00.0", "gpu_cpus": "16-31"}
    assert placement.said(1, near) == ""
    # unbound: every CPU, its GPU near half of them
    said = placement.said(1, {**near, "cpus": "0-31"})
    assert said.startswith("Rank 1's process may run on CPUs 0-31, and its GPU (00000000:1b:00.0) is attached near "
                           "CPUs 16-31: on CPUs 0-15 its launches cross") and "--numa-binding node" in said
    # a machine of one NUMA node (the GPU near every CPU: the lent H200 hosts), a rank recorded before these facts
    # were kept, or one whose GPU was not named
    assert placement.said(1, {"host": "vm", "cpus": "0-31", "gpu": "00000000:00:07.0", "gpu_cpus": "0-31"}) == ""
    assert placement.said(0, None) == ""
    assert placement.said(0, {**near, "cpus": "0-31", "gpu": None, "gpu_cpus": None}) == ""
