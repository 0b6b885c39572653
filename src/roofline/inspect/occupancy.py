"""Theoretical occupancy: how many blocks of a kernel an SM holds at once, and which resource stops it at that.

The rules are CUDA's occupancy calculator's (cuda_occupancy.h), with each compute capability's limits from the
CUDA C++ Programming Guide's table of technical specifications:
- warps: a block takes ceil(threads / 32) warps, up to the SM's maximum of resident warps and blocks;
- registers: a warp's are allocated in units of 256 (a thread's count rounded up to 8), and an SM's register file
  is split between its four sub-partitions, each holding whole warps: a sub-partition of 16,384 registers holds
  floor(16384 / a warp's) warps, so the warps an SM holds by registers come in fours;
- shared memory: a block's static and dynamic shared memory, plus the 1 KiB the system reserves for each block
  from compute capability 8.0 on, rounded up to 128 bytes, against the most an SM can give (its largest carveout).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

WARP = 32
SUB_PARTITIONS = 4
REGISTER_UNIT = 256            # a warp's registers are allocated in these
REGISTERS_PER_SM = 65536
MAX_REGISTERS_PER_THREAD = 255
SHARED_UNIT = 128


@dataclass(frozen=True)
class Limits:
    """One compute capability's per-SM limits."""
    arch: str
    max_warps: int
    max_blocks: int
    max_shared: int            # bytes an SM can give its blocks (the largest carveout)
    max_shared_per_block: int  # bytes one block may have (with the opt-in attribute)
    reserved_shared: int       # bytes the system keeps for each block


LIMITS = {l.arch: l for l in (
    Limits("sm_70", 64, 32, 96 * 1024, 96 * 1024, 0),
    Limits("sm_75", 32, 16, 64 * 1024, 64 * 1024, 0),
    Limits("sm_80", 64, 32, 164 * 1024, 163 * 1024, 1024),
    Limits("sm_86", 48, 16, 100 * 1024, 99 * 1024, 1024),
    Limits("sm_89", 48, 24, 100 * 1024, 99 * 1024, 1024),
    Limits("sm_90", 64, 32, 228 * 1024, 227 * 1024, 1024),
    Limits("sm_100", 64, 32, 228 * 1024, 227 * 1024, 1024),
)}


def limits(arch: str) -> Limits:
    """The limits of "sm_90" (also "sm_90a", "90", 90)."""
    key = f"sm_{str(arch).removeprefix('sm_').rstrip('a')}"
    if key not in LIMITS:
        raise ValueError(f"arch must be one of {', '.join(LIMITS)}, got {arch!r}")
    return LIMITS[key]


@dataclass(frozen=True)
class Occupancy:
    arch: str
    threads: int               # a block's
    registers: int             # a thread's
    shared_bytes: int          # a block's, static and dynamic, as the kernel asks
    blocks: int                # resident on one SM at once
    warps: int                 # resident on one SM at once
    occupancy: float           # warps / the SM's maximum
    limiter: str               # "warps", "blocks", "registers" or "shared memory": what allows the fewest blocks
    by: dict                   # blocks an SM holds by each limit

    def to_dict(self) -> dict:
        return asdict(self)


def _round_up(value: int, unit: int) -> int:
    return -(-value // unit) * unit


def occupancy(arch: str, threads: int, registers: int, shared_bytes: int) -> Occupancy:
    """The theoretical occupancy of a kernel whose blocks have `threads` threads of `registers` registers each and
    `shared_bytes` of shared memory (static and dynamic)."""
    for name, value in (("threads", threads), ("registers", registers), ("shared_bytes", shared_bytes)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    if not 0 < threads <= 1024:
        raise ValueError(f"threads must be 1 to 1024 (a block's), got {threads}")
    if registers > MAX_REGISTERS_PER_THREAD:
        raise ValueError(f"registers must be at most {MAX_REGISTERS_PER_THREAD} a thread, got {registers}")
    lim = limits(arch)
    warps = -(-threads // WARP)
    per_warp = _round_up(max(registers, 1) * WARP, REGISTER_UNIT)
    warps_by_registers = SUB_PARTITIONS * (REGISTERS_PER_SM // SUB_PARTITIONS // per_warp)
    shared = _round_up(shared_bytes + lim.reserved_shared, SHARED_UNIT) if shared_bytes else 0
    by = {"warps": lim.max_warps // warps,
          "blocks": lim.max_blocks,
          "registers": warps_by_registers // warps if per_warp * warps <= REGISTERS_PER_SM else 0,
          "shared memory": (lim.max_shared // shared if shared_bytes <= lim.max_shared_per_block else 0)
          if shared else lim.max_blocks}
    blocks = min(by.values())
    limiter = min(by, key=lambda k: (by[k], k != "warps"))   # ties: the plainest reason
    return Occupancy(lim.arch, threads, registers, shared_bytes, blocks, blocks * warps,
                     blocks * warps / lim.max_warps, limiter, by)
