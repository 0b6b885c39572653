"""Several GPUs: starting ranks as torchrun does (launch), and the interconnect's measured ceilings
(interconnect). Everything runs on torch.distributed: NCCL on GPUs, gloo on CPUs."""

from roofline.distributed.launch import RankFailed, spawn

__all__ = ["RankFailed", "spawn"]
