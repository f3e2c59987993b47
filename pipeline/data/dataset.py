"""The one loader for COCO 2017-layout detection data: the embedded synthetic set and real COCO.

Follows torchvision's references/detection recipe for what it skips, and logs each skip:
  * crowd annotations (iscrowd=1) are not training targets (they stay in the evaluation ground
    truth, where COCOeval ignores matches to them);
  * boxes are clamped to the image; a box with no area left (zero width or height, or entirely
    outside the image) is dropped (COCO itself has a few, so these cannot be errors);
  * training drops images left without a box; evaluation keeps every image.
Anything else wrong is an error naming the file and what to do: a missing, empty, truncated or
mislabelled (PNG named .jpg) image, one in a mode with no rule (images.py), malformed or
non-COCO JSON, duplicate ids, dangling references, a category id below 1 (torchvision's label 0
is the background), a box no recipe can mean (negative size, NaN or infinite), an empty split
(annotations.py checks the files). Each remedy fits a user's own tree first, then one the data
stage fetched or generated.

Images are read by `ImageReader` (images.py: each mode's rule, EXIF orientation), for training,
evaluation and the data stage alike.

`build_manifest` is the data stage's check (pipeline/data/prepare.py writes the manifest): both
splits load, agree on their categories, and every image decodes, in a pool of processes, before
any training starts; the manifest counts the images' modes and the keys filled in for COCOeval.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from .annotations import (
    CategoryUse,
    box_area,
    check_split_categories,
    clean_box,
    filled_line,
    load_annotations,
    missing_optional,
)
from .errors import DatasetError, remedy
from .images import EXIF_REMEDY, ExifOrientationError, ImageReader, mode_rule, orientation_name
from .tree import SPLIT_DIRS, annotation_path, file_sha256

__all__ = [
    "SPLIT_DIRS",
    "CocoDetection",
    "DatasetError",
    "InMemory",
    "MIRROR",
    "annotation_path",
    "build_manifest",
    "clean_box",
    "collate",
    "to_model_input",
]
log = logging.getLogger(__name__)
MIRROR = v2.RandomHorizontalFlip(p=1.0)  # the image and its boxes, together
SHOWN = 10  # unusable images named one per line in the data stage's error; the rest counted
DECODE_CHUNK = 64  # images per task of the data stage's pool: few round trips, even shares
PROGRESS_EVERY_S = 10.0  # the data stage's progress line while it decodes


class CocoDetection(torch.utils.data.Dataset):
    """(uint8 image tensor (C, H, W), target dict) pairs in torchvision's detection format; the
    model takes each image through `to_model_input` (float32 in [0, 1], made on its device).

    Labels are COCO category ids as they stand (torchvision's recipe): the model has
    max(category id) + 1 classes, 0 being background. Images are read by `ImageReader`, with
    their EXIF orientation as `exif_orientation` says.
    """

    def __init__(
        self, root: str | Path, split: str, train: bool, horizontal_flip: float = 0.0, exif_orientation: str = "refuse"
    ):
        self.root, self.split, self.train = Path(root), split, train
        self.reader = ImageReader(self.root, split, exif_orientation)
        self.image_dir, self.source = self.reader.image_dir, self.reader.source
        document = load_annotations(root, split)
        self.categories = {c["id"]: c["name"] for c in document["categories"]}
        self.category_use = CategoryUse.of(self.source, document)  # the splits' agreement
        self.missing_keys = missing_optional(document)  # filled in for COCOeval
        self._check_category_ids(document)
        self.num_classes = max(self.categories, default=0) + 1
        self.skipped: Counter[str] = Counter()
        self.clamped = 0
        self._examples: dict[str, str] = {}  # reason -> the first thing skipped for it
        by_image = self._annotations_by_image(document)
        self.images = []
        for img in sorted(document["images"], key=lambda i: i["id"]):
            targets = self._targets(img, by_image[img["id"]])
            if train and not targets:
                self._skip("images without usable boxes (training)", img["file_name"])
                continue
            self.images.append((img, targets))
        self._check_images()
        self._log_skips()
        # uint8 as decoded: a quarter of float32's bytes through the worker queues, the pinning
        # and the host-to-device copy (R50-FPN on an H100 waited for data 23 % of each iteration).
        self.transforms = v2.ToImage()
        self.horizontal_flip = horizontal_flip if train else 0.0
        self.augmentation_seed = 0  # set per epoch by the training loop (`set_epoch`)

    def _check_category_ids(self, document: dict) -> None:
        """Labels are the category ids, and torchvision's detector reserves label 0 for the
        background: a category 0 (some exporters number from 0) would be learnt as background
        and never predicted (AP 0, silently); a negative one is no label at all."""
        used = Counter(ann["category_id"] for ann in document["annotations"])
        bad = {i for i in [*self.categories, *used] if not (isinstance(i, int) and not isinstance(i, bool) and i >= 1)}
        if not bad:
            return
        named = ", ".join(
            f"{i} ({self.categories[i]!r})" if i in self.categories else f"{i} (not in 'categories')"
            for i in sorted(bad, key=lambda i: (type(i).__name__, i))
        )
        raise DatasetError(
            f"{self.source}: category id(s) {named}, used by {sum(used[i] for i in bad)} "
            "annotation(s), are not whole numbers from 1: torchvision's detector reserves label "
            "0 for the background (a category 0 would be learnt as background and never "
            "predicted) and has no negative labels; renumber the categories from 1 in "
            "'categories' and in every annotation's category_id (e.g. add 1 to each id if they "
            "start at 0), the same way in the train and val annotation files"
        )

    def _annotations_by_image(self, document: dict) -> dict[int, list[dict]]:
        by_image: dict[int, list[dict]] = {img["id"]: [] for img in document["images"]}
        for ann in document["annotations"]:
            if ann["image_id"] not in by_image:
                raise DatasetError(
                    f"{self.source}: annotation {ann['id']} refers to image "
                    f"{ann['image_id']}, which is not in 'images'; add the image "
                    "or remove the annotation"
                )
            if ann["category_id"] not in self.categories:
                raise DatasetError(
                    f"{self.source}: annotation {ann['id']} has category_id "
                    f"{ann['category_id']}, which is not in 'categories'; add the "
                    "category or fix the annotation's category_id"
                )
            by_image[ann["image_id"]].append(ann)
        return by_image

    def _check_images(self) -> None:
        """Every kept image is on disk (its bytes are checked when it is decoded), and some are."""
        missing = [img["file_name"] for img, _ in self.images if not (self.image_dir / img["file_name"]).is_file()]
        if missing:
            own = (
                f"add the files to {self.image_dir}, or remove their entries in 'images' (and "
                f"their annotations) from {self.source}"
            )
            raise DatasetError(
                f"{self.image_dir}: {len(missing)} image(s) listed in {self.source} "
                f"are missing, e.g. {missing[:3]}; {remedy(own, self.root)}"
            )
        if not self.images:
            why = " (every image lacks a valid non-crowd box)" if self.train else ""
            own = f"add images{' with boxes' if self.train else ''} to it and to {self.image_dir}"
            raise DatasetError(
                f"{self.source}: no usable images in the {self.split} split{why}; {remedy(own, self.root)}"
            )

    def _skip(self, reason: str, example: str) -> None:
        self.skipped[reason] += 1
        self._examples.setdefault(reason, example)

    def _log_skips(self) -> None:
        """One warning per kind of skip, with a count and an example; each box at INFO."""
        for reason, count in sorted(self.skipped.items()):
            log.warning("%s: skipped %d %s (e.g. %s)", self.source, count, reason, self._examples[reason])
        if self.clamped:
            log.warning("%s: clamped %d boxes that extend past their image to its edges", self.source, self.clamped)

    def _targets(self, img: dict, annotations: list[dict]) -> list[tuple]:
        kept = []
        for ann in annotations:
            if self.train and ann.get("iscrowd", 0):
                self._skip("crowd annotations (training)", f"annotation {ann['id']}")
                continue
            box = self._box(img, ann)
            if box is not None:
                kept.append((box, ann["category_id"], box_area(ann), ann.get("iscrowd", 0)))
        return kept

    def _box(self, img: dict, ann: dict) -> list[float] | None:
        """The annotation's box clamped to its image; None (skipped, counted) if none is left."""
        try:
            box = clean_box(ann["bbox"], img["width"], img["height"])
        except ValueError as err:
            raise DatasetError(
                f"{self.source}: annotation {ann['id']} of image {img['id']} "
                f"({img['file_name']}): bbox {ann['bbox']} {err}; fix or remove "
                "the annotation"
            ) from None
        x, y, w, h = (float(v) for v in ann["bbox"])
        if box is None:
            reason = "boxes of zero width or height" if w == 0 or h == 0 else "boxes entirely outside their image"
            self._skip(reason, f"annotation {ann['id']}")
            log.info(
                "%s: annotation %s of image %s: %s %s; skipped",
                self.source,
                ann["id"],
                img["file_name"],
                reason,
                ann["bbox"],
            )
        elif box != [x, y, x + w, y + h]:
            self.clamped += 1
            log.info(
                "%s: annotation %s of image %s: box %s clamped to %s",
                self.source,
                ann["id"],
                img["file_name"],
                ann["bbox"],
                box,
            )
        return box

    def __len__(self) -> int:
        return len(self.images)

    def aspect_ratios(self) -> list[float]:
        """Width / height per image, from the annotations (no decoding), for batch grouping."""
        return [img["width"] / img["height"] for img, _ in self.images]

    def image_ids(self) -> list[int]:
        return [img["id"] for img, _ in self.images]

    def load_image(self, index: int) -> Image.Image:
        return self.reader.read(self.images[index][0]).image

    def target(self, index: int) -> dict:
        """The annotations of image `index` in torchvision's detection format (no decoding)."""
        img, targets = self.images[index]
        boxes = torch.tensor([t[0] for t in targets], dtype=torch.float32).reshape(-1, 4)
        return {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(img["height"], img["width"])),
            "labels": torch.tensor([t[1] for t in targets], dtype=torch.int64),
            "image_id": img["id"],
            "area": torch.tensor([t[2] for t in targets], dtype=torch.float32),
            "iscrowd": torch.tensor([t[3] for t in targets], dtype=torch.int64),
        }

    def set_epoch(self, seed: int, epoch: int) -> None:
        self.augmentation_seed = seed * 1_000_003 + epoch

    def flips(self, index: int) -> bool:
        """Whether image `index` is mirrored this epoch: drawn from (seed, epoch, index) alone,
        not from a generator shared with other samples, so it does not depend on which loader
        process reads the image or after what (a run resumed mid-epoch flips the same images)."""
        if not self.horizontal_flip:
            return False
        generator = torch.Generator().manual_seed(self.augmentation_seed * 1_000_003 + index)
        return torch.rand(1, generator=generator).item() < self.horizontal_flip

    def __getitem__(self, index: int):
        image, target = self.transforms(self.load_image(index), self.target(index))
        if self.flips(index):
            image, target = MIRROR(image, target)
        target["boxes"] = target["boxes"].as_subclass(torch.Tensor)
        return image, target


