"""The terminal summary of a Report: short, ranked, and never the whole trace."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from roofline.profiler.costs import roofline_cell
from roofline.profiler.kernels import short_name
from roofline.profiler.ncu import COLUMNS as NCU_COLUMNS, row_note
from roofline.profiler.overhead import sentence as overhead_sentence


def _ms(us: float) -> str:
    return f"{us / 1e3:,.2f}"


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x:.0%}"


def _shapes(shapes: list, limit: int = 40) -> str:
    text = ", ".join("x".join(map(str, s)) if isinstance(s, list) and all(isinstance(d, int) for d in s) and s else
                     ("[...]" if isinstance(s, list) and s else "") for s in shapes)
    text = ", ".join(p for p in text.split(", ") if p)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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

    if report.findings:
        ft = Table(title="findings (estimated gains overlap; do not add them up)", title_justify="left")
        verified = any(f.verified is not None for f in report.findings)
        for col in ("", "finding", "where", "gain ms") + (("measured ms",) if verified else ()):
            ft.add_column(col, justify="right" if col.endswith(" ms") else "left", overflow="fold")
        for f in report.findings[:top]:
            color = {"high": "red", "medium": "yellow"}.get(f.severity, "dim")
            message = f.message + (f"\n[cyan]{escape(f.verified.summary())}[/cyan]" if f.verified else "")
            ft.add_row(f"[{color}]{f.severity}[/{color}]", f"[bold]{f.title}[/bold]\n{message}", _loc(f.location),
                       f"{f.est_gain_ms:,.2f}", *((_measured(f.verified),) if verified else ()))
        console.print(ft)
    elif gpu:
        console.print("[green]no findings above 1% of the profiled time[/green]")

    lt = Table(title=f"top lines by {'GPU' if gpu else 'op'} time", title_justify="left")
    for col in ("line", "function", "ms", "share", "backward", "count"):
        lt.add_column(col, justify="left" if col in ("line", "function") else "right")
    for r in report.lines[:top]:
        if r.self_us <= 0:
            break
        lt.add_row(_loc(r.location), r.location.function, _ms(r.self_us), _pct(r.self_us / at.total_us),
                   _pct(r.backward_us / r.self_us if r.self_us else None), str(r.count))
    console.print(lt)

    if gpu and report.host:
        scaled = " (without the profiler's stretch)" if report.overhead else " (as recorded, profiler included)"
        ht = Table(title=f"host time by line, ms a step{scaled}", title_justify="left")
        for col in ("line", "function", "host ms", "of which backward"):
            ht.add_column(col, justify="left" if col in ("line", "function") else "right")
        for h in report.host[:top]:
            ht.add_row(_loc(h.location), h.location.function, f"{report.host_ms_per_step(h.host_us):,.3f}",
                       f"{report.host_ms_per_step(h.backward_us):,.3f}" if h.backward_us else "")
        console.print(ht)

    ot = Table(title="top ops on the roofline", title_justify="left")
    for col in ("op", "inputs", "pass", "calls", "ms", "TFLOP/s", "GB/s", "bound", "of roofline", "headroom ms"):
        ot.add_column(col, justify="left" if col in ("op", "inputs", "pass", "bound") else "right")
    for o in report.ops[:top]:
        ot.add_row(o.name.removeprefix("aten::"), _shapes(o.shapes), "bwd" if o.backward else "fwd", str(o.count),
                   _ms(o.us), _rate(o.tflops), _rate(o.gbps),
                   o.bound or "", roofline_cell(o.rule, o.pct_of_roofline, _pct),
                   _ms(o.headroom_us) if o.headroom_us is not None else "")
    console.print(ot)

    if gpu:
        kt = Table(title="top kernels", title_justify="left")
        for col in ("kernel", "category", "count", "total ms", "avg us", "share"):
            kt.add_column(col, justify="left" if col in ("kernel", "category") else "right")
        for k in report.kernels[:top]:
            kt.add_row(k.name, k.category, str(k.count), _ms(k.total_us), f"{k.avg_us:,.1f}", _pct(k.share))
        console.print(kt)

    if report.ncu:
        nt = Table(title=f"Nsight Compute, the heaviest launches of the top kernels ({report.ncu.seconds:,.0f} s of "
                   "ncu runs)", title_justify="left")
        nt.add_column("kernel")
        for header, _, _ in NCU_COLUMNS:
            nt.add_column(header, justify="right")
        nt.add_column("launch; note", overflow="fold")
        for k in report.ncu.kernels:
            counters = ["" if getattr(k, key) is None else fmt.format(getattr(k, key)) for _, key, fmt in NCU_COLUMNS]
            nt.add_row(short_name(k.name), *counters, row_note(vars(k)))
        console.print(nt)

    mods = [m for m in report.modules if m.total_us > 0]
    if mods:
        mt = Table(title="modules (forward, and the backward of their forward ops)", title_justify="left")
        for col in ("module", "total ms", "forward", "backward"):
            mt.add_column(col, justify="left" if col == "module" else "right")
        for m in sorted(mods, key=lambda m: -m.total_us)[:top]:
            mt.add_row(m.path, _ms(m.total_us), _ms(m.forward_us), _ms(m.backward_us))
        console.print(mt)

    if report.memory:
        memt = Table(title="memory operations", title_justify="left")
        for col in ("kind", "memory", "count", "MB", "ms", "GB/s"):
            memt.add_column(col, justify="left" if col in ("kind", "memory") else "right")
        for m in report.memory[:top]:
            memt.add_row(m.kind, f"{m.source} -> {m.destination}" if m.source else m.destination, str(m.count),
                         f"{m.bytes / 1e6:,.1f}", _ms(m.total_us), f"{m.gbps:,.1f}" if m.gbps else "")
        console.print(memt)

    if tl.syncs:
        st = Table(title="host synchronizations", title_justify="left")
        for col in ("call", "line", "count", "host wait ms", "GPU idle after ms"):
            st.add_column(col, justify="left" if col in ("call", "line") else "right")
        for s in tl.syncs[:top]:
            st.add_row(s.call, _loc(s.location), str(s.count), _ms(s.wait_us), _ms(s.idle_us))
        console.print(st)
