"""The run summary from explicit inputs (pipeline/training/summary.py, `summary_of`): hand-made
iteration records, training state, context, precision and ranks; no Job, no training loop."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from pipeline.config import params, schema
from pipeline.runtime.records.evaluation import Evaluation
from pipeline.runtime.records.training import Bytes, RankReport, RunSummary
from pipeline.strategies import Context, sweep
from pipeline.training.precision import Precision
from pipeline.training.state import Phases, TrainState
from pipeline.training.summary import WARMUP_ITERATIONS_EXCLUDED, summary_of

from .conftest import REPO

# Ten iterations over two epochs: the first five (left out of the timing) take 1 s, the rest
# 0.5 s, of which a quarter communicating. The loss falls by one an iteration, from 9 to 0.
SECONDS = [1.0] * WARMUP_ITERATIONS_EXCLUDED + [0.5] * 5
RECORDS = [{"step": step, "epoch": (step - 1) // 5, "lr": 0.01, "time_data": 0.05, "images": 8,
            "bytes_sent": 100, "bytes_received": 100, "time_iter": seconds,
            "elapsed": sum(SECONDS[:step]), "loss": float(10 - step),
            "time_compute": seconds / 2, "time_communication": seconds / 4,
            "time_optimizer": seconds / 4 - 0.05}
           for step, seconds in enumerate(SECONDS, start=1)]


def ranks(*checksums: str) -> list[RankReport]:
    return [RankReport(rank=i, role="worker", checksum=checksum, gradient_bytes=400,
                       bytes_per_iteration=Bytes(sent=100.0, received=100.0),
                       theory_bytes_per_iteration=Bytes(sent=100, received=100))
            for i, checksum in enumerate(checksums)]


def summary(records=RECORDS, checksums=("ab", "ab"), communication_timed=True) -> RunSummary:
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    run = sweep.fill({"strategy": "ddp", "workers": 2}, cfg)
    # Resumed once, at step 4, by torchrun's restart after a worker died
    state = TrainState(epoch=2, step=10, train_seconds=7.5, evaluation_seconds=1.0,
                       checkpoints={"count": 3, "seconds": 0.2},
                       sessions=[{"step": 0, "restart": 0}, {"step": 4, "restart": 1}])
    ctx = Context(rank=0, processes=2, threads=1, backend="gloo", shard=0, shards=2)
    schedule = schema.replaced(cfg.train, warmup_iters=3, checkpoint_every=4)
    evaluations = [Evaluation(epoch=2, step=10, train_seconds=7.5, AP=0.1, AP50=0.2, AP75=0.05,
                              seconds=1.0)]
    return summary_of(records, run, state, ctx, Precision("fp32", torch.device("cpu")), {},
                      ranks=ranks(*checksums), schedule=schedule, global_batch=8, lr=0.02,
                      evaluations=evaluations, communication_timed=communication_timed)


def test_a_summary_from_hand_made_inputs():
    record = summary()
    assert (record.strategy, record.workers, record.precision, record.status) == ("ddp", 2, "fp32", "ok")
    assert (record.global_batch, record.lr, record.processes, record.backend) == (8, 0.02, 2, "gloo")
    assert (record.epochs, record.iterations) == (2, 10)
    assert record.epoch_loss == [7.0, 2.0] and record.final_loss == 2.0
    # the first iterations are left out of the timing: 8 images in 0.5 s
    assert record.images_per_second == pytest.approx(16.0)
    assert (record.sec_per_iter.mean, record.sec_per_iter.p95) == (0.5, 0.5)
    assert record.time_split.communication == pytest.approx(0.125)
    assert record.communication_share == pytest.approx(0.25)
    assert (record.checkpoints.count, record.checkpoints.every) == (3, 4)
    assert record.resumed_at_steps == [4] and record.restarts == 1
    assert record.warmup_iters == 3 and record.skipped_steps == 0
    assert record.replicas_identical and record.evaluations[0].AP == 0.1
    assert RunSummary.from_json(record.to_json()) == record  # what train_summary.json reads back


def test_replicas_that_differ_are_said_to():
    assert not summary(checksums=("ab", "cd")).replicas_identical


def test_no_share_where_communication_is_not_timed_apart_or_not_split():
    assert summary(communication_timed=False).communication_share is None
    unsplit = [{k: v for k, v in r.items()
                if k not in ("time_compute", "time_communication", "time_optimizer")} for r in RECORDS]
    record = summary(unsplit)
    assert record.communication_share is None
    assert dataclasses.asdict(record.time_split) == {"data": pytest.approx(0.05), "compute": None,
                                                     "communication": None, "optimizer": None}


def test_each_process_keeps_its_own_split_as_the_summary_reads_rank_0s():
    """Phases (every process's own time split, resumable) over the same records gives the
    summary's split: the same steady iterations, the same means."""
    phases = Phases()
    for record in RECORDS[:7]:
        phases.add(record)
    resumed = Phases()  # a restart: the checkpoint's sums, then the rest
    resumed.load_state_dict(phases.state_dict())
    for record in RECORDS[7:]:
        resumed.add(record)
    split = summary().time_split
    assert resumed.iterations == {"first": WARMUP_ITERATIONS_EXCLUDED,
                                  "steady": len(RECORDS) - WARMUP_ITERATIONS_EXCLUDED}
    assert resumed.means() == pytest.approx({"data": split.data, "compute": split.compute,
                                             "communication": split.communication,
                                             "optimizer": split.optimizer})
    short = Phases()  # a run of no steady iteration: its first ones, as summary_of reads it
    for record in RECORDS[:3]:
        short.add(record)
    assert short.means()["compute"] == pytest.approx(0.5)
