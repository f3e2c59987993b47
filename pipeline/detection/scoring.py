"""Scoring detections with COCOeval: what the final evaluation (pipeline/detection/evaluate.py) and
the evaluations during training (pipeline/training/train.py) share, and which runs are not scored.

Two implementations of COCOeval, `eval.backend`: pycocotools, the reference, and
faster-coco-eval (C++), the same algorithm faster; tests/test_evaluate.py holds both to the
same assertions, and to each other's twelve numbers within 1e-6.

Kept apart from evaluate.py, the evaluation stage's command line, so that editing that stage
does not rerun training (the Snakefile's code inputs follow each stage's imports).
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .. import strategies  # noqa: F401  declares each strategy's facts, keys of a run summary
from ..runtime.files import read_json, write_json
from ..runtime.records.training import RunSummary

if TYPE_CHECKING:
    import torch

    from ..data.dataset import CocoDetection

# The order of COCOeval.stats for bounding boxes.
METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
BACKENDS = ("pycocotools", "faster-coco-eval")
DEFAULT_BACKEND = "faster-coco-eval"  # for the evaluations during training; equal numbers
CHATTER = "cocoeval.log"  # in the run directory: what COCOeval says of each evaluation of the run


def ground_truth(path: str | Path, backend: str):
    """The backend's COCO of annotation file `path`, built from the document COCOeval reads
    (pipeline/data/annotations.py: keys COCO files may leave out filled in, the file unchanged),
    the same for both backends."""
    from ..data.annotations import for_evaluation

    COCO, _ = coco_api(backend)
    document = for_evaluation(path)
    if backend == "faster-coco-eval":
        return COCO(document)
    coco = COCO()  # pycocotools takes only a file name: its documented way for a dict
    coco.dataset = document
    coco.createIndex()
    return coco


@contextlib.contextmanager
def chatter_into(stream: io.StringIO):
    """COCOeval's own output (pycocotools prints it, faster-coco-eval logs it: loading,
    "DONE (t=...)", the twelve-line summary) into `stream` instead of the console, where it
    buried each evaluation's one line."""
    library = logging.getLogger("faster_coco_eval")
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    kept = library.level, library.propagate
    library.addHandler(handler)
    library.setLevel(logging.INFO)
    library.propagate = False
    try:
        with contextlib.redirect_stdout(stream):
            yield stream
    finally:
        library.removeHandler(handler)
        library.setLevel(kept[0])
        library.propagate = kept[1]


def keep_chatter(text: str, chatter: Path | None, what: str) -> None:
    """COCOeval's output of one evaluation appended to file `chatter` (the run's cocoeval.log),
    under a line saying when and of what; dropped where there is no file to keep it in."""
    if chatter is not None:
        with open(chatter, "a") as handle:
            handle.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} {what}\n{text}\n")


def coco_api(backend: str):
    """(COCO, COCOeval) of the backend."""
    if backend == "pycocotools":
        from pycocotools.coco import COCO
        from pycocotools.cocoeval import COCOeval

        return COCO, COCOeval
    if backend == "faster-coco-eval":
        from faster_coco_eval import COCO, COCOeval_faster

        return COCO, COCOeval_faster
    raise ValueError(f"eval.backend: {backend!r} is not one of {', '.join(BACKENDS)}")


def coco_metrics(
    ground_truth_file: str | Path,
    detections: list[dict],
    image_ids: list[int] | None = None,
    backend: str = DEFAULT_BACKEND,
    chatter: Path | None = None,
) -> dict[str, float]:
    """COCOeval's twelve bbox numbers. No detections at all scores 0 (pycocotools would fail);
    -1 means the ground truth has no object of that size, as in COCOeval. What COCOeval itself
    says goes to file `chatter`, never to the console (chatter_into)."""
    _, COCOeval = coco_api(backend)
    with chatter_into(io.StringIO()) as said:
        coco_gt = ground_truth(ground_truth_file, backend)
        metrics = _scored(coco_gt, COCOeval, detections, image_ids)
    keep_chatter(
        said.getvalue(), chatter, f"COCOeval ({backend}) of {len(detections)} detections on {ground_truth_file}"
    )
    return metrics


