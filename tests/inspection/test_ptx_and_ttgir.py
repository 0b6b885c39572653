"""PTX and TTGIR mapped to the kernel's source lines beside the SASS: first the parsers on cut-down samples of
Triton 3.6's output (and on text they must survive), then kernels compiled here for sm_90 as a launch on the H100
compiles them (a matmul three ways, roofline's softmax, flash attention's forward), read at every level."""

import re
import sys
from pathlib import Path

import pytest
import torch

from roofline.inspect import ptx, sass, ttgir

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from examples import inspect_kernels  # noqa: E402

# the tests of compiled kernels share one compilation (about 10 s here with Triton's cache warm, a minute cold): run
# them first; the parsers' tests take no time
pytestmark = pytest.mark.long

# PTX as Triton 3.6 writes it for sm_90 (cut down): `.file` after the function, inline asm in braces with a label
# of its own, predicated instructions, a local array's declaration (.local, not a .loc), and `.loc`s LLVM cannot
# place (line 0), that cannot be read, or of no named file
PTX = """
.version 8.7
.target sm_90a
.visible .entry mm(
	.param .u64 .ptr .global .align 1 mm_param_0
)
.reqntid 128
{
	.reg .b32 	%r<239>;
	ld.param.b64 	%rd19, [mm_param_0];
	.loc	1 12 25                         // kern.py:12:25
$L__BB0_3:
	@%p1 cp.async.cg.shared.global [ %r18 + 0 ], [ %rd6 + 0 ], 0x10, %r19;
	ld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd23 + 0 ];
	ld.global.b16 { %rs1 }, [ %rd24 + 0 ];
	cp.async.commit_group;
	.loc	1 13 20                         // kern.py:13:20
	@%p2 cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%r8], [%rd1, {%r42, %r42}], [%r5];
	{
	.reg .pred complete;
	waitLoop:
	mbarrier.try_wait.parity.shared::cta.b64 complete, [%r17], %r77;
	@!complete bra.uni waitLoop;
	}
	.loc	1 14 25                         // kern.py:14:25
	.local .align 8 .b8 	__local_depot0[16];
	wgmma.fence.sync.aligned;
	wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%r189,%r190}, %rd55, %rd56, %p2, 1, 1, 0, 1;
	mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%r1,%r2}, {%r5,%r6}, {%r9}, {%r1,%r2};
	wgmma.wait_group.sync.aligned 0;
	ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1, %r2, %r3, %r4}, [%r5];
	st.local.b32 	[%rd2], %r4;
	ld.local.b32 	%r4, [%rd2];
	.loc	1 0 25                          // kern.py:0:25
	bar.sync 	0;
	.loc	1 oops
	ex2.approx.f32 	%r1, %r2;
	.loc	3 15 4
	shfl.sync.bfly.b32 	%r1, %r2, 16, 31, -1;
	.loc	2 170 27                        // standard.py:170:27 @[ kern.py:15:19 ]
	max.f32 	%r3, %r1, %r2;
	.loc	1 16 4
	st.global.v4.b32 [ %rd92 + 0 ], { %r1, %r2, %r3, %r4 };
	atom.global.gpu.acq_rel.add.f32 %r5, [%rd1], %r6;
	ret;
$L__func_end0:
}
	.file	1 "/work/kern.py"
	.file	2 "/lib/triton/language" "standard.py"
	.section	.debug_abbrev
	{
.b8 1                                   // Abbreviation Code
	}
"""


def test_ptx_instructions_land_on_their_loc_lines():
    found = ptx.parse(PTX)
    assert [i.opcode for i in found][:3] == ["ld.param.b64", "cp.async.cg.shared.global", "ld.global.v4.b32"]
    assert (found[0].file, found[0].line) == (None, None)   # before any .loc
    at = {(i.file, i.line) for i in found if i.base == "wgmma"}
    assert at == {("/work/kern.py", 14)}
    assert found[1].text.startswith("@%p1 cp.async.cg.shared.global [ %r18 + 0 ]")
    assert found[1].offset == PTX.splitlines().index(
        "\t@%p1 cp.async.cg.shared.global [ %r18 + 0 ], [ %rd6 + 0 ], 0x10, %r19;") + 1
    # inside the inline asm: the wait and its branch, not the label or the .reg
    assert [i.opcode for i in found if i.line == 13] == ["cp.async.bulk.tensor.2d.shared::cluster.global."
                                                         "mbarrier::complete_tx::bytes",
                                                         "mbarrier.try_wait.parity.shared::cta.b64", "bra.uni"]
    # line 0, an unreadable .loc and a file no .file names: no line, and no crash
    for opcode in ("bar.sync", "ex2.approx.f32", "shfl.sync.bfly.b32"):
        (ins,) = [i for i in found if i.opcode == opcode]
        assert (ins.file, ins.line) == (None, None), opcode
    (inlined,) = [i for i in found if i.opcode == "max.f32"]
    assert (inlined.file, inlined.line) == ("/lib/triton/language/standard.py", 170)   # innermost, as the SASS's
    assert not [i for i in found if i.opcode.startswith((".", "b8", "waitLoop"))]
    assert found[-3].text == "st.global.v4.b32 [ %rd92 + 0 ], { %r1, %r2, %r3, %r4 }"   # its operand's braces kept


