"""Starting ranks on this host as torchrun starts them: torch.distributed.run's elastic launcher, a process a rank,
RANK / LOCAL_RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set by its rendezvous (c10d, on localhost).

    results = spawn(measure, 2, sizes)        # measure(sizes) on ranks 0 and 1; their results in rank order

Each rank joins the default process group (NCCL with a GPU a rank, gloo on CPUs) before the function runs, and
leaves it after. A rank that raises or dies stops the others (the launcher terminates them: no process is left
running) and `RankFailed` names it, with its exit status and its error. A collective that waits longer than
`timeout_s` for a rank fails on the ranks that waited (the process group's timeout), and is reported the same way,
with the call each rank waited in and the line each stopped rank was at (distributed.hang).
The environment is the parent's, inherited whole (NCCL settings included: on the lent machines NVLink multicast
is off, NCCL_NVLS_ENABLE=0, and stays off in every rank), with torchrun's one addition: where several ranks share
the host and OMP_NUM_THREADS is not set, it is 1 in each (one_thread_a_rank).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import signal
import tempfile
import threading
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from roofline.distributed import hang


class RankFailed(RuntimeError):
    """A rank raised, died or timed out; the others were stopped."""

    def __init__(self, failures: dict[int, str], stopped: frozenset = frozenset(), here: tuple = ()):
        self.failures = failures   # rank -> what happened to it
        self.here = here           # the ranks this host ran that failed or were stopped (the launcher's record)
        said = "; ".join(f"rank {rank}: {why}" for rank, why in failures.items())
        super().__init__(f"{len(set(failures) - stopped)} of the ranks failed, and the others were stopped: {said}")


class Interrupted(RuntimeError):
    """The launcher was signalled (Ctrl-C, SIGTERM) and stopped every rank. No RankFailed: a ladder that climbs on
    after a strategy's failure stops here."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}: every rank was stopped")
        self.signum = signum


@contextlib.contextmanager
def signals_said():
    """A signal to the launcher (torch's elastic agent stops the ranks, then raises its SignalException with a
    traceback of 60 lines; a Ctrl-C before it has started them is a KeyboardInterrupt) as Interrupted; and the
    process's own handlers back afterwards (the agent leaves its own in place, in the main thread, where it sets
    them: a Ctrl-C while the traces were read raised its SignalException there)."""
    from torch.distributed.elastic.multiprocessing.api import SignalException

    main = threading.current_thread() is threading.main_thread()
    caught = [s for s in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, s)] if main else []
    saved = {s: signal.getsignal(getattr(signal, s)) for s in caught}
    try:
        yield
    except SignalException as exc:
        raise Interrupted(int(exc.sigval)) from None
    except KeyboardInterrupt:
        raise Interrupted(signal.SIGINT) from None
    finally:
        for name, handler in saved.items():
            # None: a handler set outside Python, which Python cannot put back: the default then
            signal.signal(getattr(signal, name), signal.SIG_DFL if handler is None else handler)


def backend() -> str:
    """The process group's backend here: NCCL where CUDA is, else gloo."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def _in_group(fn, backend_name: str, timeout_s: float, reports: str, args: tuple):
    """A rank's life: join the default group (its GPU its local rank's), run fn(*args), leave. An exception is
    noted in `reports` (a folder) with the time it was raised, so that the rank whose error came first, the cause,
    is told from the ranks that failed because it did."""
    rank = int(os.environ["RANK"])
    hang.arm(reports, rank)
    try:
        if backend_name == "nccl":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        dist.init_process_group(backend_name, timeout=datetime.timedelta(seconds=timeout_s),
                                **({"device_id": torch.device("cuda", torch.cuda.current_device())}
                                   if backend_name == "nccl" else {}))
        result = fn(*args)
    except BaseException as exc:   # noted while still in the group: leaving it fails the ranks that wait on this one
        note_error(reports, rank, exc)
        hang.note(reports, rank, exc)   # then, while there is time, the collective it failed in
        raise
    dist.destroy_process_group()
    hang.disarm(reports, rank)
    return result


@contextlib.contextmanager
def quiet_launcher():
    """The launcher logs each failure as it handles it, in its own format; RankFailed says it once, plainly."""
    loggers = [logging.getLogger(name) for name in ("torch.distributed.elastic", "torch.multiprocessing")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


@contextlib.contextmanager
def one_thread_a_rank(nproc: int):
    """torchrun's rule while ranks start: with several on this host and OMP_NUM_THREADS not set, each rank's torch
    runs its CPU ops on one thread. Otherwise every rank starts a thread per core: on a 2-core machine two gloo
    ranks of examples/ddp_train.py stepped in 21.7-37.3 ms against 12.0-13.4 with one thread each."""
    if nproc <= 1 or "OMP_NUM_THREADS" in os.environ:
        yield
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield
    finally:
        os.environ.pop("OMP_NUM_THREADS", None)


ERROR_CHARS = 240   # of a rank's error in what the launcher says (gloo's lost peer alone is 200 and more)


def note_error(reports: Path, rank: int, error: BaseException) -> None:
    """Note the rank's error in `reports` with the time it was raised, so that the rank whose error came first, the
    cause, is told from the ranks that failed because it did (what_failed): its lines in one, at most ERROR_CHARS.
    Written whole or not at all: the launcher may kill this rank mid-write (a rank that waited on one that died
    fails just as the launcher stops the rest), and a half-written note would hide every rank's cause."""
    # its lines in one (NCCL's DistBackendError gives the cause on a later line)
    said = " / ".join(line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip())
    note = Path(reports, hang.NOTE.format(rank))
    draft = note.with_suffix(".draft")
    draft.write_text(json.dumps({"time": time.time(),
                                 "error": said if len(said) <= ERROR_CHARS else said[:ERROR_CHARS - 1] + "…"}))
    os.replace(draft, note)


