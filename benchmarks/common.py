"""What the benchmark scripts share: training one run the way the workflow does, and its summary."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import sweep  # noqa: E402
from pipeline.launch import command  # noqa: E402


def train(cfg: dict, run: dict, out: Path, env: dict | None = None) -> dict:
    """Train `run` (a filled sweep entry) of the resolved preset `cfg` into `out`, as the
    workflow's train job does; its train_summary.json, or exit naming the run and its error."""
    result = subprocess.run(command(cfg, run, str(out)), cwd=REPO, capture_output=True, text=True,
                            env=dict(os.environ, **(env or {})))
    if result.returncode != 0:
        raise SystemExit(f"{sweep.run_id(run)} ({out}) failed:\n{result.stderr[-3000:]}")
    return json.loads((Path(out) / "train_summary.json").read_text())
