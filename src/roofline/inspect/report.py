"""One view of each kernel a function launches: its launch, its resources, its occupancy and what limits it, its
instruction mix, the source lines its code comes from (what each line became in SASS, in PTX and in TTGIR), and
findings at those lines. Kernels that torch.compile generated for the function come beside them: the user's lines
each fused, its time, its code.

    found = inspect_function(fn, arch="sm_90")      # roofline inspect FILE:FUNCTION
"""

from __future__ import annotations

import collections
import inspect as _inspect
import itertools
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from rich.markup import escape

from roofline.inspect import generated, kernels, occupancy, ptx, sass, ttgir
from roofline.inspect.stalls import reason_text
from roofline.tables import Column, Row, show

OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion", "launch_cooperative_grid",
           "launch_pdl")   # launch keywords that are compile options, not the kernel's constexprs
LOW_OCCUPANCY = 0.5        # below this share of the SM's warps, a limit other than the block's own size is named


@dataclass
class Finding:
    id: str
    title: str
    message: str
    where: str | None          # file:line

    def to_dict(self) -> dict:
        return asdict(self)


MBARRIER_WAIT = "SYNCS.PHASECHK"   # Hopper's try-wait on an mbarrier's phase


@dataclass
class LineRow:
    """What one source line of the kernel compiled to: its SASS, its PTX and its TTGIR ops."""
    file: str
    line: int
    source: str
    mix: sass.Mix                                        # SASS
    ptx: sass.Mix = field(default_factory=sass.Mix)      # PTX, in the same classes
    ttgir: sass.Mix = field(default_factory=sass.Mix)    # TTGIR ops by name
    mbarrier_waits: int = 0   # its SASS's waits on an mbarrier (SYNCS.PHASECHK): a TMA copy's or other warps'

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "source": self.source, **self.mix.to_dict(),
                "ptx": self.ptx.to_dict(), "ttgir": ttgir.to_dict(self.ttgir), "mbarrier_waits": self.mbarrier_waits}


@dataclass
class KernelReport:
    name: str
    where: str                 # file:line of its definition
    arch: str
    grid: tuple | None         # None where a grid function could not be read again
    num_warps: int
    num_stages: int
    constexprs: dict
    resources: sass.Resources
    shared_bytes: int          # a block's, static and dynamic
    occupancy: occupancy.Occupancy
    mix: sass.Mix
    lines: list[LineRow]
    findings: list[Finding]
    compiled_here: bool        # compiled on this machine (its launch ran under the interpreter, or for another GPU)
    sms: int | None            # the GPU's SMs, where known
    asm: dict = field(default_factory=dict, repr=False)   # ttgir, ptx, sass, ... as text
    file: str = ""             # the kernel's source: its file,
    source: list[str] = field(default_factory=list, repr=False)   # its function's lines,
    first_line: int = 0        # numbered from this line of its file
    stalls: object = None      # stalls.KernelStalls: where its warps waited, by line (--ncu); None without
    ptx: sass.Mix = field(default_factory=sass.Mix)      # its PTX's mix, in the SASS mix's classes
    ttgir: sass.Mix = field(default_factory=sass.Mix)    # its TTGIR's ops by name

    @property
    def blocks(self) -> int | None:
        return None if self.grid is None else self.grid[0] * self.grid[1] * self.grid[2]

    @property
    def waves(self) -> float | None:
        """The grid's blocks over what the GPU holds at once."""
        if not self.sms or not self.occupancy.blocks or self.blocks is None:
            return None
        return self.blocks / (self.sms * self.occupancy.blocks)

    def to_dict(self) -> dict:
        return {"name": self.name, "where": self.where, "arch": self.arch,
                "grid": None if self.grid is None else list(self.grid),
                "blocks": self.blocks, "num_warps": self.num_warps, "num_stages": self.num_stages,
                "constexprs": {k: repr(v) for k, v in self.constexprs.items()},
                "registers": self.resources.registers, "local_bytes": self.resources.local_bytes,
                "stack_bytes": self.resources.stack_bytes, "local_memory": self.resources.local_memory,
                "shared_bytes": self.shared_bytes,
                "occupancy": self.occupancy.to_dict(), "mix": self.mix.to_dict(), "ptx": self.ptx.to_dict(),
                "ttgir": ttgir.to_dict(self.ttgir), "sms": self.sms,
                "waves": self.waves, "compiled_here": self.compiled_here,
                "lines": [r.to_dict() for r in self.lines], "findings": [f.to_dict() for f in self.findings],
                "source": {"file": self.file, "first_line": self.first_line, "lines": self.source},
                "stalls": self.stalls.to_dict() if self.stalls is not None else None}


