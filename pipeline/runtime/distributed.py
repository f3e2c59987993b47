"""Process-group helpers shared by the multi-process strategies and by evaluation.

A process started by torchrun (or a test) finds its place in the job in the environment:
RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT.
"""

from __future__ import annotations

import datetime
import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from . import compat, failure

if TYPE_CHECKING:  # annotations only: torch is imported where a process runs
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


def gpu_count() -> int:
    """The GPUs this process can use, as torch.cuda.device_count() counts them, without
    importing torch where it is not loaded yet (the Snakefile plans runs on a login node in a
    fraction of a second): NVML's count, narrowed by CUDA_VISIBLE_DEVICES as CUDA narrows it
    (indices or GPU-/MIG- UUIDs, up to the first invalid entry). No driver: 0."""
    if "torch" in sys.modules:  # a training process: torch's own answer
        return sys.modules["torch"].cuda.device_count()
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            installed = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # pynvml.NVMLError (no driver: a CPU machine), or no pynvml at all
        return 0
    return visible_gpus(installed, os.environ.get("CUDA_VISIBLE_DEVICES"))


def uses_gpus(backend: str) -> bool:
    """Whether a process group of `backend` (parallel.backend) puts one process on each GPU:
    NCCL always, `auto` where this machine has GPUs."""
    return backend == "nccl" or (backend == "auto" and gpu_count() > 0)


def visible_gpus(installed: int, visible: str | None) -> int:
    """How many of `installed` GPUs CUDA_VISIBLE_DEVICES=`visible` leaves (None: unset), as
    torch counts them: up to the first invalid entry, and none if an entry repeats."""
    if visible is None:
        return installed
    chosen: list[str] = []
    for entry in (e.strip() for e in visible.split(",")):
        if not (entry.startswith(("GPU-", "MIG-")) or (entry.isdigit() and int(entry) < installed)):
            break
        if entry in chosen:
            return 0
        chosen.append(entry)
    return min(len(chosen), installed)


def default_device(local_rank: int = 0) -> torch.device:
    import torch

    return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")


def launched_by_torchrun() -> bool:
    return int(os.environ.get("WORLD_SIZE", 1)) > 1


