"""The HTML report: one self-contained file (no network, no external script or font), made from the JSON form
of a Report, so `roofline analyze --html` can make it from any saved analysis.

Charts are SVG drawn here, on roofline.page's page (its only script sorts tables when a header is clicked).
Sections: summary, findings, every rank (where the program ran on several: the ranks side by side, their
collectives and the findings across them), timeline (GPU busy by kernel category and idle by cause over the
window), roofline chart (each op a point against the device's ceilings), top-down tree, and
the tables (lines, ops, kernels, modules, memory operations, host syncs).
"""

from __future__ import annotations

import json
import math
from html import escape

from roofline.distributed.comms import size_text
from roofline.page import page, table
from roofline.profiler.costs import roofline_cell
from roofline.profiler.kernels import CATEGORIES
from roofline.profiler.ncu import COLUMNS as NCU_COLUMNS, row_note
from roofline.profiler.overhead import NO_OPS, sentence as overhead_sentence

# Colour per kernel category (busy) and per idle cause; the same in the legend and the chart.
CATEGORY_COLORS = dict(zip(CATEGORIES, ("#3b6fd4", "#7b4fd0", "#2fa36b", "#d98a1c", "#c2497b", "#b5a01f",
                                        "#4aa7c9", "#8c8c8c", "#d14f3b", "#5a7d3a", "#6e6e9e")))
IDLE_COLORS = {"sync": "#e0463a", "launch": "#f2a33a", "host": "#c9c9c9", "gpu": "#9fb7d9"}
IDLE_WORDS = {"sync": "host sync", "launch": "launch-bound", "host": "other host work", "gpu": "GPU-side wait"}


# --------------------------------------------------------------------------- small pieces