@dataclass
class Inspection:
    launched: list     # a KernelReport, or an Uncompiled, for each Triton launch the function made itself
    made: list         # generated.GeneratedKernel for each kernel torch.compile generated, timed, with its
                       # KernelReport where a GPU compiled it

    def to_dict(self) -> dict:
        return {"kernels": [r.to_dict() for r in self.launched], "generated": [k.to_dict() for k in self.made]}


def inspect_function(fn, *args, arch: str | None = None, sms: int | None = None, runs: int = 3,
                     **kwargs) -> Inspection:
    """Run fn(*args, **kwargs) once and inspect every Triton kernel it launched, compiled for `arch` ("sm_90"; by
    default this machine's GPU, else the H100's), and every kernel torch.compile generated for it, timed over
    `runs` more calls. sms: the GPU's SM count (this GPU's by default, where there is one) for the findings about
    the grid."""
    import torch

    gpu = kernels.target(arch)
    if sms is None and torch.cuda.is_available() and arch is None:
        sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    with generated.recording() as graphs:
        found = kernels.launches(fn, *args, **kwargs)
    made = generated.timed(graphs, fn, args, kwargs, runs)
    with_binary = [k for k in made if k.launch is not None]
    for k, built in zip(with_binary, kernels.compiled([k.launch for k in with_binary], gpu)):
        k.report = report_of(k.launch, built, sms)
    return Inspection([report_of(launch, built, sms) for launch, built in zip(found, kernels.compiled(found, gpu))],
                      made)


def report_of(launch: kernels.Launch, built: dict, sms: int | None):
    """One launch's KernelReport, from its kernel compiled (kernels.compiled's dict), or an Uncompiled saying why
    it could not be."""
    if "error" in built:
        return Uncompiled(launch.name, _where(*launch.where), built["error"])
    return analyze(launch, built, sms)


@dataclass
class Uncompiled:
    """A launch whose kernel could not be compiled for the GPU asked for, and why."""
    name: str
    where: str
    error: str

    def to_dict(self) -> dict:
        return {"name": self.name, "where": self.where, "error": self.error}


def _own_static_shared(used: sass.Resources, cubin: bytes, arch: str) -> int:
    """The kernel's own static shared memory. A cubin that reserves the system's shared memory for its blocks (a
    `.nv.shared.reserved.N` section: sm_90 kernels that use shared memory) counts that reserve in cuobjdump's
    SHARED; the occupancy adds it to every block already (measured: Nsight Compute reads no static shared
    memory and 1 KiB the driver's for such kernels, benchmarks/results/h100-inspect.md)."""
    if b".nv.shared.reserved." in cubin:
        return max(used.static_shared_bytes - occupancy.limits(arch).reserved_shared, 0)
    return used.static_shared_bytes


def analyze(launch: kernels.Launch, built: dict, sms: int | None = None) -> KernelReport:
    """The report of one launch, from its kernel compiled (kernels.compiled's dict)."""
    meta, cubin = built["metadata"], built["asm"]["cubin"]
    listing = sass.disassemble(cubin)
    file, first = launch.where
    instructions = [_in_file(i, file) for i in sass.parse_disassembly(listing)]
    # the same kernel one and two levels up (a binary from a cache may come without them)
    ptx_code = [_in_file(i, file) for i in ptx.parse(built["asm"].get("ptx") or "")]
    ttgir_ops = [_in_file(i, file) for i in ttgir.parse(built["asm"].get("ttgir") or "")]
    found = sass.resources(cubin)
    if meta["name"] not in found:
        raise RuntimeError(f"cuobjdump reports no function {meta['name']} in its cubin (it has: {', '.join(found)})")
    used = found[meta["name"]]
    shared = meta["shared"] + _own_static_shared(used, cubin, meta["arch"])
    occ = occupancy.occupancy(meta["arch"], meta["num_warps"] * 32, used.registers, shared)
    rows = _line_rows(instructions, file, ptx_code, ttgir_ops)
    report = KernelReport(
        launch.name, _where(file, first), meta["arch"], launch.grid, meta["num_warps"], meta["num_stages"],
        {k: v for k, v in launch.kwargs.items() if k not in OPTIONS}, used, shared, occ, sass.mix(instructions),
        rows, [], built["here"], sms,
        {**{k: v for k, v in built["asm"].items() if isinstance(v, str)}, "sass": listing},
        file, *_kernel_source(launch), ptx=ptx.mix(ptx_code), ttgir=ttgir.mix(ttgir_ops))
    report.findings = findings(report, launch, instructions)
    return report