class InMemory(torch.utils.data.Dataset):
    """`data_mode: synthetic`: the loader taken out of the measurement. A pool of `pool` samples
    with the shapes and targets of the dataset's first images, their pixels random, made once
    when the process starts; index i serves sample i mod pool. No decoding, no augmentation:
    the difference in images/s from the real loader is what loading costs."""

    def __init__(self, source: CocoDetection, pool: int, seed: int):
        self.source = source
        generator = torch.Generator().manual_seed(seed)
        self.samples = []
        for index in range(min(pool, len(source))):
            img, _ = source.images[index]
            target = source.target(index)
            target["boxes"] = target["boxes"].as_subclass(torch.Tensor)
            # uint8, as the real loader hands them: the same copy and on-device scaling run
            pixels = torch.randint(0, 256, (3, img["height"], img["width"]), dtype=torch.uint8, generator=generator)
            self.samples.append((pixels, target))

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        return self.samples[index % len(self.samples)]

    @property
    def num_classes(self) -> int:
        return self.source.num_classes

    def aspect_ratios(self) -> list[float]:
        return self.source.aspect_ratios()


def to_model_input(image: torch.Tensor, device) -> torch.Tensor:
    """An image as the model takes it: on `device`, float32 in [0, 1]. A loader's uint8 image is
    copied as such (non_blocking: from pinned memory the copy overlaps the host's work) and
    scaled there by v2.ToDtype's own kernel, so the values are those the loader's float32 path
    gave, bit for bit; a float32 image passes through unchanged."""
    image = image.to(device, non_blocking=True)
    return v2.functional.to_dtype(image, torch.float32, scale=True)


