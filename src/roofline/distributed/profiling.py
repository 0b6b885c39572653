"""`roofline profile` on a program of several ranks.

Two ways in, one recording:
    roofline profile --nproc-per-node N train.py ARGS          roofline starts the ranks, as torchrun does
    torchrun --nproc-per-node N -m roofline profile train.py    the user starts them (rendezvous options and all)

Each rank runs the program under its own profiler, on the same steps (`--skip`, `--steps`: a step is an
optimizer.step(), the same count on every rank), and writes its trace as rank<R>.json.gz into one folder: the one
the launcher made, or under torchrun a folder named by the run's id (TORCHELASTIC_RUN_ID) in the temporary
directory, which the ranks of one host share (`--rank-dir` names one for several hosts: a shared file system).
Then the traces are read together (distributed.merge): by the launcher once every rank has ended, or under torchrun
by rank 0, which waits for the others' traces.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

RANK_WAIT_S = 300.0   # how long rank 0 waits, under torchrun, for the other ranks' traces after its own
LAUNCHED = "ROOFLINE_RANKS_LAUNCHED"   # set for the ranks `--nproc-per-node` starts: the launcher reports them


def under_torchrun() -> tuple[int, int] | None:
    """(rank, world size) where this process is one rank of several started by torchrun, else None."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return (int(os.environ.get("RANK", "0")), world) if world > 1 and "RANK" in os.environ else None


def default_dir() -> Path:
    """The folder the ranks of one torchrun job share on a host: named by the job's run id and rendezvous port
    (plain torchrun's run id is "none" for every job: wait_for tells this job's traces by their time)."""
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}-{os.environ.get('MASTER_PORT', '0')}"
    return Path(tempfile.gettempdir()) / f"roofline-ranks-{run}"


def started() -> float:
    """When this rank's recording began (wall clock), for telling its job's traces from an earlier job's; a rank's
    own earlier trace is removed (a stale one must never pass for this run's)."""
    return time.time()


def forget_earlier(folder: Path, rank: int) -> None:
    trace_path(folder, rank).unlink(missing_ok=True)


def trace_path(folder: Path, rank: int) -> Path:
    return Path(folder) / f"rank{rank}.json.gz"


def partial_path(folder: Path, rank: int) -> Path:
    """Where a rank writes its trace before moving it to trace_path (so a reader never sees half a file)."""
    return Path(folder) / f".rank{rank}.partial.json.gz"


def publish(folder: Path, rank: int) -> None:
    os.replace(partial_path(folder, rank), trace_path(folder, rank))


def wait_for(folder: Path, world: int, timeout_s: float = RANK_WAIT_S,
             since: float = 0.0) -> tuple[dict[int, Path], list[int]]:
    """The ranks' traces once every one is there, or at the timeout: ({rank: trace}, ranks missing). A trace
    written before `since` (an earlier job's, in a folder reused) counts as missing."""
    deadline = time.monotonic() + timeout_s

    def fresh(path: Path) -> bool:
        return path.exists() and path.stat().st_mtime >= since - 60   # 60 s: clocks of hosts sharing the folder

    while True:
        found = {r: trace_path(folder, r) for r in range(world) if fresh(trace_path(folder, r))}
        missing = [r for r in range(world) if r not in found]
        if not missing or time.monotonic() > deadline:
            return found, missing
        time.sleep(0.2)


