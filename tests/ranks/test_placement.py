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


def test_this_process_s_facts_on_a_cpu_machine():
    facts = placement.facts()
    if hasattr(os, "sched_getaffinity"):
        assert placement.cpu_set(facts["cpus"]) == os.sched_getaffinity(0)
    if not torch.cuda.is_available():
        assert facts["gpu"] is None and facts["gpu_cpus"] is None


def test_a_gpu_s_cpus_are_the_system_s_record_of_its_pci_device(tmp_path, monkeypatch):
    device = tmp_path / "0000:1b:00.0"
    device.mkdir()
    (device / "local_cpulist").write_text("16-31\n")
    monkeypatch.setattr(placement, "PCI_DEVICES", tmp_path)
    monkeypatch.setattr("roofline.device.pci_address", lambda d, domain_digits=8: "0000:1b:00.0")
    assert placement.gpu_cpus(torch.device("cuda", 0)) == set(range(16, 32))
    monkeypatch.setattr("roofline.device.pci_address", lambda d, domain_digits=8: "0000:2c:00.0")
    assert placement.gpu_cpus(torch.device("cuda", 0)) is None   # no record: nothing said


def test_what_is_said_of_a_rank_s_placement():
    near = {"host": "a", "cpus": "16-31", "gpu": "00000000:1b:00.0", "gpu_cpus": "16-31"}
    assert placement.said(1, {1: near, 0: {**near, "cpus": "0-15", "gpu_cpus": "0-15"}}) == ""
    # unbound: every CPU, its GPU near half of them
    said = placement.said(1, {1: {**near, "cpus": "0-31"}})
    assert said.startswith("Rank 1's process may run on CPUs 0-31, and its GPU (00000000:1b:00.0) is attached near "
                           "CPUs 16-31: on CPUs 0-15 its launches cross") and "--numa-binding node" in said
    # a machine of one NUMA node (the GPU near every CPU: the lent H200 hosts), ranks sharing CPUs there, or a
    # rank recorded before these facts were kept
    one_node = {"host": "vm", "cpus": "0-31", "gpu": "00000000:00:07.0", "gpu_cpus": "0-31"}
    assert placement.said(1, {1: one_node, 0: {**one_node, "gpu": "00000000:00:06.0"}}) == ""
    assert placement.said(0, {0: None, 1: one_node}) == ""
    assert placement.said(0, {0: {**one_node, "gpu": None, "gpu_cpus": None}}) == ""