def _rate(x: float) -> str:
    """A ceiling: whole numbers where large (an H100's 684 TFLOP/s), three digits where small (a CPU's 0.041)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _pct(x) -> str:
    return "" if x is None else f"{x:.0%}"


def _where(d: dict) -> str:
    return f"{d['file']}:{d['line']}" if d.get("file") else "(unattributed)"


def _shapes(shapes) -> str:
    parts = []
    for s in shapes or []:
        if isinstance(s, list) and s and all(isinstance(v, int) for v in s):
            parts.append("x".join(map(str, s)))
        elif isinstance(s, list) and s:
            parts.append("[...]")
    return ", ".join(parts)


def _legend(colors: dict, words: dict | None = None) -> str:
    return '<div class="legend">' + "".join(
        f'<span><i style="background:{c}"></i>{escape((words or {}).get(k, k))}</span>' for k, c in colors.items()) + "</div>"


# --------------------------------------------------------------------------- sections

def _summary(d: dict) -> str:
    t, dev = d["totals"], d["device"]
    ceilings = dev["ceilings"]
    gpu = dev["kind"] == "cuda" and d.get("timeline") is not None
    peaks = ", ".join(f"{k} {_rate(v)} TFLOP/s" for k, v in (ceilings.get("matmul_tflops") or {}).items())
    source = {"measured": "measured by roofline doctor on this machine",
              "datasheet": "datasheet values (run `roofline doctor` on the GPU to measure them)"}.get(
        ceilings["source"], "none known")
    parts = [f"<p><b>{escape(str(dev['name']))}</b>"
             + (f", {dev['sm_count']} SMs" if dev.get("sm_count") else "")
             + f". Ceilings: {escape(source)}"
             + (f": DRAM {ceilings['dram_gbps']:,.0f} GB/s" if ceilings.get("dram_gbps") else "")
             + (f"; {escape(peaks)}" if peaks else "") + ".</p>"]
    steps = f", {t['steps']} steps of {t['step_ms']:.2f} ms" if t.get("step_ms") else ""
    if gpu:
        wall = t["wall_ms"] or 1.0
        segments = [("busy", t["busy_ms"], "#3b6fd4")] + [(IDLE_WORDS[k], v, IDLE_COLORS[k]) for k, v in t["idle"].items()]
        bar = "".join(f'<div title="{escape(name)}: {ms:,.2f} ms" style="width:{100 * ms / wall:.3f}%;background:{color}">'
                      "</div>" for name, ms, color in segments if ms > 0)
        parts.append(f"<p>Window {t['wall_ms']:,.2f} ms{steps}: GPU busy {t['busy_ms']:,.2f} ms "
                     f"({t['busy_ms'] / wall:.0%}), idle {t['idle_ms']:,.2f} ms.</p>"
                     f'<div class="bar" id="busy-bar">{bar}</div>'
                     + _legend({"busy": "#3b6fd4", **IDLE_COLORS}, {"busy": "GPU busy", **IDLE_WORDS}))
    else:
        parts.append(f"<p>Window {t['wall_ms']:,.2f} ms{steps}; op time {t['work_ms']:,.2f} ms. "
                     "<b>No GPU activity in this trace:</b> the tables show CPU op times; the GPU analysis "
                     "(kernels, idle time, findings) needs a run on a GPU.</p>")
    cost = overhead_sentence(t, gpu)
    if cost:
        parts.append(f"<p>{escape(cost)}</p>")
    parts.append(f"<p>Attributed to source lines: {t['attributed_share']:.1%} of "
                 f"{'GPU' if gpu else 'op'} time ({t['exact_share']:.1%} to exact lines).</p>")
    if not t.get("ops_recorded", True):
        parts.append(f"<p>{escape(NO_OPS)}</p>")
    return "\n".join(parts)


def _findings(d: dict) -> str:
    if not d["findings"]:
        return '<p class="note">No finding is worth 1% of the window.</p>'
    cards = []
    for f in d["findings"]:
        evidence = ", ".join(f"{escape(str(k))}: {escape(_evidence_value(v))}" for k, v in f["evidence"].items())
        where = _where(f["location"]) if f["location"] else "(no single line)"
        cards.append(
            f'<div class="card finding" data-id="{escape(f["id"])}"><span class="gain">~{f["est_gain_ms"]:,.2f} ms</span>'
            f'<span class="sev {escape(f["severity"])}">{escape(f["severity"])}</span><b>{escape(f["title"])}</b>'
            f' <span class="where">{escape(where)}</span> <code>{escape(f["id"])}</code>'
            f'<p>{escape(f["message"])}</p>{_verified(f.get("verified"))}<div class="evidence">{evidence}</div></div>')
    return ('<p class="note">Ranked by estimated gain in the profiled window. Gains overlap (TF32 and autocast speed '
            "up the same matmuls): do not add them up.</p>" + "".join(cards))


def _verified(v: dict | None) -> str:
    """What --verify measured of a finding's fix: the gain with its interval, and each case timed."""
    if not v:
        return ""
    if v["gain_ms"] is None:
        reason = v["reason"] or "; ".join(c["error"] for c in v["cases"] if c["error"])
        return f'<p class="verified none">Not measured: {escape(reason)}</p>'
    cases = "".join(
        f'<li>{escape(c["case"])}: ' + (f'{c["speedup"]:.2f}x ({c["low"]:.2f} to {c["high"]:.2f}), {escape(c["check"])}'
                                       if c["speedup"] is not None else escape(c["error"] or "")) + "</li>"
        for c in v["cases"])
    return (f'<p class="verified">Measured: {v["gain_ms"]:,.2f} ms ({v["gain_low_ms"]:,.2f} to '
            f'{v["gain_high_ms"]:,.2f}) on {v["covered_share"]:.0%} of the ops\' time, replaced by '
            f'{escape(v["replacement"])}</p><ul class="cases">{cases}</ul>')


