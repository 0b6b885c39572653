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


@pytest.mark.parametrize("recording", [[], ["--no-ops"]], ids=["ops", "no-ops"])
def test_profile_two_gpus_of_ddp_training(tmp_path, recording):
    """DDP's gradient all_reduces are NCCL kernels: found, sized, timed on the GPU, overlapped with the backward's
    kernels in part; a planted straggler named at its line. Without ops, the calls are read off NCCL's kernels and
    the flight recorder's records of them."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", "--nproc-per-node", "2", "--skip", "4",
                           "--steps", "3", *recording, "--json", str(out), "examples/ddp_train.py", "--steps", "9",
                           "--slow-rank", "1", "--slow-ms", "30"], cwd=root, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0, done.stderr[-3000:]
    ranks = json.loads(out.read_text())["ranks"]
    grads = [row for row in ranks["collectives"] if row["kind"] == "all_reduce"]
    assert grads and all(row["on_gpu"] and row["bytes"] and row["busbw_gbps"] for row in grads)
    assert sum(row["bytes"] * row["calls"] for row in grads) > 100e6   # GPT-2 small's gradients, bf16 or fp32
    assert all(r["comm_ms"] > 0 and r["overlap"] is not None for r in ranks["ranks"])
    assert ranks["straggler"]["rank"] == 1 and "ddp_train.py" in ranks["straggler"]["where"]
    # outside the window (steps 1, 2 and 8) NCCL timed every call: rank 0 waits for rank 1's 30 ms sleep there
    timed = ranks["unrecorded"]
    assert timed is not None and timed["calls"] >= 2 * sum(row["calls"] for row in grads)
    assert all(ms > 0 for ms in timed["comm_ms"]) and timed["straggler"] == 1
    assert 15 < ranks["straggler"]["held_ms"] < 45 and timed["waits_ms"][0] > 15


def test_a_collective_that_times_out_over_nccl_is_named_from_the_watchdog_s_record(tmp_path):
    """Rank 1 sleeps through the all_reduce rank 0 waits in: NCCL's watchdog tears rank 0 down after the group's
    5 s (no Python speaks), and the record it writes names the call; rank 1 is told where it was when stopped."""
    from roofline.distributed import hang

    with pytest.raises(RankFailed) as failed:
        spawn(fail, 2, "hang", str(tmp_path), timeout_s=5)
    said = failed.value.failures
    assert "waited out the group's timeout (5 s) in call 2 of process group default_pg (all_reduce, 16 B) at " \
           "workers.py:" in said[0], said
    assert said[1].startswith(hang.STOPPED + " workers.py:") or "never reached call 2" in said[1], said


def test_a_loss_printed_by_rank_0_alone_is_its_host_sync(tmp_path):
    """Rank 0 prints the loss every step (loss.item()): a line where its host waits for its GPU and the other
    rank's does not."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "roofline", "profile", "--nproc-per-node", "2", "--skip", "4",
                           "--steps", "3", "--json", str(out), "examples/ddp_train.py", "--steps", "9",
                           "--log-every", "1"], cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "120"})
    assert done.returncode == 0, done.stderr[-3000:]
    syncs = json.loads(out.read_text())["ranks"]["host_syncs"]
    printed = [row for row in syncs if "ddp_train.py" in row["where"]]
    assert printed and printed[0]["ranks"] == [0] and not printed[0]["every_rank"]
    assert printed[0]["calls"] == 1 and printed[0]["wait_ms"][0] > 0
    assert "host syncs" in done.stdout
