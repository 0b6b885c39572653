"""A kernel's PTX, each instruction at the source line its `.loc` directive gives, sorted into sass.py's classes.

LLVM writes the line table into the PTX as directives: `.file N "path"` names a file (Triton's PTX puts them
after the function, so files are resolved once the whole text is read), and `.loc N LINE COL` holds for the
instructions after it until the next. For code inlined from another file (Triton's reductions:
triton/language/standard.py) `.loc` gives the innermost line, as nvdisasm's line table does for the SASS, so the
two counts of a line agree on what they count.

The classes are the SASS mix's (sass.Mix), so that the two levels read alike: a `wgmma.mma_async` and the HGMMA
ptxas makes of it are both "tensor core", `cp.async.bulk.tensor` and UTMALDG both "TMA". Two differ by nature:
PTX has no register spills (ptxas makes those), so its "spill" class holds the local arrays LLVM could not keep
in registers (`ld.local`/`st.local`), which spill to the same memory; and PTX's counts are before ptxas unrolls,
schedules and drops code, so a line's two totals differ while its classes tell the same story.

    instructions = ptx.parse(kernel.asm["ptx"])
    ptx.mix(instructions).counts["tensor core"]; ptx.by_line(instructions)[(file, line)]
"""

from __future__ import annotations

import re

from roofline.inspect import sass