def _evidence_value(v) -> str:
    if isinstance(v, float):
        return f"{v:,.4g}"
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _timeline(d: dict) -> str:
    tl = d.get("timeline")
    if not tl:
        return '<p class="note">No GPU activity: nothing to draw.</p>'
    width, busy_h, idle_h, left = 1040, 110, 26, 40
    bin_ms = tl["bin_ms"]
    n = len(next(iter(tl["idle_ms"].values())))
    bw = (width - left) / n
    shapes = []
    for i in range(n):
        y = busy_h
        for cat, row in tl["busy_ms"].items():
            h = min(row[i] / bin_ms, 1.0) * (busy_h - 10) if bin_ms else 0
            if h > 0.05:
                y -= h
                shapes.append(f'<rect x="{left + i * bw:.2f}" y="{y:.2f}" width="{bw + 0.3:.2f}" height="{h:.2f}" '
                              f'fill="{CATEGORY_COLORS.get(cat, "#888")}"/>')
        y = busy_h + 6
        for cause, row in tl["idle_ms"].items():
            h = min(row[i] / bin_ms, 1.0) * idle_h if bin_ms else 0
            if h > 0.05:
                shapes.append(f'<rect x="{left + i * bw:.2f}" y="{y:.2f}" width="{bw + 0.3:.2f}" height="{h:.2f}" '
                              f'fill="{IDLE_COLORS[cause]}"/>')
                y += h
    total_ms = bin_ms * n
    ticks = []
    for k in range(6):
        x = left + (width - left) * k / 5
        ticks.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{busy_h}" y2="{busy_h + 4}" stroke="#555"/>'
                     f'<text x="{x:.1f}" y="{busy_h + idle_h + 22}" text-anchor="middle">{total_ms * k / 5:,.1f} ms</text>')
    height = busy_h + idle_h + 28
    svg = (f'<svg id="timeline" viewBox="0 0 {width} {height}" width="100%" role="img" '
           f'aria-label="GPU busy and idle over the window">'
           f'<text x="2" y="14">busy</text><text x="2" y="{busy_h + 20}">idle</text>'
           f'<line x1="{left}" x2="{width}" y1="{busy_h}" y2="{busy_h}" stroke="#999"/>{"".join(shapes)}{"".join(ticks)}</svg>')
    used = {c: CATEGORY_COLORS.get(c, "#888") for c in tl["busy_ms"]}
    return (f'<p class="note">The window in {n} bins of {bin_ms * 1e3:,.1f} us. Top: the share of each bin the GPU was '
            "busy, by kernel category (streams that overlap are capped at 100%). Bottom: why it sat idle.</p>"
            + svg + _legend(used) + _legend(IDLE_COLORS, IDLE_WORDS))


RANK_COLORS = {"compute": "#3b6fd4", "communication": "#d98a1c"}


def _rank_lanes(lanes: dict | None) -> str:
    """Each rank's recorded window, side by side on rank 0's clock: two lanes a rank, the share of each bin its
    compute and its communication took."""
    if not lanes:
        return '<p class="note">No rank recorded compute or communication: no timeline.</p>'
    width, left, lane, gap = 1040, 56, 16, 10
    ranks = lanes["ranks"]
    bins = len(ranks[0]["compute"])
    bw = (width - left) / bins
    shapes, y = [], 4
    for r in ranks:
        shapes.append(f'<text x="2" y="{y + lane + 3}">rank {r["rank"]}</text>')
        for kind, color in zip(("compute", "comm"), RANK_COLORS.values()):
            for i, share in enumerate(r[kind]):
                if share > 0.01:
                    h = share * lane
                    shapes.append(f'<rect x="{left + i * bw:.2f}" y="{y + lane - h:.2f}" width="{bw + 0.3:.2f}" '
                                  f'height="{h:.2f}" fill="{color}"/>')
            y += lane + 2
        y += gap
    total_ms = lanes["bin_us"] * bins / 1e3
    ticks = "".join(f'<text x="{left + (width - left) * k / 5:.1f}" y="{y + 10}" text-anchor="middle">'
                    f'{total_ms * k / 5:,.1f} ms</text>' for k in range(6))
    return (f'<svg id="ranks-timeline" viewBox="0 0 {width} {y + 16}" width="100%" role="img" '
            f'aria-label="each rank\'s compute and communication over the recorded window">{"".join(shapes)}{ticks}'
            "</svg>" + _legend(RANK_COLORS))


