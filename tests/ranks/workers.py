"""Functions the tests run on every rank (launch.spawn starts fresh processes, which import them by name)."""

import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from roofline.bench.collective import KINDS, time_collective


def every_collective(sizes):
    """Each kind at each size: the timings' dicts, the same on every rank (they are all-gathered)."""
    return [time_collective(kind, size, dtype=torch.float32, rep_ms=5).to_dict() for kind in KINDS for size in sizes]


def fail(how: str, pids: str):
    """Rank 1 fails `how`; rank 0 waits for it in an all_reduce. Each rank notes its pid in `pids` first."""
    Path(pids, str(os.getpid())).touch()
    if dist.get_rank() == 1:
        if how == "raise":
            raise ValueError("rank 1 could not go on")
        if how == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)   # "hang": never reaches the collective
    dist.all_reduce(torch.ones(4))
    return dist.get_rank()


def nccl_settings():
    """What this rank sees of the settings that keep NVLink multicast off, and its GPU."""
    import torch

    return {name: os.environ.get(name) for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                    "NVSHMEM_DISABLE_NVLS")}, torch.cuda.current_device()

