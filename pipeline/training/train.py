"""The one training loop, shared by every strategy (pipeline/strategies/).

    python -m pipeline.training.train --config '<preset JSON>' --entry '<sweep entry JSON>' --out DIR

Writes, in DIR:
  iterations.jsonl    one record per iteration: step, epoch, losses, lr, images, seconds split
                      into data wait, forward+backward, and the strategy's step
  model_final.pt      the trained weights
  utilisation.jsonl   every process's CPU, memory and GPU use over time (pipeline/training/monitor.py)
  events.out.tfevents.iterations  the iterations' scalars (loss, lr, images/s, time split) and the
                      evaluations' AP for `tensorboard --logdir` (scalars.py; none without tensorboard)
  train_summary.json  status, throughput, time per iteration, provenance (written last), and
                      `evaluations`: AP on the validation split every eval.every_epochs against
                      training seconds (which exclude the evaluations) and iterations
and, while it runs, DIR/state/ (checkpoint.pt every train.checkpoint_every iterations and after
every epoch, the live iterations log), so that a rerun of the identical run (same settings, same
code) resumes where the last checkpoint was taken, mid-epoch if need be, to the result an
uninterrupted run gets; a finished run removes it (pipeline/training/checkpoint.py).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np
import torch

from .. import strategies
from ..config import cli, schema
from ..config.params import scaled_lr
from ..data.dataset import CocoDetection, DatasetError, InMemory, collate, to_model_input
from ..data.sampler import ShardedBatchSampler, aspect_ratio_groups
from ..detection import scoring
from ..detection.model import build_model
from ..runtime import attempts, distributed, lifetime
from ..runtime.files import (
    OutputError,
    output_error,
)
from ..runtime.run import Run
from . import speed
from .checkpoint import CheckpointError
from .identity import fingerprint
from .job import Job
from .monitor import Monitor
from .precision import Precision
from .state import Phases, Stopwatch
from .summary import failed_outcome, summarise
from .timing import IterationClock, Pending, SyncCheck

log = logging.getLogger("train")
RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"  # set by torchrun in its workers
SYNC_CHECK_AFTER = 5  # iterations before train.sync_debug checks (warm-up work may synchronise)
LOSS_TERMS = ("loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg")


class TrainingError(RuntimeError):
    """Training cannot go on; the message says where it stopped and what to change."""


class Diverged(TrainingError):
    """A non-finite loss: what these settings do (rerun as they are, they diverge again). Its
    `outcome` records the run as failed, with this reason, so that the report lists it and
    the workflow goes on (pipeline/config/cli.py, pipeline/runtime/failure.py)."""

    outcome: dict | None = None


def learning_rate(train: schema.Train, base_lr: float, step: int, epoch: int) -> float:
    """Linear warm-up over the first iterations, then multi-step decay at epoch boundaries."""
    warmup = 1.0
    assert train.warmup_iters != "auto"  # Job.schedule resolved it to iterations
    if step < train.warmup_iters:
        alpha = step / train.warmup_iters
        warmup = train.warmup_factor * (1 - alpha) + alpha
    decays = sum(1 for milestone in train.lr_steps if epoch >= milestone)
    return base_lr * warmup * train.lr_gamma**decays


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


class Progress:
    """A progress bar on a terminal, a plain line every `every` iterations otherwise (a job's
    log on a cluster): step, loss, images/s and the time left, at the pace of the last lines."""

    def __init__(self, total: int, done: int, every: int, enabled: bool, images_per_step: int):
        self.every, self.enabled, self.images_per_step = every, enabled, images_per_step
        self.bar = None
        self.window: list[float] = []  # seconds of the iterations since the last line
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="it", dynamic_ncols=True)

    def update(self, record: dict, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix(
                epoch=record["epoch"], loss=f"{record['loss']:.3f}", lr=f"{record['lr']:.2g}", refresh=False
            )
            self.bar.update(1)
            return
        self.window.append(record["time_iter"])
        if record["step"] % self.every == 0 or record["step"] == total:
            per_step = sum(self.window) / len(self.window)
            self.window = []
            log.info(
                "step %d/%d epoch %d loss %.4f lr %.4g %.3fs/it %.1f images/s ETA %s",
                record["step"],
                total,
                record["epoch"],
                record["loss"],
                record["lr"],
                per_step,
                self.images_per_step / per_step if per_step > 0 else float("nan"),
                clock_time((total - record["step"]) * per_step),
            )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def clock_time(seconds: float) -> str:
    """3725 -> '1:02:05': how long, as a person reads it."""
    seconds = max(0, round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def to_device(images, targets, device):
    """The batch on the device, queued: the loader pins its tensors, so no copy waits for the
    device (a blocking copy would drain its queue, once per tensor of every target)."""
    # The loader's uint8 images are copied as such and made float32 in [0, 1] on the device.
    images = [to_model_input(image, device) for image in images]
    targets = [
        {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets
    ]
    return images, targets


def forward_backward(model, optimizer, images, targets, precision: Precision) -> dict:
    """The losses (their sum as `loss`, then each term), still on the device: reading them
    here would make the host wait for the device (see pipeline/training/timing.py)."""
    try:
        with precision.autocast():
            loss_dict = model(images, targets)
            loss = sum(loss_dict.values())
        optimizer.zero_grad(set_to_none=True)
        precision.backward(loss)
    except Exception as err:  # torch.compile's own errors surface at the first iterations
        if speed.is_compile_error(err):
            raise speed.CompileFailed(err) from err
        raise
    return {"loss": loss, **{k: loss_dict[k] for k in LOSS_TERMS}}


def check_finite(record: dict, precision: Precision) -> None:
    """A non-finite loss stops the run, unless fp16's scaler skips the step. Checked when the
    iteration's record is finished, before any later checkpoint is written."""
    if "loss" in record and not math.isfinite(record["loss"]) and not precision.handles_overflow:
        values = {k: record[k] for k in LOSS_TERMS}
        raise Diverged(
            f"non-finite loss {values} at epoch {record['epoch']}, step {record['step']}; the last "
            "good checkpoint (if any) stays in the run's state/ directory. Lower train.base_lr or "
            "raise train.warmup_iters, and check the boxes of the data"
        )


