"""The profile's heaviest Triton kernels seen from inside (`roofline profile --inspect K`).

While the program runs, every Triton launch that goes through Triton's JIT is noted with the binary it ran
(roofline.inspect.kernels: the first launch of each kernel and configuration, which is the one that compiles;
roofline's ops launch again from C++ past the JIT, and those add nothing new). After the profile, the K kernels
with the most GPU time that are Triton kernels are matched by name to those launches, and each configuration
launched is read as `roofline inspect` reads a kernel: registers, spills, shared memory, occupancy and what
limits it, the instruction mix, and findings at their lines. A profile that says a kernel is slow can then say
what inside it is (occupancy limited by registers, no tensor-core instruction for its tl.dot, narrow loads).
"""

from __future__ import annotations

from dataclasses import dataclass

from roofline.profiler.kernels import function_name, short_name


@dataclass
class Inside:
    kernel: str            # the profile's short name
    share: float           # its share of the GPU's time
    total_us: float
    reports: list          # roofline.inspect.report.KernelReport (or Uncompiled): a configuration launched each

    def to_dict(self) -> dict:
        return {"kernel": self.kernel, "share": self.share, "total_us": self.total_us,
                "configurations": [r.to_dict() for r in self.reports]}


def look_inside(rows: list, launches: list, count: int, sms: int | None = None) -> list[Inside]:
    """For each of the `count` heaviest kernel rows (profiler.kernels.KernelRow, heaviest first) that a noted
    Triton launch names, that kernel's configurations inspected."""
    from roofline.inspect import kernels
    from roofline.inspect.report import report_of

    by_name: dict[str, list] = {}
    for launch in launches:
        by_name.setdefault(launch.name, []).append(launch)
    chosen = [(row, by_name[function_name(row.full_name)]) for row in rows
              if function_name(row.full_name) in by_name][:count]
    if not chosen:
        return []
    todo = [launch for _, found in chosen for launch in found]
    built = iter(kernels.compiled(todo, kernels.target(None)))
    return [Inside(short_name(row.full_name), row.share, row.total_us,
                   [report_of(launch, next(built), sms) for launch in found]) for row, found in chosen]


SLOW_KERNEL_FINDINGS = ("small-grid", "below-roofline")   # the profile's findings about how fast kernels run


def link(findings: list, inside: list[Inside]) -> None:
    """Tell the profile's slow-kernel findings (small-grid's kernel, the kernels of the op a below-roofline finding
    is about) what inspect found inside those kernels, where --inspect looked: its findings' titles and lines, that
    its binary shows none, or that it could not be compiled; in the message, and as evidence["inside"]."""
    by_kernel = {x.kernel: x for x in inside}
    for f in findings:
        if f.id not in SLOW_KERNEL_FINDINGS:
            continue
        named = [f.evidence.get("kernel")] + [k for o in f.ops for k in (o.kernels or {})]
        said = []
        for x in (by_kernel[k] for k in dict.fromkeys(named) if k in by_kernel):
            read = [r for r in x.reports if hasattr(r, "findings")]   # an Uncompiled report read no binary
            found = {(g.title, g.where): g.id for r in read for g in r.findings}
            f.evidence.setdefault("inside", {})[x.kernel] = sorted(set(found.values()))
            if found:
                said.append(f"inside {x.kernel}, " + "; ".join(f"{title} ({where})" for title, where in found))
            elif read:
                said.append(f"inside {x.kernel}, its binary shows nothing to fix (registers, occupancy, loads)")
            else:
                said.append(f"{x.kernel} could not be compiled to look inside ({x.reports[0].error})")
        if said:
            f.message += f" roofline inspect's view: {'. '.join(said)}."


def render(inside: list[Inside], console, top: int) -> None:
    from roofline.inspect.report import render_reports

    if not inside:
        return
    names = ", ".join(f"{x.kernel} ({x.share:.0%} of the GPU's time)" for x in inside)
    console.print(f"\n[bold]Inside the heaviest Triton kernels[/bold] (roofline inspect's view of the binaries that "
                  f"ran): {names}", highlight=False)
    render_reports([r for x in inside for r in x.reports], console, top)
