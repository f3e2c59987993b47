"""The run records: what train_summary.json and the files beside it hold, as types (the
standard library only, no torch).

    RunSummary   one run: its identity and typed Run (run.py), status, speed, time split,
                 losses, checkpoints, the evaluations during training, every rank's report,
                 provenance
    RankReport   one process: role, checksum, bytes per iteration measured and by theory
    Evaluation   one evaluation during training (AP against training seconds)
    Provenance   where a stage's result came from (runtime/provenance.py), with its Hardware
    Metrics      RUN_DIR/metrics.json: the final model's COCO AP, or why it was not scored
    CommbenchRecord  a commbench file: LinkFit per primitive, SharedCompute, Calibrations
    EquivalenceRecord  the one-step check: a StepCheck per strategy

Training builds a RunSummary (pipeline/training/summary.py), the launcher a skipped one
(pipeline/launch.py), and the report reads one (pipeline/report/load.py). `to_json()` gives the
file's JSON object, the keys it always had; `from_json(raw)` reads it back, first through
`upgrade(raw)`, the one place that knows how older run folders differ, and refuses a key no field
declares, so a misspelt key fails when the file is read instead of becoming an empty column.

A new fact is one field here (with its default: None, "not recorded") plus the line that
computes it. A strategy's own facts (Runtime.summary_facts, rank_facts) are declared by its
module (`declare_facts`), which this one does not name: they are kept in the record's `facts`,
written as keys of their own beside its fields, and only when the strategy reports them.
Records other stages write for other readers too (the provenance, commbench's) are
OpenRecords: a key no field declares is kept as written rather than refused.
`Record.read(path)` reads any of them from its file.

It lives on the ground floor (runtime) because every layer that writes or reads a run, from
training to the report and the launcher, imports it; it imports nothing of the pipeline.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from .run import Run

SKIPPED = {"skipped": True}    # a field a skipped run writes (the others are a finished run's)
OPTIONAL = {"optional": True}  # written only when set: a strategy's own facts, a stage's own


class RecordError(ValueError):
    """A run record that cannot be read: the message names the file, the key and the remedy."""


def _inside(where: str, key: str) -> str:
    """Where `key` is, inside `where`: FILE: key, then FILE: key.inner, FILE: ranks[1].role."""
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def _decode(hint, value, where: str):
    """A JSON value as the type `hint` says: records from their objects, lists item by item."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode(inner[0], value, where) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, found {type(value).__name__}; {REMEDY}")
        return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, found {type(value).__name__}; {REMEDY}")
        return {k: _decode(item, v, _inside(where, k)) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, (Record, Run)):
        return hint.from_json(value, where)
    return value


def _encode(value):
    if isinstance(value, (Record, Run)):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


REMEDY = ("correct it, or delete the run directory and rerun its training (its fields are "
          "declared in pipeline/runtime/record.py)")
# A strategy's facts (Runtime.summary_facts, rank_facts) are declared keys, not free ones
STRATEGY_REMEDY = ("a strategy's facts are declared by its module: record.declare_facts("
                   "RunSummary (summary_facts) or RankReport (rank_facts), name=type)")
FACTS = {"facts": True}  # the field that holds a strategy's declared facts, written flat
_DECLARED: dict[type, dict[str, typing.Any]] = {}  # record -> fact name -> its type


def declare_facts(record: type, **hints) -> None:
    """Facts a strategy's module reports in `record` (RunSummary or RankReport), by name and
    type (a Record type is read back as one). Declared once at its import: a summary is read
    where the registry (pipeline/strategies) has been imported, as the report and the tests do."""
    clash = set(hints) & set(record.field_names())
    if clash:
        raise ValueError(f"{record.__name__} already has a field {sorted(clash)[0]!r}")
    _DECLARED.setdefault(record, {}).update(hints)