def init_process_group(backend: str, timeout_s: float, threads: int) -> Membership:
    """Join the job described in the environment with parallel.backend (`auto`: nccl on GPUs)
    and parallel.timeout_s; threads 0 means cores / local processes."""
    import torch
    import torch.distributed as dist

    rank, processes = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", processes))
    device = default_device(local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    # NCCL's own watchdog aborts a collective that outlives the timeout and tears the process
    # down (instead of leaving it stuck in a kernel); gloo honours the timeout by itself.
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    threads = threads or max(1, available_cores() // local_processes)
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend,
            store=attempt_store(rank, processes, timeout),
            rank=rank,
            world_size=processes,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
        start_heartbeat()
    return Membership(rank, processes, device, backend, threads)


# ---- who stopped where: for the message of a run that lost a process ----------------------
PEER_FAILURE_HINTS = (
    "gloo",
    "NCCL",
    "Connection closed",
    "Connection reset",
    "Broken pipe",
    "Timed out",
    "timed out",
    "caused pair closure",
)  # gloo's words where its timeout ends a broadcast
# (DDP's buffer sync: "Application timeout caused pair closure", seen with a hung peer)
STORE_READ_TIMEOUT = datetime.timedelta(seconds=5)


def _store():
    """The job's key-value store (torchrun's, or rank 0's): every rank can reach it."""
    import torch.distributed as dist

    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):  # not in a process group
        return None


HEARTBEAT_S = 1.0  # every rank says it is alive this often; 3 missed beats: silent


def _key(kind: str, rank: int) -> str:
    return f"frcnn-bench/{kind}/{rank}"  # the store is set apart per restart (attempt_store)


_progress = {"step": 0}  # this rank's iterations done; the heartbeat publishes it


def start_heartbeat() -> None:
    """A thread that leaves this rank's wall-clock time and iteration count in the store every
    HEARTBEAT_S (the training loop itself does no store I/O), so that a rank that lost its
    peers can tell which one went silent (died, or hangs) and where."""
    import torch.distributed as dist

    store, rank = _store(), dist.get_rank()

    def beat():
        while True:
            try:
                store.set(_key("step", rank), str(_progress["step"]))
                store.set(_key("alive", rank), repr(time.time()))
            except Exception:  # the store is gone: the job is ending
                return
            time.sleep(HEARTBEAT_S)

    threading.Thread(target=beat, name="heartbeat", daemon=True).start()


def report_progress(step: int) -> None:
    """This rank's iteration count, for the heartbeat to publish (no I/O here)."""
    _progress["step"] = step


def last_reported(kind: str) -> dict[int, float | None]:
    """Every rank's last value of `kind` ("step", "alive") in the store; None: never reported,
    or the store is gone."""
    import torch.distributed as dist

    store, values = _store(), dict[int, float | None]()
    if store is None:
        return values
    store.set_timeout(STORE_READ_TIMEOUT)
    for rank in range(dist.get_world_size()):
        try:
            key = _key(kind, rank)
            values[rank] = float(store.get(key)) if store.check([key]) else None
        except (RuntimeError, ValueError):  # the store's host is gone too
            values[rank] = None
    return values


def lost_peers(err: BaseException) -> str | None:
    """If `err` is a collective that failed because another process of the job died or hangs,
    what happened and what to do; None for any other error."""
    import torch.distributed as dist

    if not dist.is_initialized() or not (
        isinstance(err, dist.DistError) or any(h in str(err) for h in PEER_FAILURE_HINTS)
    ):
        return None
    steps, beats, now = last_reported("step"), last_reported("alive"), time.time()
    silent = {
        rank: now - beat if beat is not None else math.inf
        for rank, beat in beats.items()
        if rank != dist.get_rank() and (beat is None or now - beat > 3 * HEARTBEAT_S)
    }
    if silent:
        who = "; ".join(
            f"rank {rank} has been silent for {age:.0f} s, since step {int(steps.get(rank) or 0)}"
            for rank, age in silent.items()
        )
        who += ": it died or hangs (its own lines in this log, and torchrun's report, say why)"
    elif beats:
        who = "every rank is still alive: a connection between them failed"
    else:
        who = "the job's store is unreachable too: the first node (or its torchrun) is gone"
    first_line = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
    return failure.Consequence(
        f"rank {dist.get_rank()} lost the other processes of its run ({first_line}); {who}. "
        "The run's last checkpoint is kept: rerun the same command to resume from it, or set "
        "parallel.max_restarts to have torchrun restart the run by itself. A process that "
        "hangs rather than dies is waited for at most parallel.timeout_s"
    )


def attempt_store(rank: int, processes: int, timeout: datetime.timedelta) -> dist.Store:
    """The job's store (MASTER_ADDR:MASTER_PORT: torchrun's, or rank 0's), its keys set apart
    per torchrun restart. torchrun keeps one store across restarts, and without that prefix
    a restarted process group reads the dead one's addresses from it and cannot connect
    (seen with gloo on torch 2.14; pytorch/pytorch#167288 is the same with NCCL)."""
    import torch.distributed as dist

    store, _, _ = next(dist.rendezvous("env://", rank, processes, timeout=timeout))
    return dist.PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def all_gather(obj) -> list:
    """Every process's `obj`, in rank order ([obj] outside a process group)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return [obj]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, obj)
    return everyone


# The process groups this process left, kept alive until it ends (destroy_process_group).
_LEFT: list = []


def destroy_process_group() -> None:
    """Leave the job once every process got here. torch forgets the groups; we keep their
    objects, so that none is freed while the process runs. Freed, a gloo group joins its worker
    threads, with the GIL held by whoever drops the last reference: after torch forgot it, a
    model wrapper (DDP's reducer) as the training function returns. A worker thread still
    freeing the barrier's finished collective needs the GIL for that collective's tensors, and
    both wait forever: seen on torch 2.11 (a finished training's rank 0 in std::thread::join
    under ~ProcessGroupGloo under the reducer's dealloc; a gloo thread in gil_scoped_acquire
    under ~AsyncBarrierWork). A finished process ends without teardown
    (lifetime.exit_finished), so the kept groups are never freed at all."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        _LEFT.extend(compat.process_groups())
        dist.destroy_process_group()