def _ranks(d: dict) -> str:
    """The ranks read together (distributed.merge, report): each rank's step, its timeline beside the others',
    the collectives, and the findings across the ranks."""
    ranks = d.get("ranks")
    if not ranks:
        return ""
    timed = ranks.get("unrecorded")
    rows = []
    for k, r in enumerate(ranks["ranks"]):
        rows.append({**r, "overlap": (r["overlap"], _pct(r["overlap"])), "wait_ms": ranks["waits_ms"][k],
                     "u_comm_ms": timed["comm_ms"][k] if timed else None,
                     "u_wait_ms": timed["waits_ms"][k] if timed else None})
    columns = [("rank", "rank:n"), ("unrecorded step ms", "unprofiled_ms:n"),
               *([("unrecorded comm ms", "u_comm_ms:n"), ("unrecorded wait ms", "u_wait_ms:n")] if timed else []),
               ("recorded step ms", "recorded_step_ms:n"), ("compute ms", "compute_ms:n"), ("comm ms", "comm_ms:n"),
               ("exposed ms", "exposed_ms:n"), ("overlap", "overlap:n"), ("waited ms", "wait_ms:n")]
    collectives = [{**c, "size": size_text(c["bytes"]), "timed": "outside the window" if c.get("unrecorded") else
                    "in the window"} for c in ranks["collectives"]]
    syncs = [{**x, "ranks": "all" if x["every_rank"] else ", ".join(map(str, x["ranks"])),
              "waits": ", ".join(f"{k}: {ms:,.2f}" for k, ms in zip(x["ranks"], x["wait_ms"])),
              "costs": ", ".join(f"{k}: {ms:,.2f}" for k, ms in zip(x["ranks"], x["gain_ms"]))}
             for x in ranks.get("host_syncs", [])]
    cards = "".join(
        f'<div class="card rank-finding" data-id="{escape(f["id"])}"><span class="gain">~{f["gain_ms"]:,.2f} ms'
        f'</span><b>{escape(f["title"])}</b> <span class="where">{escape(f["where"] or "(no single line)")}</span>'
        f'<p>{escape(f["message"])}</p></div>' for f in ranks.get("findings", []))
    matched = (f"{ranks['world_size']} ranks, {ranks['matched']} collective calls matched across them"
               + (f" ({ranks['mismatch']})" if ranks.get("mismatch") else "")
               + (f"; outside the window NCCL timed {timed['calls']} calls of {timed['steps']} steps" if timed else ""))
    failed = (f'<div class="card"><b>The run failed.</b> <p>{escape(ranks["failed"])}. What follows is what the '
              "ranks recorded before it; the findings across the ranks are left out.</p></div>"
              if ranks.get("failed") else "")
    return "\n".join([
        failed,
        f'<p class="note">{escape(matched)}. Figures a step. Recorded figures are the window\'s, which the recorder '
        "stretches; unrecorded ones come from the steps outside it, as the program runs.</p>",
        table(columns, rows, "ranks"),
        "<h3>Timeline</h3><p class='note'>The recorded window, every rank on rank 0's clock (aligned on the ends of "
        "their matched collectives): for each bin, the share of it the rank computed (top lane) and communicated "
        "(bottom lane).</p>", _rank_lanes(ranks.get("lanes")),
        "<h3>Collectives</h3>",
        table([("collective", "kind"), ("size", "size"), ("line", "where"), ("moves", "owner"),
                ("calls a step", "calls:n"),
                ("ms a step", "ms:n"), ("transfer us", "call_us:n"), ("busbw GB/s", "busbw_gbps:n"),
                ("us and busbw timed", "timed")], collectives, "collectives"),
        *(["<h3>Host syncs</h3><p class='note'>Lines at which hosts waited for their GPUs, a step, over the ranks "
            "that wait there: each rank's wait in them, and the GPU idle after them that it would win without "
            "them.</p>", table([("line", "where"), ("call", "call"), ("ranks", "ranks"), ("calls a step", "calls:n"),
                                ("host wait ms, by rank", "waits"), ("GPU idle it costs ms, by rank", "costs")],
                               syncs, "host-syncs")] if syncs else []),
        "<h3>Findings across the ranks</h3>",
        cards or '<p class="note">No finding across the ranks.</p>',
    ])


