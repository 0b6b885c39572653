"""The collectives in one rank's trace: what was called, where, how big, and when its data moved.

torch.distributed records each collective the program calls as a c10d op on the calling thread (`c10d::allreduce_`,
`c10d::_allgather_base_`, ...), with its tensors' shapes, and at the line the program called it from (DDP's and
FSDP's own calls come from their hooks, inside backward or forward). The data moves elsewhere:
- with NCCL, in a kernel on a stream of NCCL's own (`ncclDevKernel_AllReduce_Sum_bf16_RING_LL`), launched inside
  the c10d op; the kernel runs from the moment every rank has launched it, so its time holds the wait for the
  last rank to arrive;
- with gloo, on a thread of gloo's, recorded as `gloo:all_reduce` and the like, in the order of the calls.
Either way, the transfer's span is the collective's time on this rank, and the c10d op's start is when this rank
arrived at it.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from roofline.bench.collective import bus_factor
from roofline.profiler.attribution import Location, Resolver
from roofline.profiler.trace import Trace

# c10d's op names (without the namespace and trailing underscores) -> the collective, as bench.collective names it
_KINDS = {"allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "allgather": "all_gather",
          "_allgather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
          "allgather_coalesced": "all_gather",
          "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
          "reduce_scatter_tensor_coalesced": "reduce_scatter", "alltoall": "all_to_all", "alltoall_base": "all_to_all",
          "broadcast": "broadcast", "reduce": "reduce", "send": "send_recv", "recv": "send_recv",
          "recv_any_source": "send_recv", "barrier": "barrier", "gather": "gather", "scatter": "scatter"}
_GLOO = re.compile(r"^gloo:(\w+)$")
# NCCL's kernels name the collective they move: ncclDevKernel_AllReduce_Sum_bf16_RING_LL, ncclDevKernel_SendRecv
# (send, recv and all_to_all), before NCCL 2.19 ncclKernel_AllGather_RING_LL_Sum_int8_t
_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)", re.IGNORECASE)
_NCCL_KERNEL_KINDS = {"allreduce": "all_reduce", "allgather": "all_gather", "reducescatter": "reduce_scatter",
                      "broadcast": "broadcast", "reduce": "reduce", "sendrecv": "send_recv", "send": "send_recv",
                      "recv": "send_recv"}
_ITEMSIZE = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "long int": 8, "int": 4,
             "unsigned char": 1, "signed char": 1, "bool": 1}
_KERNEL_DTYPE = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8, "i64": 8, "i32": 4, "u8": 1, "i8": 1, "f8e4m3": 1,
                 "f8e5m2": 1}


@dataclass
class Call:
    """One collective call on one rank."""
    kind: str                       # all_reduce, all_gather, ... (bench.collective.KINDS), barrier, gather, scatter
    nbytes: int | None              # the message as nccl-tests sizes it (None where the trace does not say)
    arrived: float                  # the c10d op's start: when the host called it (us, this rank's clock)
    start: float                    # the transfer's span (the NCCL kernel, or gloo's record of it): its start is
                                    # when this rank arrived at the collective, and it ends when every rank has
    end: float
    location: Location | None       # the user's line that called it (DDP's and FSDP's: the line their hook ran in)
    module: str | None
    op: int                         # the c10d op's index in the rank's trace (-1: a window that records no op)
    on_gpu: bool                    # a kernel moved the data (else a host thread)
    asynchronous: bool | None       # called with async_op=True (as DDP's and FSDP's hooks call them); None: not
                                    # known (a window that records no op, a call from the program's own thread)
    owner: str | None = None        # whose tensors it moves: "DDP bucket 2", "FSDP2 layers.3" (see owners())

    @property
    def us(self) -> float:
        return self.end - self.start

    def busbw_gbps(self, ranks: int) -> float | None:
        return busbw_gbps(self.kind, self.nbytes, self.us, ranks)


def busbw_gbps(kind: str, nbytes: int | None, us: float, ranks: int) -> float | None:
    """nccl-tests' bus bandwidth of a call moving `nbytes` in `us`; None where it has none (a barrier, an unknown
    size)."""
    if not nbytes or us <= 0 or kind not in _BUS_KINDS:
        return None
    return nbytes / (us * 1e-6) / 1e9 * bus_factor(kind, ranks)


def size_text(nbytes: int | None) -> str:
    """A message's size as the tables show it: "27.0 MiB", "512 B"; "" where unknown."""
    if not nbytes:
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"


