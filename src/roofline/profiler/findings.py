"""Findings: deterministic rules over a Report, each naming a problem, its evidence, where it is, and what it costs.

Every rule is a function `rule(report) -> list[Finding]`, registered in RULES. The estimated
gain is the GPU (or wall) time the fix would save in the profiled window, by a stated model:
rules overlap (TF32 and bf16 autocast both speed up the same matmuls), so gains are not to be
summed. Gains that are GPU idle time (launch-bound, host-bound, host syncs) are the program's
without the profiler where steps outside the window were timed (report.idle_scale, see
overhead.py): the profiler stretches the host, and so the idle. Findings are ranked by gain; severity is the
gain's share of the window's wall time, unprofiled where known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roofline.profiler.attribution import Location
from roofline.profiler.costs import MATMUL_KEY, ParameterSet
from roofline.profiler.kernels import category, short_name

MIN_SHARE = 0.01              # a finding must be worth at least 1% of the profiled wall time
PINNED_H2D_GBPS = 25.0        # host<->device rate assumed for pinned copies (PCIe 4 x16 achieves ~25)
SDPA_EFFICIENCY = 0.45        # share of the matmul ceiling a flash kernel reaches (SDPA's flash forward in
                              # benchmarks/results/h100-tune.md, run 7, against doctor's measured bf16 ceiling)
ALIGNED_EFFICIENCY = 0.7      # share of the matmul ceiling an aligned matmul of the same size is assumed to reach


@dataclass
class Finding:
    id: str
    title: str
    message: str
    est_gain_ms: float
    location: Location | None = None
    evidence: dict = field(default_factory=dict)
    severity: str = "low"
    ops: list = field(default_factory=list, repr=False)   # the op rows it is about, for verify.py to rebuild
    verified: object = None       # verify.Verification, where --verify measured the fix

    def to_dict(self) -> dict:
        loc = {"file": self.location.file, "line": self.location.line} if self.location else None
        return {"id": self.id, "severity": self.severity, "title": self.title, "message": self.message,
                "evidence": self.evidence, "location": loc, "est_gain_ms": round(self.est_gain_ms, 4),
                "verified": self.verified.to_dict() if self.verified is not None else None}


def _where(locations: dict) -> Location | None:
    known = {k: v for k, v in locations.items() if k is not None}
    return max(known, key=known.get) if known else None


def _time_by_location(ops) -> dict:
    """Location -> device time, summed over op rows."""
    locations: dict = {}
    for o in ops:
        for loc, t in o.locations.items():
            locations[loc] = locations.get(loc, 0.0) + t
    return locations


def _at(loc: Location | None) -> str:
    return f" at {loc.file}:{loc.line}" if loc else ""


# --------------------------------------------------------------------------- rules

def _unprofiled_note(report) -> str:
    o = report.overhead
    if o is None:
        return ""
    return (f" (without the profiler: its steps took {o.step_ms:.2f} ms unrecorded against {o.profiled_step_ms:.2f} "
            f"ms recorded, so idle time is scaled by {o.idle_scale:.2f})")


def host_sync_in_loop(report) -> list[Finding]:
    """A line that synchronizes with the GPU again and again (.item(), .cpu(), .tolist(), print of a tensor)."""
    out = []
    # The sync's own bound (the host's lead) holds with or without the profiler; what the profiler changes is
    # how much idle there is to remove: no more than the unprofiled program's. (Scaling the gain by the window's
    # idle ratio, whose host idle the profiler inflates most, cut item_sync's estimate to under a third of what
    # removing the sync saved; measured: benchmarks/results/h100-profile.md.)
    unprofiled_idle = report.timeline.idle_total_us * report.idle_scale
    for s in report.timeline.syncs:
        if s.location is None or s.count < 3:
            continue
        out.append(Finding(
            "host-sync-in-loop", f"host waits for the GPU {s.count} times{_at(s.location)}",
            f"`{s.call}` ran {s.count} times from {s.location}: each time the host stopped queuing work until the "
            f"GPU caught up ({s.wait_us / 1e3:.2f} ms in all), and the GPU then idled {s.idle_us / 1e3:.2f} ms in all "
            "before the next launch (recorded). Keep values on the GPU (accumulate `loss.detach()`, not "
            "`loss.item()`) and read them once, after the loop or every N steps. The gain counts only the idle time "
            "the host's lead would have covered, a host that barely waited being itself the bottleneck, and no more "
            f"than the program idles without the profiler{_unprofiled_note(report)}.",
            min(s.gain_us, unprofiled_idle) / 1e3, s.location,
            {"call": s.call, "count": s.count, "host_wait_ms": s.wait_us / 1e3, "gpu_idle_ms": s.idle_us / 1e3}))
    return out


def pageable_copies(report) -> list[Finding]:
    """Host-device copies from pageable memory: staged, slower, and blocking."""
    by_line: dict = {}
    for w in report.attribution.work:
        if w.kind == "memcpy" and "Pageable" in w.name:
            g = report.trace.gpu[w.index]
            direction = "DtoH" if "DtoH" in w.name else "HtoD"
            row = by_line.setdefault((w.location, direction), [0, 0.0, 0])
            row[0] += 1
            row[1] += w.us
            row[2] += g.bytes or 0
    out = []
    for (loc, direction), (count, us, nbytes) in by_line.items():
        pinned_us = nbytes / (PINNED_H2D_GBPS * 1e3)
        gbps = nbytes / us / 1e3 if us else 0.0
        out.append(Finding(
            "pageable-copy", f"{count} copies from pageable host memory{_at(loc)}",
            f"{count} copies moved {nbytes / 1e9:.2f} GB between pageable host memory and the GPU at {gbps:.1f} GB/s, "
            "each blocking the host. Pin the host tensors once (`tensor.pin_memory()`, or `DataLoader(pin_memory=True)`) "
            f"and copy with `non_blocking=True`; at {PINNED_H2D_GBPS:.0f} GB/s (a pinned copy over PCIe 4) they would take "
            f"{pinned_us / 1e3:.1f} ms instead of {us / 1e3:.1f} ms.",
            max(us - pinned_us, 0.0) / 1e3, loc,
            {"copies": count, "bytes": nbytes, "ms": us / 1e3, "gbps": gbps, "assumed_pinned_gbps": PINNED_H2D_GBPS,
             "direction": direction}))
    return out


def _fp32_matmuls(report):
    return [o for o in report.ops if o.rule in ("matmul", "conv", "attention") and o.matmul_dtype == "fp32"]


def fp32_matmul_without_tf32(report) -> list[Finding]:
    """fp32 matmuls on the CUDA cores when TF32 tensor cores would run them several times faster."""
    slow = [o for o in _fp32_matmuls(report) if o.tensor_cores is False]
    tf32 = report.peaks.matmul_tflops.get("tf32")
    if not slow or not tf32:
        return []
    us = sum(o.us for o in slow)
    flops = sum(o.flops for o in slow)
    tf32_us = flops / (tf32 * 1e6)
    locations = _time_by_location(slow)
    loc = _where(locations)
    return [Finding(
        "fp32-matmul-no-tf32", "fp32 matmuls without TF32",
        f"{sum(o.count for o in slow)} fp32 matmuls took {us / 1e3:.1f} ms on the CUDA cores "
        f"({flops / us / 1e6:.1f} TFLOP/s). With TF32 (`torch.backends.cuda.matmul.allow_tf32 = True`, or "
        "`torch.set_float32_matmul_precision('high')`) they run on tensor cores: at the measured TF32 ceiling of "
        f"{tf32:.0f} TFLOP/s, {tf32_us / 1e3:.1f} ms. TF32 keeps fp32 range with a 10-bit mantissa, which training tolerates.",
        max(us - tf32_us, 0.0) / 1e3, loc,
        {"matmuls": sum(o.count for o in slow), "ms": us / 1e3, "tflops": flops / us / 1e6, "tf32_peak_tflops": tf32},
        ops=slow)]


def no_autocast(report) -> list[Finding]:
    """Matmuls dominate in fp32 while bf16 autocast would double or more their speed."""
    fp32 = _fp32_matmuls(report)
    bf16 = report.peaks.matmul_tflops.get("bf16")
    busy = report.timeline.busy_us
    us = sum(o.us for o in fp32)
    if not fp32 or not bf16 or busy <= 0 or us < 0.3 * busy:
        return []
    flops = sum(o.flops for o in fp32)
    bf16_us = flops / (bf16 * 1e6)
    locations = _time_by_location(fp32)
    return [Finding(
        "no-autocast", "matmuls dominate and run in fp32",
        f"fp32 matmuls take {us / 1e3:.1f} ms, {us / busy:.0%} of GPU busy time. Under "
        "`torch.autocast('cuda', dtype=torch.bfloat16)` they run in bf16 with fp32 accumulation: at the "
        f"bf16 ceiling of {bf16:.0f} TFLOP/s, {bf16_us / 1e3:.1f} ms. (Overlaps with TF32: take one or the other.)",
        max(us - bf16_us, 0.0) / 1e3, _where(locations),
        {"ms": us / 1e3, "share_of_busy": us / busy, "bf16_peak_tflops": bf16}, ops=fp32)]


def eager_elementwise_chain(report) -> list[Finding]:
    """Runs of three or more elementwise kernels launched back to back from one function, in eager mode:
    each reads and writes whole tensors that one fused kernel would touch once."""
    trace, work = report.trace, report.attribution.work
    order = sorted((i for i, w in enumerate(work) if w.kind == "kernel"), key=lambda i: trace.gpu[work[i].index].ts)
    chains: dict = {}

    def close(run):
        if len(run) < 3:
            return
        first = work[run[0]].location
        total = sum(work[i].us for i in run)
        longest = max(work[i].us for i in run)
        row = chains.setdefault((first.file, first.function), [first, 0, 0.0, 0.0, 0])
        row[1] += 1
        row[2] += total
        row[3] += total - longest
        row[4] += len(run)

    run: list[int] = []
    for i in order:
        w = work[i]
        ok = (not w.backward and w.location is not None and category(w.name) == "elementwise"
              and "multi_tensor_apply" not in w.name)   # foreach kernels: see unfused_optimizer
        if ok and run and (work[run[-1]].location.file, work[run[-1]].location.function) == (w.location.file, w.location.function):
            run.append(i)
            continue
        close(run)
        run = [i] if ok else []
    close(run)
    out = []
    for first, runs, total, gain, kernels in chains.values():
        out.append(Finding(
            "eager-elementwise-chain", f"chains of small elementwise kernels in {first.function}",
            f"{first.function} ({first.file}) launched {runs} chains of elementwise kernels back to back "
            f"({kernels} kernels, {total / 1e3:.1f} ms), each kernel reading and writing whole tensors. Fused, each chain "
            "costs about its largest kernel: wrap the function in `torch.compile`, or use a fused op from roofline.ops.",
            gain / 1e3, first, {"chains": runs, "kernels": kernels, "ms": total / 1e3}))
    return out


_ADAM_LIKE = ("lerp", "addcdiv", "addcmul", "sqrt")


def unfused_optimizer(report) -> list[Finding]:
    """An optimizer stepping with foreach (multi-tensor) kernels, one pass over the parameters per operation,
    where its fused implementation makes one pass in all."""
    foreach = [o for o in report.ops if o.rule == "foreach" and not o.backward]
    if not foreach or not report.peaks.gbps:
        return []
    us = sum(o.us for o in foreach)
    steps = min(o.count for o in foreach)   # an op that runs once per step (Adam calls some twice)
    params = max([sum(_numel(s) for s in o.shapes[0] if isinstance(s, list)) for o in foreach
                  if o.shapes and isinstance(o.shapes[0], list)] + [0])
    if not params:   # lists too long for the profiler to record: the optimizer's own count, if capture saw it
        known = ParameterSet.from_facts(report.trace.facts)
        params = known.numel if known else 0
    if not params:
        return []
    adam = any(k in o.name for o in foreach for k in _ADAM_LIKE)
    # Fused Adam(W) reads params, grads and both moments and writes params and moments: 7 passes of fp32;
    # fused SGD with momentum about 5.
    fused_us = steps * (7 if adam else 5) * params * 4 / (report.peaks.gbps * 1e3)
    locations = _time_by_location(foreach)
    return [Finding(
        "unfused-optimizer", "the optimizer runs unfused, one pass over the parameters per operation",
        f"{sum(o.count for o in foreach)} foreach kernels ({len(foreach)} kinds) updated {params / 1e6:.1f} M parameters "
        f"in {us / 1e3:.1f} ms over {steps} steps. The fused implementation (`fused=True`, e.g. "
        f"`torch.optim.{'AdamW' if adam else 'SGD'}(params, fused=True)`) reads and writes each parameter and its "
        f"state once per step: about {fused_us / 1e3:.1f} ms at the measured bandwidth.",
        max(us - fused_us, 0.0) / 1e3, _where(locations),
        {"ms": us / 1e3, "steps": steps, "parameters": params, "fused_estimate_ms": fused_us / 1e3, "adam": adam},
        ops=foreach)]


def _starved_us(report, unprofiled: bool = True) -> float:
    """GPU idle while the host was late to launch (launch and host causes), for the program without the
    profiler (unprofiled) or as recorded."""
    tl = report.timeline
    return (tl.idle_us.get("launch", 0.0) + tl.idle_us.get("host", 0.0)) * (report.idle_scale if unprofiled else 1.0)


def _median_kernel_us(report) -> float | None:
    durations = sorted(w.us for w in report.attribution.work if w.kind == "kernel")
    return durations[len(durations) // 2] if durations else None


def _short_kernels_starve(report, median: float | None) -> bool:
    """launch-bound's pattern: short kernels (median under 20 us) and a GPU busy under half the time."""
    return (median is not None and median < 20.0 and report.timeline.window_us > 0
            and report.timeline.busy_us < 0.5 * report.unprofiled_wall_us)