def _in_file(instruction: sass.Instruction, file: str) -> sass.Instruction:
    """The instruction with the kernel's file where its line table names a file of that name elsewhere: Triton's
    cache keys a kernel by its source, not its path, so a binary compiled from another checkout of the same file
    carries that checkout's path."""
    if instruction.file is None or instruction.file == file or Path(instruction.file).name != Path(file).name:
        return instruction
    return replace(instruction, file=file)


def _line_rows(instructions: list[sass.Instruction], file: str, ptx_code: list[sass.Instruction],
               ttgir_ops: list[sass.Instruction]) -> list[LineRow]:
    """The source lines the kernel's code comes from, most SASS instructions first: its own file's, and the lines
    of what it inlined from other files (Triton's reductions: triton/language/standard.py). A line whose PTX or
    TTGIR ops left no SASS (ptxas dropped or merged them) is there too, with no SASS instruction."""
    machine, ptx_lines, ttgir_lines = sass.by_line(instructions), ptx.by_line(ptx_code), ttgir.by_line(ttgir_ops)
    waits = collections.Counter((i.file, i.line) for i in instructions if i.opcode.startswith(MBARRIER_WAIT))
    texts: dict[str, list[str]] = {}
    out = []
    for path, line in {**machine, **ptx_lines, **ttgir_lines}:
        if path not in texts:
            try:
                texts[path] = Path(path).read_text().splitlines()
            except OSError:
                texts[path] = []
        source = texts[path][line - 1].strip() if 0 < line <= len(texts[path]) else ""
        out.append(LineRow(path, line, source, machine.get((path, line), sass.Mix()),
                           ptx_lines.get((path, line), sass.Mix()), ttgir_lines.get((path, line), sass.Mix()),
                           waits[(path, line)]))
    return sorted(out, key=lambda r: (-r.mix.total, -r.ptx.total, r.file != file, r.line))


def _outer_products(report: KernelReport) -> list[Finding]:
    """A loop that adds an outer product to its accumulator each step (TTGIR: ttgir.outer_product_updates): a
    matmul on the CUDA cores, at the line of the add."""
    text = report.asm.get("ttgir", "")
    updates = ttgir.outer_product_updates(text)
    if not updates:
        return []
    ops = {op.offset: op for op in ttgir.parse(text)}
    out = []
    for number, rows, cols in updates:
        op = ops.get(number)
        if op is not None and op.file and Path(op.file).name == Path(report.file).name:
            op = replace(op, file=report.file)   # the file as this run loaded it (a cached compile names another's)
        out.append(Finding(
            "outer-products", f"a {rows} x {cols} outer product a step: a matmul on the CUDA cores",
            f"The loop adds an outer product of a {rows}-vector and a {cols}-vector to its accumulator each step "
            f"(`acc += a[:, None] * b[None, :]`): over K steps a matmul of {rows} x K by K x {cols}, as one scalar "
            "FMA an element a step. Load a block of 16 or more steps of each ([M, BLOCK_K] and [BLOCK_K, N]) and "
            "call tl.dot(a, b, acc): the tensor cores (HGMMA on sm_90, HMMA before) take it in bf16 or fp16, and "
            "fp32 as TF32.", _where(op.file, op.line) if op is not None and op.file else report.where))
    return out


