"""What a run carries from one iteration to the next, apart from the weights: below both the loop
(pipeline/training/train.py) and the checkpoint (checkpoint.py), which saves it as one named part
beside the model, the optimizer and the scaler, and never sees the loop's own object.

    TrainState   the position (epoch, batch, step), the seconds, the checkpoints and sessions
    Moved        this process's byte counters (one per rank in a checkpoint)
    Phases       this process's seconds in each phase of an iteration (likewise)
    RandomState  this process's generators (one per rank in a checkpoint)
    Stopwatch    training seconds, with checkpoints and evaluations kept out of them
"""

from __future__ import annotations

import time
import typing
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

WARMUP_ITERATIONS_EXCLUDED = 5  # first iterations (allocator, caches) left out of timing stats


@dataclass
class TrainState:
    """The run's resumable position, the same on every rank."""

    epoch: int = 0  # the epoch in progress (or the next one)
    batch: int = 0  # batches of it done
    step: int = 0  # iterations done
    train_seconds: float = 0.0
    evaluation_seconds: float = 0.0  # evaluations during training, kept out of train_seconds
    checkpoints: dict = field(default_factory=lambda: {"count": 0, "seconds": 0.0})  # likewise
    sessions: list = field(default_factory=list)  # where each (re)start began, torchrun's restart count

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        for name, value in state.items():
            setattr(self, name, type(getattr(self, name))(value))

    def begin_session(self, restart: int) -> None:
        """One record per session of the run: where it started, and torchrun's restart count."""
        self.sessions.append({"step": self.step, "restart": restart})


@dataclass
class Moved:
    """Bytes this process sent and received over the run's iterations, every session's."""

    sent: int = 0
    received: int = 0
    iterations: int = 0

    def add(self, sent: int, received: int) -> None:
        self.sent += sent
        self.received += received
        self.iterations += 1

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        self.sent, self.received, self.iterations = state["sent"], state["received"], state["iterations"]


@dataclass
class Phases:
    """Seconds this process spent in each timed phase (data, compute, communication, optimizer)
    over its steady iterations, every session's: its own time split, which the summary keeps
    per rank (one process's wait for another shows only on one side) and, read from the first
    worker's iteration log (`of`), as the run's."""

    excluded: int = WARMUP_ITERATIONS_EXCLUDED  # the first iterations (allocator, caches)
    seconds: dict = field(default_factory=dict)  # "steady" and "first": phase -> seconds
    iterations: dict = field(default_factory=dict)  # ... and how many iterations each

    PHASES = ("data", "compute", "communication", "optimizer")

    @classmethod
    def of(cls, records: list[dict]) -> Phases:
        """The split of an iteration log's records (the summary's, from the first worker's log)."""
        phases = cls()
        for record in records:
            phases.add(record)
        return phases

    def add(self, record: dict) -> None:
        part = "first" if record["step"] <= self.excluded else "steady"
        sums = self.seconds.setdefault(part, {})
        for phase in self.PHASES:
            value = record.get(f"time_{phase}")
            if value is not None:
                sums[phase] = sums.get(phase, 0.0) + value
        self.iterations[part] = self.iterations.get(part, 0) + 1

    def means(self) -> dict[str, float]:
        """Mean seconds per steady iteration of each phase timed; where every iteration was one
        of the first, theirs (as summary.py reads a log that short); {} before any."""
        part = "steady" if self.iterations.get("steady") else "first"
        count = self.iterations.get(part, 0)
        return {phase: total / count for phase, total in self.seconds.get(part, {}).items()} if count else {}

    def state_dict(self) -> dict:
        return {
            "seconds": {part: dict(sums) for part, sums in self.seconds.items()},
            "iterations": dict(self.iterations),
        }

    def load_state_dict(self, state: dict) -> None:
        self.seconds = {part: dict(sums) for part, sums in state["seconds"].items()}
        self.iterations = dict(state["iterations"])


class RandomState:
    """This process's torch, CUDA and NumPy generators, as tensors and plain numbers (loadable
    with weights_only=True), so that the rest of an epoch draws what it would have drawn."""

    def __init__(self, device: torch.device):
        self.device = device

    def state_dict(self) -> dict:
        kind, keys, position, has_gauss, cached = typing.cast(tuple, np.random.get_state())  # the legacy tuple form
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None,
            "numpy": {
                "keys": torch.from_numpy(keys.astype(np.int64)),
                "position": int(position),
                "has_gauss": int(has_gauss),
                "cached_gaussian": float(cached),
            },
        }

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if state["cuda"] is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda"], self.device)
        numpy = state["numpy"]
        np.random.set_state(
            (
                "MT19937",
                numpy["keys"].numpy().astype(np.uint32),
                numpy["position"],
                numpy["has_gauss"],
                numpy["cached_gaussian"],
            )
        )


class Stopwatch:
    """The seconds of one stretch of training, added to `state.train_seconds`; a pause (a
    checkpoint) is left out. `lap()` starts an iteration: its data wait and its whole time
    count from there."""

    def __init__(self, state: TrainState):
        self.state = state
        self.since = self.lap_start = time.perf_counter()

    def lap(self) -> None:
        self.lap_start = time.perf_counter()

    def lap_seconds(self, now: float | None = None) -> float:
        return (time.perf_counter() if now is None else now) - self.lap_start

    def elapsed(self, now: float) -> float:
        """Training seconds of the run up to `now`, every earlier stretch included."""
        return self.state.train_seconds + now - self.since

    def stop(self) -> None:
        self.state.train_seconds += time.perf_counter() - self.since

    @contextmanager
    def paused(self):
        self.stop()
        yield
        self.since = time.perf_counter()