def launch_bound(report) -> list[Finding]:
    """The GPU waits on the host between short kernels: launch overhead, not GPU work, sets the pace."""
    tl = report.timeline
    median = _median_kernel_us(report)
    if not _short_kernels_starve(report, median):
        return []
    kernels = [w for w in report.attribution.work if w.kind == "kernel"]
    starved = _starved_us(report)
    busy_share = tl.busy_us / report.unprofiled_wall_us
    counts: dict = {}
    for w in kernels:
        counts[w.location] = counts.get(w.location, 0) + 1
    return [Finding(
        "launch-bound", "the GPU waits on kernel launches",
        f"{len(kernels)} kernels, median {median:.1f} us long; the GPU was busy {busy_share:.0%} of the "
        f"time and idle {starved / 1e3:.1f} ms waiting for the host to launch the next kernel"
        f"{_unprofiled_note(report)}. "
        "Replay the steady part as a CUDA graph (`torch.cuda.graphs`, `torch.cuda.make_graphed_callables`, or "
        "`torch.compile(mode='reduce-overhead')`), or fuse kernels so there are fewer to launch.",
        starved / 1e3, _where(counts),
        {"kernels": len(kernels), "median_kernel_us": median, "busy_share": busy_share,
         "launch_idle_ms": tl.idle_us.get("launch", 0.0) * report.idle_scale / 1e3,
         "host_idle_ms": tl.idle_us.get("host", 0.0) * report.idle_scale / 1e3,
         "starved_profiled_ms": _starved_us(report, unprofiled=False) / 1e3})]


