"""The bad-input catalogue: each input a user can get wrong, and the message it gets.

Every case checks that the message has the form `<file or key>: <what is wrong>; <remedy>`,
naming the file, key or value and saying what to do, and that the failure touched nothing:
what was written before (an earlier manifest or result, the dataset itself) keeps its bytes
and mtime, and nothing new (half-written) appears.

README's table of messages ("Bad input, and the message each gets") is checked against these
cases: each case checks its row against the message it really produced (check_readme_row, at the
end), and test_readme_table_has_a_row_for_each_case that rows and cases correspond one to one.
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageOps
from torchvision.transforms.v2.functional import pil_to_tensor

from pipeline.config import params, stages
from pipeline.config.params import canonical
from pipeline.data import dataset as dataset_module
from pipeline.data import prepare
from pipeline.data.dataset import CocoDetection, DatasetError, annotation_path, build_manifest
from pipeline.detection.model import build_model
from pipeline.runtime import run_lock
from pipeline.strategies import sweep
from pipeline.training.train import train

from .conftest import HANG_S, REPO, small_config, user_data, write_coco

EARLIER = 1_500_000_000  # an mtime in the past: a rewrite with the same bytes still shows


# --- what the failure must leave alone -------------------------------------------------------

def snapshot(root: Path) -> dict[str, tuple]:
    """Every file and folder under root: its bytes and mtime (a folder: None and its mtime)."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def write_earlier(path: Path, text: str) -> None:
    """An output of an earlier, successful run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    os.utime(path, (EARLIER, EARLIER))


def assert_message(message: str, what: str, remedy: str) -> None:
    """One line of the message starts with `what` (the file or key, and what is wrong) and
    goes on to the remedy."""
    lines = [line.strip() for line in message.splitlines()]
    assert any(line.startswith(what) and remedy in line[len(what):] for line in lines), (
        f"expected a line starting with\n  {what}\nand going on to\n  {remedy}\ngot\n  {message}")


# --- data: a small valid COCO layout, then one thing broken ---------------------------------

def noise_jpeg(path: Path, seed: int, kind: str = "JPEG", size=(64, 48)) -> None:
    """Noise (64x48 unless `size` says): its JPEG scan data is most of the file, so half the
    file is a cut scan."""
    pixels = np.random.default_rng(seed).integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path, format=kind)


def good_dataset(root: Path) -> None:
    """Both splits, two images each, one box per image."""
    for split in ("train", "val"):
        images = [{"id": i, "file_name": f"{i}.jpg", "width": 64, "height": 48} for i in (1, 2)]
        annotations = [{"id": i, "image_id": i, "category_id": 1, "bbox": [1, 1, 10, 10],
                        "area": 100.0, "iscrowd": 0} for i in (1, 2)]
        write_coco(root, split, images, annotations)
        for image in images:
            noise_jpeg(root / f"{split}2017" / image["file_name"], image["id"])


def ann_file(root: Path) -> Path:
    return annotation_path(root, "train")


def own(remedy: str):
    """A remedy for a user's own tree, then the one for a tree the data stage made."""
    return lambda r: (f"{remedy.format(ann=ann_file(r), root=r)}; for a dataset the data stage "
                      f"fetched or generated, delete {r} and rerun the data stage to fetch or "
                      "generate it again")


UNDECODABLE = own("replace the file with a readable copy, or remove it: its entry in 'images' "
                  "and its annotations in {ann}")
RENUMBER = ("renumber the categories from 1 in 'categories' and in every annotation's "
            "category_id (e.g. add 1 to each id if they start at 0), the same way in the train "
            "and val annotation files")


def image_file(root: Path) -> Path:
    return root / "train2017" / "1.jpg"


def edit(change):
    """A damage that edits the train annotations (json writes NaN and Infinity as Python does)."""
    def damage(root: Path) -> None:
        document = json.loads(ann_file(root).read_text())
        change(document)
        ann_file(root).write_text(json.dumps(document))
    return damage


def set_bbox(bbox):
    return edit(lambda doc: doc["annotations"][0].update(bbox=bbox))


