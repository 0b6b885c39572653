"""What a program of several ranks is told: each rank's step split into compute, communication and exposed
communication; each collective against the interconnect's ceiling (roofline doctor's, where it measured this
machine); the rank that held the others back, and where; and what to do, each finding with its line and its
estimated gain a step."""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass

from roofline.distributed import comms, placement
from roofline.distributed.merge import Merged, collective_rows, host_sync_rows
from roofline.distributed.wrapping import FSDP2_GROUPS
from roofline.tables import Column, Row, show

EXPOSED_SHARE = 0.05   # exposed communication worth a finding: this share of a step, at least
SLOW_SHARE = 0.5       # a transfer under this share of the bus bandwidth doctor measured at its size is slow
SMALL_BYTES = 1 << 20  # messages under this are latency-bound on NVLink (busbw under a tenth of the peak at 1 MiB)
HOOKS_SHARE = 0.1      # FSDP2's hooks worth a finding: this share of a step's time on the host, at least
ADVISED_UNITS = FSDP2_GROUPS + 1   # what the FSDP2 finding advises: the blocks in FSDP2_GROUPS groups, and the root
SYNC_SHARE = 0.01      # a line of host syncs worth a finding: its gain this share of a step, at least
SYNC_CALLS = 3         # ... and this many calls in the window (one at the loop's end is no sync in the loop)
SPLIT_GRAPHS = 2       # compiled graphs a DDP forward from which the host's cost of each is worth a finding
HOST_SHARE = 0.05      # ... with the GPU waiting on its host this share of a step, at least


@dataclass
class Finding:
    id: str
    title: str
    message: str
    where: str | None
    gain_ms: float        # estimated, a step

    def to_dict(self) -> dict:
        return asdict(self)