HOST_BOUND_SHARE = 0.05   # the GPU waiting on the host this share of the (unprofiled) time is worth naming lines


def host_bound(report) -> list[Finding]:
    """The GPU waits on the host, with kernels too long for launch-bound to explain it: name the lines whose
    host time (Python, dispatch, launches) sets the pace."""
    starved, wall = _starved_us(report), report.unprofiled_wall_us
    if (not report.host or wall <= 0 or starved < HOST_BOUND_SHARE * wall
            or _short_kernels_starve(report, _median_kernel_us(report))):
        return []
    top = report.host[:3]
    spent = ", ".join(f"{h.location.file}:{h.location.line} {report.host_ms_per_step(h.host_us):.2f} ms"
                      + (f" (backward {report.host_ms_per_step(h.backward_us):.2f})" if h.backward_us else "")
                      for h in top)
    return [Finding(
        "host-bound", f"the GPU waits on the host {starved / wall:.0%} of the time",
        f"The GPU idled {starved / 1e3:.1f} ms waiting for work from the host{_unprofiled_note(report)}. The host's "
        f"time per step went most to {spent}. Replay the step as a CUDA graph (`torch.compile(mode="
        "'reduce-overhead')`, `torch.cuda.graphs`), compile it so that fewer, larger kernels are launched, or move "
        "Python work (data preparation, logging) out of the step.",
        starved / 1e3, top[0].location,
        {"gpu_waits_ms": starved / 1e3, "share": starved / wall,
         "host_ms_per_step": {str(h.location): report.host_ms_per_step(h.host_us) for h in top}})]