def _where(file: str, line: int) -> str:
    """file:line as a user finds it: relative to the working folder where it lies inside, else its name."""
    path = Path(file)
    try:
        shown = path.resolve().relative_to(Path.cwd())
    except ValueError:
        shown = path.name
    return f"{shown}:{line}"


def findings(report: KernelReport, launch: kernels.Launch, instructions: list[sass.Instruction]) -> list[Finding]:
    """What the compiled kernel says about itself, each at its line where it has one."""
    out = []
    used, occ, m = report.resources, report.occupancy, report.mix
    spills = [i for i in instructions if sass.kind(i) == "spill"]
    if used.local_bytes or spills:
        # the kernel's own lines first: Triton's library lines (tl.max's, tl.sum's) were inlined into them
        own = Path(launch.where[0]).name
        lines = sorted({(i.file, i.line) for i in spills if i.file}, key=lambda fl: (Path(fl[0]).name != own, fl))
        out.append(Finding(
            "spills", f"{used.local_memory:,} bytes of local memory a thread: registers spill",
            f"The compiler keeps {used.local_memory:,} bytes a thread in local memory (its stack frame and local "
            f"arrays), which lives in DRAM behind the caches: {len(spills)} spill loads and stores (LDL/STL)"
            + (f" at {', '.join(_where(f, n) for f, n in lines[:4])}" if lines else "") + f", at "
            f"{used.registers} registers a thread. Smaller blocks, fewer pipeline stages (num_stages) or more warps "
            "(num_warps) give each thread less to hold.",
            _where(*lines[0]) if lines and Path(lines[0][0]).name == own else report.where))
    if occ.blocks == 0:
        out.append(Finding(
            "cannot-launch", f"a block does not fit an SM of {report.arch}",
            f"A block asks for {report.shared_bytes:,} bytes of shared memory and {used.registers} registers a "
            f"thread for {report.num_warps * 32} threads; an SM of {report.arch} gives a block at most "
            f"{occupancy.limits(report.arch).max_shared_per_block:,} bytes and {occupancy.REGISTERS_PER_SM:,} "
            "registers: the launch would fail. Fewer pipeline stages or smaller blocks ask for less.",
            report.where))
    elif occ.occupancy < LOW_OCCUPANCY and occ.limiter in ("registers", "shared memory"):
        held = (f"{used.registers} registers a thread" if occ.limiter == "registers"
                else f"{report.shared_bytes:,} bytes of shared memory a block")
        out.append(Finding(
            "occupancy", f"occupancy {occ.occupancy:.0%}, limited by {occ.limiter}",
            f"An SM holds {occ.blocks} block{'s' if occ.blocks != 1 else ''} of {report.num_warps} warps at once "
            f"({occ.warps} of its {occupancy.limits(report.arch).max_warps} warps): {held}. A "
            "memory-bound kernel needs many warps in flight to hide DRAM's latency; one that keeps its tensor "
            "cores busy from shared memory can run well like this.", report.where))
    # a tl.dot a constexpr left out compiled to nothing
    compiled_lines = {(x.file, x.line) for x in report.lines if x.mix.total}
    dots = [n for n in _source_lines(launch, r"\.dot\(") if (launch.where[0], n) in compiled_lines]
    if dots and not m.counts.get("tensor core"):
        out.append(Finding(
            "no-tensor-cores", "tl.dot runs on the CUDA cores",
            "The kernel calls tl.dot, but its machine code has no tensor-core instruction (HMMA, HGMMA): the "
            "products run as scalar FMAs. fp32 inputs take the tensor cores as TF32 (tl.dot's input_precision="
            "'tf32', its default unless TRITON_F32_DEFAULT says otherwise), bf16 and fp16 inputs always, where each "
            "dimension of the product is at least 16.", _where(launch.where[0], dots[0])))
    out += _outer_products(report)
    loads = m.load_bits
    if sum(loads.values()) >= 2 and max(loads) < 64:
        why = launch.unaligned()
        out.append(Finding(
            "narrow-loads", f"global loads of {max(loads)} bits a thread",
            f"Every global load moves {max(loads)} bits or fewer a thread ({widths(loads)}), where 128 bits move "
            "four to eight times the bytes an instruction. Triton vectorizes a load where it can prove the "
            "addresses contiguous and 16-byte aligned: from pointers 16-byte aligned and integer arguments (sizes, "
            "strides) divisible by 16."
            + (f" Here: {'; '.join(why)}." if why else " Check the layout's fastest axis is contiguous."),
            report.where))
    if report.sms and report.blocks is not None and report.blocks < report.sms:
        out.append(Finding(
            "small-grid", f"{report.blocks} blocks for {report.sms} SMs",
            f"The grid has {report.blocks} block{'s' if report.blocks != 1 else ''}, fewer than the GPU's "
            f"{report.sms} SMs: {report.sms - report.blocks} SMs have nothing to do. Smaller blocks, or splitting "
            "the work along another axis (split-K, more rows a launch), fill the GPU.", report.where))
    return out