def _roofline_chart(d: dict) -> str:
    ceilings = d["device"]["ceilings"]
    bw = ceilings.get("dram_gbps")
    ops = [o for o in d["ops"] if o.get("intensity") and o.get("tflops") and o["ms"] > 0]
    if not bw or not ops:
        return '<p class="note">No op with known FLOPs, bytes and ceilings to place on the roofline.</p>'
    peaks = {k: v for k, v in (ceilings.get("matmul_tflops") or {}).items() if v}
    width, height, left, bottom, top, right = 1040, 420, 60, 40, 12, 20
    xs = [o["intensity"] for o in ops]
    ys = [o["tflops"] for o in ops]
    x_lo = 10 ** math.floor(math.log10(max(min(xs), 1e-3)))
    x_hi = 10 ** math.ceil(math.log10(max(max(xs), max(peaks.values(), default=1) * 1e3 / bw * 4)))
    y_hi = 10 ** math.ceil(math.log10(max(max(ys), max(peaks.values(), default=1))))
    y_lo = 10 ** math.floor(math.log10(max(min(ys), y_hi * 1e-6)))

    def px(x):
        return left + (math.log10(x) - math.log10(x_lo)) / (math.log10(x_hi) - math.log10(x_lo)) * (width - left - right)

    def py(y):
        y = min(max(y, y_lo), y_hi)
        return top + (math.log10(y_hi) - math.log10(y)) / (math.log10(y_hi) - math.log10(y_lo)) * (height - top - bottom)

    parts = []
    for e in range(int(math.log10(x_lo)), int(math.log10(x_hi)) + 1):
        x = px(10 ** e)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{height - bottom}" stroke="#eee"/>'
                     f'<text x="{x:.1f}" y="{height - bottom + 14}" text-anchor="middle">1e{e}</text>')
    for e in range(int(math.log10(y_lo)), int(math.log10(y_hi)) + 1):
        y = py(10 ** e)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
                     f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">1e{e}</text>')
    # Ceilings: the memory slope (TFLOP/s = intensity x TB/s) up to each compute roof (dtypes with one peak share it).
    roofs: dict = {}
    for name, peak in peaks.items():   # equal to 3 significant digits: one roof (a CPU's is under 0.1 TFLOP/s)
        roofs.setdefault(float(f"{peak:.3g}"), []).append(name)
    for peak, names in sorted(roofs.items(), reverse=True):
        name = "/".join(names)
        ridge = peak * 1e3 / bw
        parts.append(f'<polyline fill="none" stroke="#444" stroke-width="1.2" points="{px(x_lo):.1f},{py(x_lo * bw / 1e3):.1f} '
                     f'{px(ridge):.1f},{py(peak):.1f} {px(x_hi):.1f},{py(peak):.1f}"/>'
                     f'<text x="{width - right - 4}" y="{py(peak) - 4:.1f}" text-anchor="end">{escape(name)} '
                     f'{_rate(peak)} TFLOP/s</text>')
    parts.append(f'<text x="{px(x_lo) + 6:.1f}" y="{py(x_lo * bw / 1e3) - 6:.1f}">DRAM {bw:,.0f} GB/s</text>')
    l2 = ceilings.get("l2_gbps")
    if l2:   # ops whose working set stays in L2 can sit above the DRAM slope, up to this one
        top_peak = max(peaks.values(), default=y_hi)
        parts.append(f'<polyline fill="none" stroke="#999" stroke-dasharray="4 3" points="{px(x_lo):.1f},'
                     f'{py(x_lo * l2 / 1e3):.1f} {px(top_peak * 1e3 / l2):.1f},{py(top_peak):.1f}"/>'
                     f'<text x="{px(x_lo) + 6:.1f}" y="{py(x_lo * l2 / 1e3) - 6:.1f}">L2 {l2:,.0f} GB/s</text>')
    total = sum(o["ms"] for o in ops)
    for o in sorted(ops, key=lambda o: -o["ms"]):
        r = 3 + 14 * math.sqrt(o["ms"] / total)
        color = "#d14f3b" if (o.get("pct_of_roofline") or 1) < 0.5 else "#3b6fd4"
        tip = (f"{o['name']} ({o['pass']}) {_shapes(o['shapes'])}\n{o['count']} calls, {o['ms']:,.3f} ms, "
               f"{o['tflops']:,.2f} TFLOP/s, {o['gbps'] or 0:,.0f} GB/s, intensity {o['intensity']:,.1f} FLOP/B, "
               f"{_pct(o.get('pct_of_roofline'))} of roofline{' (L2-resident)' if o.get('l2_resident') else ''}"
               f"\n{_where(o)}")
        parts.append(f'<circle class="op" cx="{px(o["intensity"]):.1f}" cy="{py(o["tflops"]):.1f}" r="{r:.1f}" '
                     f'fill="{color}" fill-opacity="0.55" stroke="{color}"><title>{escape(tip)}</title></circle>')
    parts.append(f'<text x="{(left + width) / 2}" y="{height - 6}" text-anchor="middle">arithmetic intensity (FLOP/byte)</text>'
                 f'<text x="14" y="{(top + height) / 2}" transform="rotate(-90 14 {(top + height) / 2})" '
                 'text-anchor="middle">achieved TFLOP/s</text>')
    return ('<p class="note">Each op (name, shapes, pass) is a point: achieved TFLOP/s against FLOPs per byte moved. '
            "The lines are the ceilings (dashed: the L2 cache's, for ops whose bytes fit in it); red points run below "
            "half of theirs. Point area ~ time. Hover for details.</p>"
            f'<svg id="roofline" viewBox="0 0 {width} {height}" width="100%" role="img" aria-label="roofline chart">'
            + "".join(parts) + "</svg>")


