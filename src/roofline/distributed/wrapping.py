"""Data parallelism as users write it, for the ladder on several GPUs (roofline.distributed.ladder).

    forward = wrap(model, "ddp", device, bf16=True, compile_mode="default")

ddp: DistributedDataParallel over the whole model (its gradients reduced in buckets while the backward runs), and
under torch.compile the wrapped model compiled, as PyTorch's DDP notes advise (the compiler splits its graphs at
the buckets); with bucket_view, each gradient is a view of its bucket (gradient_as_bucket_view), not copied into
it and out again. fsdp2: `fully_shard` on each layer (every module of the model's nn.ModuleLists: the transformer
blocks), then on the whole model, as torchtitan does, or in fewer units (wrap's groups: K groups of blocks kept
gathered from forward to backward, or with 1 the model alone); under bf16 its parameters are gathered in bf16 and
the gradients reduced in fp32, or in bf16 with reduce_bf16 (MixedPrecisionPolicy), and under torch.compile each
layer is compiled before it is sharded (torchtitan's order). The process group must exist
(torch.distributed.init_process_group).
"""

from __future__ import annotations

import torch
from torch import nn

STRATEGIES = ("ddp", "fsdp2")
# FSDP2's groups of layers where fewer units are asked for (the ladder's FSDP2 rung, the fsdp2-hooks finding's
# advice): on two H100s, fewer units were faster down to one, and 2 and 4 kept gathered were not told apart
# (benchmarks/results/h100x2-distributed.md, "Side by side"); 4 hold less memory gathered than 2
FSDP2_GROUPS = 4


def grouped(blocks: list, groups: int) -> list[list]:
    """`blocks` in `groups` runs of consecutive blocks, as even as they divide (10 in 4: 3, 3, 2, 2)."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    size, extra = divmod(len(blocks), groups)
    out, start = [], 0
    for i in range(min(groups, len(blocks))):
        end = start + size + (i < extra)
        out.append(blocks[start:end])
        start = end
    return out


def layers(model: nn.Module) -> list[nn.Module]:
    """The modules FSDP2 shards one by one: each element of the model's outermost nn.ModuleLists (the blocks, not
    a list inside a block)."""
    found, names = [], []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and not any(name == n or name.startswith(f"{n}.") for n in names):
            found += list(module)
            names += [f"{name}.{i}" for i in range(len(module))]
    return found


def wrap(model: nn.Module, strategy: str, device: torch.device, bf16: bool, compile_mode: str | None,
         groups: int | None = None, bucket_view: bool = False, reduce_bf16: bool = False) -> nn.Module:
    """The module a training step calls: `model` under `strategy`, compiled where compile_mode is set (None, or
    torch.compile's mode: "default", "max-autotune"); groups: FSDP2's units of layers (None: one a layer, each
    resharded after its forward; K: K units kept gathered from forward to backward; 1: the model as one unit, with
    one all-gather and one reduce-scatter a step); bucket_view: DDP's gradients as views of its buckets;
    reduce_bf16: under bf16, FSDP2's gradients reduce-scattered in bf16, not fp32 (half the bytes)."""
    mode = None if compile_mode in (None, "default") else compile_mode
    if reduce_bf16 and (strategy != "fsdp2" or not bf16):
        raise ValueError(f"reduce_bf16: FSDP2's gradients are reduced in bf16 under bf16 only (strategy "
                         f"{strategy!r}, bf16={bf16})")
    if strategy == "ddp":
        ddp = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                                  gradient_as_bucket_view=bucket_view)
        return ddp if compile_mode is None else torch.compile(ddp, mode=mode)
    if strategy == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                      reduce_dtype=torch.bfloat16 if reduce_bf16 else torch.float32) if bf16 \
            else MixedPrecisionPolicy()
        blocks = layers(model)
        if not blocks:
            raise ValueError("fsdp2: the model has no nn.ModuleList of layers to shard one by one")
        if groups is None:
            units = [[block] for block in blocks]
        elif groups == 1:   # the model's own fully_shard below holds every layer
            units = []
        else:
            units = grouped(blocks, groups)
        if compile_mode is not None:
            for block in blocks:
                block.compile(mode=mode)
        for unit in units:
            fully_shard(unit if len(unit) > 1 else unit[0], mp_policy=policy, reshard_after_forward=groups is None)
        fully_shard(model, mp_policy=policy)
        return model
    raise ValueError(f"strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