def _out_numel_of_matmul(o) -> int | None:
    shapes = [s for s in o.shapes if isinstance(s, list) and s and all(isinstance(d, int) for d in s)]
    if o.name not in ("aten::bmm", "aten::mm", "aten::matmul", "aten::baddbmm") or len(shapes) < 2:
        return None
    x, w = shapes[-2], shapes[-1]
    batch = 1
    for d in x[:-2]:
        batch *= d
    return batch * x[-2] * w[-1]


def _sdpa_ceiling(peaks, dtype: str) -> tuple[str, float | None]:
    """The matmul ceiling SDPA's kernels work against for scores of this dtype: bf16/fp16 tensor cores, and for
    fp32 the memory-efficient kernel's 3xTF32 (three TF32 products per fp32 one, so a third of the TF32
    ceiling; its fp32 results for GPT-2's attention agreed with float64 as closely as 3xTF32's do and TF32's
    alone would not)."""
    key = MATMUL_KEY.get(dtype, "bf16")
    if key == "fp32" and peaks.matmul_tflops.get("tf32"):
        return "3xTF32", peaks.matmul_tflops["tf32"] / 3
    return key, peaks.matmul_tflops.get(key) or peaks.matmul_tflops.get("bf16")


def manual_attention(report) -> list[Finding]:
    """Attention written as matmul, softmax, matmul: the [N x N] scores make several round trips to memory."""
    out = []
    for sm in report.ops:
        if sm.rule != "softmax" or sm.backward or not sm.shapes or len(sm.shapes[0]) < 3 or sm.shapes[0][-1] < 128:
            continue
        shape = sm.shapes[0]
        scores = 1
        for d in shape:
            scores *= d
        involved = []
        for o in report.ops:
            sizes = [_numel(s) for s in o.shapes if isinstance(s, list) and all(isinstance(d, int) for d in s)]
            if scores in sizes or _out_numel_of_matmul(o) == scores:
                involved.append(o)
        heads = scores // (shape[-2] * shape[-1])
        head_dim = next((o.shapes[-1][-2] for o in involved if _out_numel_of_matmul(o) == scores and not o.backward), 64)
        has_backward = any(o.backward for o in involved)
        # A mask filled into the scores is taken as causal, as in a decoder's training (padding masks are
        # rarer there): is_causal=True skips the hidden half of the scores.
        masked = any("masked_fill" in o.name for o in involved)
        flops = (4.0 * heads * shape[-2] * shape[-1] * head_dim * (3.5 if has_backward else 1.0)
                 * (0.5 if masked else 1.0) * max(sm.count, 1))
        key, peak = _sdpa_ceiling(report.peaks, sm.dtypes[0] if sm.dtypes else "")
        sdpa_us = flops / (peak * SDPA_EFFICIENCY * 1e6) if peak else 0.0
        us = sum(o.us for o in involved)
        call = "is_causal=True" if masked else "is_causal=..."
        # k and v repeated to the query heads in the same function: grouped-query attention
        functions = {loc.function for loc in sm.locations if loc is not None}
        grouped = any(o.name == "aten::repeat_interleave" and any(loc is not None and loc.function in functions
                                                                  for loc in o.locations) for o in report.ops)
        gqa_note = ""
        if grouped:
            gqa_note = (" k and v are repeated to the query heads (grouped-query attention): "
                        + ("in fp32 keep the repeat and call SDPA without enable_gqa, which would send fp32 to its "
                           "math path (its fused kernels take grouped heads only in fp16/bf16)."
                           if key == "3xTF32" else "enable_gqa=True runs flash on the shared heads, no repeat needed."))
        out.append(Finding(
            "manual-attention", "attention written as matmul + softmax + matmul",
            f"softmax over {shape} scores, with the matmuls and elementwise ops around it, took {us / 1e3:.1f} ms "
            f"({len(involved)} ops touching the {shape[-2]}x{shape[-1]} score matrix"
            + (", a mask filled in: taken as causal" if masked else "") + "). "
            f"`torch.nn.functional.scaled_dot_product_attention(q, k, v, {call})` computes the same in a flash "
            f"kernel that never writes the scores: about {sdpa_us / 1e3:.1f} ms at {SDPA_EFFICIENCY:.0%} of the "
            f"{key} ceiling.{gqa_note}",
            max(us - sdpa_us, 0.0) / 1e3, _where(sm.locations),
            {"scores_shape": shape, "ops": len(involved), "ms": us / 1e3, "sdpa_estimate_ms": sdpa_us / 1e3,
             "head_dim": head_dim, "dtype": sm.dtypes[0] if sm.dtypes else None, "backward": has_backward,
             "masked": masked, "grouped_query": grouped},
            ops=involved))
    return out


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


