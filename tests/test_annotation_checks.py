"""The data stage's checks across an annotation file and between the splits
(pipeline/data/annotations.py): the two splits agree on their categories, or the knob
data.category_mismatch says to warn; and what COCOeval reads but COCO files may leave out
(area, iscrowd) is filled in for it, in memory, the same for both backends, so that no
evaluation fails, or scores otherwise, after the data stage passed the tree."""
from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import pytest
import torch

from pipeline.config import schema, stages
from pipeline.data import prepare
from pipeline.data.dataset import DatasetError, annotation_path
from pipeline.detection.evaluate import evaluate
from pipeline.detection.model import build_model
from pipeline.detection.scoring import BACKENDS, METRICS, coco_metrics

from .conftest import small_config, user_data, write_coco
from .test_bad_inputs import (ann_file, assert_message, check_readme_row, good_dataset, noise_jpeg,
                              snapshot, write_earlier)


def data_config(root: Path, category_mismatch: str = "refuse") -> schema.Data:
    return user_data(root, category_mismatch=category_mismatch)


def edit_val(root: Path, change) -> Path:
    path = annotation_path(root, "val")
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))
    return path


# --- the splits agree on categories ---------------------------------------------------------

def a_val_box_of_a_category_training_lacks(doc: dict) -> None:
    """One validation box relabelled to a category that no training box has."""
    doc["categories"].append({"id": 9, "name": "zebra"})
    doc["annotations"][0]["category_id"] = 9


def renamed_in_val(doc: dict) -> None:
    doc["categories"][0]["name"] = "other thing"


CATEGORY_FIX = ("give both annotation files the same categories (one id for one name), with "
                "training boxes of each category validation uses; or set "
                "data.category_mismatch: warn to train and evaluate on them as they are")
CATEGORY_CASES = [
    ("val-category-absent-from-train", a_val_box_of_a_category_training_lacks,
     "category id(s) 9 ('zebra', 1 boxes) are used by validation boxes but by no training box "
     "in {ann}, so the model can never predict them and each such box counts as missed"),
    ("category-named-differently", renamed_in_val,
     "category id(s) 1 ('thing' in train, 'other thing' in val) are named differently in {ann}, "
     "so one id does not mean one category"),
]


@pytest.mark.parametrize("case", CATEGORY_CASES, ids=[c[0] for c in CATEGORY_CASES])
def test_splits_that_disagree_on_categories_are_refused(case, tmp_path):
    case_id, damage, what = case
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    val = edit_val(root, damage)
    manifest = tmp_path / "data" / "mine.manifest.json"
    write_earlier(manifest, '{"earlier": true}\n')
    before = snapshot(tmp_path)
    with pytest.raises(DatasetError) as err:
        prepare.prepare(data_config(root), str(manifest))
    assert_message(str(err.value), f"{val}: {what.format(ann=ann_file(root))}", CATEGORY_FIX)
    check_readme_row(case_id, str(err.value), root=root, ann=ann_file(root))
    assert snapshot(tmp_path) == before


def test_warn_takes_the_splits_over_as_they_are_with_a_warning(tmp_path, caplog):
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    val = edit_val(root, a_val_box_of_a_category_training_lacks)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.annotations"):
        manifest = prepare.prepare(data_config(root, "warn"), str(tmp_path / "m.json"))
    assert f"{val}: category id(s) 9 ('zebra', 1 boxes) are used by validation boxes" in caplog.text
    assert "data.category_mismatch: warn uses both splits as they are" in caplog.text
    assert manifest["category_mismatch"] == "warn"
    assert [line.split(":")[0] for line in manifest["category_mismatches"]] == [str(val)]


# --- what COCOeval reads, filled in where a file leaves it out ------------------------------

WIDTH, HEIGHT = 160, 120
# One object of each of COCOeval's sizes per image: small (< 32²), medium, large (> 96²).
BOXES = [[4, 4, 8, 8], [20, 10, 40, 40], [50, 10, 100, 100]]


