"""The contract between the training loop and a strategy, and what the strategies share."""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class Context:
    """What one training process knows about its place in the job."""

    rank: int = 0                 # global process rank
    world_size: int = 1           # processes in the job (a dedicated ps server included)
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    threads: int = 1
    backend: str = "none"
    shard: int | None = 0         # the part of the data this process trains on; None: no data
    shards: int = 1               # parts the data is split into (1 for single and dp)
    role: str = "worker"          # "worker", "server" (dedicated ps) or "server+worker"

    @property
    def reports(self) -> bool:
        """The first worker writes the iteration log and the run summary."""
        return self.shard == 0


@dataclass
class Traffic:
    """Bytes this process sent and received, and seconds the backward pass waited on
    communication, since the last `take()`."""

    sent: int = 0
    received: int = 0
    backward_wait: float = 0.0

    def take(self) -> "Traffic":
        taken = Traffic(self.sent, self.received, self.backward_wait)
        self.sent, self.received, self.backward_wait = 0, 0, 0.0
        return taken


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def gradient_bytes(model: torch.nn.Module) -> int:
    """M: the bytes of one full set of gradients (the trainable parameters)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


class Strategy:
    """Defaults describe one process on one device; strategies override what differs."""

    name = "base"

    def unavailable(self, run: dict, parallel: dict) -> str | None:
        """Why this run cannot run on this machine (checked before any process starts)."""
        return None

    def launcher(self, run: dict, parallel: dict, python: str) -> list[str]:
        """Command prefix that starts the processes of `-m pipeline.train ...`."""
        return [python]

    def start(self, run: dict, parallel: dict, threads: int) -> Context:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        threads = threads or available_cores()
        torch.set_num_threads(threads)
        return Context(device=device, threads=threads)

    def batch_per_process(self, run: dict) -> int:
        return run["images_per_worker"]

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        return model

    def step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: Context) -> float:
        """Synchronise gradients and update the weights; return seconds spent communicating."""
        optimizer.step()
        return 0.0

    def traffic(self) -> Traffic:
        """What this process communicated since the last call (nothing, for one process)."""
        return Traffic()

    def theory_bytes(self, run: dict, ctx: Context, grad_bytes: int) -> dict[str, float]:
        """Bytes per iteration this process should send and receive, by the algorithm's analysis."""
        return {"sent": 0.0, "received": 0.0}

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)

    def finish(self, ctx: Context) -> None:
        pass


# ---- shared by the multi-process strategies (ddp, ps) ---------------------------------------

def processes_per_node(run: dict, parallel: dict, extra: int = 0) -> tuple[int, str | None]:
    """torchrun's --nproc-per-node for `world_size + extra` processes over nnodes machines."""
    total, nodes = run["world_size"] + extra, parallel["nnodes"]
    if total % nodes:
        return 0, f"{total} processes do not split evenly over {nodes} nodes"
    return total // nodes, None


def check_devices(per_node: int, parallel: dict) -> str | None:
    """More processes than GPUs (or, on CPU, than cores) on a node, or NCCL without GPUs."""
    gpus = torch.cuda.device_count()
    if parallel["backend"] == "nccl" and gpus == 0:
        return "NCCL needs GPUs and none is visible (set parallel.backend to auto or gloo)"
    if gpus:
        return None if per_node <= gpus else f"{per_node} processes per node but {gpus} GPU(s)"
    cores = available_cores()
    return None if per_node <= cores else f"{per_node} processes per node but {cores} CPU core(s)"


def torchrun(run: dict, parallel: dict, python: str, per_node: int) -> list[str]:
    """The standard launcher: one torchrun per node, c10d rendezvous at parallel.rdzv_endpoint."""
    command = [python, "-m", "torch.distributed.run", f"--nproc-per-node={per_node}",
               f"--nnodes={parallel['nnodes']}"]
    if parallel["nnodes"] == 1:
        return command + ["--standalone"]
    return command + ["--rdzv-backend=c10d", f"--rdzv-endpoint={parallel['rdzv_endpoint']}",
                      f"--rdzv-id={run['strategy']}-{run['world_size']}"]


def init_process_group(parallel: dict, threads: int) -> tuple[int, int, torch.device, str, int]:
    """Join the job torchrun (or a test) described in the environment: RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    backend = parallel["backend"]
    if backend == "auto":
        backend = "nccl" if device.type == "cuda" else "gloo"
    threads = threads or max(1, available_cores() // local_world)
    torch.set_num_threads(threads)
    if not dist.is_initialized():
        dist.init_process_group(backend, rank=rank, world_size=world,
                                timeout=datetime.timedelta(minutes=30),
                                device_id=device if device.type == "cuda" else None)
    return rank, world, device, backend, threads


def destroy_process_group() -> None:
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
