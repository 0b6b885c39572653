"""One analysis of one trace: every table and finding, and its JSON form (schema below, versioned).

    report = analyze("trace.json.gz")      # or Profiler.report
    report.print()                          # the terminal summary
    report.write_json("profile.json")
    report.write_html("profile.html")       # self-contained: tables, timeline, roofline chart, tree

JSON schema, version 1 (times in milliseconds, rates in TFLOP/s and GB/s):
    schema              "roofline.profile/1"
    device              {kind, name, sm_count, ceilings: {source, dram_gbps, matmul_tflops}}
    totals              {wall_ms, busy_ms, idle_ms, idle: {sync, launch, host, gpu}, work_ms,
                         steps, step_ms, attributed_share, unattributed_ms, exact_share, unprofiled}
                        unprofiled: null, or the program without the profiler (see overhead.py):
                        {steps_timed, step_ms, clock, wall_step_ms, profiled_step_ms, inflation, busy_step_ms,
                         idle_step_ms, idle_scale, wall_ms, idle_ms, idle: {sync, launch, host, gpu}}
    kernels[]           {name, full_name, category, count, total_ms, avg_ms, min_ms, max_ms, share}
    categories          {category: ms}
    memory_ops[]        {kind, source, destination, pageable, count, bytes, total_ms, gbps}
    lines[]             {file, line, function, self_ms, total_ms, backward_ms, count}
    modules[]           {path, self_ms, total_ms, forward_ms, backward_ms}
    tree                {file, line, function, total_ms, self_ms, children[]}  (top-down; root has no file)
    syncs[]             {call, file, line, function, count, wait_ms, idle_ms, gain_ms}
    launch_regions[]    {start_ms, span_ms, kernels, busy_ms, idle_ms, file, line}
    timeline            {bin_ms, busy_ms: {category: [ms per bin]}, idle_ms: {cause: [ms per bin]}}
                        (the window in equal bins; null without GPU activity)
    ops[]               {name, shapes, dtypes, pass, rule (null: no cost model), cost_note, count, ms, flops,
                         bytes, intensity, tflops, gbps, bound, peak_tflops, peak_gbps, l2_resident, roofline_ms,
                         pct_of_roofline, headroom_ms, file, line, module, kernels}
    host_lines[]        {file, line, function, host_ms, backward_ms, host_ms_per_step}: the host's time by line
                        (host.py), scaled by host_scale to the program without the profiler where known
    host_scale          unprofiled host pace / recorded (1: unknown)
    findings[]          {id, severity, title, message, evidence, location: {file, line}, est_gain_ms}
    compiled[]          {name, kind, count, total_ms, share, lines[]: {file, line, code}}: the kernels torch.compile
                        generated that ran in the window, with the lines of the program whose operations each holds
    ncu                 null, or {seconds, kernels[]: {name, occupancy_pct, dram_pct, sm_pct, l2_hit_pct, registers,
                        spill_bytes, duration_us, grid_size, block_size, grid, block, trace_us, launches, share, note,
                        error}}: Nsight Compute on the heaviest launches of the top kernels (--ncu K): the grid and
                        block the profile timed, its duration there, the launches of that grid and block and their
                        share of the kernel's time; note: where ncu's launch or duration parts from the profile's
    inside[]            {kernel, share, total_us, configurations[]: roofline inspect's report of each configuration
                        launched}: the heaviest Triton kernels seen from inside (--inspect K; profiler.inside)
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from roofline.profiler import attribution, costs, kernels, timeline
from roofline.profiler.compiled import CompiledRow, compiled_table
from roofline.profiler.host import HostLine, host_lines
from roofline.profiler.ncu import NcuRun
from roofline.profiler.overhead import Overhead, measure as measure_overhead
from roofline.profiler.trace import Trace, load

SCHEMA = "roofline.profile/1"
_TREE_MIN_SHARE = 0.001       # tree nodes under 0.1% of the work are folded, so the JSON stays small


@dataclass
class Report:
    trace: Trace
    device: dict
    peaks: costs.Peaks
    attribution: attribution.Attribution
    kernels: list
    memory: list
    timeline: timeline.Timeline
    ops: list
    findings: list = field(default_factory=list)
    overhead: Overhead | None = None   # the program timed outside the window, if it was
    host: list[HostLine] = field(default_factory=list)   # host time by line, as recorded
    ncu: NcuRun | None = None     # Nsight Compute's counters for the top kernels, where asked for (--ncu)
    compiled: list[CompiledRow] = field(default_factory=list)   # torch.compile's kernels with the lines they fused
    inside: list = field(default_factory=list)   # profiler.inside.Inside: the top Triton kernels inspected (--inspect)

    @property
    def steps(self) -> int:
        """Whole steps in the window: the profiler's step ranges (trace.load leaves out a partial last one)."""
        return self.timeline.steps

    def host_ms_per_step(self, us: float) -> float:
        """Host time of the window (us, as recorded) as ms a step of the program without the profiler (the whole
        window where no steps were marked)."""
        return us * self.host_scale / 1e3 / (self.steps or 1)

    @property
    def host_scale(self) -> float:
        """What the host's recorded time shrinks to without the profiler: its pace between step marks outside
        the window over its pace inside (1 when unknown)."""
        tl = self.timeline
        if self.overhead is None or not tl.step_us:
            return 1.0
        return min(self.overhead.wall_step_ms / (tl.step_us / 1e3), 1.0)

    @property
    def idle_scale(self) -> float:
        """What the window's idle time shrinks to without the profiler (1 when unknown)."""
        return self.overhead.idle_scale if self.overhead else 1.0

    @property
    def unprofiled_wall_us(self) -> float:
        """The window's wall time as the program runs without the profiler: GPU work, and the idle scaled."""
        tl = self.timeline
        return tl.busy_us + tl.idle_total_us * self.idle_scale if self.overhead else tl.window_us

    # ---------------------------------------------------------------- views
    @property
    def lines(self):
        return attribution.lines(self.attribution)

    @property
    def modules(self):
        return attribution.modules(self.attribution)

    @property
    def tree(self):
        return attribution.tree(self.attribution)

    @property
    def totals(self) -> dict:
        tl, at = self.timeline, self.attribution
        exact = sum(w.us for w in at.work if w.exact)
        steps = self.steps
        return {"wall_ms": tl.window_us / 1e3, "busy_ms": tl.busy_us / 1e3, "idle_ms": tl.idle_total_us / 1e3,
                "idle": {k: v / 1e3 for k, v in tl.idle_us.items()}, "work_ms": at.total_us / 1e3,
                "steps": steps, "step_ms": tl.step_us / 1e3 if tl.step_us else None,
                "attributed_share": at.attributed_share, "unattributed_ms": at.unattributed_us / 1e3,
                "exact_share": exact / at.total_us if at.total_us else 1.0,
                "ops_recorded": not self.trace.facts.get("own_marks"),   # False: capture's ops=False (--no-ops)
                "unprofiled": None if self.overhead is None else {
                    **self.overhead.to_dict(), "wall_ms": self.unprofiled_wall_us / 1e3,
                    "idle_ms": tl.idle_total_us * self.idle_scale / 1e3,
                    "idle": {k: v * self.idle_scale / 1e3 for k, v in tl.idle_us.items()}}}

    # ---------------------------------------------------------------- output
    def to_dict(self) -> dict:
        ms = 1e-3
        loc = _location
        return {
            "schema": SCHEMA,
            "device": self.device,
            "totals": self.totals,
            "kernels": [{"name": k.name, "full_name": k.full_name, "category": k.category, "count": k.count,
                         "total_ms": k.total_us * ms, "avg_ms": k.avg_us * ms, "min_ms": k.min_us * ms,
                         "max_ms": k.max_us * ms, "share": k.share} for k in self.kernels],
            "categories": {k: v * ms for k, v in kernels.category_table(self.kernels, self.memory).items()},
            "memory_ops": [{"kind": m.kind, "source": m.source, "destination": m.destination, "pageable": m.pageable,
                            "count": m.count, "bytes": m.bytes, "total_ms": m.total_us * ms, "gbps": m.gbps}
                           for m in self.memory],
            "lines": [{**loc(r.location), "self_ms": r.self_us * ms, "total_ms": r.total_us * ms,
                       "backward_ms": r.backward_us * ms, "count": r.count} for r in self.lines],
            "modules": [{"path": m.path, "self_ms": m.self_us * ms, "total_ms": m.total_us * ms,
                         "forward_ms": m.forward_us * ms, "backward_ms": m.backward_us * ms} for m in self.modules],
            "tree": _tree_dict(self.tree, self.attribution.total_us * _TREE_MIN_SHARE),
            "syncs": [{"call": s.call, **loc(s.location), "count": s.count, "wait_ms": s.wait_us * ms,
                       "idle_ms": s.idle_us * ms, "gain_ms": s.gain_us * ms} for s in self.timeline.syncs],
            "launch_regions": [{"start_ms": (r.start - self.trace.start) * ms, "span_ms": r.span_us * ms,
                                "kernels": r.kernels, "busy_ms": r.busy_us * ms, "idle_ms": r.idle_us * ms,
                                **loc(_top(r.locations))} for r in self.timeline.launch_regions],
            "timeline": _bins_dict(self.timeline.bins),
            "ops": [_op_dict(o) for o in self.ops],
            "host_lines": [{**loc(h.location), "host_ms": h.host_us * self.host_scale * ms,
                            "backward_ms": h.backward_us * self.host_scale * ms,
                            "host_ms_per_step": self.host_ms_per_step(h.host_us) if self.steps else None}
                           for h in self.host],
            "host_scale": self.host_scale,
            "findings": [f.to_dict() for f in self.findings],
            "ncu": self.ncu.to_dict() if self.ncu else None,
            "compiled": [c.to_dict(self.attribution.total_us / 1e3) for c in self.compiled],
            "inside": [x.to_dict() for x in self.inside],
        }

    def write_json(self, path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1, default=str))

    def write_html(self, path, ranks: dict | None = None) -> None:
        """A self-contained HTML report (see roofline.profiler.html); ranks: every rank read together (the "ranks"
        of profile's JSON on several ranks), shown beside this rank's report."""
        from roofline.profiler.html import render

        argv = self.trace.facts.get("argv") or []
        title = "roofline profile: " + " ".join(argv) if argv else "roofline profile"
        page = {**self.to_dict(), **({"ranks": ranks} if ranks else {})}
        Path(path).write_text(render(json.loads(json.dumps(page, default=str)), title=title), encoding="utf-8")

    def print(self, console=None, top: int = 10) -> None:
        from roofline.profiler.terminal import render

        render(self, console, top=top)