@dataclass
class IterationLog:
    """Where each finished iteration's record goes: checked (a non-finite loss stops the run),
    then, in the process that reports, appended to the live iteration log and shown."""

    file: TextIO | None  # None in the processes that do not report
    progress: Progress
    precision: Precision
    total_steps: int
    # this process's own time split, in every process (the loop's: job.phases; a benchmark
    # driving the loop, or another revision's, may leave it out)
    phases: Phases = field(default_factory=Phases)

    def write(self, record: dict | None) -> None:
        if record is None:  # no iteration was waiting to be finished
            return
        check_finite(record, self.precision)
        self.phases.add(record)
        if self.file is not None:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
            self.progress.update(record, self.total_steps)


def loader_workers(data_cfg: schema.Data) -> int:
    """data.workers, or for `auto` the cores of one training process on this node less the
    one it trains on: decoding then keeps up without taking the training's cores."""
    if data_cfg.workers != "auto":
        return data_cfg.workers
    local_processes = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    return max(1, distributed.available_cores() // local_processes - 1)


def setup(cfg: schema.TrainStage, run: Run, out_dir: Path) -> Job:
    """Start this process's part of the job: data, model, wrapped by the strategy, optimizer,
    and the state of an interrupted run with the same fingerprint."""
    train_cfg, data_cfg = cfg.train, cfg.data
    spec = strategies.get(run, cfg.parallel)
    runtime = spec.runtime()
    ctx = runtime.start(train_cfg.threads)
    per_process = spec.batch_per_process()
    global_batch = per_process * ctx.shards
    if ctx.device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    seed_everything(run.seed)  # the same initial weights in every process
    coco = CocoDetection(
        data_cfg.root,
        "train",
        train=True,
        horizontal_flip=data_cfg.horizontal_flip,
        exif_orientation=data_cfg.exif_orientation,
    )
    in_memory = run.data_mode == "synthetic"
    dataset: CocoDetection | InMemory = coco
    if in_memory:
        dataset = InMemory(coco, per_process, run.seed + 1000 * (ctx.shard or 0))
    groups = aspect_ratio_groups(dataset.aspect_ratios(), data_cfg.aspect_ratio_groups)
    try:
        sampler = ShardedBatchSampler(len(dataset), per_process, run.seed, ctx.shard or 0, ctx.shards, groups)
    except ValueError as err:
        raise TrainingError(f"{data_cfg.root}: {err}") from None
    workers = 0 if in_memory else loader_workers(data_cfg)
    log.info(
        "loader: %d images in %d aspect-ratio group(s), %d worker process(es) per process",
        len(dataset),
        len(set(groups)),
        workers,
    )
    loader_seed = torch.Generator()
    # On a GPU, batches go to page-locked memory, so the copy to the device (non_blocking)
    # overlaps the next step; workers prefetch two batches each (DataLoader's default).
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_sampler=sampler,
        collate_fn=collate,
        num_workers=workers,
        generator=loader_seed,
        pin_memory=ctx.device.type == "cuda",
    )
    model = speed.apply(build_model(cfg.model, dataset.num_classes).to(ctx.device), train_cfg)
    model = runtime.wrap(model, ctx)
    base_lr = scaled_lr(train_cfg, global_batch)
    optimizer = runtime.optimizer(
        [p for p in model.parameters() if p.requires_grad],
        lr=base_lr,
        momentum=train_cfg.momentum,
        weight_decay=train_cfg.weight_decay,
        **speed.sgd_options(train_cfg),
    )
    job = Job(
        cfg,
        run,
        out_dir,
        runtime,
        ctx,
        dataset,
        sampler,
        loader,
        loader_seed,
        model,
        optimizer,
        base_lr,
        global_batch,
        fingerprint(cfg, run),
        Precision(run.precision, ctx.device, runtime.grad_scaler),
        IterationClock(ctx.device, train_cfg.time_split),
    )
    job.checkpointer.restore(ctx.rank, ctx.reports)
    job.state.begin_session(int(os.environ.get(RESTART_COUNT, 0)))
    job.sync_check = SyncCheck(
        runtime.unwrap(model), SYNC_CHECK_AFTER, enabled=train_cfg.sync_debug and ctx.device.type == "cuda"
    )
    log.info(
        "rank %d (%s): %d images, %d per process x %d shards, lr %.4g, %d threads, %s, %s",
        ctx.rank,
        ctx.role,
        len(dataset),
        per_process,
        ctx.shards,
        base_lr,
        ctx.threads,
        ctx.device,
        ctx.backend,
    )
    return job


