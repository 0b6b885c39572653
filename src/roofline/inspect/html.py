"""`roofline inspect --html`: the kernels side by side, then each kernel's source with what every line compiled to
beside it (SASS instructions, tensor-core instructions, global loads by width, spills; PTX instructions, its
tensor-core instructions and loads; TTGIR ops and those of note), its findings, and its TTGIR, PTX and SASS (each
instruction under its source line) to read or search; torch.compile's kernels with the lines of the user's code
each fused, their time and their generated code."""

from __future__ import annotations

from html import escape
from pathlib import Path

from roofline.inspect import sass, ttgir
from roofline.inspect.generated import compact
from roofline.inspect.report import Inspection, KernelReport, Uncompiled, count_text, us_text, widths
from roofline.inspect.stalls import reason_text
from roofline.page import page, table


def render(found: Inspection, title: str) -> str:
    """The page for one inspection."""
    reports = [r for r in found.launched if isinstance(r, KernelReport)]
    made_reports = [k.report for k in found.made if isinstance(k.report, KernelReport)]
    parts = [f"<h1>{escape(title)}</h1><div class='sub'>roofline inspect</div>"]
    failed = [r for r in found.launched if isinstance(r, Uncompiled)]
    if found.launched:
        parts += ["<h2>Triton kernels the function launched</h2>", _overview(reports, "launched")]
        parts += [f"<div class='card'><b>{escape(r.name)}</b> ({escape(r.where)}) could not be compiled for the "
                  f"GPU asked for: {escape(r.error)}</div>" for r in failed]
        parts += [_kernel(r, f"launched-{i}") for i, r in enumerate(reports)]
    if found.made:
        parts += ["<h2>Kernels torch.compile generated</h2>", _generated(found.made)]
        if made_reports:
            parts += ["<h3>Their machine code</h3>", _overview(made_reports, "generated-code")]
            parts += [_kernel(r, f"generated-{i}") for i, r in enumerate(made_reports)]
    if not found.launched and not found.made:
        parts.append("<p>The function launched no Triton kernel, and torch.compile generated none for it.</p>")
    return page(title, "\n".join(parts))


def _overview(reports: list[KernelReport], table_id: str) -> str:
    if not reports:
        return ""
    note = ("<p class='note'>Compiled here, each with the configuration its launch ran (under Triton's "
            "interpreter, or on another GPU): on the GPU an autotuner may pick another.</p>"
            if any(r.compiled_here for r in reports) else "")
    rows = [{"kernel": r.name, "where": r.where, "arch": r.arch,
             "grid": "?" if r.grid is None else "x".join(map(str, r.grid)), "warps": r.num_warps,
             "registers": r.resources.registers, "local": r.resources.local_memory,
             "shared": (r.shared_bytes, f"{r.shared_bytes / 1024:,.1f}"),
             "occupancy": (r.occupancy.occupancy, f"{r.occupancy.occupancy:.0%}"), "limit": r.occupancy.limiter,
             "tc": r.mix.counts.get("tensor core", 0), "loads": widths(r.mix.load_bits) or "-",
             "findings": len(r.findings)} for r in reports]
    return note + table([("kernel", "kernel"), ("defined at", "where"), ("arch", "arch"), ("grid", "grid"),
                         ("warps", "warps:n"), ("registers", "registers:n"), ("local B", "local:n"),
                         ("shared KiB", "shared:n"), ("occupancy", "occupancy:n"), ("limited by", "limit"),
                         ("tensor-core instr.", "tc:n"), ("global loads", "loads"), ("findings", "findings:n")],
                        rows, table_id)


def _kernel(r: KernelReport, anchor: str) -> str:
    """One kernel: its launch, findings, source beside its machine code's counts, and its code."""
    occ = r.occupancy
    head = (f"<h3 id='{anchor}'>{escape(r.name)} <span class='where'>{escape(r.where)}</span></h3>"
            f"<div class='note'>{escape(' '.join(f'{k}={v}' for k, v in r.constexprs.items()))}</div>"
            f"<p>{r.num_warps} warps, {r.num_stages} stages; {r.resources.registers} registers a thread, "
            f"{r.resources.local_memory:,} bytes of local memory, {r.shared_bytes:,} bytes of shared memory a block; "
            f"{occ.blocks} block{'s' if occ.blocks != 1 else ''} an SM ({occ.occupancy:.0%} of its warps, limited "
            f"by {escape(occ.limiter)}); {r.mix.total} instructions.</p>")
    cards = "".join(f"<div class='card'><b>{escape(f.title)}</b> <span class='where'>{escape(f.where or '')}"
                    f"</span><div>{escape(f.message)}</div></div>" for f in r.findings)
    sections = "".join(f"<details><summary>{label}</summary><pre>{escape(r.asm[key])}</pre></details>"
                       for key, label in (("sass", "SASS, each instruction under its source line"),
                                          ("ptx", "PTX"), ("ttgir", "TTGIR"), ("ttir", "TTIR"))
                       if key in r.asm)
    return head + cards + _source(r, anchor) + sections