def findings(merged: Merged, ceiling=None) -> list[Finding]:
    """The findings across the ranks, largest estimated gain first. ceiling: doctor's Interconnect for these GPUs,
    where it measured them (the collectives' transfers are held against it)."""
    out = []
    step = next((r.step_ms for r in merged.ranks if r.step_ms), None)
    s, timed, rows = merged.straggler, merged.ledger, collective_rows(merged)
    # a gain measured outside the window against the step there; a recorded one against the recorded step
    if s is not None and step and s.gain_ms > 0.01 * ((_unrecorded_step(merged) or step) if s.held_ms is not None
                                                      else step):
        spent = [f"{s.where_ms:,.2f} ms a step more than the others at {s.where}" if s.where else "",
                 f"its computation took {s.compute_excess_ms:,.2f} ms a step longer" if s.compute_excess_ms else ""]
        held = (f"Unrecorded, NCCL timed it {s.held_ms:,.2f} ms a step behind the next latest rank (at the "
                f"step's collective where it lagged most); recorded, the others waited {s.waited_ms:,.2f} ms at all "
                "the step's collectives together."
                if s.held_ms is not None else f"Recorded, the other ranks waited {s.waited_ms:,.2f} ms a step for it.")
        out.append(Finding(
            "straggler", f"rank {s.rank} holds the other ranks back",
            f"Rank {s.rank} arrived last at {s.last_at} of {s.calls} recorded collectives"
            + (f": {'; '.join(x for x in spent if x)}" if any(spent) else "") + f". {held} {_lost_where(s, merged)}",
            str(s.where) if s.where else None, s.gain_ms))
    # The rank that waits least at its collectives shows the communication itself; the others' exposed time adds
    # their wait for a later rank, which the straggler's finding is about.
    if timed is not None:
        least = merged.ranks[min(range(merged.world), key=timed.waits_ms.__getitem__)]
    else:
        least = min(merged.ranks, key=lambda r: r.exposed_ms)
    exposed, split = least.exposed_ms, _exposed_unrecorded(merged, least)
    unrecorded, idle = split if split is not None else (None, 0.0)
    estimate = exposed if unrecorded is None else unrecorded
    if step and estimate > EXPOSED_SHARE * (least.unprofiled_ms if unrecorded is not None else step):
        # the collective whose transfers take longest a step: the table's first holds the most time with its waits,
        # and a broadcast right after a late rank's sleep held 10 of its 10.17 ms waiting (two gloo ranks)
        heaviest = max(rows, key=lambda row: row["call_us"] * row["calls"]) if rows else {}
        top, owner = heaviest.get("where"), heaviest.get("owner") or ""
        # the order is the measured one (benchmarks/results/h100x2-distributed.md, "Side by side"): bucket views
        # gained, larger buckets were not told apart from no gain, and bf16 compression cost more than it saved;
        # FSDP2's from h200x2-distributed.md, "FSDP2 in fewer units": its reduce-scatter in bf16 gained where it was
        # timed beside fp32 in one launch (2 and 4 units), and the best figure was the model alone reducing in bf16
        ddp = ("DDP: gradient_as_bucket_view=True lets the backward write each gradient into its bucket, with no "
               "copy in and out; larger buckets (DistributedDataParallel(bucket_cap_mb=...)) send fewer, larger "
               "messages; under gradient accumulation, no_sync() on all but the last micro-batch reduces once."
               + (" Over NVLink, compressing gradients to bf16 (a comm hook) costs more than it saves."
                  if any(r.trace.gpu for r in merged.ranks) else ""))
        fsdp = ("FSDP2: MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16) "
                "reduce-scatters the gradients in bf16, half the bytes of fp32; fewer units (fully_shard on groups of "
                "blocks, down to the model alone where its parameters fit gathered) gather and reduce in fewer, "
                "larger collectives; reshard_after_forward=False keeps a unit's parameters gathered for the "
                "backward.")
        # advice for whoever's tensors the top collective moves
        overlap = "async_op=True and a wait() just before the result is needed let computation run meanwhile."
        asynchronous = heaviest.get("asynchronous", False)
        if owner.startswith("DDP"):
            advice = ddp
        elif owner.startswith("FSDP2"):
            advice = fsdp
        elif asynchronous:
            advice = f"{ddp} {fsdp}"
        elif asynchronous is None:   # a window that recorded no op does not know how the program's thread called it
            advice = (f"The window recorded no op, so how the program called it is not known. Called and waited for "
                      f"at once: {overlap} Issued by DDP or FSDP2: {ddp} {fsdp}")
        else:
            advice = f"The program waits for each collective where it calls it: {overlap}"
        if unrecorded is None:
            said = (f"A step spends {exposed:,.2f} ms of {step:,.2f} communicating with nothing of its own to compute "
                    "meanwhile (on the rank that waits least for the others).")
        else:
            taken = ([f"its {timed.waits_ms[merged.ranks.index(least)]:,.2f} ms of waits for other ranks"]
                     if timed is not None else [])
            if s is not None and s.rank == least.rank and _idle_lead(s):
                taken.append(f"its own {_idle_lead(s):,.2f} ms lead as the straggler")
            said = (f"Unrecorded, a step of rank {least.rank} (the rank that waits least for the others) takes "
                    f"{least.unprofiled_ms:,.2f} ms, and its GPU computes {least.compute_ms:,.2f} of them: "
                    f"{unrecorded:,.2f} ms are communication no computation hides (with any idle"
                    + (f", less {' and '.join(taken)}" if taken else "") + ")."
                    + (f" At most the time NCCL's kernels ran there, waits aside: the other {idle:,.2f} ms its GPU "
                       "idles with no kernel at all, waiting on its host (rank 0's report above names the lines)."
                       if idle > 0.05 * estimate and idle > 0.1 else "")
                    + (f" Recorded, with steps {least.stretch:.2f}x as long, {exposed:,.2f} ms overlapped "
                       "nothing." if least.stretch else ""))
        out.append(Finding("exposed-communication", "communication no computation hides", f"{said} {advice}", top,
                           estimate))
    out += _serialized(merged, step)
    out += _host_syncs(merged, step)
    out += _reduced_every_micro_batch(merged)
    out += _fsdp2_hooks(merged)
    out += _ddp_split_graphs(merged)
    out += _slow_transfers(merged, rows, ceiling)
    # DDP's calls repeated for each micro-batch are no_sync()'s to remove: larger buckets would not make fewer
    accumulating = any(f.id == "ddp-no-sync" for f in out)
    for row in rows:
        if accumulating and (row["owner"] or "").startswith("DDP bucket"):
            continue
        if row["bytes"] and row["bytes"] < SMALL_BYTES and row["calls"] >= 4 and step and row["ms"] > 0.01 * step:
            out.append(Finding(
                "small-collectives", f"{row['calls']:.0f} small {row['kind']}s a step",
                f"{row['calls']:.0f} calls a step of {row['bytes']:,} bytes each take {row['ms']:,.2f} ms: messages "
                f"this small are bound by each call's latency, not by the interconnect's bandwidth. {_fewer(row)}",
                row["where"], row["ms"] * (1 - 1 / row["calls"])))
    return sorted(out, key=lambda f: -f.gain_ms)