# ncu's counters become findings past roofline's bars (Nsight Compute's own rules flag any excess, and judge stalls
# by cycles between issues): accesses that take a fifth more than they need; one stall reason, at one line, that
# holds a fifth of the kernel's warp samples.
EXCESS_SHARE = 0.2
STALL_SHARE = 0.2
# What a stall reason asks of the kernel; reasons absent here (issuing, ready but not selected, the math pipes
# busy) are a kernel doing its work.
STALL_ADVICE = {
    "long_sb": "its warps wait for global (or local) memory. More bytes in flight hide the latency: a pipelined "
               "loop (num_stages), more elements a program, or more warps an SM; a kernel already at DRAM's "
               "bandwidth waits here by nature (roofline profile gives its bandwidth).",
    "lg": "the queue of global and local memory instructions is full: fewer, wider accesses (128-bit vectors) "
          "issue the same bytes in fewer instructions.",
    "barrier": "its warps wait at a barrier for the block's other warps: reductions and layout conversions across "
               "warps synchronize them; fewer warps a block (num_warps) makes each barrier cheaper.",
    "short_sb": "its warps wait on shared memory or a special function (exp, log, reciprocal): bank conflicts "
                "(the shared-memory counters) or transcendental math on the critical path.",
    "mio": "the shared-memory and special-function queue is full: fewer shared-memory round trips (layout "
           "conversions) or cheaper math (exp2, fast reciprocals).",
    "wait": "its warps wait on fixed-latency dependencies: each instruction needs the one before; more independent "
            "work a thread (several rows or tiles) gives the scheduler something to issue.",
    "no_inst": "the instruction cache misses: the kernel's code is large (deeply unrolled loops, many "
               "constexpr-specialized branches).",
    "membar": "its warps wait at memory fences: atomics with acquire or release semantics (sem='relaxed' where "
              "no ordering is needed).",
}
# What long scoreboard asks at a line that waits on an mbarrier (a TMA copy's, or another partition's signal)
MBARRIER_ADVICE = ("the phase completes when the copy engine's (TMA's) bytes have landed or the other warps have "
                   "arrived. Waiting for data, more stages in flight hide the copy's latency. In a warp-specialized "
                   "kernel a partition that waits for another idles by design (a producer for a free slot, its "
                   "consumers for data): what to change is in the lines of the partition it waits for.")


def mbarrier_lines(report: KernelReport) -> set[tuple[str, int]]:
    """(file name, line) of the kernel's lines that wait on an mbarrier, as ncu's stalls name them."""
    return {(Path(x.file).name, x.line) for x in report.lines if x.mbarrier_waits}


def _at(x, barriers: set) -> bool:
    """Whether ncu's line x (stalls.LineStalls) is one of `barriers` (mbarrier_lines)."""
    return (Path(x.file).name, x.line) in barriers