def iterate(job: Job, batch, stopwatch: Stopwatch, log: IterationLog) -> None:
    """One iteration of the loop, from the batch in hand (its wait counted since the
    stopwatch's lap) to the previous iteration's record checked and logged. Its record is
    built here; job.clock fills in what the device knows (losses, phase seconds)."""
    ctx, clock, state = job.ctx, job.clock, job.state
    assert job.sync_check is not None  # set by setup()
    with job.sync_check.iteration(state.step):  # train.sync_debug (timing.py)
        # -- the learning rate of this step
        lr = learning_rate(job.schedule, job.base_lr, state.step, state.epoch)
        for group in job.optimizer.param_groups:
            group["lr"] = lr
        # -- the batch to the device, forward and backward, queued (marks bound the phases)
        marks, losses, data = {}, None, {}
        if batch is not None:  # a dedicated parameter server has no data: only the strategy's step
            batch_images, batch_targets = batch
            images, targets = to_device(batch_images, batch_targets, ctx.device)
            data = {"time_data": stopwatch.lap_seconds(), "images": len(images) * ctx.shards}
            marks["forward"] = clock.mark()
            losses = forward_backward(job.model, job.optimizer, images, targets, job.precision)
        # -- the strategy's step, and the bytes it moved
        marks["step"] = clock.mark()
        seconds_communicating = job.runtime.step(job.model, job.precision.optimizer(job.optimizer), ctx)
        marks["end"] = clock.mark()
        traffic = job.runtime.traffic()
        job.moved.add(traffic.sent, traffic.received)
        state.step += 1
        distributed.report_progress(state.step)
        state.batch += 1
        now = time.perf_counter()
        record = {
            "step": state.step,
            "epoch": state.epoch,
            "lr": lr,
            **data,
            "bytes_sent": traffic.sent,
            "bytes_received": traffic.received,
            "time_iter": stopwatch.lap_seconds(now),
            "elapsed": stopwatch.elapsed(now),
        }
        # -- its record is finished one iteration late, once its device work is done (timing.py)
        pending = Pending(record, marks, communication=seconds_communicating, backward_wait=traffic.backward_wait)
        log.write(clock.push(pending, losses))


