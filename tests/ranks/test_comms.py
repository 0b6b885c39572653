"""Collective calls read off a rank's trace: the message size from the c10d op and the NCCL kernel it launched."""

import json

import pytest

from profiler.synth import AUTOGRAD, TraceBuilder, at   # tests/profiler (pytest puts tests/ on the path)
from roofline.distributed import comms
from roofline.profiler.trace import load


def _trace(tmp_path, op: str, dims, dtype: str, kernel: str):
    events = [
        {"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": 100.0, "dur": 50.0,
         "args": {"Input Dims": dims, "Input type": [dtype] * len(dims)}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 110.0, "dur": 5.0,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": f"{kernel}(ncclDevKernelArgsStorage<4096ul>)", "pid": 0, "tid": 20,
         "ts": 120.0, "dur": 30.0, "args": {"correlation": 7, "device": 0, "stream": 20}},
    ]
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"traceEvents": events,
                                "distributedInfo": {"world_size": 2, "rank": 0, "backend": "nccl"}}))
    return load(path)


@pytest.mark.parametrize("op, dims, dtype, kernel, nbytes", [
    # FSDP2's all-gather: NCCL's kernel names no dtype (it moves bytes); the op's recorded input type does
    ("c10d::_allgather_base_", [[8192], [4096]], "c10::BFloat16", "ncclDevKernel_AllGather_RING_LL", 8192 * 2),
    # a reducing kernel names its dtype, which wins over the op's (what NCCL reduces in)
    ("c10d::allreduce_", [[[1024, 4]]], "c10::BFloat16", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 4096 * 4),
    # a reduce_scatter's first argument is one rank's share: the message is all of them
    ("c10d::_reduce_scatter_base_", [[2048], [4096]], "float", "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL",
     2048 * 4 * 2),
])
def test_the_message_size_of_an_nccl_call(tmp_path, op, dims, dtype, kernel, nbytes):
    call, = comms.calls(_trace(tmp_path, op, dims, dtype, kernel))
    assert (call.nbytes, call.start, call.end, call.arrived, call.on_gpu) == (nbytes, 120.0, 150.0, 100.0, True)


def _call(kind: str, nbytes: int) -> comms.Call:
    return comms.Call(kind, nbytes, 0.0, 0.0, 1.0, None, None, 0, True, True)


def test_ddp_s_all_reduces_are_named_by_bucket_in_turn_and_another_size_is_someone_else_s():
    buckets = [[{"bytes": 400, "params": ["head.weight", "head.bias"]}, {"bytes": 800, "params": []}]]
    calls = [_call("all_reduce", 400), _call("broadcast", 400), _call("all_reduce", 64), _call("all_reduce", 800),
             _call("all_reduce", 400), _call("all_reduce", 800)]   # two steps, and the program's own calls
    comms._name_ddp_buckets(calls, buckets)
    assert [c.owner for c in calls] == ["DDP bucket 0 (head.weight … head.bias, 2 tensors)", None, None,
                                        "DDP bucket 1", "DDP bucket 0 (head.weight … head.bias, 2 tensors)",
                                        "DDP bucket 1"]
    assert comms.owners(calls) == "DDP buckets 0, 1"
    assert comms.owners(calls[:1]) == "DDP bucket 0 (head.weight … head.bias, 2 tensors)"
    assert comms.owners([_call("all_reduce", 8)]) is None
    layers = [_call("all_gather", 64) for _ in range(3)]
    for c, name in zip(layers, ("FSDP2 layers.0", "FSDP2 layers.1", "FSDP2 layers.2")):
        c.owner = name
    assert comms.owners(layers) == "FSDP2 layers.0 … layers.2 (3)"


def test_fsdp2_s_record_functions_name_the_module():
    mark = comms._FSDP_MARK
    assert mark.match("FSDP::all_gather (layers.3)")[1] == "layers.3"
    assert mark.match("FSDP::post_backward_reduce (h.0.mlp) [pg=2]")[1] == "h.0.mlp"
    assert mark.match("FSDP::all_gather")[1] is None   # the root module
    assert mark.match("FSDP::pre_forward (layers.3)") is None