def stall_findings(report: KernelReport) -> list[Finding]:
    """What ncu's source counters (report.stalls, --ncu) say of the kernel, each at its line: the line and stall
    reason that hold the most warp samples, where that reason asks something of the kernel; global accesses that
    move more L2 sectors than coalesced ones would; shared-memory accesses whose bank conflicts take more
    wavefronts than conflict-free ones. The access counters are exact counts: they speak however few the samples."""
    found = report.stalls
    if found is None or not found.lines:
        return []
    out = []
    barriers = mbarrier_lines(report)
    waits = [(n, reason, x) for x in found.lines for reason, n in x.reasons.items() if reason in STALL_ADVICE]
    if waits and found.samples:
        n, reason, top = max(waits, key=lambda w: w[0])
        at_mbarrier = reason == "long_sb" and _at(top, barriers)
        said = reason_text(reason, at_mbarrier)
        if n >= STALL_SHARE * found.samples:
            out.append(Finding(
                "stall", f"{n / found.samples:.0%} of the warp samples wait at one line: {said}",
                f"ncu sampled the kernel's warps {found.samples:,} times; {n:,} of them sat at `{top.source.strip()}` "
                f"{said}: {MBARRIER_ADVICE if at_mbarrier else STALL_ADVICE[reason]}",
                _where(report.file, top.line)))
    for kind, excess, total in (("global", "excess_sectors", "sectors"), ("shared", "shared_excess",
                                                                          "shared_wavefronts")):
        moved = sum(getattr(x, total) for x in found.lines)
        extra = sum(getattr(x, excess) for x in found.lines)
        if not moved or extra < EXCESS_SHARE * (moved - extra):
            continue
        worst = sorted((x for x in found.lines if getattr(x, excess)), key=lambda x: -getattr(x, excess))[:3]
        lines = "; ".join(f"line {x.line} `{x.source.strip()}`: {getattr(x, total):,} where "
                          f"{getattr(x, total) - getattr(x, excess):,} would do" for x in worst)
        if kind == "global":
            out.append(Finding(
                "uncoalesced", f"global accesses move {moved / (moved - extra):.1f}x the L2 sectors they need",
                f"{extra:,} of the kernel's {moved:,} L2 sectors of global memory are beyond what coalesced accesses "
                f"would move ({lines}). A warp's access is coalesced where its threads' addresses are contiguous: "
                "each instruction then touches the fewest 32-byte sectors. Where a thread holds several elements "
                "but loads them one at a time (the loads are not vectorized), each instruction strides across "
                "them: vectorized 128-bit accesses need sizes and strides divisible by 16 and 16-byte aligned "
                "pointers.", _where(report.file, worst[0].line)))
        else:
            out.append(Finding(
                "bank-conflicts", f"shared-memory accesses take {moved / (moved - extra):.1f}x the wavefronts "
                "they need", f"{extra:,} of the kernel's {moved:,} shared-memory wavefronts are bank conflicts "
                f"({lines}): threads of a warp reach different addresses in one of the 32 banks, and the access "
                "is split. In Triton these are the layout conversions and reductions the compiler routes through "
                "shared memory (convert_layout in the TTGIR at that line): block shapes whose layouts agree avoid "
                "the conversion; in Gluon, a swizzled or padded shared layout avoids the conflicts.",
                _where(report.file, worst[0].line)))
    return out


def widths(bits) -> str:
    """Accesses by width: "24 x 128-bit, 2 x 32-bit" (instructions, widest first)."""
    return ", ".join(f"{n} x {b}-bit" for b, n in sorted(bits.items(), reverse=True))


def _kernel_source(launch: kernels.Launch) -> tuple[list[str], int]:
    """The kernel function's lines and the line of its file they start at (none where Python cannot find them).
    A kernel whose function stayed in Inductor's compile workers is read from its module, from its def on."""
    if launch.source is not None:
        file, first = launch.source
        try:
            text = Path(file).read_text().splitlines()[first - 1:]
        except OSError:
            return [], first
        body = [text[0]] + list(itertools.takewhile(lambda line: not line.strip() or line[:1].isspace(), text[1:]))
        while body and not body[-1].strip():
            body.pop()
        return body, first
    try:
        lines, first = _inspect.getsourcelines(getattr(launch.kernel, "fn", None))   # (None: TypeError)
    except (OSError, TypeError):
        return [], launch.where[1]
    return [line.rstrip("\n") for line in lines], first


def _source_lines(launch: kernels.Launch, pattern: str) -> list[int]:
    """The lines of the kernel's source that match `pattern` (numbered as in its file)."""
    lines, first = _kernel_source(launch)
    return [first + k for k, text in enumerate(lines) if re.search(pattern, text.split("#")[0])]