def collate(batch):
    """Detection batches stay lists: images differ in size and in their number of boxes."""
    return tuple(zip(*batch, strict=False))


def build_manifest(
    root: str | Path, splits=tuple(SPLIT_DIRS), exif_orientation: str = "refuse", category_mismatch: str = "refuse"
) -> dict:
    """The data stage's check and summary of the splits: each loads, the two agree on their
    categories, and every image of each decodes as training and evaluation will read it, so
    that a bad image is found here rather than hours into training. What is wrong, in every
    split, is one DatasetError that names each file (up to SHOWN per split) and what to do."""
    datasets = [CocoDetection(root, split, train=False, exif_orientation=exif_orientation) for split in splits]
    by_split = {dataset.split: dataset for dataset in datasets}
    mismatches = (
        check_split_categories(by_split["train"].category_use, by_split["val"].category_use, category_mismatch)
        if {"train", "val"} <= set(by_split)
        else []
    )
    manifest: dict[str, Any] = {
        "root": str(root),
        "exif_orientation": exif_orientation,
        "category_mismatch": category_mismatch,
        "category_mismatches": mismatches,
        "splits": {},
    }
    problems = []
    for dataset in datasets:
        unusable, oriented, modes = inspect_images(dataset)
        problems += _unusable_problem(dataset, unusable) + _orientation_problem(dataset, oriented)
        _log_modes(dataset, modes)
        if dataset.missing_keys:
            log.info(filled_line(dataset.source, dataset.missing_keys))
        manifest["splits"][dataset.split] = {
            "annotation_file": str(dataset.source),
            "sha256": file_sha256(dataset.source),
            "images": len(dataset),
            "boxes": sum(len(t) for _, t in dataset.images),
            "num_classes": dataset.num_classes,
            "skipped": dict(dataset.skipped),
            # how many images a viewer shows turned from their stored pixels, and what was done
            "exif_oriented_images": len(oriented),
            # the PIL modes the images are stored in (images.py: how each is read), with counts
            "image_modes": dict(sorted(modes.items())),
            # annotations lacking a key COCOeval reads, filled in for it (annotations.py)
            "filled_for_evaluation": dataset.missing_keys,
        }
    if problems:
        raise DatasetError("\n".join(problems))
    refuse_nothing_to_score(by_split.get("val"))
    return manifest