_BUS_KINDS = {"all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv"}


def is_comm_kernel(name: str) -> bool:
    """Whether a GPU kernel is NCCL's (it moves a collective's data)."""
    return bool(_NCCL_KERNEL.match(name))


def kind_of(op_name: str) -> str | None:
    """The collective a c10d op is, or None for another op."""
    if not op_name.startswith("c10d::"):
        return None
    name = op_name[len("c10d::"):]
    return _KINDS.get(name) or _KINDS.get(name.rstrip("_"))


def _count(dims) -> int | None:
    """Elements of a c10d op's first argument (a tensor list: [[d0, d1, ...], ...]; or one tensor's dims)."""
    if not dims:
        return None
    first = dims[0]
    tensors = first if first and isinstance(first[0], list) else [first]
    total = 0
    for shape in tensors:
        if not isinstance(shape, list) or not all(isinstance(d, int) for d in shape):
            return None
        n = 1
        for d in shape:
            n *= d
        total += n
    return total


def _message_bytes(kind: str, elements: int | None, itemsize: int | None, ranks: int) -> int | None:
    """nccl-tests' message size from the c10d op's first argument, its output: an all_gather's and all_to_all's is
    the whole message, a reduce_scatter's one rank's share of it; the other collectives' is their buffer."""
    if elements is None or itemsize is None:
        return None
    return elements * itemsize * (ranks if kind == "reduce_scatter" else 1)


def calls(trace: Trace, resolver: Resolver | None = None) -> list[Call]:
    """Every collective call in the rank's trace, in the order the program made them."""
    resolver = resolver or Resolver(trace)
    if trace.facts.get("own_marks"):
        found = _launched_calls(trace, resolver)
    else:
        ranks = int((trace.meta.get("distributedInfo") or {}).get("world_size") or 1)
        found = _called_ops(trace, resolver, ranks)
    _name_ddp_buckets(found, trace.facts.get("ddp_buckets") or [])
    return found


def _called_ops(trace: Trace, resolver: Resolver, ranks: int) -> list[Call]:
    """The calls as the c10d ops the trace recorded, each with the transfer it made."""
    issued = [i for i, op in enumerate(trace.ops) if not op.annotation and kind_of(op.name)]
    issued.sort(key=lambda i: trace.ops[i].ts)
    kernels = _nccl_kernels_by_op(trace)
    gloo = _gloo_records(trace)
    found = []
    for i in issued:
        op = trace.ops[i]
        kind = kind_of(op.name)
        kernel = kernels.get(i)
        if kernel is not None:
            # NCCL names the dtype in a reducing kernel's name; an all-gather's moves bytes of any dtype, and its
            # c10d op's recorded input type says which
            itemsize = _kernel_itemsize(kernel.name) or _ITEMSIZE.get((op.dtypes or [None])[0])
            start, end, on_gpu = kernel.ts, kernel.end, True
        else:
            record = _take_gloo(gloo, kind, op, ranks)
            if record is None:
                start, end, itemsize = op.ts, op.end, None
            else:
                start, end = record.ts, record.end
                itemsize = _ITEMSIZE.get((record.dtypes or [None])[0])
            on_gpu = False
        stack, _, module, _ = resolver.resolve(i)
        found.append(Call(kind, _message_bytes(kind, _count(op.shapes), itemsize, ranks), op.ts, start, end,
                          stack[-1] if stack else None, module, i, on_gpu, _asynchronous(op), _fsdp_owner(trace, i)))
    return found


