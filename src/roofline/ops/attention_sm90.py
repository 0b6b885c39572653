"""flash_attention's forward for Hopper (sm_90), written in Gluon with FlashAttention-3's structure.

The tiled Triton forward (attention.py) runs one warpgroup a block of 64 queries, its softmax and its matrix
products in turn; the tensor cores wait while it exponentiates. FlashAttention-3 overlaps them, and Triton 3.6's
own warp specialization does not build that for this kernel (benchmarks/results/h100-inspect.md: at 128 queries
its Hopper partitioning fails, at 64 it doubles the work). Here it is written out:

    a producer warpgroup      loads Q once, then each block of keys and of values through the copy engine (TMA)
                              into a ring of STAGES shared-memory slots, each slot's mbarrier saying when it is
                              full; it keeps 24 registers a thread and gives the rest to the MMA warpgroups
                              (setmaxnreg)
    two MMA warpgroups        128 queries, 64 each, 240 registers a thread: S = Q K^T on the tensor cores
                              (wgmma, asynchronous), the online softmax in base 2, O += P V with P kept in
                              registers as the product's A operand. Block j's S is issued before block j-1's
                              P V, and block j's softmax runs while that product does; each slot is handed back
                              (its "empty" mbarrier) once the product reading it has retired. Each warpgroup a
                              partition of its own (MMA_PARTS), optionally taking turns to issue (PINGPONG), and
                              optionally rescaling O while the next S runs (RESCALE_UNDER_S; slower where timed)

Same conventions as attention.py's forward: bottom-right causal alignment, grouped-query heads (query head h reads
key head h // group), a query that sees no key gets zeros and a log-sum-exp of -inf, the log-sum-exp saved in
natural log for the backward (attention.py's kernels). For bf16 and fp16 at head dims 64 and 128, a positive
scale, on a device of compute capability 9.0.

Off unless attention.SM90_FORWARD (ROOFLINE_SM90_ATTENTION=1). On an H200 (benchmarks/results/h200-attention.md),
at head dim 128 it is faster than the tiled forward, alone and as eager code calls it (from 1024 keys), and level
with cuDNN's only at the longest sequences; at 64 it is not faster than the tiled one. It stays off until a whole
program has been timed with it.
"""

from __future__ import annotations

import torch

from roofline.ops import _eager_node
from roofline.ops._common import cdiv, interpreting, tma_descriptor

try:   # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
except ImportError:
    gluon = None

HEAD_DIMS = (64, 128)
# Where flash_attention takes it, with ROOFLINE_SM90_ATTENTION=1: the head dims it was timed faster than the tiled
# forward at (benchmarks/results/h200-attention.md; slower at 64). tune_ops and the tests route both.
ROUTED_HEAD_DIMS = (128,)
BLOCK_M = 128   # queries a program holds: 64 for each MMA warpgroup
BLOCK_N = 128   # keys and values a step of the loop walks
# Slots in the ring by head dim (one more fits the 227 KiB a block may hold beside Q: O leaves through Q's memory)
STAGES = {64: 3, 128: 2}
LOAD_WARPS = 4   # the producer: the kernel's num_warps (Gluon's default partition), a warpgroup
MMA_WARPS = 8   # the two MMA warpgroups
# The MMA warpgroups as one partition (1: its barriers sync them, they move in lockstep) or a partition each (2:
# each waits only on its own work); two were the faster on the H200 (benchmarks/results/h200-attention.md)
MMA_PARTS = 2
# With two: FA3's ping-pong, each partition issues its products only after the other has issued its own (turn
# mbarriers), instead of leaving the order to the warp schedulers; on the H200 it was not told apart from
# without (benchmarks/results/h200-attention.md): off
PINGPONG = False
# O rescaled by the last block's factor while this block's S = Q K^T runs (FA3's order: off the path from one P V to
# the next issue), instead of after P V has retired; on the H200 it was slower (h200-attention.md, run 3): off
RESCALE_UNDER_S = False
MMA_REGISTERS = 240   # a thread of the MMA warpgroups; Triton leaves the producer's warpgroup 24
# At launch, a thread of each of the 12 warps: 168 x 384 threads = 24 x 128 + 240 x 256, the whole budget that
# setmaxnreg moves between the partitions. A launch with fewer would leave the MMA warpgroups' request for 240
# waiting on registers that never free (the CPU test holds the compile to exactly this many)
MAX_REGISTERS = 168


