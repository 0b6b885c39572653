"""flash_attention's forward and backward for Hopper (sm_90), written in Gluon with FlashAttention-3's structure.

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

The backward makes five products a tile where the tiled one (attention.py) makes seven: a program holds 128 keys
(64 for each MMA warpgroup) and walks the queries 64 at a time, every query head of its key head:

    a producer warpgroup      brings each step's Q and dO blocks, and their queries' log-sum-exp (base 2) and delta
                              from padded copies, through the copy engine into a ring of slots; and adds each step's
                              dQ, which the MMA warpgroups leave in shared memory, into an fp32 buffer in memory
                              (red.global.add.v4.f32, 16 bytes an add), while the next step's blocks load
    two MMA warpgroups        one partition, 232 registers a thread (the producer keeps 40): S^T = K Q^T and
                              dP^T = V dO^T, P^T and dS^T = P^T (dP^T - delta) in registers, dV += P^T dO and
                              dK += dS^T Q with P^T and dS^T as A operands from registers, then dQ = dS K with dS^T
                              from shared memory (both warpgroups' keys: a barrier between them)

dQ is added up across the programs of a key head by atomic adds, so it is not the same bit for bit from run to
run; where torch.use_deterministic_algorithms is on, the tiled backward runs. A last pass rounds dQ to q's dtype.

flash_attention takes them where `routed` says (attention.SM90_ATTENTION: ROOFLINE_SM90_ATTENTION=auto, the
default). On an H200 (benchmarks/results/h200-attention.md), at head dim 128 the forward is faster than the tiled
forward, alone and as eager code calls it (from 1024 keys), and level with cuDNN's only at the longest sequences;
the backward is faster than the tiled backward and slower than cuDNN's; together they made transformers' Llama
(heads of 128) train 1.016x faster than with the tiled kernels at 4 x 2048 tokens, 1.021x at 2 x 4096. At head
dim 64 neither is faster than the tiled one.
"""

from __future__ import annotations

import torch

from roofline.ops._common import cdiv, hopper, interpreting
from roofline.ops._launch import Launch

try:   # Gluon ships with Triton 3.5 and later
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma,
                                                                   warpgroup_mma, warpgroup_mma_wait)
except ImportError:
    gluon = None

HEAD_DIMS = (64, 128)
# Where flash_attention takes them: the head dims the forward and the backward were timed faster than the tiled ones
# at (benchmarks/results/h200-attention.md; the forward slower at 64, the backward not faster; tune_ops and the
# tests route both), and unless ROOFLINE_SM90_ATTENTION=1 from this many queries and keys: the shortest length
# measured at which they were faster alone, as eager code calls them and in a whole program (on the H200, run 13,
# replayed from C++). At 1024 the GPU's time and eager calls were level with the tiled kernels'.
ROUTED_HEAD_DIMS = (128,)
ROUTED_MIN_LENGTH = 2048
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
MMA_REGISTERS = 240   # a thread of the MMA warpgroups; Triton leaves the producer's warpgroup the rest, 24
# At launch, a thread of each of the 12 warps: 168 x 384 threads = 24 x 128 + 240 x 256, the whole budget that
# setmaxnreg moves between the partitions. A launch with fewer would leave the MMA warpgroups' request for 240
# waiting on registers that never free (the CPU test holds the compile to exactly this many)
MAX_REGISTERS = 168

# The backward: queries a step walks, keys a program holds (64 for each MMA warpgroup), slots in the producer's ring
BWD_BLOCK_M = 64
BWD_BLOCK_N = 128
BWD_STAGES = {64: 2, 128: 2}
# Registers a thread of the producer's warpgroup (which adds dQ into memory, four floats at a time) and of the MMA
# warpgroups: 40 x 128 + 232 x 256 = 168 x 384, the same budget as the forward's. The kernel asks for the MMA
# warpgroups' share; Triton gives the producer the rest (the CPU test checks both in the machine code)
BWD_LOAD_REGISTERS, BWD_MMA_REGISTERS = 40, 232
# The per-query values come in blocks of BWD_BLOCK_M through a descriptor of rank 1 (no swizzle)
VECTOR_LAYOUT = None if gluon is None else gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=1)


