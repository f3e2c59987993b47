"""The calls whose spelling differs between the torch releases the pipeline runs on: the lock's
(for the container and CI) and whatever a GPU host or cluster brings (torch >= 2.4)."""

from __future__ import annotations

import inspect


def ddp_buffer_sync(sync: bool, ddp_class=None) -> dict:
    """DDP's keyword for broadcasting rank 0's buffers at every forward (or not): `forward_sync_buffers`
    in torch 2.14, `broadcast_buffers` before (a GPU host's torch 2.11 refused the new name)."""
    import torch

    ddp_class = ddp_class or torch.nn.parallel.DistributedDataParallel
    parameters = inspect.signature(ddp_class.__init__).parameters
    name = "forward_sync_buffers" if "forward_sync_buffers" in parameters else "broadcast_buffers"
    return {name: sync}


def _fsdp2(name: str):
    """An FSDP2 name: public in torch.distributed.fsdp since torch 2.6, in
    torch.distributed._composable.fsdp before (torch 2.4 and 2.5)."""
    try:
        return getattr(__import__("torch.distributed.fsdp", fromlist=[name]), name)
    except (ImportError, AttributeError):
        return getattr(__import__("torch.distributed._composable.fsdp", fromlist=[name]), name)


def fully_shard():
    return _fsdp2("fully_shard")


def mixed_precision_policy():
    return _fsdp2("MixedPrecisionPolicy")


def process_groups() -> list:
    """Every process group this process is in. torch.distributed lists them nowhere public; its
    registry `distributed_c10d._world.pg_map` holds them (torch 2.0 to 2.14 at least); the
    default group alone where that is gone."""
    import torch

    world = getattr(torch.distributed.distributed_c10d, "_world", None)
    groups = getattr(world, "pg_map", None)
    return list(groups) if groups else [torch.distributed.group.WORLD]
