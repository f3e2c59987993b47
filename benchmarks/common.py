"""What the benchmark scripts share: training one run the way the workflow does, and its summary
and metrics as the report reads them (pipeline/runtime/records/); the entries that run every
registered strategy (the registry decides, nothing here lists them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import params, schema, stages  # noqa: E402
from pipeline.launch import command, evaluation_command  # noqa: E402
from pipeline.runtime.records.evaluation import Metrics  # noqa: E402
from pipeline.runtime.records.training import RunSummary  # noqa: E402
from pipeline.runtime.run import Run  # noqa: E402
from pipeline.strategies import REGISTERED, sweep  # noqa: E402


def _run(argv: list[str], what: str, env: dict | None = None) -> None:
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, env=dict(os.environ, **(env or {})))
    if result.returncode != 0:
        raise SystemExit(f"{what} failed:\n{result.stderr[-3000:]}")


def train(cfg: schema.Preset | schema.TrainStage, run: Run, out: Path, env: dict | None = None) -> RunSummary:
    """Train `run` (a filled sweep entry) of the resolved preset `cfg` into `out`, as the
    workflow's train job does (with the train stage's view of `cfg`); its train_summary.json,
    or exit naming the run and its error."""
    _run(command(stages.view(cfg, "train"), run, str(out)), f"training {sweep.run_id(run)} ({out})", env)
    return RunSummary.read(Path(out) / "train_summary.json")


def evaluate(cfg: schema.Preset | schema.EvaluateStage, run: Run, out: Path) -> Metrics:
    """Score the trained run in `out` as the workflow's evaluate job does (with the evaluate
    stage's view of the resolved preset `cfg`); its metrics.json."""
    _run(evaluation_command(stages.view(cfg, "evaluate"), run, str(out)), f"evaluating {sweep.run_id(run)} ({out})")
    return Metrics.read(Path(out) / "metrics.json")


def workers_for(cls, processes: int) -> int:
    """One worker per process, up to what the strategy can use."""
    return min(processes, cls.max_workers or processes)


def strategy_entries(processes: int) -> list[dict]:
    """Every registered strategy at `processes` workers (or its most), and one entry for each
    value of each of its choice options: the registry decides, nothing here lists them."""
    entries = []
    for cls in REGISTERED:
        workers = workers_for(cls, processes)
        entries.append({"strategy": cls.name, "workers": workers})
        for key, option in cls.options.items():
            choices = option.schema.get("enum") or ([True, False] if option.schema.get("type") == "boolean" else [])
            for value in choices:
                if value != option.default:
                    entries.append({"strategy": cls.name, "workers": workers, key: value})
    return entries


def one_process_entry(cls, cfg: schema.Preset) -> dict:
    """`cls`'s entry at one worker: its defaults, or the first option value that lets it run
    on one process (the default itself, with its reason, where none does)."""
    candidates = [e for e in strategy_entries(1) if e["strategy"] == cls.name]
    for entry in candidates:
        try:
            run = sweep.fill(dict(entry, images_per_worker=2), cfg, where="benchmark")
        except params.ParamsError:
            continue
        if run.workers == 1 and cls(run, cfg.parallel).processes() == 1:
            return entry
    return candidates[0]