class Record:
    """to_json / from_json for a dataclass whose fields are JSON values or other records."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.metadata.get("facts"):
                out.update({k: _encode(v) for k, v in value.items()})
            elif not (f.metadata.get("optional") and value is None):
                out[f.name] = _encode(value)
        return out

    @classmethod
    def read(cls, path, **how):
        """This record from the JSON file at `path` (errors name the file)."""
        return cls.from_json(json.loads(Path(path).read_text()), str(path), **how)

    @classmethod
    def fields_of(cls, raw: dict, where: str, remedy: str = REMEDY) -> dict:
        """The fields a JSON object of this record holds, decoded (records from their objects);
        a key no field declares is an error naming it, `where` it is and the `remedy`."""
        if not isinstance(raw, dict):
            raise RecordError(f"{where}: expected a JSON object for {cls.__name__}, found "
                              f"{type(raw).__name__}; {remedy}")
        facts = _DECLARED.get(cls, {})
        known = {name.lower(): name for name in [*cls.field_names(), *facts]}
        if issubclass(cls, OpenRecord):  # another stage's record: its other keys kept as written
            other = {k: v for k, v in raw.items() if k not in known.values()}
            raw = {**{k: v for k, v in raw.items() if k in known.values()},
                   **({"other": other} if other else {})}
        for key in raw:
            if key not in known.values():
                close = difflib.get_close_matches(key.lower(), list(known), n=1)
                hint = f" (did you mean '{known[close[0]]}'?)" if close else ""
                raise RecordError(f"{where}: unknown key '{key}'{hint} in {cls.__name__}; {remedy}")
        hints = {**typing.get_type_hints(cls), **facts}
        decoded = {k: _decode(hints[k], v, _inside(where, k)) for k, v in raw.items()}
        reported = {k: decoded.pop(k) for k in list(decoded) if k in facts}
        return {**decoded, "facts": reported} if reported else decoded

    @classmethod
    def from_json(cls, raw: dict, where: str = ""):
        """This record from its JSON object; a missing key takes its field's default."""
        where = where or cls.__name__
        try:
            return cls(**cls.fields_of(raw, where))
        except TypeError as err:  # a field without a default is missing
            raise RecordError(f"{where}: {cls.__name__} incomplete ({err}); {REMEDY}") from None


@dataclass(frozen=True)
class OpenRecord(Record):
    """A record another stage writes for more readers than the report (the provenance, the
    commbench stage's fits): the keys read here are fields; any other is kept in `other` and
    written back as it was, so a file with a key of an older or newer version is still read."""

    other: dict = field(default_factory=dict, kw_only=True)

    def to_json(self) -> dict:
        whole = super().to_json()
        other = whole.pop("other")
        return {**whole, **other}


@dataclass(frozen=True)
class Evaluation(Record):
    """One evaluation during training: COCO box AP after `step` steps and `train_seconds` of
    training; `seconds` the evaluation took (kept out of training time)."""

    epoch: int
    step: int
    train_seconds: float
    AP: float
    AP50: float
    AP75: float
    seconds: float


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
    reserved_bytes: int | None = None    # GPU: torch.cuda.max_memory_reserved (the allocator's)
    per_gpu_bytes: list[int] | None = None  # GPU: max_memory_allocated of each GPU it uses
    state: StateBytes | None = None


@dataclass(frozen=True)
class RankReport(Record):
    """One process at the end of training: its role, the checksum of its weights (equal on
    every replica of a correct run), M (its gradient bytes), and bytes per iteration, measured
    and by the strategy's theory. The rest is what a strategy observed (Runtime.rank_facts)."""

    rank: int | None = None
    role: str | None = None            # worker, server (dedicated ps) or server+worker
    checksum: str | None = None
    gradient_bytes: int | None = None  # M
    bytes_per_iteration: Bytes | None = None
    theory_bytes_per_iteration: Bytes | None = None
    memory: Memory | None = field(default=None, metadata=OPTIONAL)  # None: before it was measured
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


# ---- where a result came from (runtime/provenance.py) --------------------------------------------
@dataclass(frozen=True)
class Hardware(OpenRecord):
    """The machine a stage ran on (runtime/provenance.hardware); GPU fields where torch saw CUDA."""

    machine: str | None = field(default=None, metadata=OPTIONAL)
    processor: str | None = field(default=None, metadata=OPTIONAL)
    cpu_count: int | None = field(default=None, metadata=OPTIONAL)
    hostname: str | None = field(default=None, metadata=OPTIONAL)
    os: str | None = field(default=None, metadata=OPTIONAL)
    cuda_available: bool | None = field(default=None, metadata=OPTIONAL)
    gpus: list[str] | None = field(default=None, metadata=OPTIONAL)
    cuda: str | None = field(default=None, metadata=OPTIONAL)
    driver: str | None = field(default=None, metadata=OPTIONAL)

    @property
    def model(self) -> str:
        """The processor's name, else the architecture, else '?'."""
        return self.processor or (self.machine if self.machine is not None else "?")

    @property
    def cores(self) -> str:
        return "?" if self.cpu_count is None else str(self.cpu_count)


