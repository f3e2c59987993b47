"""Reading run directories into frames, and the metrics derived from them.

Only pandas here, no plotting: benchmark scripts import one metric from this module without
paying for matplotlib and seaborn.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from ..runtime.files import read_json
from ..runtime.records.evaluation import Evaluation, Metrics
from ..runtime.records.training import RunSummary
from ..strategies import STRATEGIES, recorded

TRAFFIC_COLUMNS = [
    "run_id",
    "rank",
    "role",
    "sent_per_iter",
    "received_per_iter",
    "theory_sent_per_iter",
    "theory_received_per_iter",
    "gradient_bytes",
]
AP_COLUMNS = ["AP", "AP50", "AP75"]
TIME_SPLIT = ["data", "compute", "communication", "optimizer"]
# Kept beside progress_per_epoch so the report's definition cannot drift from the code.
PROGRESS_DEFINITION = (
    "training progress per epoch = mean decrease of the epoch-mean total training loss per epoch, "
    "(L_1 - L_E) / (E - 1) for E epochs with epoch-mean losses L_1..L_E; undefined (n/a) for a "
    "single epoch. The published study did not define its measure, so its values are quoted, "
    "not recomputed."
)


def progress_per_epoch(epoch_loss: list[float]) -> float:
    """Training progress per epoch: the mean per-epoch decrease of the epoch-mean total loss.

    (epoch_loss[0] - epoch_loss[-1]) / (n_epochs - 1); NaN with fewer than two epochs, where no
    decrease can be measured. Positive means the loss went down.
    """
    if len(epoch_loss) < 2:
        return math.nan
    return (epoch_loss[0] - epoch_loss[-1]) / (len(epoch_loss) - 1)


def read_input(path: Path) -> dict:
    """read_json, plus the remedy for a missing file and a check that it holds an object."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: file not found; run the train and evaluate stages for this run first (snakemake --cores all)"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a JSON object, found {type(data).__name__}; delete it and rerun the stage that writes it"
        )
    return data


def read_iterations(path: Path) -> pd.DataFrame:
    """iterations.jsonl as a frame, naming the file and line of any broken record."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: file not found; the run says it finished, so delete its run directory and rerun its training"
        )
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(
                    f"{path}: line {number} is not valid JSON ({err.msg}); delete "
                    "the run directory and rerun its training"
                ) from err
    if not records:
        raise ValueError(
            f"{path}: no iteration records in a finished run; delete the run directory and rerun its training"
        )
    return pd.DataFrame.from_records(records)


def read_utilisation(path: Path) -> list[dict]:
    """utilisation.jsonl's samples, for a run whose summary says it sampled."""
    if not path.exists():
        raise FileNotFoundError(
            f"{path}: file not found; the run's summary says it sampled "
            "utilisation, so delete its run directory and rerun its training"
        )
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@dataclass(frozen=True)
class RunDir:
    """One run directory as the report reads it: the summary (whichever version wrote it), the
    metrics, and for a completed run its iterations and utilisation samples. `status` and
    `reason` are the summary's, or the evaluation's where that failed."""

    summary: RunSummary
    status: str
    reason: str = ""
    metrics: Metrics = field(default_factory=Metrics)
    evaluated: bool = False  # completed and scored (a run on in-memory tensors is only timed)
    iterations: pd.DataFrame | None = None
    utilisation: list[dict] = field(default_factory=list)
    dir: Path | None = None

    @property
    def run_id(self) -> str:
        return self.summary.run_id

    @property
    def entry(self) -> str:
        return self.summary.entry

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def load_run(run_dir: str | Path) -> RunDir:
    """The inputs of one run directory (the records of pipeline/runtime/records/)."""
    run = load_result(run_dir)
    sampled = run.ok and run.summary.utilisation is not None  # None: before the sampler
    assert run.dir is not None  # load_result sets it
    return dataclasses.replace(
        run,
        iterations=read_iterations(run.dir / "iterations.jsonl") if run.ok else None,
        utilisation=read_utilisation(run.dir / "utilisation.jsonl") if sampled else [],
    )