_ALIGN = {"bf16": 8, "fp16": 8, "fp32": 4, "fp8": 16}


def misaligned_matmul(report) -> list[Finding]:
    """Matmuls whose dimensions are not multiples of 16 bytes' worth of elements: tensor cores run them padded or not at all."""
    out = []
    for o in report.ops:
        if o.rule != "matmul" or o.matmul_dtype not in _ALIGN or o.pct_of_roofline is None:
            continue
        shapes = [s for s in o.shapes if isinstance(s, list) and len(s) >= 2 and all(isinstance(d, int) for d in s)]
        if len(shapes) < 2:
            continue
        x, w = shapes[-2], shapes[-1]
        dims = {"M": x[-2], "K": x[-1], "N": w[-1]}
        bad = {k: v for k, v in dims.items() if v % _ALIGN[o.matmul_dtype]}
        if not bad or o.pct_of_roofline >= ALIGNED_EFFICIENCY:
            continue
        target_us = o.roofline_us / ALIGNED_EFFICIENCY
        out.append(Finding(
            "misaligned-matmul", f"matmul dims {', '.join(f'{k}={v}' for k, v in bad.items())} waste tensor cores",
            f"{o.name} on {o.shapes} ({o.matmul_dtype}) has dimensions that are not multiples of "
            f"{_ALIGN[o.matmul_dtype]} and ran at {o.pct_of_roofline:.0%} of its roofline. Pad the model dimensions "
            f"(hidden size, vocabulary, heads x head_dim) to multiples of {_ALIGN[o.matmul_dtype] * 8} to reach "
            f"~{ALIGNED_EFFICIENCY:.0%}.",
            max(o.us - target_us, 0.0) / 1e3, _where(o.locations),
            {"dims": dims, "pct_of_roofline": o.pct_of_roofline, "ms": o.us / 1e3,
             "pad_to": _ALIGN[o.matmul_dtype] * 8}, ops=[o]))
    return out