def begin_epoch(job: Job) -> None:
    """Make the rest of the epoch replayable: seeds derive from (seed, shard, epoch), and a
    run resumed mid-epoch got its generators back from the checkpoint."""
    epoch, seed = job.state.epoch, job.seed
    if job.state.batch == 0:
        seed_everything(seed + 1000 * (job.ctx.shard or 0) + 7919 * epoch)
    job.loader_seed.manual_seed(seed + epoch)
    job.sampler.set_epoch(epoch, skip=job.state.batch)
    if isinstance(job.dataset, CocoDetection):  # in-memory data has no augmentation
        job.dataset.set_epoch(seed, epoch)


def run_epoch(job: Job, log: IterationLog, max_steps: int | None) -> None:
    """The rest of one pass over this process's shard (all of it unless resumed mid-epoch).
    Checkpoints every train.checkpoint_every iterations; their seconds are kept out of the
    training time."""
    state, every = job.state, job.schedule.checkpoint_every
    begin_epoch(job)
    batches = job.loader if job.ctx.shard is not None else itertools.repeat(None, len(job.sampler) - state.batch)
    stopwatch = Stopwatch(state)
    for batch in batches:
        iterate(job, batch, stopwatch, log)
        attempts.abort_if_asked(job.ctx.rank, state.step, job.out_dir / "state")  # tests only
        if state.step == max_steps:
            break
        # -- a checkpoint now and then, out of the training time
        if every and state.step % every == 0 and state.batch < len(job.sampler):
            log.write(job.clock.drain())  # checked before it is saved
            with stopwatch.paused():
                save_checkpoint(job)  # the epoch's end saves one anyway
        stopwatch.lap()
    log.write(job.clock.drain())
    stopwatch.stop()


def save_checkpoint(job: Job) -> None:
    """The run's checkpoint (every process takes part); its seconds are counted apart from
    training's, and this save counts itself, though its own seconds are not known yet (a
    resumed run does not count them)."""
    start = time.perf_counter()
    job.runtime.consolidate(job.model, job.optimizer, job.ctx)
    job.state.checkpoints["count"] += 1
    job.checkpointer.save(job.runtime.saves_checkpoint(job.ctx))
    job.state.checkpoints["seconds"] += time.perf_counter() - start


