"""The collectives of the steps outside the recorded window, as torch.distributed's flight recorder kept them.

Under torch.profiler every rank's host runs slower (benchmarks/results/h100x2-distributed.md), and a
small lead of one host grows into long waits of the others' GPUs: the recorded window's waits and transfer times
describe the recording, not the program. The flight recorder costs the program nothing it would notice. It is
ProcessGroupNCCL's ring of its last collective calls, and keeps each call's kind, sizes, and the host time it was
issued; with TORCH_NCCL_ENABLE_TIMING=1 it also keeps the call's time on the GPU, between two CUDA events that
NCCL's stream records around it. So the steps that capture times outside the window (profiler.capture.StepClock)
get their collectives measured as the program runs unrecorded.

A call's time on the GPU runs from when NCCL's stream reached it (its input computed) to when the data has moved,
and a collective ends on every rank at about the same moment. So, matched across ranks by process group and
sequence number, the shortest of a call's times is its transfer alone, the rank that took it arrived last, and
every other rank's time is longer by its wait. The waits of a step do not add up: NCCL's kernel waits on its own
stream while the rank goes on computing (DDP's buckets in the backward), and a rank 2 ms behind at each of a
step's 14 calls costs the step 2 ms, not 28. What a step loses to a late rank is its largest lag: the others
wait for it where their own work needs the collective's result (DDP's broadcast of the buffers before the
forward, the last gradient bucket before the optimizer), or carry the lag to the step's end. So a step counts,
for each rank, its largest wait at any of the step's collectives, and for the rank that arrived last, its largest
lead over the next latest; the figures are the median step's (the steps outside the window include the program's
early ones: DDP rebuilds its buckets after the first, allocators grow). gloo's calls carry no GPU time: on CPUs
the recorded window's figures stand.
"""

from __future__ import annotations

import bisect
import os
import pickle
import statistics
from dataclasses import dataclass, field

ENV = {"TORCH_NCCL_ENABLE_TIMING": "1",   # each call's time on the GPU (two CUDA events a call)
       "TORCH_FR_BUFFER_SIZE": "20000"}   # calls kept (torch's default, 2000, is 40 steps of an FSDP2 GPT-2's)
DOMINANT = 0.75   # a straggler holds the others back at this share of all the waits, at least (noise: about 1/2)

# the flight recorder's dtype names -> bytes an element
_ITEMSIZE = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "Long": 8, "Int": 4, "Short": 2, "Byte": 1,
             "Char": 1, "Bool": 1, "Float8_e4m3fn": 1, "Float8_e5m2": 1, "ComplexFloat": 8}
# its call names (profiling_name after "nccl:" or "gloo:") -> the collective, as bench.collective names it,
# tried in this order (all_reduce before reduce, reduce_scatter before reduce and scatter)
_KINDS = (("all_gather", "all_gather"), ("allgather", "all_gather"), ("reduce_scatter", "reduce_scatter"),
          ("all_reduce", "all_reduce"), ("allreduce", "all_reduce"), ("all_to_all", "all_to_all"),
          ("alltoall", "all_to_all"), ("broadcast", "broadcast"), ("send", "send_recv"), ("recv", "send_recv"),
          ("barrier", "barrier"), ("reduce", "reduce"), ("gather", "gather"), ("scatter", "scatter"))


def environment() -> dict[str, str]:
    """The NCCL settings this process runs with (NCCL_* variables), for telling a measurement's from another's."""
    return {name: value for name, value in sorted(os.environ.items()) if name.startswith("NCCL_")}


def enable() -> None:
    """Have the process groups this process makes keep their calls, timed on the GPU; the user's own settings
    stand. Before the program makes its first process group: ProcessGroupNCCL reads these when it is made."""
    for name, value in ENV.items():
        if name == "TORCH_FR_BUFFER_SIZE" and "TORCH_NCCL_TRACE_BUFFER_SIZE" in os.environ:
            continue   # the user's, by the name torch before 2.8 read (an alias since)
        os.environ.setdefault(name, value)


