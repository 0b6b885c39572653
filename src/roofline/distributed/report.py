"""What a program of several ranks is told: each rank's step split into compute, communication and exposed
communication; each collective against the interconnect's ceiling (roofline doctor's, where it measured this
machine); the rank that held the others back, and where; and what to do, each finding with its line and its
estimated gain a step."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from roofline.distributed.merge import Merged, collective_rows
from roofline.tables import Column, Row, show

EXPOSED_SHARE = 0.05   # exposed communication worth a finding: this share of a step, at least
SMALL_BYTES = 1 << 20  # messages under this are latency-bound on NVLink (busbw under a tenth of the peak at 1 MiB)


@dataclass
class Finding:
    id: str
    title: str
    message: str
    where: str | None
    gain_ms: float        # estimated, a step

    def to_dict(self) -> dict:
        return asdict(self)




def findings(merged: Merged) -> list[Finding]:
    out = []
    step = next((r.step_ms for r in merged.ranks if r.step_ms), None)
    s = merged.straggler
    if s is not None and step and s.waited_ms > 0.01 * step:
        where = f" It spent {s.where_ms:,.2f} ms a step more than the others at {s.where}." if s.where else ""
        out.append(Finding(
            "straggler", f"rank {s.rank} holds the other ranks back",
            f"Rank {s.rank} arrived last at {s.last_at} of {s.calls} collectives, and the other ranks waited "
            f"{s.waited_ms:,.2f} ms a step for it.{where} A rank that loads its data on the critical path, gets a "
            "larger batch, or runs on a slower GPU makes every rank wait at the next collective.",
            str(s.where) if s.where else None, s.waited_ms))
    # The rank that waits least at its collectives shows the communication itself; the others' exposed time adds
    # their wait for a later rank, which the straggler's finding is about.
    exposed = min(r.exposed_ms for r in merged.ranks)
    if step and exposed > EXPOSED_SHARE * step:
        rows = collective_rows(merged)
        top = rows[0]["where"] if rows else None
        if rows and rows[0]["asynchronous"]:
            advice = ("DDP: larger buckets (DistributedDataParallel(bucket_cap_mb=...)) send fewer, larger messages; "
                      "gradient_as_bucket_view=True saves a copy; under gradient accumulation, no_sync() on all but the "
                      "last micro-batch reduces once. FSDP2: prefetch the next layer's all-gather, and "
                      "reshard_after_forward=False keeps the parameters gathered for the backward.")
        else:
            advice = ("The program waits for each collective where it calls it: async_op=True and a wait() just "
                      "before the result is needed let computation run meanwhile.")
        out.append(Finding(
            "exposed-communication", "communication no computation hides",
            f"A step spends {exposed:,.2f} ms of {step:,.2f} communicating with nothing of its own to compute "
            f"meanwhile (on the rank that waits least for the others). {advice}", top, exposed))
    for row in collective_rows(merged):
        if row["bytes"] and row["bytes"] < SMALL_BYTES and row["calls"] >= 4 and step and row["ms"] > 0.01 * step:
            out.append(Finding(
                "small-collectives", f"{row['calls']:.0f} small {row['kind']}s a step",
                f"{row['calls']:.0f} calls a step of {row['bytes']:,} bytes each take {row['ms']:,.2f} ms: messages "
                "this small are bound by each call's latency, not by the interconnect's bandwidth. Put them in one "
                "tensor (a bucket) and reduce it once.", row["where"], row["ms"] * (1 - 1 / row["calls"])))
    return sorted(out, key=lambda f: -f.gain_ms)


def _size(nbytes: int | None) -> str:
    if not nbytes:
        return ""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:,.1f} {unit}"
    return f"{nbytes} B"


def render(merged: Merged, console, ceiling=None, top: int = 10) -> None:
    """The ranks side by side, their collectives, the straggler and the findings. ceiling: doctor's Interconnect."""
    ranks = merged.ranks
    console.print(f"[bold]{merged.world} ranks[/bold], {ranks[0].steps} steps recorded on each; "
                  f"{merged.matched} collective calls matched across the ranks"
                  + (f" ({merged.mismatch})" if merged.mismatch else ""))
    if not any(r.calls for r in ranks):
        console.print("[yellow]No rank called a collective in the recorded steps: there is no communication to "
                      "show (a program of several ranks that never communicates trains several models).[/yellow]")
    rows = [Row([str(r.rank), _ms(r.step_ms), _ms(r.compute_ms), _ms(r.comm_ms), _ms(r.exposed_ms),
                 "" if r.overlap is None else f"{r.overlap:.0%}", _ms(wait)]) for r, wait in zip(ranks, merged.waits_ms)]
    show(console, "ranks (ms a step)", [Column("rank"), Column("step"), Column("compute"), Column("comm"),
                                        Column("exposed"), Column("overlap", "ovl"), Column("waited", "wait")], rows)
    rows = []
    for c in collective_rows(merged)[:top]:
        peak = ceiling.peak_busbw(c["kind"]) if ceiling is not None else None
        rows.append(Row([c["kind"], _size(c["bytes"]), c["where"] or "", f"{c['calls']:g}", _ms(c["ms"]),
                         f"{c['call_us']:,.0f}", "" if c["busbw_gbps"] is None else _gbps(c["busbw_gbps"]),
                         f"{c['busbw_gbps'] / peak:.0%}" if peak and c["busbw_gbps"] else ""]))
    if rows:
        show(console, "collectives (the median rank, a step)",
             [Column("collective", "coll", justify="left"), Column("size"), Column("line", justify="left", fold=True),
              Column("calls"), Column("ms"), Column("us a call", "us"), Column("busbw GB/s", "busbw"),
              Column("of peak", "peak")], rows)
    found = findings(merged)
    if found:
        show(console, "findings across the ranks (estimated gains a step overlap; do not add them up)",
             [Column("finding", justify="left", fold=True), Column("where", justify="left", fold=True),
              Column("gain ms", "gain")],
             [Row([f"[bold]{f.title}[/bold]\n{f.message}", f.where or "", f"{f.gain_ms:,.2f}"]) for f in found])


def _gbps(value: float) -> str:
    """Bus bandwidth: one decimal where large (NVLink's hundreds of GB/s), three digits where small (gloo's)."""
    return f"{value:,.1f}" if value >= 10 else f"{value:.3g}"


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:,.2f}"
