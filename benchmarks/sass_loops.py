"""Instructions per element in the hot loops of roofline's row kernels, read off their SASS, with no GPU.

    python benchmarks/sass_loops.py

Triton compiles for a target it is told (here sm_90, the H100) without a device, and ships ptxas, cuobjdump and
nvdisasm; so a kernel's registers, spills and loop bodies can be read on a CPU machine. Integer and pointer
arguments are marked divisible by 16, as Triton marks them at launch for the benchmark shapes, so that the loads
come out vectorized as they do on the GPU. A loop is a backward branch; its body's instructions divided by the
elements a thread handles per iteration is the figure that made cross_entropy's first pass issue-bound (15.25
before the chunked online softmax, 7.6 after: benchmarks/results/h100-tune.md, run 8). A body with an if/else
counts both arms (cross_entropy's gradient loop: the block that holds the target and the others), and an outer
loop counts its inner loops once.
"""

from __future__ import annotations

import collections
import importlib
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")


def compile_for_sm90(fn, signature: dict, constexprs: dict, num_warps: int, divisible_by_16=()):
    """fn (a @triton.jit kernel) compiled for sm_90; signature maps each argument to a Triton type or 'constexpr'."""
    names = list(signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible_by_16}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def _tool(name: str, kernel) -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        args = ["-res-usage"] if name == "cuobjdump" else ["-c"]
        return subprocess.run([os.path.join(BIN, name), *args, f.name], capture_output=True, text=True,
                              check=True).stdout


def resources(kernel) -> str:
    """Registers, stack (spills) and shared memory a thread, as cuobjdump reports them."""
    return _tool("cuobjdump", kernel).strip().splitlines()[-1].strip()


def loops(kernel) -> list[collections.Counter]:
    """The opcode counts of each loop body (from a label to a branch back to it), the shortest first."""
    instructions, labels = [], {}
    for line in _tool("nvdisasm", kernel).splitlines():
        label = re.match(r"^\s*(\.L_x_\d+):", line)
        if label:
            labels[label.group(1)] = len(instructions)
        elif (found := re.match(r"\s*/\*[0-9a-f]+\*/\s+(.*?);", line)):
            instructions.append(found.group(1))
    bodies = []
    for end, instruction in enumerate(instructions):
        target = re.search(r"\bBRA\b.*?(\.L_x_\d+)", instruction)
        if target and labels.get(target.group(1), end + 1) < end:
            body = instructions[labels[target.group(1)]:end + 1]
            ops = (re.sub(r"^@!?U?P\w+\s+", "", i).split()[0].split(".")[0] for i in body)   # no predicate
            bodies.append(collections.Counter(ops))
    return sorted(bodies, key=lambda c: sum(c.values()))


def _row_kernels():
    """(name, kernel, signature, constexprs, warps, elements a thread per iteration) at the benchmark shapes."""
    ce = importlib.import_module("roofline.ops.cross_entropy")
    sm = importlib.import_module("roofline.ops.softmax")
    ce_signature = {"x_ptr": "*bf16", "target_ptr": "*i64", "loss_ptr": "*fp32", "grad_ptr": "*bf16",
                    "stats_ptr": "*i32", "rows": "i32", "n": "i32", "ignore_index": "i32", "smoothing": "fp32",
                    "GRAD": "constexpr", "MEAN": "constexpr", "SMOOTH": "constexpr", "BLOCK": "constexpr"}
    sm_signature = {"x_ptr": "*bf16", "y_ptr": "*bf16", "rows": "i32", "n": "i32", "LOG": "constexpr",
                    "BLOCK": "constexpr", "SINGLE": "constexpr", "ROWS": "constexpr"}
    return [
        ("cross_entropy forward, bf16 [8192 x 128256]", ce.cross_entropy_forward_kernel, ce_signature,
         dict(GRAD=True, MEAN=True, SMOOTH=False, BLOCK=ce.BLOCK), ce.NUM_WARPS, ce.BLOCK // (32 * ce.NUM_WARPS)),
        ("softmax forward, bf16 rows of 65536", sm.softmax_forward_kernel, sm_signature,
         dict(LOG=False, BLOCK=sm.MAX_BLOCK, SINGLE=False, ROWS=1), sm.LONG_ROW_WARPS,
         sm.MAX_BLOCK // (32 * sm.LONG_ROW_WARPS)),
    ]


def main() -> None:
    for name, kernel, signature, constexprs, warps, per_thread in _row_kernels():
        pointers_and_n = [a for a, t in signature.items() if t.startswith("*") or a == "n"]
        compiled = compile_for_sm90(kernel, signature, constexprs, warps, pointers_and_n)
        print(f"{name}: {resources(compiled)}")
        for body in loops(compiled):
            count = sum(body.values())
            top = ", ".join(f"{op} {n}" for op, n in body.most_common(8))
            print(f"  loop of {count} instructions, {count / per_thread:.2f} an element: {top}")


if __name__ == "__main__":
    main()