def _launched_calls(trace: Trace, resolver: Resolver) -> list[Call]:
    """A window that records no op (capture's ops=False) holds no c10d op: each NCCL kernel is a call, arrived at
    when its thread launched it, at the line that thread was on. Its kind and size are those of the flight
    recorder's record of the call (capture keeps the window's: distributed.ledger): the latest record made before
    the launch, of a kind the kernel can run, that no other kernel took. Without one (a kernel beyond its call's
    first, a record the recorder's ring let go), the kind the kernel's name says, and no size. A coalesced block's
    own record names no collective and is passed over: its kernel takes the record of the block's last call, and
    that call's size. A launch from a thread that runs no line of the program is a hook's in the backward (DDP's,
    FSDP2's): asynchronous."""
    own = trace.facts["own_marks"]
    base = trace.meta["baseTimeNanoseconds"]   # place_own_marks has checked that the trace has it
    records = sorted((c for c in own.get("collectives") or []
                      if str(c.get("group", "")).startswith("nccl:") and c.get("kind")), key=lambda c: c["created_ns"])
    created = [(c["created_ns"] - base) / 1e3 for c in records]   # on the trace's clock, as place_own_marks puts marks
    taken = [False] * len(records)
    kernels = sorted((g for g in trace.gpu if g.kind == "kernel" and g.launch >= 0 and is_comm_kernel(g.name)),
                     key=lambda g: trace.runtime[g.launch].ts)
    found = []
    for g in kernels:
        launch = trace.runtime[g.launch]
        named = _kernel_kind(g.name)
        j = bisect.bisect_right(created, launch.ts) - 1
        while j >= 0 and (taken[j] or not _runs(named, records[j]["kind"])):
            j -= 1
        record = {}
        if j >= 0:
            record, taken[j] = records[j], True
        stack, _, module, backward = resolver.for_runtime(g.launch)
        kind = record.get("kind") or named or "other"
        found.append(Call(kind, record.get("bytes"), launch.ts, g.ts, g.end, stack[-1] if stack else None, module,
                          -1, True, True if backward else None, _fsdp2_unit(kind, module)))
    return found


def _fsdp2_unit(kind: str, module: str | None) -> str | None:
    """Whose parameters an all-gather moves, where the window recorded no op (and so none of FSDP2's own marks):
    FSDP2 gathers a unit's parameters in that unit's forward pre-hook, inside the module's call, and fully_shard
    renames a module's class FSDP<Name>, so under a root so named the module is the unit ("FSDP2 h.3", as
    _fsdp_owner names it). A prefetch of the next unit, made inside this one's call, is named by this one."""
    if kind != "all_gather" or not module:
        return None
    root, _, unit = module.partition(".")
    return f"FSDP2 {unit or 'root'}" if root.startswith("FSDP") else None


def _runs(named: str | None, kind: str) -> bool:
    """Whether a kernel whose name says `named` (None: it names none) can run a call of `kind`: NCCL runs an
    all_to_all, a gather and a scatter as sends and receives, and a barrier as an all_reduce."""
    return named is None or named == kind or (named, kind) in _RUN_AS


_RUN_AS = {("send_recv", "all_to_all"), ("send_recv", "gather"), ("send_recv", "scatter"), ("all_reduce", "barrier")}


def _kernel_kind(name: str) -> str | None:
    found = _NCCL_KERNEL.match(name)
    return _NCCL_KERNEL_KINDS.get(found[1].lower()) if found else None


# FSDP2 wraps each collective it issues in a record_function that names the module whose parameters it moves:
# "FSDP::all_gather (layers.3)" (a prefetch too, inside "FSDP::forward_prefetch for layers.3"),
# "FSDP::post_backward_reduce (layers.3)"; the root module's carry no name, and a module with several parameter
# groups adds " [pg=N]".
_FSDP_MARK = re.compile(r"^FSDP::(?:all_gather|post_backward_reduce)(?: \((.+?)\))?(?: \[pg=\d+\])?$")


def _fsdp_owner(trace: Trace, i: int) -> str | None:
    while i >= 0:
        op = trace.ops[i]
        found = _FSDP_MARK.match(op.name) if op.annotation else None
        if found:
            return f"FSDP2 {found[1] or 'root'}"
        i = op.parent
    return None


def ddp_buckets(modules) -> list[list[dict]]:
    """For each DistributedDataParallel among `modules` (compiled by torch.compile or not), its gradient buckets
    in the order its reducer reduces them: [{"bytes": ..., "params": [names]}, ...]. DDP rebuilds its buckets in
    the order the first backward made the gradients ready, and its logging data names their parameters from then
    on; before, only their sizes."""
    from torch.nn.parallel import DistributedDataParallel

    out = []
    for ddp in modules:
        ddp = getattr(ddp, "_orig_mod", ddp)   # torch.compile(ddp): the program calls the OptimizedModule
        if not isinstance(ddp, DistributedDataParallel):
            continue
        try:
            data = ddp._get_ddp_logging_data()   # DDP's own record of its buckets (a private API: it may change)
        except (AttributeError, RuntimeError):
            continue
        rebuilt = bool(data.get("has_rebuilt_buckets"))
        sizes = str(data.get("rebuilt_bucket_sizes" if rebuilt else "bucket_sizes") or "")
        members = str(data.get("rebuilt_per_bucket_param_indices") or "") if rebuilt else ""
        # the reducer's parameters, which its indices count: those that want a gradient (a frozen embedding or a
        # LoRA base is in _module_parameters too)
        params = [p for p in (getattr(ddp, "_module_parameters", None) or ddp.module.parameters()) if p.requires_grad]
        names = {id(p): n for n, p in ddp.module.named_parameters()}
        indices = [[int(x) for x in part.split()] for part in members.split(",")] if members else []
        buckets = []
        for k, size in enumerate(x for x in sizes.split(",") if x.strip()):
            held = indices[k] if k < len(indices) else []
            buckets.append({"bytes": int(size), "params": [names.get(id(params[j]), f"#{j}") for j in held
                                                           if j < len(params)]})
        if buckets:
            out.append(buckets)
    return out


