"""The sweep: its entries filled from their defaults into typed runs (pipeline/runtime/run.py),
once, here; checked against their strategy, and named.

An entry names a strategy and its `workers` (the sweep's count of workers: devices or processes
that train on a shard of the batch); a job may start more processes than workers (a dedicated
parameter server adds one). `images_per_worker` defaults to train.images_per_worker, `data_mode`
to data.mode (real: the loader decodes and augments; synthetic: in-memory tensors, no loader),
`precision` to train.precision (fp32, or bf16 / fp16 autocast: pipeline/training/precision.py),
`norm` to model.norm (the tiny model's batchnorm or groupnorm: pipeline/detection/model.py),
`repeats` to 1, and each strategy's own options (pipeline/strategies/) default to what the
strategy declares.

An entry with `repeats: n` is n runs with seeds train.seed, train.seed + 1, ...: the run-to-run
spread the report compares strategies against. A run's id names its seed (ddp-w2-b4-s1); the
entry's id, shared by its repeats, does not (ddp-w2-b4).

An entry with `held_out: true` (default false) is trained and measured like any other; the cost
model is fitted without it and then predicts it (pipeline/report/holdout.py: the out-of-sample
check). Like `repeats` it is in no run: toggling it changes no run id, fingerprint or result,
only what the report and the what-if command fit the model on (`held_out`).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
import warnings
from pathlib import Path

import jsonschema

from .. import strategies
from ..config import schema, stages
from ..config.params import ParamsError, remedy
from ..runtime import provenance
from ..runtime.records.training import RunSummary
from ..runtime.run import NORMS, Run

COMMON_KEYS = ("strategy", "workers", "images_per_worker", "data_mode", "precision", "norm", "repeats", "held_out")
DATA_MODES = ("real", "synthetic")
PRECISIONS = ("fp32", "bf16", "fp16")
RunSections = schema.Preset | schema.TrainStage  # what filling an entry reads: train, data, model
DEPRECATED = {"world_size": "workers"}  # old name -> new name


def _entry_schema(strategy: type[strategies.Strategy]) -> dict:
    positive = {"type": "integer", "minimum": 1}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": list(COMMON_KEYS),
        "properties": {
            "strategy": {"const": strategy.name},
            "workers": positive,
            "images_per_worker": positive,
            "repeats": positive,
            "held_out": {"type": "boolean"},
            "data_mode": {"enum": list(DATA_MODES)},
            "precision": {"enum": list(PRECISIONS)},
            "norm": {"enum": list(NORMS)},
            **{k: o.schema for k, o in strategy.options.items()},
        },
    }


def _renamed(entry: dict, where: str) -> dict:
    """Accept the deprecated spelling, saying what to write instead."""
    entry = dict(entry)
    for old, new in DEPRECATED.items():
        if old in entry:
            if new in entry:
                raise ParamsError(f"{where}: both {old} and {new}; {old} is the old name of {new}, keep only {new}")
            warnings.warn(
                f"{where}: '{old}' is deprecated; write '{new}: {entry[old]}' (the "
                f"number of workers; a job's processes may be more)",
                FutureWarning,
                stacklevel=3,
            )
            entry[new] = entry.pop(old)
    return entry


def _unknown_key_message(strategy: type[strategies.Strategy], key: str, where: str) -> str:
    owners = [s.name for s in strategies.STRATEGIES.values() if key in s.options]
    if owners:
        return f"{where}: {key} is a {' / '.join(owners)} option, not {strategy.name}'s"
    allowed = list(COMMON_KEYS) + list(strategy.options)
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"{where}: unknown key '{key}'{hint}; allowed for {strategy.name}: {', '.join(allowed)}"


@dataclasses.dataclass(frozen=True)
class Entry:
    """A filled sweep entry: the run of its first repeat, and the keys that are in no run."""

    run: Run
    repeats: int
    held_out: bool  # the cost model is fitted without it, then predicts it


def fill(entry: dict, cfg: RunSections, where: str = "sweep entry") -> Run:
    """One sweep entry of the resolved preset `cfg` as the run of its first repeat: every key
    present, checked against its strategy's schema."""
    return _filled(entry, cfg, where).run


def _filled(entry: dict, cfg: RunSections, where: str) -> Entry:
    """The run of an entry's first repeat, its number of repeats and whether it is held out."""
    entry = _renamed(entry, where)
    try:
        strategy = strategies.lookup(entry.get("strategy"))
    except ValueError as err:  # its message names the key as if the sweep were at the top
        raise ParamsError(f"{where}.strategy: {str(err).removeprefix('sweep.strategy: ')}") from None
    extra = sorted(set(entry) - set(COMMON_KEYS) - set(strategy.options))
    if extra:
        raise ParamsError(_unknown_key_message(strategy, extra[0], where))
    filled = {
        "images_per_worker": cfg.train.images_per_worker,
        "data_mode": cfg.data.mode,
        "precision": cfg.train.precision,
        "norm": cfg.model.norm,
        "repeats": 1,
        "held_out": False,
        **entry,
    }
    try:  # the options' defaults are valid by their declaration: the entry's own are checked
        jsonschema.validate(filled, _entry_schema(strategy))
    except jsonschema.ValidationError as err:
        path = ".".join(map(str, err.absolute_path))
        raise ParamsError(f"{where}{'.' + path if path else ''}: {err.message}; {remedy(err)}") from None
    repeats, held_out = filled.pop("repeats"), filled.pop("held_out")
    run = strategy.filled(**filled, seed=cfg.train.seed)
    why = strategy.invalid(run)
    if why:
        raise ParamsError(f"{where} ({entry_id(run)}): {why}")
    _check_fits_the_data(run, entry, cfg, where)
    return Entry(run, repeats, held_out)


