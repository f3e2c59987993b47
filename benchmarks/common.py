"""What the benchmark scripts share: training one run the way the workflow does, and its summary."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.launch import command, evaluation_command  # noqa: E402
from pipeline.strategies import sweep  # noqa: E402


def _run(argv: list[str], what: str, env: dict | None = None) -> None:
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, **(env or {})))
    if result.returncode != 0:
        raise SystemExit(f"{what} failed:\n{result.stderr[-3000:]}")


def train(cfg: dict, run: dict, out: Path, env: dict | None = None) -> dict:
    """Train `run` (a filled sweep entry) of the resolved preset `cfg` into `out`, as the
    workflow's train job does; its train_summary.json, or exit naming the run and its error."""
    _run(command(cfg, run, str(out)), f"training {sweep.run_id(run)} ({out})", env)
    return json.loads((Path(out) / "train_summary.json").read_text())


def evaluate(cfg: dict, run: dict, out: Path) -> dict:
    """Score the trained run in `out` as the workflow's evaluate job does; its metrics.json."""
    _run(evaluation_command(cfg, run, str(out)), f"evaluating {sweep.run_id(run)} ({out})")
    return json.loads((Path(out) / "metrics.json").read_text())
