"""A run's identity: what its checkpoint must match to be resumed, and which checkpoints a
workflow will not resume. No torch here: the workflow reads it while it plans.

The fingerprint covers every config section the training stage reads, the sweep entry, the
bytes of every source file the run executes (pipeline/config/stages.py: the same list the
Snakefile declares as its training job's code inputs) and the identity of the data it trains
on (pipeline/data/tree.py). A checkpoint records it beside itself (state/checkpoint.json), so
the workflow can name, before anything runs, a checkpoint that no run will resume: one whose
run left the sweep, or whose settings, code or data changed since (`superseded`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .. import strategies
from ..config import schema, stages
from ..config.params import canonical
from ..data import tree
from ..runtime.run import Run

SIDECAR = "checkpoint.json"  # beside state/checkpoint.pt: its fingerprint and position


def fingerprint(cfg: schema.TrainStage | schema.Config, run: Run, known_files: dict | None = None) -> str:
    """The identical run: its config, entry, code and data. `known_files`: the manifest's
    signature of the data, whose hashes are reused where the files are unchanged."""
    data = tree.identity(tree.signature(cfg.data.root, known=known_files))
    identity = {
        "config": stages.config_for(cfg, "train"),
        "run": run.to_json(),
        "code": stages.code_digest("train", strategies.not_run_by(run.strategy)),
        "data": data,
    }
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:16]


def recorded_fingerprint(state_dir: Path) -> str | None:
    try:
        return json.loads((state_dir / SIDECAR).read_text())["fingerprint"]
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return None


def superseded(
    cfg: schema.Config, runs: dict[str, Run], runs_dir: str | Path, known_files: dict | None = None
) -> list[str]:
    """A line for each checkpoint under `runs_dir` (results/runs/<preset>) that no run of this
    sweep will resume: it is kept where it is (a run left the sweep) or replaced when its run
    starts over (its settings, code or data changed); either way the user hears of it first."""
    lines = []
    for checkpoint in sorted(Path(runs_dir).glob("*/state/checkpoint.pt")):
        run_dir = checkpoint.parent.parent
        run = runs.get(run_dir.name)
        if run is None:
            lines.append(
                f"{checkpoint}: an unfinished run that is not in this sweep; it is kept "
                f"(delete {run_dir} when you no longer need it)"
            )
        elif recorded_fingerprint(checkpoint.parent) not in (None, fingerprint(cfg, run, known_files)):
            lines.append(
                f"{checkpoint}: written with other settings, code or data than the run "
                "has now; the run starts over and replaces it (move it away first to "
                "keep it)"
            )
    return lines