def _serialized(merged: Merged, step: float | None) -> list[Finding]:
    """Collectives whose NCCL kernels run on a stream the rank computes on: there, in a stream's order, no
    transfer overlaps computation."""
    ranks = [r for r in merged.ranks if step and r.serialized_ms > 0.01 * step]
    if not ranks:
        return []
    worst = max(ranks, key=lambda r: r.serialized_ms)
    streams = sorted({s for r in ranks for s in r.serialized_streams})
    return [Finding(
        "serialized-communication", "collectives run on the stream that computes",
        f"On rank{'s' if len(ranks) > 1 else ''} {', '.join(str(r.rank) for r in ranks)}, NCCL's kernels run on "
        f"stream{'s' if len(streams) > 1 else ''} {', '.join(map(str, streams))}, where the computation runs too: "
        f"{worst.serialized_ms:,.2f} ms a step of transfers (rank {worst.rank}) that wait for the kernels before "
        "them and hold up those after, overlapping none. torch.distributed's process groups run collectives on "
        "streams of their own; a collective launched on the current stream (a library's own NCCL communicator, "
        "or one launched under a stream context) runs in its order. Launch it on a side stream "
        "(torch.cuda.Stream) and have the work that reads its result wait on an event. At most the transfers' "
        "time, where computation that does not need them is there to overlap.",
        str(worst.serialized_at) if worst.serialized_at else None, min(worst.serialized_ms, worst.exposed_ms))]


def _host_syncs(merged: Merged, step: float | None) -> list[Finding]:
    """Lines at which hosts wait for their GPUs in the loop. After each such wait a GPU idles until its host
    launches again, and reaches the next collective that much later. On every rank, each step waits for the rank
    whose sync cost most, and wins at least what the least-stalled one would (the gain). On some ranks only (a rank
    that logs), the others wait at the next collective for those, if those arrive last: the step wins what the
    worst of them would, at most what the other ranks waited a step (NCCL's timing outside the window, else the
    recorded waits). Each rank's gain is at most the part of its unrecorded step its GPU does not compute."""
    if not step:
        return []
    ranks = {r.rank: r for r in merged.ranks}
    index = {r.rank: k for k, r in enumerate(merged.ranks)}
    steps = max(merged.ranks[0].steps, 1)
    waits = merged.ledger.waits_ms if merged.ledger is not None else merged.waits_ms

    def bounded(k: int, gain: float) -> float:
        idle = ranks[k].not_computing_ms
        return gain if idle is None else min(gain, idle)

    out = []
    for row in host_sync_rows(merged):
        gains = [bounded(k, g) for k, g in zip(row["ranks"], row["gain_ms"])]
        if row["every_rank"]:
            gain = min(gains)
        else:
            others = [waits[index[k]] for k in ranks if k not in row["ranks"]]
            gain = min(max(gains), max(others, default=0.0))
        if row["calls"] * steps < SYNC_CALLS or gain < SYNC_SHARE * step:
            continue
        several = len(row["ranks"]) > 1
        waited = ", ".join(f"rank {k} {ms:,.2f}" for k, ms in zip(row["ranks"], row["wait_ms"]))
        idles = ", ".join(f"rank {k} {ms:,.2f}" for k, ms in zip(row["ranks"], gains))
        said = (f"`{row['call']}` runs {_times(row['calls'])} a step at this line on each rank. Each time the host "
                f"stops queuing work until its GPU catches up (ms a step: {waited}), and the GPU then idles before the "
                f"next launch (ms a step it would win without them: {idles}). A rank that idles reaches the next "
                "collective late, so a step waits for the rank whose syncs cost most; the gain is the least any "
                "rank wins." if row["every_rank"] else
                f"Only {_ranks(row['ranks'])} of {merged.world} wait{'' if several else 's'} for "
                f"{'their GPUs' if several else 'its GPU'} at this line (`{row['call']}`, {_times(row['calls'])} a "
                f"step; ms a step: {waited}). {'Their GPUs' if several else 'The GPU'} then idle"
                f"{'' if several else 's'} before the next launch (ms a step it would win without them: {idles}), "
                f"{'those ranks reach' if several else 'the rank reaches'} the next collective late, and the other "
                "ranks wait there: one rank's logging costs every rank. The gain is at most what the others waited "
                f"a step ({max(others, default=0.0):,.2f} ms).")
        out.append(Finding(
            "host-sync-every-rank" if row["every_rank"] else "host-sync-some-ranks",
            f"hosts wait for their GPUs {_times(row['calls'])} a step"
            + ("" if row["every_rank"] else f" on {_ranks(row['ranks'])}"),
            f"{said} Keep values on the GPU (accumulate `loss.detach()`, not `loss.item()`) and read them every N "
            "steps, or copy them to pinned memory with non_blocking=True and read them a step later.",
            row["where"], gain))
    return out


