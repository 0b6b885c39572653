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
    # unbound: every CPU, its GPU near half of them; another rank on another host shares no CPU of this one's
    loose = {**near, "cpus": "0-31"}
    said = placement.said(1, {1: loose, 0: {**loose, "host": "b"}})
    assert said.startswith("Rank 1's process may run on CPUs 0-31, and its GPU (00000000:1b:00.0) is attached near "
                           "CPUs 16-31") and "shares" not in said
    # two ranks on one host, on overlapping CPUs, each near its GPU
    said = placement.said(1, {1: {**near, "cpus": "12-31"}, 0: {**near, "cpus": "0-15", "gpu_cpus": "0-15"},
                              2: {**near, "cpus": "30-40"}})
    assert "It shares CPUs 12-15,30-31 with ranks 0, 2 on a" in said
    # a machine of one NUMA node (the GPU near every CPU), or ranks recorded before these facts were kept
    assert placement.said(0, {0: {**loose, "gpu_cpus": "0-31"}}) == ""
    assert placement.said(0, {0: None, 1: loose}) == ""