def small_grid(report) -> list[Finding]:
    """Kernels launched with fewer blocks than the GPU has SMs: part of the GPU sits idle while they run."""
    sms = report.device.get("sm_count")
    if not sms:
        return []
    rows: dict = {}
    for w in report.attribution.work:
        # NCCL sizes its grid to the channels that drive the links: more blocks would not move more bytes
        if w.kind != "kernel" or category(w.name) == "communication":
            continue
        g = report.trace.gpu[w.index]
        if not g.grid:
            continue
        blocks = g.grid[0] * g.grid[1] * g.grid[2]
        if blocks >= sms:
            continue
        row = rows.setdefault(w.name, [0, 0.0, 0.0, blocks, {}])
        row[0] += 1
        row[1] += w.us
        row[2] += w.us * (1 - blocks / sms)
        row[4][w.location] = row[4].get(w.location, 0.0) + w.us
    out = []
    for name, (count, us, idle_sm_us, blocks, locations) in rows.items():
        if count and us / count < 10.0:
            continue   # short kernels: their cost is the launch, which launch-bound covers
        out.append(Finding(
            "small-grid", f"{short_name(name)} fills {blocks} of {sms} SMs",
            f"{short_name(name)} ran {count} times ({us / 1e3:.2f} ms) with {blocks} blocks on a GPU with {sms} SMs: "
            f"{1 - blocks / sms:.0%} of the SMs idle while it runs. Give it more parallelism (a larger batch, split-K "
            "or split-row work, or fuse it with neighbours).",
            idle_sm_us / 1e3, _where(locations),
            {"kernel": short_name(name), "blocks": blocks, "sms": sms, "count": count, "ms": us / 1e3}))
    return out


