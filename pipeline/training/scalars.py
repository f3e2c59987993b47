"""A run's per-iteration scalars as a TensorBoard event file, written once training is over from
what the run already recorded (its iteration log and its evaluations): training itself and its
timing are untouched. No torch: tensorboard's own record writer.

    tensorboard --logdir results/runs/<preset>      one run per run id

The file has one fixed name in the run directory (TensorBoard reads any file whose name holds
"tfevents"), replaced whole when the run trains again, so a rerun never shows twice. Steps are
the iteration log's; wall times are the run's training clock (its `elapsed`), set to end when
the file is written, so TensorBoard's "relative" axis reads seconds of training (evaluations
and checkpoints left out). Where tensorboard is not installed (a GPU host's own python), one
line says so and nothing is written: the same values stay in iterations.jsonl.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from ..runtime.files import atomic_path
from ..runtime.records.evaluation import Evaluation

log = logging.getLogger(__name__)

EVENTS_FILE = "events.out.tfevents.iterations"
# tag -> the iteration record's key; the loss terms (loss_*) follow under loss/
TIME_SPLIT = {
    "time/iteration": "time_iter",
    "time/data": "time_data",
    "time/compute": "time_compute",
    "time/communication": "time_communication",
    "time/optimizer": "time_optimizer",
}
EVALUATED = ("AP", "AP50", "AP75")


def iteration_scalars(record: dict) -> dict[str, float]:
    """tag -> value of one iteration record: loss and its terms, lr, images/s, the time split
    (what the record holds: a dedicated parameter server has no images, train.time_split: false
    no split)."""
    found = {"loss/total": record.get("loss"), "lr": record.get("lr")}
    found.update({f"loss/{k.removeprefix('loss_')}": v for k, v in record.items() if k.startswith("loss_")})
    if record.get("images") and record.get("time_iter"):
        found["images_per_second"] = record["images"] / record["time_iter"]
    found.update({tag: record.get(key) for tag, key in TIME_SPLIT.items()})
    return {tag: float(value) for tag, value in found.items() if value is not None}


def steps(records: list[dict], evaluations: list[Evaluation]) -> dict[int, dict[str, float]]:
    """step -> its scalars: each iteration's (a step logged twice, before and after a resume,
    counts once: the later record), and each evaluation's AP at the step it was taken."""
    by_step: dict[int, dict[str, float]] = {}
    for record in records:
        by_step[int(record["step"])] = iteration_scalars(record)
    for evaluation in evaluations:
        at = by_step.setdefault(evaluation.step, {})
        at.update({f"eval/{k}": float(getattr(evaluation, k)) for k in EVALUATED})
    return dict(sorted(by_step.items()))


def wall_times(records: list[dict], now: float) -> dict[int, float]:
    """step -> wall time: the run's training clock, ending at `now`."""
    elapsed = {int(r["step"]): float(r["elapsed"]) for r in records if "elapsed" in r}
    start = now - max(elapsed.values(), default=0.0)
    return {step: start + seconds for step, seconds in elapsed.items()}


def write_events(
    run_dir: Path, records: list[dict], evaluations: list[Evaluation], now: float | None = None
) -> Path | None:
    """RUN_DIR/EVENTS_FILE from the run's records; None (and one line why) where tensorboard is
    not installed."""
    try:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.record_writer import RecordWriter
    except ImportError as err:
        log.info(
            "no TensorBoard event file for this run: tensorboard is not installed (%s); its "
            "scalars are in iterations.jsonl",
            err,
        )
        return None
    now = time.time() if now is None else now
    walls = wall_times(records, now)
    path = Path(run_dir) / EVENTS_FILE
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        writer = RecordWriter(handle)
        first = min(walls.values(), default=now)
        writer.write(Event(wall_time=first, file_version="brain.Event:2").SerializeToString())
        for step, scalars in steps(records, evaluations).items():
            summary = Summary(value=[Summary.Value(tag=tag, simple_value=value) for tag, value in scalars.items()])
            event = Event(wall_time=walls.get(step, now), step=step, summary=summary)
            writer.write(event.SerializeToString())
        writer.flush()
    return path