@pytest.mark.parametrize("compute_stream, serialized", [(20, 30.0), (7, 0.0)])
def test_nccl_kernels_on_the_stream_that_computes_are_serialized(tmp_path, compute_stream, serialized):
    from roofline.distributed.merge import _serialized

    trace = _trace(tmp_path, "c10d::allreduce_", [[[1024, 4]]], "float", "ncclDevKernel_AllReduce_Sum_f32_RING_LL")
    path = tmp_path / "rank0.json"
    data = json.loads(path.read_text())
    data["traceEvents"].append({"ph": "X", "cat": "kernel", "name": "ampere_sgemm_128x64_nn", "pid": 0,
                                "tid": compute_stream, "ts": 200.0, "dur": 40.0,
                                "args": {"correlation": 9, "device": 0, "stream": compute_stream}})
    path.write_text(json.dumps(data))
    trace = load(path)
    us, streams, at = _serialized(trace, comms.calls(trace))
    assert (us, streams) == (serialized, [20] if serialized else [])


@pytest.mark.long   # processes of their own: run first (conftest)
def test_ddp_s_buckets_are_found_when_the_program_compiled_the_ddp_module():
    """torch.compile(ddp) is what the program calls, and what the profile's module hooks see: its buckets must
    still be found (without them no collective is DDP's, and DDP's advice and findings are lost)."""
    from roofline.distributed import spawn

    from .workers import ddp_buckets_compiled_or_not

    for plain, compiled in spawn(ddp_buckets_compiled_or_not, 2):
        assert plain and compiled == plain


BASE_NS = 1_790_000_000_000_000_000   # the trace's baseTimeNanoseconds: its times are wall-clock ns less this, in us


def _record(created_us: float, kind: str, nbytes: int, seq: int) -> dict:
    """The flight recorder's record of a call (distributed.ledger.read's), made at created_us on the trace's clock."""
    return {"step": 0, "group": "nccl:0", "p2p": False, "seq": seq, "created_ns": BASE_NS + int(created_us * 1000),
            "kind": kind, "bytes": nbytes, "ms": None}


def test_a_window_without_ops_takes_its_calls_from_nccl_s_kernels_and_the_flight_recorder(tmp_path):
    """No c10d op is recorded: each NCCL kernel is a call, arrived at its launch, at the line its thread was on;
    its kind and size from the flight recorder's latest record before the launch; a kernel with none left gets the
    kind its name says and no size; launches from the autograd engine's thread are hooks' (asynchronous)."""
    ns = lambda us: BASE_NS + int(us * 1000)   # noqa: E731
    b = TraceBuilder()
    b.stacks.extend([list(map(list, s)) for s in (at(30), at(31))])
    b.facts["own_marks"] = {
        "lines": {"100": [[ns(0), ns(400)], [0, 1]]}, "modules": [], "steps": [[ns(0), ns(900)]],
        "collectives": [_record(8, "broadcast", 4096, 1),
                        _record(300, "all_reduce", 256, 2),   # a call whose kernel the trace lacks: passed over
                        _record(405, "all_reduce", 1 << 20, 3), _record(500, "all_reduce", 1 << 19, 4),
                        {**_record(501, "all_reduce", 64, 1), "group": "gloo:0"}]}   # gloo's: no kernel of NCCL
    b.extra_meta["baseTimeNanoseconds"] = BASE_NS
    b.kernel("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 20, 5, launch_ts=10, stream=30)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 450, 40, launch_ts=420,
             tid=AUTOGRAD, stream=30)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 520, 20, launch_ts=510,
             tid=AUTOGRAD, stream=30)
    b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 600, 10, launch_ts=590, stream=30)
    b.kernel("gemm", 100, 40, launch_ts=90)
    b.facts["ddp_buckets"] = [[{"bytes": 1 << 20, "params": ["head.weight"]}, {"bytes": 1 << 19, "params": []}]]
    trace = load(b.write(tmp_path / "rank0.json"))
    found = comms.calls(trace)
    assert [(c.kind, c.nbytes, c.arrived, c.start, c.end, c.op) for c in found] == [
        ("broadcast", 4096, 10.0, 20.0, 25.0, -1), ("all_reduce", 1 << 20, 420.0, 450.0, 490.0, -1),
        ("all_reduce", 1 << 19, 510.0, 520.0, 540.0, -1), ("send_recv", None, 590.0, 600.0, 610.0, -1)]
    assert [c.location.line for c in found] == [30, 31, 31, 31]
    assert [c.asynchronous for c in found] == [None, True, True, None]
    assert [c.owner for c in found] == [None, "DDP bucket 0 (head.weight)", "DDP bucket 1", None]
    assert comms.is_comm_kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)")
    assert comms.is_comm_kernel("ncclKernel_AllGather_RING_LL_Sum_int8_t") and not comms.is_comm_kernel("gemm")