def _times(n: float) -> str:
    return "once" if n == 1 else f"{n:g} times"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _reduced_every_micro_batch(merged: Merged) -> list[Finding]:
    """DDP under gradient accumulation without no_sync(): its reducer all-reduces every bucket after every
    backward, so k micro-batches an optimizer step reduce each gradient k times where once would do (accumulated
    locally under no_sync(), reduced with the last micro-batch). Told by its first bucket, reduced k times a step
    (a step is an optimizer.step()). The gain is at most the reductions' time on the GPU less one in k: what a
    step wins is their exposed part, and the SMs and memory bandwidth they take from the backward they overlap.
    The rank whose reductions took least is the one that waited least in them for the others."""
    def reductions(rank) -> list:
        return [c for c in rank.calls if c.owner and comms.bucket_index(c.owner) is not None]

    rank = min(merged.ranks, key=lambda r: sum(c.us for c in reductions(r)) / max(r.steps, 1))
    steps, ddp = max(rank.steps, 1), reductions(rank)
    per_step = _ddp_backwards(rank)
    if per_step < 1.5:
        return []
    reduced_ms = sum(c.us for c in ddp) / steps / 1e3
    gain = reduced_ms * (1 - 1 / per_step)
    where = next((str(c.location) for c in ddp if c.location), None)
    return [Finding(
        "ddp-no-sync", f"DDP reduces the gradients {per_step:.0f} times a step",
        f"Each optimizer step runs {per_step:.0f} backwards, and DDP all-reduces every gradient bucket after each "
        f"({reduced_ms:,.2f} ms a step of all_reduce on rank {rank.rank}). Under gradient accumulation, run all but "
        "the last micro-batch's forward and backward in `with ddp.no_sync():`: the gradients add up locally and "
        f"are reduced once, {per_step:.0f}x fewer bytes. The estimate is the reductions' time saved, at most: what a "
        "step wins is the part no computation hid.", where, gain)]


def _ddp_backwards(rank) -> float:
    """DDP's backwards a step on a rank, told by its first bucket's reductions (0 without DDP). A first bucket by
    its name, which holds its parameters' names: each DDP instance numbers its buckets from 0."""
    firsts = collections.Counter(c.owner for c in rank.calls if c.owner and comms.bucket_index(c.owner) == 0)
    return max(firsts.values(), default=0) / max(rank.steps, 1)