def refuse_nothing_to_score(val: CocoDetection | None) -> None:
    """A validation split without one box to score (no annotations, or only crowd boxes, or
    only boxes skipped as empty) makes COCOeval answer -1 for all twelve numbers: no accuracy,
    not a bad one. Refused here, before any training."""
    if val is None or any(not crowd for _, targets in val.images for *_, crowd in targets):
        return
    raise DatasetError(
        f"{val.source}: the val split has no box to score ({len(val)} images, "
        f"{sum(len(t) for _, t in val.images)} boxes, none of them a non-crowd box with an area), so "
        "COCO mAP would be -1 for every number; give its annotations the boxes of its images, or point "
        "data.root at a dataset whose val split is annotated"
    )


def _log_modes(dataset: CocoDetection, modes: Counter) -> None:
    """One line per split: the stored modes seen, with counts and how each is read."""
    log.info(
        "%s: image modes: %s",
        dataset.image_dir,
        ", ".join(f"{mode} {count} ({mode_rule(mode) or 'refused'})" for mode, count in sorted(modes.items())),
    )


def inspect_images(dataset: CocoDetection) -> tuple[list[str], list[tuple[str, int]], Counter]:
    """Decode every image of `dataset` as its reader reads them: (what is wrong with each
    unusable one, (file name, EXIF orientation) of each whose orientation is not 1, how many
    images are stored in each mode)."""
    infos = [info for info, _ in dataset.images]
    results = _inspect_all([(dataset.reader, info) for info in infos], str(dataset.image_dir))
    unusable = [problem for problem, _, _ in results if problem is not None]
    oriented = [
        (info["file_name"], orientation)
        for info, (_, orientation, _) in zip(infos, results, strict=False)
        if orientation != 1
    ]
    modes = Counter(mode for _, _, mode in results if mode is not None)
    return unusable, oriented, modes