def _location(loc) -> dict:
    if loc is None:
        return {"file": None, "line": None, "function": None}
    return {"file": loc.file, "line": loc.line, "function": loc.function}


def _top(counts: dict):
    return max(counts, key=counts.get) if counts else None


def _bins_dict(bins) -> dict | None:
    if bins is None:
        return None
    ms = lambda row: [round(v / 1e3, 5) for v in row]  # noqa: E731
    return {"bin_ms": bins.width_us / 1e3, "busy_ms": {k: ms(v) for k, v in sorted(bins.busy.items())},
            "idle_ms": {k: ms(v) for k, v in bins.idle.items()}}


def _tree_dict(node, min_us: float) -> dict:
    out = {**_location(node.location), "total_ms": node.total_us / 1e3, "self_ms": node.self_us / 1e3}
    kids = [c for c in node.sorted_children() if c.total_us >= min_us]
    out["children"] = [_tree_dict(c, min_us) for c in kids]
    folded = node.total_us - node.self_us - sum(c.total_us for c in kids)
    if kids != list(node.children.values()) and folded > 0:
        out["folded_ms"] = folded / 1e3
    return out


def _op_dict(o: costs.OpRow) -> dict:
    ms = 1e-3
    roof, head = o.roofline_us, o.headroom_us
    return {"name": o.name, "shapes": o.shapes, "dtypes": o.dtypes, "pass": "backward" if o.backward else "forward",
            "rule": o.rule, "cost_note": o.note, "count": o.count, "ms": o.us * ms, "flops": o.flops, "bytes": o.bytes,
            "intensity": o.intensity, "tflops": o.tflops, "gbps": o.gbps, "bound": o.bound,
            "peak_tflops": o.peak_tflops, "peak_gbps": o.peak_gbps, "l2_resident": o.l2_resident,
            "roofline_ms": roof * ms if roof is not None else None, "pct_of_roofline": o.pct_of_roofline,
            "headroom_ms": head * ms if head is not None else None, **_location(_top(o.locations)),
            "module": _top({k: v for k, v in o.modules.items() if k is not None}),
            "kernels": sorted(o.kernels, key=o.kernels.get, reverse=True)[:3]}