def _source(r: KernelReport, anchor: str) -> str:
    """The kernel's lines with what each compiled to; then the lines it inlined from other files."""
    counts = {(x.file, x.line): x for x in r.lines}
    spills = bool(r.mix.counts.get("spill"))
    sampled = r.stalls is not None and r.stalls.samples > 0   # --ncu: where its warps waited, by line
    waits = {x.line: x for x in r.stalls.lines} if sampled else {}

    def row(where: str, code: str, x, line: int | None = None) -> dict:
        waited = waits.get(line)
        mix, ptx, ops = (x.mix, x.ptx, x.ttgir) if x else (None, sass.Mix(), sass.Mix())
        return {"line": where, "code": code, "instructions": mix.total if mix else None,
                "tc": mix.counts.get("tensor core", 0) if mix else None,
                "loads": widths(mix.load_bits) if mix else "", "stores": widths(mix.store_bits) if mix else "",
                "spills": mix.counts.get("spill", 0) if mix else None,
                "ptx": ptx.total if x else None, "ptx_tc": ptx.counts.get("tensor core", 0) if x else None,
                "ptx_loads": widths(ptx.load_bits), "ttgir": ops.total if x else None,
                "ttgir_notable": ttgir.notable(ops),
                "samples": (waited.samples / r.stalls.samples, f"{waited.samples / r.stalls.samples:.0%}")
                if waited and waited.samples else None,
                "why": reason_text(waited.top_reason, bool(x and x.mbarrier_waits)) if waited else "",
                "_class": None if x else "cold"}

    own = [row(str(r.first_line + k), text, counts.get((r.file, r.first_line + k)), r.first_line + k)
           for k, text in enumerate(r.source)]
    inlined = [row(f"{Path(x.file).name}:{x.line}", x.source, x,
                   x.line if Path(x.file).name == Path(r.file).name else None) for x in r.lines
               if x.file != r.file or not r.first_line <= x.line < r.first_line + len(r.source)]
    columns = [("line", "line"), ("source", "code:code"), ("SASS instr.", "instructions:n"),
               ("SASS tensor core", "tc:n"), ("SASS global loads", "loads"), ("SASS global stores", "stores"),
               *([("spills", "spills:n")] if spills else []),
               ("PTX instr.", "ptx:n"), ("PTX tensor core", "ptx_tc:n"), ("PTX global loads", "ptx_loads"),
               ("TTGIR ops", "ttgir:n"), ("TTGIR ops of note", "ttgir_notable"),
               *([("warp samples (ncu)", "samples:n"), ("most often waiting on", "why")] if sampled else [])]
    out = "<h3>Source, with what each line compiled to</h3>" + (
        table(columns, own, f"{anchor}-source") if own else
        "<p class='note'>The kernel's source could not be read; its lines by instructions follow.</p>")
    if inlined:
        out += ("<p class='note'>Inlined from other files (Triton's reductions, helpers) or outside the kernel's "
                "own function:</p>" + table(columns, inlined, f"{anchor}-inlined"))
    return out


def _generated(made: list) -> str:
    total = sum(k.ms or 0.0 for k in made)
    rows = [{"graph": k.graph, "kernel": k.label, "kind": k.kind, "calls": (k.calls, count_text(k.calls)),
             "us": (k.ms * 1e3, us_text(k.ms)) if k.ms is not None else None,
             "share": (k.ms / total, f"{k.ms / total:.0%}") if k.ms is not None and total else None,
             "lines": compact(k.lines)} for k in made]
    out = ("<p class='note'>In the order each graph runs them (a backward is a graph of its own; aten:: is a "
           "library call); time a run, the median of its calls.</p>"
           + table([("graph", "graph:n"), ("kernel", "kernel"), ("kind", "kind"), ("calls", "calls:n"),
                    ("us a run", "us:n"), ("share", "share:n"), ("your lines", "lines")], rows, "generated"))
    for k in made:
        lines = "".join(f"<tr><td class='where'>{escape(str(x))}</td><td class='code'>{escape(x.code)}</td></tr>"
                        for x in k.lines)
        code = (f"<details><summary>its code ({len(k.code.splitlines())} lines)</summary><pre>{escape(k.code)}"
                "</pre></details>" if k.code else "")
        out += (f"<div class='card'><b>{escape(k.label)}</b> <span class='note'>graph {k.graph}, {escape(k.kind)}"
                f"{f', {us_text(k.ms)} us a run' if k.ms is not None else ''}</span>"
                f"<table>{lines}</table>{code}</div>")
    return out