def test_the_ptx_mix_reads_as_the_sass_mix():
    found = ptx.parse(PTX)
    mix = ptx.mix(found)
    assert mix.total == len(found) == 22
    assert dict(mix.counts) == {"other": 3, "async copy": 1, "global load": 2, "barrier": 5, "TMA": 1,
                                "tensor core": 2, "shared": 1, "spill": 2, "special function": 1, "shuffle": 1,
                                "float": 1, "global store": 2}
    # cp.async's 16 bytes and a v4.b32 are 128 bits a thread, as LDGSTS.E.128 and LDG.E.128 are; atomics no width
    assert dict(mix.load_bits) == {128: 2, 16: 1} and dict(mix.store_bits) == {128: 1}
    lines = ptx.by_line(found)
    assert lines[("/work/kern.py", 14)].counts["tensor core"] == 2 and lines[("/work/kern.py", 14)].total == 7
    assert sum(m.total for m in lines.values()) + sum(i.line is None for i in found) == mix.total
    assert ptx.parse("") == [] and all(i.line is None for i in ptx.parse("garbage { ;; } .loc\n.file x\n"))


# TTGIR as Triton 3.6 writes it (cut down): aliases before and after the module, names over locations, call sites
# of inlined code, an op with a region whose location follows its closing brace, and locations written in place
TTGIR = """#blocked = #ttg.blocked<{sizePerThread = [1], threadsPerWarp = [32], warpsPerCTA = [4], order = [0]}>
#loc = loc("/work/kern.py":7:0)
#loc1 = loc(unknown)
#loc11 = loc("/work/kern.py":11:19)
#loc23 = loc("x_ptr"(#loc))
#loc34 = loc("z"(#loc11))
#loc40 = loc(callsite(#loc1 at #loc34))
module attributes {"ttg.num-warps" = 4 : i32} {
  tt.func public @k(%x_ptr: !tt.ptr<bf16> loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc))) attributes {noinline = false} {
    %cst = arith.constant dense<0xFF80> : tensor<1024xbf16, #blocked> loc(#loc1)
    %x_5 = tt.load %x_4, %x_0, %cst : tensor<1024x!tt.ptr<bf16>, #blocked> loc(#loc32)
    %z = "tt.reduce"(%x_6) <{axis = 0 : i32}> ({
    ^bb0(%z_11: f32 loc(callsite(#loc1 at #loc34)), %z_12: f32 loc(callsite(#loc1 at #loc34))):
      %z_13 = arith.maxnumf %z_11, %z_12 : f32 loc(#loc43)
      tt.reduce.return %z_13 : f32 loc(#loc39)
    }) : (tensor<1024xf32, #blocked>) -> f32 loc(#loc39)
    %acc = scf.for %i = %c0_i32 to %K step %c32_i32 iter_args(%arg7 = %cst) -> (tensor<64x64xf32, #mma>)  : i32 {
      %acc_37 = ttng.warp_group_dot %a, %b, %arg7 {isAsync = true} : !ttg.memdesc<64x32xbf16> * !ttg.memdesc<32x64xbf16> -> tensor<64x64xf32> loc(#loc61)
      %acc_38:3 = ttng.warp_group_dot_wait %acc_37, %a, %b {pendings = 0 : i32} : tensor<64x64xf32, #mma> loc(#loc61)
      scf.yield %acc_38#0 : tensor<64x64xf32, #mma> loc(#loc25)
    } loc(#loc55)
    %c = scf.if %p -> (tensor<64x64xbf16, #mma>) {
      %t = arith.truncf %acc : tensor<64x64xf32, #mma> to tensor<64x64xbf16, #mma> loc("/work/kern.py":20:8)
      scf.yield %t : tensor<64x64xbf16, #mma> loc(#loc70)
    } else {
      scf.yield %u : tensor<64x64xbf16, #mma> loc(#loc70)
    } loc(#loc70)
    %9 = ttg.convert_layout %c : tensor<64x64xbf16, #mma> -> tensor<64x64xbf16, #blocked1> loc(#loc31)
    tt.store %7, %9 : tensor<64x64x!tt.ptr<bf16>, #blocked1> loc(fused[#loc1, "/work/kern.py":22:4])
    %10 = ttg.local_alloc %9 : (tensor<64x64xbf16, #blocked1>) -> !ttg.memdesc<64x64xbf16, #shared, #smem> loc(#loc80)
    %11 = ttg.local_load %10 : !ttg.memdesc<64x64xbf16, #shared, #smem> -> tensor<64x64xbf16, #blocked1> loc(#loc81)
    %12 = tt.splat %n : i32 -> tensor<64xi32> loc(#loc82)
    %13 = tt.splat %n : i32 -> tensor<64xi32> loc(#loc84)
    tt.return loc(#loc32)
  } loc(#loc)
} loc(#loc)
#loc10 = loc("/lib/triton/language/standard.py":191:40)
#loc12 = loc("/lib/triton/language/standard.py":170:27)
#loc24 = loc("/work/kern.py":15:25)
#loc25 = loc("/work/kern.py":15:8)
#loc30 = loc("/work/kern.py":21:4)
#loc32 = loc("/work/kern.py":10:16)
#loc39 = loc(callsite(#loc10 at #loc34))
#loc43 = loc(callsite(#loc12 at #loc39))
#loc55 = loc("acc"(#loc18))
#loc18 = loc("/work/kern.py":14:25)
#loc61 = loc("acc"(#loc24))
#loc70 = loc(fused<"meta">[#loc1, "/work/kern.py":20:4])
#loc31 = loc(callsite(callsite(#loc1 at #loc30) at #loc24))
#loc80 = loc("/work/kern.py":0:1)
#loc81 = loc(#loc99)
#loc82 = loc(#loc83)
#loc83 = loc(#loc82)
#loc84 = loc("/work/kern.py":23:5 to :23:9)
"""