@dataclass(frozen=True)
class Rendezvous:
    """How the hosts of a job meet, in torchrun's terms (its --nnodes, --rdzv-endpoint, --rdzv-id, --rdzv-backend,
    --node-rank). One host by default: a fresh port on localhost and a run id of its own. A bad value raises
    ValueError("FIELD: why")."""
    nnodes: int = 1
    endpoint: str = "localhost:0"
    run_id: str | None = None   # the same on every host; None: torchrun's "none" (several hosts), a new one (one)
    backend: str = "c10d"
    node_rank: int | None = None   # the static backend's: this host's place; c10d's rendezvous assigns it

    def __post_init__(self):
        if self.nnodes < 1:
            raise ValueError(f"nnodes: at least 1, got {self.nnodes}")
        if self.backend not in ("c10d", "static"):
            raise ValueError(f"rdzv_backend: c10d or static, got {self.backend!r}")
        port = self.endpoint.rpartition(":")[2]
        if self.nnodes > 1 and (not port.isdigit() or int(port) == 0):
            raise ValueError(f"rdzv_endpoint: the hosts meet at one HOST:PORT they all reach, got {self.endpoint!r}")
        if self.backend == "static" and (self.node_rank is None or not 0 <= self.node_rank < self.nnodes
                                         or self.endpoint.endswith(":0")):
            raise ValueError("node_rank: the static rendezvous needs each host's place (0 to nnodes - 1) and "
                             "--rdzv-endpoint (rank 0's host:port)")
        if self.backend != "static" and self.node_rank is not None:
            raise ValueError("node_rank: only the static rendezvous takes it (c10d's assigns each host's place)")


def launch(nproc: int, rank_argv: list[str], folder: Path, rendezvous: Rendezvous = Rendezvous()) -> list[int]:
    """Start `nproc` ranks on this host, as torchrun starts them, each running `python -m roofline profile
    --rank-dir FOLDER ...` (rank_argv: the options and the program), joining the job's other hosts where
    `rendezvous` names several. Returns the global ranks this host ran; raises RankFailed naming the ranks that
    failed, with the others stopped."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from roofline.distributed.launch import one_thread_a_rank, quiet_launcher, rank_failed, signals_said

    config = LaunchConfig(min_nodes=rendezvous.nnodes, max_nodes=rendezvous.nnodes, nproc_per_node=nproc,
                          # several hosts meet under one id: torchrun's default, "none", where none is given
                          run_id=rendezvous.run_id or ("none" if rendezvous.nnodes > 1 else str(uuid.uuid4())),
                          rdzv_backend=rendezvous.backend,
                          rdzv_endpoint=rendezvous.endpoint, max_restarts=0, monitor_interval=0.1,
                          rdzv_configs={"rank": rendezvous.node_rank} if rendezvous.backend == "static" else {})
    with quiet_launcher(), one_thread_a_rank(nproc), signals_said():
        try:
            ran = elastic_launch(config, sys.executable)("-m", "roofline", "profile", "--rank-dir", str(folder),
                                                         *rank_argv)
        except ChildFailedError as exc:
            raise rank_failed(exc.failures, folder, nproc * rendezvous.nnodes) from None
    return sorted(ran)


def hosts() -> int:
    """Under torchrun: how many hosts the job's ranks run on (every host runs as many: torchrun's rule)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)) or world)
    return max(1, world // max(local, 1))


def write_merged_trace(paths: dict[int, Path], offsets_us: list[float], out: Path) -> None:
    """One Chrome/Perfetto trace of every rank: each rank's processes renamed "rank R: ..." and numbered apart,
    its flow arrows (a launch to its kernel) kept to their rank, its times moved onto the first rank's clock."""
    events = []
    for (rank, path), offset in zip(sorted(paths.items()), offsets_us):
        with gzip.open(path, "rt") as f:
            data = json.load(f)
        pids: dict = {}
        for e in data.get("traceEvents", []):
            pid = pids.setdefault(e.get("pid"), rank * 1000 + len(pids))
            e = {**e, "pid": pid}
            if "ts" in e and isinstance(e["ts"], (int, float)):
                e["ts"] = e["ts"] - offset
            if e.get("ph") in ("s", "t", "f") and "id" in e:
                e["id"] = f"{rank}:{e['id']}"
            if e.get("ph") == "M" and e.get("name") == "process_name":
                e["args"] = {"name": f"rank {rank}: {(e.get('args') or {}).get('name', '')}"}
            events.append(e)
        for original, pid in pids.items():
            events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}})
    opener = gzip.open if out.suffix == ".gz" else open
    with opener(out, "wt") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