def render(found: Inspection, console, top: int = 8) -> None:
    """The Triton kernels the function launched, then those torch.compile generated for it."""
    if not found.launched and not found.made:
        console.print("[yellow]The function launched no Triton kernel, and torch.compile generated none for it."
                      "[/yellow]")
        return
    render_reports(found.launched, console, top)
    if found.made:
        _render_generated(found.made, console, top)
        render_reports([k.report for k in found.made if k.report is not None], console, top)


def _render_generated(made: list, console, top: int) -> None:
    """torch.compile's kernels in the order they run, each with its time and the user's lines it fused; then the
    heaviest kernels' lines with their code."""
    import torch

    graphs = len({k.graph for k in made})
    total = sum(k.ms or 0.0 for k in made)
    console.print(f"\n[bold]{len(made)} kernel{'s' if len(made) != 1 else ''} torch.compile generated[/bold] in "
                  f"{graphs} graph{'s' if graphs != 1 else ''} (a backward is a graph of its own; aten:: is a "
                  f"library call), {'GPU' if torch.cuda.is_available() else 'CPU'} time a run:", highlight=False)
    rows = [Row([str(k.graph), k.label, count_text(k.calls), "-" if k.ms is None else us_text(k.ms),
                 f"{k.ms / total:.0%}" if k.ms is not None and total else "-", generated.compact(k.lines)]) for k in made]
    show(console, None, [Column("graph", "g"), Column("kernel", justify="left", fold=True), Column("calls"),
                         Column("us"), Column("share", "%"), Column("your lines", "lines", justify="left",
                                                                    fold=True)], rows)
    for k in sorted((k for k in made if k.ms), key=lambda k: -k.ms)[:top]:
        console.print(f"\n[bold]{k.label}[/bold] (graph {k.graph}): {us_text(k.ms)} us a run, {k.ms / total:.0%}",
                      highlight=False)
        for x in k.lines:
            console.print(f"  {x}  {x.code}", highlight=False)


def us_text(ms: float) -> str:
    us = ms * 1e3
    return f"{us:,.0f}" if us >= 100 else f"{us:.3g}"


def count_text(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}"


def render_reports(reports: list, console, top: int) -> None:
    """Kernels' reports side by side, then each one's hottest lines and findings."""
    failed = [r for r in reports if isinstance(r, Uncompiled)]
    reports = [r for r in reports if not isinstance(r, Uncompiled)]
    for r in failed:
        console.print(f"[yellow]{r.name}[/yellow] ({r.where}) could not be compiled for the GPU asked for: {r.error}",
                      highlight=False)
    if not reports:
        return
    arch = reports[0].arch
    here = any(r.compiled_here for r in reports)
    console.print(f"[bold]{len(reports)} kernel{'s' if len(reports) != 1 else ''}[/bold], compiled for {arch}"
                  + (" here, each with the configuration its launch ran (under Triton's interpreter, or on "
                     "another GPU): on the GPU an autotuner may pick another" if here else ""),
                  highlight=False)
    rows = []
    for r in reports:
        occ = r.occupancy
        tc = r.mix.counts.get("tensor core", 0)
        grid = "?" if r.grid is None else "x".join(str(g) for g in r.grid if g > 1) or "1"
        rows.append(Row([r.name, grid, str(r.num_warps),
                         str(r.resources.registers), f"{r.resources.local_memory:,}", f"{r.shared_bytes / 1024:,.1f}",
                         f"{occ.occupancy:.0%} {occ.limiter}", str(tc), widths(r.mix.load_bits) or "-"]))
    show(console, None, [Column("kernel", justify="left", fold=True), Column("grid"), Column("warps"),
                         Column("registers", "regs"), Column("local B", "local"), Column("shared KiB", "smem"),
                         Column("occupancy (limit)", "occ", justify="left"), Column("tensor-core instr.", "tc"),
                         Column("global loads", "loads", justify="left", fold=True)], rows)
    for r in reports:
        console.print(f"\n[bold]{r.name}[/bold] {r.where}  "
                      + " ".join(f"{k}={v}" for k, v in r.constexprs.items()), highlight=False)
        spills = bool(r.mix.counts.get("spill"))   # a column only where the kernel spills
        lines = [Row([f"{Path(x.file).name}:{x.line}", _source_cell(x), str(x.mix.total),
                      str(x.mix.counts.get("tensor core", 0)), widths(x.mix.load_bits),
                      *([str(x.mix.counts.get("spill", 0) or "")] if spills else []), str(x.ptx.total)])
                 for x in r.lines[:top]]
        show(console, f"lines by instructions ({r.mix.total} SASS, {r.ptx.total} PTX; {r.ttgir.total} TTGIR ops)",
             [Column("line", justify="left"),
              Column("source (and its TTGIR ops of note)", "source", justify="left", fold=True),
              Column("SASS instr.", "instr."), Column("tensor core", "tc"),
              Column("global loads", "loads", justify="left", fold=True),
              *([Column("spills")] if spills else []), Column("PTX instr.", "ptx")], lines)
        if r.stalls is not None:
            _render_stalls(r.stalls, console, top, mbarrier_lines(r))
        for f in r.findings:
            console.print(f"[bold yellow]{f.title}[/bold yellow] ({f.where}): {f.message}", highlight=False)


