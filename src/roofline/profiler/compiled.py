"""torch.compile's kernels in a profile: each kernel Inductor generated that ran in the window, its time there,
and the lines of the user's code whose operations it holds.

A profile charges a compiled region's kernels to the line that called the region (`loss = model(x)`); the lines
inside come from Inductor itself, noted while the program compiled (roofline.inspect.generated, kept in the
trace's run facts as "compiled_kernels"). A Triton kernel is found on the GPU by its name; a C++ kernel (a CPU) by
its own profiler range, graph_N_<name>. The calls Inductor leaves to a library (mm, attention) are not among them:
they are the ops of the op table. Inductor names a kernel uniquely within its graph only: kernels of one name in
two graphs (a forward's and its backward's) are one row here, with the lines of both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roofline.inspect.generated import GRAPH_PREFIX, Line
from roofline.profiler.trace import Trace

@dataclass
class CompiledRow:
    name: str
    kind: str                                # "triton" or "cpp"
    lines: list[Line] = field(default_factory=list)   # the user's lines it fused
    count: int = 0
    total_us: float = 0.0

    def to_dict(self, ms_total: float) -> dict:
        return {"name": self.name, "kind": self.kind, "count": self.count, "total_ms": self.total_us / 1e3,
                "share": self.total_us / 1e3 / ms_total if ms_total else None,
                "lines": [{"file": x.file, "line": x.line, "code": x.code} for x in self.lines]}


def compiled_table(trace: Trace, kernel_rows: list) -> list[CompiledRow]:
    """The kernels torch.compile generated that ran in the window, by time: their lines (across every graph that
    has a kernel of the name) and their time, from the GPU's kernels (kernels.kernel_table's rows) or, on a CPU,
    from the C++ kernels' ranges."""
    noted = trace.facts.get("compiled_kernels") or []
    rows: dict[str, CompiledRow] = {}
    for k in noted:
        if k["kind"] not in ("triton", "cpp"):
            continue
        row = rows.setdefault(k["name"], CompiledRow(k["name"], k["kind"]))
        row.lines += [x for x in (Line(*line) for line in k["lines"]) if x not in row.lines]
    if not rows:
        return []
    for kernel in kernel_rows:
        row = rows.get(kernel.full_name)
        if row is not None:
            row.count += kernel.count
            row.total_us += kernel.total_us
    for op in trace.ops:
        row = rows.get(GRAPH_PREFIX.sub("", op.name))
        if row is not None and row.kind == "cpp":
            row.count += 1
            row.total_us += op.end - op.ts
    for row in rows.values():
        row.lines.sort(key=lambda x: (x.file, x.line))
    return sorted((r for r in rows.values() if r.count), key=lambda r: -r.total_us)
