"""The contract between the training loop and a strategy."""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Context:
    """What one training process knows about its place in the job."""

    rank: int
    world_size: int
    device: torch.device
    threads: int
    backend: str = "none"

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


class Strategy:
    """Defaults describe one process on one device; strategies override what differs."""

    name = "base"

    def launcher(self, world_size: int, python: str) -> list[str]:
        """Command prefix that starts the training module's processes (`... -m pipeline.train`)."""
        return [python]

    def start(self, run: dict, threads: int) -> Context:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
        threads = threads or max(1, available_cores() // run["world_size"])
        torch.set_num_threads(threads)
        return Context(rank=0, world_size=1, device=device, threads=threads)

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        return model

    def step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> float:
        """Synchronise gradients and update the weights; return seconds spent communicating."""
        optimizer.step()
        return 0.0

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)

    def finish(self, ctx: Context) -> None:
        pass