def below_roofline(report) -> list[Finding]:
    """Ops far below their roofline that take a noticeable share of GPU time."""
    out = []
    for o in report.ops:
        pct, head = o.pct_of_roofline, o.headroom_us
        if pct is None or head is None or pct >= 0.5 or o.rule in (None, "default"):
            continue
        if o.matmul_dtype == "fp32" and o.tensor_cores is False:
            continue   # fp32-matmul-no-tf32 says it better
        # the same op in the forward and the backward pass (a mask's fill, say) is two rows, often alike: say which
        name = f"{o.name} (backward)" if o.backward else o.name
        out.append(Finding(
            "below-roofline", f"{name} at {pct:.0%} of its roofline",
            f"{name} on {o.shapes} ({', '.join(str(d) for d in o.dtypes if d)}) ran {o.count} times in "
            f"{o.us / 1e3:.2f} ms: {o.tflops or 0:.1f} TFLOP/s, {o.gbps or 0:.0f} GB/s, {o.bound}-bound, {pct:.0%} of its "
            f"roofline. At the roofline it would take {o.roofline_us / 1e3:.2f} ms.",
            head / 1e3, _where(o.locations),
            {"pct_of_roofline": pct, "bound": o.bound, "ms": o.us / 1e3, "roofline_ms": o.roofline_us / 1e3},
            ops=[o]))
    return out


RULES = [host_sync_in_loop, pageable_copies, fp32_matmul_without_tf32, no_autocast, eager_elementwise_chain,
         unfused_optimizer, launch_bound, host_bound, manual_attention, misaligned_matmul, small_grid, below_roofline]


def find(report) -> list[Finding]:
    """All findings worth MIN_SHARE of the window's wall time (unprofiled where known), largest estimated gain
    first."""
    if report.attribution.device != "cuda":
        return []
    wall_ms = report.unprofiled_wall_us / 1e3
    found = [f for rule in RULES for f in rule(report) if wall_ms > 0 and f.est_gain_ms >= MIN_SHARE * wall_ms]
    for f in found:
        share = f.est_gain_ms / wall_ms
        f.severity = "high" if share >= 0.10 else "medium" if share >= 0.03 else "low"
    return sorted(found, key=lambda f: -f.est_gain_ms)