@pytest.mark.parametrize("thread, buckets, asynchronous, owner, advice", [
    # DDP's bucket all-reduce, launched by the autograd engine: DDP's advice
    (AUTOGRAD, [[{"bytes": 1 << 20, "params": ["head.weight"]}]], True, "DDP bucket 0 (head.weight)",
     "gradient_as_bucket_view"),
    # the program's own call, on its thread: how it was called is not known without ops, and the advice says so
    (100, [], None, None, "how the program called it is not known"),
], ids=["ddp", "own-call"])
def test_ranks_recorded_without_ops_merge_and_report(tmp_path, thread, buckets, asynchronous, owner, advice):
    """Two ranks' windows without ops: their calls matched, the exposed all-reduce found at its line, named and
    advised on by who launched it."""
    from roofline.distributed.merge import collective_rows, merge
    from roofline.distributed.report import findings

    ns = lambda us: BASE_NS + int(us * 1000)   # noqa: E731
    traces = {}
    for rank, late in ((0, 0.0), (1, 30.0)):
        b = TraceBuilder()
        b.stacks.extend([list(map(list, s)) for s in (at(30), at(31))])
        b.facts["own_marks"] = {"lines": {"100": [[ns(0), ns(400)], [0, 1]]}, "modules": [],
                                "steps": [[ns(0), ns(900)]],
                                "collectives": [_record(405 + late, "all_reduce", 1 << 20, 1)]}
        b.facts["window_steps"] = 1
        b.facts["ddp_buckets"] = buckets
        b.extra_meta.update(baseTimeNanoseconds=BASE_NS, distributedInfo={"world_size": 2, "rank": rank,
                                                                           "backend": "nccl"})
        b.kernel("gemm", 100, 300 + late, launch_ts=90)
        b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 450 + late,
                 300 - late, launch_ts=420 + late, tid=thread, stream=30)
        traces[rank] = load(b.write(tmp_path / f"rank{rank}.json"))
    merged = merge(traces)
    assert merged.matched == 1 and merged.mismatch is None
    row, = collective_rows(merged)
    assert (row["kind"], row["bytes"], row["where"], row["asynchronous"], row["owner"]) == (
        "all_reduce", 1 << 20, "train.py:31 (train)", asynchronous, owner)
    exposed = [f for f in findings(merged) if f.id == "exposed-communication"]
    assert exposed and advice in exposed[0].message


