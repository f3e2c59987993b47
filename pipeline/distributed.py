"""Process-group helpers shared by the multi-process strategies and by evaluation.

A process started by torchrun (or a test) finds its place in the job in the environment:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Membership:
    """One process's place in a job."""

    rank: int
    processes: int  # torch.distributed's world size: every process of the job
    device: torch.device
    backend: str
    threads: int


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def default_device(local_rank: int = 0) -> torch.device:
    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", 1)) > 1


def init_process_group(parallel: dict, threads: int) -> Membership:
    """Join the job described in the environment; threads 0 means cores / local processes."""
    rank, processes = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", processes))
    device = default_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = parallel["backend"]
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    threads = threads or max(1, available_cores() // local_processes)
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=processes,
                                timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None)
    return Membership(rank, processes, device, backend, threads)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_gather(obj) -> list:
    """Every process's `obj`, in rank order ([obj] outside a process group)."""
    if not dist.is_initialized():
        return [obj]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
