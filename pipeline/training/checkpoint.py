"""A run's checkpoint: written every train.checkpoint_every iterations and after every epoch,
resumed only by the identical unfinished run, to the same result bit for bit on CPU.

The fingerprint covers every config section the training stage reads, the sweep entry, and the
bytes of every source file the stage executes (pipeline/config/stages.py, the same list the Snakefile
declares as the rule's code inputs), so a checkpoint of other settings or other code is never
resumed: it is stale, and the run starts over. A checkpoint holds the weights, the optimizer,
the position (epoch, batches done in it, iterations), every rank's random number generators
(so the rest of an epoch draws what it would have drawn), the training seconds and every rank's
traffic counters. It holds only tensors and plain data and is loaded with weights_only=True, so
a checkpoint from someone else cannot run code. A finished run removes its state.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from ..config import stages
from ..config.params import canonical
from ..runtime import distributed
from ..runtime.files import atomic_path, save_torch

if TYPE_CHECKING:  # the loop's state; train.py imports this module, not the reverse
    from .train import Job

log = logging.getLogger("train")
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun in its workers


class CheckpointError(RuntimeError):
    """A checkpoint this run must not use or overwrite; the message says what to do."""


def fingerprint(cfg: dict, run: dict) -> str:
    """What a checkpoint must match to be resumed: the identical run. That is every config
    section the training stage reads, the sweep entry, and the bytes of every source file the
    stage executes (the same list the Snakefile declares as the rule's code inputs)."""
    identity = {"config": stages.config_for(cfg, "train"), "run": run,
                "code": stages.code_digest("train")}
    return hashlib.sha256(canonical(identity).encode()).hexdigest()[:16]


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
            "put back an intact copy to resume it") from None
    if not isinstance(checkpoint, dict) or "fingerprint" not in checkpoint:
        raise CheckpointError(f"{path}: is not a checkpoint of this pipeline; it was left as it "
                              f"is. Delete {state_dir} to train the run from its start")
    # One without a run name predates them: stale, like any checkpoint of other code.
    if "run" in checkpoint and checkpoint["run"] != run_dir:
        raise CheckpointError(
            f"{path}: was written for run {checkpoint.get('run')!r}, not for {run_dir!r} "
            "(copied from another preset or run?); it was left as it is. Move it back where it "
            f"belongs, or delete {state_dir} to train this run from its start")
    if checkpoint["fingerprint"] != expected:
        log.info("%s was written with other settings or code; starting over", path)
        return None
    return checkpoint


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the records up to the checkpoint; later ones belong to the interrupted stretch."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= last_step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept))


def rng_state(device: torch.device) -> dict:
    """This process's generators, as tensors and plain numbers (weights_only-loadable)."""
    kind, keys, position, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
            "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "position": int(position),
                      "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    numpy = state["numpy"]
    np.random.set_state(("MT19937", numpy["keys"].numpy().astype(np.uint32), numpy["position"],
                         numpy["has_gauss"], numpy["cached_gaussian"]))


def restore(job: Job) -> None:
    """Resume from the last checkpoint if it is this very run's, else start clean: the weights,
    the optimizer, the position, the generators, the seconds and every rank's traffic so far."""
    state_dir, ctx, run_dir = job.state_dir, job.ctx, run_name(job.out_dir)
    if ctx.rank == 0 and load_checkpoint(state_dir, job.fingerprint, run_dir) is None:
        shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    distributed.barrier()  # nobody reads the state directory while rank 0 may be clearing it
    checkpoint = load_checkpoint(state_dir, job.fingerprint, run_dir)
    # One record per session of the run: where it started, and torchrun's restart count then.
    session = {"step": 0 if checkpoint is None else checkpoint["step"],
               "restart": int(os.environ.get(RESTART_COUNT, 0))}
    job.sessions = [session] if checkpoint is None else checkpoint["sessions"] + [session]
    if checkpoint is None:
        return
    job.strategy.unwrap(job.model).load_state_dict(checkpoint["model"])
    job.optimizer.load_state_dict(checkpoint["optimizer"])
    if job.precision.scaler is not None:
        job.precision.scaler.load_state_dict(checkpoint["scaler"])
    job.epoch, job.batch, job.step = checkpoint["epoch"], checkpoint["batch"], checkpoint["step"]
    job.train_seconds = checkpoint["train_seconds"]
    job.evaluation_seconds = checkpoint["evaluation_seconds"]
    job.checkpoints = dict(checkpoint["checkpoints"])
    job.moved = dict(checkpoint["moved"][ctx.rank])
    set_rng_state(checkpoint["rng"][ctx.rank], ctx.device)
    if ctx.reports:
        for name in ("iterations.jsonl", "evaluations.jsonl"):
            truncate_log(state_dir / name, checkpoint["step"])
        log.info("resuming %s at epoch %d, batch %d (step %d)", state_dir.parent,
                 checkpoint["epoch"], checkpoint["batch"], checkpoint["step"])


def save_checkpoint(job: Job) -> None:
    """Everything `restore` needs, every rank's generators and traffic counters included (so a
    resumed run draws the same numbers and reports the bytes of all its iterations, not only of
    its last session). Its seconds are counted apart from training's."""
    start = time.perf_counter()
    job.strategy.consolidate(job.model, job.optimizer, job.ctx)
    moved = distributed.all_gather(job.moved)
    rng = distributed.all_gather(rng_state(job.ctx.device))
    if job.strategy.saves_checkpoint(job.ctx):
        save_torch({"fingerprint": job.fingerprint, "run": run_name(job.out_dir),
                    "epoch": job.epoch, "batch": job.batch, "step": job.step,
                    "train_seconds": job.train_seconds, "moved": moved, "rng": rng,
                    "evaluation_seconds": job.evaluation_seconds,
                    # this save's own seconds are not known yet: a resumed run counts them not
                    "checkpoints": {"count": job.checkpoints["count"] + 1,
                                    "seconds": job.checkpoints["seconds"]},
                    "sessions": job.sessions,
                    "scaler": (job.precision.scaler.state_dict()
                               if job.precision.scaler is not None else None),
                    "model": job.strategy.unwrap(job.model).state_dict(),
                    "optimizer": job.optimizer.state_dict()}, job.state_dir / "checkpoint.pt")
    distributed.barrier()  # every rank resumes training once the checkpoint is on disk
    job.checkpoints["count"] += 1
    job.checkpoints["seconds"] += time.perf_counter() - start


def forget_state(job: Job) -> None:
    """A finished run keeps no state: rerunning its job (a forced rerun, a changed input)
    trains from scratch instead of "resuming" past its last epoch."""
    distributed.barrier()  # every rank is done with the state directory
    if job.ctx.rank == 0:
        shutil.rmtree(job.state_dir, ignore_errors=True)
