"""Collective calls read off a rank's trace: the message size from the c10d op and the NCCL kernel it launched."""

import json

import pytest

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
