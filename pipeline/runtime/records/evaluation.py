"""What an evaluation finds, typed: Evaluation, one during training (in the run summary and
evaluations.jsonl), and Metrics, the final model's (RUN_DIR/metrics.json,
pipeline/detection/evaluate.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import OPTIONAL, Record
from .provenance import Provenance


@dataclass(frozen=True)
class Evaluation(Record):
    """One evaluation during training: COCO box AP after `step` steps and `train_seconds` of
    training; `seconds` the evaluation took (kept out of training time)."""

    epoch: int
    step: int
    train_seconds: float
    AP: float
    AP50: float
    AP75: float
    seconds: float


@dataclass(frozen=True)
class Metrics(Record):
    """RUN_DIR/metrics.json (pipeline/detection/evaluate.py): COCO box AP and AR of the final
    model (None: not scored, or -1 from COCO: no objects of that size), how the evaluation ran;
    a run that was not scored says why in `status` and `reason`."""

    run_id: str | None = None
    status: str = field(default="ok", metadata=OPTIONAL)  # written only where it is not ok
    reason: str = field(default="", metadata=OPTIONAL)
    AP: float | None = None
    AP50: float | None = None
    AP75: float | None = None
    APs: float | None = None
    APm: float | None = None
    APl: float | None = None
    AR1: float | None = None
    AR10: float | None = None
    AR100: float | None = None
    ARs: float | None = None
    ARm: float | None = None
    ARl: float | None = None
    images: int | None = field(default=None, metadata=OPTIONAL)
    batch_size: int | None = field(default=None, metadata=OPTIONAL)
    detections: int | None = field(default=None, metadata=OPTIONAL)
    inference_seconds: float | None = field(default=None, metadata=OPTIONAL)
    processes: int | None = field(default=None, metadata=OPTIONAL)
    scoring_seconds: float | None = field(default=None, metadata=OPTIONAL)
    eval_backend: str | None = field(default=None, metadata=OPTIONAL)
    provenance: Provenance | None = field(default=None, metadata=OPTIONAL)

    @property
    def scored(self) -> bool:
        return self.status == "ok"
