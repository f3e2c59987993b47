"""A run's checkpoint: written after every epoch, resumed only by the identical unfinished run.

The fingerprint covers every config section the training stage reads, the sweep entry, and the
bytes of every source file the stage executes (pipeline/stages.py, the same list the Snakefile
declares as the rule's code inputs), so a checkpoint of other settings or other code is never
resumed. A checkpoint holds the weights, the optimizer, the position, the training seconds and
every rank's traffic counters; a finished run removes its state.
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from . import distributed, stages
from .files import atomic_path, save_torch
from .params import canonical

if TYPE_CHECKING:  # the loop's state; train.py imports this module, not the reverse
    from .train import Job

log = logging.getLogger("train")


def fingerprint(cfg: dict, run: dict) -> str:
    """What a checkpoint must match to be resumed: the identical run. That is every config
    section the training stage reads, the sweep entry, and the bytes of every source file the
    stage executes (the same list the Snakefile declares as the rule's code inputs)."""
    identity = {"config": stages.config_for(cfg, "train"), "run": run,
                "code": stages.code_digest("train")}
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:16]


def load_checkpoint(state_dir: Path, expected: str) -> dict | None:
    path = state_dir / "checkpoint.pt"
    if not path.exists():
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if checkpoint.get("fingerprint") != expected:
        log.info("%s was written with other settings or code; starting over", path)
        return None
    return checkpoint


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the records up to the checkpoint; later ones belong to the interrupted epoch."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= last_step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept))


def restore(job: Job) -> None:
    """Resume from the last epoch's checkpoint if it is this very run's, else start clean:
    the weights, the optimizer, the position, the seconds and every rank's traffic so far."""
    state_dir, ctx = job.state_dir, job.ctx
    if ctx.rank == 0 and load_checkpoint(state_dir, job.fingerprint) is None:
        shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()  # nobody reads the state directory while rank 0 may be clearing it
    checkpoint = load_checkpoint(state_dir, job.fingerprint)
    if checkpoint is None:
        return
    job.strategy.unwrap(job.model).load_state_dict(checkpoint["model"])
    job.optimizer.load_state_dict(checkpoint["optimizer"])
    job.epoch, job.step = checkpoint["epoch"] + 1, checkpoint["step"]
    job.train_seconds = checkpoint["train_seconds"]
    job.evaluation_seconds = checkpoint.get("evaluation_seconds", 0.0)
    job.moved = dict(checkpoint["moved"][ctx.rank])
    if ctx.reports:
        truncate_log(state_dir / "iterations.jsonl", checkpoint["step"])
        log.info("resuming %s after epoch %d (step %d)", state_dir.parent, checkpoint["epoch"],
                 checkpoint["step"])


def save_checkpoint(job: Job) -> None:
    """After an epoch: everything `restore` needs, every rank's traffic counters included (so a
    resumed run reports the bytes of all its iterations, not only of its last session)."""
    moved = distributed.all_gather(job.moved)
    if job.strategy.saves_checkpoint(job.ctx):
        save_torch({"fingerprint": job.fingerprint, "epoch": job.epoch, "step": job.step,
                    "train_seconds": job.train_seconds, "moved": moved,
                    "evaluation_seconds": job.evaluation_seconds,
                    "model": job.strategy.unwrap(job.model).state_dict(),
                    "optimizer": job.optimizer.state_dict()}, job.state_dir / "checkpoint.pt")


def forget_state(job: Job) -> None:
    """A finished run keeps no state: rerunning its job (a forced rerun, a changed input)
    trains from scratch instead of "resuming" past its last epoch."""
    distributed.barrier()  # every rank is done with the state directory
    if job.ctx.rank == 0:
        shutil.rmtree(job.state_dir, ignore_errors=True)