def truncate(root: Path) -> None:
    data = image_file(root).read_bytes()
    image_file(root).write_bytes(data[:len(data) // 2])


def as_png(root: Path) -> None:
    noise_jpeg(image_file(root), 1, kind="PNG")


def replace_image(name: str, image: Image.Image):
    """A damage: train image 1 replaced by `image`, saved as `name` (its format by the suffix),
    and its file_name in the annotations changed to match."""
    def damage(root: Path) -> None:
        image_file(root).unlink()
        image.save(root / "train2017" / name)
        edit(lambda doc: doc["images"][0].update(file_name=name))(root)
    return damage


def with_transparent_corner() -> Image.Image:
    """64x48 RGBA, opaque but for a 4x4 corner: what a viewer shows there is its background."""
    pixels = np.full((48, 64, 4), 200, dtype=np.uint8)
    pixels[..., 3] = 255
    pixels[:4, :4, 3] = 0
    return Image.fromarray(pixels, mode="RGBA")


def duplicate_image_id(doc: dict) -> None:
    doc["images"][1]["id"] = 1


def duplicate_annotation_id(doc: dict) -> None:
    doc["annotations"][1]["id"] = 1


def numbered_from_0(doc: dict) -> None:
    """What some exporters write: the first category is 0."""
    doc["categories"] = [{"id": 0, "name": "thing"}]
    for ann in doc["annotations"]:
        ann["category_id"] = 0


def negative_category(doc: dict) -> None:
    doc["annotations"][0]["category_id"] = -1


# (id, damage, when, what, remedy); `what` and `remedy` are functions of the dataset root.
# when: "load" fails when the dataset is opened; "decode" when the image is read (training
# reads lazily; the data stage decodes every image first).
DATA_CASES = [
    ("truncated-jpeg", truncate, "decode",
     lambda r: f"{image_file(r)}: cannot decode image 1: the file is truncated: its JPEG data "
               "stops after", UNDECODABLE),
    ("zero-byte-jpeg", lambda r: image_file(r).write_bytes(b""), "decode",
     lambda r: f"{image_file(r)}: cannot decode image 1: the file is empty (0 bytes)",
     UNDECODABLE),
    ("png-named-jpg", as_png, "decode",
     lambda r: f"{image_file(r)}: holds PNG data although its name says JPEG",
     lambda r: f"re-encode it as JPEG, or rename it to 1.png and change its file_name in {ann_file(r)}"),
    ("size-differs-from-annotations", edit(lambda doc: doc["images"][0].update(width=100)), "decode",
     lambda r: f"{image_file(r)}: is 64x48 but {ann_file(r)} says 100x48",
     own("correct width and height of image 1 in {ann}, or replace the file with the image "
         "they describe")),
    ("image-mode-without-rule", replace_image("1.tif", Image.new("LAB", (64, 48))), "decode",
     lambda r: f"{r / 'train2017' / '1.tif'}: image 1 is stored in PIL mode LAB, which has no rule "
               "here to be read as RGB",
     own("convert it to 8-bit RGB (or to one of those modes), or remove it: its entry in "
         "'images' and its annotations in {ann}")),
    ("transparent-pixels", replace_image("1.png", with_transparent_corner()), "decode",
     lambda r: f"{r / 'train2017' / '1.png'}: image 1 has 16 transparent or translucent pixels "
               "(PIL mode RGBA)",
     own("flatten it onto that background (e.g. magick IN -background white -flatten OUT), or "
         "remove it: its entry in 'images' and its annotations in {ann}")),
    ("missing-image", lambda r: image_file(r).unlink(), "load",
     lambda r: f"{r / 'train2017'}: 1 image(s) listed in {ann_file(r)} are missing, e.g. ['1.jpg']",
     own("add the files to {root}/train2017, or remove their entries in 'images' (and their "
         "annotations) from {ann}")),
    ("negative-box-size", set_bbox([1, 1, -4, 5]), "load",
     lambda r: f"{ann_file(r)}: annotation 1 of image 1 (1.jpg): bbox [1, 1, -4, 5] has a "
               "negative width or height", lambda r: "fix or remove the annotation"),
    ("nan-box", set_bbox([1, float("nan"), 5, 5]), "load",
     lambda r: f"{ann_file(r)}: annotation 1 of image 1 (1.jpg): bbox [1, nan, 5, 5] has a NaN "
               "or infinite coordinate", lambda r: "fix or remove the annotation"),
    ("infinite-box", set_bbox([1, 1, float("inf"), 5]), "load",
     lambda r: f"{ann_file(r)}: annotation 1 of image 1 (1.jpg): bbox [1, 1, inf, 5] has a NaN "
               "or infinite coordinate", lambda r: "fix or remove the annotation"),
    ("box-not-4-numbers", set_bbox([1, 1, 5]), "load",
     lambda r: f"{ann_file(r)}: annotation 1 of image 1 (1.jpg): bbox [1, 1, 5] is not 4 numbers",
     lambda r: "fix or remove the annotation"),
    ("unknown-category", edit(lambda doc: doc["annotations"][0].update(category_id=7)), "load",
     lambda r: f"{ann_file(r)}: annotation 1 has category_id 7, which is not in 'categories'",
     lambda r: "add the category or fix the annotation's category_id"),
    ("category-id-0", edit(numbered_from_0), "load",
     lambda r: f"{ann_file(r)}: category id(s) 0 ('thing'), used by 2 annotation(s), are not "
               "whole numbers from 1: torchvision's detector reserves label 0 for the background",
     lambda r: RENUMBER),
    ("negative-category-id", edit(negative_category), "load",
     lambda r: f"{ann_file(r)}: category id(s) -1 (not in 'categories'), used by 1 annotation(s), "
               "are not whole numbers from 1", lambda r: RENUMBER),
    ("segmentation-without-bbox", edit(lambda doc: doc["annotations"][0].pop("bbox")), "load",
     lambda r: f"{ann_file(r)}: annotations entry 1 lacks bbox",
     own("give each such annotation a bbox [x, y, width, height] (its object's bounding box), "
         "or remove it")),
    ("unknown-image", edit(lambda doc: doc["annotations"][0].update(image_id=99)), "load",
     lambda r: f"{ann_file(r)}: annotation 1 refers to image 99, which is not in 'images'",
     lambda r: "add the image or remove the annotation"),
    ("area-not-a-number", edit(lambda doc: doc["annotations"][0].update(area="100")), "load",
     lambda r: f"{ann_file(r)}: annotation 1 of image 1 has area '100', which COCOeval cannot read",
     lambda r: "write area: a number from 0, or no area key: then the box's width x height is "
               "used"),
    ("file-name-under-two-ids", edit(lambda doc: doc["images"][1].update(file_name="1.jpg")), "load",
     lambda r: f"{ann_file(r)}: file_name '1.jpg' is listed under 2 image ids (1, 2)",
     lambda r: "an image is listed once: keep one entry (id 1) and give its annotations that image_id "
               "(those of id(s) 2 too), or point each entry at its own file"),
    ("bbox-of-strings", set_bbox(["10", "43", "27", "27"]), "load",
     lambda r: f"{ann_file(r)}: annotation 1 (image 1) has bbox ['10', '43', '27', '27'], which holds a value "
               "that is not a number",
     lambda r: "write bbox as 4 JSON numbers [x, y, width, height], without quotes"),
    ("id-a-string", edit(lambda doc: doc["annotations"][0].update(category_id="1")), "load",
     lambda r: f"{ann_file(r)}: annotation 1 has category_id '1', not a whole number",
     lambda r: "write category_id as a JSON number, without quotes"),
    ("duplicate-image-id", edit(duplicate_image_id), "load",
     lambda r: f"{ann_file(r)}: image id 1 is used by 2 entries of 'images' (1.jpg, 2.jpg)",
     lambda r: "give each image its own id"),
    ("duplicate-annotation-id", edit(duplicate_annotation_id), "load",
     lambda r: f"{ann_file(r)}: annotation id 1 is used by 2 entries of 'annotations'",
     lambda r: "give each annotation its own id"),
    ("malformed-json", lambda r: ann_file(r).write_text('{"images": ['), "load",
     lambda r: f"{ann_file(r)}: not valid JSON (Expecting value, line 1)",
     own("correct the JSON there, or restore the file")),
    ("json-list", lambda r: ann_file(r).write_text("[]"), "load",
     lambda r: f"{ann_file(r)}: is a JSON list, not a COCO annotation object (images, "
               "annotations, categories)",
     own("write it as one object with the lists images, annotations and categories")),
    ("empty-annotation-file", lambda r: ann_file(r).write_bytes(b""), "load",
     lambda r: f"{ann_file(r)}: is empty (0 bytes)",
     own("restore it from your copy of the annotations")),
    ("missing-section", edit(lambda doc: doc.pop("annotations")), "load",
     lambda r: f"{ann_file(r)}: missing the 'annotations' list of a COCO annotation file",
     own("add it (an empty list if it has no entries)")),
]


@pytest.mark.parametrize("case", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data(case, tmp_path):
    case_id, damage, when, what, remedy = case
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    damage(root)
    manifest = tmp_path / "data" / "mine.manifest.json"
    write_earlier(manifest, '{"earlier": true}\n')
    before = snapshot(tmp_path)

    # The data stage, as it runs for a dataset it did not make: it validates and decodes every
    # image before it writes.
    with pytest.raises(DatasetError) as err:
        prepare.prepare(user_data(root), str(manifest))
    assert_message(str(err.value), what(root), remedy(root))
    check_readme_row(case_id, str(err.value), root=root, ann=ann_file(root))
    # Training: the dataset opens, or fails, the same way; an image fails when it is read.
    if when == "load":
        with pytest.raises(DatasetError) as err:
            CocoDetection(root, "train", train=True)
    else:
        dataset = CocoDetection(root, "train", train=True)
        with pytest.raises(DatasetError) as err:
            dataset[0]
    assert_message(str(err.value), what(root), remedy(root))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("annotations", [[], [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [1, 1, 10, 10],
                                                 "area": 100.0, "iscrowd": 1}]], ids=["none", "crowd-only"])
def test_a_val_split_with_no_box_to_score_is_refused(annotations, tmp_path):
    """COCOeval answers -1 for all twelve numbers where val has no box to score: refused at the
    data stage, before any training, rather than reported as an accuracy."""
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    val = annotation_path(root, "val")
    val.write_text(json.dumps(dict(json.loads(val.read_text()), annotations=annotations)))
    manifest = tmp_path / "data" / "mine.manifest.json"
    before = snapshot(tmp_path)
    with pytest.raises(DatasetError) as err:
        prepare.prepare(user_data(root), str(manifest))
    assert_message(str(err.value), f"{val}: the val split has no box to score (2 images, {len(annotations)} boxes",
                   "give its annotations the boxes of its images, or point data.root at a dataset whose val "
                   "split is annotated")
    check_readme_row("val-without-boxes", str(err.value), root=root, ann=ann_file(root))
    assert snapshot(tmp_path) == before


# Boxes torchvision's recipe clamps or skips (COCO itself has a few: erroring would make it
# unusable): the dataset loads, without them, and a warning names the file and the count.
BOX_WARNINGS = [
    ("zero-size-box", [5, 5, 0, 8], {"boxes of zero width or height": 1}, 0,
     "skipped 1 boxes of zero width or height (e.g. annotation 1)"),
    ("box-outside-the-image", [70, 60, 5, 5], {"boxes entirely outside their image": 1}, 0,
     "skipped 1 boxes entirely outside their image (e.g. annotation 1)"),
    ("box-partly-outside", [60, 40, 10, 10], {}, 1,
     "clamped 1 boxes that extend past their image to its edges"),
]


@pytest.mark.parametrize("case", BOX_WARNINGS, ids=[c[0] for c in BOX_WARNINGS])
def test_degenerate_boxes_are_skipped_with_a_warning(case, tmp_path, caplog):
    case_id, bbox, skipped, clamped, warning = case
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    set_bbox(bbox)(root)
    before = snapshot(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.dataset"):
        evaluation = CocoDetection(root, "train", train=False)
        manifest = build_manifest(root)
    assert f"{ann_file(root)}: {warning}" in caplog.text
    check_readme_row(case_id, caplog.text, root=root, ann=ann_file(root))
    assert evaluation.skipped == skipped and evaluation.clamped == clamped
    assert manifest["splits"]["train"]["skipped"] == skipped
    boxes = evaluation.target(0)["boxes"].tolist()
    assert boxes == ([[60, 40, 64, 48]] if clamped else [])
    assert snapshot(tmp_path) == before


# --- images a viewer shows turned: EXIF orientation -----------------------------------------
# A camera held sideways or upside down stores its pixels as they came off the sensor and an
# EXIF tag saying how to turn them for display. Boxes drawn in a viewer then fit the turned
# image, not the stored pixels, and nothing in the data says which a tree's boxes fit.

BOX = [8, 6, 20, 12]  # x, y, width, height: the bright rectangle, where a viewer shows it
# The stored pixels of an upright scene for each orientation (a viewer turns them back):
# 3 is shown rotated 180; 6 is shown rotated 90 clockwise, so it is stored turned 90 the other way.
STORED = {3: Image.Transpose.ROTATE_180, 6: Image.Transpose.ROTATE_90}
EXIF_REMEDY = ("set data.exif_orientation: apply if the boxes were drawn on the images as a "
               "viewer shows them, or ignore if they were drawn on the stored pixels")


def exif_dataset(root: Path, orientation: int) -> None:
    """good_dataset, with train image 1 a dark 64x48 scene with a bright rectangle, taken by a
    camera held at `orientation`; its size and box as a viewer shows it."""
    good_dataset(root)
    scene = Image.new("RGB", (64, 48))
    x, y, w, h = BOX
    ImageDraw.Draw(scene).rectangle([x, y, x + w - 1, y + h - 1], fill=(255, 255, 255))
    exif = Image.Exif()
    exif[0x0112] = orientation
    scene.transpose(STORED[orientation]).save(image_file(root), exif=exif, quality=95)
    set_bbox(BOX)(root)


def brightness(image: torch.Tensor, box: list[float]) -> tuple[float, float]:
    """Mean pixel value inside the box (an edge pixel in) and outside it."""
    x0, y0, x1, y1 = (int(v) for v in box)
    pixels = image.float()
    inside = pixels[:, y0 + 1:y1 - 1, x0 + 1:x1 - 1].mean().item()
    box_sum = pixels[:, y0:y1, x0:x1].sum().item()
    outside = (pixels.sum().item() - box_sum) / (pixels.numel() - 3 * (y1 - y0) * (x1 - x0))
    return inside, outside


def test_exif_orientation_is_refused_by_default(tmp_path):
    root = tmp_path / "data" / "mine"
    exif_dataset(root, 3)
    before = snapshot(tmp_path)
    with pytest.raises(DatasetError) as err:  # the data stage
        prepare.prepare(user_data(root), str(tmp_path / "data" / "m.json"))
    what = (f"{root / 'train2017'}: 1 of the train split's 2 images have an EXIF orientation "
            "other than 1, so a viewer shows them turned from their stored pixels (e.g. 1.jpg "
            "(3: rotate 180))")
    assert_message(str(err.value), what, EXIF_REMEDY)
    check_readme_row("exif-orientation-refused", str(err.value), root=root, ann=ann_file(root))
    # A tree changed after the data stage: training's loader refuses the image by name.
    with pytest.raises(DatasetError) as err:
        CocoDetection(root, "train", train=True)[0]
    assert_message(str(err.value), f"{image_file(root)}: has EXIF orientation 3: rotate 180",
                   EXIF_REMEDY)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("orientation", sorted(STORED))
def test_exif_orientation_apply_reads_the_image_as_a_viewer_shows_it(orientation, tmp_path):
    root = tmp_path / "mine"
    exif_dataset(root, orientation)
    manifest = build_manifest(root, exif_orientation="apply")  # sizes checked as shown: 64x48
    assert manifest["exif_orientation"] == "apply"
    assert manifest["splits"]["train"]["exif_oriented_images"] == 1
    for train in (True, False):  # training and evaluation read it alike
        image, target = CocoDetection(root, "train", train=train, exif_orientation="apply")[0]
        assert image.shape == (3, 48, 64)
        inside, outside = brightness(image, target["boxes"][0].tolist())
        assert inside > 200 and outside < 20, (inside, outside)  # the box is on the rectangle
        shown = ImageOps.exif_transpose(Image.open(image_file(root))).convert("RGB")
        assert torch.equal(image, pil_to_tensor(shown))  # as PIL turns it for a viewer


def test_exif_orientation_ignore_reads_the_stored_pixels_with_a_warning(tmp_path, caplog):
    root = tmp_path / "mine"
    exif_dataset(root, 3)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.dataset"):
        manifest = build_manifest(root, exif_orientation="ignore")
    assert (f"{root / 'train2017'}: 1 of the train split's 2 images have an EXIF orientation "
            "other than 1") in caplog.text
    assert "1.jpg (3: rotate 180)" in caplog.text
    assert "ignore reads their stored pixels as they are" in caplog.text
    assert manifest["splits"]["train"]["exif_oriented_images"] == 1
    image, target = CocoDetection(root, "train", train=True, exif_orientation="ignore")[0]
    assert torch.equal(image, pil_to_tensor(Image.open(image_file(root)).convert("RGB")))
    inside, _ = brightness(image, target["boxes"][0].tolist())
    assert inside < 20  # stored pixels: the rectangle is elsewhere, as the user was warned


def test_a_quarter_turn_read_as_stored_names_exif_in_its_size_error(tmp_path):
    """Stored 48x64, annotated (as shown) 64x48: the size error says the tag swaps them."""
    root = tmp_path / "mine"
    exif_dataset(root, 6)
    with pytest.raises(DatasetError) as err:
        build_manifest(root, exif_orientation="ignore")
    assert_message(str(err.value), f"{image_file(root)}: is 48x64 but {ann_file(root)} says "
                   "64x48 (its EXIF orientation 6: rotate 90 CW swaps width and height: "
                   "data.exif_orientation: apply reads it as 64x48)",
                   f"correct width and height of image 1 in {ann_file(root)}")
    check_readme_row("exif-quarter-turn-read-as-stored", str(err.value), root=root,
                     ann=ann_file(root))


# --- images that do not decode, found by the data stage before any training -----------------

def test_truncated_images_in_train_and_val_are_named_by_the_data_stage(tmp_path, monkeypatch,
                                                                       caplog):
    """Every image of both splits is decoded, in a pool of processes (forced here for 4
    images), with progress on the log; every bad file is named, not only the first."""
    monkeypatch.setattr(dataset_module, "DECODE_CHUNK", 1)
    monkeypatch.setattr(dataset_module, "_usable_cores", lambda: 2)
    monkeypatch.setattr(dataset_module, "PROGRESS_EVERY_S", 0.0)
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    bad = {"train": root / "train2017" / "1.jpg", "val": root / "val2017" / "2.jpg"}
    for path in bad.values():
        path.write_bytes(path.read_bytes()[:600])
    manifest = tmp_path / "data" / "mine.manifest.json"
    write_earlier(manifest, '{"earlier": true}\n')
    before = snapshot(tmp_path)
    data_cfg = user_data(root).model_dump()  # the data section, as the workflow passes it
    with caplog.at_level(logging.INFO, logger="pipeline.data.dataset"), \
            pytest.raises(SystemExit) as exit:
        prepare.main(["--config", json.dumps(data_cfg), "--manifest", str(manifest)])
    message = str(exit.value.code)
    assert message.startswith("error: ")
    for split, path in bad.items():
        source = annotation_path(root, split)
        assert f"{source}: 1 of the {split} split's 2 images cannot be used" in message
        assert_message(message, f"{path}: cannot decode image {path.stem}: the file is truncated: "
                       "its JPEG data stops after 600 bytes",
                       f"replace the file with a readable copy, or remove it: its entry in "
                       f"'images' and its annotations in {source}")
    assert f"{root / 'val2017'}: decoded 2/2 images" in caplog.text  # the progress line
    check_readme_row("undecodable-images-in-both-splits", message, root=root, ann=ann_file(root))
    assert snapshot(tmp_path) == before


# The full suite's: the fast tier reads the same decode errors through the data stage and the
# training set (test_bad_data) and evaluates in process (tests/test_annotation_checks.py).
@pytest.mark.slow
def test_the_evaluate_stage_ends_a_bad_image_in_one_line(tmp_path):
    """A validation image cut short after the data stage checked the tree: the evaluate stage
    ends with one line naming the file, as training does, not a traceback."""
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    build_manifest(root)  # the data stage passed it
    bad = root / "val2017" / "2.jpg"
    bad.write_bytes(bad.read_bytes()[:600])
    cfg = stages.view(small_config(root), "evaluate")
    run_dir = tmp_path / "results" / "runs" / "demo" / "single-w1-b4-s0"
    run_dir.mkdir(parents=True)
    (run_dir / "train_summary.json").write_text(json.dumps({"status": "ok",
                                                            "run_id": run_dir.name}))
    model = build_model(cfg.model, num_classes=2)
    torch.save({"model": model.state_dict(), "num_classes": 2}, run_dir / "model_final.pt")
    before = snapshot(tmp_path)
    result = subprocess.run([sys.executable, "-m", "pipeline.detection.evaluate", "--config",
                             canonical(cfg.model_dump()), "--run-dir", str(run_dir)],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert_message(error, f"error: {bad}: cannot decode image 2: the file is truncated",
                   "replace the file with a readable copy, or remove it")
    check_readme_row("image-damaged-after-the-data-stage", error, root=root)
    assert snapshot(tmp_path) == before  # no predictions or metrics written


# --- params.yaml: the real file, edited in memory, resolved as the Snakefile does ------------

def demo(raw: dict) -> dict:
    return raw["presets"]["demo"]


def set_train(**values):
    return lambda raw: demo(raw)["train"].update(values)


def set_sweep(*entries, train_images=None):
    def change(raw):
        demo(raw)["sweep"] = list(entries)
        if train_images is not None:
            demo(raw)["data"]["synthetic"]["train_images"] = train_images
    return change


def unknown_key(raw: dict) -> None:
    demo(raw)["train"]["lr_step"] = [3]


def missing_key(raw: dict) -> None:
    del raw["defaults"]["train"]["momentum"]  # no preset sets it: it comes from defaults (named there)


DEMO = "params.yaml: presets.demo"
PARAMS_CASES = [
    ("wrong-type", set_train(epochs="ten"),
     f"{DEMO}.train.epochs: 'ten' is not of type 'integer'", "write a whole number"),
    ("quoted-number", set_train(epochs="10"),
     f"{DEMO}.train.epochs: '10' is not of type 'integer'", "write a whole number, without quotes"),
    ("wrong-type-nullable", lambda raw: raw["presets"]["coco2017"]["data"]["fetch"].update(subset="all"),
     "params.yaml: presets.coco2017.data.fetch.subset: 'all' is not of type 'integer' or 'null'",
     "write a whole number or null"),  # the generated schema names the type first, then null
    ("unknown-key", unknown_key,
     f"{DEMO}.train: unknown key 'lr_step' (did you mean 'lr_steps'?)", "allowed keys: base_batch, "),
    ("missing-key", missing_key,
     "params.yaml: defaults.train: 'momentum' is a required property", "add it (see the demo preset"),
    ("not-one-of", lambda raw: demo(raw)["model"].update(arch="resnet9000"),
     f"{DEMO}.model.arch: 'resnet9000' is not one of ['tiny', 'fasterrcnn_resnet50_fpn']",
     "use one of those"),
    ("negative-epochs", set_train(epochs=-1),
     f"{DEMO}.train.epochs: -1 is less than the minimum of 1", "set it to 1 or more"),
    ("nested-negative", lambda raw: demo(raw)["data"]["synthetic"].update(train_images=-5),
     f"{DEMO}.data.synthetic.train_images: -5 is less than the minimum of 1", "set it to 1 or more"),
    ("unknown-preset", lambda raw: raw.update(preset="coco2014"),
     "params.yaml: preset: 'coco2014' is not one of the presets (demo, demo-parity, demo-quick, coco2017, coco2017-quick)",
     "use --config preset=NAME with one of them"),
    ("lr-steps-past-the-last-epoch", set_train(epochs=4, lr_steps=[5]),
     f"{DEMO}.train.lr_steps: [5] reach past the last epoch (epochs: 4)",
     "keep every step below 4 (lr_steps: [] for no decay) or raise epochs"),
    ("lr-steps-not-increasing", set_train(lr_steps=[5, 4]),
     f"{DEMO}.train.lr_steps: [5, 4] must be strictly increasing epochs",
     "list each once, in order: [4, 5]"),
    ("empty-sweep", set_sweep(),
     f"{DEMO}.sweep: [] should be non-empty", "list at least one run, e.g. - {strategy: single, workers: 1}"),
    ("zero-workers", set_sweep({"strategy": "ddp", "workers": 0}),
     f"{DEMO}.sweep[0].workers: 0 is less than the minimum of 1", "set it to 1 or more"),
    ("workers-not-a-number", set_sweep({"strategy": "ddp", "workers": "two"}),
     f"{DEMO}.sweep[0].workers: 'two' is not of type 'integer'", "write a whole number"),
    ("unknown-sweep-key", set_sweep({"strategy": "ddp", "worker": 2}),
     f"{DEMO}.sweep[0]: unknown key 'worker' (did you mean 'workers'?)", "allowed for ddp: "),
    ("unknown-strategy", set_sweep({"strategy": "horovod", "workers": 2}),
     f"{DEMO}.sweep[0].strategy: unknown strategy 'horovod'", "choose one of single, dp, ddp, ps"),
    ("too-many-workers-for-single", set_sweep({"strategy": "single", "workers": 2}),
     f"{DEMO}.sweep[0] (single-w2-b8): single runs at most 1 worker(s), not 2",
     "(use ddp, ps or dp for more)"),
    ("more-workers-than-images", set_sweep({"strategy": "ddp", "workers": 8}, train_images=4),
     f"{DEMO}.sweep[0].workers (ddp-w8-b8): 8 workers but data.synthetic.train_images is 4",
     "use at most 4 workers or raise data.synthetic.train_images"),
    ("batch-larger-than-the-dataset",
     set_sweep({"strategy": "ddp", "workers": 2, "images_per_worker": 16}, train_images=16),
     f"{DEMO}.sweep[0].images_per_worker (ddp-w2-b16): 16 x 2 workers = 32 images per step, more "
     "than data.synthetic.train_images (16)",
     "lower images_per_worker to at most 8 or raise data.synthetic.train_images"),
    ("duplicate-sweep-entries", set_sweep({"strategy": "ddp", "workers": 2}, {"strategy": "ddp", "workers": 2}),
     f"{DEMO}.sweep: duplicate entries ['ddp-w2-b8']", "each combination once"),
    # the command line's `--config set=...` (the Snakefile passes it as `set`): named as its own
    ("override-wrong-type", lambda raw: raw.update(set="train.epochs=four"),
     "--config set: train.epochs: 'four' is not of type 'integer'", "write a whole number"),
    ("override-unknown-key", lambda raw: raw.update(set="train.epoch=4"),
     "--config set: train.epoch: train has no key 'epoch' (did you mean 'epochs'?)", "its keys: base_batch"),
]


@pytest.mark.parametrize("case", PARAMS_CASES, ids=[c[0] for c in PARAMS_CASES])
def test_bad_params(case, tmp_path, monkeypatch):
    case_id, change, what, remedy = case
    monkeypatch.chdir(tmp_path)  # where the workflow would write
    write_earlier(tmp_path / "results" / "runs" / "demo" / "single-w1-b8-s0" / "train_summary.json",
                  '{"status": "ok"}\n')
    before = snapshot(tmp_path)
    raw = params.load(REPO / "params.yaml")
    change(raw)
    with pytest.raises(params.ParamsError) as err:
        sweep.runs(params.resolve(raw))  # as the Snakefile does, before any job
    assert_message(str(err.value), what, remedy)
    check_readme_row(case_id, str(err.value))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("case, text, what", [
    ("key-given-twice", "\npresets:\n  mine: {extends: demo}\n",
     "the key 'presets' is given a second time in this mapping (first at line"),
    ("yaml-syntax-error", "\nreport: {dpi: 50\n", "not valid YAML:"),
])
def test_a_malformed_params_file_is_named_by_line(case, text, what, tmp_path, monkeypatch):
    """params.yaml read strictly (the Snakefile reads it so before Snakemake does): a key given
    twice, or a YAML error, named with the file, line and column; the file left as it was."""
    monkeypatch.chdir(tmp_path)
    Path("params.yaml").write_text((REPO / "params.yaml").read_text() + text)
    before = snapshot(tmp_path)
    with pytest.raises(params.ParamsError) as err:
        params.load("params.yaml")
    assert re.match(r"params\.yaml:\d+:\d+: ", str(err.value)) and what in str(err.value), str(err.value)
    check_readme_row(case, str(err.value))
    assert snapshot(tmp_path) == before


def test_the_real_params_pass_every_check():
    """The catalogue's rules refuse none of the shipped presets."""
    raw = params.load(REPO / "params.yaml")
    for preset in raw["presets"]:
        assert sweep.runs(params.resolve(dict(raw, preset=preset)))


# --- a run's own files: its checkpoint, its directory, the disk -----------------------------
# Each case is the training CLI (what the workflow's train job runs) on a run directory that
# holds a checkpoint taken mid-epoch; the checkpoint must come out of it as it went in.

@pytest.fixture(scope="module")
def checkpointed(small_dataset, tmp_path_factory):
    """A run stopped after its step-2 checkpoint: (what the train stage reads, run, its directory)."""
    cfg = small_config(small_dataset, epochs=1, checkpoint_every=2)
    run = next(iter(sweep.runs(cfg).values()))
    out = tmp_path_factory.mktemp("checkpointed") / "results" / "runs" / "demo" / sweep.run_id(run)
    train_cfg = stages.view(cfg, "train")
    train(train_cfg, run, out, max_steps=3)
    assert (out / "state" / "checkpoint.pt").exists()
    return train_cfg, run, out


def in_mount_namespace(setup: str, command: list[str]) -> list[str]:
    """`command` after `setup` (mounts), in a mount namespace of its own: root, or an
    unprivileged user as root of a user namespace, may mount there and nothing leaks out."""
    return ["unshare", "--mount", "--map-root-user", "sh", "-c",
            f"{setup} && exec \"$@\"", "sh", *command]


def can_mount() -> bool:
    probe = subprocess.run(in_mount_namespace("mount -t tmpfs -o size=1m tmpfs /mnt", ["true"]),
                           capture_output=True)
    return probe.returncode == 0


def copied_run(checkpointed, tmp_path: Path, run_dir: str) -> Path:
    out = tmp_path / run_dir
    shutil.copytree(checkpointed[2], out)
    return out


def foreign_checkpoint(checkpointed, tmp_path):
    """The checkpoint of the same run of another preset, copied into this one's directory."""
    out = copied_run(checkpointed, tmp_path, "results/runs/coco2017/single-w1-b4-s0")
    return out, [], (f"{out}/state/checkpoint.pt: was written for run 'demo/single-w1-b4-s0', "
                     "not for 'coco2017/single-w1-b4-s0'"), f"delete {out}/state to train this run"


def corrupt_checkpoint(checkpointed, tmp_path):
    out = copied_run(checkpointed, tmp_path, "results/runs/demo/single-w1-b4-s0")
    (out / "state" / "checkpoint.pt").write_bytes(b"PK\x03\x04 half a zip file")
    return out, [], f"{out}/state/checkpoint.pt: cannot be read as a checkpoint", \
        f"Delete {out}/state to train the run from its start"


def results_not_writable(checkpointed, tmp_path):
    out = copied_run(checkpointed, tmp_path, "results/runs/demo/single-w1-b4-s0")
    setup = f"mount --bind {out} {out} && mount -o remount,ro,bind {out}"
    return out, [setup], f"{out}/state/", "read-only file system: run from a writable copy"


def disk_full(checkpointed, tmp_path):
    """The state directory on a file system with room for one checkpoint but not two: the
    next save fails; the one before must survive."""
    out = copied_run(checkpointed, tmp_path, "results/runs/demo/single-w1-b4-s0")
    state, size = out / "state", (out / "state" / "checkpoint.pt").stat().st_size
    kept = tmp_path / "kept"
    shutil.copytree(state, kept)
    setup = (f"mount -t tmpfs -o size={size * 3 // 2 // 1024}k tmpfs {state} "
             f"&& cp -a {kept}/. {state}/")
    return out, [setup], f"{state}/checkpoint.pt: cannot write it (No space left on device)", \
        "free space on the file system that holds"


RUN_CASES = {"checkpoint-from-another-preset": foreign_checkpoint,
             "corrupt-checkpoint": corrupt_checkpoint,
             "results-directory-not-writable": results_not_writable,
             "disk-full-writing-a-checkpoint": disk_full}
FAST_RUN_CASES = ("results-directory-not-writable",)  # the rest: full suite


@pytest.mark.parametrize("case", [case if case in FAST_RUN_CASES else pytest.param(case, marks=pytest.mark.slow)
                                  for case in RUN_CASES])
def test_bad_run_state(case, checkpointed, tmp_path):
    cfg, run, _ = checkpointed
    out, setup, what, remedy = RUN_CASES[case](checkpointed, tmp_path)
    if setup and not can_mount():
        pytest.skip("needs a mount namespace (unshare --mount --map-root-user) for a read-only "
                    "or full file system; this machine refuses one")
    before = snapshot(out)
    command = [sys.executable, "-m", "pipeline.training.train", "--config", canonical(cfg.model_dump()),
               "--entry", canonical(run.to_json()), "--out", str(out)]
    if setup:
        # Inside the namespace, after the run: the checkpoint still there, byte for byte.
        check = f"cmp {out}/state/checkpoint.pt {checkpointed[2]}/state/checkpoint.pt && ls -a {out}/state"
        command = in_mount_namespace(setup[0], ["sh", "-c", '"$@"; rc=$?; ' + check + '; exit $rc',
                                                "sh", *command])
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: "), result.stderr[-3000:]
    assert_message(error.removeprefix("error: "), what, remedy)
    check_readme_row(case, error, run=out)
    if setup:  # what the namespace saw: the checkpoint intact, no temporary left beside it
        assert ".tmp" not in result.stdout and "checkpoint.pt" in result.stdout, result.stdout
    if case != "disk-full-writing-a-checkpoint":
        assert snapshot(out) == before


# --- a run another process holds ------------------------------------------------------------

HOLD_LOCK = """
import sys, time
from pipeline.runtime import run_lock
run_lock.hold(sys.argv[1], "train")
print("held", flush=True)
time.sleep(600)
"""


def test_a_second_process_on_a_run_is_refused(tmp_path):
    """A run another process trains (two workflows started at once on one results/): the second
    is refused by the run directory's lock, naming the first, and changes nothing there
    (pipeline/runtime/run_lock.py; the launcher's one-line error: tests/test_run_lock.py)."""
    out = tmp_path / "results" / "runs" / "demo" / "single-w1-b4-s0"
    first = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(out)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "held"
        before = snapshot(tmp_path)
        with pytest.raises(run_lock.RunBusyError) as err:
            run_lock.hold(out, "train")
        assert_message(str(err.value), f"another process (pid {first.pid}) is training this run "
                       f"({out})", f"wait for it to end, or stop it (kill {first.pid}), then rerun")
        check_readme_row("run-busy", str(err.value), run=out, pid=first.pid)
        assert snapshot(tmp_path) == before
    finally:
        first.kill()
        first.wait()
        first.stdout.close()


# --- README's table of these messages -------------------------------------------------------
# README.md's section TABLE_SECTION has a table: | Bad input | Message (its key part) | Case |.
# The Case cell names one case (or several) of this file by id, the Message cell shows as many
# messages as code spans, in the same order. A case's test checks its span against the message
# it really produced, right where it produced it (check_readme_row): with each placeholder
# <name> replaced by that case's value for it (PLACEHOLDERS) and every run of whitespace read
# as one space, the span must occur in the message, where `...` (and the spaces around it)
# stands for any text. So no row can go stale without its case failing, independent of test
# order or selection, and no case is run twice; the one test below (no case runs: milliseconds)
# checks that each case has a row and each row a case. `pytest tests/test_bad_inputs.py` checks
# the whole table.

README = REPO / "README.md"
TABLE_SECTION = "## Bad input, and the message each gets"
PLACEHOLDERS = {  # what a case passes for each, as README's section says
    "root": "the dataset's folder (data/coco2017)",
    "ann": "its train annotations, <root>/annotations/instances_train2017.json",
    "run": "the run's folder (results/runs/demo/single-w1-b4-s0)",
    "pid": "the process that holds the run",
}
# The cases above with a test of their own (not an entry of a list of cases), and those of
# tests/test_annotation_checks.py (the two splits' categories), test_overrides.py (an overlay)
# and test_files.py (an edited generated tree), which check their rows here too.
ONE_OFF_CASES = ("exif-orientation-refused", "exif-quarter-turn-read-as-stored",
                 "undecodable-images-in-both-splits", "image-damaged-after-the-data-stage",
                 "run-busy", "val-category-absent-from-train", "category-named-differently",
                 "key-given-twice", "yaml-syntax-error", "val-without-boxes",
                 "configfile-redefines-a-preset", "edited-generated-tree")
# Cases with no row of their own: their message has the form of the case named, its row's.
SHOWN_BY = {"infinite-box": "nan-box", "wrong-type-nullable": "wrong-type",
            "workers-not-a-number": "wrong-type", "nested-negative": "negative-epochs"}


def all_cases() -> list[str]:
    return ([case[0] for case in DATA_CASES + BOX_WARNINGS + PARAMS_CASES] + list(RUN_CASES)
            + list(ONE_OFF_CASES))


def readme_table() -> dict[str, tuple[str, str]]:
    """Case id -> (its row's Bad input cell, the message shown for it), from README.md."""
    text = README.read_text()
    assert text.count(TABLE_SECTION + "\n") == 1, f"README.md has no section {TABLE_SECTION!r}"
    section = text.split(TABLE_SECTION + "\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    assert len(lines) > 2 and set(lines[1]) <= set("|-: "), f"{TABLE_SECTION}: no table"
    shown: dict[str, tuple[str, str]] = {}
    for line in lines[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        assert len(cells) == 3, (f"README.md, {TABLE_SECTION}: a row of {len(cells)} cells, not "
                                 f"3 (bad input, message, case):\n  {line}")
        label, messages, cases = cells[0], *(re.findall(r"`([^`]*)`", cell) for cell in cells[1:])
        assert cases and len(messages) == len(cases), (
            f"README.md, {TABLE_SECTION}: row {label!r} shows {len(messages)} message(s) (code "
            f"spans) for {len(cases)} case(s) {cases}: one per case, in the same order")
        for case, message in zip(cases, messages):
            assert case not in shown, f"README.md, {TABLE_SECTION}: case {case!r} has two rows"
            shown[case] = (label, message)
    return shown


def with_placeholders(message: str, values: dict) -> str:
    """The message with each value written as its placeholder (for a row to copy)."""
    for name, value in sorted(values.items(), key=lambda item: -len(str(item[1]))):
        message = message.replace(str(value), f"<{name}>")
    return message


def shows(span: str, message: str, values: dict) -> bool:
    """`span` (a Message cell's code span) occurs in `message`, as check_readme_row says."""
    def put(match: re.Match) -> str:
        name = match.group(1)
        assert name in values, (f"{span!r}: <{name}> does not apply to this case (its "
                                f"placeholders: {', '.join(f'<{n}>' for n in values) or 'none'})")
        return str(values[name])

    pieces = [" ".join(re.sub(r"<([a-z]+)>", put, piece).split()) for piece in span.split("...")]
    pattern = ".*?".join(re.escape(piece) for piece in pieces)
    return re.search(pattern, " ".join(message.split())) is not None


def check_readme_row(case: str, message: str, **values) -> None:
    """README's table shows the message `case` really produced, given its placeholders' values
    (root=, ann=, run=, pid=: PLACEHOLDERS)."""
    assert set(values) <= set(PLACEHOLDERS), set(values) - set(PLACEHOLDERS)
    table = readme_table()
    shown_as = SHOWN_BY.get(case, case)
    if shown_as != case:  # shown by another case's row: not checked against this message
        assert shown_as in table, f"README.md's table has no row for case {shown_as!r}"
        return
    assert case in table, (f"README.md's table ({TABLE_SECTION}) has no row for case {case!r}; "
                           f"its message:\n  {with_placeholders(message, values)}")
    label, span = table[case]
    assert shows(span, message, values), (
        f"README.md's row {label!r} shows, for case {case!r},\n  {span}\nwhich is not in the "
        f"message it really produces:\n  {with_placeholders(message, values)}")


def test_readme_table_has_a_row_for_each_case():
    """Each case of this file has its row in README's table (or is SHOWN_BY another's), and
    each row names cases of this file; every placeholder in the table is one of PLACEHOLDERS.
    Whether each row shows its case's real message, the case's own test checks."""
    cases = all_cases()
    assert len(set(cases)) == len(cases), sorted({c for c in cases if cases.count(c) > 1})
    assert set(SHOWN_BY) <= set(cases) and set(SHOWN_BY.values()) <= set(cases) - set(SHOWN_BY)
    table = readme_table()
    without_row = [c for c in cases if c not in table and c not in SHOWN_BY]
    unknown = [c for c in table if c not in cases]
    also_shown_by = [c for c in table if c in SHOWN_BY]
    assert not (without_row or unknown or also_shown_by), (
        f"cases with no row in README.md's table: {without_row}; cases the table names that "
        f"this file does not have: {unknown}; cases with a row though SHOWN_BY another's row: "
        f"{also_shown_by}")
    for case, (label, span) in table.items():
        unknown_names = set(re.findall(r"<([a-z]+)>", span)) - set(PLACEHOLDERS)
        assert not unknown_names, f"row {label!r} ({case}): placeholders {unknown_names} unknown"
