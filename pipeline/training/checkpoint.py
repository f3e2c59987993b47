"""A run's checkpoint: written every train.checkpoint_every iterations and after every epoch,
resumed only by the identical unfinished run, to the same result bit for bit on CPU.

The fingerprint (pipeline/training/identity.py) covers every config section the training stage
reads, the sweep entry, the bytes of every source file the run executes and the data's identity,
so a checkpoint of other settings, code or data is never resumed: it is stale, and the run starts
over. A checkpoint holds the weights, the optimizer,
the position (epoch, batches done in it, iterations), every rank's random number generators
(so the rest of an epoch draws what it would have drawn), the training seconds and every rank's
traffic counters. It holds only tensors and plain data and is loaded with weights_only=True, so
a checkpoint from someone else cannot run code. A finished run removes its state.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from ..runtime import distributed
from ..runtime.files import atomic_path, save_torch, write_json
from .identity import SIDECAR

log = logging.getLogger("train")


class CheckpointError(RuntimeError):
    """A checkpoint this run must not use or overwrite; the message says what to do."""


def run_name(out_dir: Path) -> str:
    """`<preset>/<run id>`: the last two parts of a run directory (results/runs/...)."""
    return "/".join(Path(out_dir).resolve().parts[-2:])


def load_checkpoint(state_dir: Path, expected: str, run_dir: str) -> dict | None:
    """This run's checkpoint; None when there is none or it is stale (other settings or code).
    A file that is not a checkpoint, or one written for another run (`run_name`: copied from
    another preset's directory), is refused and left as it is: it is not ours to delete."""
    path = state_dir / "checkpoint.pt"
    if not path.exists():
        return None
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a damaged or foreign file
        raise CheckpointError(
            f"{path}: cannot be read as a checkpoint ({type(err).__name__}: {str(err)[:200]}); "
            f"it was left as it is. Delete {state_dir} to train the run from its start, or "
            "put back an intact copy to resume it"
        ) from None
    if not isinstance(checkpoint, dict) or "fingerprint" not in checkpoint:
        raise CheckpointError(
            f"{path}: is not a checkpoint of this pipeline; it was left as it "
            f"is. Delete {state_dir} to train the run from its start"
        )
    # One without a run name predates them: stale, like any checkpoint of other code.
    if "run" in checkpoint and checkpoint["run"] != run_dir:
        raise CheckpointError(
            f"{path}: was written for run {checkpoint.get('run')!r}, not for {run_dir!r} "
            "(copied from another preset or run?); it was left as it is. Move it back where it "
            f"belongs, or delete {state_dir} to train this run from its start"
        )
    if checkpoint["fingerprint"] != expected:
        log.info("%s was written with other settings or code; starting over", path)
        return None
    return checkpoint


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the records up to the checkpoint; later ones belong to the interrupted stretch."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= last_step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept))


@dataclass
class Checkpointer:
    """The run's checkpoint, configured once, as torchtitan's CheckpointManager: where it lives,
    what it must match, and the named stateful parts it saves and loads (state_dict /
    load_state_dict): `parts`, the run's (model, optimizer, scaler, train_state; None is
    skipped), and `rank_parts`, what each rank keeps of its own (its generators and traffic
    counters), saved for every rank."""

    state_dir: Path
    fingerprint: str
    run_name: str  # `<preset>/<run id>` (run_name): a checkpoint of another run is refused
    parts: dict
    rank_parts: dict

    def restore(self, rank: int, reports: bool) -> bool:
        """Resume from the last checkpoint if it is this very run's (True), else start clean
        (False, after rank 0 cleared a stale state directory). The process that `reports`
        cuts its logs back to the checkpoint."""
        if rank == 0 and load_checkpoint(self.state_dir, self.fingerprint, self.run_name) is None:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        distributed.barrier()  # nobody reads the state directory while rank 0 may be clearing it
        checkpoint = load_checkpoint(self.state_dir, self.fingerprint, self.run_name)
        if checkpoint is None:
            return False
        for name, part in self.parts.items():
            if part is not None:
                part.load_state_dict(checkpoint[name])
        for name, part in self.rank_parts.items():
            part.load_state_dict(checkpoint[name][rank])
        position = checkpoint["train_state"]
        if reports:
            for name in ("iterations.jsonl", "evaluations.jsonl"):
                truncate_log(self.state_dir / name, position["step"])
            log.info(
                "resuming %s at epoch %d, batch %d (step %d)",
                self.state_dir.parent,
                position["epoch"],
                position["batch"],
                position["step"],
            )
        return True

    def save(self, writes: bool) -> None:
        """Every rank's `rank_parts` are gathered (so a resumed run draws the same numbers and
        reports the bytes of all its iterations, not only of its last session); the process
        that `writes` saves them with `parts`. Every rank goes on once the file is on disk."""
        gathered = {name: distributed.all_gather(part.state_dict()) for name, part in self.rank_parts.items()}
        if writes:
            save_torch(
                {
                    "fingerprint": self.fingerprint,
                    "run": self.run_name,
                    **gathered,
                    **{name: None if part is None else part.state_dict() for name, part in self.parts.items()},
                },
                self.state_dir / "checkpoint.pt",
            )
            # What the workflow reads while it plans (no torch there): which run this resumes.
            write_json(self.state_dir / SIDECAR, {"fingerprint": self.fingerprint, "run": self.run_name})
        distributed.barrier()

    def forget(self, rank: int) -> None:
        """A finished run keeps no state: rerunning its job (a forced rerun, a changed input)
        trains from scratch instead of "resuming" past its last epoch."""
        distributed.barrier()  # every rank is done with the state directory
        if rank == 0:
            shutil.rmtree(self.state_dir, ignore_errors=True)