def test_ttgir_ops_land_on_their_locations_lines():
    ops = ttgir.parse(TTGIR)
    at = {op.opcode: (Path(op.file).name if op.file else None, op.line) for op in ops}
    assert at["tt.load"] == ("kern.py", 10)
    # inlined from standard.py: the innermost line (tl.max's reduce and its combine), as PTX and SASS place them
    assert at["tt.reduce"] == ("standard.py", 191) and at["arith.maxnumf"] == ("standard.py", 170)
    # a named location, an alias used before it is defined, an op whose region ends with its location
    assert at["ttng.warp_group_dot"] == ("kern.py", 15) and at["scf.for"] == ("kern.py", 14)
    assert at["arith.truncf"] == ("kern.py", 20) and at["scf.if"] == ("kern.py", 20)   # in place; fused
    # a call site whose callee is unknown: its caller's line; a fusion: its first known part
    assert at["ttg.convert_layout"] == ("kern.py", 21) and at["tt.store"] == ("kern.py", 22)
    # unknown, line 0, an alias never defined, aliases in a circle: no line
    for name in ("arith.constant", "ttg.local_alloc", "ttg.local_load"):
        assert at[name] == (None, None), name
    assert [op.line for op in ops if op.opcode == "tt.splat"] == [None, 23]   # a circle; a range: its first line
    assert not {"module", "tt.func"} & set(at) and len(ops) == 20
    assert [op.offset for op in ops] == sorted(op.offset for op in ops)


def test_the_ttgir_mix_counts_ops_by_name_and_names_those_of_note():
    ops = ttgir.parse(TTGIR)
    mix = ttgir.mix(ops)
    assert mix.total == 20 and mix.counts["scf.yield"] == 3 and not mix.load_bits
    lines = ttgir.by_line(ops)
    assert sum(m.total for m in lines.values()) + sum(op.line is None for op in ops) == mix.total
    assert ttgir.notable(lines[("/work/kern.py", 15)]) == "warp_group_dot"
    assert ttgir.notable(mix) == "warp_group_dot, convert_layout, local_alloc, local_load, load, store"
    assert ttgir.to_dict(lines[("/work/kern.py", 15)]) == {
        "total": 3, "ops": {"scf.yield": 1, "ttng.warp_group_dot": 1, "ttng.warp_group_dot_wait": 1}}
    assert ttgir.parse("") == []
    assert [(op.opcode, op.line) for op in ttgir.parse("} loc(#loc)\n%x = tt.load %p loc(\n")] == [("tt.load", None)]


