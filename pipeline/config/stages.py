"""The workflow's stages in one table: which config sections each reads, which module it runs,
and, derived from that module's imports, which source files it executes.

What a stage reads is its typed view of the config (schema.TrainStage, ...): its fields are the
sections it reads, a narrower class (schema.EvalSchedule) the keys of a section it reads.
The Snakefile declares `code_files(stage)` as each rule's inputs (so editing any module a stage
executes reruns that stage and what follows; a run's training and evaluation, only its own
strategy's modules), passes `config_for(cfg, stage)` as its params, and training fingerprints its
checkpoints with `code_digest("train", ...)`: the rerun decision and the resume decision
read the same list, so they cannot disagree. A stage's process rebuilds its view from its
command line (`parsed_config`).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, cast

import pydantic

from . import params, schema

PACKAGE = "pipeline"
ROOT = Path(__file__).resolve().parents[2]  # the directory that holds pipeline/


@dataclass(frozen=True)
class Stage:
    config: type[pydantic.BaseModel]  # what it reads of the resolved preset (schema.py)
    modules: tuple[str, ...]  # what it runs with `python -m` (a launcher and what it execs)
    # Settings (section.key) that shape how the stage runs, not what it computes: they reach
    # the stage, but are neither a rerun trigger nor part of a checkpoint's identity, so raising
    # max_restarts after a crash does not retrain the runs that finished.
    knobs: tuple[str, ...] = ()
    # Modules its launcher imports but whose code never runs for it (the launcher's path to
    # another stage): left out of its code, so editing them reruns nothing of this stage.
    other_paths: tuple[str, ...] = ()

    @property
    def sections(self) -> tuple[str, ...]:
        """The parts of the resolved preset it reads: `section`, or `section.key` for each key
        of a section it reads in part (its field's class is narrower than the preset's)."""
        picked: list[str] = []
        for name, field in self.config.model_fields.items():
            whole = schema.Config.model_fields[name].annotation
            if field.annotation is whole:
                picked.append(name)
            else:
                narrower = cast(type[pydantic.BaseModel], field.annotation)  # a section class of its own
                picked += [f"{name}.{key}" for key in narrower.model_fields]
        return tuple(picked)


FAULT_KNOBS = ("parallel.timeout_s", "parallel.max_restarts", "parallel.crash_retries")  # how a job outlives a fault
# How a training job runs, not what it computes: checkpoints, the sync check, and the speed
# knobs (pipeline/training/speed.py: the same tensors within the precision's rounding)
SPEED_KNOBS = ("train.checkpoint_every", "train.sync_debug", "train.compile", "train.optimizer")
COMMBENCH_LAUNCH = ("pipeline.commbench", "pipeline.commbench.job")  # pipeline.launch's commbench path
STAGES = {
    "data": Stage(schema.DataStage, ("pipeline.data.prepare",)),
    # Training evaluates as it goes (time-to-accuracy) with COCO's standard settings, so of
    # `eval` it reads only how often and in batches of how many: the final evaluation's other
    # knobs do not retrain anything.
    "train": Stage(
        schema.TrainStage,
        ("pipeline.launch", "pipeline.runtime.elastic", "pipeline.training.train"),
        FAULT_KNOBS + SPEED_KNOBS,
        COMMBENCH_LAUNCH,
    ),
    "evaluate": Stage(
        schema.EvaluateStage,
        ("pipeline.launch", "pipeline.runtime.elastic", "pipeline.detection.evaluate"),
        FAULT_KNOBS,
        COMMBENCH_LAUNCH,
    ),
    "equivalence": Stage(
        schema.EquivalenceStage,
        ("pipeline.equivalence", "pipeline.runtime.elastic", "pipeline.training.train"),
        FAULT_KNOBS + SPEED_KNOBS,
    ),
    # The machine's links for the cost model, and how much its processes slow each other's
    # compute (with the run's model): one job per process count the sweep runs
    "commbench": Stage(
        schema.CommbenchStage, ("pipeline.launch", "pipeline.runtime.elastic", "pipeline.commbench"), FAULT_KNOBS
    ),
    "report": Stage(schema.ReportStage, ("pipeline.report",)),
    "paper": Stage(schema.PaperStage, ("pipeline.report.paper",)),
}
FETCH_MODULES = ("pipeline.data.coco_fetch",)  # what dvc.yaml's COCO stages run for the data stage


def config_for(cfg: pydantic.BaseModel, stage: str) -> dict:
    """The sections (or single keys) of the resolved preset (or of a stage's view of it, one
    that holds them) that `stage` reads, its knobs left out, as plain data: what its results
    depend on (its Snakemake params, its checkpoints' identity)."""
    dumped, picked = cfg.model_dump(), dict[str, Any]()
    for name in STAGES[stage].sections:
        section, _, key = name.partition(".")
        if key:
            picked.setdefault(section, {})[key] = dumped[section][key]
        else:
            picked[section] = dumped[section]
    for name in STAGES[stage].knobs:
        section, _, key = name.partition(".")
        picked.get(section, {}).pop(key, None)
    return picked


def knobs_for(cfg: pydantic.BaseModel, stage: str) -> dict:
    """The stage's knobs, as {section: {key: value}}."""
    return _values(cfg, STAGES[stage].knobs)


def _values(cfg: pydantic.BaseModel, names) -> dict:
    """The values of `names` (section.key) in `cfg`, as {section: {key: value}}."""
    picked: dict = {}
    for name in names:
        section, _, key = name.partition(".")
        picked.setdefault(section, {})[key] = getattr(getattr(cfg, section), key)
    return picked


def view(cfg: pydantic.BaseModel, stage: str) -> Any:
    """What `stage` reads of the resolved preset (a Config, or anything that holds the stage's
    sections: a Preset, another stage's view), with its knobs: the typed config its process runs
    with (schema.TrainStage, ...)."""
    return STAGES[stage].config.model_validate(with_knobs(config_for(cfg, stage), knobs_for(cfg, stage)))


def with_knobs(config: dict, knobs: dict) -> dict:
    """A stage's config (`config_for`) with its knobs put back: what its process runs with."""
    merged = {name: dict(value) if isinstance(value, dict) else value for name, value in config.items()}
    for section, values in knobs.items():
        merged.setdefault(section, {}).update(values)
    return merged


KNOBS_ENV = "FRCNN_BENCH_KNOBS"  # every stage's knobs, as JSON, set by the Snakefile


def knobs_environment(cfg: schema.Config) -> str:
    return json.dumps({stage: knobs_for(cfg, stage) for stage in STAGES}, sort_keys=True)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """--config (what the stage's results depend on) and --knobs (how it runs), as JSON."""
    parser.add_argument("--config", required=True, help="the stage's part of the resolved preset, as JSON")
    parser.add_argument(
        "--knobs",
        help=f"the stage's knobs (pipeline/config/stages.py), as JSON; "
        f"default: from ${KNOBS_ENV}, set by the workflow, else those in "
        f"--config, else params.yaml's default preset's",
    )


def parsed_config(args: argparse.Namespace, stage: str) -> Any:
    """The stage's typed config (schema.TrainStage, ...) with its knobs: --knobs, else the
    workflow's environment, else those already in --config (a view written with its knobs, as
    a launcher passes it on), else, for a command copied from `snakemake -p` into a shell that
    lacks the workflow's environment, those of params.yaml's default preset in the working
    directory (`default_knobs`)."""
    try:
        config = json.loads(args.config)
    except json.JSONDecodeError as err:
        raise SystemExit(
            f"error: --config is not valid JSON ({err}); pass the stage's config as `snakemake -p` prints it"
        ) from None
    if args.knobs:
        config = with_knobs(config, json.loads(args.knobs))
    elif KNOBS_ENV in os.environ:
        config = with_knobs(config, json.loads(os.environ[KNOBS_ENV]).get(stage, {}))
    else:
        missing = [
            name for name in STAGES[stage].knobs if name.partition(".")[2] not in config.get(name.partition(".")[0], {})
        ]
        if missing:
            config = with_knobs(config, default_knobs(stage, missing))
    try:
        return STAGES[stage].config.model_validate(config)
    except pydantic.ValidationError as err:
        raise SystemExit(
            f"error: --config ({stage} stage): {schema.first_error(err)}; pass the "
            "stage's config as `snakemake -p` prints it"
        ) from None


def default_knobs(stage: str, names: list[str], path: str | Path = "params.yaml") -> dict:
    """The knobs `names` of `stage` from the default preset of `path` (the working directory's
    params.yaml), said in one line on stderr (once per run: by its first process only).

    Knobs never change a stage's results (that is why they are not its params, and why
    changing one reruns nothing), so taking the default preset's, whichever preset the command
    was printed for, computes the same outputs; only how the stage outlives a fault (its
    timeouts, restarts, checkpoint interval) may differ from the workflow's."""
    where = f"--knobs '<JSON>' or ${KNOBS_ENV} (the workflow sets it; `snakemake -p` does not print it)"
    if not Path(path).is_file():
        raise SystemExit(
            f"error: the {stage} stage's knobs ({', '.join(names)}) are neither in "
            f"--config nor given: pass {where}, or run from the directory that "
            f"holds params.yaml to use its default preset's"
        )
    try:
        cfg = params.load_resolved(path)
    except params.ParamsError as err:
        raise SystemExit(f"error: {err} (read for the {stage} stage's knobs; or pass {where})") from None
    knobs = _values(cfg, names)
    if os.environ.get("RANK", "0") == "0":
        print(
            f"{KNOBS_ENV} is not set and no --knobs given: the {stage} stage takes its knobs "
            f"from {path}'s default preset ({cfg.preset}): {json.dumps(knobs, sort_keys=True)}",
            file=sys.stderr,
            flush=True,
        )
    return knobs


def _module_file(module: str) -> Path | None:
    """pipeline.x -> pipeline/x.py or pipeline/x/__init__.py; None outside the package."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> frozenset[str]:
    """Every pipeline module `path` imports, at any depth of its code (a function-level import
    runs too), with relative imports resolved against `module`; each file parsed once while it
    is unchanged (a dry run of the demo asks for every run's files: it took 12 of 18 s)."""
    stat = path.stat()
    return _parsed_imports(path, module, stat.st_mtime_ns, stat.st_size)


@cache
def _parsed_imports(path: Path, module: str, mtime_ns: int, size: int) -> frozenset[str]:
    is_package = path.name == "__init__.py"
    package_parts = module.split(".") if is_package else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package_parts[: len(package_parts) - (node.level - 1)]
                base = ".".join(parent + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from . import x`
    return frozenset(name for name in found if _module_file(name) is not None)


def _with_parents(module: str) -> list[str]:
    """Importing pipeline.a.b runs pipeline/__init__.py and pipeline/a/__init__.py first."""
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts) + 1)]


def executed_modules(entry_modules: tuple[str, ...], left_out: frozenset[str]) -> dict[str, Path]:
    """module -> file of every pipeline module running `entry_modules` executes: the modules
    themselves, a package's __main__, and their pipeline imports, transitively, except those in
    `left_out` (and what only they import)."""
    pending = [m for entry in entry_modules for m in _with_parents(entry)]
    pending += [f"{m}.__main__" for m in entry_modules if _module_file(f"{m}.__main__")]
    seen: dict[str, Path] = {}
    while pending:
        module = pending.pop()
        path = _module_file(module)
        if module in seen or module in left_out or path is None:
            continue
        seen[module] = path
        for imported in _imports(path, module):
            pending += _with_parents(imported)
    return seen


@cache
def module_files(*entry_modules: str, left_out: frozenset[str] = frozenset()) -> tuple[str, ...]:
    """The source files (relative to the repository) that running `entry_modules` executes,
    `left_out` modules aside (executed_modules)."""
    return tuple(sorted(str(p.relative_to(ROOT)) for p in set(executed_modules(entry_modules, left_out).values())))


def code_files(stage: str, fetch: bool = False, left_out: frozenset[str] = frozenset()) -> list[str]:
    """What `stage` executes, but the `left_out` modules: for one run's stage, the strategies it
    does not run (pipeline/strategies/__init__.py: not_run_by); never its launcher's paths to
    other stages (Stage.other_paths)."""
    modules = STAGES[stage].modules + (FETCH_MODULES if fetch else ())
    return list(module_files(*modules, left_out=left_out | frozenset(STAGES[stage].other_paths)))


def code_digest(stage: str, left_out: frozenset[str] = frozenset()) -> str:
    """SHA-256 over the bytes of every file the stage executes (any edit counts)."""
    digest = hashlib.sha256()
    for name in code_files(stage, left_out=left_out):
        digest.update(name.encode() + b"\0" + (ROOT / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]