def _fsdp2_hooks(merged: Merged) -> list[Finding]:
    """FSDP2 programs of many fully_shard units: each unit's hooks cost the host time in every forward and
    backward, and where a unit's computation is shorter, the GPU waits for them."""
    r = max(merged.ranks, key=lambda r: r.hooks_ms)
    step = r.unprofiled_ms or r.step_ms
    stretch = r.host_stretch if r.host_stretch and r.host_stretch > 1 else 1.0
    hooks = r.hooks_ms / stretch   # the recorder stretches the host: the hooks' time at the program's own pace
    if r.hook_units <= ADVISED_UNITS or not step or hooks < HOOKS_SHARE * step:
        return []
    gain = hooks * (1 - ADVISED_UNITS / r.hook_units)
    idle = r.not_computing_ms
    if idle is not None:   # on a GPU, a step gains at most the time its GPU does not compute
        gain = min(gain, idle)
    recorded = f" ({r.hooks_ms:,.2f} ms recorded)" if stretch > 1 else ""
    waits = (f" Unrecorded, its GPU computes nothing for {idle:,.2f} ms of a {step:,.2f} ms step."
             if idle is not None else "")
    return [Finding(
        "fsdp2-hooks", f"{r.hook_units} FSDP2 units cost the host {hooks:,.2f} ms a step",
        f"FSDP2's hooks held rank {r.rank}'s host {hooks:,.2f} ms a step{recorded}: {r.hook_units} fully_shard "
        f"units, {hooks / r.hook_units:,.2f} ms each, gathering each unit's parameters before its forward and its "
        f"backward and reducing its gradients after. That is host time: where a unit's computation is shorter, the "
        f"GPU waits for the host.{waits} Shard fewer, larger units: fully_shard on groups of blocks "
        f"(fully_shard(list(model.blocks[i:j])) for {FSDP2_GROUPS} groups: a list, since a slice of a ModuleList is "
        "a module of its own that is never called), and reshard_after_forward=False keeps each group "
        "gathered from its forward to its backward, saving the backward's gathers and their hooks (the memory "
        "FSDP2 saves on parameters is spent while they stay gathered). The gain is estimated for "
        f"{FSDP2_GROUPS} groups and the root; `roofline ladder --nproc-per-node N` measures it as its FSDP2 rung "
        "\"fewer FSDP2 units\", then the model as one unit (where its parameters fit gathered) and its gradients "
        "reduced in bf16.",
        str(r.hooks_at) if r.hooks_at else None, gain)]


def _ddp_split_graphs(merged: Merged) -> list[Finding]:
    """DDP around a model compiled as many graphs a forward: Dynamo's DDP optimizer splits the model's graph at
    DDP's buckets (so that each bucket's all-reduce can start while the backward of the graphs before it runs), and
    compiling each block alone does the same. Each graph's forward and backward is a call of the host's, with its
    guards, its autograd node and its DDP hooks; where the host then falls behind, the GPU waits for it. On two
    H200s (GPT-2 small, 8 x 1024 tokens a rank, benchmarks/results/h200x2-distributed.md) the split graphs kept the
    GPU waiting on its host for most of the step they lost against one graph.

    A forward is a DDP forward: its first bucket's reductions count them (micro-batches of gradient accumulation
    each run the graphs again). Only where NCCL timed the steps outside the window (the ledger) is the host's wait
    told from communication. The gain: on the rank that waits least for the others, the unrecorded step's time its
    GPU neither computes nor communicates nor waits for another rank; and where that rank is the straggler at the
    compiled forward's line, its lead there too (the straggler finding's gain as well: they overlap)."""
    timed = merged.ledger
    rank = max(merged.ranks, key=lambda r: r.compiled_graphs)
    forwards = _ddp_backwards(rank)
    if timed is None or not forwards:
        return []
    graphs = rank.compiled_graphs / max(forwards, 1.0)
    if graphs < SPLIT_GRAPHS:
        return []
    least = merged.ranks[min(range(merged.world), key=timed.waits_ms.__getitem__)]
    split = _exposed_unrecorded(merged, least)
    if split is None:
        return []
    s = merged.straggler
    at_forward = (s is not None and s.rank == least.rank and rank.compiled_at is not None
                  and str(s.where) == str(rank.compiled_at))
    lead = _idle_lead(s) if at_forward else 0.0
    host = split[1] + lead
    if host < HOST_SHARE * least.unprofiled_ms:
        return []
    also = (f", {lead:,.2f} ms of them its lead over the other ranks at the compiled forward (the straggler "
            "finding's too)" if lead else "")
    return [Finding(
        "ddp-split-graphs", f"DDP runs {graphs:.0f} compiled graphs a forward",
        f"Rank {rank.rank} ran {graphs:.0f} graphs of torch.compile's a forward under DDP: Dynamo's DDP optimizer "
        "splits a compiled DDP model's graph at each of DDP's buckets, so that their all-reduces can overlap the "
        "backward (compiling each block alone splits it too). Every graph's forward and backward is a call of the "
        f"host's, and unrecorded, rank {least.rank}'s GPU spends {host:,.2f} ms of a {least.unprofiled_ms:,.2f} ms "
        f"step neither computing nor communicating{also}: waiting on its host. Compile the DDP module as one graph: "
        "torch.compile(ddp) with torch._dynamo.config.optimize_ddp = False set before its first step. DDP then "
        "reduces the gradients when the backward has returned them all, with nothing to overlap them; on two H200s "
        "that was still the faster step for GPT-2 small, the roofline ladder's rung \"one compiled graph under "
        "DDP\" (benchmarks/results/h200x2-distributed.md).",
        str(rank.compiled_at) if rank.compiled_at else None, host)]


