"""Why ranks stopped: the collective a rank waited in when its job failed, and where the other ranks were.

A collective waits for every rank of its group. When one rank never arrives (it hangs, loops, or took another
branch), the others wait out the process group's timeout and fail, and their exit statuses say nothing of the
cause: over gloo the waiting call raises "Timed out waiting 3000ms for send operation"; over NCCL the watchdog
tears the process down (SIGABRT) before any Python can speak. torch.distributed's flight recorder keeps each
group's last calls: kind, sizes, sequence number, state, and the Python stack that issued it. So:
- a rank whose collective raised writes its record itself (`note`), while its group is still up;
- over NCCL the watchdog writes the same record on a timeout (TORCH_NCCL_DUMP_ON_TIMEOUT, into the file named by
  TORCH_FR_DUMP_TEMP_FILE and the rank), and has the other ranks write theirs;
- a rank the launcher stops (SIGTERM) writes where it was: faulthandler's handler runs in C, so it speaks even
  from inside a blocking call.
`explain` reads them together: the call each rank waited in, the ranks that never reached it, and each stopped
rank's line.
"""

from __future__ import annotations

import faulthandler
import io
import os
import pickle
import re
import signal
import sysconfig
import time
import traceback
from pathlib import Path

from roofline.distributed.ledger import kind_of, message_bytes

RECORD = "collectives-rank"   # + the rank: its flight recorder's calls, pickled as NCCL's watchdog writes them
STACK = "stack-rank{}.txt"    # where a rank was when the launcher stopped it
NOTE = "rank{}.json"          # the error a rank raised, and when (launch.note_error)
STOPPED = "stopped at"        # how explain says it
_PLACES = {"purelib", "platlib", "stdlib", "platstdlib"}
_LIBRARIES = tuple({sysconfig.get_path(p) for p in _PLACES if sysconfig.get_path(p)}
                   | {str(Path(__file__).resolve().parents[1])})   # roofline's own frames run the program
_INSTALLED = re.compile(r"[/\\](site|dist)-packages[/\\]")   # a package's, installed on this machine or another
_stack_file = None