_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"(?:\s+"([^"]*)")?')   # (index, path) or (index, dir, name)
_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
_FUNCTION = re.compile(r"\.(entry|func)\b")
_LABEL = re.compile(r"^[\w$.]+:(?=\s|$)\s*")   # "waitLoop:", not "ld.shared::cta"
_STATEMENT = re.compile(r"^(@!?%?\w+\s+)?([a-z][a-z0-9_]*(?:\.[A-Za-z0-9_:]+)*)")


def parse(text: str) -> list[sass.Instruction]:
    """The PTX's instructions, each with the source line its `.loc` gives (file and line None where no `.loc`
    holds, where one names line 0, a file no `.file` names, or cannot be read). An Instruction's offset is its
    line in the PTX text, counted from 1."""
    files: dict[int, str] = {}
    found: list[tuple[int, str, str, int | None, int | None]] = []   # (PTX line, opcode, text, file index, line)
    where: tuple[int, int] | None = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("//", 1)[0].strip()
        if line.startswith("."):
            where = _directive(line, files, where)
            continue
        for statement in _statements(line):
            matched = _STATEMENT.match(statement)
            if matched:
                found.append((number, matched[2], statement, *(where or (None, None))))
    return [sass.Instruction(number, opcode, text, files.get(index), line if index in files else None)
            for number, opcode, text, index, line in found]


def _directive(line: str, files: dict[int, str], where: tuple[int, int] | None) -> tuple[int, int] | None:
    """Read a `.file` or `.loc` directive; the location that holds after `line`. A `.loc` that cannot be read, one
    at line 0 (LLVM's "no line"), and a new function's start leave the instructions after it without a line."""
    named = _FILE.match(line)
    if named:
        files[int(named[1])] = f"{named[2].rstrip('/')}/{named[3]}" if named[3] else named[2]
        return where
    if re.match(r"\.loc\b", line):   # (not .local, a local array's declaration)
        loc = _LOC.match(line)
        return (int(loc[1]), int(loc[2])) if loc and int(loc[2]) > 0 else None
    if _FUNCTION.search(line):
        return None
    return where


def _statements(line: str) -> list[str]:
    """The instructions of one line of PTX (comments removed): a line may hold several (`;` ends each), sit in an
    inline-asm block's braces, or follow a label; directives inside a block (`.reg`) are none."""
    out = []
    for part in line.split(";"):
        part = _unbraced(part)
        while _LABEL.match(part):
            part = _unbraced(_LABEL.sub("", part, count=1))
        if part and not part.startswith((".", "$", ")", "(")):
            out.append(" ".join(part.split()))
    return out


def _unbraced(part: str) -> str:
    """A statement without the brace that opens or closes an inline-asm block around it; a vector operand's braces
    ({%r1, %r2}) stay."""
    part = part.strip()
    while part.startswith("{") and part.count("{") > part.count("}"):
        part = part[1:].strip()
    while part.endswith("}") and part.count("}") > part.count("{"):
        part = part[:-1].strip()
    return part


# What each class of instruction is, by opcode (the first match wins); memory accesses are classed by their state
# space below. Waits and commits of asynchronous copies and MMAs are barriers, as their SASS is (DEPBAR, WARPGROUP).
_CLASSES = (
    ("tensor core", re.compile(r"^(mma\.|wgmma\.mma_async|wmma\.mma|tcgen05\.mma)")),
    ("barrier", re.compile(r"^(bar\.|barrier\.|membar\.|fence\.|mbarrier\.|wgmma\.(fence|commit_group|wait_group)|"
                           r"cp\.async\.(commit_group|wait_group|wait_all|mbarrier)|"
                           r"cp\.async\.bulk\.(commit_group|wait_group))")),
    ("TMA", re.compile(r"^(cp\.async\.bulk|cp\.reduce\.async\.bulk)")),
    ("async copy", re.compile(r"^cp\.async\.(ca|cg)\b")),
    ("special function", re.compile(r"^(ex2|lg2|rcp|rsqrt|sqrt|sin|cos|tanh)\.approx\b")),
    ("shuffle", re.compile(r"^shfl\.")),
)
_MEMORY = ("ld", "ldu", "st", "red", "atom")
_SPACES = ("global", "shared", "local", "param", "const", "tex")
_FLOAT_OPS = ("add", "sub", "mul", "fma", "mad", "min", "max", "neg", "abs", "div", "rcp", "sqrt", "setp", "selp",
              "cvt", "testp", "copysign")
_FLOAT_TYPE = re.compile(r"^b?f(16|32|64)(x2)?$")


def _space(opcode: str) -> str | None:
    """The state space an ld/st/atom names ("global", "shared" for shared::cta and shared::cluster, ...); None
    for generic addressing."""
    for part in opcode.split(".")[1:]:
        if part.split("::")[0] in _SPACES:
            return part.split("::")[0]
    return None


def kind(instruction: sass.Instruction) -> str:
    """The class of one PTX instruction, named as sass.kind names SASS's; "other" for integer math, moves,
    parameter loads and branches."""
    for name, pattern in _CLASSES:
        if pattern.match(instruction.opcode):
            return name
    base, space = instruction.base, _space(instruction.opcode)
    if base in ("ldmatrix", "stmatrix"):
        return "shared"
    if base in _MEMORY:
        if space == "local":
            return "spill"
        if space == "shared":
            return "shared"
        if space in ("global", None):   # generic addresses are global memory's in Triton's code, as SASS's LD/ST
            return "global load" if base in ("ld", "ldu") else "global store"
        return "other"                  # kernel parameters, constants
    if base in _FLOAT_OPS and any(_FLOAT_TYPE.match(p) for p in instruction.opcode.split(".")[1:]):
        return "float"
    return "other"


def access_bits(instruction: sass.Instruction) -> int:
    """The bits one thread moves: a vector's elements times their width (ld.global.v4.b32: 128), a cp.async's
    size operand in bytes (16: 128)."""
    if instruction.opcode.startswith("cp.async."):
        after = instruction.text[instruction.text.index(instruction.opcode) + len(instruction.opcode):]
        operands = [x.strip() for x in after.split(",")]
        try:
            return 8 * int(operands[2], 0)
        except (IndexError, ValueError):
            return 32
    parts = instruction.opcode.split(".")
    lanes = next((int(p[1:]) for p in parts if re.fullmatch(r"v[248]", p)), 1)
    width = next((int(m[1]) for m in map(re.compile(r"^[bsuf](8|16|32|64|128)$").match, parts) if m), 32)
    return lanes * width


def global_access(instruction: sass.Instruction, name: str) -> tuple[str, int] | None:
    """As sass.global_access, for PTX: global loads and cp.async's copies, global stores (not atomics)."""
    if name in ("global load", "async copy"):
        return "load", access_bits(instruction)
    if name == "global store" and instruction.base == "st":
        return "store", access_bits(instruction)
    return None


def mix(instructions: list[sass.Instruction]) -> sass.Mix:
    return sass.mix(instructions, kind, global_access)


def by_line(instructions: list[sass.Instruction]) -> dict[tuple[str, int], sass.Mix]:
    return sass.by_line(instructions, mix)