def _fewer(row: dict) -> str:
    """How to send a row's small messages in fewer calls, by whose tensors they move."""
    owner = row.get("owner") or ""
    if owner.startswith("FSDP2"):
        return (f"FSDP2 moves each fully_shard unit's parameters in one call ({owner}): put several layers in one "
                "unit (fully_shard on a group of blocks), or reshard_after_forward=False to gather once a step.")
    if owner.startswith("DDP"):
        return (f"DDP sends a call per gradient bucket ({owner}): a larger bucket_cap_mb makes fewer, larger "
                "ones.")
    return "Put them in one tensor (a bucket) and reduce it once."


def _slow_transfers(merged: Merged, rows: list[dict], ceiling) -> list[Finding]:
    """Collectives whose transfers (timed by NCCL outside the window, waits aside) reach under SLOW_SHARE of the
    bus bandwidth doctor measured for a message of their size on these GPUs: with the NCCL settings the ranks had
    and doctor's did not, which can be why."""
    step = _unrecorded_step(merged)
    if ceiling is None or merged.ledger is None or not step:
        return []
    ranks_env: dict = {}
    for r in merged.ranks:   # every rank's settings (a setting one rank alone has counts too)
        ranks_env.update(r.trace.facts.get("nccl_env") or {})
    measured = ceiling.environment
    changed = {k: v for k, v in ranks_env.items() if measured is not None and measured.get(k) != v}
    dropped = sorted(set(measured or ()) - set(ranks_env))
    out = []
    for row in rows:   # collective_rows(merged)
        expected = ceiling.busbw_at(row["kind"], row["bytes"]) if row["bytes"] else None
        if not (row["unrecorded"] and row["busbw_gbps"] and expected and row["busbw_gbps"] < SLOW_SHARE * expected):
            continue
        transfer_ms = row["calls"] * row["call_us"] / 1e3
        gain = transfer_ms * (1 - row["busbw_gbps"] / expected)
        if gain <= 0.01 * step:
            continue
        if measured is None:
            settings = ("Doctor's measurement does not say which NCCL settings it had (it predates roofline keeping "
                        "them): measure again with roofline doctor --remeasure"
                        + (f"; the ranks had {', '.join(f'{k}={v}' for k, v in ranks_env.items())}." if ranks_env
                           else "."))
        elif changed or dropped:
            settings = ("The ranks ran with NCCL settings doctor measured without: "
                        + ", ".join([*(f"{k}={v}" for k, v in changed.items()), *(f"{k} unset" for k in dropped)])
                        + ". Try the program without them, or measure them with roofline doctor.")
        else:
            settings = ("The ranks had the NCCL settings doctor measured with: look for other traffic on the links "
                        "(another job, a second process group at once) or a topology that differs from doctor's.")
        size = comms.size_text(row["bytes"])
        out.append(Finding(
            "slow-collectives", f"{row['kind']}s of {size} at {row['busbw_gbps'] / expected:.0%} of the interconnect",
            f"Unrecorded, a {row['kind']} of {size} moves its data in {row['call_us']:,.0f} us: "
            f"{row['busbw_gbps']:,.1f} GB/s of bus bandwidth, where roofline doctor measured {expected:,.1f} GB/s for "
            f"that size on these GPUs. {settings} The gain assumes the transfers are exposed; hidden under compute, "
            "they cost nothing.", row["where"], gain))
    return out