def arm(folder: Path, rank: int) -> None:
    """In a rank, before its first process group: have NCCL's watchdog write its record into `folder` on a
    timeout (the user's own settings stand; the recorder itself is on by default, 2,000 calls), and have SIGTERM
    write where the rank is."""
    global _stack_file
    folder = Path(folder).resolve()   # the program may change its directory
    for name in (f"{RECORD}{rank}", NOTE.format(rank)):   # an earlier job's, in a folder reused
        (folder / name).unlink(missing_ok=True)
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    if not {"TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} & set(os.environ):   # (torch's older name)
        os.environ["TORCH_FR_DUMP_TEMP_FILE"] = str(folder / RECORD)
    _stack_file = open(folder / STACK.format(rank), "w")   # held open: the handler writes to its descriptor
    faulthandler.register(signal.SIGTERM, file=_stack_file, all_threads=False, chain=True)


def forget(folder: Path, ranks) -> None:
    """Before a job whose ranks write into `folder`, a folder used before: the earlier job's records and stacks of
    these ranks go (a rank that ends before it is armed would otherwise be told by another job's)."""
    for rank in ranks:
        for name in (f"{RECORD}{rank}", STACK.format(rank), NOTE.format(rank)):
            (Path(folder) / name).unlink(missing_ok=True)


def disarm(folder: Path, rank: int) -> None:
    """The rank ended on its own: nothing to say of where it stopped."""
    global _stack_file
    if _stack_file is None:
        return
    faulthandler.unregister(signal.SIGTERM)
    _stack_file.close()
    _stack_file = None
    (Path(folder) / STACK.format(rank)).unlink(missing_ok=True)


def raised_in_collective(error: BaseException) -> bool:
    """Whether `error` came out of a torch.distributed call (a timeout, a peer gone), not the program's own."""
    import torch.distributed as dist

    if isinstance(error, getattr(dist, "DistError", ())):
        return True
    return any(frame.filename.replace("\\", "/").endswith("torch/distributed/distributed_c10d.py")
               for frame in traceback.extract_tb(error.__traceback__))


def note(folder: Path, rank: int, error: BaseException) -> None:
    """After the rank's program failed with `error`: where it failed in a collective, write this process's flight
    record for `explain` (unless NCCL's watchdog wrote it already), the call it waited in given the line its
    traceback names. (The recorder's own stacks are not asked for: their first symbolization imports for 2 s, long
    enough for the launcher to stop a failing rank before it writes.)"""
    path = Path(folder).resolve() / f"{RECORD}{rank}"
    if path.exists() or not raised_in_collective(error):
        return
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return
    for name in ("_dump_nccl_trace", "_dump_fr_trace"):   # NCCL's recorder, then the one gloo's groups share
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            record = _load(dump(True, False, False))
        except Exception:   # a recorder not built in, or never used
            continue
        entries = [e for e in record.get("entries") or [] if not e.get("is_p2p")]
        waited = waited_in(_calls({"entries": entries}))
        if waited is None:
            continue
        entry = entries[waited["index"]]
        entry["frames"] = [{"filename": f.filename, "line": f.lineno, "name": f.name}
                           for f in reversed(traceback.extract_tb(error.__traceback__))]
        entry["waited_ns"] = time.time_ns() - (entry.get("time_created_ns") or time.time_ns())   # issued to raised
        path.with_suffix(".draft").write_bytes(pickle.dumps(record))
        os.replace(path.with_suffix(".draft"), path)   # whole or not at all: the launcher may stop this rank
        return


# --------------------------------------------------------------------------- reading them


class _Plain(pickle.Unpickler):
    """A flight record holds dicts, lists, strings and numbers only. The folder it is read from may be shared
    (--rank-dir on a network file system, a name in /tmp): no class is ever made from it, so nothing it holds
    can run."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"a flight record holds no {module}.{name}")


def _load(data: bytes) -> dict:
    return _Plain(io.BytesIO(data)).load()


def _user_line(frames: list[tuple[str, int, str]]) -> str | None:
    """'file.py:LINE (function)' of the innermost frame of the user's (innermost first): not torch's, not the
    standard library's, not roofline's, which runs the program."""
    for filename, line, name in frames:
        path = os.path.abspath(filename)
        if filename.startswith("<") or path.startswith(_LIBRARIES) or _INSTALLED.search(path):
            continue
        return f"{Path(filename).name}:{line} ({name})"
    return None


def _group(entry: dict) -> str:
    """A group as the user knows it: its description where torch has one (default_pg), else its name."""
    name, desc = (list(entry.get("process_group") or ()) + [entry.get("pg_id"), None])[:2]
    return str(desc if desc and desc != "undefined" else name)


def _calls(record: dict) -> list[dict]:
    """A flight record's calls, oldest first: the entry's index, recorder, group, seq, kind, bytes, state, timeout
    and line."""
    calls = []
    for index, e in enumerate(record.get("entries") or []):
        if e.get("is_p2p"):   # a send or recv pairs two ranks, with a count of their own: no group's wavefront
            continue
        name = str(e.get("profiling_name", ""))
        frames = [(f.get("filename", "<?>"), f.get("line", 0), f.get("name", "?")) for f in e.get("frames") or []]
        calls.append({"index": index, "recorder": name.split(":", 1)[0], "created_ns": e.get("time_created_ns") or 0,
                      "group": _group(e), "seq": e.get("collective_seq_id"), "kind": kind_of(name) or name,
                      "bytes": message_bytes(e), "state": e.get("state"), "timeout_ms": e.get("timeout_ms"),
                      "waited_ns": e.get("waited_ns"), "line": _user_line(frames)})
    return sorted(calls, key=lambda c: c["created_ns"])


def waited_in(calls: list[dict]) -> dict | None:
    """The call a rank's record says it waited in: NCCL marks each call completed as its watchdog retires it, so
    the oldest call not completed; gloo's calls are synchronous and never marked, so the newest (a gloo record is
    written only by a rank whose collective raised)."""
    if not calls:
        return None
    if calls[-1]["recorder"] == "gloo":
        return calls[-1]
    return next((c for c in calls if c["state"] != "completed"), None)


def describe(call: dict) -> str:
    size = f", {call['bytes']:,} B" if call["bytes"] is not None else ""
    at = f" at {call['line']}" if call["line"] else ""
    return f"call {call['seq']} of process group {call['group']} ({call['kind']}{size}){at}"


def _stack_line(text: str) -> str | None:
    """The user's line in faulthandler's dump (most recent call first)."""
    frames = [(f, int(n), name) for f, n, name in re.findall(r'File "(.+)", line (\d+) in (.+)', text)]
    return _user_line(frames)


def explain(folder: Path, world: int) -> dict[int, str]:
    """What each rank's records in `folder` say of its end: rank -> the call it waited in and for how long, or the
    last call it made before the call the others waited in; and where it was when stopped ("stopped at LINE")."""
    folder = Path(folder)
    records = {}
    said: dict[int, list[str]] = {}
    for r in range(world):
        path = folder / f"{RECORD}{r}"
        try:
            records[r] = _calls(_load(path.read_bytes()))
        except FileNotFoundError:   # none written
            continue
        except Exception as error:   # written, unreadable or not as read here (another torch's): say so, and why
            why = f"{type(error).__name__}: {error}"
            said[r] = [f"its flight record {path.name} could not be read ({why[:200]})"]
    waits = {r: c for r, c in ((r, waited_in(calls)) for r, calls in records.items()) if c is not None}
    for r, call in waits.items():
        if call["waited_ns"] is not None:   # noted by the rank as its call raised
            waited = f"waited {call['waited_ns'] / 1e9:.3g} s"
        elif call["timeout_ms"]:   # written by NCCL's watchdog, as the call ran out of time
            waited = f"waited out the group's timeout ({call['timeout_ms'] / 1000:g} s)"
        else:
            waited = "waited"
        said.setdefault(r, []).append(f"{waited} in {describe(call)}")
    for r, calls in records.items():
        if r in waits and waits[r]["state"] != "completed":
            continue
        behind = [w for w in waits.values()
                  if not any(c["group"] == w["group"] and c["seq"] >= w["seq"] for c in calls)]
        if behind and calls:
            said.setdefault(r, []).append(f"never reached call {behind[0]['seq']} of process group "
                                          f"{behind[0]['group']}: its last was {describe(calls[-1])}")
    for r in range(world):
        try:
            line = _stack_line((folder / STACK.format(r)).read_text())
        except OSError:
            continue
        if line:
            said.setdefault(r, []).append(f"{STOPPED} {line}")
    return {r: "; ".join(parts) for r, parts in sorted(said.items())}
