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


def threads() -> tuple:
    """This rank's OMP_NUM_THREADS and the threads its torch runs CPU ops on."""
    return os.environ.get("OMP_NUM_THREADS"), torch.get_num_threads()


def fail(how: str, pids: str):
    """Rank 1 fails `how`; rank 0 waits for it in an all_reduce. Each rank notes its pid in `pids` first."""
    Path(pids, str(os.getpid())).touch()
    x = torch.ones(4, device="cuda" if dist.get_backend() == "nccl" else "cpu")
    if how == "hang":
        # a first call on both ranks: NCCL makes its communicator in the first collective, where rank 0 would
        # otherwise wait for the late rank (seen on two H200s: the watchdog noticed only when rank 1 arrived)
        dist.all_reduce(x)
    if dist.get_rank() == 1:
        if how == "raise":
            raise ValueError("rank 1 could not go on")
        if how == "signal":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)   # "hang": never reaches the collective
    dist.all_reduce(x)
    x.sum().item()   # waits for the result: NCCL's call returns at once
    return dist.get_rank()


def fsdp2_units(cases):
    """For each (blocks, groups) of `cases`: FSDP2's units of a model of `blocks` layers wrapped with `groups`, each
    unit's modules, whether it is set to reshard its parameters after its forward (None: it holds none; read
    before any forward, where FSDP2 has not yet exempted the root), and how many parameters it holds."""
    return [_fsdp2_units(blocks, groups) for blocks, groups in cases]


def _fsdp2_units(blocks: int, groups):
    from torch import nn
    from torch.distributed.fsdp import FSDPModule

    from roofline.distributed.wrapping import wrap

    model = nn.Sequential(nn.ModuleList(nn.Linear(8, 8) for _ in range(blocks)))
    wrap(model, "fsdp2", torch.device("cpu"), bf16=False, compile_mode=None, groups=groups)
    units, reshards, held = {}, {}, {}
    for name, module in model.named_modules():
        if isinstance(module, FSDPModule):
            state = module._get_fsdp_state()
            units.setdefault(id(state), []).append(name)
            group = state._fsdp_param_group   # None for a unit with no parameters of its own
            reshards[id(state)] = None if group is None else group.post_forward_mesh_info is not None
            held[id(state)] = 0 if group is None else len(group.fsdp_params)
    return [(names, reshards[key], held[key]) for key, names in units.items()]


def fsdp2_reduce_dtypes(flags) -> list[str]:
    """For each reduce_bf16 of `flags`: the dtype FSDP2 reduce-scatters gradients in, for a model wrapped under bf16
    with it."""
    from torch import nn

    from roofline.distributed.wrapping import wrap

    out = []
    for reduce_bf16 in flags:
        model = nn.Sequential(nn.ModuleList(nn.Linear(8, 8) for _ in range(2)))
        wrap(model, "fsdp2", torch.device("cpu"), bf16=True, compile_mode=None, groups=1, reduce_bf16=reduce_bf16)
        out.append(str(model._get_fsdp_state()._fsdp_param_group.mp_policy.reduce_dtype))
    return out


def nccl_settings():
    """What this rank sees of the settings that keep NVLink multicast off, and its GPU."""
    import torch

    return {name: os.environ.get(name) for name in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                    "NVSHMEM_DISABLE_NVLS")}, torch.cuda.current_device()


def tiny_task():
    """A training task small enough for gloo ranks in a test: a two-block MLP language model over 64 tokens."""
    from torch import nn

    from roofline.ladder import TrainTask

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(32, 16)
            self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 16)) for _ in range(2))
            self.head = nn.Linear(16, 32)

        def forward(self, idx, targets):
            x = self.embed(idx)
            for block in self.blocks:
                x = x + block(x)
            return nn.functional.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())

    def batch(device):
        g = torch.Generator(device).manual_seed(1)
        return tuple(torch.randint(0, 32, (4, 16), device=device, generator=g) for _ in range(2))

    return TrainTask("tiny", model=Tiny, batch=batch, loss=lambda model, b: model(*b), warmup=2, steps=6,
                     check_steps=2)


def failing_task():
    """tiny_task, whose step raises on rank 1 from its second rung on: rank 0 would wait for it at DDP's
    all-reduce."""
    from dataclasses import replace

    task = tiny_task()
    loss = task.loss

    def on_rank_1_it_fails(model, b):
        if dist.get_rank() == 1 and torch.is_autocast_enabled("cpu"):
            raise ValueError("rank 1 ran out of luck")
        return loss(model, b)
    return replace(task, loss=on_rank_1_it_fails)


