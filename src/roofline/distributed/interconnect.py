"""The interconnect's measured ceilings: what `roofline doctor` measures on a machine with several GPUs.

One process per GPU, started here (launch.spawn), times each collective over message sizes from 1 KiB to 1 GiB
(bench.time_collective: the slowest rank's time, median and 95% interval over rounds), with algbw and busbw as
nccl-tests defines them; the smallest message's time is the latency. The peer-to-peer copy bandwidth (one GPU's
memory to another's, one direction) is timed in this process. The results are cached with the other ceilings,
keyed by the GPU count and model, the topology (`nvidia-smi topo -m`), and the torch and NCCL versions.

On CPUs the same runs over gloo (`roofline doctor --nproc 2`), which is how the tests check it.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass, field

import torch

from roofline.bench.collective import KINDS, time_collective
from roofline.distributed import ledger
from roofline.distributed.launch import backend, spawn

SIZES = tuple(1 << k for k in range(10, 31, 2))       # 1 KiB to 1 GiB, by 4x
CACHE = "interconnect.json"


@dataclass
class Interconnect:
    ranks: int
    devices: str                  # "2 x NVIDIA H100 80GB HBM3", or "2 x cpu"
    backend: str
    topology: str                 # nvidia-smi topo -m, as printed
    versions: dict
    measured_at: str
    rows: list = field(default_factory=list)    # CollectiveTiming.to_dict() for each kind and size
    p2p_gbps: float | None = None                # one GPU's memory to another's, one direction
    environment: dict | None = None   # the NCCL settings it was measured with (ledger.environment); None in a
                                      # measurement older than roofline's keeping them

    def sizes(self, kind: str) -> dict[int, dict]:
        """kind's rows by the size asked for."""
        return {r.get("size", r["nbytes"]): r for r in self.rows if r["kind"] == kind}

    def peak_busbw(self, kind: str) -> float | None:
        """The best bus bandwidth over the sizes measured (the largest messages', in practice)."""
        found = [r["busbw_gbps"] for r in self.rows if r["kind"] == kind]
        return max(found) if found else None

    def busbw_at(self, kind: str, nbytes: int) -> float | None:
        """The bus bandwidth measured for a message of nbytes: between the two sizes measured around it, linear in
        the size's logarithm (the ends beyond the sizes measured); None where kind was not measured."""
        points = sorted((r["nbytes"], r["busbw_gbps"]) for r in self.rows if r["kind"] == kind and r["nbytes"] > 0)
        if not points:
            return None
        if nbytes <= points[0][0]:
            return points[0][1]
        for (x0, y0), (x1, y1) in zip(points, points[1:]):
            if nbytes <= x1:
                t = math.log(nbytes / x0) / math.log(x1 / x0) if x1 > x0 else 1.0
                return y0 + t * (y1 - y0)
        return points[-1][1]

    def latency_us(self, kind: str) -> float | None:
        """The smallest message's time."""
        found = self.sizes(kind)
        return found[min(found)]["median_ms"] * 1e3 if found else None

    def to_dict(self) -> dict:
        return asdict(self)


def topology() -> str:
    """`nvidia-smi topo -m` (which GPUs are linked by what), or "" where it cannot be read."""
    if shutil.which("nvidia-smi") is None:
        return ""
    try:
        done = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return re.sub(r"\x1b\[[0-9;]*m", "", done.stdout).strip() if done.returncode == 0 else ""   # no terminal styling


def _devices(ranks: int) -> str:
    if backend() == "gloo":
        return f"{ranks} x cpu"
    names = {torch.cuda.get_device_name(i) for i in range(ranks)}
    return f"{ranks} x {' / '.join(sorted(names))}"


def _versions() -> dict:
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None
    return {"torch": torch.__version__, "nccl": nccl}


def cache_key(ranks: int) -> str:
    """What a measurement holds for: the GPUs, how they are linked, and the software moving data between them."""
    topo = hashlib.sha256(topology().encode()).hexdigest()[:12]
    versions = _versions()
    return f"{_devices(ranks)}|topology {topo}|torch {versions['torch']}|nccl {versions['nccl']}"


def _sweep(kinds: tuple, sizes: tuple, rep_ms: float) -> list[dict]:
    """On each rank: every kind at every size (the same results on every rank)."""
    dtype = torch.bfloat16 if torch.cuda.is_available() else torch.float32
    # each row keeps the size asked for: time_collective rounds it to whole elements a rank (3 ranks: 1 MiB - 4 B)
    return [{**time_collective(kind, size, dtype=dtype, rep_ms=rep_ms).to_dict(), "size": size}
            for kind in kinds for size in sizes]