def _lost_where(s, merged: Merged) -> str:
    """Where the straggler lost its lead, where NCCL timed it outside the window: its GPU computing longer than the
    other ranks' (recorded), or the rest, its GPU idle while its host was late (_idle_lead), with where its process
    may run (distributed.placement)."""
    if s.held_ms is None:
        return ("A rank that loads its data on the critical path, gets a larger batch, or runs on a slower GPU makes "
                "every rank wait at the next collective.")
    host, gpu = _idle_lead(s), min(s.compute_excess_ms, s.held_ms)
    # "its host's" is the GPU idle for want of launches: the host's own work, or its path to this GPU (the swapped
    # pair in benchmarks/results/h200x2-distributed.md, "Does the lag follow the rank or the GPU?")
    if host >= gpu:
        return (f"Of that lead, {host:,.2f} ms a step is its host's: its GPU computed "
                + (f"only {gpu:,.2f} ms longer than the others'" if gpu > 0 else "no longer than the others'")
                + f", and idled the rest, waiting for rank {s.rank}'s host to launch. Look at what that host does "
                "that the others' do not between collectives (loading or preparing data, logging, a host sync"
                + (", at the line above first" if s.where else "") + "), and at what else runs on its CPUs; where "
                "the ranks run the same code, a host whose launches reach this GPU more slowly lags alike (on two "
                "H200s, the lag once followed the GPU when the ranks swapped GPUs). "
                + placement.said(s.rank, next(r.trace.facts.get("placement") for r in merged.ranks
                                              if r.rank == s.rank))).rstrip()
    return (f"Of that lead, {gpu:,.2f} ms a step is its GPU computing longer than the others' (recorded): a slower "
            "GPU (its clocks, power or temperature) or more work (a larger or longer batch).")


def _unrecorded_step(merged: Merged) -> float | None:
    timed = [r.unprofiled_ms for r in merged.ranks if r.unprofiled_ms]
    return max(timed) if timed else None


def _idle_lead(straggler) -> float:
    """The part of a straggler's lead its own GPU spends idle, waiting for its host: its host's lead, not its
    GPU's (that is compute already). Unrecorded (held_ms), the lead less any compute it did beyond the others;
    else the recorded lead at its line."""
    if straggler.held_ms is not None:
        return max(straggler.held_ms - straggler.compute_excess_ms, 0.0)
    return straggler.where_ms


def _exposed_unrecorded(merged: Merged, rank) -> tuple[float, float] | None:
    """A rank's exposed communication in the unrecorded program, and the rest of its GPU's idle: the part of its
    unrecorded step its GPU does not compute, less its waits for other ranks where NCCL timed them outside the
    window, and less its own idle lead where it is the straggler; None where the steps outside the window were not
    timed on a GPU. Where NCCL timed its calls, no more than they ran (their waits aside): a GPU that idles longer
    waits on its host, with no kernel at all, and that rest is the second figure. Without NCCL's timing the lead is
    the recorded one: where the recorder alone made that host slower, the estimate comes out low."""
    not_computing = rank.not_computing_ms
    if not_computing is None:
        return None
    timed, k = merged.ledger, merged.ranks.index(rank)
    waits = timed.waits_ms[k] if timed is not None else 0.0
    s = merged.straggler
    lead = _idle_lead(s) if s is not None and s.rank == rank.rank else 0.0
    uncapped = max(not_computing - waits - lead, 0.0)
    exposed = min(uncapped, max(timed.comm_ms[k] - waits, 0.0)) if timed is not None else uncapped
    return exposed, uncapped - exposed


