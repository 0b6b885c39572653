"""The interconnect's ceilings in `roofline doctor`: measured over real ranks (gloo here, NCCL on the GPU machine),
cached by GPUs, topology and versions, shown at 80 columns, plotted, and written to JSON."""

import json

import pytest
from typer.testing import CliRunner

from roofline.bench.collective import KINDS
from roofline.cli import app
from roofline.device import write_cache
from roofline.distributed import interconnect

pytestmark = pytest.mark.long   # processes of their own: run first (conftest)

# `nvidia-smi topo -m` on the lent machine with 2 H100s
TOPOLOGY = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\t0-15\t0\t\tN/A
GPU1\tNV18\t X \t0-15\t0\t\tN/A

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks"""


def test_the_link_between_gpu0_and_gpu1_is_read_off_the_topology():
    assert interconnect.link(TOPOLOGY) == "NV18"
    assert interconnect.link("") is None and interconnect.link("GPU0\n") is None


def test_measured_over_two_ranks_and_cached(monkeypatch, tmp_path):
    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    found = interconnect.measure(2, kinds=("all_reduce", "send_recv"), sizes=(1024, 1 << 16), rep_ms=5)
    assert [(r["kind"], r["nbytes"]) for r in found.rows] == [("all_reduce", 1024), ("all_reduce", 1 << 16),
                                                              ("send_recv", 1024), ("send_recv", 1 << 16)]
    assert found.backend == "gloo" and found.devices == "2 x cpu" and found.p2p_gbps is None
    assert found.latency_us("all_reduce") == pytest.approx(found.rows[0]["median_ms"] * 1e3)
    assert found.peak_busbw("send_recv") == max(r["busbw_gbps"] for r in found.rows[2:])
    assert interconnect.cached(2) == found
    with pytest.raises(ValueError, match="at least 2 ranks"):
        interconnect.measure(1)
    with pytest.raises(ValueError, match="kinds"):
        interconnect.measure(2, kinds=("all_sum",))


def _row(kind, nbytes, ms, ranks=2):
    from roofline.bench.collective import CollectiveTiming

    return CollectiveTiming(kind, nbytes, ranks, "bfloat16", 10, (ms,) * 9, (ms,) * ranks, ms, ms * 0.99,
                            ms * 1.01).to_dict()


def test_doctor_shows_the_cached_interconnect_at_80_columns(monkeypatch, tmp_path):
    """What doctor prints and writes on the 2-GPU machine, from a cached measurement (no ranks started)."""
    from roofline.bench import ceilings

    monkeypatch.setenv("ROOFLINE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(interconnect, "topology", lambda: TOPOLOGY)
    monkeypatch.setattr(ceilings, "_copy_bytes", lambda dev: 16 << 20)   # the CPU's own ceilings, measured quickly
    sizes = interconnect.SIZES
    rows = [_row(kind, s, 0.02 + s / 300e6) for kind in KINDS for s in sizes]
    cached = interconnect.Interconnect(2, "2 x cpu", "gloo", TOPOLOGY, {"torch": "2.13", "nccl": None},
                                       "2026-11-27T05:00:00", rows, None)
    write_cache(interconnect.CACHE, interconnect.cache_key(2), cached.to_dict())
    out = tmp_path / "doctor.json"
    result = CliRunner().invoke(app, ["doctor", "--device", "cpu", "--nproc", "2", "--json", str(out),
                                      "--plot", str(tmp_path / "busbw.png")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.output.splitlines()) <= 80 and "…" not in result.output
    text = " ".join(result.output.split())
    assert "interconnect: 2 x cpu, gloo, GPU0-GPU1 NV18 (measured 2026-11-27T05:00:00, cached)" in text
    for kind in KINDS:
        assert kind in text
    saved = json.loads(out.read_text())["interconnect"]
    assert saved["rows"] == rows and (tmp_path / "busbw.png").stat().st_size > 0


def test_doctor_refuses_one_rank():
    result = CliRunner().invoke(app, ["doctor", "--device", "cpu", "--nproc", "1"])
    assert result.exit_code == 2 and "at least 2 ranks" in result.output
