"""A kernel's TTGIR (Triton's GPU dialect, after layouts are chosen), each op at the source line its location gives.

TTGIR is where a Triton program's costs first show by name: `ttng.warp_group_dot` (Hopper's wgmma) or `tt.dot`,
each `ttg.convert_layout` (a tensor moved between layouts, mostly through shared memory), `ttg.local_alloc`,
`local_load` and `local_store` (shared memory), `tt.load`/`tt.store` and the copies the pipeliner or a tensor
descriptor made (`ttg.async_copy_global_to_local`: cp.async; `ttng.async_tma_copy_*`: TMA).

MLIR prints an op's location after it: `loc(#loc12)`, an alias defined before or after the module
(`#loc12 = loc("kernel.py":40:21)`), or written in place. Triton 3.6 wraps them: a name (`loc("acc"(#loc24))`:
the variable assigned), a call site (`loc(callsite(#loc10 at #loc34))`: code inlined from a function, here
triton/language/standard.py's reductions), a fusion (`loc(fused[#loc3, #loc7])`: ops merged). A call site gives
its innermost known line, as the PTX's `.loc` and the SASS's line table do; a fusion its first; `loc(unknown)`
(constants Triton made up) no line. An op that holds a region (scf.for, scf.if, tt.reduce) prints its location
after the region's closing brace; the module and the kernel's function are not counted.

    ops = ttgir.parse(kernel.asm["ttgir"])
    ttgir.mix(ops).counts["ttng.warp_group_dot"]; ttgir.by_line(ops)[(file, line)]
"""

from __future__ import annotations

import re

from roofline.inspect import sass

_ALIAS = re.compile(r"^\s*(#loc[\w.$-]*)\s*=\s*loc\((.*)\)\s*$")
_OP = re.compile(r'^(?:%[^=]*=\s*)?"?([A-Za-z_][\w$]*\.[\w.$]+)"?')
_FILE_LINE = re.compile(r'^"((?:[^"\\]|\\.)*)":(\d+)(?::\d+)?')
_NAMED = re.compile(r'^"(?:[^"\\]|\\.)*"\s*\(')
_CONTAINERS = ("module", "builtin.module", "tt.func")   # hold the kernel's ops; no work of their own


def parse(text: str) -> list[sass.Instruction]:
    """The TTGIR's ops in the order they appear, each with the source line its location gives (file and line
    None where it has none). An op is an sass.Instruction whose opcode is its name ("ttg.convert_layout") and
    whose offset is its line in the TTGIR text, counted from 1."""
    lines = text.splitlines()
    aliases = {m[1]: m[2] for m in map(_ALIAS.match, lines) if m}
    resolved: dict[str, tuple[str, int] | None] = {}
    ops: list[sass.Instruction] = []
    open_ops: list[tuple[int, str, str] | None] = []   # ops whose region is open: their location comes at its end
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith(("#", "//", "^")):   # aliases, comments, a block's label
            continue
        if line.startswith("}"):
            if line.endswith("{") or not open_ops:   # "} else {": the same op's next region
                continue
            opened = open_ops.pop()
            if opened is not None:
                ops.append(_op(*opened, _trailing_loc(line), aliases, resolved))
            continue
        name = _OP.match(line)
        loc = _trailing_loc(line)
        if line.endswith("{") and loc is None:
            open_ops.append((number, name[1], line) if name and name[1] not in _CONTAINERS else None)
        elif name and name[1] not in _CONTAINERS:
            ops.append(_op(number, name[1], line, loc, aliases, resolved))
    return sorted(ops, key=lambda op: op.offset)


def _op(number: int, name: str, text: str, loc: str | None, aliases: dict, resolved: dict) -> sass.Instruction:
    file, line = location(loc, aliases, resolved) or (None, None)
    return sass.Instruction(number, name, text, file, line)