def kind_of(profiling_name: str) -> str | None:
    name = profiling_name.split(":", 1)[-1].strip().lower()
    return next((kind for word, kind in _KINDS if word in name), None)


def message_bytes(entry: dict) -> int | None:
    """A recorded call's message as nccl-tests sizes it: an all-gather's output, a reduce-scatter's input, either
    for the rest (the larger of the two)."""
    nbytes = [_nbytes(entry.get("input_sizes"), entry.get("input_dtypes")),
              _nbytes(entry.get("output_sizes"), entry.get("output_dtypes"))]
    return max((b for b in nbytes if b is not None), default=None)


def _nbytes(sizes, dtypes) -> int | None:
    """The bytes of a call's tensors (sizes: one shape per tensor)."""
    total = 0
    for shape, dtype in zip(sizes or [], dtypes or []):
        if dtype not in _ITEMSIZE:
            return None
        n = 1
        for d in shape:
            n *= d
        total += n * _ITEMSIZE[dtype]
    return total


def _dumps() -> list[tuple[str, dict]]:
    """Every flight recorder's calls in this process, each with its recorder: NCCL's and gloo's keep one each."""
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:   # torch built without distributed
        return []
    out = []
    for recorder, name in (("nccl", "_dump_nccl_trace"), ("gloo", "_dump_fr_trace")):
        dump = getattr(c10d, name, None)
        if dump is None:
            continue
        try:
            out.extend((recorder, e) for e in pickle.loads(dump(True, False, False)).get("entries") or [])
        except Exception:   # a recorder not built in, or never used
            continue
    return out


def read(spans_ns: list[tuple[int, int]]) -> list[dict]:
    """The calls issued within the given steps (wall-clock spans, time.time_ns), each as
    {"step", "group", "seq", "p2p", "kind", "bytes", "ms"}: ms, its time on the GPU, None where the recorder did
    not time it (gloo; NCCL without TORCH_NCCL_ENABLE_TIMING; a call not yet retired)."""
    if not spans_ns:
        return []
    starts = [a for a, _ in spans_ns]   # in order: the steps ran one after another
    out = []
    for recorder, entry in _dumps():
        created = entry.get("time_created_ns") or 0
        step = bisect.bisect_right(starts, created) - 1
        if step < 0 or created >= spans_ns[step][1]:
            continue
        p2p = bool(entry.get("is_p2p"))
        # a group by its name, the same on each of its ranks (pg_id only counts the groups a process made), and
        # the recorder that kept it (NCCL's and gloo's count their groups apart)
        name = (entry.get("process_group") or (entry.get("pg_id"),))[0]
        out.append({"step": step, "group": f"{recorder}:{name}", "p2p": p2p,
                    "seq": entry.get("p2p_seq_id" if p2p else "collective_seq_id"), "created_ns": created,
                    "kind": kind_of(str(entry.get("profiling_name", ""))),
                    "bytes": message_bytes(entry),
                    "ms": entry.get("duration_ms")})
    return out


def union(*reads: list[dict]) -> list[dict]:
    """Several read()s of one process as one: each call once, timed where any read timed it (a call the watchdog
    had not retired at one read may be timed at a later one), in the order of steps and sequence."""
    calls: dict = {}
    for read_calls in reads:
        for c in read_calls:
            key = (c["group"], c["p2p"], c["seq"])
            if key not in calls or calls[key]["ms"] is None:
                calls[key] = c
    return sorted(calls.values(), key=lambda c: (c["step"], c["group"], c["p2p"], c["seq"] or 0))


# --------------------------------------------------------------------------- the ranks together

def dominant(shares: list[float]) -> int | None:
    """The index whose share makes at least DOMINANT of the total: the rank that holds the others back, by what
    each held them back; None where the shares are spread (ranks taking turns: noise) or there are none."""
    total = sum(shares)
    if total <= 0:
        return None
    culprit = max(range(len(shares)), key=shares.__getitem__)
    return culprit if shares[culprit] >= DOMINANT * total else None


