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
