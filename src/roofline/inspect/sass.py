"""A kernel's machine code (SASS) and resources, read from its cubin with NVIDIA's own tools.

Triton ships cuobjdump and nvdisasm beside its ptxas (triton/backends/nvidia/bin), so this works wherever Triton
does, a machine without a GPU included; a CUDA toolkit's on PATH serves otherwise.
- `cuobjdump --dump-resource-usage`: registers a thread, local memory a thread (spills live there), static shared
  memory and stack, as the driver will allocate them.
- `nvdisasm -c -g`: the instructions, each under the source line the compiler's line table gives it
  (`//## File "...", line N`); Triton writes the kernel's Python lines into that table.

The instruction mix sorts opcodes into what a performance engineer looks for: tensor-core MMAs (HMMA on sm_80,
HGMMA, the warpgroup MMA, on sm_90), global loads and stores by width (a 128-bit LDG.E.128 moves four times a
32-bit LDG.E's bytes per instruction), asynchronous copies into shared memory (LDGSTS: cp.async) and the Tensor
Memory Accelerator's (UTMALDG, UBLKCP), shared-memory traffic, barriers and fences, and spills (local memory:
LDL/STL). ptx.py sorts PTX into the same classes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

TOOLS = ("cuobjdump", "nvdisasm")


def tool(name: str) -> str:
    """The path of cuobjdump or nvdisasm: Triton's own, else the one on PATH."""
    try:
        import triton

        bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:
        pass
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} was not found: it comes with Triton's NVIDIA backend (pip install triton) or "
                           "with the CUDA toolkit")
    return found


def _run_on(cubin: bytes, *argv: str) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        done = subprocess.run([*argv, f.name], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed on the cubin: {done.stderr.strip()[:500]}")
    return done.stdout


@dataclass(frozen=True)
class Resources:
    """What a thread and a block of the kernel take, as the driver allocates them."""
    registers: int          # a thread's
    local_bytes: int        # a thread's local arrays the compiler could not keep in registers
    stack_bytes: int        # a thread's stack frame, where ptxas puts spilled registers (sm_90: all of them)
    static_shared_bytes: int

    @property
    def local_memory(self) -> int:
        """A thread's bytes in local memory (DRAM behind the caches): its stack frame and its local arrays."""
        return self.stack_bytes + self.local_bytes


_RESOURCE = re.compile(r"Function\s+(\S+):\s*\n\s*REG:(\d+)\s+STACK:(\d+)\s+SHARED:(\d+)\s+LOCAL:(\d+)")


def parse_resources(text: str) -> dict[str, Resources]:
    """cuobjdump --dump-resource-usage's report, by function."""
    return {m[1]: Resources(int(m[2]), int(m[5]), int(m[3]), int(m[4])) for m in _RESOURCE.finditer(text)}


def resources(cubin: bytes) -> dict[str, Resources]:
    return parse_resources(_run_on(cubin, tool("cuobjdump"), "--dump-resource-usage"))


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction; ptx.py and ttgir.py read PTX instructions and TTGIR ops into the same shape."""
    offset: int             # its address (PTX, TTGIR: its line in the text)
    opcode: str             # with its modifiers: "LDG.E.128", "HGMMA.64x128x16.F32.BF16"
    text: str               # the whole instruction, predicate and operands included
    file: str | None        # the source line the line table gives it
    line: int | None

    @property
    def base(self) -> str:
        """The opcode without modifiers: "LDG", "HGMMA"."""
        return self.opcode.split(".", 1)[0]


_FILE_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P[0-9T]\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)[^;]*);")


_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_BRANCH = re.compile(r"\bBRA\b.*?(\.L_x_\d+)")


def _read(text: str) -> tuple[list[Instruction], dict[str, int]]:
    """nvdisasm -c -g's listing read once: its instructions, each with the source line above it (a line holds
    until the next), and the index of the instruction each branch label marks."""
    out, labels, file, line = [], {}, None, None
    for raw in text.splitlines():
        marked = _FILE_LINE.search(raw)
        if marked:
            file, line = marked[1], int(marked[2])
            continue
        label = _LABEL.match(raw)
        if label:
            labels[label[1]] = len(out)
            continue
        found = _INSTRUCTION.search(raw)
        if found:
            out.append(Instruction(int(found[1], 16), found[3], " ".join(found[2].split()), file, line))
    return out, labels


def parse_disassembly(text: str) -> list[Instruction]:
    """nvdisasm -c -g's listing: each instruction with the source line above it."""
    return _read(text)[0]


def loops(listing: str) -> list[list[Instruction]]:
    """The loop bodies of an nvdisasm listing (from a label to a branch back to it), the shortest first. A body
    with an if/else holds both arms; an outer loop holds its inner loops."""
    instructions, labels = _read(listing)
    bodies = []
    for end, ins in enumerate(instructions):
        target = _BRANCH.search(ins.text)
        if target and labels.get(target[1], end + 1) < end:
            bodies.append(instructions[labels[target[1]]:end + 1])
    return sorted(bodies, key=len)