def _source_cell(x: LineRow) -> str:
    """A line's source, and under it, dimmed, the TTGIR ops of note it became: in the source's own column, which
    folds, since a column of their own would not fit 80 columns beside the SASS and PTX counts."""
    ops = ttgir.notable(x.ttgir)
    return escape(x.source) + (f"\n[dim]ttgir: {ops}[/dim]" if ops else "")


def _render_stalls(found, console, top: int, barriers: set = frozenset()) -> None:
    """Where the kernel's warps waited (ncu's samples), its lines by samples, and why. barriers: (file name,
    line) of the lines that wait on an mbarrier."""
    total = found.samples
    if not total:
        console.print("ncu sampled no warp of it at its own lines (a kernel this short gives few samples: run it "
                      "at the sizes you train at)", highlight=False)
        return
    totals: collections.Counter = collections.Counter()   # by reason, an mbarrier's waits apart from memory's
    for x in found.lines:
        for reason, n in x.reasons.items():
            totals[reason_text(reason, _at(x, barriers))] += n
    why = ", ".join(f"{text} {n / total:.0%}" for text, n in totals.most_common(3))
    rows = [Row([f"{Path(x.file).name}:{x.line}", x.source, f"{x.samples / total:.0%}",
                 reason_text(x.top_reason, _at(x, barriers)),
                 f"{x.excess_sectors:,}" if x.excess_sectors else ""])
            for x in sorted(found.lines, key=lambda x: -x.samples)[:top] if x.samples]
    show(console, f"where its warps waited (ncu, {total:,} samples): {why}",
         [Column("line", justify="left"), Column("source", justify="left", fold=True), Column("samples", "smpl"),
          Column("most often", "why", justify="left", fold=True),
          Column("excess L2 sectors", "excess")], rows)


def write_sections(found: Inspection, folder: Path) -> list[Path]:
    """Each kernel's TTGIR, PTX and SASS (with its source lines) as files in `folder`: NAME.ttgir, NAME.ptx,
    NAME.sass (a kernel launched in several configurations: NAME-2.ptx, ...); each kernel torch.compile generated
    as its source too, NAME.py (Triton) or NAME.cpp (two graphs may each have a kernel of a name: NAME-2.cpp)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    code_stems, asm_stems = _Stems(), _Stems()
    for k in found.made:
        if k.code is not None:
            written.append(folder / f"{code_stems(k.name)}.{'py' if k.kind == 'triton' else k.kind}")
            written[-1].write_text(k.code + "\n")
    reports = found.launched + [k.report for k in found.made if k.report is not None]
    for r in (r for r in reports if isinstance(r, KernelReport)):
        stem = asm_stems(r.name)
        for section in ("ttir", "ttgir", "llir", "ptx", "sass"):
            if section in r.asm:
                written.append(folder / f"{stem}.{section}")
                written[-1].write_text(r.asm[section])
    return written


class _Stems:
    """File stems for names that may repeat: NAME, NAME-2, NAME-3, ..."""
    def __init__(self):
        self.seen: dict[str, int] = {}

    def __call__(self, name: str) -> str:
        self.seen[name] = self.seen.get(name, 0) + 1
        return name if self.seen[name] == 1 else f"{name}-{self.seen[name]}"