def _scored(coco_gt, COCOeval, detections: list[dict], image_ids: list[int] | None) -> dict[str, float]:
    if not detections:
        ids = image_ids or coco_gt.getImgIds()
        has = {
            size: any(
                True
                for a in coco_gt.loadAnns(coco_gt.getAnnIds(imgIds=ids))
                if not a.get("iscrowd", 0) and lo <= a["area"] < hi
            )
            for size, (lo, hi) in {"s": (0, 32**2), "m": (32**2, 96**2), "l": (96**2, 1e10)}.items()
        }
        zero = {name: 0.0 for name in METRICS}
        for size in "sml":
            if not has[size]:
                zero[f"AP{size}"] = zero[f"AR{size}"] = -1.0
        return zero
    coco_dt = coco_gt.loadRes(detections)
    evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
    if image_ids is not None:
        evaluator.params.imgIds = sorted(image_ids)
    evaluator.evaluate()
    evaluator.accumulate()
    evaluator.summarize()
    return {name: float(value) for name, value in zip(METRICS, evaluator.stats, strict=False)}


def to_coco_results(image_id: int, output: dict, score_threshold: float) -> list[dict]:
    """torchvision's xyxy boxes -> COCO results entries with xywh boxes."""
    results = []
    for box, score, label in zip(
        output["boxes"].tolist(), output["scores"].tolist(), output["labels"].tolist(), strict=False
    ):
        if score < score_threshold:
            continue
        x0, y0, x1, y1 = box
        results.append(
            {
                "image_id": image_id,
                "category_id": int(label),
                "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                "score": round(float(score), 5),
            }
        )
    return results


def predict(model, dataset, batch_size: int, device: torch.device, score_threshold: float) -> list[dict]:
    import torch

    from ..data.dataset import collate, to_model_input

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    model.eval()
    detections = []
    with torch.no_grad():
        for images, targets in loader:
            outputs = model([to_model_input(image, device) for image in images])  # uint8 in
            for target, output in zip(targets, outputs, strict=False):
                output = {k: v.cpu() for k, v in output.items()}
                detections += to_coco_results(target["image_id"], output, score_threshold)
    return detections


def score(
    model, dataset: CocoDetection, batch_size: int, device: torch.device, chatter: Path | None = None
) -> dict[str, float]:
    """COCO's standard box AP of `model` on `dataset` (every detection, up to the model's 100
    per image): the evaluations training makes as it goes (time-to-accuracy)."""
    detections = predict(model, dataset, batch_size, device, score_threshold=0.0)
    return coco_metrics(dataset.source, detections, dataset.image_ids(), chatter=chatter)


SYNTHETIC_REASON = (
    "trained on in-memory random pixels (data_mode: synthetic) to time the "
    "strategy without its loader; its AP would say nothing, so it is not evaluated"
)


def not_evaluated(run_dir: str | Path) -> tuple[str, str] | None:
    """(status, reason) of a run whose model is not scored, None for one that is, from its
    train_summary.json as any version wrote it."""
    path = Path(run_dir) / "train_summary.json"
    summary = RunSummary.from_json(read_json(path), str(path))
    if summary.status != "ok":
        return summary.status, summary.reason
    if summary.data_mode == "synthetic":
        return "not evaluated", SYNTHETIC_REASON
    return None


def record_not_evaluated(run_dir: str | Path, why: tuple[str, str]) -> None:
    """The metrics of a run that is not scored: its status and reason, every metric None."""
    run_dir = Path(run_dir)
    write_json(run_dir / "predictions.json", [])
    write_json(
        run_dir / "metrics.json",
        {"run_id": run_dir.name, "status": why[0], "reason": why[1], **{name: None for name in METRICS}},
    )
