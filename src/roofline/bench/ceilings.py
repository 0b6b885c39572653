"""The device's ceilings, measured: what `roofline doctor` measures and every "% of roofline" is relative to.

A large device-to-device copy for DRAM bandwidth, a copy that stays in L2 for the L2's, and n x n x n matmuls for
each dtype's matrix throughput, each timed by bench.time with its usual budgets; the result is cached by device and
software (roofline.device reads it back). Here, above both the device's facts and the timer, so that device.py
needs nothing of bench.
"""

from __future__ import annotations

import time

import torch

from roofline.bench.timer import time as time_op
from roofline.device import (CEILINGS_CACHE, MATMUL_DTYPES, Ceilings, cache_key, float32_matmul_precision, info,
                             resolve, write_cache)


def _copy_bytes(device: torch.device) -> int:
    """A copy size far larger than every cache, that still fits in memory."""
    d = info(device)
    if d.kind == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(min(max(1 << 30, 16 * (d.l2_bytes or 0)), free // 4))
    return int(max(256 << 20, 16 * (d.llc_bytes or 0)))


def _details(prefix: str, m, **facts) -> dict:
    """How a ceiling was measured: its facts, the median time and any warnings, keys prefixed."""
    details = {f"{prefix}_{k}": v for k, v in facts.items()}
    details[f"{prefix}_ms"] = m.median
    if m.warnings:
        details[f"{prefix}_warnings"] = m.warnings
    return details


# Budgets as in bench.time: long runs of matmuls soon hit the power cap and the clock drops (measured:
# docs/measurement.md), and a ceiling should be what a benchmark of usual length can reach.
def measure_bandwidth_gbps(device=None, nbytes: int | None = None, rep_ms: float = 100) -> tuple[float, dict]:
    """DRAM bandwidth of a large device-to-device copy, counting bytes read plus written."""
    device = resolve(device)
    nbytes = nbytes or _copy_bytes(device)
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    m = time_op(dst.copy_, src, flush=False, rep_ms=rep_ms, warn=False)
    return 2 * nbytes / (m.median * 1e-3) / 1e9, _details("copy", m, bytes=nbytes)


def measure_l2_gbps(device=None, rep_ms: float = 100) -> tuple[float, dict]:
    """Bandwidth of a device-to-device copy whose source and destination together take half the L2 cache, copied
    again and again (no flush): what an op whose working set stays in L2 can reach, read plus written."""
    device = resolve(device)
    nbytes = info(device).l2_bytes // 4
    # fp32, so that the copy moves 16 bytes an instruction (at L2's rate a byte-wise copy is bound by
    # instructions, and reads below even the DRAM's bandwidth); in a CUDA graph, so that the launches of so
    # short a copy do not count
    src = torch.randn(nbytes // 4, device=device)
    dst = torch.empty_like(src)
    m = time_op(dst.copy_, src, flush=False, cuda_graph=True, rep_ms=rep_ms, warn=False)
    return 2 * nbytes / (m.median * 1e-3) / 1e9, _details("l2_copy", m, bytes=nbytes)


def measure_matmul_tflops(dtype_key: str, device=None, n: int | None = None, rep_ms: float = 100) -> tuple[float, dict]:
    """Throughput of an n x n x n matmul on random inputs (not zeros: they run faster)."""
    device = resolve(device)
    if n is None:
        n = 8192 if device.type == "cuda" else 1024
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}[dtype_key]
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    with float32_matmul_precision("high" if dtype_key == "tf32" else "highest"):
        m = time_op(torch.matmul, a, b, flush=False, rep_ms=rep_ms, warn=False)
    return 2 * n**3 / (m.median * 1e-3) / 1e12, _details(f"matmul_{dtype_key}", m, n=n)


def measure_ceilings(device=None, save: bool = True, progress=None) -> Ceilings:
    """Measure this device's ceilings now (seconds of work) and cache them.

    progress, if given, is called with a short text before each measurement.
    """
    device = resolve(device)
    d = info(device)
    step = progress or (lambda text: None)
    details: dict = {}
    step("DRAM bandwidth (device-to-device copy)")
    gbps, extra = measure_bandwidth_gbps(device)
    details.update(extra)
    l2_gbps = None
    if d.kind == "cuda" and d.l2_bytes:
        step("L2 bandwidth (a copy that fits in L2)")
        l2_gbps, extra = measure_l2_gbps(device)
        details.update(extra)
    tflops = {}
    # The CPU's matrix ceiling is its fp32 rate: it has no bf16/tf32 matrix units that torch uses.
    keys = MATMUL_DTYPES if d.kind == "cuda" else ("fp32",)
    for key in keys:
        step(f"{key} matmul")
        tflops[key], extra = measure_matmul_tflops(key, device)
        details.update(extra)
    c = Ceilings(
        device=d.name,
        source="measured",
        dram_gbps=gbps,
        matmul_tflops=tflops,
        l2_gbps=l2_gbps,
        l2_bytes=d.l2_bytes if d.kind == "cuda" else None,
        measured_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        versions={"torch": d.torch, "cuda": d.cuda, "driver": d.driver, "triton": d.triton},
        details=details,
    )
    if save:
        write_cache(CEILINGS_CACHE, cache_key(device), c.to_dict())
    return c