def rank_failed(launcher_failures: dict, reports: Path, world: int) -> RankFailed:
    """RankFailed for the launcher's record of the ranks that ended (ChildFailedError.failures) and the ranks'
    notes in `reports`; a rank the launcher stopped (SIGTERM) is counted apart from those that failed."""
    said = what_failed(launcher_failures, reports, world)
    noted = set(_notes(reports, world))
    # SIGTERM's, and those the launcher does not list (a function's ranks) that said nothing but where they were
    stopped = frozenset(r for r, f in launcher_failures.items() if f.exitcode == -signal.SIGTERM.value) | \
        (set(said) - set(launcher_failures) - noted)
    return RankFailed(said, stopped, tuple(sorted(launcher_failures)))


def _notes(reports: Path, world: int) -> dict[int, dict]:
    """The notes of their errors (note_error) of this job's `world` ranks: rank -> {"time", "error"}. A note of a
    rank past them is a larger job's, in a folder reused."""
    notes = {int(p.stem.removeprefix("rank")): p for p in reports.glob(hang.NOTE.format("*"))}
    return {rank: json.loads(path.read_text()) for rank, path in notes.items() if rank < world}


def what_failed(launcher_failures: dict, reports: Path, world: int) -> dict[int, str]:
    """What happened to each failed rank, the first error first: the ranks' own notes (with the time each was
    raised), and for a rank that left none (killed by a signal, a crash in C++) the launcher's record; then what
    the ranks' flight records and stacks say (hang.explain: the collective a rank waited in, where it stopped)."""
    noted = _notes(reports, world)
    said = {}
    for rank, note in sorted(noted.items(), key=lambda kv: kv[1]["time"]):
        said[rank] = note["error"] + (" (the first error)" if not said and len(noted) > 1 else "")
    for rank, failure in launcher_failures.items():
        if rank not in said:
            status = failure.exitcode
            said[rank] = f"exit status {status}" if status >= 0 else f"killed by signal {-status}"
    for rank, why in hang.explain(reports, world).items():
        # a rank whose SIGTERM handler wrote where it was is one the launcher stopped (the others failed first)
        stopped = why.startswith(hang.STOPPED) and said.get(rank) == f"killed by signal {signal.SIGTERM.value}"
        said[rank] = f"{said[rank]}; {why}" if rank in said and not stopped else why
    return said


def spawn(fn, nproc: int, *args, backend_name: str | None = None, timeout_s: float = 300.0) -> list:
    """fn(*args) on `nproc` ranks of a new process group on this host; their return values in rank order.
    fn must be importable by name (a module's function): each rank is a fresh process."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc must be a positive int (ranks to start), got {nproc!r}")
    backend_name = backend_name or backend()
    if backend_name == "nccl" and nproc > torch.cuda.device_count():
        raise ValueError(f"nproc: {nproc} ranks need {nproc} GPUs, and this machine has {torch.cuda.device_count()}")
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc, run_id=str(uuid.uuid4()),
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0, monitor_interval=0.05)
    with tempfile.TemporaryDirectory(prefix="roofline-ranks-") as reports, quiet_launcher(), \
            one_thread_a_rank(nproc), signals_said():
        try:
            results = elastic_launch(config, _in_group)(fn, backend_name, timeout_s, reports, args)
        except ChildFailedError as exc:
            raise rank_failed(exc.failures, Path(reports), nproc) from None
    return [results[rank] for rank in range(nproc)]