def _tree(node: dict, total: float, depth: int = 0) -> str:
    label = _where(node) + (f" ({node['function']})" if node.get("function") else "") if node.get("file") else "all work"
    share = node["total_ms"] / total if total else 0
    head = (f'<span class="mono">{escape(label)}</span> &mdash; {node["total_ms"]:,.2f} ms ({share:.1%})'
            + (f', self {node["self_ms"]:,.2f} ms' if node["self_ms"] else ""))
    kids = "".join(_tree(c, total, depth + 1) for c in node["children"])
    if node.get("folded_ms"):
        kids += f'<div class="note" style="margin-left:14px">smaller calls: {node["folded_ms"]:,.3f} ms</div>'
    if not kids:
        return f'<div style="margin-left:14px">{head}</div>'
    return f'<details{" open" if depth < 3 else ""}><summary>{head}</summary>{kids}</details>'


def _tables(d: dict, top: int) -> str:
    ms_unit = "GPU ms" if d.get("timeline") else "ms"
    lines = [{**r, "where": _where(r)} for r in d["lines"][:top]]
    ops = [{**o, "shapes_text": _shapes(o["shapes"]), "where": _where(o),
            "pct": (o["pct_of_roofline"], roofline_cell(o["rule"], o["pct_of_roofline"], _pct))}
           for o in d["ops"][:top]]
    kernels = [{**k, "avg_us": k["avg_ms"] * 1e3, "share": (k["share"], _pct(k["share"]))} for k in d["kernels"][:top]]
    memory = [{**m, "memory": f"{m['source']} -> {m['destination']}", "mb": m["bytes"] / 1e6} for m in d["memory_ops"]]
    syncs = [{**s, "where": _where(s)} for s in d["syncs"][:top]]
    host = [{**h, "where": _where(h)} for h in d.get("host_lines", [])[:top]]
    compiled = [{**c, "share": (c["share"], _pct(c["share"])),
                 "where": "; ".join(f"{x['file'].rsplit('/', 1)[-1]}:{x['line']} {x['code']}" for x in c["lines"])}
                for c in d.get("compiled", [])[:top]]
    return "\n".join([
        "<h2>Source lines</h2><p class='note'>Flat view by line: self is work launched on the line itself, total "
        "includes the functions it called; backward work counts on the forward line that created it.</p>",
        table([("line", "where"), ("function", "function"), (f"self {ms_unit}", "self_ms:n"),
                (f"total {ms_unit}", "total_ms:n"), ("backward ms", "backward_ms:n"), ("count", "count:n")],
               lines, "lines"),
        "<h2>Host time by line</h2><p class='note'>Per step: the program's main thread at each line (waits on the "
        "GPU left out), with the autograd engine's work for the line's ops; scaled to the program without the "
        "profiler where steps outside the window were timed.</p>",
        table([("line", "where"), ("function", "function"), ("host ms a step", "host_ms_per_step:n"),
                ("of which backward ms (window)", "backward_ms:n")], host, "host"),
        "<h2>Ops on the roofline</h2>",
        table([("op", "name"), ("inputs", "shapes_text"), ("pass", "pass"), ("calls", "count:n"), ("ms", "ms:n"),
                ("TFLOP/s", "tflops:n"), ("GB/s", "gbps:n"), ("FLOP/B", "intensity:n"), ("bound", "bound"),
                ("of roofline", "pct:n"), ("headroom ms", "headroom_ms:n"), ("line", "where"), ("module", "module")],
               ops, "ops"),
        "<h2>Kernels</h2>",
        table([("kernel", "name"), ("category", "category"), ("count", "count:n"), ("total ms", "total_ms:n"),
                ("avg us", "avg_us:n"), ("share", "share:n")], kernels, "kernels"),
        *(["<h2>torch.compile's kernels</h2><p class='note'>Each kernel Inductor generated that ran in the window, "
            "with the lines of the program whose operations it holds (`roofline inspect` shows inside each).</p>",
            table([("kernel", "name"), ("kind", "kind"), ("count", "count:n"), ("total ms", "total_ms:n"),
                   ("share", "share:n"), ("lines fused", "where")], compiled, "compiled")] if compiled else []),
        "<h2>Modules</h2>",
        table([("module", "path"), ("total ms", "total_ms:n"), ("forward ms", "forward_ms:n"),
                ("backward ms", "backward_ms:n"), ("self ms", "self_ms:n")], d["modules"][:top], "modules"),
        "<h2>Memory operations</h2>",
        table([("kind", "kind"), ("memory", "memory"), ("count", "count:n"), ("MB", "mb:n"), ("ms", "total_ms:n"),
                ("GB/s", "gbps:n")], memory, "memory"),
        *([f"<h2>Nsight Compute: the top kernels</h2><p class='note'>The heaviest launches of each (by grid and "
           f"block), {d['ncu']['seconds']:,.0f} s of ncu runs (the program run again per launch).</p>",
           table([("kernel", "name"), *((header, f"{key}:n") for header, _, key, _ in NCU_COLUMNS),
                   ("launch; note", "said")], [{**k, "said": row_note(k)} for k in d["ncu"]["kernels"]], "ncu")]
          if d.get("ncu") else []),
        *_inside(d.get("inside") or []),
        "<h2>Host synchronizations</h2>",
        table([("call", "call"), ("line", "where"), ("count", "count:n"), ("host wait ms", "wait_ms:n"),
                ("GPU idle after ms", "idle_ms:n"), ("saved without it ms", "gain_ms:n")], syncs, "syncs"),
    ])