@dataclass(frozen=True)
class Provenance(OpenRecord):
    """runtime/provenance.collect's record: the stage's params, code revision, package versions
    and hardware, plus the facts the stage adds (a training run: its sweep entry, seed, shape)."""

    params: dict | None = field(default=None, metadata=OPTIONAL)
    git_revision: str | None = field(default=None, metadata=OPTIONAL)
    packages: dict[str, str] | None = field(default=None, metadata=OPTIONAL)
    hardware: Hardware | None = field(default=None, metadata=OPTIONAL)
    argv: list[str] | None = field(default=None, metadata=OPTIONAL)
    knobs: dict | None = field(default=None, metadata=OPTIONAL)
    run: dict | None = field(default=None, metadata=OPTIONAL)  # the filled sweep entry
    seed: int | None = field(default=None, metadata=OPTIONAL)
    workers: int | None = field(default=None, metadata=OPTIONAL)
    processes: int | None = field(default=None, metadata=OPTIONAL)
    threads: int | None = field(default=None, metadata=OPTIONAL)
    device: str | None = field(default=None, metadata=OPTIONAL)
    backend: str | None = field(default=None, metadata=OPTIONAL)

    def package(self, name: str) -> str | None:
        return (self.packages or {}).get(name)

    @property
    def dataset(self) -> str | None:
        """The data the stage read: data.name of its params."""
        return ((self.params or {}).get("data") or {}).get("name")


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
        return {f.name: whole[f.name] for f in dataclasses.fields(self)
                if f.metadata.get("skipped") and f.name in whole}

    @classmethod
    def from_json(cls, raw: dict, where: str = "train_summary.json",
                  folder: str | None = None) -> RunSummary:
        """A summary as any version of the pipeline wrote it (`folder`: the run directory's
        name, the run id of a summary that does not say); `where` names it in errors."""
        if not isinstance(raw, dict):
            raise RecordError(f"{where}: expected a JSON object, found {type(raw).__name__}; "
                              f"{REMEDY}")
        return super().from_json(upgrade(raw, folder, where), where)

    @classmethod
    def read(cls, path) -> RunSummary:
        """RUN_DIR/train_summary.json (a summary that names no run: the directory's name)."""
        return super().read(path, folder=Path(path).parent.name)


# ---- what the evaluate, commbench and equivalence stages write ---------------------------------
@dataclass(frozen=True)
class Metrics(Record):
    """RUN_DIR/metrics.json (pipeline/detection/evaluate.py): COCO box AP and AR of the final
    model (None: not scored, or -1 from COCO: no objects of that size), how the evaluation ran;
    a run that was not scored says why in `status` and `reason`."""

    run_id: str | None = None
    status: str = field(default="ok", metadata=OPTIONAL)  # written only where it is not ok
    reason: str = field(default="", metadata=OPTIONAL)
    AP: float | None = None
    AP50: float | None = None
    AP75: float | None = None
    APs: float | None = None
    APm: float | None = None
    APl: float | None = None
    AR1: float | None = None
    AR10: float | None = None
    AR100: float | None = None
    ARs: float | None = None
    ARm: float | None = None
    ARl: float | None = None
    images: int | None = field(default=None, metadata=OPTIONAL)
    batch_size: int | None = field(default=None, metadata=OPTIONAL)
    detections: int | None = field(default=None, metadata=OPTIONAL)
    inference_seconds: float | None = field(default=None, metadata=OPTIONAL)
    processes: int | None = field(default=None, metadata=OPTIONAL)
    scoring_seconds: float | None = field(default=None, metadata=OPTIONAL)
    eval_backend: str | None = field(default=None, metadata=OPTIONAL)
    provenance: Provenance | None = field(default=None, metadata=OPTIONAL)

    @property
    def scored(self) -> bool:
        return self.status == "ok"


@dataclass(frozen=True)
class Check(OpenRecord):
    """How a commbench measurement was checked against its bands (costmodel/bands.py): its
    attempts, the one kept, and why it is `disturbed` (None: inside its bands)."""

    attempts: list[dict] = field(default_factory=list)
    kept: int | None = None
    disturbed: str | None = None


@dataclass(frozen=True)
class LinkFit(OpenRecord):
    """One primitive's fit, seconds = alpha_s + beta_s_per_byte x bytes, over its timings."""

    alpha_s: float
    beta_s_per_byte: float
    bandwidth_gbit_s: float | None = None
    r2: float | None = None
    relative_residuals: list[float] = field(default_factory=list)
    check: Check | None = None