def _inspect(task: tuple[ImageReader, dict]) -> tuple[str | None, int, str | None]:
    """One image as the data stage checks it: (what is wrong with it, or None; its EXIF
    orientation; its stored mode, where its header could be read)."""
    reader, info = task
    try:
        read = reader.read(info)
        return None, read.orientation, read.mode
    except ExifOrientationError as err:  # counted and reported for the split as a whole
        return None, err.orientation, err.mode
    except DatasetError as err:
        return str(err), 1, getattr(err, "mode", None)


def _usable_cores() -> int:
    """The cores this process may run on (a SLURM job's share, not the whole node's)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _inspect_all(tasks: list, what: str) -> list[tuple[str | None, int, str | None]]:
    """`_inspect` of each task, in order, in a pool of processes (PIL decodes a COCO image in
    a few ms: its 123k images take minutes on one core), logging progress about every
    PROGRESS_EVERY_S."""
    workers = min(_usable_cores(), math.ceil(len(tasks) / DECODE_CHUNK))
    progress = _Progress(what, len(tasks))
    if workers <= 1:  # a small dataset: no processes to start
        return [progress.advance(_inspect(task)) for task in tasks]
    with multiprocessing.Pool(workers) as pool:
        return [progress.advance(result) for result in pool.imap(_inspect, tasks, chunksize=DECODE_CHUNK)]


class _Progress:
    """The data stage's progress line on its log (stderr): done/total, images/s, time left."""

    def __init__(self, what: str, total: int):
        self.what, self.total, self.done = what, total, 0
        self.start = self.shown = time.monotonic()

    def advance(self, result):
        self.done += 1
        now = time.monotonic()
        if now - self.shown >= PROGRESS_EVERY_S or self.done == self.total:
            self.shown = now
            rate = self.done / max(now - self.start, 1e-9)
            left = (self.total - self.done) / rate
            log.info(
                "%s: decoded %d/%d images, %.0f images/s, %s",
                self.what,
                self.done,
                self.total,
                rate,
                f"about {_duration(left)} left" if left else f"in {_duration(now - self.start)}",
            )
        return result


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _unusable_problem(dataset: CocoDetection, unusable: list[str]) -> list[str]:
    if not unusable:
        return []
    lines = [
        f"{dataset.source}: {len(unusable)} of the {dataset.split} split's {len(dataset)} "
        "images cannot be used; each, and what to do:"
    ]
    lines += [f"  {problem}" for problem in unusable[:SHOWN]]
    if len(unusable) > SHOWN:
        lines.append(f"  ... and {len(unusable) - SHOWN} more (the first {SHOWN} shown)")
    return ["\n".join(lines)]


def _orientation_problem(dataset: CocoDetection, oriented: list[tuple[str, int]]) -> list[str]:
    """Images a viewer shows turned from their stored pixels: refused, or how each was read."""
    if not oriented:
        return []
    mode = dataset.reader.exif_orientation
    what = (
        f"{dataset.image_dir}: {len(oriented)} of the {dataset.split} split's "
        f"{len(dataset)} images have an EXIF orientation other than 1, so a viewer shows "
        "them turned from their stored pixels (e.g. "
        + ", ".join(f"{name} ({orientation_name(o)})" for name, o in oriented[:5])
        + ")"
    )
    if mode == "refuse":
        return [f"{what}, and which of the two their boxes were drawn on cannot be told; {EXIF_REMEDY}"]
    if mode == "apply":
        log.info("%s; data.exif_orientation: apply reads them as a viewer shows them", what)
    else:
        log.warning(
            "%s; data.exif_orientation: ignore reads their stored pixels as they are, "
            "so their boxes must have been drawn on those",
            what,
        )
    return []
