"""One training process's run: what `setup` (train.py) builds, the loop advances and the summary
(summary.py) reads at the end."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import strategies
from ..config import schema
from ..data.dataset import CocoDetection, InMemory
from ..data.sampler import ShardedBatchSampler
from ..runtime.run import Run
from .checkpoint import Checkpointer, run_name
from .monitor import Monitor
from .precision import Precision
from .state import Moved, Phases, RandomState, TrainState
from .timing import IterationClock, SyncCheck


def warmup_iterations(train: schema.Train, iterations_per_epoch: int) -> int:
    """train.warmup_iters, or for `auto` what torchvision's reference trainer takes:
    min(1000, iterations of the first epoch - 1)."""
    if train.warmup_iters != "auto":
        return train.warmup_iters
    return min(1000, iterations_per_epoch - 1)


@dataclass
class Job:
    """One training process's run."""

    cfg: schema.TrainStage
    run: Run
    out_dir: Path
    runtime: strategies.Runtime  # the strategy in this process (pipeline/strategies/process.py)
    ctx: strategies.Context
    dataset: CocoDetection | InMemory
    sampler: ShardedBatchSampler
    loader: torch.utils.data.DataLoader
    loader_seed: torch.Generator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    base_lr: float
    global_batch: int
    fingerprint: str
    precision: Precision
    clock: IterationClock  # the phase split and losses of each iteration (timing.py)
    state: TrainState = field(default_factory=TrainState)  # what a checkpoint resumes
    moved: Moved = field(default_factory=Moved)  # this process's bytes, every session's
    phases: Phases = field(default_factory=Phases)  # ... and seconds in each phase
    monitor: Monitor | None = None  # utilisation sampling while the loop runs
    sync_check: SyncCheck | None = None  # train.sync_debug, set by setup (timing.py)

    @functools.cached_property
    def checkpointer(self) -> Checkpointer:
        """The run's checkpoint over its named stateful parts (checkpoint.py): the whole run's,
        and what each rank keeps of its own, saved for every rank."""
        return Checkpointer(
            self.state_dir,
            self.fingerprint,
            run_name(self.out_dir),
            parts={
                **self.runtime.checkpoint_state(self.model, self.optimizer),
                "scaler": self.precision.scaler,
                "train_state": self.state,
            },
            rank_parts={"moved": self.moved, "phases": self.phases, "rng": RandomState(self.ctx.device)},
        )

    @functools.cached_property
    def schedule(self) -> schema.Train:
        """The train section with its warm-up resolved (`auto` -> iterations)."""
        return self.cfg.train.model_copy(update={"warmup_iters": warmup_iterations(self.cfg.train, len(self.sampler))})

    @property
    def state_dir(self) -> Path:
        return self.out_dir / "state"

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def total_steps(self) -> int:
        return self.cfg.train.epochs * len(self.sampler)