def peer_copy_gbps(nbytes: int = 256 << 20) -> float | None:
    """GB/s of a copy from GPU 0's memory to GPU 1's (bench.time: median of timed copies); None with under 2."""
    if torch.cuda.device_count() < 2:
        return None
    from roofline.bench import time as bench_time

    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda:1")
    m = bench_time(dst.copy_, src, device="cuda:0", flush=False, warn=False)
    return nbytes / (m.median * 1e-3) / 1e9


def measure(ranks: int | None = None, *, kinds: tuple = KINDS, sizes: tuple = SIZES, rep_ms: float = 50.0,
            save: bool = True) -> Interconnect:
    """Time every collective over `ranks` processes (default: one a GPU), and the peer-to-peer copy."""
    ranks = ranks or torch.cuda.device_count()
    if ranks < 2:
        raise ValueError(f"ranks: the interconnect needs at least 2 ranks, got {ranks} (a machine with one GPU has "
                         "no interconnect to measure)")
    unknown = set(kinds) - set(KINDS)
    if unknown:
        raise ValueError(f"kinds: {sorted(unknown)} are not collectives timed here ({', '.join(KINDS)})")
    rows = spawn(_sweep, ranks, tuple(kinds), tuple(sizes), rep_ms)[0]
    found = Interconnect(ranks, _devices(ranks), backend(), topology(), _versions(),
                         datetime.datetime.now().isoformat(timespec="seconds"), rows, peer_copy_gbps(),
                         ledger.environment())
    if save:
        from roofline.device import write_cache

        write_cache(CACHE, cache_key(ranks), found.to_dict())
    return found


def cached(ranks: int | None = None) -> Interconnect | None:
    """The measurement of this machine's interconnect with this software, if one was made."""
    from roofline.device import read_cache

    ranks = ranks or torch.cuda.device_count()
    found = read_cache(CACHE).get(cache_key(ranks))
    return Interconnect(**found) if found else None


# ------------------------------------------------------------------ the report

def link(topology_text: str) -> str | None:
    """How GPU 0 reaches GPU 1 in `nvidia-smi topo -m` ("NV18": 18 NVLinks; "SYS", "PHB", ...: through PCIe)."""
    lines = [line.split() for line in topology_text.splitlines() if line.strip()]
    if not lines or "GPU1" not in lines[0]:
        return None
    column = lines[0].index("GPU1") + 1   # rows carry their own name first
    row = next((line for line in lines[1:] if line[0] == "GPU0"), None)
    return row[column] if row and len(row) > column else None


def _size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def render(found: Interconnect, console, note: str) -> None:
    """The measurement as a table: each collective's latency, bus bandwidth at a few sizes, and its best."""
    from roofline.tables import Column, Row, show

    shown = [s for s in (1 << 20, 64 << 20, 256 << 20, 1 << 30) if any(r.get("size", r["nbytes"]) == s
                                                                         for r in found.rows)]
    rows = []
    for kind in dict.fromkeys(r["kind"] for r in found.rows):
        by_size = found.sizes(kind)
        rows.append(Row([kind, f"{found.latency_us(kind):,.1f}",
                         *(f"{by_size[s]['busbw_gbps']:,.1f}" if s in by_size else "" for s in shown),
                         f"{found.peak_busbw(kind):,.1f}"]))
    linked = link(found.topology)
    title = (f"interconnect: {found.devices}, {found.backend}"
             + (f" {found.versions['nccl']}" if found.versions.get("nccl") else "")
             + (f", GPU0-GPU1 {linked}" if linked else "") + f" ({note})")
    show(console, title, [Column("collective", justify="left"), Column("latency us", "lat us"),
                          *(Column(f"busbw {_size(s)}", _size(s)) for s in shown),
                          Column("busbw peak GB/s", "peak")], rows)
    console.print("bus bandwidth in GB/s as nccl-tests defines it (all_reduce: algbw x 2(n-1)/n); latency: the "
                  f"{_size(min(r.get('size', r['nbytes']) for r in found.rows))} message through torch.distributed, the host's "
                  "time to issue it included; each the slowest rank's median")
    if found.p2p_gbps:
        console.print(f"peer copy, GPU 0 to GPU 1: {found.p2p_gbps:,.1f} GB/s")


def plot(found: Interconnect, path) -> str:
    """Bus bandwidth against message size, a line per collective, the best measured as a dashed ceiling."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    best = 0.0
    for kind in dict.fromkeys(r["kind"] for r in found.rows):
        by_size = sorted(found.sizes(kind).items())
        ax.plot([s for s, _ in by_size], [r["busbw_gbps"] for _, r in by_size], marker="o", label=kind)
        best = max(best, found.peak_busbw(kind) or 0.0)
    ax.axhline(best, linestyle="--", color="gray", label=f"best measured: {best:,.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{found.devices}, {found.backend}")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return str(path)