def render(merged: Merged, console, ceiling=None, top: int = 10, findings_too: bool = True) -> None:
    """The ranks side by side, their collectives, the straggler and (findings_too) the findings. ceiling: doctor's
    Interconnect."""
    ranks = merged.ranks
    console.print(f"[bold]{merged.world} ranks[/bold], {ranks[0].steps} steps recorded on each; "
                  f"{merged.matched} collective calls matched across the ranks"
                  + (f" ({merged.mismatch})" if merged.mismatch else ""))
    if not any(r.calls for r in ranks):
        console.print("[yellow]No rank called a collective in the recorded steps: there is no communication to "
                      "show (a program of several ranks that never communicates trains several models).[/yellow]")
    timed = merged.ledger
    unrecorded = ([Column("unrecorded comm", "u.comm"), Column("unrecorded wait", "u.wait")]
                  if timed is not None else [])
    rows = [Row([str(r.rank), _ms(r.unprofiled_ms),
                 *([_ms(timed.comm_ms[k]), _ms(timed.waits_ms[k])] if timed is not None else []),
                 # the window's over its steps, as compute, comm and exposed are, and as the stretch below holds it
                 _ms(r.recorded_step_ms or r.step_ms), _ms(r.compute_ms), _ms(r.comm_ms), _ms(r.exposed_ms),
                 "" if r.overlap is None else f"{r.overlap:.0%}", _ms(merged.waits_ms[k])])
            for k, r in enumerate(ranks)]
    show(console, "ranks (ms a step)", [Column("rank"), Column("unrecorded step", "unrec"), *unrecorded,
                                        Column("recorded step", "step"), Column("compute"), Column("comm"),
                                        Column("exposed"), Column("overlap", "ovl"), Column("waited", "wait")], rows)
    stretched = [r.stretch for r in ranks if r.stretch]
    if stretched:
        low, high = f"{min(stretched):.2f}x", f"{max(stretched):.2f}x"
        console.print(f"The recorder stretched the ranks' steps {low if low == high else f'{low} to {high}'} (the "
                      "unrecorded steps: timed outside the window). Compute, communication, overlap and waits are the "
                      "recorded steps'; a finding's gain is the unrecorded program's where the GPU's time says it.",
                      highlight=False)
    if timed is not None:
        console.print(f"Unrecorded comm and wait: {timed.calls} collective calls of {timed.steps} steps outside the "
                      "window, timed on each GPU by NCCL (TORCH_NCCL_ENABLE_TIMING, read from its flight recorder): "
                      "the calls' time, waits included, and a step's largest wait at one collective (its waits do "
                      "not add up: compute hides most). Below, a transfer time marked u and its bus bandwidth are "
                      "theirs too (the shortest over the ranks: no wait); the others are the window's.",
                      highlight=False)
    rows = []
    for c in collective_rows(merged)[:top]:
        peak = ceiling.peak_busbw(c["kind"]) if ceiling is not None else None
        line = "\n".join(x for x in (c["where"], c.get("owner")) if x)   # the tensors it moves under the line
        rows.append(Row([c["kind"], comms.size_text(c["bytes"]), line, _calls(c["calls"]), _ms(c["ms"]),
                         f"{c['call_us']:,.0f}" + ("u" if c["unrecorded"] else ""),
                         "" if c["busbw_gbps"] is None else _gbps(c["busbw_gbps"]),
                         f"{c['busbw_gbps'] / peak:.0%}" if peak and c["busbw_gbps"] else ""]))
    if rows:
        show(console, "collectives (the median rank, a step)",
             [Column("collective", "coll", justify="left"), Column("size"), Column("line", justify="left", fold=True),
              Column("calls"), Column("ms"), Column("transfer us", "us"), Column("busbw GB/s", "busbw"),
              Column("of peak", "peak")], rows)
    syncs = host_sync_rows(merged)
    if syncs:
        def spread(ms: list) -> str:
            low, high = min(ms), max(ms)
            return f"{low:,.2f}" if high - low < 0.005 else f"{low:,.2f}-{high:,.2f}"

        show(console, "host syncs: where hosts wait for their GPUs (a step; over the ranks that wait there)",
             [Column("line", justify="left", fold=True), Column("call", justify="left", fold=True),
              Column("ranks"), Column("calls"), Column("host wait ms", "wait"),
              Column("GPU idle it costs, ms", "idle")],
             [Row([x["where"], x["call"], "all" if x["every_rank"] else ", ".join(map(str, x["ranks"])),
                   f"{x['calls']:g}", spread(x["wait_ms"]), spread(x["gain_ms"])]) for x in syncs[:top]])
    found = findings(merged, ceiling) if findings_too else []
    if found:
        show(console, "findings across the ranks (estimated gains a step overlap; do not add them up)",
             [Column("finding", justify="left", fold=True), Column("where", justify="left", fold=True),
              Column("gain ms", "gain")],
             [Row([f"[bold]{f.title}[/bold]\n{f.message}", f.where or "", f"{f.gain_ms:,.2f}"]) for f in found])


def _calls(value: float) -> str:
    """Calls a step: whole where they are (12), two digits where a call comes once in several steps (0.33)."""
    return f"{value:g}" if value >= 1 else f"{value:.2g}"


def _gbps(value: float) -> str:
    """Bus bandwidth: one decimal where large (NVLink's hundreds of GB/s), three digits where small (gloo's)."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.2f}"
