"""flash_attention's Hopper forward (attention_sm90.py): compiled here for sm_90 as a launch on the H100 compiles
it, the design checked in its machine code; its numbers on the GPU, against float64 (the `gpu` tests)."""

import collections
import faulthandler
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from ops_checks import DEVICE, assert_within_twice_torchs_error, outputs_and_grads

from roofline.inspect import sass
from roofline.ops import _eager_node
from roofline.ops import attention_sm90 as sm90
from roofline.ops._launch import clear_plans
from roofline.ops.attention import attention_reference, flash_attention

attention_module = importlib.import_module("roofline.ops.attention")
SHARED_MEMORY_LIMIT = 227 * 1024   # what a block may hold on the H100
DEADLOCK_S = 300   # a GPU test of the forward takes seconds (its first compile included)

pytestmark = pytest.mark.skipif(sm90.gluon is None, reason="Gluon ships with Triton 3.5 and later")


# (MMA partitions, ping-pong): one partition of both MMA warpgroups, a partition each, a partition each in turns
VARIANTS = [(1, False), (2, False), (2, True)]


def _compiled(d: int, causal: bool, parts: int, pingpong: bool, stages: int, rescale_under_s: bool = False):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def descriptor(rows):
        return f"tensordesc<bf16[1, 1, {rows}, {d}],{sm90._layout(d, torch.bfloat16, rows)!r}>"

    signature = {"q_desc": descriptor(sm90.BLOCK_M), "k_desc": descriptor(sm90.BLOCK_N),
                 "v_desc": descriptor(sm90.BLOCK_N), "o_desc": descriptor(sm90.BLOCK_M // parts), "lse_ptr": "*fp32",
                 "heads": "i32", "group": "i32", "nq": "i32", "nk": "i32", "scale_log2": "fp32",
                 "CAUSAL": "constexpr", "STAGES": "constexpr", "MMA_PARTS": "constexpr", "PINGPONG": "constexpr",
                 "RESCALE_UNDER_S": "constexpr", "MMA_REGISTERS": "constexpr"}
    constexprs = {"CAUSAL": causal, "STAGES": stages, "MMA_PARTS": parts, "PINGPONG": pingpong,
                  "RESCALE_UNDER_S": rescale_under_s, "MMA_REGISTERS": sm90.MMA_REGISTERS}
    source = GluonASTSource(sm90.attention_forward_sm90_kernel, signature, constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": sm90.LOAD_WARPS, "maxnreg": sm90.MAX_REGISTERS})


def _summary(kernel) -> tuple[dict, list]:
    """Warps, registers, local and shared memory and opcode counts of a kernel compiled for sm_90, and its SASS."""
    used = sass.resources(kernel.asm["cubin"])[kernel.metadata.name]
    code = sass.parse_disassembly(sass.disassemble(kernel.asm["cubin"]))
    return {"warps": kernel.metadata.num_warps, "registers": used.registers, "local": used.local_memory,
            "shared": kernel.metadata.shared + used.static_shared_bytes,
            "ops": collections.Counter(x.base for x in code)}, code


def _machine_code() -> dict:
    """For each head dim and causal or not: the forward's _summary, and whether each copy of O out waits for every
    warp's write of it (run in a process where Triton compiles: the tests' interprets)."""
    out = {}
    for d in sm90.HEAD_DIMS:
        for causal in (False, True):
            for parts, pingpong in VARIANTS:
                summary, code = _summary(_compiled(d, causal, parts, pingpong, sm90.STAGES[d]))
                barriers = []   # for each copy of O out: a barrier after the last shared-memory write before it
                for store in (i for i, x in enumerate(code) if x.base == "UTMASTG"):
                    last_write = max(i for i, x in enumerate(code[:store]) if x.base in ("STS", "STSM"))
                    barriers.append(any(x.opcode.startswith("BAR.SYNC") for x in code[last_write:store]))
                out[f"{d},{causal},{parts},{pingpong}"] = {**summary, "o_written_then_barrier": barriers}
    return out


def _in_a_compiling_process(call: str):
    """The JSON result of `call`, an expression over this module as `t`, evaluated in a process of its own where
    Triton compiles (the tests' interprets)."""
    child = ("import json, sys; sys.path.insert(0, sys.argv[1]); import test_attention_sm90 as t; "
             f"print(json.dumps({call}))")
    done = subprocess.run([sys.executable, "-c", child, str(Path(__file__).parent)], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"}, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def machine_code():
    return _in_a_compiling_process("t._machine_code()")


@pytest.mark.parametrize("parts,pingpong", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", sm90.HEAD_DIMS)
def test_a_producer_warpgroup_and_two_mma_warpgroups_without_spills(machine_code, d, causal, parts, pingpong):
    """The MMA warpgroups as one partition or as a partition each (in turns or not): the same warps and
    registers, each partition's products, and each partition's O out by the copy engine."""
    kernel = machine_code[f"{d},{causal},{parts},{pingpong}"]
    ops = kernel["ops"]
    assert kernel["warps"] == sm90.LOAD_WARPS + sm90.MMA_WARPS == 12
    # every register of the SM at launch, for setmaxnreg to hand out (fewer: the MMA warpgroups would wait forever)
    assert kernel["registers"] == sm90.MAX_REGISTERS and kernel["local"] == 0   # and nothing spilled
    assert ops.get("USETMAXREG", 0) > 0   # the registers moved from the producer to the MMA warpgroups
    # S = Q K^T and O += P V on the tensor cores, head_dim / 16 and BLOCK_N / 16 wgmmas each, a warpgroup: the
    # first block's S, the loop's S and P V, the last block's P V
    assert ops["HGMMA"] == parts * (2 * (d // 16) + 2 * (sm90.BLOCK_N // 16))
    assert ops["UTMALDG"] == 3 and ops["UTMASTG"] == parts   # Q, K, V in by the copy engine, O out
    # O's copy out waits for every MMA warp's write of it: a barrier the compiler puts there, not the source
    assert kernel["o_written_then_barrier"] == [True] * parts
    assert kernel["shared"] <= SHARED_MEMORY_LIMIT


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", sm90.HEAD_DIMS)
def test_ping_pong_waits_and_passes_a_turn_at_each_issue_of_products(machine_code, d, causal):
    """In turns, each of the two partitions waits for its turn and passes it on at each of its three places that
    issue products (the first S, the loop's S and P V, the last P V): mbarrier operations the other lacks."""
    alone, turns = (machine_code[f"{d},{causal},2,{pingpong}"]["ops"] for pingpong in (False, True))
    assert turns["SYNCS"] - alone["SYNCS"] >= 2 * 3 * 2
    assert turns["HGMMA"] == alone["HGMMA"]


def _one_compiled(d: int, parts: int, pingpong: bool, stages: int, rescale_under_s: bool = False) -> dict:
    """The _summary of one causal variant of the forward."""
    return _in_a_compiling_process(f"t._summary(t._compiled({d}, True, {parts}, {pingpong}, {stages}, "
                                   f"{rescale_under_s}))[0]")


@pytest.mark.parametrize("d", sm90.HEAD_DIMS)
def test_o_rescaled_under_s_compiles_to_the_same_products_without_spills(d):
    """FA3's order (O rescaled while the next S runs): the same registers, products and copies, nothing spilled."""
    kernel = _one_compiled(d, 2, False, sm90.STAGES[d], rescale_under_s=True)
    assert kernel["registers"] == sm90.MAX_REGISTERS and kernel["local"] == 0
    ops = kernel["ops"]
    assert ops["HGMMA"] == 2 * (2 * (d // 16) + 2 * (sm90.BLOCK_N // 16)) and ops["UTMASTG"] == 2


@pytest.mark.parametrize("d", sm90.HEAD_DIMS)
def test_one_more_stage_fits_now_that_o_leaves_through_q_s_memory(d):
    """O is staged in Q's shared memory, so a ring of one more slot than the default still fits a block."""
    kernel = _one_compiled(d, 2, True, sm90.STAGES[d] + 1)
    q, slot = sm90.BLOCK_M * d * 2, sm90.BLOCK_N * d * 2   # bf16 bytes: Q, and a key or value block
    assert q + 2 * (sm90.STAGES[d] + 1) * slot <= kernel["shared"] <= SHARED_MEMORY_LIMIT and kernel["local"] == 0


# --------------------------------------------------------------------------- on a GPU

@pytest.fixture(params=[(1, False, 0, False), (2, False, 0, False), (2, True, 0, False), (2, True, 1, False),
                        (2, False, 0, True)],
                ids=["one MMA partition", "a partition a warpgroup", "in turns", "in turns, one more stage",
                     "O rescaled under S"])
def hopper_forward(monkeypatch, request):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a GPU of compute capability 9.0")
    parts, pingpong, more_stages, rescale_under_s = request.param
    monkeypatch.setattr(sm90, "RESCALE_UNDER_S", rescale_under_s)
    monkeypatch.setattr(attention_module, "SM90_ATTENTION", True)
    monkeypatch.setattr(sm90, "ROUTED_HEAD_DIMS", sm90.HEAD_DIMS)
    monkeypatch.setattr(sm90, "MMA_PARTS", parts)
    monkeypatch.setattr(sm90, "PINGPONG", pingpong)
    monkeypatch.setattr(sm90, "STAGES", {d: n + more_stages for d, n in sm90.STAGES.items()})
    clear_plans()
    # a kernel whose warps wait on each other forever (a barrier's phase wrong) never returns: after this long the
    # run ends with every thread's stack, instead of running into the device call's limit with nothing said
    faulthandler.dump_traceback_later(DEADLOCK_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()
    clear_plans()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 16, 4, 1023, 1023, 128), (1, 8, 8, 4096, 4096, 64), (1, 4, 1, 203, 2048, 128),
                                   (2, 4, 2, 300, 130, 64), (1, 2, 2, 1, 77, 128)])
def test_matches_float64_within_twice_torchs_error(hopper_forward, shape, causal, dtype):
    """The output and, through the Hopper backward, dQ, dK and dV (which read the log-sum-exp the forward saved):
    Nq != Nk both ways (causal with more queries than keys: rows that see no key), grouped heads, lengths off the
    blocks."""
    batch, heads, kv_heads, nq, nk, d = shape
    q = torch.randn(batch, heads, nq, d, device="cuda", dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, nk, d, device="cuda", dtype=dtype) for _ in range(2))
    plan = attention_module._plan(q, k, v, causal, d ** -0.5)
    assert plan.sm90 is not None and plan.sm90_backward is not None   # the Hopper kernels run
    dout = torch.randn_like(q)
    ours = outputs_and_grads(lambda *a: flash_attention(*a, causal, d ** -0.5, backend="triton"), (q, k, v), dout)
    exact = outputs_and_grads(lambda *a: attention_reference(*a, causal), (q, k, v), dout, torch.float64)
    theirs = outputs_and_grads(lambda *a: attention_reference(*a, causal), (q, k, v), dout)
    assert_within_twice_torchs_error(("output", "dq", "dk", "dv"), ours, exact, theirs, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_the_hopper_backward_agrees_with_the_tiled_one_and_yields_to_it_where_asked(hopper_forward, causal):
    """At a language model's size (GQA, lengths off the blocks): the Hopper backward's gradients within bf16's
    rounding of the tiled one's; with deterministic algorithms on, the tiled backward's own, bit for bit."""
    q = torch.randn(2, 8, 1000, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 2, 1000, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    do = torch.randn_like(q)
    assert attention_module._plan(q, k, v, causal, 128 ** -0.5).sm90_backward is not None   # the Hopper one runs
    o, lse = attention_module._forward(q, k, v, causal, 128 ** -0.5)
    hopper = attention_module._backward(do, q, k, v, o, lse, causal, 128 ** -0.5)
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        asked = attention_module._backward(do, q, k, v, o, lse, causal, 128 ** -0.5)
    finally:
        torch.use_deterministic_algorithms(before)
    attention_module.SM90_ATTENTION = False   # (the fixture's monkeypatch puts it back)
    tiled = attention_module._backward(do, q, k, v, o, lse, causal, 128 ** -0.5)
    for ours, theirs, exact in zip(hopper, tiled, asked):
        assert torch.equal(exact, theirs)
        assert torch.allclose(ours.float(), theirs.float(), rtol=1.6e-2, atol=1.6e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_by_default_flash_attention_takes_them_at_a_long_sequence(monkeypatch, causal):
    """ROOFLINE_SM90_ATTENTION=auto (the default), at lengths past ROUTED_MIN_LENGTH (off the blocks, Nq != Nk,
    grouped heads): the public op with autograd, three times (cold, warm, and replayed from C++), output and
    gradients within twice torch's error of float64; the replayed call's output, dK and dV exactly the first's (dQ
    is added by atomics, in any order)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs a GPU of compute capability 9.0")
    monkeypatch.setattr(attention_module, "SM90_ATTENTION", None)
    monkeypatch.setattr(_eager_node, "refusals", {})
    in_python = []   # the Hopper backward's Python path, call by call (a replay launches its kernels from C++)
    python_backward = sm90.Sm90Backward.__call__
    monkeypatch.setattr(sm90.Sm90Backward, "__call__", lambda *a: in_python.append(1) or python_backward(*a))
    clear_plans()
    n, scale = sm90.ROUTED_MIN_LENGTH, 128 ** -0.5
    q = torch.randn(1, 4, n + 37, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 2, n + 200, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    plan = attention_module._plan(q, k, v, causal, scale)   # the plan the calls below take: the same scale
    assert plan.sm90 is not None and plan.sm90_backward is not None
    dout = torch.randn_like(q)
    exact = outputs_and_grads(lambda *a: attention_reference(*a, causal, scale), (q, k, v), dout, torch.float64)
    theirs = outputs_and_grads(lambda *a: attention_reference(*a, causal, scale), (q, k, v), dout)
    faulthandler.dump_traceback_later(DEADLOCK_S, exit=True)
    try:
        calls = []
        for _ in range(3):
            calls.append(outputs_and_grads(lambda *a: flash_attention(*a, causal, scale), (q, k, v), dout))
            assert_within_twice_torchs_error(("output", "dq", "dk", "dv"), calls[-1], exact, theirs, torch.bfloat16)
        assert _eager_node.refusals == {} and len(in_python) < 3, (_eager_node.refusals, len(in_python))
        for name, first, replayed in zip(("output", "dq", "dk", "dv"), calls[0], calls[2]):
            assert name == "dq" or torch.equal(first, replayed), name
    finally:
        faulthandler.cancel_dump_traceback_later()
        clear_plans()


@pytest.mark.gpu
def test_the_hopper_backward_masks_the_keys_past_the_end_and_takes_each_do_layout(hopper_forward):
    """Not causal, keys that end inside a block: the copy engine's zero keys past the end must weigh nothing, even
    where the log-sum-exp is below -128 (a large negative scale: exp2(-lse) would be inf, and inf x 0 nan). And
    one plan's backward given dO of two layouts in turn (a transposed view's gradient is itself transposed)."""
    q = torch.randn(1, 4, 200, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 4, 200, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for scale in (-8.0, 128 ** -0.5):
        assert attention_module._plan(q, k, v, False, scale).sm90_backward is not None
        o, lse = attention_module._forward(q, k, v, False, scale)
        for do in (torch.randn_like(q), torch.randn(1, 200, 4, 128, device="cuda", dtype=q.dtype).transpose(1, 2)):
            hopper = attention_module._backward(do, q, k, v, o, lse, False, scale)
            before = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True)
            try:
                tiled = attention_module._backward(do, q, k, v, o, lse, False, scale)
            finally:
                torch.use_deterministic_algorithms(before)
            for ours, theirs in zip(hopper, tiled):
                assert torch.isfinite(ours).all()
                assert torch.allclose(ours.float(), theirs.float(), rtol=1.6e-2, atol=1.6e-2)


def test_the_setting_is_read_at_each_call(monkeypatch):
    """SM90_ATTENTION set call by call (a benchmark timing both forwards as eager code calls them) takes effect at the
    next call, with no plans cleared: plans and call signatures hold it, auto (None) apart from 1 (True) and 0
    (False)."""
    monkeypatch.setattr(sm90, "supports", lambda *args, **kwargs: True)   # as on a Hopper GPU
    monkeypatch.setattr(sm90, "Sm90Forward", lambda *args: lambda q, k, v: (torch.zeros_like(q),
                                                                            q.new_zeros(q.shape[:3])))
    monkeypatch.setattr(sm90, "Sm90Backward", lambda *args: None)
    monkeypatch.setattr(attention_module, "hopper", lambda device: True)
    clear_plans()
    q, k, v = (torch.randn(1, 2, 16, 128, device=DEVICE) for _ in range(3))   # the tiled kernels run where they can
    try:
        monkeypatch.setattr(sm90, "ROUTED_MIN_LENGTH", 16)   # auto takes these 16 queries and keys
        for setting, on in ((True, True), (False, False), (None, True), (False, False), (None, True)):
            monkeypatch.setattr(attention_module, "SM90_ATTENTION", setting)
            out = flash_attention(q, k, v, False, backend="triton")
            assert bool(out.abs().sum() == 0) is on   # the stand-in's zeros only where it is on
    finally:
        clear_plans()


def test_flash_attention_takes_them_only_at_the_head_dims_they_were_timed_faster(monkeypatch):
    """With ROOFLINE_SM90_ATTENTION=1, head dim 128 (faster than the tiled kernels on the H200); not 64 (the
    forward slower, the backward not faster), though the kernels take it. The backward takes a negative scale,
    the forward not."""
    monkeypatch.setattr(attention_module, "SM90_ATTENTION", True)
    monkeypatch.setattr(sm90, "supports", lambda q, k, scale, backward=False: backward or scale > 0)
    monkeypatch.setattr(sm90, "Sm90Forward", lambda *args: "the Hopper forward")
    monkeypatch.setattr(sm90, "Sm90Backward", lambda *args: "the Hopper backward")
    monkeypatch.setattr(attention_module, "hopper", lambda device: True)   # CPU tensors, on a GPU machine too
    clear_plans()
    try:
        for d, scale, forward, backward in ((128, 0.1, "the Hopper forward", "the Hopper backward"),
                                            (128, -0.1, None, "the Hopper backward"), (64, 0.1, None, None)):
            q, k, v = (torch.randn(1, 2, 16, d) for _ in range(3))
            plan = attention_module._plan(q, k, v, False, scale)
            assert (plan.sm90, plan.sm90_backward) == (forward, backward)
    finally:
        clear_plans()


def test_by_default_they_take_long_sequences_only(monkeypatch):
    """ROOFLINE_SM90_ATTENTION=auto (the default): from ROUTED_MIN_LENGTH queries and keys, the shortest they were
    timed faster at alone, as eager code calls them and in a whole program; not a decoding step's one query, nor a
    short prompt."""
    monkeypatch.setattr(attention_module, "SM90_ATTENTION", None)
    monkeypatch.setattr(sm90, "supports", lambda *args, **kwargs: True)   # as on a Hopper GPU
    monkeypatch.setattr(sm90, "Sm90Forward", lambda *args: "the Hopper forward")
    monkeypatch.setattr(sm90, "Sm90Backward", lambda *args: "the Hopper backward")
    monkeypatch.setattr(attention_module, "hopper", lambda device: True)   # CPU tensors, on a GPU machine too
    clear_plans()
    n = sm90.ROUTED_MIN_LENGTH
    try:
        for nq, nk, d, taken in ((n, n, 128, True), (n, 4 * n, 128, True), (1, 4 * n, 128, False),
                                 (n - 1, n - 1, 128, False), (n, n, 64, False)):
            q = torch.randn(1, 2, nq, d)
            k = v = torch.randn(1, 2, nk, d)
            plan = attention_module._plan(q, k, v, True, d ** -0.5)
            assert (plan.sm90 is not None, plan.sm90_backward is not None) == (taken, taken), (nq, nk, d)
    finally:
        clear_plans()


def test_the_setting_is_auto_1_or_0_and_nothing_else():
    assert [attention_module._sm90_setting(v) for v in ("auto", "1", "0")] == [None, True, False]
    with pytest.raises(ValueError, match="ROOFLINE_SM90_ATTENTION must be auto, 1 or 0, got 'yes'"):
        attention_module._sm90_setting("yes")


def test_their_launches_describe_each_tensor_as_the_compiled_kernels_take_it():
    """Sm90Forward's and Sm90Backward's Launches (past the JIT after the first call) hand the
    kernels Gluon descriptors of the blocks and shared layouts the machine-code tests compile them for; the
    backward's per-query values as one vector of padded rows."""
    bf16, d = torch.bfloat16, 128
    q, o = torch.randn(2, 4, 300, d, dtype=bf16), torch.empty(2, 4, 300, d, dtype=bf16)
    k = torch.randn(2, 2, 200, d, dtype=bf16)
    forward = sm90.Sm90Forward(q, k, True, 0.1)
    args = forward.launch._jit_args((q, k, k, o, torch.empty(2, 4, 300), *forward.args))
    rows = [sm90.BLOCK_M, sm90.BLOCK_N, sm90.BLOCK_N, sm90.BLOCK_M // sm90.MMA_PARTS]
    assert [a.block_shape for a in args[:4]] == [[1, 1, r, d] for r in rows]
    assert [a.layout for a in args[:4]] == [sm90._layout(d, bf16, r) for r in rows]
    assert [a.base for a in args[:4]] == [q, k, k, o] and [list(a.strides) for a in args[:4]] == [
        list(t.stride()) for t in (q, k, k, o)]
    backward = sm90.Sm90Backward(q, k, True, 0.1, 0.1 * 1.4426950408889634, per_query=None)
    per_query = torch.empty(8, backward.nq_pad)
    args = backward._launch(q.stride())._jit_args((q, k, k, q, k, k, per_query, per_query,
                                                   torch.empty(q.shape), *backward.args))
    rows = [sm90.BWD_BLOCK_M, sm90.BWD_BLOCK_N, sm90.BWD_BLOCK_N, sm90.BWD_BLOCK_M, sm90.BWD_BLOCK_N,
            sm90.BWD_BLOCK_N]
    assert [a.block_shape for a in args[:6]] == [[1, 1, r, d] for r in rows]
    assert [a.layout for a in args[:6]] == [sm90._layout(d, bf16, r) for r in rows]
    for vector in args[6:8]:
        assert (vector.shape, vector.strides, vector.block_shape) == ([8 * backward.nq_pad], [1], [sm90.BWD_BLOCK_M])
        assert vector.layout == sm90.VECTOR_LAYOUT
    assert backward._launch(q.stride()) is backward._launch(q.stride())   # one Launch for each layout of dO
    assert backward._launch(q.transpose(1, 2).contiguous().transpose(1, 2).stride()) is not backward._launch(
        q.stride())


def test_deterministic_algorithms_take_the_tiled_backward(monkeypatch):
    """The Hopper backward adds dQ up with atomic adds; with torch.use_deterministic_algorithms(True) the tiled
    backward runs, and only then."""
    calls = []
    plan = attention_module.AttentionPlan.__new__(attention_module.AttentionPlan)
    plan.sm90_backward = lambda *args: calls.append("Hopper") or "Hopper's gradients"
    plan.backward_args = (1, 1, 1, 4)
    monkeypatch.setattr(attention_module, "_aligned", lambda t: t)
    monkeypatch.setattr(plan, "_backward_launch", lambda strides: calls.append("tiled") or (_Stop(), None, None),
                        raising=False)
    q = torch.randn(1, 1, 4, 64)
    assert plan.backward(q, q, q, q, q, q[..., 0], False, 1.0) == "Hopper's gradients"
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with pytest.raises(_Stopped):   # the tiled backward's first launch
            plan.backward(q, q, q, q, q, q[..., 0], False, 1.0)
    finally:
        torch.use_deterministic_algorithms(before)
    assert calls == ["Hopper", "tiled"]


def test_the_recorded_backwards_are_kept_apart_by_deterministic_mode():
    """The plan's backward branches on torch.use_deterministic_algorithms: the context the forward leaves, whose
    attributes key the eager node's recorded backwards, holds it; a backward recorded in one mode (the tiled one)
    is not replayed in the other."""
    from roofline.ops._eager_node import EagerContext

    q = torch.randn(1, 1, 4, 64)
    keys = []
    before = torch.are_deterministic_algorithms_enabled()
    try:
        for on in (False, True):
            torch.use_deterministic_algorithms(on)
            ctx = EagerContext(plan=None)
            attention_module._save_for_backward(ctx, (q, q, q, False, 1.0), (q, q[..., 0]))
            keys.append(tuple(ctx.__dict__.values()))
    finally:
        torch.use_deterministic_algorithms(before)
    assert keys[0] != keys[1]


class _Stopped(Exception):
    pass


class _Stop:
    def __call__(self, *args):
        raise _Stopped


def _backward_compiled(d: int, causal: bool, stages: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def descriptor(rows):
        return f"tensordesc<bf16[1, 1, {rows}, {d}],{sm90._layout(d, torch.bfloat16, rows)!r}>"

    vector = f"tensordesc<fp32[{sm90.BWD_BLOCK_M}],{sm90.VECTOR_LAYOUT!r}>"
    queries, keys = descriptor(sm90.BWD_BLOCK_M), descriptor(sm90.BWD_BLOCK_N)
    signature = {"q_desc": queries, "k_desc": keys, "v_desc": keys, "do_desc": queries, "dk_desc": keys,
                 "dv_desc": keys, "lse_desc": vector, "delta_desc": vector, "dq_ptr": "*fp32", "heads": "i32",
                 "kv_heads": "i32", "group": "i32", "nq": "i32", "nq_pad": "i32", "nk": "i32", "scale": "fp32",
                 "scale_log2": "fp32", "CAUSAL": "constexpr", "STAGES": "constexpr", "MMA_REGISTERS": "constexpr"}
    constexprs = {"CAUSAL": causal, "STAGES": stages, "MMA_REGISTERS": sm90.BWD_MMA_REGISTERS}
    source = GluonASTSource(sm90.attention_backward_sm90_kernel, signature, constexprs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": sm90.LOAD_WARPS, "maxnreg": sm90.MAX_REGISTERS})


def _backward_machine_code() -> dict:
    """For each head dim, causal or not, and ring slots (the default, and 3): the backward's _summary, its adds into
    memory and the register shares setmaxnreg moves."""
    out = {}
    for d in sm90.HEAD_DIMS:
        for causal in (False, True):
            for stages in sorted({sm90.BWD_STAGES[d], 3}):
                summary, code = _summary(_backward_compiled(d, causal, stages))
                out[f"{d},{causal},{stages}"] = {
                    **summary, "adds": sorted({x.opcode for x in code if x.base in ("RED", "REDG", "ATOMG")}),
                    "setmaxnreg": sorted({int(x.text.split()[-1], 16) for x in code if x.base == "USETMAXREG"})}
    return out


@pytest.fixture(scope="module")
def backward_machine_code():
    return _in_a_compiling_process("t._backward_machine_code()")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", sm90.HEAD_DIMS)
def test_the_backward_makes_five_products_a_step_and_adds_dq_sixteen_bytes_at_a_time(backward_machine_code, d,
                                                                                      causal):
    """S^T, dP^T, dV, dK and dQ on the tensor cores, a warpgroup each: head_dim / 16 wgmmas for S^T and dP^T,
    BWD_BLOCK_M / 16 for dV and dK, BWD_BLOCK_N / 16 for dQ (the tiled backward makes seven products a tile). dQ
    goes into memory by 16-byte adds from the producer's warps; every input by the copy engine, dK and dV out."""
    kernel = backward_machine_code[f"{d},{causal},{sm90.BWD_STAGES[d]}"]
    ops = kernel["ops"]
    assert kernel["warps"] == sm90.LOAD_WARPS + sm90.MMA_WARPS == 12
    assert kernel["registers"] == sm90.MAX_REGISTERS
    # the partitions' shares, moved by setmaxnreg: the producer's (it adds dQ) and the MMA warpgroups'
    assert {sm90.BWD_LOAD_REGISTERS, sm90.BWD_MMA_REGISTERS} <= set(kernel["setmaxnreg"])
    assert ops["HGMMA"] == 2 * (d // 16) + 2 * (sm90.BWD_BLOCK_M // 16) + sm90.BWD_BLOCK_N // 16
    assert kernel["adds"] == ["REDG.E.ADD.F32x4.FTZ.RN.STRONG.GPU"]
    assert ops["UTMALDG"] == 6 and ops["UTMASTG"] == 2   # K, V, Q, dO and the two per-query values; dK, dV
    assert kernel["shared"] <= SHARED_MEMORY_LIMIT
    # registers: at head dim 64 nothing spills; at 128 (dK and dV take 128 of the 232 a thread) a few bytes do
    assert kernel["local"] <= (0 if d == 64 else 32)


def test_a_third_ring_slot_fits_the_backward_at_head_dim_128(backward_machine_code):
    """Three slots of Q and dO (and their per-query values) fit the 227 KiB a block may hold, with K, V, two
    dS^T buffers and dQ's: the setting tune_ops times against two."""
    two, three = backward_machine_code["128,False,2"], backward_machine_code["128,False,3"]
    slot = 2 * sm90.BWD_BLOCK_M * 128 * 2 + 2 * sm90.BWD_BLOCK_M * 4
    assert three["shared"] - two["shared"] >= slot and three["shared"] <= SHARED_MEMORY_LIMIT