def disassemble(cubin: bytes) -> str:
    """The cubin's SASS listing, each instruction under its source line (parse_disassembly reads it)."""
    return _run_on(cubin, tool("nvdisasm"), "-c", "-g")


# What each class of instruction is, by opcode (the first match wins)
_CLASSES = (
    ("tensor core", re.compile(r"^(HGMMA|HMMA|IMMA|QGMMA|IGMMA|BGMMA|DMMA|UTCHMMA|UTCQMMA|UTCIMMA)\b")),
    ("spill", re.compile(r"^(LDL|STL)\b")),
    ("TMA", re.compile(r"^(UTMALDG|UTMASTG|UTMAREDG|UTMAPF|UBLKCP|UBLKRED)\b")),
    ("async copy", re.compile(r"^LDGSTS\b")),
    ("global load", re.compile(r"^(LDG|LD)\b")),
    ("global store", re.compile(r"^(STG|ST|RED|ATOMG|ATOM)\b")),
    ("shared", re.compile(r"^(LDS|STS|LDSM|STSM|ATOMS)\b")),
    ("barrier", re.compile(r"^(BAR|SYNCS|WARPSYNC|MEMBAR|FENCE|DEPBAR|WARPGROUP|ARRIVES)\b")),
    ("special function", re.compile(r"^MUFU\b")),
    ("shuffle", re.compile(r"^SHFL\b")),
    ("float", re.compile(r"^(FFMA|FADD|FMUL|FMNMX|FSETP|FSEL|HFMA2|HADD2|HMUL2|HMNMX2|F2F|F2FP|F2I|I2F|FCHK|DFMA|DADD|"
                         r"DMUL|FRND)\b")),
)


def kind(instruction: Instruction) -> str:
    """The class of one instruction (see _CLASSES); "other" for integer math, moves and branches."""
    for name, pattern in _CLASSES:
        if pattern.match(instruction.opcode):
            return name
    return "other"


def access_bits(opcode: str) -> int:
    """The width of one thread's global or shared access, in bits: LDG.E.128 -> 128, LDG.E.U16 -> 16; 32 where
    the opcode names no width (LDG.E)."""
    for part in opcode.split(".")[1:]:
        digits = re.fullmatch(r"[US]?(8|16|32|64|128)", part)
        if digits:
            return int(digits[1])
    return 32


@dataclass
class Mix:
    """The instruction mix of one kernel: counts by class, and the global accesses by width (static counts: an
    instruction in a loop counts once). PTX's mix (ptx.py) has the same classes, TTGIR's (ttgir.py) counts ops by
    name and no widths."""
    counts: Counter = field(default_factory=Counter)
    load_bits: Counter = field(default_factory=Counter)    # global loads (LDG, LDGSTS) by width
    store_bits: Counter = field(default_factory=Counter)   # global stores by width
    total: int = 0

    def to_dict(self) -> dict:
        return {"total": self.total, "counts": dict(self.counts),
                "load_bits": {str(k): v for k, v in sorted(self.load_bits.items())},
                "store_bits": {str(k): v for k, v in sorted(self.store_bits.items())}}


def global_access(instruction: Instruction, name: str) -> tuple[str, int] | None:
    """("load" or "store", bits a thread) for an instruction of class `name` whose width the mix counts: global
    loads and cp.async's copies, global stores (atomics and reductions are not counted by width); None for the
    rest."""
    if name in ("global load", "async copy"):
        return "load", access_bits(instruction.opcode)
    if name == "global store" and instruction.base in ("STG", "ST"):
        return "store", access_bits(instruction.opcode)
    return None


def mix(instructions: list[Instruction], kind_of=kind, access_of=global_access) -> Mix:
    """The mix of instructions, each classed by kind_of and its global access's width read by access_of: SASS's
    by default; ptx.py passes PTX's, ttgir.py an op's name."""
    out = Mix(total=len(instructions))
    for ins in instructions:
        name = kind_of(ins)
        out.counts[name] += 1
        access = access_of(ins, name)
        if access is not None:
            (out.load_bits if access[0] == "load" else out.store_bits)[access[1]] += 1
    return out


def by_line(instructions: list[Instruction], summarize=mix) -> dict[tuple[str, int], Mix]:
    """The mix of each source line's instructions (summarize: SASS's mix by default); instructions without a line
    count in no line's."""
    grouped: dict[tuple[str, int], list[Instruction]] = {}
    for ins in instructions:
        if ins.file is not None and ins.line is not None:
            grouped.setdefault((ins.file, ins.line), []).append(ins)
    return {where: summarize(group) for where, group in grouped.items()}
