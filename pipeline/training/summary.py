"""The run summary (train_summary.json) and every rank's report, built at the end of training.

`summary_of` builds the summary from explicit inputs (the log records, the run's entry, its
training state, the process's context, the precision, the strategy's facts); `summarise` reads
them off the loop's Job (job.py) and gathers every rank's report. The first worker writes the
weights, the iteration log, its TensorBoard view (scalars.py) and the summary (last, so that its
presence means the run finished).
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import typing
from pathlib import Path

import numpy as np

from ..config import schema, stages
from ..runtime import attempts, distributed, failure, provenance
from ..runtime.files import atomic_path, read_json_lines, save_torch, write_json, write_text
from ..runtime.records.base import STRATEGY_REMEDY
from ..runtime.records.evaluation import Evaluation
from ..runtime.records.training import (
    Bytes,
    Checkpoints,
    Memory,
    RankReport,
    RunSummary,
    SecondsPerIteration,
    StateBytes,
    TimeSplit,
    Utilisation,
)
from ..runtime.run import Run
from ..strategies import sweep
from ..strategies.process import Context, gradient_bytes
from . import scalars
from .job import Job
from .monitor import peak_memory
from .precision import Precision
from .state import WARMUP_ITERATIONS_EXCLUDED, Phases, TrainState


def evaluations(state_dir: Path) -> list[Evaluation]:
    """The run's evaluations during training, one per epoch (a resumed run may have scored
    an epoch twice, before and after the interruption: the later record counts)."""
    path = state_dir / "evaluations.jsonl"
    if not path.exists():
        return []
    by_epoch = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            record = Evaluation.from_json(json.loads(line), f"{path}: line {number}")
            by_epoch[record.epoch] = record
    return [by_epoch[e] for e in sorted(by_epoch)]


def summarise(job: Job, live_log: Path) -> dict | None:
    """Gather every rank's report; the first worker writes the weights, the iteration log and
    the summary (last, so that its presence means the run finished). Returns the summary's
    JSON object in that process, None in the others."""
    job.runtime.consolidate(job.model, job.optimizer, job.ctx)
    ranks = rank_report(job)
    assert job.monitor is not None  # started by train() before the loop
    samples = [s for rank in distributed.all_gather(job.monitor.stop()) for s in rank]
    if not job.ctx.reports:
        return None
    cfg, ctx, runtime = job.cfg, job.ctx, job.runtime
    # What the strategy observed over every rank (a ps server's staleness): fields of the record
    facts = RunSummary.fields_of(
        runtime.summary_facts([r.to_json() for r in ranks]), f"{runtime.spec.name}.summary_facts", STRATEGY_REMEDY
    )
    records, evaluated = read_json_lines(live_log), evaluations(job.state_dir)
    record = summary_of(
        records,
        job.run,
        job.state,
        ctx,
        job.precision,
        facts,
        ranks=ranks,
        schedule=job.schedule,
        global_batch=job.global_batch,
        lr=job.base_lr,
        evaluations=evaluated,
        communication_timed=runtime.spec.communication_timed is not None,
    )
    write_text(job.out_dir / "utilisation.jsonl", "".join(json.dumps(s) + "\n" for s in samples))
    save_torch(
        {
            "model": runtime.model_state(job.model),
            "num_classes": job.dataset.num_classes,
            "model_cfg": cfg.model.model_dump(),
        },
        job.out_dir / "model_final.pt",
    )
    with atomic_path(job.out_dir / "iterations.jsonl") as tmp:
        shutil.copyfile(live_log, tmp)
    scalars.write_events(job.out_dir, records, evaluated)  # the same records, for TensorBoard
    record = dataclasses.replace(
        record,
        utilisation=Utilisation(
            interval_s=job.monitor.interval, samples=len(samples), gpus=job.monitor.gpu_reason or "sampled through NVML"
        ),
        # as collected (a dict, written as the Provenance record reads it back)
        provenance=typing.cast(
            typing.Any,
            provenance.collect(
                stages.config_for(cfg, "train"),
                knobs=stages.knobs_for(cfg, "train"),
                run=job.run.to_json(),
                seed=job.seed,
                workers=job.run.workers,
                processes=ctx.processes,
                threads=ctx.threads,
                device=str(ctx.device),
                backend=ctx.backend,
            ),
        ),
    )
    summary = record.to_json()
    write_json(job.out_dir / "train_summary.json", summary)
    return summary


def failed_outcome(job: Job, live_log: Path, reason: str) -> dict:
    """What records a diverged run (pipeline/runtime/failure.py, write_outcome): a summary that
    says `failed` and why, in one line, and the iterations logged until then. Its state/ stays:
    a rerun with other settings starts over, and one unchanged meets the same loss again."""
    return {
        "out": str(job.out_dir),
        "iterations": str(live_log),
        "summary": sweep.unfinished_summary(job.cfg, job.run, "failed", failure.one_line(reason)),
    }


def rank_report(job: Job) -> list[RankReport]:
    """Every process's role, checksum of its weights, and bytes per iteration, measured and by
    theory; gathered from all ranks (the replicas must be identical)."""
    grad_bytes = gradient_bytes(job.runtime.unwrap(job.model))
    iterations = max(job.moved.iterations, 1)
    return distributed.all_gather(
        RankReport(
            rank=job.ctx.rank,
            role=job.ctx.role,
            checksum=job.runtime.checksum(job.model),
            gradient_bytes=grad_bytes,
            bytes_per_iteration=Bytes(sent=job.moved.sent / iterations, received=job.moved.received / iterations),
            theory_bytes_per_iteration=Bytes(**job.runtime.theory_bytes(job.ctx, grad_bytes)),
            memory=Memory(
                **peak_memory(job.runtime.gpus_in_use(job.ctx)),
                state=StateBytes(**job.runtime.owned_state(job.model, job.optimizer)),
            ),
            time_split=TimeSplit(**means) if (means := job.phases.means()) else None,
            **RankReport.fields_of(
                job.runtime.rank_facts(job.ctx), f"{job.runtime.spec.name}.rank_facts", STRATEGY_REMEDY
            ),
        )
    )


def summary_of(
    records: list[dict],
    run: Run,
    state: TrainState,
    ctx: Context,
    precision: Precision,
    facts: dict,
    *,
    ranks: list[RankReport],
    schedule: schema.Train,
    global_batch: int,
    lr: float,
    evaluations: list[Evaluation],
    communication_timed: bool,
) -> RunSummary:
    """Throughput, time per iteration and its split, losses, and the ranks' reports. `facts`
    are the strategy's summary facts as fields of the record; `schedule` is the train section
    with its warm-up resolved; `communication_timed` is False where the strategy exchanges
    inside forward and backward (Strategy.communication_timed is None)."""
    # Timed from the attempt that finished (a resumed one, after a crash or a kill, began with a
    # warm-up of its own), its first iterations excluded as for any run
    since = state.sessions[-1]["step"] if state.sessions else 0
    last = [r for r in records if r["step"] > since] or records
    steady = last[WARMUP_ITERATIONS_EXCLUDED:] or last
    times = np.array([r["time_iter"] for r in steady])
    # the log's own split, as each process keeps its own (state.Phases); train.time_split:
    # false leaves only the data wait (pipeline/training/timing.py)
    split = Phases.of(records).means()
    epochs = sorted({r["epoch"] for r in records})
    epoch_loss = [float(np.mean([r["loss"] for r in records if r["epoch"] == e])) for e in epochs]
    assert schedule.warmup_iters != "auto"  # resolved by Job.schedule
    return RunSummary(
        # the precision that ran: the run's (sweep.identity's), resolved by training/precision.py
        **dict(sweep.identity(run), precision=precision.name),
        global_batch=global_batch,
        lr=lr,
        device=str(ctx.device),
        backend=ctx.backend,
        threads=ctx.threads,
        processes=ctx.processes,
        status="ok",
        reason="",
        epochs=len(epochs),
        iterations=len(records),
        train_seconds=state.train_seconds,
        evaluation_seconds=state.evaluation_seconds,
        evaluations=evaluations,
        checkpoints=Checkpoints(**state.checkpoints, every=schedule.checkpoint_every),
        # Each session after the first resumed from a checkpoint (a rerun, or torchrun's
        # restart after a worker died; `restart` is torchrun's count then).
        resumed_at_steps=[s["step"] for s in state.sessions[1:]],
        restarts=sum(1 for s in state.sessions if s["restart"] > 0),
        failed_attempts=attempts.retried_before() or None,
        timed_from_step=since or None,
        channels_last=schedule.channels_last,
        warmup_iters=schedule.warmup_iters,  # `auto` resolved
        skipped_steps=precision.skipped_steps,  # fp16 overflows the scaler skipped
        images_per_second=float(sum(r["images"] for r in steady) / times.sum()),
        sec_per_iter=SecondsPerIteration(
            mean=float(times.mean()), p50=float(np.percentile(times, 50)), p95=float(np.percentile(times, 95))
        ),
        time_split=TimeSplit(**split),
        timing_excludes_first_iterations=WARMUP_ITERATIONS_EXCLUDED,
        # None where no share was timed
        communication_share=(
            split["communication"] / float(times.mean()) if "communication" in split and communication_timed else None
        ),
        ranks=ranks,
        replicas_identical=len({r.checksum for r in ranks}) == 1,
        **facts,
        epoch_loss=epoch_loss,
        final_loss=epoch_loss[-1] if epoch_loss else math.nan,
    )
