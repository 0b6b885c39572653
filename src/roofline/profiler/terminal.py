"""The terminal summary of a Report: short, ranked, and never the whole trace."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape

from roofline.inspect.generated import compact
from roofline.profiler.costs import roofline_cell
from roofline.profiler.kernels import short_name
from roofline.profiler.ncu import COLUMNS as NCU_COLUMNS, row_note
from roofline.profiler.overhead import NO_OPS, sentence as overhead_sentence
from roofline.tables import Column as C, Row, show


def _ms(us: float) -> str:
    return f"{us / 1e3:,.2f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _shapes(shapes: list) -> str:
    """The inputs' shapes, whole (a table folds them where they are long)."""
    text = ", ".join("x".join(map(str, s)) if isinstance(s, list) and all(isinstance(d, int) for d in s) and s else
                     ("[...]" if isinstance(s, list) and s else "") for s in shapes)
    return ", ".join(p for p in text.split(", ") if p)


def _rate(x: float | None) -> str:
    """Three significant digits for small rates (a CPU's 0.0512 TFLOP/s), none lost for large ones."""
    if not x:
        return ""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _measured(v) -> str:
    """A finding's measured gain (--verify), its interval under it."""
    if v is None or v.gain_ms is None:
        return "[dim]-[/dim]"
    low, high = v.interval_ms
    return f"{v.gain_ms:,.2f}\n[dim]{low:,.2f} to {high:,.2f}[/dim]"


def _loc(loc) -> str:
    return f"{loc.file}:{loc.line}" if loc else "[dim](unattributed)[/dim]"