# Kernels compiled for sm_90 as the H100's launches compile them (Triton's own toolchain, in a process of its own)
def _kernels():
    """A matmul three ways (bf16, TF32: warpgroup MMAs; fp32 IEEE: none), roofline's softmax forward and backward on
    rows of 1,024 bf16 values, flash attention's bf16 forward (tensor descriptors: TMA)."""
    from roofline import ops

    inspect_kernels.matmuls(64)
    inspect_kernels.softmax_forward_and_backward(8, 1024)
    q, k, v = (torch.randn(1, 1, 64, 128, dtype=torch.bfloat16) for _ in range(3))
    ops.flash_attention(q, k, v, backend="triton")


@pytest.fixture(scope="module")
def compiled():
    from roofline.inspect.report import inspect_function

    reports = inspect_function(_kernels, arch="sm_90").launched
    assert [r.name for r in reports] == ["matmul_kernel"] * 3 + ["softmax_forward_kernel", "softmax_backward_kernel",
                                                                 "attention_forward_kernel"], reports
    return reports


def _lines_matching(report, pattern: str) -> list[int]:
    """The lines of the kernel's file (its function and the helpers it inlines) that match `pattern` and compiled
    to something: what a constexpr left out, or another kernel's, are not this kernel's."""
    own = {x.line for x in report.lines if x.file == report.file}
    return [n for n, text in enumerate(Path(report.file).read_text().splitlines(), 1)
            if re.search(pattern, text.split("#")[0]) and n in own]


def _row(report, line: int, file: str | None = None):
    return next(x for x in report.lines if x.file == (file or report.file) and x.line == line)


def test_every_tl_dot_line_holds_a_wgmma_and_a_warp_group_dot(compiled):
    """Each kernel on the tensor cores: at each tl.dot line, its warpgroup MMAs in PTX (wgmma.mma_async) and in
    TTGIR (ttng.warp_group_dot); in SASS, as many HGMMAs as PTX's wgmmas. ptxas's line table is coarser than the
    PTX's: of the bf16 matmul's two HGMMAs, it puts one on the loop's line and one on a load's, none on the dot's,
    so there the SASS's are only counted: as many, inside the loop; of flash attention's, those of S = Q K^T sit at
    its dot's line, those of P V (which follows the softmax's row sum) on neighbouring lines."""
    bf16, tf32, ieee, *_, attention = compiled
    for r in (bf16, tf32, attention):
        dots = _lines_matching(r, r"\btl\.dot\(")
        assert dots, r.name
        for line in dots:
            x = _row(r, line)
            assert x.ptx.counts["tensor core"] > 0 and x.ttgir.counts["ttng.warp_group_dot"] > 0, (r.name, line)
            assert all(i.base == "wgmma" for i in ptx.parse(r.asm["ptx"]) if i.line == line and ptx.kind(i) ==
                       "tensor core")
        assert r.mix.counts["tensor core"] == r.ptx.counts["tensor core"] > 0, r.name
    scores, _ = _lines_matching(attention, r"\btl\.dot\(")
    assert _row(attention, scores).mix.counts["tensor core"] > 0
    loop = _lines_matching(bf16, r"^\s*for ")[0]
    hgmma = [i.line for i in sass.parse_disassembly(bf16.asm["sass"]) if i.base == "HGMMA"]
    assert len(hgmma) == 2 and all(loop <= n <= _lines_matching(bf16, r"\btl\.dot\(")[0] for n in hgmma)
    # fp32 in IEEE precision: tl.dot on the CUDA cores at every level
    (dot,) = _lines_matching(ieee, r"\btl\.dot\(")
    x = _row(ieee, dot)
    assert not x.mix.counts["tensor core"] and not x.ptx.counts["tensor core"] and x.ttgir.counts["tt.dot"] == 1
    assert x.ptx.counts["float"] >= 64 * 64 * 32 // 128   # the FMAs: a 64x64x32 block's over 128 threads