def _trailing_loc(line: str) -> str | None:
    """What the `loc(...)` that ends `line` holds (an op's own location, not its operands' or block arguments'
    locations earlier in the line); None where the line ends otherwise."""
    line = line.rstrip()
    for m in reversed(list(re.finditer(r"\bloc\(", line))):
        end = _closing(line, m.end() - 1)
        if end == len(line) - 1:
            return line[m.end():end]
    return None


def _outside_quotes(text: str, start: int = 0):
    """Each character of `text` from `start` that stands outside quoted strings (file paths), with the depth of
    brackets after it: (index, character, depth)."""
    depth, quoted, k = 0, False, start
    while k < len(text):
        c = text[k]
        if quoted:
            if c == "\\":
                k += 1
            elif c == '"':
                quoted = False
        elif c == '"':
            quoted = True
        else:
            depth += (c in "([<") - (c in ")]>")
            yield k, c, depth
        k += 1


def _closing(text: str, start: int) -> int | None:
    """The index of the bracket that closes the one at `start`."""
    return next((k for k, c, depth in _outside_quotes(text, start) if depth == 0 and c in ")]>"), None)


def _split(text: str, separator: str) -> list[str]:
    """`text` split at `separator` where it stands outside brackets and quotes."""
    parts, begin = [], 0
    for k, c, depth in _outside_quotes(text):
        if k >= begin and depth == 0 and c not in ")]>" and text.startswith(separator, k):
            parts.append(text[begin:k])
            begin = k + len(separator)
    return [*parts, text[begin:]]


def location(text: str | None, aliases: dict[str, str], resolved: dict | None = None,
             seen: frozenset = frozenset()) -> tuple[str, int] | None:
    """(file, line) of a location as MLIR prints it inside `loc(...)`; None for none (unknown, a bare name, line
    0, an alias never defined or defined in a circle, anything unreadable). resolved: aliases already read."""
    if text is None:
        return None
    text = text.strip()
    resolved = {} if resolved is None else resolved
    if text.startswith("#"):
        if text not in resolved:
            resolved[text] = None if text in seen else location(aliases.get(text), aliases, resolved, seen | {text})
        return resolved[text]
    at = _FILE_LINE.match(text)
    if at:
        return (at[1], int(at[2])) if int(at[2]) > 0 else None
    if text.startswith("callsite(") and text.endswith(")"):
        parts = _split(text[len("callsite("):-1], " at ")   # (callee, caller): the innermost line first
        return next((w for w in (location(p, aliases, resolved, seen) for p in parts) if w), None)
    if text.startswith("fused"):
        body = text[text.find("[") + 1:text.rfind("]")] if "[" in text else ""
        return next((w for w in (location(p, aliases, resolved, seen) for p in _split(body, ",")) if w), None)
    named = _NAMED.match(text)
    if named and text.endswith(")"):   # "acc"(#loc24): a name over the location that counts
        return location(text[named.end():-1], aliases, resolved, seen)
    return None


# The ops a performance engineer looks for, as the per-line view names them (in this order)
NOTABLE = {
    "tt.dot": "dot", "ttng.warp_group_dot": "warp_group_dot", "ttng.tc_gen5_mma": "tc_gen5_mma",
    "tt.dot_scaled": "dot_scaled", "ttg.convert_layout": "convert_layout", "ttg.local_alloc": "local_alloc",
    "ttg.local_load": "local_load", "ttg.local_store": "local_store", "tt.load": "load", "tt.store": "store",
    "tt.descriptor_load": "descriptor_load", "tt.descriptor_store": "descriptor_store",
    "ttg.async_copy_global_to_local": "cp_async", "ttng.async_tma_copy_global_to_local": "tma_load",
    "ttng.async_tma_copy_local_to_global": "tma_store", "ttng.async_tma_reduce": "tma_reduce",
    "ttng.async_tma_gather": "tma_gather", "ttng.async_tma_scatter": "tma_scatter",
}


def _name(op: sass.Instruction) -> str:
    return op.opcode


def _no_access(op: sass.Instruction, name: str) -> None:   # TTGIR ops move tensors, not a thread's bits
    return None


def mix(ops: list[sass.Instruction]) -> sass.Mix:
    """The ops counted by name; no widths."""
    return sass.mix(ops, _name, _no_access)


