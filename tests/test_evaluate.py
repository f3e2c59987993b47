"""COCO evaluation on hand-built cases whose AP is known, by both COCOeval backends, and the two
backends' twelve numbers against each other on a dataset's worth of imperfect detections."""
from __future__ import annotations

import json
import logging
import random

import pytest
import torch

from pipeline.data.dataset import annotation_path
from pipeline.detection.scoring import BACKENDS, METRICS, coco_metrics, to_coco_results

from .conftest import write_coco


@pytest.fixture(params=BACKENDS)
def backend(request):
    return request.param

# Two images, one 100x100 object each (area 10000 > 96²: a "large" object in COCO's sense).
GROUND_TRUTH = [((1, [10, 10, 100, 100]), 1), ((2, [50, 20, 100, 100]), 2)]


@pytest.fixture
def gt_file(tmp_path):
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 200, "height": 200} for i in (1, 2)]
    annotations = [{"id": k, "image_id": image_id, "category_id": category, "bbox": box,
                    "area": box[2] * box[3], "iscrowd": 0}
                   for k, ((image_id, box), category) in enumerate(GROUND_TRUTH, 1)]
    return write_coco(tmp_path, "val", images, annotations,
                      categories=[{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])


def detections(shift: float = 0.0, category_offset: int = 0) -> list[dict]:
    return [{"image_id": image_id, "category_id": category + category_offset,
             "bbox": [box[0] + shift, box[1], box[2], box[3]], "score": 0.9}
            for (image_id, box), category in GROUND_TRUTH]


def test_perfect_predictions_score_one(gt_file, backend):
    metrics = coco_metrics(gt_file, detections(), backend=backend)
    for name in ("AP", "AP50", "AP75", "APl", "AR1", "AR10", "AR100"):
        assert metrics[name] == pytest.approx(1.0), name
    assert metrics["APs"] == metrics["APm"] == -1.0  # no small or medium objects at all


def test_shifted_boxes_score_by_their_iou(gt_file, backend):
    # Shifted 20 px sideways: IoU = 80*100 / (2*10000 - 80*100) = 2/3. It is a match at the
    # IoU thresholds .50, .55, .60, .65 and a miss at .70 ... .95: AP@[.5:.95] = 4/10.
    metrics = coco_metrics(gt_file, detections(shift=20), backend=backend)
    assert metrics["AP"] == pytest.approx(0.4)
    assert metrics["AP50"] == pytest.approx(1.0)
    assert metrics["AP75"] == pytest.approx(0.0)


def test_wrong_class_scores_zero_and_no_detections_too(gt_file, backend):
    swapped = [dict(d, category_id=3 - d["category_id"]) for d in detections()]
    assert coco_metrics(gt_file, swapped, backend=backend)["AP"] == pytest.approx(0.0)
    empty = coco_metrics(gt_file, [], backend=backend)
    assert empty["AP"] == 0.0 and empty["APl"] == 0.0 and empty["APs"] == -1.0


def test_half_the_objects_found(gt_file, backend):
    # One of two objects per class found: per-class AP of 1.0 and 0.0 -> mean 0.5.
    metrics = coco_metrics(gt_file, detections()[:1], backend=backend)
    assert metrics["AP50"] == pytest.approx(0.5)


def test_torchvision_output_to_coco_results():
    output = {"boxes": torch.tensor([[10.0, 20.0, 30.0, 60.0], [0.0, 0.0, 5.0, 5.0]]),
              "scores": torch.tensor([0.8, 0.01]), "labels": torch.tensor([3, 1])}
    results = to_coco_results(7, output, score_threshold=0.05)
    assert results == [{"image_id": 7, "category_id": 3, "bbox": [10.0, 20.0, 20.0, 40.0], "score": 0.8}]


def jittered_detections(ground_truth: dict, seed: int, per_image: int = 20) -> list[dict]:
    """Imperfect detections: every object found with a shifted box and a random score, plus
    false positives, so that every threshold, area range and recall level has work to do."""
    rng = random.Random(seed)
    categories = [c["id"] for c in ground_truth["categories"]]
    found = []
    for image in ground_truth["images"]:
        objects = [a for a in ground_truth["annotations"] if a["image_id"] == image["id"]]
        for a in objects:
            x, y, w, h = a["bbox"]
            found.append({"image_id": image["id"], "category_id": a["category_id"], "score": rng.random(),
                          "bbox": [x + rng.uniform(-0.2, 0.2) * w, y + rng.uniform(-0.2, 0.2) * h,
                                   w * rng.uniform(0.7, 1.3), h * rng.uniform(0.7, 1.3)]})
        for _ in range(per_image - len(objects)):
            w, h = rng.uniform(4, image["width"] / 2), rng.uniform(4, image["height"] / 2)
            found.append({"image_id": image["id"], "category_id": rng.choice(categories),
                          "score": rng.random() * 0.5, "bbox": [rng.uniform(0, image["width"] - w),
                                                                rng.uniform(0, image["height"] - h), w, h]})
    return found


def test_both_backends_give_the_same_twelve_numbers(small_dataset):
    path = annotation_path(small_dataset, "val")
    found = jittered_detections(json.loads(path.read_text()), seed=0)
    scores = {backend: coco_metrics(path, found, backend=backend) for backend in BACKENDS}
    assert 0.05 < scores["pycocotools"]["AP"] < 0.95  # neither trivial nor perfect
    for name in METRICS:
        assert scores["faster-coco-eval"][name] == pytest.approx(scores["pycocotools"][name], abs=1e-6), name


def test_cocoevals_output_goes_to_the_runs_log_not_the_console(gt_file, backend, capfd, caplog):
    """What COCOeval says (loading, DONE, its twelve-line summary) is appended to the file it is
    given (the run's cocoeval.log), one block per evaluation, and nothing reaches stdout, stderr
    or the logging of the process; the twelve numbers are the same as without it."""
    caplog.set_level(logging.INFO)  # as a stage logs: COCOeval's INFO lines would show
    chatter = gt_file.parent.parent / "cocoeval.log"
    quiet = coco_metrics(gt_file, detections(shift=20), backend=backend, chatter=chatter)
    coco_metrics(gt_file, detections(), backend=backend, chatter=chatter)
    console = capfd.readouterr()
    assert console.out == "" and "Average Precision" not in console.err + caplog.text
    said = chatter.read_text()
    assert said.count(f"COCOeval ({backend}) of 2 detections on {gt_file}") == 2
    assert said.count("Average Precision  (AP) @[ IoU=0.50:0.95 | area=   all | maxDets=100 ]") == 2
    assert said.count("Average Precision") == 12  # six a summary, in both backends
    assert quiet == coco_metrics(gt_file, detections(shift=20), backend=backend)
