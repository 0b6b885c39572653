"""Timing a collective across ranks, with the op timer's statistics: median and 95% interval over rounds.

Called on every rank of an initialized process group (NCCL on GPUs, gloo on CPUs), with the same arguments:

    t = roofline.bench.time_collective("all_reduce", 256 << 20)     # a CollectiveTiming, the same on every rank
    t.busbw_gbps, t.median_ms, t.slowest_rank

Each round starts at a barrier and times `iters` back-to-back calls (CUDA events on the current stream on a GPU,
perf_counter on a CPU). A collective ends for everyone when the last rank arrives, and a rank that came late
times less of it, so each round's time is the slowest rank's, as nccl-tests reports it; the ranks' times are
all-gathered, and every rank returns the same result. Before it is timed, each collective's result is checked
(an all_reduce of each rank's number sums them, ...), so that a timing never stands for work that did not
happen.

Bandwidth as nccl-tests defines it (its doc/PERFORMANCE.md): `nbytes` is the size of the whole message (for
all_gather the gathered output, for reduce_scatter its input, for all_to_all what one rank sends), algbw =
nbytes / time, and the bus bandwidth, comparable to the hardware's peak whatever the rank count n:

    all_reduce                                 busbw = algbw * 2 (n - 1) / n
    all_gather, reduce_scatter, all_to_all     busbw = algbw * (n - 1) / n
    broadcast, reduce, send_recv               busbw = algbw

send_recv: each rank sends to the next and receives from the one before (a ring of point-to-point transfers).
"""

from __future__ import annotations

import time as _time
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from roofline.bench.stats import median_ci

# The flat-tensor forms of all_gather and reduce_scatter, by their newer names where torch has them (2.13 warns
# that the older ones are deprecated; 2.11 has only those).
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
ROUNDS = 9            # rounds of timed calls: the fewest that give a 95% sign-test interval, and one more
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce", "send_recv")