def by_line(ops: list[sass.Instruction]) -> dict[tuple[str, int], sass.Mix]:
    return sass.by_line(ops, mix)


def notable(m: sass.Mix) -> str:
    """The ops of note in a mix: "warp_group_dot, 2 x load" (a count where more than one)."""
    return ", ".join(label if m.counts[name] == 1 else f"{m.counts[name]} x {label}"
                     for name, label in NOTABLE.items() if m.counts.get(name))


def to_dict(m: sass.Mix) -> dict:
    return {"total": m.total, "ops": dict(sorted(m.counts.items()))}


# --------------------------------------------------------------------------- a matmul done by outer products

_DEFINED = re.compile(r'^(%[\w.$-]+)(?::\d+)?\s*=\s*"?([A-Za-z_][\w$]*\.[\w.$]+)"?\s*(.*)$')
_ITER_ARGS = re.compile(r"iter_args\(([^)]*)\)")
_VALUE = re.compile(r"%[\w.$-]+")
_TENSOR = re.compile(r"tensor<((?:\d+x)+)[a-z]")   # its shape: "64x1x" of tensor<64x1xf32, ...>
MIN_MMA = 16   # the tensor cores' smallest M and N


def outer_product_updates(text: str) -> list[tuple[int, int, int]]:
    """Loop-carried accumulators that add an M x N outer product each step, `acc += a[:, None] * b[None, :]`:
    K steps of it are a matmul of M x K by K x N done as scalar FMAs. (TTGIR line of the add, M, N), where M and N
    are at least the tensor cores' 16. Triton turns `tl.sum(a[:, :, None] * b[None, :, :], axis=1)` into a
    tl.dot of its own; not this. Each function's values are its own (MLIR names them afresh in each)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip().startswith("tt.func")]
    edges = [0] + starts[1:] + [len(lines)]
    return [update for a, b in zip(edges, edges[1:]) for update in _outer_products_in(lines[a:b], a)]


def _outer_products_in(lines: list[str], first: int) -> list[tuple[int, int, int]]:
    """outer_product_updates of one function's lines, the first of them line first + 1 of the text."""
    defined: dict[str, tuple[str, str]] = {}
    carried: set[str] = set()   # a loop's iter_args: what it carries from step to step
    yielded: set[str] = set()   # what a loop's steps hand on to the next
    for raw in lines:
        line = raw.strip()
        found = _DEFINED.match(line)
        if found:
            defined[found[1]] = (found[2], found[3])
        for args in _ITER_ARGS.findall(line):
            carried.update(part.split("=")[0].strip() for part in args.split(","))
        if line.startswith("scf.yield"):
            yielded.update(_VALUE.findall(line))

    def broadcast_shape(value: str) -> tuple[int, ...] | None:
        op, rest = defined.get(value, ("", ""))
        shape = _TENSOR.search(rest) if op == "tt.broadcast" else None
        return tuple(int(n) for n in shape[1].rstrip("x").split("x")) if shape else None

    out = []
    for number, raw in enumerate(lines, first + 1):
        found = _DEFINED.match(raw.strip())
        if not found or found[2] != "arith.addf" or found[1] not in yielded:
            continue
        operands = _VALUE.findall(found[3])[:2]
        products = [v for v in operands if defined.get(v, ("",))[0] == "arith.mulf"]
        if len(products) != 1 or not set(operands) - set(products) <= carried or len(set(operands)) != 2:
            continue
        shapes = sorted((broadcast_shape(v) for v in _VALUE.findall(defined[products[0]][1])[:2]),
                        key=lambda s: s is None or s[0] == 1)   # [M, 1] first, then [1, N]
        if (len(shapes) == 2 and None not in shapes and len(shapes[0]) == len(shapes[1]) == 2
                and shapes[0][1] == 1 and shapes[1][0] == 1 and min(shapes[0][0], shapes[1][1]) >= MIN_MMA):
            out.append((number, shapes[0][0], shapes[1][1]))
    return out