def render(report, console: Console | None = None, top: int = 10) -> None:
    console = console or Console()
    t = report.totals
    tl, at = report.timeline, report.attribution
    d = report.device
    gpu = at.device == "cuda"
    ceil = d["ceilings"]
    console.print(f"[bold]{d['name']}[/bold]  ceilings: {ceil['source']}"
                  + ("" if ceil["source"] == "measured" else "  (run `roofline doctor` on this machine to measure them)"))
    if not gpu:
        console.print("[yellow]No GPU activity in this trace: CPU op times below; GPU analysis (kernels, idle time, "
                      "findings) needs a run on a GPU.[/yellow]")
    steps = f", {t['steps']} steps of {t['step_ms']:.2f} ms" if t["step_ms"] else ""
    if gpu:
        idle = t["idle"]
        console.print(f"window {t['wall_ms']:,.1f} ms{steps}: GPU busy {t['busy_ms']:,.1f} ms "
                      f"({t['busy_ms'] / t['wall_ms']:.0%}), idle {t['idle_ms']:,.1f} ms = sync {idle['sync']:,.1f} + "
                      f"launch {idle['launch']:,.1f} + host {idle['host']:,.1f} + GPU-side {idle['gpu']:,.1f}")
    else:
        console.print(f"window {t['wall_ms']:,.1f} ms{steps}: op time {t['work_ms']:,.1f} ms")
    cost = overhead_sentence(t, gpu)
    if cost:
        console.print(cost, style="yellow" if t["unprofiled"] is None else None)
    console.print(f"attributed to source lines: {t['attributed_share']:.1%} of {'GPU' if gpu else 'op'} time "
                  f"({t['exact_share']:.1%} to exact lines)")
    if not t["ops_recorded"]:
        console.print(NO_OPS)

    if report.findings:
        verified = any(f.verified is not None for f in report.findings)
        columns = [C("", justify="left"), C("finding", justify="left", fold=True),
                   C("where", justify="left", fold=True), C("gain ms", "gain")]
        columns += [C("measured ms", "measured")] if verified else []
        rows = []
        for f in report.findings[:top]:
            color = {"high": "red", "medium": "yellow"}.get(f.severity, "dim")
            message = f.message + (f"\n[cyan]{escape(f.verified.summary())}[/cyan]" if f.verified else "")
            rows.append(Row([f"[{color}]{f.severity}[/{color}]", f"[bold]{f.title}[/bold]\n{message}", _loc(f.location),
                             f"{f.est_gain_ms:,.2f}", *((_measured(f.verified),) if verified else ())]))
        show(console, "findings (estimated gains overlap; do not add them up)", columns, rows)
    elif gpu:
        console.print("[green]no findings above 1% of the profiled time[/green]")

    line_columns = [C("line", justify="left", fold=True), C("function", "fn", justify="left", fold=True)]
    rows = [Row([_loc(r.location), r.location.function, _ms(r.self_us), _pct(r.self_us / at.total_us),
                 _pct(r.backward_us / r.self_us if r.self_us else None), str(r.count)])
            for r in report.lines[:top] if r.self_us > 0]
    show(console, f"top lines by {'GPU' if gpu else 'op'} time",
         line_columns + [C("ms"), C("share"), C("backward", "bwd"), C("count", "n")], rows)

    if gpu and report.host:
        scaled = " (without the profiler's stretch)" if report.overhead else " (as recorded, profiler included)"
        rows = [Row([_loc(h.location), h.location.function, f"{report.host_ms_per_step(h.host_us):,.3f}",
                     f"{report.host_ms_per_step(h.backward_us):,.3f}" if h.backward_us else ""])
                for h in report.host[:top]]
        show(console, f"host time by line, ms a step{scaled}",
             line_columns + [C("host ms", "host"), C("of which backward", "bwd")], rows)

    rows = [Row([o.name.removeprefix("aten::"), _shapes(o.shapes), "bwd" if o.backward else "fwd", str(o.count),
                 _ms(o.us), _rate(o.tflops), _rate(o.gbps), o.bound or "",
                 roofline_cell(o.rule, o.pct_of_roofline, _pct),
                 _ms(o.headroom_us) if o.headroom_us is not None else ""]) for o in report.ops[:top]]
    if rows:   # none without ops (--no-ops): the report says so above
        show(console, "top ops on the roofline",
             [C("op", justify="left", fold=True), C("inputs", "in", justify="left", fold=True),
              C("pass", justify="left"), C("calls", "n"), C("ms"), C("TFLOP/s", "TF/s"), C("GB/s"),
              C("bound", justify="left", fold=True), C("of roofline", "roof", fold=True), C("headroom ms", "room")],
             rows)
    above = [o.name.removeprefix("aten::") for o in report.ops[:top]
             if o.pct_of_roofline is not None and o.pct_of_roofline > 1 and o.bound == "memory" and not o.l2_resident]
    if above:   # a GPU's L2-resident ops are held against the L2's ceiling, doctor's; on a CPU none is measured
        console.print(f"[dim]Over 100%: {', '.join(dict.fromkeys(above))} moved their bytes faster than the memory "
                      "roof (DRAM) allows: their working sets stayed in a cache, whose ceiling doctor measures on "
                      "GPUs only (the L2's).[/dim]")

    if gpu:
        rows = [Row([k.name, k.category, str(k.count), _ms(k.total_us), f"{k.avg_us:,.1f}", _pct(k.share)])
                for k in report.kernels[:top]]
        show(console, "top kernels", [C("kernel", justify="left", fold=True), C("category", "kind", justify="left"),
                                      C("count", "n"), C("total ms", "ms"), C("avg us", "avg us"), C("share")], rows)

    if report.compiled:
        rows = [Row([c.name, str(c.count), _ms(c.total_us), _pct(c.total_us / at.total_us if at.total_us else None),
                     compact(c.lines)])
                for c in report.compiled[:top]]
        show(console, "torch.compile's kernels, with the lines of yours each fused (roofline inspect shows inside)",
             [C("kernel", justify="left", fold=True), C("count", "n"), C("ms"), C("share"),
              C("your lines", "lines", justify="left", fold=True)], rows)

    if report.ncu:
        rows = [Row([short_name(k.name), *("" if getattr(k, key) is None else fmt.format(getattr(k, key))
                                           for _, _, key, fmt in NCU_COLUMNS), row_note(vars(k))])
                for k in report.ncu.kernels]
        show(console, f"Nsight Compute, the heaviest launches of the top kernels ({report.ncu.seconds:,.0f} s of ncu "
             "runs)", [C("kernel", justify="left", fold=True), *(C(header, short) for header, short, _, _ in NCU_COLUMNS),
                       C("launch; note", justify="left", fold=True)], rows)

    if report.inside:
        from roofline.profiler import inside

        inside.render(report.inside, console, top)

    mods = sorted((m for m in report.modules if m.total_us > 0), key=lambda m: -m.total_us)[:top]
    if mods:
        rows = [Row([m.path, _ms(m.total_us), _ms(m.forward_us), _ms(m.backward_us)]) for m in mods]
        show(console, "modules (forward, and the backward of their forward ops)",
             [C("module", justify="left", fold=True), C("total ms", "ms"), C("forward", "fwd"), C("backward", "bwd")],
             rows)

    if report.memory:
        rows = [Row([m.kind, f"{m.source} -> {m.destination}" if m.source else m.destination, str(m.count),
                     f"{m.bytes / 1e6:,.1f}", _ms(m.total_us), f"{m.gbps:,.1f}" if m.gbps else ""])
                for m in report.memory[:top]]
        show(console, "memory operations", [C("kind", justify="left"), C("memory", justify="left", fold=True),
                                            C("count", "n"), C("MB"), C("ms"), C("GB/s")], rows)

    if tl.syncs:
        rows = [Row([s.call, _loc(s.location), str(s.count), _ms(s.wait_us), _ms(s.idle_us)]) for s in tl.syncs[:top]]
        show(console, "host synchronizations", [C("call", justify="left", fold=True), C("line", justify="left", fold=True),
                                                C("count", "n"), C("host wait ms", "wait ms"),
                                                C("GPU idle after ms", "idle ms")], rows)