def _check_fits_the_data(run: Run, entry: dict, cfg: RunSections, where: str) -> None:
    """A synthetic dataset's size is in params, so an entry it cannot feed is refused before
    any job starts (a real dataset's size is known only once the data stage has run). The
    sampler would pad by repeating images: every step would run a smaller batch than the
    one the lr was scaled for, with some images twice."""
    synthetic = cfg.data.synthetic
    if synthetic is None:
        return
    images, workers, per_worker = synthetic.train_images, run.workers, run.images_per_worker
    name = entry_id(run)
    if workers > images:
        raise ParamsError(
            f"{where}.workers ({name}): {workers} workers but "
            f"data.synthetic.train_images is {images}, so some worker would have "
            f"no image of its own; use at most {images} workers or raise "
            "data.synthetic.train_images"
        )
    if workers * per_worker > images:
        inherited = "" if "images_per_worker" in entry else " (from train.images_per_worker)"
        raise ParamsError(
            f"{where}.images_per_worker ({name}): {per_worker}{inherited} x "
            f"{workers} workers = {workers * per_worker} images per step, more "
            f"than data.synthetic.train_images ({images}); lower images_per_worker "
            f"to at most {images // workers} or raise data.synthetic.train_images"
        )


def variant(run: Run) -> str:
    return strategies.lookup(run.strategy).variant(run)


def entry_id(run: Run) -> str:
    """Stable name of a sweep entry, shared by its repeats: single-w1-b8, ddp-fp16-w2-b4 (the
    strategy decides what its variant names: here a gradient hook), ps-dedicated-w2-b4,
    ddp-w2-b4-synthetic, single-w1-b8-amp-bf16 (mixed precision), ddp-w2-b4-groupnorm (the
    model's normalisation, where not batchnorm)."""
    name = run.strategy + (f"-{variant(run)}" if variant(run) else "")
    mode = "" if run.data_mode == "real" else f"-{run.data_mode}"
    precision = "" if run.precision == "fp32" else f"-amp-{run.precision}"
    norm = "" if run.norm == "batchnorm" else f"-{run.norm}"
    return f"{name}-w{run.workers}-b{run.images_per_worker}{mode}{precision}{norm}"


def run_id(run: Run) -> str:
    """Stable name of one run, used in paths: its entry's id and its seed (ddp-w2-b4-s0)."""
    return f"{entry_id(run)}-s{run.seed}"


def identity(run: Run) -> dict:
    """The fields that say which run a record belongs to, in every summary of it."""
    return {
        "run_id": run_id(run),
        "entry": entry_id(run),
        "strategy": run.strategy,
        "variant": variant(run),
        "workers": run.workers,
        "images_per_worker": run.images_per_worker,
        "data_mode": run.data_mode,
        "precision": run.precision,
        "seed": run.seed,
        "run": run,
    }


def unfinished_summary(cfg: schema.TrainStage, run: Run, status: str, reason: str) -> dict:
    """The train_summary.json of a run that did not finish: `skipped` (this machine cannot run
    it) or `failed` (its training diverged); identity, status, reason and provenance."""
    return RunSummary(
        **identity(run),
        status=status,
        reason=reason,
        # as collected (a dict, written as the Provenance record reads it back)
        provenance=typing.cast(typing.Any, provenance.collect(stages.config_for(cfg, "train"), run=run.to_json())),
    ).to_json()


def repeated(run: Run, repeats: int) -> list[Run]:
    """The runs of one filled entry, one per seed from its first's. `repeats` itself is in none
    of them, so that asking for more repeats adds runs without changing (and rerunning) the
    existing ones."""
    return [dataclasses.replace(run, seed=run.seed + i) for i in range(repeats)]


def runs(cfg: schema.Config, source: str = "params.yaml") -> dict[str, Run]:
    """run id -> run (a filled sweep entry with its seed), for the resolved preset `cfg`;
    duplicates are an error, and so is no run at all (nothing to measure)."""
    where = f"{source}: presets.{cfg.preset}.sweep"
    if not cfg.sweep:  # the schema refuses this in params.yaml; a config edited in code too
        raise ParamsError(f"{where}: empty; list at least one run, e.g. - {{strategy: single, workers: 1}}")
    entries = _entries(cfg, where)
    ids = [entry_id(e.run) for e in entries]
    duplicates = sorted({r for r in ids if ids.count(r) > 1})
    if duplicates:
        raise ParamsError(
            f"{where}: duplicate entries {duplicates}; each combination once (more seeds of one: its repeats)"
        )
    return {run_id(run): run for e in entries for run in repeated(e.run, e.repeats)}