def test_a_layout_conversion_shows_at_its_line_with_its_trip_through_shared_memory(compiled):
    """The matmul's accumulator leaves the MMA's layout for a coalesced store: TTGIR's convert_layout at the
    tl.store line, where PTX and SASS write it to shared memory, wait at a barrier and read it back."""
    bf16 = compiled[0]
    (store,) = _lines_matching(bf16, r"\btl\.store\(")
    converts = [op.line for op in ttgir.parse(bf16.asm["ttgir"]) if op.opcode == "ttg.convert_layout"]
    assert converts == [store]
    x = _row(bf16, store)
    assert ttgir.notable(x.ttgir) == "convert_layout, store"
    for level in (x.ptx, x.mix):
        assert level.counts["shared"] > 0 and level.counts["barrier"] > 0 and level.counts["global store"] > 0
    assert dict(x.ptx.store_bits) == dict(x.mix.store_bits) == {128: 4}   # stored 128 bits a thread, as converted


def test_a_softmax_s_reductions_land_on_triton_s_lines_at_every_level(compiled):
    """tl.max and tl.sum are inlined from triton/language/standard.py: TTGIR's tt.reduce (through its call-site
    locations), the PTX's shuffles and the SASS's SHFLs all sit at the reduce call's lines there."""
    for r in compiled[3:5]:
        reduces = {(op.file, op.line) for op in ttgir.parse(r.asm["ttgir"]) if op.opcode == "tt.reduce"}
        assert reduces and all(Path(f).name == "standard.py" for f, _ in reduces), reduces
        for f, line in reduces:
            x = _row(r, line, f)
            assert "core.reduce(" in x.source
            assert x.ptx.counts["shuffle"] > 0 and x.mix.counts["shuffle"] > 0, (r.name, line)
        # rows of 1,024 bf16: 128-bit loads at every level
        assert max(r.ptx.load_bits) == max(r.mix.load_bits) == 128 and r.ttgir.counts["tt.load"] >= 1


def test_flash_attention_s_tensor_descriptors_are_tma_at_every_level(compiled):
    attention = compiled[-1]
    tma_ops = {op.line for op in ttgir.parse(attention.asm["ttgir"])
               if op.opcode == "ttng.async_tma_copy_global_to_local"}
    assert tma_ops and attention.ptx.counts["TMA"] > 0 and attention.mix.counts["TMA"] > 0
    for line in tma_ops:
        assert _row(attention, line).ptx.counts["TMA"] > 0, line   # cp.async.bulk.tensor at the same line


def test_each_level_s_counts_by_line_sum_to_its_totals(compiled):
    """Every instruction and op is counted at one line or at none: the lines' counts and those without a line make
    the kernel's totals, class by class."""
    for r in compiled:
        for level, code, total in (("mix", sass.parse_disassembly(r.asm["sass"]), r.mix),
                                   ("ptx", ptx.parse(r.asm["ptx"]), r.ptx),
                                   ("ttgir", ttgir.parse(r.asm["ttgir"]), r.ttgir)):
            kind = {"mix": sass.kind, "ptx": ptx.kind, "ttgir": lambda op: op.opcode}[level]
            unplaced = [kind(i) for i in code if i.line is None]
            for name, n in total.counts.items():
                placed = sum(getattr(x, level).counts.get(name, 0) for x in r.lines)
                assert placed + unplaced.count(name) == n, (r.name, level, name)
            assert sum(getattr(x, level).total for x in r.lines) + len(unplaced) == total.total > 0


def test_the_terminal_json_and_page_show_ptx_and_ttgir_beside_the_sass(compiled):
    from rich.console import Console

    from roofline.inspect import html
    from roofline.inspect.report import Inspection, render_reports

    console = Console(width=80, record=True, force_terminal=False)
    render_reports(compiled, console, top=8)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "ttgir: warp_group_dot" in text and "ttgir: convert_layout, store" in text
    assert re.search(r"lines by instructions \(\d+ SASS, \d+ PTX; \d+ TTGIR ops\)", text)
    assert "TTGIR ops) (1/2)" not in " ".join(text.split())   # each kernel's lines in one table: the columns fit
    bf16 = compiled[0]
    (dot,) = _lines_matching(bf16, r"\btl\.dot\(")
    as_json = next(x for x in bf16.to_dict()["lines"] if x["line"] == dot)
    assert as_json["ptx"]["counts"]["tensor core"] == 2 and as_json["ttgir"]["ops"]["ttng.warp_group_dot"] == 1
    assert bf16.to_dict()["ttgir"]["total"] == bf16.ttgir.total
    page = html.render(Inspection(compiled, []), "t")
    table = page[page.index('id="launched-0-source"'):]
    table = table[:table.index("</table>")]
    row = re.search(rf"<tr[^>]*><td>{dot}</td>.*?</tr>", table)[0]
    assert "PTX tensor core" in table and "TTGIR ops of note" in table and "<td>warp_group_dot</td>" in row