def load_result(run_dir: str | Path) -> RunDir:
    """A run directory's summary and metrics, without its per-iteration and utilisation
    samples (a COCO run's iterations.jsonl holds ~10^5 lines): what comparing results needs."""
    run_dir = Path(run_dir)
    path, metrics_path = run_dir / "train_summary.json", run_dir / "metrics.json"
    summary = RunSummary.from_json(read_input(path), str(path), folder=run_dir.name)
    metrics = Metrics.from_json(read_input(metrics_path), str(metrics_path))
    status, reason = summary.status, summary.reason
    # A run trained on in-memory tensors is timed, not scored: it stays a completed run.
    if status == "ok" and not metrics.scored and summary.data_mode != "synthetic":
        status, reason = metrics.status, metrics.reason  # evaluation failed
    if status == "ok" and metrics.scored and any(getattr(metrics, k) is None for k in AP_COLUMNS):
        raise ValueError(f"{metrics_path}: no AP values for a completed run; delete it and rerun the evaluate stage")
    return RunDir(summary, status, reason or "", metrics, status == "ok" and metrics.scored, dir=run_dir)


def has_variant(variant) -> bool:
    return isinstance(variant, str) and bool(variant)  # read back from CSV, '' becomes NaN


def strategy_label(strategy: str, variant, data_mode: str = "real") -> str:
    """How tables and figures name an entry's strategy: its class's one display name, then
    what tells the entry apart: parameter server (dedicated-k2), DDP (synthetic data)."""
    declared = STRATEGIES.get(strategy)
    details = ([variant] if has_variant(variant) else []) + ([] if data_mode == "real" else [f"{data_mode} data"])
    name = declared.label if declared else strategy  # a run of a strategy no longer registered
    return name + (f" ({', '.join(details)})" if details else "")


# A variant's parts in a reader's words (the verdict names no run ids): ps's placement and
# shards, its staleness, FSDP2's keeping the weights gathered, DDP's compression hooks.
VARIANT_WORDS = (
    (r"^colocated$", ""),
    (r"^dedicated$", "dedicated server"),
    (r"^k(\d+)$", r"\1 shards"),
    (r"^ssp(\d+)$", r"staleness \1"),
    (r"^keep$", "weights kept gathered"),
    (r"^fp16$", "fp16-compressed gradients"),
    (r"^bf16$", "bf16-compressed gradients"),
    (r"^powersgd$", "PowerSGD"),
)


def reader_name(strategy: str | None, variant, data_mode: str = "real", workers=None) -> str:
    """An entry as a reader names it: 'DDP, 2 workers', 'parameter server (2 shards), 2
    workers', 'FSDP2 (weights kept gathered), 2 workers'; no run id's hyphens."""
    declared = STRATEGIES.get(strategy or "")  # None: a summary that names none
    words = []
    for part in variant.split("-") if has_variant(variant) else []:
        for pattern, replacement in VARIANT_WORDS:
            if re.match(pattern, part):
                part = re.sub(pattern, replacement, part)
                break
        if part:
            words.append(part)
    if data_mode not in ("real", None) and data_mode == data_mode:  # NaN: real
        words.append("in-memory data" if data_mode == "synthetic" else f"{data_mode} data")
    name = (declared.label if declared else strategy or "") + (f" ({', '.join(words)})" if words else "")
    if workers is None or workers != workers:
        return name
    return f"{name}, {int(workers)} worker{'s' if int(workers) != 1 else ''}"


def reader_names(summary: pd.DataFrame, workers: bool = True) -> dict[str, str]:
    """entry -> reader_name (with its worker count or without) for each entry of summary.csv's
    frame; entries that would share a name are told apart by their images a step, then their
    threads: 'single process, 1 worker (4 images a step)'."""
    firsts = summary.groupby("entry", sort=False).first()
    names = {
        e: reader_name(r["strategy"], r["variant"], r["data_mode"], r["workers"] if workers else None)
        for e, r in firsts.iterrows()
    }
    # Without the worker count, entries of different worker counts share a name harmlessly: the
    # sentence that names them states the count. Within one count they are told apart.
    groups: dict[tuple, list[str]] = {}
    for e, n in names.items():
        groups.setdefault((n, firsts.loc[e, "workers"]), []).append(e)
    for (name, _), same in groups.items():
        if len(same) < 2:
            continue
        for column, unit in (("global_batch", "image"), ("threads", "thread")):
            if firsts.loc[same, column].nunique(dropna=False) > 1:
                for e in same:
                    value = firsts.loc[e, column]
                    count = "?" if value != value else int(value)
                    names[e] = f"{name} ({count} {unit}{'' if count == 1 else 's'}" + (
                        " a step)" if column == "global_batch" else ")"
                    )
                break
    return names