# --------------------------------------------------------------------------- analysis

def device_of(trace: Trace) -> tuple[dict, costs.Peaks]:
    """What the trace ran on, and the ceilings to hold it against: measured on this machine when it is the
    same GPU (or CPU) and `roofline doctor` has measured it, the datasheet's otherwise."""
    from roofline import device as dev

    props = trace.device_properties
    if trace.gpu and props:
        name = props[0].get("name", "unknown GPU")
        c = None
        try:
            import torch

            if torch.cuda.is_available() and torch.cuda.get_device_name() == name:
                c = dev.ceilings()
        except Exception:   # an analysis machine without a working CUDA stack still has the datasheet
            c = None
        if c is None:
            sheet = dev.datasheet(name)
            c = dev.Ceilings(device=name, source="datasheet" if sheet else "none",
                             dram_gbps=sheet.dram_gbps if sheet else None,
                             matmul_tflops=dict(sheet.matmul_tflops) if sheet else {})
        info = {"kind": "cuda", "name": name, "sm_count": props[0].get("numSms"),
                "memory_bytes": props[0].get("totalGlobalMem")}
    else:
        c = dev.ceilings("cpu") if not trace.gpu else dev.Ceilings(device="unknown", source="none", dram_gbps=None)
        info = {"kind": "cpu" if not trace.gpu else "cuda", "name": dev.info("cpu").name if not trace.gpu else "unknown",
                "sm_count": None, "memory_bytes": None}
    info["ceilings"] = {"source": c.source, "dram_gbps": c.dram_gbps, "matmul_tflops": dict(c.matmul_tflops),
                        "l2_gbps": c.l2_gbps}
    return info, costs.Peaks.from_ceilings(c)


def analyze(source, peaks: costs.Peaks | None = None) -> Report:
    """Run every analysis over a trace (a Trace, or the path of a torch.profiler JSON trace).

    peaks: the ceilings to place ops against; by default those of the trace's device (see device_of).
    """
    from roofline.profiler import findings

    trace = source if isinstance(source, Trace) else load(source)
    info, device_peaks = device_of(trace)
    if peaks is None:
        peaks = device_peaks
    else:
        info["ceilings"] = {"source": peaks.source, "dram_gbps": peaks.gbps, "matmul_tflops": dict(peaks.matmul_tflops),
                            "l2_gbps": peaks.l2_gbps}
    resolver = attribution.Resolver(trace)
    attr = attribution.attribute(trace, resolver)
    tl = timeline.analyze(trace, resolver)
    report = Report(trace=trace, device=info, peaks=peaks, attribution=attr,
                    kernels=kernels.kernel_table(trace), memory=kernels.memory_table(trace),
                    timeline=tl, ops=costs.op_table(trace, attr, peaks),
                    overhead=measure_overhead(trace, tl), host=host_lines(trace, resolver))
    report.compiled = compiled_table(trace, report.kernels)
    report.findings = findings.find(report)
    return report