@dataclass(frozen=True)
class InStep(OpenRecord):
    """The exchange inside a step (pipeline/commbench/in_step.py, fitted by
    pipeline/costmodel/in_step.py): the wait for the slower worker (measured, and what
    slowest_wait's formula makes of `variance_s2`), contention with compute, the fixed cost per
    DDP bucket and per point-to-point message, each hook's own work per byte; DDP's `buckets`
    of the model. Its timings are kept as other keys."""

    processes: int
    images: int
    wait_s: float
    variance_s2: float
    alone_variance_s2: float
    contention: float
    bucket_s: float
    message_s: float
    bucket_bytes: float
    buckets: list[float] = field(default_factory=list)
    hook_s_per_byte: dict[str, float] = field(default_factory=dict)
    formula_wait_s: float | None = None


@dataclass(frozen=True)
class SharedCompute(OpenRecord):
    """Forward + backward of `images` alone and with every process at once: `factor` slower;
    `in_step`, what an exchange costs inside such a step (None: before it was measured)."""

    factor: float
    expected: float = 1.0  # a quiet machine's factor (before it was recorded: 1)
    images: int | None = None
    alone_s: float | None = None
    together_s: float | None = None
    check: Check | None = None
    in_step: InStep | None = field(default=None, metadata=OPTIONAL)

    @property
    def disturbed(self) -> bool:
        return bool(self.check and self.check.disturbed)


@dataclass(frozen=True)
class Calibrations(OpenRecord):
    """Strategies timed on the model: name -> setting -> seconds (fsdp: keep_s, reshard_s)."""

    strategies: dict[str, dict[str, float]] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    images: int | None = None


@dataclass(frozen=True)
class CommbenchRecord(OpenRecord):
    """results/commbench/<preset>/p<N>.json (pipeline/commbench/): this host's links at
    `processes` processes, the shared-compute factor and the strategies timed on the model."""

    processes: int
    primitives: dict[str, LinkFit] = field(default_factory=dict)  # send_recv, all_reduce, ...
    backend: str | None = None
    shared_compute: SharedCompute | None = None
    calibrations: Calibrations | None = None
    disturbed: list[str] = field(default_factory=list)
    provenance: Provenance | None = None


@dataclass(frozen=True)
class StepCheck(Record):
    """One strategy's step beside single's: the largest weight difference, absolute and relative
    to single's step, or why it was `skipped`."""

    max_abs_difference: float | None = None
    relative_to_step: float | None = None
    skipped: str | None = field(default=None, metadata=OPTIONAL)
    # |step - single's step| / |single's step| over all weights (None: before it was measured)
    step_distance: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class SplitDistance(Record):
    """Under one `norm`, how far 2 workers x 4 images move the step of 1 worker x 8, relative
    to its norm: `split` (4 + 4, averaged) and `resample` (the same 8 images, another sampling
    seed) from one process (pipeline/detection/split_probe.py); `launched`: ddp-w2's step
    against single's, the real strategies from the same weights (pipeline/equivalence.py)."""

    norm: str
    split: float
    resample: float
    launched: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class EquivalenceRecord(Record):
    """results/equivalence/<preset>.json (pipeline/equivalence.py): one SGD step of each
    strategy from the same weights and batch as the `reference` single run."""

    reference: str
    max_abs_step_of_single: float
    why: str
    strategies: dict[str, StepCheck] = field(default_factory=dict)
    # Each cause of the difference with and without it (the tiny model's norms; before: none)
    causes: list[SplitDistance] | None = field(default=None, metadata=OPTIONAL)

    @property
    def relative_steps(self) -> dict[str, float]:
        """strategy -> how far its step landed from single's, relative to the step, where run."""
        return {name: step.relative_to_step for name, step in self.strategies.items()
                if step.skipped is None and step.relative_to_step is not None}


# ---- older run folders -----------------------------------------------------------------------
RENAMED = {"world_size": "workers"}  # old key -> new key, in the summary, its provenance and run
IDENTITY = ("strategy", "workers", "images_per_worker", "data_mode", "precision", "seed")


def _rename(record: dict, where: str) -> None:
    for old, new in RENAMED.items():
        if old in record:
            if new in record:
                raise RecordError(f"{where}: both '{old}' and '{new}'; '{old}' is the old name "
                                  f"of '{new}', keep only '{new}'")
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


__all__ = ["Bytes", "Calibrations", "Check", "Checkpoints", "CommbenchRecord", "EquivalenceRecord",
           "Evaluation", "Hardware", "LinkFit", "Memory", "Metrics", "Provenance", "RankReport",
           "RecordError", "RunSummary", "STRATEGY_REMEDY", "SecondsPerIteration", "SharedCompute", "SplitDistance",
           "StateBytes", "StepCheck", "TimeSplit", "Utilisation", "declare_facts", "upgrade"]
