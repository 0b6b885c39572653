"""Where a kernel's warps wait, line by line: Nsight Compute's source counters (`roofline inspect --ncu`).

ncu samples each SM's warps at a fixed interval while a kernel runs and notes, for each sample, the instruction
the warp is at and why it is not issuing (the stall reason). Its source page adds the samples up by source line,
through the line table the compiler put in the binary (Triton keeps one: the kernel's Python lines), with the
instructions each line executed and, for global memory, the L2 sectors it moved beyond what a coalesced access
would (excess). One ncu run records every launch of the inspected kernels; `--page source --print-source
cuda,sass --csv` prints them in launch order, a section a source file, which `parse` splits back into launches.
"""

from __future__ import annotations

import csv
import io
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

# ncu's stall reasons (column "stall_X" of the source page) in words, for the terminal and the page
REASONS = {
    "long_sb": "waiting on global or local memory (long scoreboard)",
    "short_sb": "waiting on shared memory or a special function (short scoreboard)",
    "barrier": "waiting at a barrier for the block's other warps",
    "math": "math pipe busy",
    "mio": "memory input/output queue full (shared memory, special functions)",
    "lg": "local/global memory queue full",
    "wait": "fixed-latency dependency",
    "not_selected": "ready, another warp issued",
    "selected": "issuing",
    "no_inst": "no instruction fetched (instruction cache)",
    "branch_resolving": "resolving a branch",
    "dispatch": "dispatch stall",
    "drain": "draining memory stores at exit",
    "imc": "constant cache miss",
    "membar": "memory barrier",
    "misc": "other",
    "sleep": "sleeping",
    "tex": "texture unit queue full",
}
SAMPLES = "Warp Stall Sampling (All Samples)"   # the source page's column of a line's warp samples
# A warp waiting on an mbarrier (Hopper's try-wait, SASS SYNCS.PHASECHK) is filed under long scoreboard, where it
# waits for the copy engine's bytes or for other warps' arrival, not for a load of its own
AT_MBARRIER = "waiting at an mbarrier, for the copy engine's bytes or other warps (long scoreboard)"


def reason_text(reason: str | None, at_mbarrier: bool = False) -> str:
    """A stall reason in words; at a line that waits on an mbarrier, long scoreboard is that wait."""
    if reason == "long_sb" and at_mbarrier:
        return AT_MBARRIER
    return REASONS.get(reason, reason or "")


@dataclass
class LineStalls:
    file: str
    line: int
    source: str
    samples: int                  # warp samples at this line's instructions
    reasons: dict                 # stall reason -> samples
    instructions: int             # warp-level instructions it executed
    excess_sectors: int           # global-memory L2 sectors beyond a coalesced access's
    sectors: int = 0              # global-memory L2 sectors its accesses moved
    shared_wavefronts: int = 0    # shared-memory wavefronts its accesses took
    shared_excess: int = 0        # of them, beyond a conflict-free access's (bank conflicts)

    @property
    def top_reason(self) -> str | None:
        return max(self.reasons, key=self.reasons.get) if self.reasons else None


@dataclass
class KernelStalls:
    name: str
    lines: list[LineStalls] = field(default_factory=list)   # every line ncu named, in the file's order
    threads: int | None = None    # the launch's block and grid (ncu's launch statistics), to tell one
    blocks: int | None = None     # configuration of a kernel from another, and from an autotuner's trials

    @property
    def samples(self) -> int:
        return sum(x.samples for x in self.lines)

    def reasons(self) -> dict:
        total: dict = {}
        for x in self.lines:
            for reason, n in x.reasons.items():
                total[reason] = total.get(reason, 0) + n
        return dict(sorted(total.items(), key=lambda kv: -kv[1]))

    def of_file(self, file: str) -> "KernelStalls":
        """Its lines in `file` (the kernel's own; the rest are Triton's library), matched by name, since a binary
        compiled from another checkout of a file names that checkout's path."""
        return KernelStalls(self.name, [x for x in self.lines if Path(x.file).name == Path(file).name],
                            self.threads, self.blocks)

    def to_dict(self) -> dict:
        return {"name": self.name, "samples": self.samples, "reasons": self.reasons(),
                "lines": [{**asdict(x), "top_reason": x.top_reason}
                          for x in sorted(self.lines, key=lambda x: -x.samples) if x.samples]}


def _int(text: str) -> int:
    try:
        return int(float(text.replace(",", "")))
    except ValueError:   # "-": no figure for this line
        return 0