def _name_ddp_buckets(found: list[Call], ddps: list[list[dict]]) -> None:
    """Name DDP's gradient all-reduces by bucket: its reducer launches them strictly in bucket order, each of its
    bucket's size, so the calls are matched to the buckets in turn (a call of another size is someone else's)."""
    for buckets in ddps:
        k = 0
        for call in found:
            if call.kind == "all_reduce" and call.owner is None and call.nbytes == buckets[k]["bytes"]:
                call.owner = bucket_name(k, buckets[k]["params"])
                k = (k + 1) % len(buckets)


def bucket_name(index: int, params: list[str]) -> str:
    """"DDP bucket 0 (lm_head.weight … h.11.ln_2.bias, 14 tensors)": its first and last parameter."""
    if not params:
        return f"DDP bucket {index}"
    held = params[0] if len(params) == 1 else f"{params[0]} … {params[-1]}, {len(params)} tensors"
    return f"DDP bucket {index} ({held})"


def owners(calls: list[Call]) -> str | None:
    """What a group of calls moves, in the order they came: one owner by name, several by the first and last."""
    seen = list(dict.fromkeys(c.owner for c in calls if c.owner))
    if len(seen) <= 1:
        return seen[0] if seen else None
    buckets = [bucket_index(o) for o in seen]
    if None not in buckets:
        return "DDP buckets " + ", ".join(map(str, buckets))
    return f"{seen[0]} … {seen[-1].removeprefix('FSDP2 ')} ({len(seen)})"


_BUCKET = re.compile(r"^DDP bucket (\d+)")


def bucket_index(owner: str) -> int | None:
    """The DDP bucket an owner names ("DDP bucket 2 (...)": 2), or None."""
    found = _BUCKET.match(owner)
    return int(found[1]) if found else None


def _asynchronous(op) -> bool:
    """c10d's ops take async_op as their one bool argument (allreduce_(tensors, group, op, indices, asyncOp, ...))."""
    return "True" in (op.scalars or [])


def _nccl_kernels_by_op(trace: Trace) -> dict[int, object]:
    """For each c10d op, the NCCL kernel launched inside it (its launch's enclosing ops, walked up to the c10d op)."""
    out = {}
    for g in trace.gpu:
        if g.kind != "kernel" or not is_comm_kernel(g.name) or g.launch < 0:
            continue
        i = trace.runtime[g.launch].op
        while i >= 0 and not kind_of(trace.ops[i].name):
            i = trace.ops[i].parent
        if i >= 0:
            out.setdefault(i, g)
    return out


def _kernel_itemsize(name: str) -> int | None:
    for part in name.split("_"):
        if part in _KERNEL_DTYPE:
            return _KERNEL_DTYPE[part]
    return None


def _gloo_records(trace: Trace) -> dict[str, list]:
    """gloo's records of its transfers, by collective, in the order they started."""
    out: dict[str, list] = {}
    for op in trace.ops:
        found = _GLOO.match(op.name) if op.annotation else None
        if found:
            kind = _KINDS.get(found[1].replace("_", ""), found[1])
            out.setdefault(kind, []).append(op)
    for records in out.values():
        records.sort(key=lambda o: o.ts)
    return out


def _take_gloo(records: dict[str, list], kind: str, call, ranks: int) -> object | None:
    """The first record of `kind` not yet taken that started after the call and moves as many elements (gloo
    records one rank's share where the call's first argument is the whole message, or the other way round)."""
    pending = records.get(kind) or []
    elements = _count(call.shapes)
    sizes = (None,) if elements is None else (None, elements, elements * ranks, elements // ranks)
    for k, record in enumerate(pending):
        if record.ts >= call.ts - 1 and _count(record.shapes) in sizes:
            return pending.pop(k)
    return None
