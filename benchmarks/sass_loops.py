"""Instructions per element in the hot loops of roofline's row kernels, and in linear's epilogue for each
activation, read off their SASS, with no GPU.

    python benchmarks/sass_loops.py

Triton compiles for a target it is told (here sm_90, the H100) without a device, and ships ptxas, cuobjdump and
nvdisasm; so a kernel's registers, spills and loop bodies can be read on a CPU machine (roofline.inspect.sass reads
them; `roofline inspect` shows them for any function's kernels). Integer and pointer
arguments are marked divisible by 16, as Triton marks them at launch for the benchmark shapes, so that the loads
come out vectorized as they do on the GPU. A loop is a backward branch; its body's instructions divided by the
elements a thread handles per iteration is the figure that made cross_entropy's first pass issue-bound (15.25
before the chunked online softmax, 7.6 after: benchmarks/results/h100-tune.md, run 8). A body with an if/else
counts both arms (cross_entropy's gradient loop: the block that holds the target and the others), and an outer
loop counts its inner loops once. The epilogue report is what made GeLU's erf the cost of linear's fused
epilogue (65 instructions an output element and a spill before _normal_cdf, 33 after: h100-linear.md).
"""

from __future__ import annotations

import collections
import importlib

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from roofline.inspect import sass



def compile_for_sm90(fn, signature: dict, constexprs: dict, num_warps: int, divisible_by_16=()):
    """fn (a @triton.jit kernel) compiled for sm_90; signature maps each argument to a Triton type or 'constexpr'."""
    names = list(signature)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in divisible_by_16}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})


def resources(kernel) -> str:
    """Registers, spills (local memory) and shared memory, as cuobjdump reports them."""
    used = sass.resources(kernel.asm["cubin"])[kernel.metadata.name]
    return (f"{used.registers} registers, {used.local_memory} bytes of local memory a thread, "
            f"{kernel.metadata.shared + used.static_shared_bytes} bytes of shared memory")


def _opcodes(instructions) -> collections.Counter:
    return collections.Counter(i.base for i in instructions)


def loops(kernel) -> list[collections.Counter]:
    """The opcode counts of each loop body (roofline.inspect.sass.loops), the shortest first."""
    return [_opcodes(body) for body in sass.loops(sass.disassemble(kernel.asm["cubin"]))]


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


def linear_epilogues() -> None:
    """What each activation adds to linear_kernel (bf16, bias, the 128 x 256 persistent tile with 8 warps that the
    autotuner picks for the large shapes): registers, spills, and instructions an output element beyond the
    kernel without activation (every instruction of the kernel counted once; the epilogue runs once per tile)."""
    lin = importlib.import_module("roofline.ops.linear")
    bm, bn, bk, warps = 128, 256, 64, 8
    signature = {"x_desc": f"tensordesc<bf16[{bm}, {bk}]>", "w_desc": f"tensordesc<bf16[{bn}, {bk}]>",
                 "y_desc": f"tensordesc<bf16[{bm}, {bn}]>", "r_desc": "constexpr", "z_desc": "constexpr",
                 "bias_ptr": "*bf16", "scale_ptr": "constexpr", "M": "i32", "N": "i32", "K": "i32", "GROUPS": "i32",
                 "M_BUCKET": "i32"}
    constexprs = dict(r_desc=None, z_desc=None, scale_ptr=None, HAS_BIAS=True, HAS_RESIDUAL=False, W_SCALED=False,
                      GROUP_K=0, SAVE_Z=False, PRECISION="tf32", UPCAST=False, ROUND_TF32=False, GROUP_M=lin.GROUP_M,
                      BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, PERSISTENT=True, SPLIT_EPILOGUE=False)
    signature.update({name: "constexpr" for name in constexprs if name not in signature})
    signature["ACTIVATION"] = "constexpr"
    per_thread = bm * bn // (32 * warps)
    plain = None
    print(f"linear_kernel epilogues, bf16 {bm} x {bn} tiles, {warps} warps:")
    for code, name in enumerate(lin.ACTIVATIONS):
        compiled = compile_for_sm90(lin.linear_kernel.fn, signature, dict(constexprs, ACTIVATION=code), warps,
                                    ("bias_ptr", "N", "K"))
        ops = _opcodes(sass.parse_disassembly(sass.disassemble(compiled.asm["cubin"])))
        plain = plain or ops
        extra = (sum(ops.values()) - sum(plain.values())) / per_thread
        top = ", ".join(f"{op} {n / per_thread:+.1f}" for op, n in (ops - plain).most_common(6))
        print(f"  {name or 'none'}: {resources(compiled)}; {extra:.1f} instructions an element more: {top}")


def main() -> None:
    linear_epilogues()
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