def steps_with_a_late_rank(late_rank: int, late_s: float):
    """Four steps of an all_reduce and an all_gather each, spanned as capture's StepClock spans the steps outside a
    window, rank `late_rank` sleeping before each step's first call (gloo's calls carry no GPU time: the sleep only
    makes the ranks' steps differ). The flight recorder's calls of those steps (ledger.read)."""
    from roofline.distributed import ledger

    spans, x = [], torch.ones(1000)
    dist.all_reduce(x)   # before the first step: not in any span
    for _ in range(4):
        start = time.time_ns()
        if dist.get_rank() == late_rank:
            time.sleep(late_s)
        dist.all_reduce(x)
        dist.all_gather_into_tensor(torch.empty(2000), x)
        spans.append((start, time.time_ns()))
    return ledger.read(spans)


def compiled_rungs_under_ddp() -> list[tuple[int, bool, str]]:
    """The ladder's compiled DDP rung on this rank (ladder._climb_one, as a climb runs it), without and then with
    the "one compiled graph" setting: for each, (graphs AOTAutograd compiled, optimize_ddp after the rung, its
    status). DDP's buckets are 1 MB, about a layer of _Layers, so that a split shows; AOTAutograd alone compiles (no
    Inductor: seconds of C++ compiles on a CPU)."""
    import functools
    from unittest import mock

    import torch._dynamo
    from torch._dynamo.utils import counters

    from roofline import ladder

    task = ladder.TrainTask("layers", _Layers, lambda device: (torch.randn(16, 512, device=device),),
                            lambda model, batch: model(batch[0]).sum(), warmup=1, steps=6, check_steps=1)
    rung = ladder.Rung("compiled", "", lambda c: c)
    ddp_init = torch.nn.parallel.DistributedDataParallel.__init__
    out = []
    for one_graph in (False, True):
        counters.clear()
        with mock.patch.object(torch, "compile", functools.partial(torch.compile, backend="aot_eager")), \
                mock.patch.object(torch.nn.parallel.DistributedDataParallel, "__init__",
                                  functools.partialmethod(ddp_init, bucket_cap_mb=1)):
            result = ladder._climb_one(task, rung, ladder.Config(parallel="ddp", compile="default",
                                                                 one_graph=one_graph), torch.device("cpu"), {})
        out.append((counters["aot_autograd"]["total"], torch._dynamo.config.optimize_ddp, result.status))
    return out


class _Layers(torch.nn.Module):
    """Code of a user's (Dynamo compiles its frames; torch's own modules, such as nn.Sequential, it inlines only
    when called from such code)."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(512, 512) for _ in range(4))

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return x


def compiled_ddp_gradients(variant: str, backend: str = "aot_eager"):
    """benchmarks/parallel_step.py's step of a compiled DDP variant (torch.compile's backend: AOTAutograd alone, or
    "inductor" where Inductor's own passes are under test), on this rank's own batch: (the largest difference
    between its gradients and the mean of every rank's gradients of the model alone, the backward graphs compiled
    autograd captured, the graphs Dynamo compiled)."""
    import functools
    import sys
    from unittest import mock

    from torch._dynamo.utils import counters

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import parallel_step

    device = torch.device("cpu")
    counters.clear()
    with mock.patch.object(torch, "compile", functools.partial(torch.compile, backend=backend)):
        run, model, context, shape = parallel_step.build("gpt2", variant, device)
        alone = parallel_step.model_and_batch("gpt2", device)[0]
        alone.load_state_dict(model.state_dict())
        idx = torch.randint(0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(dist.get_rank()))
        with context():
            run(idx)
    alone(idx, targets=idx)[1].backward()
    error = 0.0
    for reduced, own in zip(model.parameters(), alone.parameters()):
        mean = own.grad.clone()
        dist.all_reduce(mean)
        error = max(error, (reduced.grad - mean / dist.get_world_size()).abs().max().item())
    return {"error": error, "captured": counters["compiled_autograd"]["captures"],
            "graphs": counters["stats"]["unique_graphs"], "buckets": counters["inductor"]["ddp_buckets"],
            "reorder": torch._inductor.config.reorder_for_compute_comm_overlap}


def ddp_buckets_compiled_or_not():
    """comms.ddp_buckets of a DDP module after a backward, as it is and wrapped by torch.compile (never run
    compiled): (the buckets' sizes found each way)."""
    from roofline.distributed import comms

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 4))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    ddp(torch.randn(8, 64)).sum().backward()
    sizes = [[b["bytes"] for b in buckets] for buckets in comms.ddp_buckets([ddp])]
    return sizes, [[b["bytes"] for b in buckets] for buckets in comms.ddp_buckets([torch.compile(ddp)])]