@dataclass
class Ledger:
    """The ranks' timed calls, matched: each figure a rank's, the median over the steps."""
    steps: int                   # steps in which every rank timed every call
    calls: int                   # matched calls, all steps
    comm_ms: list[float]         # the calls' time on the GPU (their waits included, hidden or not)
    waits_ms: list[float]        # the largest wait at one of the step's collectives
    held_ms: list[float]         # the largest lead over the next latest rank at a collective it arrived at last:
                                 # what every rank's step loses to it
    transfers: dict = field(default_factory=dict)   # (kind, bytes) -> [the transfer's ms, each matched call]
    per_step: dict = field(default_factory=dict)    # "comm_ms", "waits_ms", "held_ms" -> [[each rank's], a step]

    @property
    def straggler(self) -> int | None:
        """The rank (its index in the ranks' order) that holds the others back, by its leads (dominant)."""
        return dominant(self.held_ms)

    def to_dict(self) -> dict:
        return {"steps": self.steps, "calls": self.calls, "comm_ms": self.comm_ms, "waits_ms": self.waits_ms,
                "held_ms": self.held_ms, "straggler": self.straggler, "per_step": self.per_step,
                "transfers": [{"kind": k, "bytes": b, "calls": len(ms), "median_ms": statistics.median(ms)}
                              for (k, b), ms in self.transfers.items()]}


def match(per_rank: list[list[dict]]) -> Ledger | None:
    """The ranks' collective calls (read()'s, in the order of ranks) matched by process group and sequence number,
    where every rank timed them (a subgroup's calls, which some ranks never make, are left out); None where no
    call was timed on every rank."""
    # point-to-point calls pair two ranks, each pair counting its own sequence: not matched across all ranks
    timed = [{(c["group"], c["seq"]): c for c in calls if c.get("ms") is not None and not c["p2p"]}
             for calls in per_rank]
    if len(timed) < 2:
        return None
    # a step with a call some rank did not time (its watchdog had not retired it) is left out whole: its figures
    # would miss that call. Only in groups whose calls are timed: a gloo group beside NCCL's never is
    timed_groups = {group for t in timed for group, _ in t}
    partial = {c["step"] for calls in per_rank for c in calls
               if c.get("ms") is None and not c["p2p"] and c["group"] in timed_groups}
    keys = {k for k in set.intersection(*(set(t) for t in timed)) if timed[0][k]["step"] not in partial}
    if not keys:
        return None
    n = len(timed)
    transfers: dict = {}
    by_step: dict[int, list] = {}
    for key in keys:
        first = timed[0][key]
        transfers.setdefault((first["kind"], first["bytes"]), []).append(min(t[key]["ms"] for t in timed))
        by_step.setdefault(first["step"], []).append(key)
    per_step: dict[str, list] = {"comm_ms": [], "waits_ms": [], "held_ms": []}
    for step in sorted(by_step):
        step_keys = by_step[step]
        comm, waits, leads = [0.0] * n, [0.0] * n, [0.0] * n
        for key in step_keys:
            ms = [t[key]["ms"] for t in timed]
            order = sorted(range(n), key=ms.__getitem__)
            leads[order[0]] = max(leads[order[0]], ms[order[1]] - ms[order[0]])
            for r in range(n):
                comm[r] += ms[r]
                waits[r] = max(waits[r], ms[r] - ms[order[0]])
        for name, figures in zip(per_step, (comm, waits, leads)):
            per_step[name].append(figures)

    def median(name: str) -> list[float]:
        return [statistics.median(step[r] for step in per_step[name]) for r in range(n)]

    return Ledger(len(by_step), len(keys), median("comm_ms"), median("waits_ms"), median("held_ms"), transfers,
                  per_step)
