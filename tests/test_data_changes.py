"""A user's own dataset that changes after a finished run, through the real workflow: images
added to a split make the data stage check it again and the run train again on the new data
(not resume on the old); nothing changed, or data put back as it was, plans nothing, and a dry
run writes nothing; a split that disappears is refused
with a message that names it. pipeline/data/tree.py compares the tree with its manifest."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipeline.runtime.files import MARKER
from pipeline.training.identity import fingerprint

from .conftest import small_config
from .test_train import single_run
from .workflow import copy_workflow, edit_params, jobs, on_disk, snakemake, tiny_params

pytestmark = pytest.mark.slow

RUN = "single-w1-b4-s0"
TARGET = f"results/runs/mine/{RUN}/metrics.json"


def users_tree(raw: dict) -> dict:
    """A preset `mine` on a COCO-layout tree of the user's at data/mine (no generator, no
    fetch): one single run of one epoch."""
    tiny_params(raw)
    raw["presets"]["mine"] = {"extends": "demo",
                              "data": {"name": "mine", "root": "data/mine", "synthetic": None},
                              "train": {"epochs": 1},
                              "sweep": [{"strategy": "single", "workers": 1}]}
    raw["preset"] = "mine"
    return raw


def add_training_images(root: Path, count: int) -> None:
    """`count` more training images: copies of the first ones, with their boxes, under new
    names and ids (a user adding pictures and their annotations)."""
    path = root / "annotations" / "instances_train2017.json"
    coco = json.loads(path.read_text())
    next_image = max(image["id"] for image in coco["images"]) + 1
    next_box = max(box["id"] for box in coco["annotations"]) + 1
    for image in coco["images"][:count]:
        new = dict(image, id=next_image, file_name=f"added_{next_image}.jpg")
        shutil.copy(root / "train2017" / image["file_name"], root / "train2017" / new["file_name"])
        for box in [b for b in coco["annotations"] if b["image_id"] == image["id"]]:
            coco["annotations"].append(dict(box, id=next_box, image_id=next_image))
            next_box += 1
        coco["images"].append(new)
        next_image += 1
    path.write_text(json.dumps(coco))


def iterations(workdir: Path) -> int:
    return json.loads((workdir / "results" / "runs" / "mine" / RUN / "train_summary.json")
                      .read_text())["iterations"]


@pytest.fixture
def workdir(tmp_path, small_dataset) -> Path:
    root = copy_workflow(tmp_path)
    edit_params(root, users_tree)
    shutil.copytree(small_dataset, root / "data" / "mine", ignore=shutil.ignore_patterns(MARKER))
    return root


def test_a_users_data_that_changes_is_checked_and_trained_on_again(workdir):
    snakemake(workdir, TARGET)
    manifest = workdir / "data" / "mine.manifest.json"
    assert json.loads(manifest.read_text())["splits"]["train"]["images"] == 24
    before = iterations(workdir)
    assert jobs(snakemake(workdir, "--dry-run", TARGET)) == {}

    # An annotation file edited, planned, then put back byte for byte (a new time): no
    # trace of the plan, nothing to do (a dry run writes nothing that a later plan reads)
    annotations = workdir / "data" / "mine" / "annotations" / "instances_val2017.json"
    kept = annotations.read_bytes()
    annotations.write_bytes(kept.replace(b'"images"', b'"images" ', 1))
    disk = on_disk(workdir)
    assert jobs(snakemake(workdir, "--dry-run", TARGET)) == {"data": 1, "train": 1, "evaluate": 1}
    assert on_disk(workdir) == disk
    annotations.write_bytes(kept)
    assert jobs(snakemake(workdir, "--dry-run", TARGET)) == {}

    add_training_images(workdir / "data" / "mine", 8)
    disk = on_disk(workdir)
    planned = snakemake(workdir, "--dry-run", TARGET)
    assert on_disk(workdir) == disk
    assert "data/mine changed since data/mine.manifest.json (train2017: 24 images -> 32 images" in (
        planned.stderr)
    assert jobs(planned) == {"data": 1, "train": 1, "evaluate": 1}
    log = snakemake(workdir, TARGET)
    assert json.loads(manifest.read_text())["splits"]["train"]["images"] == 32
    assert iterations(workdir) == before + 2  # 8 more images at 4 a step: trained on the new data
    train_log = (workdir / "logs" / "train" / "mine" / f"{RUN}.log").read_text()
    assert "resuming" not in train_log, train_log[-2000:]
    assert jobs(snakemake(workdir, "--dry-run", TARGET)) == {}, log.stderr[-2000:]

    # The validation split moved away: refused by name, not read as a smaller dataset.
    shutil.move(workdir / "data" / "mine" / "val2017", workdir / "val2017-elsewhere")
    failed = snakemake(workdir, TARGET, check=False)
    assert failed.returncode != 0
    data_log = (workdir / "logs" / "data" / "mine.log").read_text()
    assert "data/mine: lacks val2017 of the COCO 2017 layout the dataset needs" in data_log, data_log


def test_the_checkpoint_fingerprint_covers_the_data(tmp_path, small_dataset):
    """A run resumed after its data changed would mix two datasets: its checkpoint's
    fingerprint changes with the tree, and so it is not resumed."""
    root = tmp_path / "mine"
    shutil.copytree(small_dataset, root, ignore=shutil.ignore_patterns(MARKER))
    cfg = small_config(root)
    run = single_run(cfg)
    before = fingerprint(cfg, run)
    assert fingerprint(cfg, run) == before  # the same data: the same fingerprint
    add_training_images(root, 1)
    assert fingerprint(cfg, run) != before