# A loop of outer products as Triton 3.6 prints it in TTGIR (from a compile for sm_90 of a kernel like
# examples/inspect_kernels.py's outer_product_matmul_kernel at 64 x 64 blocks, N made 32; layouts cut short), and
# three adds that are no such update
OUTER_PRODUCTS = """\
    %acc = scf.for %k = %c0_i32 to %K step %c1_i32 iter_args(%acc_5 = %cst_0) -> (tensor<64x32xf32, #blocked>)  : i32 {
      %acc_13 = tt.expand_dims %a_8 {axis = 1 : i32} : tensor<64xf32, #ttg.slice<{dim = 1, parent = #blocked}>> -> tensor<64x1xf32, #blocked> loc(#loc38)
      %acc_14 = tt.expand_dims %b_12 {axis = 0 : i32} : tensor<32xf32, #ttg.slice<{dim = 0, parent = #blocked}>> -> tensor<1x32xf32, #blocked> loc(#loc39)
      %acc_15 = tt.broadcast %acc_13 : tensor<64x1xf32, #blocked> -> tensor<64x32xf32, #blocked> loc(#loc40)
      %acc_16 = tt.broadcast %acc_14 : tensor<1x32xf32, #blocked> -> tensor<64x32xf32, #blocked> loc(#loc40)
      %acc_17 = arith.mulf %acc_16, %acc_15 : tensor<64x32xf32, #blocked> loc(#loc40)
      %acc_18 = arith.addf %acc_5, %acc_17 : tensor<64x32xf32, #blocked> loc(#loc41)
      %twice = arith.addf %acc_17, %acc_17 : tensor<64x32xf32, #blocked> loc(#loc41)
      %scaled = arith.mulf %acc_15, %acc_15 : tensor<64x32xf32, #blocked> loc(#loc40)
      %other = arith.addf %acc_5, %scaled : tensor<64x32xf32, #blocked> loc(#loc41)
      scf.yield %acc_18 : tensor<64x32xf32, #blocked> loc(#loc16)
    } loc(#loc37)
"""


def test_a_loop_that_adds_an_outer_product_each_step_is_a_matmul_on_the_cuda_cores():
    from roofline.inspect import ttgir

    # the add of the carried accumulator and the product of a [64, 1] and a [1, 32] broadcast; not a product added
    # to itself, nor a product of two [64, 1] broadcasts
    assert ttgir.outer_product_updates(OUTER_PRODUCTS) == [(7, 64, 32)]
    narrow = OUTER_PRODUCTS.replace("1x32x", "1x8x").replace("tensor<32xf32", "tensor<8xf32")
    assert ttgir.outer_product_updates(narrow) == []   # N under the tensor cores' 16
    uncarried = OUTER_PRODUCTS.replace("iter_args(%acc_5 = %cst_0)", "iter_args(%other_5 = %cst_0)")
    assert ttgir.outer_product_updates(uncarried) == []   # no loop carries what it adds to
    unyielded = OUTER_PRODUCTS.replace("scf.yield %acc_18", "scf.yield %acc_5")
    assert ttgir.outer_product_updates(unyielded) == []   # the sum is not handed to the next step
    # each function's values are its own: f's loop carries an %acc_5, g's adds to an %acc_5 its loop does not carry
    loop = OUTER_PRODUCTS.splitlines()[0]
    two = (f"tt.func @f() {{\n{loop}\n      scf.yield %acc_5 : tensor<64x32xf32, #blocked>\n    }}\n}}\n"
           f"tt.func @g() {{\n{uncarried}}}\n")
    assert ttgir.outer_product_updates(two) == []
    # g's own, found: its add at the text's line 13 (5 of f, g's header, its 7th)
    assert ttgir.outer_product_updates(two.replace("%other_5", "%acc_5")) == [(13, 64, 32)]