def bus_factor(kind: str, ranks: int) -> float:
    """busbw / algbw for a collective of `kind` over `ranks` ranks (nccl-tests' definitions)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}; got {kind!r}")
    if ranks < 1:
        raise ValueError(f"ranks must be at least 1, got {ranks}")
    if kind == "all_reduce":
        return 2 * (ranks - 1) / ranks
    if kind in ("all_gather", "reduce_scatter", "all_to_all"):
        return (ranks - 1) / ranks
    return 1.0


@dataclass(frozen=True)
class CollectiveTiming:
    kind: str
    nbytes: int                    # the message, as nccl-tests sizes it (see the module's docstring)
    ranks: int
    dtype: str
    iters: int                     # calls per round
    rounds_ms: tuple               # per call, each round's slowest rank
    rank_ms: tuple                 # per call, each rank's median over rounds
    median_ms: float
    low_ms: float                  # the median's 95% interval over rounds
    high_ms: float

    @property
    def algbw_gbps(self) -> float:
        return self.nbytes / (self.median_ms * 1e-3) / 1e9

    @property
    def busbw_gbps(self) -> float:
        return self.algbw_gbps * bus_factor(self.kind, self.ranks)

    @property
    def slowest_rank(self) -> int:
        return max(range(self.ranks), key=lambda r: self.rank_ms[r])

    def to_dict(self) -> dict:
        return {**asdict(self), "rounds_ms": list(self.rounds_ms), "rank_ms": list(self.rank_ms),
                "algbw_gbps": self.algbw_gbps, "busbw_gbps": self.busbw_gbps, "slowest_rank": self.slowest_rank}


class _Collective:
    """Buffers for one collective of `nbytes` on this rank, its call, and the check of its result."""

    def __init__(self, kind: str, nbytes: int, dtype: torch.dtype, device: torch.device, group):
        self.kind, self.group = kind, group
        self.rank, self.n = dist.get_rank(group), dist.get_world_size(group)
        count = nbytes // torch.empty((), dtype=dtype).element_size()
        chunk = count // self.n
        make = lambda numel: torch.empty(numel, dtype=dtype, device=device)  # noqa: E731
        if kind == "all_gather":
            self.input, self.output = make(chunk), make(chunk * self.n)
        elif kind == "reduce_scatter":
            self.input, self.output = make(chunk * self.n), make(chunk)
        elif kind == "all_to_all":
            self.input, self.output = make(chunk * self.n), make(chunk * self.n)
        else:
            self.input = self.output = make(count)
        if kind == "send_recv":
            self.output = make(count)

    def __call__(self) -> None:
        g, kind = self.group, self.kind
        if kind == "all_reduce":
            dist.all_reduce(self.input, group=g)
        elif kind == "all_gather":
            _all_gather(self.output, self.input, group=g)
        elif kind == "reduce_scatter":
            _reduce_scatter(self.output, self.input, group=g)
        elif kind == "all_to_all":
            dist.all_to_all_single(self.output, self.input, group=g)
        elif kind == "broadcast":
            dist.broadcast(self.input, src=dist.get_global_rank(g, 0) if g else 0, group=g)
        elif kind == "reduce":
            dist.reduce(self.input, dst=dist.get_global_rank(g, 0) if g else 0, group=g)
        else:
            peer = lambda r: dist.get_global_rank(g, r % self.n) if g else r % self.n  # noqa: E731
            ops = [dist.P2POp(dist.isend, self.input, peer(self.rank + 1), g),
                   dist.P2POp(dist.irecv, self.output, peer(self.rank - 1), g)]
            for request in dist.batch_isend_irecv(ops):
                request.wait()

    def check(self) -> None:
        """Run it once on known values and check what arrived: each rank's input holds its rank + 1."""
        n, rank = self.n, self.rank
        self.input.fill_(rank + 1)
        self()
        out, kind = self.output, self.kind
        if kind == "all_reduce":
            expected = torch.full_like(out, n * (n + 1) / 2)
        elif kind == "all_gather":
            expected = torch.arange(1, n + 1, dtype=out.dtype, device=out.device).repeat_interleave(out.numel() // n)
        elif kind == "reduce_scatter":
            expected = torch.full_like(out, n * (n + 1) / 2)
        elif kind == "all_to_all":
            expected = torch.arange(1, n + 1, dtype=out.dtype, device=out.device).repeat_interleave(out.numel() // n)
        elif kind == "broadcast":
            expected = torch.full_like(out, 1)
        elif kind == "reduce":
            if rank != 0:
                return   # only the destination's buffer is defined after a reduce (gloo uses the others' as scratch)
            expected = torch.full_like(out, n * (n + 1) / 2)
        else:
            expected = torch.full_like(out, (rank - 1) % n + 1)
        if not torch.equal(out, expected):
            raise RuntimeError(f"{kind} on rank {rank} of {n} gave wrong values (first {out.flatten()[:4].tolist()}, "
                               f"expected {expected.flatten()[:4].tolist()}): it cannot be timed")


def _timed_round(call, iters: int, cuda: bool, group) -> float:
    """ms per call of `iters` calls, on this rank, started together at a barrier."""
    dist.barrier(group=group)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters
    began = _time.perf_counter()
    for _ in range(iters):
        call()
    return (_time.perf_counter() - began) * 1e3 / iters


def _gathered(value: float, device: torch.device, group) -> list[float]:
    """Every rank's value, in rank order, on every rank."""
    mine = torch.tensor([value], dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(every, mine, group=group)
    return [float(t.item()) for t in every]


def time_collective(kind: str, nbytes: int, *, dtype: torch.dtype = torch.bfloat16, group=None,
                    rep_ms: float = 100.0, rounds: int = ROUNDS, warmup: int = 5) -> CollectiveTiming:
    """Time one collective of `nbytes` (see the module's docstring) on every rank of `group` (default: the world).
    rep_ms: the time budget of the timed calls, shared by the rounds; every rank must pass the same arguments."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("time_collective needs an initialized process group (torch.distributed.init_process_group)")
    bus_factor(kind, 1)   # the kind, checked
    n = dist.get_world_size(group)
    itemsize = torch.empty((), dtype=dtype).element_size()
    if not isinstance(nbytes, int) or nbytes < n * itemsize:
        raise ValueError(f"nbytes must be an int of at least {n * itemsize} (one {dtype} element a rank), got {nbytes!r}")
    if rounds < 6:
        raise ValueError(f"rounds must be at least 6 for a 95% interval, got {rounds}")
    nbytes -= nbytes % (n * itemsize)    # whole elements, split evenly over the ranks
    backend = dist.get_backend(group)
    cuda = backend == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    collective = _Collective(kind, nbytes, dtype, device, group)
    collective.check()
    for _ in range(warmup):
        collective()
    # Calls per round from one timed call, the same on every rank (the slowest rank's estimate).
    estimate_ms = max(_gathered(_timed_round(collective, 1, cuda, group), device, group))
    iters = max(1, min(1000, int(rep_ms / rounds / max(estimate_ms, 1e-3))))
    per_rank = [_timed_round(collective, iters, cuda, group) for _ in range(rounds)]
    table = [_gathered(ms, device, group) for ms in per_rank]          # [round][rank]
    slowest = [max(row) for row in table]
    low, median, high = median_ci(slowest)
    rank_ms = tuple(sorted(row[r] for row in table)[rounds // 2] for r in range(n))
    return CollectiveTiming(kind, nbytes, n, str(dtype).removeprefix("torch."), iters, tuple(slowest), rank_ms,
                            median, low, high)
