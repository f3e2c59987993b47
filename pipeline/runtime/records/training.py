"""train_summary.json, typed: RunSummary, one run (its identity and typed Run, status, speed,
time split, losses, checkpoints, the evaluations during training, every rank's RankReport,
provenance), and the parts they hold. `RunSummary.from_json` reads a summary of any version
first through `upgrade(raw)`, the one place that knows how older run folders differ.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from ..run import Run
from .base import FACTS, OPTIONAL, REMEDY, Record, RecordError
from .evaluation import Evaluation
from .provenance import Provenance

SKIPPED = {"skipped": True}  # a field a skipped run writes (the others are a finished run's)


@dataclass(frozen=True)
class Bytes(Record):
    """Bytes per iteration each way."""

    sent: float
    received: float


@dataclass(frozen=True)
class StateBytes(Record):
    """Bytes of parameters, gradients and optimizer state one process holds, counted from its
    tensors (a shard counts its local part)."""

    parameters: int
    gradients: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


@dataclass(frozen=True)
class Memory(Record):
    """One process's memory at the end of training. `peak_bytes`: on a GPU the most its tensors
    held at once (torch.cuda.max_memory_allocated, the largest over the GPUs it computes on:
    DataParallel's device 0), on a CPU its peak resident set; `measure` says which."""

    peak_bytes: int
    measure: str
    reserved_bytes: int | None = None  # GPU: torch.cuda.max_memory_reserved (the allocator's)
    per_gpu_bytes: list[int] | None = None  # GPU: max_memory_allocated of each GPU it uses
    state: StateBytes | None = None


@dataclass(frozen=True)
class RankReport(Record):
    """One process at the end of training: its role, the checksum of its weights (equal on
    every replica of a correct run), M (its gradient bytes), and bytes per iteration, measured
    and by the strategy's theory. The rest is what a strategy observed (Runtime.rank_facts)."""

    rank: int | None = None
    role: str | None = None  # worker, server (dedicated ps) or server+worker
    checksum: str | None = None
    gradient_bytes: int | None = None  # M
    bytes_per_iteration: Bytes | None = None
    theory_bytes_per_iteration: Bytes | None = None
    memory: Memory | None = field(default=None, metadata=OPTIONAL)  # None: before it was measured
    # this process's own split of its steady iterations (the first worker's is the summary's
    # time_split, from the log it writes); None: before it was kept
    time_split: TimeSplit | None = field(default=None, metadata=OPTIONAL)
    facts: dict = field(default_factory=dict, metadata=FACTS)  # its strategy's rank_facts


@dataclass(frozen=True)
class SecondsPerIteration(Record):
    mean: float
    p50: float
    p95: float


@dataclass(frozen=True)
class TimeSplit(Record):
    """Mean seconds per iteration in each part; train.time_split: false leaves only data."""

    data: float | None = field(default=None, metadata=OPTIONAL)
    compute: float | None = field(default=None, metadata=OPTIONAL)
    communication: float | None = field(default=None, metadata=OPTIONAL)
    optimizer: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class Checkpoints(Record):
    count: int
    seconds: float
    every: int | None = None  # train.checkpoint_every


@dataclass(frozen=True)
class Utilisation(Record):
    """How utilisation.jsonl was sampled (pipeline/training/monitor.py)."""

    interval_s: float
    samples: int
    gpus: str  # "sampled through NVML", or why not


@dataclass(frozen=True)
class FailedAttempt(Record):
    """A training attempt that failed (pipeline/runtime/attempts.py): how it ended, the last
    line of its log that says why, and where that log is kept."""

    ended: str = ""  # "killed by SIGABRT", "a rank was killed or lost", "exited with code 1"
    reason: str = ""
    log: str | None = None

    def said(self) -> str:
        return f"{self.ended}: {self.reason}" if self.reason else self.ended


@dataclass(frozen=True)
class RunSummary(Record):
    """train_summary.json. A skipped run has its identity, status, reason and provenance; the
    other fields are a finished run's (None: not recorded, e.g. by a run from before it was)."""

    # which run (pipeline/strategies/sweep.py identity)
    run_id: str = field(default="", metadata=SKIPPED)
    entry: str = field(default="", metadata=SKIPPED)
    strategy: str | None = field(default=None, metadata=SKIPPED)
    variant: str | None = field(default=None, metadata=SKIPPED)
    workers: int | None = field(default=None, metadata=SKIPPED)
    images_per_worker: int | None = field(default=None, metadata=SKIPPED)
    data_mode: str = field(default="real", metadata=SKIPPED)  # runs before synthetic mode: real
    precision: str = field(default="fp32", metadata=SKIPPED)  # runs before mixed precision: fp32
    seed: int | None = field(default=None, metadata=SKIPPED)
    run: Run | None = field(default=None, metadata={**SKIPPED, **OPTIONAL})  # the sweep's, typed
    # how it ran
    global_batch: int | None = None
    lr: float | None = None
    device: str | None = None
    backend: str | None = None
    threads: int | None = None
    processes: int | None = None
    status: str = field(default="failed", metadata=SKIPPED)  # ok, skipped
    reason: str = field(default="", metadata=SKIPPED)
    # what it did
    epochs: int | None = None
    iterations: int | None = None
    train_seconds: float | None = None
    evaluation_seconds: float | None = None
    evaluations: list[Evaluation] = field(default_factory=list)
    checkpoints: Checkpoints | None = None
    resumed_at_steps: list[int] = field(default_factory=list)
    restarts: int | None = None
    # The job's attempts that crashed before the one that finished (or, for a failed run, all
    # of them): the run is marked, and its speed taken from the attempt that finished
    failed_attempts: list[FailedAttempt] | None = field(default=None, metadata=OPTIONAL)  # None: none failed
    timed_from_step: int | None = field(default=None, metadata=OPTIONAL)  # where its last attempt resumed
    channels_last: bool | None = None
    warmup_iters: int | None = None
    skipped_steps: int | None = None  # fp16 overflows the scaler skipped
    # how fast
    images_per_second: float | None = None
    sec_per_iter: SecondsPerIteration | None = None
    time_split: TimeSplit | None = None
    timing_excludes_first_iterations: int | None = None
    communication_share: float | None = None
    ranks: list[RankReport] = field(default_factory=list)
    replicas_identical: bool | None = None
    facts: dict = field(default_factory=dict, metadata=FACTS)  # its strategy's summary_facts
    # how well
    epoch_loss: list[float] = field(default_factory=list)
    final_loss: float | None = None
    utilisation: Utilisation | None = None  # None: no utilisation.jsonl (runs before the sampler)
    provenance: Provenance = field(default_factory=Provenance, metadata=SKIPPED)

    def __post_init__(self):
        # The stages that write a summary pass runtime/provenance.collect's dict
        if isinstance(self.provenance, dict):
            object.__setattr__(self, "provenance", Provenance.from_json(self.provenance, "provenance"))

    def to_json(self) -> dict:
        """The file's JSON object: a skipped run's fields only, for a skipped run."""
        whole = super().to_json()
        if self.status != "skipped":
            return whole
        return {
            f.name: whole[f.name] for f in dataclasses.fields(self) if f.metadata.get("skipped") and f.name in whole
        }

    @classmethod
    def from_json(cls, raw: dict, where: str = "train_summary.json", folder: str | None = None) -> RunSummary:
        """A summary as any version of the pipeline wrote it (`folder`: the run directory's
        name, the run id of a summary that does not say); `where` names it in errors."""
        if not isinstance(raw, dict):
            raise RecordError(f"{where}: expected a JSON object, found {type(raw).__name__}; {REMEDY}")
        return super().from_json(upgrade(raw, folder, where), where)

    @classmethod
    def read(cls, path, **how) -> RunSummary:
        """RUN_DIR/train_summary.json (a summary that names no run: the directory's name)."""
        return super().read(path, **{"folder": Path(path).parent.name, **how})


# ---- older run folders -----------------------------------------------------------------------
RENAMED = {"world_size": "workers"}  # old key -> new key, in the summary, its provenance and run
IDENTITY = ("strategy", "workers", "images_per_worker", "data_mode", "precision", "seed")


def _rename(record: dict, where: str) -> None:
    for old, new in RENAMED.items():
        if old in record:
            if new in record:
                raise RecordError(
                    f"{where}: both '{old}' and '{new}'; '{old}' is the old name of '{new}', keep only '{new}'"
                )
            record[new] = record.pop(old)


def upgrade(raw: dict, folder: str | None = None, where: str = "train_summary.json") -> dict:
    """A summary of any earlier version as this version writes it (a copy): every difference
    of older run folders, in one place.

    * `world_size` is now `workers` (in the summary, its provenance and the provenance's run);
    * run_id was not always written: the run directory's name (`folder`); entry, before
      repeats, was the run itself;
    * the seed was only in the provenance;
    * the typed run was only the provenance's run entry (or, without one, the summary's
      identity); the options it predates are its strategy's to default
      (pipeline/strategies `recorded`: what such a run ran with);
    * every other key a run did not write yet takes its field's default: None, not recorded
      (no `utilisation`: the run has no utilisation.jsonl; no `timing_excludes_first_iterations`:
      unrecorded), or what every run was then (`data_mode` real, `precision` fp32)."""
    raw = copy.deepcopy(raw)
    _rename(raw, where)
    provenance = raw.get("provenance")
    if isinstance(provenance, dict):
        _rename(provenance, f"{where}: provenance")
        entry = provenance.get("run")
        if isinstance(entry, dict):
            _rename(entry, f"{where}: provenance.run")
        if raw.get("seed") is None and provenance.get("seed") is not None:
            raw["seed"] = provenance["seed"]
    if raw.get("run") is None:
        raw["run"] = _recorded_run(raw)
    if not raw.get("run_id") and folder:
        raw["run_id"] = folder
    if not raw.get("entry") and raw.get("run_id"):
        raw["entry"] = raw["run_id"]
    return raw


def _recorded_run(raw: dict) -> dict | None:
    """The run of a summary written before it carried one: its provenance's run entry, the
    summary's identity filling what that entry lacks (a seed, a precision it predates); None
    where the summary names no strategy or workers (one made by hand)."""
    provenance = raw.get("provenance")
    entry = provenance.get("run") if isinstance(provenance, dict) else None
    identity = {k: raw[k] for k in IDENTITY if raw.get(k) is not None}
    run = {**identity, **(entry if isinstance(entry, dict) else {})}
    return run if "strategy" in run and "workers" in run else None
