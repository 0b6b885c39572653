"""What needs no compiler: the occupancy calculator against cases worked by hand from CUDA's rules, and the
reading of nvdisasm's and cuobjdump's output (a listing of a Triton matmul for sm_90, cut down)."""

import pytest

from roofline.inspect import sass
from roofline.inspect.occupancy import limits, occupancy

# (arch, threads, registers, shared bytes) -> (blocks an SM, limiter), each worked by hand:
CASES = [
    # 8 warps of 110 registers: 3584 a warp (110 x 32 = 3520, rounded up to 256s); a sub-partition's 16,384 hold 4
    # warps, the SM 16: 2 blocks. 99,328 bytes + 1 KiB reserved = 100,352 a block: 233,472 / 100,352 = 2 too; the
    # tie goes to the register file, listed first among the limits that bind
    (("sm_90", 256, 110, 98304 + 1024), (2, "registers")),
    # 4 warps of 32 registers: 1024 a warp, 16 a sub-partition, 64 an SM = 16 blocks; 64 warps / 4 = 16 too, and
    # the plainest reason wins the tie
    (("sm_90", 128, 32, 0), (16, "warps")),
    # 1 warp of 16 registers: 64 blocks by warps and 128 by registers, but an SM takes at most 32 blocks
    (("sm_90", 32, 16, 0), (32, "blocks")),
    # 4 warps, few registers, 60 KiB of shared memory: 61,440 + 1,024 = 62,464 a block; 233,472 / 62,464 = 3
    (("sm_90", 128, 32, 60 * 1024), (3, "shared memory")),
    # sm_86 holds 48 warps: 8-warp blocks of 32 registers fit 6 by warps
    (("sm_86", 256, 32, 0), (6, "warps")),
    # 255 registers: 8192 a warp, 2 a sub-partition, 8 an SM: one 8-warp block
    (("sm_80", 256, 255, 0), (1, "registers")),
    # a block asking for more shared memory than a block may have does not launch
    (("sm_90", 128, 32, 228 * 1024), (0, "shared memory")),
]