def parse(text: str) -> list[KernelStalls]:
    """The launches of ncu's `--page source --print-source cuda,sass --csv` output, in order. Each launch prints a
    section a source file ("File Path", "Function Name", a header, then a row a source line followed by its
    instructions' rows); a launch ends where the function changes or one of its files comes round again."""
    rows = csv.reader(io.StringIO("\n".join(line for line in text.splitlines() if line.startswith('"'))))
    launches: list[KernelStalls] = []
    files_seen: set = set()
    file = header = None
    for row in rows:
        if not row:
            continue
        if row[0] == "File Path":
            file = row[1]
            continue
        if row[0] == "Function Name":
            if not launches or launches[-1].name != row[1] or file in files_seen:
                launches.append(KernelStalls(row[1]))
                files_seen = set()
            files_seen.add(file)
            continue
        if row[0] == "Line No":
            header = {name: i for i, name in reversed(list(enumerate(row)))}   # the first of a repeated name
            if SAMPLES not in header:
                raise ValueError(f"ncu's source page has no column {SAMPLES!r} (this ncu names its columns "
                                 f"otherwise: {', '.join(row[:8])}, ...)")
            continue
        if header is None or not row[0].isdigit():
            continue   # an instruction's row ("", "", address, ...): its line's row holds the sums

        def figure(name: str) -> int:
            return _int(row[header[name]]) if name in header else 0

        reasons = {name[len("stall_"):]: _int(row[i]) for name, i in header.items()
                   if name.startswith("stall_") and not name.endswith("(Not Issued)") and _int(row[i])}
        launches[-1].lines.append(LineStalls(
            file, int(row[0]), row[1], figure(SAMPLES), reasons, figure("Instructions Executed"),
            figure("L2 Theoretical Sectors Global Excessive"), figure("L2 Theoretical Sectors Global"),
            figure("L1 Wavefronts Shared"), figure("L1 Wavefronts Shared Excessive")))
    return launches


def parse_launches(text: str) -> list[tuple[str, int, int]]:
    """(name, threads a block, blocks) of each launch of ncu's `--page raw --csv` output for the same report, in
    the source page's order."""
    from roofline.profiler.ncu import raw_table

    header, _units, rows = raw_table(text)
    if not rows:
        return []
    name, threads, blocks = (header.index(c) for c in ("Kernel Name", "launch__block_size", "launch__grid_size"))
    return [(row[name], _int(row[threads]), _int(row[blocks])) for row in rows]


def measure(target: str, names: list[str], compile: bool = False, ncu: str | None = None) -> list[KernelStalls]:
    """The source counters of every launch of the kernels `names` that the function `target` (FILE:FUNCTION)
    makes, run once under ncu in a process of its own (under torch.compile where `compile`)."""
    from roofline.profiler import ncu as ncu_tool

    timeout = ncu_tool.TIMEOUT_S
    ncu = ncu or ncu_tool.binary()
    if ncu is None:
        raise FileNotFoundError("--ncu: Nsight Compute (ncu) is not installed here")
    # load_name calls what it loads unless it is of the kind asked; every object is an object: loaded, not called
    run = ("import sys, torch; from roofline.targets import load_name; fn = load_name(sys.argv[1], object); "
           "(torch.compile(fn) if sys.argv[2] == '1' else fn)()")
    pattern = "regex:^(" + "|".join(sorted(set(names))) + ")$"
    with tempfile.TemporaryDirectory(prefix="roofline-ncu-") as folder:
        report = Path(folder) / "stalls"
        capture = [ncu, "--section", "SourceCounters", "--import-source", "yes", "--kernel-name-base", "function",
                   "--kernel-name", pattern, "-f", "-o", str(report), sys.executable, "-c", run, target,
                   "1" if compile else "0"]
        done = subprocess.run(capture, capture_output=True, text=True, timeout=timeout)
        if done.returncode or not report.with_suffix(".ncu-rep").exists():
            raise RuntimeError(f"ncu could not profile {target}: {(done.stdout + done.stderr)[-1500:]}")
        pages = []
        for page in (["--page", "source", "--print-source", "cuda,sass"],
                     ["--page", "raw", "--metrics", "launch__block_size,launch__grid_size"]):
            read = subprocess.run([ncu, "-i", str(report.with_suffix(".ncu-rep")), "--csv", *page],
                                  capture_output=True, text=True, timeout=timeout)
            if read.returncode:
                raise RuntimeError(f"ncu could not read its report back: {(read.stdout + read.stderr)[-1500:]}")
            pages.append(read.stdout)
    launches, configs = parse(pages[0]), parse_launches(pages[1])
    if len(configs) == len(launches):
        for k, (name, threads, blocks) in zip(launches, configs):
            if name == k.name:
                k.threads, k.blocks = threads, blocks
    return launches


def attach(reports: list, launches: list[KernelStalls]) -> int:
    """Give each KernelReport the stalls of its launch, only its own file's lines; the reports given some. ncu
    records every launch, inspect each configuration's first: a report takes the first launch of its name whose
    block and grid are its own (an autotuner's trials and the kernel's other configurations differ), or of its name
    alone where ncu's launch statistics were not read."""
    queue = list(launches)
    given = 0
    for report in reports:
        if not hasattr(report, "stalls"):
            continue   # could not be compiled: nothing to put beside
        threads = report.num_warps * 32

        def same(k: KernelStalls) -> bool:
            return k.name == report.name and (k.threads is None or (
                k.threads == threads and (report.blocks is None or k.blocks == report.blocks)))

        i = next((i for i, k in enumerate(queue) if same(k)), None)
        if i is not None:
            report.stalls = queue.pop(i).of_file(report.file)
            given += 1
    return given
