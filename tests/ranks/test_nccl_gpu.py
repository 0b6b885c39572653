"""On a machine with 2 or more GPUs: the same over NCCL, a process a GPU."""

import pytest
import torch

from roofline.bench.collective import KINDS
from roofline.distributed import RankFailed, interconnect, spawn

from .workers import every_collective, fail, nccl_settings

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs; this machine has {torch.cuda.device_count()}")


def test_every_collective_over_nccl_with_multicast_kept_off(monkeypatch):
    for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
        monkeypatch.setenv(name, {"NCCL_NVLS_ENABLE": "0"}.get(name, "1"))
    settings = spawn(nccl_settings, 2)
    assert [gpu for _, gpu in settings] == [0, 1]
    assert all(seen == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                        "NVSHMEM_DISABLE_NVLS": "1"} for seen, _ in settings)
    rows = spawn(every_collective, 2, (1 << 16, 16 << 20))[0]
    assert {r["kind"] for r in rows} == set(KINDS) and all(r["median_ms"] > 0 for r in rows)
    big = {r["kind"]: r["busbw_gbps"] for r in rows if r["nbytes"] == 16 << 20}
    assert big["all_reduce"] > 20   # NVLink: far beyond PCIe's ~25 GB/s a direction at 16 MiB (233 GB/s seen at 64 MiB)


def test_a_failed_rank_is_named_over_nccl(tmp_path):
    with pytest.raises(RankFailed, match="rank 1: ValueError: rank 1 could not go on"):
        spawn(fail, 2, "raise", str(tmp_path))


def test_the_interconnect_and_the_peer_copy(monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    found = interconnect.measure(2, kinds=("all_reduce",), sizes=(1024, 64 << 20), rep_ms=20)
    assert found.backend == "nccl" and found.devices.startswith("2 x ") and found.p2p_gbps > 20
    assert found.latency_us("all_reduce") < 1000 and interconnect.cached(2) == found