def _inside(inside: list) -> list[str]:
    """--inspect K: each configuration of the heaviest Triton kernels, as roofline inspect reads its binary."""
    if not inside:
        return []
    rows = []
    for x in inside:
        for c in x["configurations"]:
            if "error" in c:   # could not be compiled for the GPU asked for
                rows.append({"kernel": x["kernel"], "share": (x["share"], _pct(x["share"])), "where": c["where"],
                             "findings": f"not compiled: {c['error']}"})
                continue
            occ, mix = c["occupancy"], c["mix"]
            rows.append({
                "kernel": x["kernel"], "share": (x["share"], _pct(x["share"])), "where": c["where"],
                "registers": c["registers"], "local": c["local_memory"], "smem": c["shared_bytes"],
                "occupancy": (occ["occupancy"], f"{occ['occupancy']:.0%} {occ['limiter']}"),
                "tc": mix["counts"].get("tensor core", 0),
                "loads": ", ".join(f"{n} x {bits}-bit" for bits, n in mix["load_bits"].items()) or "-",
                "findings": "; ".join(f"{f['title']} ({f['where']})" for f in c["findings"])})
    return ["<h2>Inside the heaviest Triton kernels</h2><p class='note'>Each configuration the program launched, "
            "read from the binary it ran as roofline inspect reads it (--inspect K).</p>",
            table([("kernel", "kernel"), ("share", "share:n"), ("defined at", "where"), ("registers", "registers:n"),
                   ("local bytes", "local:n"), ("shared bytes", "smem:n"), ("occupancy (limit)", "occupancy:n"),
                   ("tensor-core instr.", "tc:n"), ("global loads", "loads"), ("findings", "findings")],
                  rows, "inside")]


def render(d: dict, title: str = "roofline profile", top: int = 50) -> str:
    """The report page for a Report's JSON form (Report.to_dict())."""
    total = d["tree"]["total_ms"] if d.get("tree") else 0
    body = "\n".join([
        f"<h1>{escape(title)}</h1><div class='sub'>roofline profile, schema {escape(d['schema'])}</div>",
        "<h2>Summary</h2>", _summary(d),
        "<h2>Findings</h2>", _findings(d),
        *(["<h2>Every rank</h2>", _ranks(d)] if d.get("ranks") else []),
        "<h2>Timeline</h2>", _timeline(d),
        "<h2>Roofline</h2>", _roofline_chart(d),
        "<h2>Top-down: call paths</h2>",
        f'<div class="tree" id="tree">{_tree(d["tree"], total) if d.get("tree") else ""}</div>',
        _tables(d, top),
    ])
    return page(title, body)