def test_a_kernel_takes_the_latest_record_of_a_kind_it_can_run(tmp_path):
    """Two calls made before either kernel is launched (another thread's in between): each kernel takes the
    record of its own kind. A coalesced block's record names no collective: its kernel takes the block's last
    call's. NCCL runs an all_to_all as sends and receives."""
    b = TraceBuilder()
    b.stacks.append(list(map(list, at(30))))
    b.facts["own_marks"] = {
        "lines": {"100": [[BASE_NS], [0]]}, "modules": [], "steps": [[BASE_NS, BASE_NS + 900_000]],
        "collectives": [_record(100, "all_gather", 8192, 1), _record(101, "all_reduce", 4096, 2),
                        _record(300, "all_reduce", 512, 3), _record(301, None, 0, 4),   # a coalesced block's own
                        _record(400, "all_to_all", 2048, 5)]}
    b.extra_meta["baseTimeNanoseconds"] = BASE_NS
    b.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 120, 5, launch_ts=110, stream=30)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 130, 5, launch_ts=111,
             stream=30)
    b.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 320, 5, launch_ts=310,
             stream=30)
    b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 420, 5, launch_ts=410, stream=30)
    b.kernel("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", 430, 5, launch_ts=411, stream=30)
    found = comms.calls(load(b.write(tmp_path / "rank0.json")))
    assert [(c.kind, c.nbytes) for c in found] == [("all_gather", 8192), ("all_reduce", 4096), ("all_reduce", 512),
                                                   ("all_to_all", 2048), ("send_recv", None)]


def test_fsdp2_s_gathers_are_named_by_the_unit_whose_call_launched_them_without_ops(tmp_path):
    """Without ops FSDP2's own marks are not recorded: a gather launched inside a module's call under a root whose
    class fully_shard renamed (FSDP<Name>) is that unit's; the root's own is the root's; a model not sharded names
    none, and neither does a reduce-scatter (launched in the backward, outside any module's call)."""
    ns = lambda us: BASE_NS + int(us * 1000)   # noqa: E731
    b = TraceBuilder()
    b.stacks.append(list(map(list, at(30))))
    b.facts["own_marks"] = {
        "lines": {"100": [[ns(0)], [0]]}, "steps": [[ns(0), ns(900)]], "collectives": [],
        "modules": [[100, ns(5), ns(400), "FSDPGPT2"], [100, ns(50), ns(150), "FSDPGPT2.h.0"],
                    [100, ns(500), ns(600), "GPT2"]]}
    b.extra_meta["baseTimeNanoseconds"] = BASE_NS
    for launch in (10, 60, 510):
        b.kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", launch + 10, 5,
                 launch_ts=launch, stream=30)
    b.kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 720, 5,
             launch_ts=700, tid=AUTOGRAD, stream=30)
    found = comms.calls(load(b.write(tmp_path / "rank0.json")))
    assert [(c.kind, c.owner) for c in found] == [("all_gather", "FSDP2 root"), ("all_gather", "FSDP2 h.0"),
                                                  ("all_gather", None), ("reduce_scatter", None)]


def test_a_rank_s_stretch_is_its_own_report_s(tmp_path):
    """The merged report's stretch and the rank's own report's agree: on a GPU both hold the GPU's span of the
    recorded steps against the unrecorded step, where the host's step marks (a host 300 us a step ahead of its GPU
    here) would give the host's pace. On two H200 ranks the two reports once said 1.33x and 1.58x."""
    from roofline.distributed.merge import rank_of
    from roofline.profiler.report import analyze as analyze_report

    b = TraceBuilder()
    b.unprofiled_steps = {"wall_ms": [0.6] * 3, "gpu_ms": [0.8] * 3}
    for n in range(3):
        b.step(n * 700, 700, n)
        b.kernel("void step_kernel", 100 + n * 1000, 1000, launch_ts=50 + n * 700)
    path = b.write(tmp_path / "t.json")
    own = analyze_report(path).overhead
    rank = rank_of(load(path), 0)
    assert own.inflation == pytest.approx(3.1 / 3 / 0.8)   # the GPU's 3.1 ms over 3 steps, against 0.8
    assert rank.stretch == pytest.approx(own.inflation) and rank.mean_step_ms == pytest.approx(0.7)