def train(cfg: schema.TrainStage, run: Run, out_dir: str | Path, max_steps: int | None = None) -> dict | None:
    """Train one sweep entry; `max_steps` stops early (the equivalence check's single step).
    Returns the run summary in the process that writes it, None in the others."""
    job = setup(cfg, run, Path(out_dir))
    job.monitor = Monitor(job.ctx.rank, cfg.train.monitor_interval_s, job.runtime.gpus_in_use(job.ctx)).start()
    state = job.state
    progress = Progress(job.total_steps, state.step, cfg.train.print_every, job.ctx.reports, job.global_batch)
    job.model.train()
    live_log = job.state_dir / "iterations.jsonl"
    try:
        with open(live_log, "a") if job.ctx.reports else contextlib.nullcontext() as log_file:
            log = IterationLog(log_file, progress, job.precision, job.total_steps, job.phases)
            while state.epoch < cfg.train.epochs and state.step != max_steps:
                run_epoch(job, log, max_steps)
                if state.step == max_steps:
                    break
                evaluate_during_training(job)
                state.epoch, state.batch = state.epoch + 1, 0
                save_checkpoint(job)
    except Diverged as err:
        who = f"rank {job.ctx.rank}: " if job.ctx.processes > 1 else ""
        err.outcome = failed_outcome(job, live_log, who + str(err))
        raise
    progress.close()
    summary = summarise(job, live_log)
    if max_steps is None:
        job.checkpointer.forget(job.ctx.rank)
    job.runtime.finish(job.ctx)
    return summary


def evaluate_during_training(job: Job) -> None:
    """After every eval.every_epochs-th epoch of a run on real data, the first worker scores
    the weights on the validation split, as one record of AP against training seconds; the
    other processes wait, and the whole pause is kept out of the training time."""
    every = job.cfg.eval.every_epochs
    if not every or (job.state.epoch + 1) % every or job.run.data_mode != "real":
        return
    start = time.perf_counter()
    model = job.runtime.scoring_model(job.model, job.ctx)  # gathered, where it is sharded
    if model is not None:
        val = CocoDetection(job.cfg.data.root, "val", train=False, exif_orientation=job.cfg.data.exif_orientation)
        metrics = scoring.score(
            model, val, job.cfg.eval.batch_size, job.ctx.device, chatter=job.out_dir / scoring.CHATTER
        )
        record = {
            "epoch": job.state.epoch + 1,
            "step": job.state.step,
            "train_seconds": job.state.train_seconds,
            **{k: metrics[k] for k in ("AP", "AP50", "AP75")},
            "seconds": time.perf_counter() - start,
        }
        with open(job.state_dir / "evaluations.jsonl", "a") as handle:
            handle.write(json.dumps(record) + "\n")
        log.info(
            "epoch %d: AP %.4f AP50 %.4f after %.1f s of training (evaluation %.1f s)",
            record["epoch"],
            record["AP"],
            record["AP50"],
            job.state.train_seconds,
            record["seconds"],
        )
    distributed.barrier()
    job.model.train()
    job.state.evaluation_seconds += time.perf_counter() - start


def explain_failure(err: BaseException, args) -> str | None:
    """An OSError where no atomic write was under way (no space, no permission), or a peer
    process that died: one line naming it; anything else raises."""
    if isinstance(err, OSError):
        explained = output_error(Path(err.filename or args.out), err)
        return None if explained is err else str(explained)
    return distributed.lost_peers(err)


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        parser.add_argument(
            "--entry", required=True, help="the sweep entry as JSON (not --run: torchrun takes that for its --run-path)"
        )
        parser.add_argument("--out", required=True, help="run directory")
        parser.add_argument("--max-steps", type=int, help="stop after this many iterations")

    cli.run_stage(
        "Train one sweep entry (see module docstring).",
        lambda args: train(args.cfg, Run.from_json(json.loads(args.entry), "--entry"), args.out, args.max_steps),
        arguments=arguments,
        stage="train",
        explain=explain_failure,
        argv=argv,
        errors=(TrainingError, CheckpointError, DatasetError, OutputError, speed.CompileFailed),
    )  # one line each


if __name__ == "__main__":
    main()
    lifetime.exit_finished()  # not through the teardown (runtime/lifetime.py)