def sized_tree(root: Path, optional_keys: bool) -> None:
    """Both splits, two 160x120 images, a small, a medium and a large box each; with
    `optional_keys` False, the annotations lack area and iscrowd (and, as write_coco writes
    them, the file has no info, licenses, segmentation or supercategory)."""
    for split in ("train", "val"):
        images = [{"id": i, "file_name": f"{i}.jpg", "width": WIDTH, "height": HEIGHT}
                  for i in (1, 2)]
        boxes = [{"id": 10 * i + k, "image_id": i, "category_id": 1, "bbox": box}
                 for i in (1, 2) for k, box in enumerate(BOXES)]
        if optional_keys:
            for box in boxes:
                box.update(area=box["bbox"][2] * box["bbox"][3], iscrowd=0)
        write_coco(root, split, images, boxes)
        for image in images:
            noise_jpeg(root / f"{split}2017" / image["file_name"], image["id"],
                       size=(WIDTH, HEIGHT))


def found(shift: int) -> list[dict]:
    """Each object found, shifted `shift` px sideways, and one false positive per image."""
    return ([{"image_id": i, "category_id": 1, "bbox": [x + shift, y, w, h], "score": 0.9}
             for i in (1, 2) for x, y, w, h in BOXES]
            + [{"image_id": i, "category_id": 1, "bbox": [120, 80, 30, 30], "score": 0.5}
               for i in (1, 2)])


def test_annotations_without_area_pass_the_data_stage_and_score_as_with_it(tmp_path, caplog):
    full, bare = tmp_path / "full", tmp_path / "bare"
    sized_tree(full, optional_keys=True)
    sized_tree(bare, optional_keys=False)
    before = snapshot(bare)
    with caplog.at_level(logging.INFO, logger="pipeline.data.dataset"):
        manifest = prepare.prepare(data_config(bare), str(tmp_path / "bare.manifest.json"))
    assert manifest["splits"]["val"]["filled_for_evaluation"] == {"area": 6, "iscrowd": 6}
    val = annotation_path(bare, "val")
    assert (f"{val}: 6 annotations lack area, read as the box's width x height; 6 annotations "
            "lack iscrowd, read as 0 (not a crowd) (in memory, for evaluation; the file is not "
            "changed)") in caplog.text
    for backend in BACKENDS:
        for detections in (found(2), found(6), []):
            scored = coco_metrics(val, detections, backend=backend)
            assert scored == coco_metrics(annotation_path(full, "val"), detections, backend=backend)
            # each size has its objects: none is -1 (no objects of that size), as it was for
            # the default backend, which counted every box without an area as small
            assert all(scored[f"{kind}{size}"] != -1.0 for kind in ("AP", "AR") for size in "sml")
    assert snapshot(bare) == before  # filled in memory: the user's file keeps its bytes


@pytest.fixture(scope="module")
def untrained_run(tmp_path_factory) -> tuple[Path, schema.EvaluateStage]:
    """A tree without area that the data stage passed, and an untrained tiny model of it as a
    run's model_final.pt: evaluation's every step, with detections of every score."""
    tmp = tmp_path_factory.mktemp("no-area")
    root = tmp / "data"
    sized_tree(root, optional_keys=False)
    prepare.prepare(data_config(root), str(tmp / "data.manifest.json"))
    cfg = stages.view(small_config(root), "evaluate")
    torch.manual_seed(0)
    model = build_model(schema.replaced(cfg.model, backbone_weights=None), num_classes=2)
    run_dir = tmp / "run"
    run_dir.mkdir()
    torch.save({"model": model.state_dict(), "num_classes": 2}, run_dir / "model_final.pt")
    return run_dir, cfg


def test_the_evaluation_stage_scores_a_tree_without_area_with_each_backend(untrained_run):
    run_dir, cfg = untrained_run
    scores = {}
    for backend in BACKENDS:
        record = evaluate(schema.replaced(cfg, eval={"backend": backend}), run_dir)
        assert record["detections"] > 0
        scores[backend] = [record[name] for name in METRICS]
        written = json.loads((run_dir / "metrics.json").read_text())
        assert [written[name] for name in METRICS] == scores[backend]
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(*scores.values())), scores
