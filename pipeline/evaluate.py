"""COCO bbox evaluation of a trained run with pycocotools.

    python -m pipeline.evaluate --config '<preset JSON>' --run-dir DIR

Reads DIR/model_final.pt, predicts on the validation split, and writes
  DIR/predictions.json   detections in the COCO results format
  DIR/metrics.json       AP@[.5:.95], AP50, AP75, AP small/medium/large, AR@1/10/100, AR s/m/l
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import time
from pathlib import Path

import torch
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval

from . import distributed, lifetime, provenance, stages
from .dataset import CocoDetection, annotation_path, collate
from .files import read_json, write_json
from .model import build_model

log = logging.getLogger("evaluate")
# The order of COCOeval.stats for bounding boxes.
METRICS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def coco_metrics(ground_truth_file: str | Path, detections: list[dict],
                 image_ids: list[int] | None = None) -> dict[str, float]:
    """COCOeval's twelve bbox numbers. No detections at all scores 0 (pycocotools would fail);
    -1 means the ground truth has no object of that size, as in COCOeval."""
    with contextlib.redirect_stdout(io.StringIO()):
        coco_gt = COCO(str(ground_truth_file))
    if not detections:
        ids = image_ids or coco_gt.getImgIds()
        has = {size: any(True for a in coco_gt.loadAnns(coco_gt.getAnnIds(imgIds=ids))
                         if not a.get("iscrowd", 0) and lo <= a["area"] < hi)
               for size, (lo, hi) in {"s": (0, 32**2), "m": (32**2, 96**2), "l": (96**2, 1e10)}.items()}
        zero = {name: 0.0 for name in METRICS}
        for size in "sml":
            if not has[size]:
                zero[f"AP{size}"] = zero[f"AR{size}"] = -1.0
        return zero
    output = io.StringIO()
    with contextlib.redirect_stdout(output):
        coco_dt = coco_gt.loadRes(detections)
        evaluator = COCOeval(coco_gt, coco_dt, iouType="bbox")
        if image_ids is not None:
            evaluator.params.imgIds = sorted(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    log.info("COCOeval:\n%s", output.getvalue())
    return {name: float(value) for name, value in zip(METRICS, evaluator.stats)}


def to_coco_results(image_id: int, output: dict, score_threshold: float) -> list[dict]:
    """torchvision's xyxy boxes -> COCO results entries with xywh boxes."""
    results = []
    for box, score, label in zip(output["boxes"].tolist(), output["scores"].tolist(),
                                 output["labels"].tolist()):
        if score < score_threshold:
            continue
        x0, y0, x1, y1 = box
        results.append({"image_id": image_id, "category_id": int(label),
                        "bbox": [round(x0, 2), round(y0, 2), round(x1 - x0, 2), round(y1 - y0, 2)],
                        "score": round(float(score), 5)})
    return results


@torch.no_grad()
def predict(model, dataset, batch_size: int, device: torch.device,
            score_threshold: float) -> list[dict]:
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collate)
    model.eval()
    detections = []
    for images, targets in loader:
        outputs = model([image.to(device) for image in images])
        for target, output in zip(targets, outputs):
            output = {k: v.cpu() for k, v in output.items()}
            detections += to_coco_results(target["image_id"], output, score_threshold)
    return detections


def evaluate(cfg: dict, run_dir: str | Path) -> dict | None:
    """Predict and score. Under torchrun (a ddp run) every rank predicts its share of the
    validation images and rank 0 scores the gathered predictions in one COCO evaluation."""
    run_dir = Path(run_dir)
    rank, world, device = 0, 1, distributed.default_device()
    if distributed.launched_by_torchrun():
        member = distributed.init_process_group(cfg["parallel"], 0)
        rank, world, device = member.rank, member.processes, member.device
    checkpoint = torch.load(run_dir / "model_final.pt", map_location="cpu", weights_only=False)
    model_cfg = dict(cfg["model"], backbone_weights=None)  # the trained weights replace them
    model = build_model(model_cfg, checkpoint["num_classes"])
    model.load_state_dict(checkpoint["model"])
    model.roi_heads.detections_per_img = cfg["eval"]["max_detections"]
    model.to(device)
    dataset = CocoDetection(cfg["data"]["root"], "val", train=False)
    start = time.perf_counter()
    share = torch.utils.data.Subset(dataset, range(rank, len(dataset), world))
    detections = predict(model, share, cfg["eval"]["batch_size"], device,
                         cfg["eval"]["score_threshold"])
    if world > 1:
        gathered = distributed.all_gather(detections)
        distributed.destroy_process_group()
        if rank != 0:
            return None
        detections = [d for part in gathered for d in part]
    seconds = time.perf_counter() - start
    write_json(run_dir / "predictions.json", detections)
    metrics = coco_metrics(annotation_path(cfg["data"]["root"], "val"), detections,
                           dataset.image_ids())
    record = {"run_id": run_dir.name, **metrics, "images": len(dataset),
              "detections": len(detections), "inference_seconds": seconds, "processes": world,
              "provenance": provenance.collect(stages.config_for(cfg, "evaluate"),
                                               device=str(device), threads=torch.get_num_threads())}
    write_json(run_dir / "metrics.json", record)
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="COCO bbox evaluation of one trained run.")
    parser.add_argument("--config", required=True, help="resolved preset as JSON")
    parser.add_argument("--run-dir", required=True)
    args = parser.parse_args(argv)
    lifetime.die_with_parent()  # a worker of torchrun (or the launcher itself): go with it
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    summary = read_json(Path(args.run_dir) / "train_summary.json")
    if summary["status"] != "ok":  # a skipped run has no model; its metrics say why
        write_json(Path(args.run_dir) / "predictions.json", [])
        write_json(Path(args.run_dir) / "metrics.json",
                   {"run_id": Path(args.run_dir).name, "status": summary["status"],
                    "reason": summary["reason"], **{name: None for name in METRICS}})
        return
    record = evaluate(json.loads(args.config), args.run_dir)
    if record is not None:
        print(json.dumps({k: round(record[k], 4) for k in METRICS}))


if __name__ == "__main__":
    main()
