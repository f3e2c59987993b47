"""COCO bbox evaluation of a trained run with pycocotools.

    python -m pipeline.detection.evaluate --config '<preset JSON>' --run-dir DIR

Reads DIR/model_final.pt, predicts on the validation split, and writes
  DIR/predictions.json   detections in the COCO results format
  DIR/metrics.json       AP@[.5:.95], AP50, AP75, AP small/medium/large, AR@1/10/100, AR s/m/l
  DIR/cocoeval.log       what COCOeval said (appended; its console gets one line of AP)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from ..config import cli, schema, stages
from ..data.dataset import CocoDetection, DatasetError, annotation_path
from ..runtime import distributed, lifetime, provenance
from ..runtime.files import write_json
from .model import build_model
from .scoring import CHATTER, coco_metrics, not_evaluated, predict, record_not_evaluated

log = logging.getLogger("evaluate")


def evaluate(cfg: schema.EvaluateStage, run_dir: str | Path) -> dict | None:
    """Predict and score. Under torchrun (a ddp run) every rank predicts its share of the
    validation images and rank 0 scores the gathered predictions in one COCO evaluation."""
    run_dir = Path(run_dir)
    rank, world, device = 0, 1, distributed.default_device()
    if distributed.launched_by_torchrun():
        member = distributed.init_process_group(cfg.parallel.backend, cfg.parallel.timeout_s, 0)
        rank, world, device = member.rank, member.processes, member.device
    checkpoint = torch.load(run_dir / "model_final.pt", map_location="cpu", weights_only=True)
    model_cfg = cfg.model.model_copy(update={"backbone_weights": None})  # the trained weights replace them
    model = build_model(model_cfg, checkpoint["num_classes"])
    model.load_state_dict(checkpoint["model"])
    model.roi_heads.detections_per_img = cfg.eval.max_detections
    model.to(device)
    dataset = CocoDetection(cfg.data.root, "val", train=False, exif_orientation=cfg.data.exif_orientation)
    start = time.perf_counter()
    share = torch.utils.data.Subset(dataset, range(rank, len(dataset), world))
    detections = predict(model, share, cfg.eval.batch_size, device, cfg.eval.score_threshold)
    if world > 1:
        gathered = distributed.all_gather(detections)
        distributed.destroy_process_group()
        if rank != 0:
            return None
        detections = [d for part in gathered for d in part]
    seconds = time.perf_counter() - start
    write_json(run_dir / "predictions.json", detections)
    scoring_start = time.perf_counter()
    metrics = coco_metrics(
        annotation_path(cfg.data.root, "val"),
        detections,
        dataset.image_ids(),
        cfg.eval.backend,
        chatter=run_dir / CHATTER,
    )
    scoring_seconds = time.perf_counter() - scoring_start
    record = {
        "run_id": run_dir.name,
        **metrics,
        "images": len(dataset),
        "batch_size": cfg.eval.batch_size,
        "detections": len(detections),
        "inference_seconds": seconds,
        "processes": world,
        "scoring_seconds": scoring_seconds,
        "eval_backend": cfg.eval.backend,
        "provenance": provenance.collect(
            stages.config_for(cfg, "evaluate"), device=str(device), threads=torch.get_num_threads()
        ),
    }
    write_json(run_dir / "metrics.json", record)
    return record


def main(argv: list[str] | None = None) -> None:
    def body(args):
        why_not = not_evaluated(args.run_dir)
        if why_not:  # a skipped run has no model, a synthetic one learnt noise; metrics say why
            record_not_evaluated(args.run_dir, why_not)
            return
        record = evaluate(args.cfg, args.run_dir)
        if record is not None:  # one line: the twelve numbers are in metrics.json
            log.info(
                "AP %.4f AP50 %.4f AP75 %.4f over %d images (all twelve: %s; COCOeval's output: %s)",
                record["AP"],
                record["AP50"],
                record["AP75"],
                record["images"],
                Path(args.run_dir) / "metrics.json",
                Path(args.run_dir) / CHATTER,
            )

    # A dataset that changed since the data stage checked it (an image rewritten or cut short)
    # ends the stage in one line naming the file, as it ends training.
    cli.run_stage(
        "COCO bbox evaluation of one trained run.",
        body,
        stage="evaluate",
        argv=argv,
        arguments=lambda parser: parser.add_argument("--run-dir", required=True),
        errors=(DatasetError,),
    )


if __name__ == "__main__":
    main()
    lifetime.exit_finished()  # not through the teardown (runtime/lifetime.py)