if gluon is not None:

    @gluon.constexpr_function
    def _rows_by_warp(warps, columns):
        """A product's accumulator layout (wgmma's) where each of `warps` warps holds 16 rows and every column."""
        return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps, 1], instr_shape=[16, columns, 16])

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
        s_layout: gl.constexpr = _rows_by_warp(warps, block_n)
        o_layout: gl.constexpr = _rows_by_warp(warps, head_d)
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

    @gluon.jit
    def _add_quads(ptrs, values, mask):
        """values added into memory four neighbouring floats at a time: one 16-byte add (red.global.add.v4.f32,
        sm_90) where tl.atomic_add makes four of 4 bytes."""
        return gl.inline_asm_elementwise(
            asm="{ .reg .pred p; setp.ne.b32 p, $12, 0; "
                "@p red.relaxed.gpu.global.add.v4.f32 [$4], {$8, $9, $10, $11}; "
                "mov.b32 $0, 0; mov.b32 $1, 0; mov.b32 $2, 0; mov.b32 $3, 0; }",
            constraints="=r,=r,=r,=r,l,l,l,l,f,f,f,f,r,r,r,r",
            args=[ptrs.to(gl.int64, bitcast=True), values, mask.to(gl.int32)], dtype=gl.int32, is_pure=False,
            pack=4)

    @gluon.jit
    def _add_dq(dq_smem, dq_ptr, row, start_m, nq):
        """The producer: a step's dQ, left in shared memory by the MMA warpgroups, added into the fp32 rows
        [start_m, start_m + block) of dq_ptr's head `row`, 8 rows at a time (a thread four neighbouring floats,
        no element twice), rows past nq dropped."""
        block_m: gl.constexpr = dq_smem.type.shape[0]
        head_d: gl.constexpr = dq_smem.type.shape[1]
        threads_a_row: gl.constexpr = 32 if head_d >= 128 else head_d // 4
        layout: gl.constexpr = gl.BlockedLayout([1, 4], [32 // threads_a_row, threads_a_row], [gl.num_warps(), 1],
                                                [1, 0])
        columns = gl.arange(0, head_d, layout=gl.SliceLayout(0, layout))
        for r in gl.static_range(0, block_m, 8):
            queries = start_m + r + gl.arange(0, 8, layout=gl.SliceLayout(1, layout))
            _add_quads(dq_ptr + (row * nq + queries[:, None]) * head_d + columns[None, :],
                       dq_smem.slice(r, 8, dim=0).load(layout), queries[:, None] < nq)

    @gluon.jit
    def _step(i, hk, group, first, blocks, block_m: gl.constexpr):
        """(query head, first query) of a program's step i: every query block of each query head of its key head
        in turn, from the first query that sees its keys."""
        return hk * group + i // blocks, first + (i % blocks) * block_m

    @gluon.jit
    def _backward_loads(descs, q_slots, do_slots, lse_slots, delta_slots, k_smem, v_smem, dq_smem, bars, dq_ptr, b,
                        hk, heads, group, start_n, first, blocks, nq, nq_pad):
        """The producer: K and V once, then each step's Q, dO and their per-query values into the ring; and the
        dQ of each step, once the MMA warpgroups have left it in shared memory, into memory, while the next
        step's blocks load."""
        q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc = descs
        kv_bar, q_full, do_full, empty, dq_full, dq_empty = bars
        slots: gl.constexpr = q_slots.type.shape[0]
        block_m: gl.constexpr = q_desc.block_type.shape[2]
        mbarrier.expect(kv_bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [b, hk, start_n, 0], kv_bar, k_smem)
        tma.async_copy_global_to_shared(v_desc, [b, hk, start_n, 0], kv_bar, v_smem)
        steps = group * blocks
        for i in range(steps + 1):   # step i's blocks, then step i-1's dQ
            if i < steps:
                slot = i % slots
                h, start_m = _step(i, hk, group, first, blocks, block_m)
                row = b * heads + h
                # a fresh mbarrier counts as having completed the phase before its first: the first round waits not
                mbarrier.wait(empty.index(slot), ((i // slots) & 1) ^ 1)
                mbarrier.expect(q_full.index(slot), q_desc.block_type.nbytes + lse_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(q_desc, [b, h, start_m, 0], q_full.index(slot), q_slots.index(slot))
                tma.async_copy_global_to_shared(lse_desc, [row * nq_pad + start_m], q_full.index(slot),
                                                lse_slots.index(slot))
                mbarrier.expect(do_full.index(slot), do_desc.block_type.nbytes + delta_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(do_desc, [b, h, start_m, 0], do_full.index(slot),
                                                do_slots.index(slot))
                tma.async_copy_global_to_shared(delta_desc, [row * nq_pad + start_m], do_full.index(slot),
                                                delta_slots.index(slot))
            if i > 0:
                h, start_m = _step(i - 1, hk, group, first, blocks, block_m)
                mbarrier.wait(dq_full, (i - 1) & 1)
                _add_dq(dq_smem, dq_ptr, (b * heads + h).to(gl.int64), start_m, nq)
                mbarrier.arrive(dq_empty, count=1)

    @gluon.jit
    def _backward_products(dk_desc, dv_desc, q_slots, do_slots, lse_slots, delta_slots, k_smem, v_smem, ds_bufs,
                           dq_smem, bars, b, hk, start_n, full, first, steps, blocks, nq, nk, scale, scale_log2,
                           CAUSAL: gl.constexpr):
        """The MMA warpgroups, one partition: dK and dV of the program's keys over every step, and each step's dQ
        (scaled) into shared memory for the producer."""
        kv_bar, q_full, do_full, empty, dq_full, dq_empty = bars
        warps: gl.constexpr = gl.num_warps()
        slots: gl.constexpr = q_slots.type.shape[0]
        block_m: gl.constexpr = q_slots.type.shape[3]
        head_d: gl.constexpr = q_slots.type.shape[4]
        block_n: gl.constexpr = k_smem.type.shape[2]
        dtype: gl.constexpr = q_slots.dtype
        # S^T and dP^T keys by queries, dK and dV keys by head_dim: each warp 16 keys. dQ queries by head_dim:
        # each MMA warpgroup half of head_dim, over all the program's keys
        st_layout: gl.constexpr = _rows_by_warp(warps, block_m)
        acc_layout: gl.constexpr = _rows_by_warp(warps, head_d)
        operand: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=acc_layout, k_width=2)
        dq_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[warps // 2, 2],
                                                            instr_shape=[16, head_d // 2, 16])
        columns: gl.constexpr = gl.SliceLayout(0, st_layout)
        k_tile = k_smem.reshape([block_n, head_d])
        v_tile = v_smem.reshape([block_n, head_d])
        keys = start_n + gl.arange(0, block_n, layout=gl.SliceLayout(1, st_layout))
        dk = gl.zeros([block_n, head_d], gl.float32, acc_layout)
        dv = gl.zeros([block_n, head_d], gl.float32, acc_layout)
        zeros = gl.zeros([block_n, block_m], gl.float32, st_layout)
        mbarrier.wait(kv_bar, 0)
        for i in range(steps):
            slot = i % slots
            phase = (i // slots) & 1
            start_m = first + (i % blocks) * block_m
            q_tile = q_slots.index(slot).reshape([block_m, head_d])
            do_tile = do_slots.index(slot).reshape([block_m, head_d])
            mbarrier.wait(q_full.index(slot), phase)
            st = warpgroup_mma(k_tile, q_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
            mbarrier.wait(do_full.index(slot), phase)
            dpt = warpgroup_mma(v_tile, do_tile.permute((1, 0)), zeros, use_acc=False, is_async=True)
            st = warpgroup_mma_wait(1, deps=(st, ))
            pt = gl.exp2(st * scale_log2 - lse_slots.index(slot).load(columns)[None, :])
            if start_m < full:   # some queries of this block see only some of the keys
                queries = start_m + gl.arange(0, block_m, layout=columns)
                visible = (keys[:, None] < nk) & (queries[None, :] >= 0)   # (the second: both of its shape)
                if CAUSAL:
                    visible = visible & (keys[:, None] <= queries[None, :] + (nk - nq))
                pt = gl.where(visible, pt, 0.0)
            dpt = warpgroup_mma_wait(0, deps=(dpt, ))
            dst = pt * (dpt - delta_slots.index(slot).load(columns)[None, :])
            pt = gl.convert_layout(pt.to(dtype), operand)
            dv = warpgroup_mma(pt, do_tile, dv, is_async=True)
            ds_operand = gl.convert_layout(dst.to(dtype), operand)
            dk = warpgroup_mma(ds_operand, q_tile, dk, is_async=True)
            # dS for dQ = dS K, scaled here so that dQ leaves the products final; in two buffers in turn: the one
            # written now was last read two steps ago, before the barrier of the step between
            ds_buf = ds_bufs.index(i % 2)
            ds_buf.store((dst * scale).to(dtype))
            fence_async_shared()
            gl.thread_barrier()   # both warpgroups' keys of dS^T in shared memory before either multiplies dS K
            dq = warpgroup_mma(ds_buf.permute((1, 0)), k_tile, gl.zeros([block_m, head_d], gl.float32, dq_layout),
                               use_acc=False, is_async=True)
            dq, dk, dv, pt, ds_operand = warpgroup_mma_wait(0, deps=(dq, dk, dv, pt, ds_operand))
            mbarrier.arrive(empty.index(slot), count=1)
            mbarrier.wait(dq_empty, (i & 1) ^ 1)
            dq_smem.store(dq)
            gl.thread_barrier()   # every warp's part of dQ written before the producer reads it
            mbarrier.arrive(dq_full, count=1)
        gl.thread_barrier()   # every product reading K and V retired before dK and dV take their memory
        k_tile.store((dk * scale).to(dtype))
        v_tile.store(dv.to(dtype))
        fence_async_shared()
        gl.thread_barrier()
        tma.async_copy_shared_to_global(dk_desc, [b, hk, start_n, 0], k_smem)
        tma.async_copy_shared_to_global(dv_desc, [b, hk, start_n, 0], v_smem)
        tma.store_wait(0)

    @gluon.jit
    def attention_backward_sm90_kernel(q_desc, k_desc, v_desc, do_desc, dk_desc, dv_desc, lse_desc, delta_desc,
                                       dq_ptr, heads, kv_heads, group, nq, nq_pad, nk, scale, scale_log2,
                                       CAUSAL: gl.constexpr, STAGES: gl.constexpr, MMA_REGISTERS: gl.constexpr):
        """Program (key block, batch x key head): dK and dV of its keys, and its share of every query's dQ added
        into dq_ptr (fp32, zeros before). lse_desc, delta_desc: the log-sum-exp in base 2 and delta of each query,
        rows padded to nq_pad with zeros. scale_log2 = scale log2(e)."""
        block_m: gl.constexpr = q_desc.block_type.shape[2]
        block_n: gl.constexpr = k_desc.block_type.shape[2]
        head_d: gl.constexpr = q_desc.block_type.shape[3]
        start_n = gl.program_id(0) * block_n
        b = gl.program_id(1) // kv_heads
        hk = gl.program_id(1) % kv_heads
        if CAUSAL:   # queries [first, full) see some of the keys (masked), [full, nq) all of them
            first = gl.maximum(start_n - (nk - nq), 0) // block_m * block_m
            full = gl.minimum(gl.cdiv(gl.maximum(start_n + block_n - 1 - (nk - nq), 0), block_m) * block_m, nq)
        else:   # every query sees every key; a block running past nk masks them all (the copy engine's zero keys
            # would weigh exp2(-lse) each, inf for a log-sum-exp below -128, and inf x 0 is nan in dQ)
            first = 0
            full = gl.where(start_n + block_n > nk, nq, 0)
        blocks = gl.cdiv(nq - first, block_m)
        q_slots = gl.allocate_shared_memory(q_desc.dtype, [STAGES] + q_desc.block_type.shape, q_desc.layout)
        do_slots = gl.allocate_shared_memory(do_desc.dtype, [STAGES] + do_desc.block_type.shape, do_desc.layout)
        lse_slots = gl.allocate_shared_memory(gl.float32, [STAGES] + lse_desc.block_type.shape, lse_desc.layout)
        delta_slots = gl.allocate_shared_memory(gl.float32, [STAGES] + delta_desc.block_type.shape,
                                                delta_desc.layout)
        k_smem = gl.allocate_shared_memory(k_desc.dtype, k_desc.block_type.shape, k_desc.layout)
        v_smem = gl.allocate_shared_memory(v_desc.dtype, v_desc.block_type.shape, v_desc.layout)
        ds_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([block_n, block_m], q_desc.dtype)
        ds_bufs = gl.allocate_shared_memory(q_desc.dtype, [2, block_n, block_m], ds_layout)
        dq_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([block_m, head_d], gl.float32)
        dq_smem = gl.allocate_shared_memory(gl.float32, [block_m, head_d], dq_layout)
        kv_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        q_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        do_full = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        dq_full = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        dq_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(kv_bar, count=1)
        mbarrier.init(dq_full, count=1)
        mbarrier.init(dq_empty, count=1)
        for i in gl.static_range(STAGES):
            mbarrier.init(q_full.index(i), count=1)
            mbarrier.init(do_full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()   # the initialized barriers seen by the copy engine before its first copy
        bars = (kv_bar, q_full, do_full, empty, dq_full, dq_empty)
        descs = (q_desc, k_desc, v_desc, do_desc, lse_desc, delta_desc)
        loads = (descs, q_slots, do_slots, lse_slots, delta_slots, k_smem, v_smem, dq_smem, bars, dq_ptr, b, hk,
                 heads, group, start_n, first, blocks, nq, nq_pad)
        products = (dk_desc, dv_desc, q_slots, do_slots, lse_slots, delta_slots, k_smem, v_smem, ds_bufs, dq_smem,
                    bars, b, hk, start_n, full, first, group * blocks, blocks, nq, nk, scale, scale_log2, CAUSAL)
        gl.warp_specialize([(_backward_loads, loads), (_backward_products, products)], [8], [MMA_REGISTERS])


def routed(d: int, nq: int, nk: int, every_length: bool) -> bool:
    """Whether flash_attention takes these kernels at head dim d, nq queries and nk keys (where they take the
    inputs: supports)."""
    return d in ROUTED_HEAD_DIMS and (every_length or min(nq, nk) >= ROUTED_MIN_LENGTH)


def supports(q: torch.Tensor, k: torch.Tensor, scale: float, backward: bool = False) -> bool:
    """Whether this forward (or the backward) takes these inputs (the tiled ones take the rest). The forward's
    softmax takes the max of the scaled scores as the scaled max: a positive scale."""
    return (gluon is not None and not interpreting() and q.dtype in (torch.bfloat16, torch.float16)
            and q.shape[3] in HEAD_DIMS and (backward or scale > 0) and hopper(q.device))


def _layout(d: int, dtype: torch.dtype, rows: int):
    element = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[dtype]
    return gl.NVMMASharedLayout.get_default_for([1, 1, rows, d], element)


def _head_block(d: int, dtype: torch.dtype, rows: int) -> tuple:
    """A Launch's descriptor spec for a (batch, heads, seq, head_dim) tensor copied `rows` rows of a head at a
    time."""
    return [1, 1, rows, d], None, None, _layout(d, dtype, rows)


class Sm90Forward:
    """The launch for q, k, v of given shapes and strides (readable by the copy engine) on a Hopper GPU: (O,
    log-sum-exp). scale_log2: the softmax scale times log2(e). Launched as the tiled kernels are (a Launch: by the
    compiled kernel's own launcher after the first call, not through the JIT)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale_log2: float):
        batch, heads, nq, d = q.shape
        self.args = (heads, heads // k.shape[1], nq, k.shape[2], scale_log2)
        o_rows = BLOCK_M // MMA_PARTS   # O leaves by the copy engine a partition's rows at a time
        self.launch = Launch(
            attention_forward_sm90_kernel, (cdiv(nq, BLOCK_M), batch * heads), q.device.index,
            descriptors={0: _head_block(d, q.dtype, BLOCK_M), 1: _head_block(d, q.dtype, BLOCK_N),
                         2: _head_block(d, q.dtype, BLOCK_N), 3: _head_block(d, q.dtype, o_rows)},
            CAUSAL=causal, STAGES=STAGES[d], MMA_PARTS=MMA_PARTS, PINGPONG=PINGPONG, RESCALE_UNDER_S=RESCALE_UNDER_S,
            MMA_REGISTERS=MMA_REGISTERS, num_warps=LOAD_WARPS, maxnreg=MAX_REGISTERS)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        o = torch.empty_like(q)
        lse = torch.empty(q.shape[:3], device=q.device, dtype=torch.float32)
        self.launch(q, k, v, o, lse, *self.args)
        return o, lse


class Sm90Backward:
    """The backward's launches for q, k, v of given shapes and strides (readable by the copy engine) on a Hopper
    GPU: (dQ, dK, dV) from dO, O and the forward's log-sum-exp. per_query(dO's strides): attention.py's pre-pass
    for a dO of those strides, which writes delta = rowsum(dO O) and the log-sum-exp in base 2 into rows padded to
    whole blocks of BWD_BLOCK_M queries (its own blocks a multiple of them: zeros past nq). scale_log2: the softmax
    scale times log2(e). A Launch for each layout of dO (its descriptor holds dO's strides)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, causal: bool, scale: float, scale_log2: float, per_query):
        batch, heads, nq, d = q.shape
        self.per_query = per_query
        self.rows, self.nq, self.heads = batch * heads, nq, heads
        self.nq_pad = cdiv(nq, BWD_BLOCK_M) * BWD_BLOCK_M
        self.grid = (cdiv(k.shape[2], BWD_BLOCK_N), batch * k.shape[1])
        self.args = (heads, k.shape[1], heads // k.shape[1], nq, self.nq_pad, k.shape[2], scale, scale_log2)
        queries, keys = _head_block(d, q.dtype, BWD_BLOCK_M), _head_block(d, q.dtype, BWD_BLOCK_N)
        # the per-query values' padded rows, end to end, copied BWD_BLOCK_M at a time
        per_query_rows = ([BWD_BLOCK_M], [self.rows * self.nq_pad], [1], VECTOR_LAYOUT)
        self.descriptors = {0: queries, 1: keys, 2: keys, 3: queries, 4: keys, 5: keys, 6: per_query_rows,
                            7: per_query_rows}
        self.settings = dict(CAUSAL=causal, STAGES=BWD_STAGES[d], MMA_REGISTERS=BWD_MMA_REGISTERS,
                             num_warps=LOAD_WARPS, maxnreg=MAX_REGISTERS)
        self.device, self.launches = q.device.index, {}

    def _launch(self, do_strides) -> Launch:
        launch = self.launches.get(do_strides)
        if launch is None:
            launch = self.launches[do_strides] = Launch(attention_backward_sm90_kernel, self.grid, self.device,
                                                        descriptors=self.descriptors, **self.settings)
        return launch

    def __call__(self, do, q, k, v, o, lse) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        lse2, delta = (torch.empty(self.rows, self.nq_pad, device=q.device, dtype=torch.float32) for _ in range(2))
        self.per_query(do.stride())(o, do, delta, lse, lse2, self.heads, self.nq, self.nq_pad)
        dq = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        self._launch(do.stride())(q, k, v, do, dk, dv, lse2, delta, dq, *self.args)
        return dq.to(q.dtype), dk, dv