if gluon is not None:

    @gluon.jit
    def _loads(q_desc, k_desc, v_desc, q_smem, k_slots, v_slots, bars, b, h, hk, start_m, end):
        """The producer: Q, then the key and value blocks [0, end) into the ring, each slot waited for until
        the MMA warpgroups have handed it back."""
        q_bar, k_full, v_full, k_empty, v_empty = bars
        slots: gl.constexpr = k_slots.type.shape[0]
        block_n: gl.constexpr = k_desc.block_type.shape[2]
        mbarrier.expect(q_bar, q_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_bar, q_smem)
        for i in range(gl.cdiv(end, block_n)):
            slot = i % slots
            phase = (i // slots) & 1
            # a fresh mbarrier counts as having completed the phase before its first: the first round waits not
            mbarrier.wait(k_empty.index(slot), phase ^ 1)
            mbarrier.expect(k_full.index(slot), k_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(k_desc, [b, hk, i * block_n, 0], k_full.index(slot), k_slots.index(slot))
            mbarrier.wait(v_empty.index(slot), phase ^ 1)
            mbarrier.expect(v_full.index(slot), v_desc.block_type.nbytes)
            tma.async_copy_global_to_shared(v_desc, [b, hk, i * block_n, 0], v_full.index(slot), v_slots.index(slot))

    @gluon.jit
    def _weights(s, m_i, start_n, full, queries, nk, reach, scale_log2, s_layout: gl.constexpr):
        """A block's scores into weights P (base 2, against the running max), the new max and the factor the
        running sum and output are rescaled by. Past `full` some keys are hidden from some queries (or past the
        end): query i sees key j when j < nk and j <= i + reach. No key seen yet: shift by 0, not -inf."""
        if start_n >= full:
            keys = start_n + gl.arange(0, s.type.shape[1], layout=gl.SliceLayout(0, s_layout))
            visible = (keys[None, :] < nk) & (keys[None, :] <= queries[:, None] + reach)
            s = gl.where(visible, s * scale_log2, -float("inf"))
            m_new = gl.maximum(m_i, gl.max(s, axis=1))
            m_use = gl.where(m_new == -float("inf"), 0.0, m_new)
            p = gl.exp2(s - m_use[:, None])
        else:   # scale_log2 > 0: the max of the scaled scores is the scaled max
            m_new = gl.maximum(m_i, gl.max(s, axis=1) * scale_log2)
            m_use = m_new
            p = gl.exp2(s * scale_log2 - m_new[:, None])
        return p, m_new, gl.exp2(m_i - m_use)

    @gluon.jit
    def _take_turn(turns, k, order: gl.constexpr, PINGPONG: gl.constexpr):
        """Ping-pong: before its k-th issue of products, an MMA partition waits until the other has issued its
        own k-th (order 1) or (k-1)-th (order 0, which goes first), so that the tensor cores take one warpgroup's
        products while the other exponentiates. A fresh mbarrier counts as having completed the phase before its
        first: order 0's first wait passes."""
        if PINGPONG:
            mbarrier.wait(turns.index(order), (k & 1) ^ (1 - order))

    @gluon.jit
    def _pass_turn(turns, order: gl.constexpr, PINGPONG: gl.constexpr):
        if PINGPONG:
            mbarrier.arrive(turns.index(1 - order), count=1)

    @gluon.jit
    def _attend(o_desc, q, o_staging, k_slots, v_slots, bars, turns, lse_ptr, row, b, h, start_m, full, end, nq, nk,
                reach, scale_log2, order: gl.constexpr, PINGPONG: gl.constexpr, RESCALE_UNDER_S: gl.constexpr):
        """An MMA partition: O and the log-sum-exp of its queries, q's rows (the program's, or where each warpgroup
        is a partition, its half), the first of them start_m. O leaves through the same shared memory (o_staging,
        q's rows as the copy engine takes them): Q is read for the last time before O is written there.
        order: the partition's place in the ping-pong."""
        q_bar, k_full, v_full, k_empty, v_empty = bars
        warps: gl.constexpr = gl.num_warps()
        slots: gl.constexpr = k_slots.type.shape[0]
        block_m: gl.constexpr = q.type.shape[0]   # q: this partition's queries, [rows, head_dim]
        head_d: gl.constexpr = q.type.shape[1]
        block_n: gl.constexpr = k_slots.type.shape[3]
        dtype: gl.constexpr = q.dtype
        # each warp 16 rows of every product: the two warpgroups split the queries, 64 each
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                           instr_shape=[16, block_n, 16])
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1],
                                                           instr_shape=[16, head_d, 16])
        p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
        o_rows: gl.constexpr = gl.SliceLayout(1, o_layout)

        queries = start_m + gl.arange(0, block_m, layout=gl.SliceLayout(1, s_layout))
        m_i = gl.full([block_m], -float("inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([block_m], gl.float32, gl.SliceLayout(1, s_layout))
        acc = gl.zeros([block_m, head_d], gl.float32, o_layout)
        blocks = gl.cdiv(end, block_n)
        mbarrier.wait(q_bar, 0)   # even with no key to walk: no copy into this block's memory outlives it
        if blocks > 0:
            mbarrier.wait(k_full.index(0), 0)
            _take_turn(turns, 0, order, PINGPONG)
            s = warpgroup_mma(q, k_slots.index(0).reshape([block_n, head_d]).permute((1, 0)),
                              gl.zeros([block_m, block_n], gl.float32, s_layout), use_acc=False, is_async=True)
            _pass_turn(turns, order, PINGPONG)
            s = warpgroup_mma_wait(0, deps=(s, ))
            mbarrier.arrive(k_empty.index(0), count=1)
            p, m_i, alpha = _weights(s, m_i, 0, full, queries, nk, reach, scale_log2, s_layout)
            # the sum of P as computed, then P in the values' dtype for the tensor cores. Summing the rounded P (the
            # weights O is divided by then add up to exactly 1) converted each weight back on the softmax's path:
            # slower where timed (benchmarks/results/h200-attention.md, run 5)
            l_i = gl.sum(p, axis=1)
            p = p.to(dtype)
            for j in range(1, blocks):
                slot = j % slots
                last = (j - 1) % slots
                mbarrier.wait(k_full.index(slot), (j // slots) & 1)
                _take_turn(turns, j, order, PINGPONG)
                s = warpgroup_mma(q, k_slots.index(slot).reshape([block_n, head_d]).permute((1, 0)), s,
                                  use_acc=False, is_async=True)
                if RESCALE_UNDER_S:   # by block j-1's factor, as S runs
                    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
                mbarrier.wait(v_full.index(last), ((j - 1) // slots) & 1)
                p_operand = gl.convert_layout(p, p_layout)
                acc = warpgroup_mma(p_operand, v_slots.index(last).reshape([block_n, head_d]), acc, is_async=True)
                _pass_turn(turns, order, PINGPONG)
                s = warpgroup_mma_wait(1, deps=(s, ))   # block j's scores; block j-1's P V may still be running
                mbarrier.arrive(k_empty.index(slot), count=1)
                p, m_i, alpha = _weights(s, m_i, j * block_n, full, queries, nk, reach, scale_log2, s_layout)
                l_i = l_i * alpha + gl.sum(p, axis=1)
                p = p.to(dtype)
                # the product read P from registers as it ran: they stay P's until it has retired
                acc, p_operand = warpgroup_mma_wait(0, deps=(acc, p_operand))
                mbarrier.arrive(v_empty.index(last), count=1)
                if not RESCALE_UNDER_S:   # by block j's factor, now that P V has retired
                    acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            last = (blocks - 1) % slots
            mbarrier.wait(v_full.index(last), ((blocks - 1) // slots) & 1)
            p_operand = gl.convert_layout(p, p_layout)
            if RESCALE_UNDER_S:   # the last block's factor, not yet applied
                acc = acc * gl.convert_layout(alpha, o_rows)[:, None]
            _take_turn(turns, blocks, order, PINGPONG)
            acc = warpgroup_mma(p_operand, v_slots.index(last).reshape([block_n, head_d]), acc, is_async=True)
            _pass_turn(turns, order, PINGPONG)
            acc, p_operand = warpgroup_mma_wait(0, deps=(acc, p_operand))
        seen = l_i > 0.0
        o_seen = gl.convert_layout(seen, o_rows)[:, None]
        # a row that sees no key is zeros, whatever the hidden keys' values (0 x inf would be nan)
        out = gl.where(o_seen, acc / gl.convert_layout(gl.where(seen, l_i, 1.0), o_rows)[:, None], 0.0)
        q.store(out.to(dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(o_desc, [b, h, start_m, 0], o_staging)   # rows past nq are dropped
        lse = gl.where(seen, (m_i + gl.log2(gl.where(seen, l_i, 1.0))) * 0.6931471805599453, -float("inf"))
        gl.store(lse_ptr + row.to(gl.int64) * nq + queries, lse, mask=queries < nq)
        tma.store_wait(0)

    @gluon.jit
    def attention_forward_sm90_kernel(q_desc, k_desc, v_desc, o_desc, lse_ptr, heads, group, nq, nk, scale_log2,
                                      CAUSAL: gl.constexpr, STAGES: gl.constexpr, MMA_PARTS: gl.constexpr,
                                      PINGPONG: gl.constexpr, RESCALE_UNDER_S: gl.constexpr,
                                      MMA_REGISTERS: gl.constexpr):
        """Program (query block, batch x head). scale_log2 = scale log2(e) > 0. The MMA warpgroups are one partition
        (MMA_PARTS 1: they share its barriers and move in lockstep) or one each (2: each waits only on its own
        work, and the warp schedulers interleave one's softmax with the other's products); o_desc's blocks are one
        partition's rows."""
        block_m: gl.constexpr = q_desc.block_type.shape[2]
        block_n: gl.constexpr = k_desc.block_type.shape[2]
        # the last query blocks first: causal, they have the most keys to walk, and the short ones fill the tail
        start_m = (gl.num_programs(0) - 1 - gl.program_id(0)) * block_m
        row = gl.program_id(1)
        b = row // heads
        h = row % heads
        if CAUSAL:   # keys [0, full) every query of the block sees, [full, end) some
            end = gl.minimum(nk, gl.maximum(start_m + block_m + nk - nq, 0))
            full = gl.maximum(gl.minimum(nk, start_m + 1 + nk - nq), 0) // block_n * block_n
            reach = nk - nq
        else:
            end = nk
            full = nk // block_n * block_n
            reach = nk
        q_smem = gl.allocate_shared_memory(q_desc.dtype, q_desc.block_type.shape, q_desc.layout)
        k_slots = gl.allocate_shared_memory(k_desc.dtype, [STAGES] + k_desc.block_type.shape, k_desc.layout)
        v_slots = gl.allocate_shared_memory(v_desc.dtype, [STAGES] + v_desc.block_type.shape, v_desc.layout)
        q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        k_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        # (16 bytes, used only in turns: every partition takes the same arguments)
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        mbarrier.init(q_bar, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(k_full.index(i), count=1)
            mbarrier.init(v_full.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=MMA_PARTS)   # free once every MMA partition has read it
            mbarrier.init(v_empty.index(i), count=MMA_PARTS)
        for i in gl.static_range(2):
            mbarrier.init(turns.index(i), count=1)
        fence_async_shared()   # the initialized barriers seen by the copy engine before its first copy
        bars = (q_bar, k_full, v_full, k_empty, v_empty)
        rows: gl.constexpr = block_m // MMA_PARTS
        pingpong: gl.constexpr = PINGPONG and MMA_PARTS == 2
        loads = (q_desc, k_desc, v_desc, q_smem, k_slots, v_slots, bars, b, h, h // group, start_m, end)
        q_rows = q_smem.reshape([block_m, q_desc.block_type.shape[3]])   # slices cannot be reshaped: both views
        first = (o_desc, q_rows.slice(0, rows), q_smem.slice(0, rows, dim=2), k_slots, v_slots, bars, turns, lse_ptr,
                 row, b, h, start_m, full, end, nq, nk, reach, scale_log2, 0, pingpong, RESCALE_UNDER_S)
        # Triton 3.6 builds the default partition outside the kernel's module, where a reduction cannot tell its
        # warps: the producer takes it (the kernel's num_warps), the MMA warpgroups are worker partitions
        if MMA_PARTS == 1:
            gl.warp_specialize([(_loads, loads), (_attend, first)], [8], [MMA_REGISTERS])
        else:
            second = (o_desc, q_rows.slice(rows, rows), q_smem.slice(rows, rows, dim=2), k_slots, v_slots, bars,
                      turns, lse_ptr, row, b, h, start_m + rows, full, end, nq, nk, reach, scale_log2, 1, pingpong,
                      RESCALE_UNDER_S)
            gl.warp_specialize([(_loads, loads), (_attend, first), (_attend, second)], [4, 4],
                               [MMA_REGISTERS, MMA_REGISTERS])


def supports(q: torch.Tensor, k: torch.Tensor, scale: float) -> bool:
    """Whether this forward takes these inputs (the tiled one takes the rest)."""
    return (gluon is not None and not interpreting() and q.is_cuda and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[3] in HEAD_DIMS and scale > 0
            and torch.cuda.get_device_capability(q.device) == (9, 0))


def _layout(d: int, dtype: torch.dtype, rows: int):
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], element)


class Sm90Forward:
    """The launch for q, k, v of given shapes (readable by the copy engine) on a Hopper GPU: (O, log-sum-exp).
    scale_log2: the softmax scale times log2(e)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale_log2: float):
        batch, heads, nq, d = q.shape
        self.d, self.causal = d, causal
        self.grid = (cdiv(nq, BLOCK_M), batch * heads)
        self.args = (heads, heads // k.shape[1], nq, k.shape[2], scale_log2)
        self.parts, self.pingpong, self.rescale, self.stages = MMA_PARTS, PINGPONG, RESCALE_UNDER_S, STAGES[d]
        self.o_rows = BLOCK_M // self.parts   # O leaves by the copy engine a partition's rows at a time
        self.layouts = {rows: _layout(d, q.dtype, rows) for rows in {BLOCK_M, BLOCK_N, self.o_rows}}

    def _descriptor(self, t: torch.Tensor, rows: int):
        return tma_descriptor(t, [1, 1, rows, self.d], layout=self.layouts[rows])

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        recorder = _eager_node.recording.recorder
        if recorder is not None:   # Triton's launcher, not a Launch: nothing a replay could repeat
            recorder.refuse("flash_attention's sm_90 forward launches through Triton's JIT")
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
        with torch.cuda.device(q.device):
            attention_forward_sm90_kernel[self.grid](
                self._descriptor(q, BLOCK_M), self._descriptor(k, BLOCK_N), self._descriptor(v, BLOCK_N),
                self._descriptor(o, self.o_rows), lse, *self.args, CAUSAL=self.causal, STAGES=self.stages,
                MMA_PARTS=self.parts, PINGPONG=self.pingpong, RESCALE_UNDER_S=self.rescale,
                MMA_REGISTERS=MMA_REGISTERS, num_warps=LOAD_WARPS,
                maxnreg=MAX_REGISTERS)
        return o, lse