def is_baseline(strategy, variant) -> bool:
    """The runs every speed-up is measured against, as their strategy declares
    (Strategy.is_baseline: `single` as configured, not a variant of it)."""
    declared = STRATEGIES.get(strategy)
    return declared is not None and declared.is_baseline(variant if has_variant(variant) else "")


def baseline_mask(frame: pd.DataFrame) -> pd.Series:
    """Which rows of a frame with strategy and variant columns are baseline runs."""
    return pd.Series(
        [is_baseline(s, v) for s, v in zip(frame["strategy"], frame["variant"], strict=False)],
        index=frame.index,
        dtype=bool,
    )


T = typing.TypeVar("T")


def required(value: T | None, what: str) -> T:
    """`value`, which a finished run's stage (or, for the report's data, build()) always sets
    before it is read; None (an unfinished run, a test's partial ReportData) fails here, naming it."""
    if value is None:
        raise ValueError(f"{what} is not set: a finished run, or the report's build(), sets it before it is read")
    return value


def speed(summary: RunSummary) -> float:
    """A completed run's images/s (a skipped run has none)."""
    return required(summary.images_per_second, f"{summary.run_id}'s images_per_second")


def number(value) -> float:
    """NaN for missing values and for COCO's -1 ('no objects of that size'), so means stay honest."""
    return math.nan if value is None or value == -1 else float(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def busiest_rank_bytes(summary: RunSummary, key: str) -> float:
    """Bytes sent plus received per iteration by the rank that moves the most (the server, for
    a parameter server; any rank, for all-reduce). `key`: bytes_per_iteration (measured) or
    theory_bytes_per_iteration."""
    totals = [getattr(r, key).sent + getattr(r, key).received for r in summary.ranks]
    return max(totals) if totals else math.nan


def largest_memory(summary: RunSummary, part: str) -> float:
    """MiB of the process that holds the most: `peak` (its peak memory, record.Memory) or
    `state` (the parameters, gradients and optimizer state it owns); NaN before memory was
    recorded."""
    memories = [r.memory for r in summary.ranks if r.memory is not None]
    values = (
        [memory.peak_bytes for memory in memories]
        if part == "peak"
        else [memory.state.total for memory in memories if memory.state is not None]
    )
    return max(values) / 2**20 if values else math.nan


def theory_state(summary: RunSummary) -> float:
    """MiB of parameters, gradients and optimizer state that the busiest process of the run
    holds by its strategy's analysis (Strategy.memory_theory), for the run's M."""
    declared = STRATEGIES.get(summary.strategy or "")
    grad_bytes = next((r.gradient_bytes for r in summary.ranks if r.gradient_bytes), None)
    if declared is None or summary.run is None or grad_bytes is None:
        return math.nan
    return sum(declared.memory_theory(recorded(summary.run), grad_bytes).values()) / 2**20


def traffic_frame(runs: list[RunDir]) -> pd.DataFrame:
    rows = [
        {
            "run_id": run.run_id,
            "rank": r.rank,
            "role": r.role,
            "sent_per_iter": r.bytes_per_iteration.sent,
            "received_per_iter": r.bytes_per_iteration.received,
            "theory_sent_per_iter": r.theory_bytes_per_iteration.sent,
            "theory_received_per_iter": r.theory_bytes_per_iteration.received,
            "gradient_bytes": r.gradient_bytes,
        }
        for run in runs
        if run.ok
        for r in run.summary.ranks
        if r.bytes_per_iteration is not None and r.theory_bytes_per_iteration is not None
    ]
    return pd.DataFrame(rows, columns=TRAFFIC_COLUMNS)


def dataset_of(runs: list[RunDir]) -> str:
    """The data the runs trained on (data.name in their provenance); 'unknown' if none says."""
    names = {name for run in runs if (name := run.summary.provenance.dataset) is not None}
    return ", ".join(sorted(names)) or "unknown"


def scaling_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """Throughput against the number of workers, per strategy (and variant) and data mode: the
    mean images/s over each entry's seeds, the speed-up over `single` in the same data mode, and
    the scaling efficiency, speed-up / workers (1.0 is linear). The baseline is the `single`
    entry at the same global batch where there is one (strong scaling: the same work per
    iteration, the demo's sweep), else the one with the same images per worker (weak scaling:
    the batch grows with the workers, the COCO recipe's sweep)."""
    done = summary[summary["status"] == "ok"]
    keys = ["entry", "strategy", "variant", "data_mode", "workers", "global_batch", "images_per_worker"]
    means = (
        done.groupby("entry", sort=False)
        .agg(
            **{k: (k, "first") for k in keys[1:]},
            images_per_second=("images_per_second", "mean"),
            images_per_second_sd=("images_per_second", "std"),
            n=("run_id", "count"),
        )
        .reset_index()
    )
    single = means[baseline_mask(means)]
    by_batch = {
        (m, b): v
        for m, b, v in zip(single["data_mode"], single["global_batch"], single["images_per_second"], strict=False)
    }
    by_per_worker = {
        (m, p): v
        for m, p, v in zip(single["data_mode"], single["images_per_worker"], single["images_per_second"], strict=False)
    }
    baselines = [
        ("same global batch", by_batch[(m, b)])
        if (m, b) in by_batch
        else ("same images per worker", by_per_worker[(m, p)])
        if (m, p) in by_per_worker
        else ("no single run", math.nan)
        for m, b, p in zip(means["data_mode"], means["global_batch"], means["images_per_worker"], strict=False)
    ]
    speedup = means["images_per_second"].to_numpy() / [value for _, value in baselines]
    frame = pd.DataFrame(
        {
            "strategy": [
                strategy_label(s, v, mode)
                for s, v, mode in zip(means["strategy"], means["variant"], means["data_mode"], strict=False)
            ],
            "workers": means["workers"].astype("Int64").to_numpy(),
            "global_batch": means["global_batch"].astype("Int64").to_numpy(),
            "n": means["n"].to_numpy(),
            "images_per_second": means["images_per_second"].to_numpy(),
            "images_per_second sd": means["images_per_second_sd"].to_numpy(),
            "speedup_vs_single": speedup,
            "efficiency": speedup / means["workers"].astype(float).to_numpy(),
            "baseline": [name for name, _ in baselines],
        }
    )
    return frame.sort_values(["strategy", "workers"], kind="stable").reset_index(drop=True)


def time_to_target(evaluations: list[Evaluation], target: float | None) -> tuple[float, float]:
    """(training seconds, iterations) when the run's evaluations during training first reached
    AP >= target; NaN for no target, no evaluations, or never reached."""
    if target is None:
        return math.nan, math.nan
    for record in evaluations:
        if record.AP >= target:
            return float(record.train_seconds), float(record.step)
    return math.nan, math.nan


@dataclass(frozen=True)
class Row:
    """What a column of summary.csv is computed from: one run (load_run's), its summary and
    metrics, and the report's settings."""

    run: RunDir
    s: RunSummary
    m: Metrics
    preset: str
    target_ap: float | None
    single: float  # images/s of the baseline runs (their mean) the run's speed-up is against

    @property
    def to_target(self) -> tuple[float, float]:
        return time_to_target(self.s.evaluations, self.target_ap)


@dataclass(frozen=True)
class Column:
    """One column of summary.csv and the one line that computes it."""

    name: str
    value: Callable[[Row], Any]
    integer: bool = False  # a count: Int64 (2, not 2.0), empty where a run has none


def _metric(name: str, row: Row) -> float:
    return number(getattr(row.m, name))


def _field(name: str, integer: bool = False, numeric: bool = False) -> Column:
    """The summary field `name` as it is (`numeric`: NaN where it is not recorded)."""
    if name not in RunSummary.field_names():  # at import: a column cannot silently go empty
        raise AttributeError(f"summary.csv column {name}: RunSummary has no field {name}")
    if numeric:
        return Column(name, lambda r: number(getattr(r.s, name)), integer)
    return Column(name, lambda r: getattr(r.s, name), integer)


def _part(prefix: str, name: str, part: str) -> Column:
    """Column prefix + part: the `part` of the summary's field `name` (sec_per_iter,
    time_split), NaN where the run has none."""
    _field(name)  # a field of the summary, or an error at import
    return Column(prefix + part, lambda r: number(getattr(getattr(r.s, name), part) if getattr(r.s, name) else None))


# summary.csv, one row per run, in this order. A new column is one line here.
COLUMNS = [
    Column("run_id", lambda r: r.run.run_id),
    Column("entry", lambda r: r.run.entry),
    _field("seed", integer=True),
    _field("data_mode"),
    Column("preset", lambda r: r.preset),
    _field("strategy"),
    _field("variant"),
    _field("workers", integer=True),
    _field("processes", integer=True),
    _field("images_per_worker", integer=True),
    _field("global_batch", integer=True),
    _field("lr"),
    _field("device"),
    _field("backend"),
    _field("threads", integer=True),
    Column("status", lambda r: r.run.status),
    Column("reason", lambda r: r.run.reason),
    _field("images_per_second", numeric=True),
    # against `single` (the mean over its seeds) at the same global batch and data mode
    Column("speedup_vs_single", lambda r: number(r.s.images_per_second) / r.single),
    *(_part("sec_per_iter_", "sec_per_iter", k) for k in ("mean", "p50", "p95")),
    *(_part("time_", "time_split", k) for k in TIME_SPLIT),
    _field("communication_share", numeric=True),
    Column("busiest_rank_bytes_per_iter", lambda r: busiest_rank_bytes(r.s, "bytes_per_iteration")),
    Column("busiest_rank_theory_bytes_per_iter", lambda r: busiest_rank_bytes(r.s, "theory_bytes_per_iteration")),
    _field("replicas_identical"),
    # What the process that holds the most kept (pipeline/runtime/records/training.py Memory)
    Column("peak_memory_mb", lambda r: largest_memory(r.s, "peak")),
    Column("owned_state_mb", lambda r: largest_memory(r.s, "state")),
    Column("theory_state_mb", lambda r: theory_state(r.s) if r.s.status == "ok" else math.nan),
    Column("progress_per_epoch", lambda r: progress_per_epoch(r.s.epoch_loss)),
    *(Column(k, functools.partial(_metric, k)) for k in AP_COLUMNS + ["APs", "APm", "APl"]),
    _field("train_seconds", numeric=True),
    _field("evaluation_seconds", numeric=True),
    Column("target_ap", lambda r: number(r.target_ap)),
    Column("seconds_to_target", lambda r: r.to_target[0]),
    Column("iterations_to_target", lambda r: r.to_target[1], integer=True),
    # How the run survived faults: checkpoint cost, torchrun's restarts, where it resumed
    Column("checkpoint_seconds", lambda r: number(r.s.checkpoints.seconds if r.s.checkpoints else None)),
    Column("checkpoints", lambda r: r.s.checkpoints.count if r.s.checkpoints else None, integer=True),
    _field("restarts", integer=True),
    Column("resumed_at_steps", lambda r: " ".join(map(str, r.s.resumed_at_steps))),
    # A run trained after its job crashed (pipeline/runtime/attempts.py): timed from the attempt
    # that finished; the report marks it
    Column(
        "retried_after", lambda r: "; ".join(a.said() for a in r.s.failed_attempts or []) if r.s.status == "ok" else ""
    ),
]
SUMMARY_COLUMNS = [c.name for c in COLUMNS]
INTEGER_COLUMNS = [c.name for c in COLUMNS if c.integer]


def summary_frame(runs: list[RunDir], preset: str, target_ap: float | None = None) -> pd.DataFrame:
    """One row per run; `target_ap` (report.target_ap of the preset) for the time to reach it."""
    # Speed-up is against `single` (the mean over its seeds) at the same global batch and in the
    # same data mode: the same work per iteration.
    single: dict[tuple, list[float]] = {}
    for r in runs:
        s = r.summary
        if r.ok and is_baseline(s.strategy, s.variant):
            single.setdefault((s.data_mode, s.global_batch), []).append(number(s.images_per_second))
    rows = []
    for run in runs:
        s = run.summary
        row = Row(run, s, run.metrics, preset, target_ap, _mean(single.get((s.data_mode, s.global_batch), [])))
        rows.append({column.name: column.value(row) for column in COLUMNS})
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)  # the columns fix the order, not the dicts
    # Integer counts stay integers (2, not 2.0) even when a skipped run leaves them empty
    for col in INTEGER_COLUMNS:
        frame[col] = pd.to_numeric(frame[col]).astype("Int64")
    return frame