@pytest.mark.parametrize("args, expected", CASES)
def test_occupancy_follows_cuda_s_rules(args, expected):
    found = occupancy(*args)
    assert (found.blocks, found.limiter) == expected, found
    assert found.warps == found.blocks * -(-args[1] // 32)
    assert found.occupancy == pytest.approx(found.warps / limits(args[0]).max_warps)


def test_occupancy_refuses_what_no_gpu_runs():
    with pytest.raises(ValueError, match="threads must be 1 to 1024"):
        occupancy("sm_90", 2048, 32, 0)
    with pytest.raises(ValueError, match="registers must be at most 255"):
        occupancy("sm_90", 128, 256, 0)
    with pytest.raises(ValueError, match="arch must be one of"):
        occupancy("sm_99", 128, 32, 0)
    with pytest.raises(ValueError, match="shared_bytes must be a non-negative int"):
        occupancy("sm_90", 128, 32, -1)
    assert limits("90").arch == limits("sm_90a").arch == "sm_90"


LISTING = """
	.section	.text.mm,"ax",@progbits
mm:
.text.mm:
	//## File "/work/kernels.py", line 12
        /*0550*/              @!PT LDS RZ, [RZ] ;
        /*0580*/                   LDGSTS.E.BYPASS.128 [R41], desc[UR14][R20.64], P0 ;
	//## File "/work/kernels.py", line 13
        /*0670*/                   LDG.E.U16 R4, desc[UR14][R28.64] ;
        /*0680*/                   LDG.E R5, desc[UR14][R30.64] ;
        /*06f0*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
	//## File "/work/kernels.py", line 14
        /*0d70*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8].tnspB, R24 ;
        /*0e80*/                   HGMMA.64x128x16.F32.BF16 R24, gdesc[UR8].tnspB, R24, gsb0 ;
        /*0e90*/                   WARPGROUP.DEPBAR.LE gsb0, 0x1 ;
        /*0ea0*/                   STL.64 [R1+0x8], R10 ;
        /*0eb0*/                   LDL.64 R10, [R1+0x8] ;
	//## File "/work/kernels.py", line 16
        /*1740*/                   STG.E.128 desc[UR14][R2.64], R12 ;
        /*1750*/              @P0  MUFU.EX2 R3, R3 ;
        /*1760*/                   EXIT ;
"""


def test_a_listing_reads_as_instructions_under_their_lines():
    found = sass.parse_disassembly(LISTING)
    assert [i.offset for i in found][:3] == [0x550, 0x580, 0x670] and len(found) == 13
    assert found[0].opcode == "LDS" and found[0].text == "@!PT LDS RZ, [RZ]" and (found[0].file, found[0].line) == (
        "/work/kernels.py", 12)
    assert found[5].opcode == "HGMMA.64x128x16.F32.BF16" and found[5].base == "HGMMA" and found[5].line == 14
    assert found[-2].text == "@P0 MUFU.EX2 R3, R3" and found[-1].line == 16


def test_the_mix_counts_each_class_and_the_widths_of_global_accesses():
    instructions = sass.parse_disassembly(LISTING)
    mix = sass.mix(instructions)
    assert mix.total == 13
    assert dict(mix.counts) == {"shared": 1, "async copy": 1, "global load": 2, "barrier": 2, "tensor core": 2,
                                "spill": 2, "global store": 1, "special function": 1, "other": 1}
    assert dict(mix.load_bits) == {128: 1, 16: 1, 32: 1} and dict(mix.store_bits) == {128: 1}
    lines = sass.by_line(instructions)
    assert lines[("/work/kernels.py", 14)].counts["tensor core"] == 2 and lines[("/work/kernels.py", 14)].total == 5


def test_resource_usage_reads_by_function():
    text = """
Resource usage:
 Common:
  GLOBAL:0
 Function mm:
  REG:110 STACK:0 SHARED:1024 LOCAL:0 CONSTANT[0]:584 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function spilling:
  REG:255 STACK:48 SHARED:0 LOCAL:48 CONSTANT[0]:400 TEXTURE:0 SURFACE:0 SAMPLER:0
"""
    found = sass.parse_resources(text)
    assert found["mm"] == sass.Resources(registers=110, local_bytes=0, stack_bytes=0, static_shared_bytes=1024)
    assert found["spilling"].local_bytes == 48 and found["spilling"].registers == 255


def _kernel_source_stand_in():
    return 0


def test_spilled_registers_are_the_stack_frame_s_and_named_at_the_kernel_s_own_line():
    """ptxas on sm_90 puts spilled registers in the stack frame (STACK), not LOCAL: a spilling kernel of the
    interpreter's attention, compiled here, reads REG:255 STACK:1672 LOCAL:0."""
    from types import SimpleNamespace

    from roofline.inspect import report as inspect_report

    used = sass.parse_resources(" Function k:\n  REG:255 STACK:1672 SHARED:0 LOCAL:0 CONSTANT[0]:400\n")["k"]
    assert used.local_memory == 1672
    spills = [sass.Instruction(0x10, "STL.64", "STL.64 [R1+0x8], R4 ;", "/x/triton/language/standard.py", 170),
              sass.Instruction(0x20, "LDL.64", "LDL.64 R4, [R1+0x8] ;", "/repo/kern.py", 12)]
    launch = SimpleNamespace(where=("/repo/kern.py", 10), source=None, parameters=[], args=[],
                             kernel=SimpleNamespace(fn=_kernel_source_stand_in))
    report = SimpleNamespace(resources=used, occupancy=occupancy("sm_90", 128, 255, 0), mix=sass.Mix(),
                             lines=[], where="kern.py:10", arch="sm_90", shared_bytes=0, num_warps=4, sms=None,
                             blocks=None, asm={})
    (found,) = [f for f in inspect_report.findings(report, launch, spills) if f.id == "spills"]
    assert "1,672 bytes of local memory a thread" in found.title and "2 spill loads and stores" in found.message
    # the kernel's own line first, Triton's library line (inlined into it) after
    assert found.where == "kern.py:12" and found.message.index("kern.py:12") < found.message.index("standard.py")
