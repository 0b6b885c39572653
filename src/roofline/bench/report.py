"""A sweep's result as a terminal table, CSV, JSON, markdown and a plot."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from roofline.bench.sweep import SweepResult

JSON_SCHEMA_VERSION = 1

# Short tags for a measurement's warnings, for the table's note column.
_WARNING_TAGS = (("noisy", "noisy"), ("short", "short: timer-bound"), ("launch-bound", "launch-bound"),
                 ("clock", "clock dropped"), ("GPU slowed", "GPU slowed"), ("escaped", "escaped stream?"))


def format_x(x) -> str:
    if isinstance(x, int) and x >= 1024 and x & (x - 1) == 0:
        return f"2^{x.bit_length() - 1}"
    return str(x)


def format_ms(ms: float | None) -> str:
    if ms is None:
        return ""
    return f"{ms:.3f} ms" if ms >= 1 else f"{ms * 1e3:.2f} us"


def _num(v: float | None) -> str:
    """Three significant digits, with thousands separators for large values."""
    if v is None:
        return ""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _columns(result: SweepResult) -> list[str]:
    have = lambda attr: any(getattr(r, attr) is not None for r in result.rows)  # noqa: E731
    cols = ["x", "provider", "median", "cv"]
    cols += [c for c in ("gbps", "tflops", "pct_of_roofline") if have(c)]
    return cols + ["speedup", "note"]


_HEADERS = {"x": None, "provider": "provider", "median": "median", "cv": "CV", "gbps": "GB/s",
            "tflops": "TFLOP/s", "pct_of_roofline": "% roofline", "note": "note"}


def _cells(result: SweepResult, row) -> dict[str, str]:
    m = row.measurement
    note = row.reason if row.status != "ok" else ", ".join(
        tag for key, tag in _WARNING_TAGS if any(w.startswith(key) for w in m.warnings))
    speedup = ""
    if row.speedup is not None and row.provider != result.baseline:
        speedup = f"{row.speedup:.2f}x [{row.speedup_low:.2f}-{row.speedup_high:.2f}]"
    return {
        "x": format_x(row.x),
        "provider": row.provider,
        "median": format_ms(row.median_ms) if m else row.status,
        "cv": f"{m.cv:.1%}" if m else "",
        "gbps": _num(row.gbps),
        "tflops": _num(row.tflops),
        "pct_of_roofline": _num(row.pct_of_roofline),
        "speedup": speedup,
        "note": note,
    }


def _title(result: SweepResult) -> str:
    c = result.ceilings
    roof = []
    if c.get("dram_gbps"):
        roof.append(f"{c['dram_gbps']:,.0f} GB/s")
    return (f"{result.name} on {result.device['name']}"
            + (f" (roofline: {', '.join(roof)}, {c['source']})" if roof else ""))


# (short header, folds): how each column gives way in a narrow terminal (roofline.tables)
_NARROW = {"provider": (None, True), "pct_of_roofline": ("roof", False), "tflops": ("TF/s", False),
           "speedup": ("vs base", True), "note": (None, True), "median": (None, False), "cv": (None, False),
           "gbps": (None, False), "x": (None, False)}


def show(result: SweepResult, console) -> None:
    """The sweep as a table on `console`, fitted to its width, one row per size and provider that ran or failed.

    Skipped providers are left out (the CLI lists them once, with the reason).
    """
    from roofline.tables import Column, Row, show as show_table

    cols = _columns(result)
    columns = [Column(result.x_name if c == "x" else _HEADERS.get(c) or f"vs {result.baseline} (95% CI)",
                      _NARROW[c][0], justify="left" if c in ("provider", "note") else "right", fold=_NARROW[c][1])
               for c in cols]
    rows = [r for r in result.rows if r.status != "skipped"]
    show_table(console, _title(result), columns, [
        Row([_cells(result, row)[c] for c in cols], style="red" if row.status == "failed" else None,
            end_section=i + 1 == len(rows) or rows[i + 1].x != row.x) for i, row in enumerate(rows)])


def to_markdown(result: SweepResult) -> str:
    cols = _columns(result)
    headers = [result.x_name if c == "x" else _HEADERS.get(c) or f"vs {result.baseline} (95% CI)" for c in cols]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    for row in result.rows:
        cells = _cells(result, row)
        lines.append("| " + " | ".join(cells[c].replace("|", "/") for c in cols) + " |")
    return "\n".join(lines)


def to_dict(result: SweepResult, samples: bool = False) -> dict:
    return {
        "schema": "roofline.sweep",
        "schema_version": JSON_SCHEMA_VERSION,
        "name": result.name,
        "description": result.description,
        "x_name": result.x_name,
        "baseline": result.baseline,
        "providers": result.providers,
        "started_at": result.started_at,
        "seconds": result.seconds,
        "device": result.device,
        "ceilings": result.ceilings,
        "options": result.options,
        "rows": [r.to_dict(samples=samples) for r in result.rows],
    }


def write_json(result: SweepResult, path, samples: bool = True) -> None:
    Path(path).write_text(json.dumps(to_dict(result, samples=samples), indent=1, default=str))


CSV_FIELDS = ("x", "provider", "status", "median_ms", "mean_ms", "min_ms", "p10_ms", "p90_ms", "std_ms",
              "cv", "n", "mode", "gbps", "tflops", "pct_of_roofline", "speedup", "speedup_low",
              "speedup_high", "warnings", "reason")


def write_csv(result: SweepResult, path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS)
        w.writeheader()
        for r in result.rows:
            m = r.measurement
            w.writerow({
                "x": r.x, "provider": r.provider, "status": r.status, "reason": r.reason,
                "median_ms": m.median if m else "", "mean_ms": m.mean if m else "",
                "min_ms": m.min if m else "", "p10_ms": m.p10 if m else "", "p90_ms": m.p90 if m else "",
                "std_ms": m.std if m else "", "cv": m.cv if m else "", "n": m.n if m else "",
                "mode": m.mode if m else "", "gbps": r.gbps or "", "tflops": r.tflops or "",
                "pct_of_roofline": r.pct_of_roofline or "", "speedup": r.speedup or "",
                "speedup_low": r.speedup_low or "", "speedup_high": r.speedup_high or "",
                "warnings": "; ".join(m.warnings) if m else "",
            })


def plot(result: SweepResult, path, metric: str | None = None) -> str:
    """Throughput (or time) against size, one line per provider, the ceiling as a dashed line.

    metric: "gbps", "tflops" or "time"; by default GB/s if the sweep counts bytes,
    else TFLOP/s if it counts FLOPs, else time. Returns the metric plotted.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    from roofline.device import matmul_key

    ok = [r for r in result.rows if r.status == "ok"]
    if metric is None:
        metric = "gbps" if any(r.gbps for r in ok) else "tflops" if any(r.tflops for r in ok) else "time"
    if metric not in ("gbps", "tflops", "time"):
        raise ValueError(f"metric must be 'gbps', 'tflops' or 'time', got {metric!r}")
    value = {"gbps": lambda r: r.gbps, "tflops": lambda r: r.tflops, "time": lambda r: r.median_ms}[metric]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for name in result.providers:
        pts = [(r.x, value(r)) for r in ok if r.provider == name and value(r) is not None]
        if pts:
            ax.plot(*zip(*pts), marker="o", markersize=3, label=name)
    c = result.ceilings
    ceiling = None
    if metric == "gbps":
        ceiling = c.get("dram_gbps")
    elif metric == "tflops" and ok and ok[0].dtype:
        import torch

        ceiling = c.get("matmul_tflops", {}).get(matmul_key(getattr(torch, ok[0].dtype)))
    if ceiling:
        ax.axhline(ceiling, color="black", linestyle="--", linewidth=1,
                   label=f"ceiling {ceiling:,.0f} ({c.get('source')})")
    numeric = ok and all(isinstance(r.x, (int, float)) and r.x > 0 for r in ok)
    if numeric:
        ax.set_xscale("log", base=2)
    if metric == "time":
        ax.set_yscale("log")
    ax.set_xlabel(result.x_name)
    ax.set_ylabel({"gbps": "GB/s", "tflops": "TFLOP/s", "time": "median time (ms)"}[metric])
    ax.set_title(_title(result), fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return metric