def _entries(cfg: schema.Config, where: str) -> list[Entry]:
    return [_filled(entry, cfg, f"{where}[{i}]") for i, entry in enumerate(cfg.sweep)]


def held_out(cfg: schema.Config, source: str = "params.yaml") -> list[str]:
    """The ids of the preset's held-out entries (`held_out: true`), in sweep order: what the
    cost model is fitted without and then predicts (pipeline/report/holdout.py)."""
    where = f"{source}: presets.{cfg.preset}.sweep"
    return [entry_id(e.run) for e in _entries(cfg, where) if e.held_out]


def swept(cfg: schema.Config) -> list[str]:
    """The strategies the preset's sweep runs, in registry order."""
    names = {entry["strategy"] for entry in cfg.sweep}
    return [cls.name for cls in strategies.REGISTERED if cls.name in names]


def swept_norms(cfg: schema.Config) -> list[str]:
    """The tiny model's norms the preset's sweep trains with, in NORMS order."""
    names = {entry.get("norm", cfg.model.norm) for entry in cfg.sweep}
    return [norm for norm in NORMS if norm in names]


def equivalence_runs(cfg: RunSections, compared: list[str] | None = None) -> list[Run]:
    """The filled entries of the one-step equivalence check (pipeline/equivalence.py): the
    `equivalence_entry` of each strategy `compared` (default: those the preset's sweep runs;
    the stage is given them, not the sweep, so that new seeds do not rerun it), the baseline
    first (the reference, checked always), then in registry order. A strategy the sweep does
    not run is not checked: its step would answer a question the preset does not ask."""
    if compared is None:
        assert isinstance(cfg, schema.Config), "without `compared`, the whole preset's sweep says"
        compared = swept(cfg)
    checked = [
        cls
        for cls in strategies.REGISTERED
        if cls.equivalence_entry is not None and (cls.name in compared or cls.is_baseline(""))
    ]
    checked.sort(key=lambda cls: not cls.is_baseline(""))
    return [fill({"strategy": cls.name, **(cls.equivalence_entry or {})}, cfg) for cls in checked]


def outcome(
    run_dirs: dict[str, str],
    report: str,
    data_failure: tuple[str, str] | None = None,
    retry: str = "",
) -> tuple[str, list[str]]:
    """The workflow's last words: how many runs finished, which were skipped or failed and why
    (from each run's train_summary.json), which were retried after a crash, and where the
    report is; and the runs whose training failed (crashed for good, or an error of its own),
    each said last with its log (its last attempt's, kept) and the command that retries it
    (`retry`: the workflow's command, to which --forcerun is added). `data_failure`: (its
    log, its error) where the data stage failed, the reason the runs not trained yet were kept
    from training."""
    done, missing = 0, []
    other: list[str] = []
    retried: list[str] = []
    failed: list[str] = []
    for run_id, run_dir in run_dirs.items():
        path = Path(run_dir) / "train_summary.json"
        try:
            summary = RunSummary.read(path)
        except (FileNotFoundError, ValueError):
            missing.append(run_id)
            continue
        if summary.status == "ok":
            done += 1
            if summary.failed_attempts:  # None where none failed
                retried.append(
                    f"  {run_id}: trained after {len(summary.failed_attempts)} failed attempt(s): "
                    + "; ".join(f"{a.said()} (log: {a.log})" for a in summary.failed_attempts)
                )
            continue
        other.append(f"  {run_id}: {summary.status}: {summary.reason}")
        if summary.failed_attempts:
            earlier = [a.log for a in summary.failed_attempts[:-1] if a.log]
            failed += [
                f"  {run_id}: {summary.reason}",
                f"    log: {summary.failed_attempts[-1].log}"
                + (f" (earlier attempts: {', '.join(earlier)})" if earlier else ""),
            ] + ([f"    retry it: {retry} --forcerun {path}"] if retry else [])
    lines = (
        [f"runs: {done} of {len(run_dirs)} trained" + (f", {len(other)} skipped or failed:" if other else "")]
        + other
        + (["  retried after a crash:"] + retried if retried else [])
    )
    if missing and data_failure:
        lines.append(f"  not trained, as the data stage failed ({data_failure[0]}): {', '.join(missing)}")
        lines += [f"    {line}" for line in data_failure[1].splitlines()]
    elif missing:
        lines.append(f"  not trained yet: {', '.join(missing)}")
    if Path(report).exists():
        lines.append(f"report: {report}")
    if failed:
        count = sum(line.startswith("  ") and not line.startswith("    ") for line in failed)
        failed.insert(0, f"failed: {count} run(s), each with its reason, its log and the command that retries it:")
    return "\n".join(lines), failed
