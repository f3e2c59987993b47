"""The one loader for COCO 2017-layout detection data: the embedded synthetic set and real COCO.

Follows torchvision's references/detection recipe for what it skips, and logs each skip:
  * crowd annotations (iscrowd=1) are not training targets (they stay in the evaluation ground
    truth, where COCOeval ignores matches to them);
  * boxes are clamped to the image; a box with no area left (zero or negative width or height,
    or entirely outside the image) is dropped;
  * training drops images left without a box; evaluation keeps every image.
Anything else wrong (a missing or unreadable file, malformed JSON, an empty split) is an error
naming the file and what to do.

`build_manifest` validates both splits; the data stage (pipeline/prepare.py) writes it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
from collections import Counter
from pathlib import Path

import torch
from PIL import Image, UnidentifiedImageError
from torchvision import tv_tensors
from torchvision.transforms import v2


log = logging.getLogger(__name__)
SPLIT_DIRS = {"train": "train2017", "val": "val2017"}
REQUIRED_KEYS = {"images": ("id", "file_name", "width", "height"),
                 "annotations": ("id", "image_id", "category_id", "bbox"),
                 "categories": ("id", "name")}


class DatasetError(ValueError):
    """The dataset on disk is unusable; the message names the file and the remedy."""


def annotation_path(root: str | Path, split: str) -> Path:
    return Path(root) / "annotations" / f"instances_{SPLIT_DIRS[split]}.json"


def load_annotations(root: str | Path, split: str) -> dict:
    path = annotation_path(root, split)
    if not path.is_file():
        raise DatasetError(f"{path}: annotation file not found; expected the COCO 2017 layout "
                           f"(annotations/, train2017/, val2017/) under {root}")
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); "
                           "re-fetch or regenerate the dataset") from err
    for section, keys in REQUIRED_KEYS.items():
        entries = document.get(section) if isinstance(document, dict) else None
        if not isinstance(entries, list):
            raise DatasetError(f"{path}: missing the '{section}' list of a COCO annotation file")
        for entry in entries:
            missing = [k for k in keys if k not in entry]
            if missing:
                raise DatasetError(f"{path}: {section} entry {entry.get('id', '?')} lacks "
                                   f"{', '.join(missing)}")
    return document


def clean_box(bbox, width: int, height: int):
    """COCO [x, y, w, h] -> clamped [x0, y0, x1, y1], or None when no area is left."""
    x, y, w, h = (float(v) for v in bbox)
    if not all(math.isfinite(v) for v in (x, y, w, h)) or w <= 0 or h <= 0:
        return None
    x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
    x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
    if x1 <= x0 or y1 <= y0:
        return None
    return [x0, y0, x1, y1]


class CocoDetection(torch.utils.data.Dataset):
    """(image tensor in [0, 1], target dict) pairs in torchvision's detection format.

    Labels are COCO category ids as they stand (torchvision's recipe): the model has
    max(category id) + 1 classes, 0 being background.
    """

    def __init__(self, root: str | Path, split: str, train: bool, horizontal_flip: float = 0.0):
        self.root, self.split, self.train = Path(root), split, train
        self.image_dir = self.root / SPLIT_DIRS[split]
        document = load_annotations(root, split)
        self.source = annotation_path(root, split)
        self.categories = {c["id"]: c["name"] for c in document["categories"]}
        self.num_classes = max(self.categories, default=0) + 1
        self.skipped = Counter()
        by_image = {img["id"]: [] for img in document["images"]}
        for ann in document["annotations"]:
            if ann["image_id"] not in by_image:
                raise DatasetError(f"{self.source}: annotation {ann['id']} refers to image "
                                   f"{ann['image_id']}, which is not in 'images'")
            if ann["category_id"] not in self.categories:
                raise DatasetError(f"{self.source}: annotation {ann['id']} has category_id "
                                   f"{ann['category_id']}, which is not in 'categories'")
            by_image[ann["image_id"]].append(ann)
        self.images = []
        for img in sorted(document["images"], key=lambda i: i["id"]):
            targets = self._targets(img, by_image[img["id"]])
            if train and not targets:
                self.skipped["images without usable boxes (training)"] += 1
                continue
            self.images.append((img, targets))
        missing = [img["file_name"] for img, _ in self.images
                   if not (self.image_dir / img["file_name"]).is_file()]
        if missing:
            raise DatasetError(f"{self.image_dir}: {len(missing)} image(s) listed in {self.source} "
                               f"are missing, e.g. {missing[:3]}; re-fetch or regenerate the dataset")
        if not self.images:
            raise DatasetError(f"{self.source}: no usable images in the {split} split"
                               + (" (every image lacks a valid non-crowd box)" if train else ""))
        for reason, count in sorted(self.skipped.items()):
            log.warning("%s: skipped %d %s", self.source, count, reason)
        transforms = [v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]
        if train and horizontal_flip > 0:
            transforms.insert(1, v2.RandomHorizontalFlip(horizontal_flip))
        self.transforms = v2.Compose(transforms)

    def _targets(self, img: dict, annotations: list[dict]) -> list[tuple]:
        kept = []
        for ann in annotations:
            if self.train and ann.get("iscrowd", 0):
                self.skipped["crowd annotations (training)"] += 1
                continue
            box = clean_box(ann["bbox"], img["width"], img["height"])
            if box is None:
                self.skipped["boxes with no area inside the image"] += 1
                log.info("%s: annotation %s of image %s has an empty box %s; skipped",
                         self.source, ann["id"], img["file_name"], ann["bbox"])
                continue
            kept.append((box, ann["category_id"], ann.get("area", 0.0), ann.get("iscrowd", 0)))
        return kept

    def __len__(self) -> int:
        return len(self.images)

    def aspect_ratios(self) -> list[float]:
        """Width / height per image, from the annotations (no decoding), for batch grouping."""
        return [img["width"] / img["height"] for img, _ in self.images]

    def image_ids(self) -> list[int]:
        return [img["id"] for img, _ in self.images]

    def load_image(self, index: int) -> Image.Image:
        img, _ = self.images[index]
        path = self.image_dir / img["file_name"]
        try:
            with Image.open(path) as handle:
                image = handle.convert("RGB")
        except (UnidentifiedImageError, OSError) as err:
            raise DatasetError(f"{path}: cannot decode image {img['id']} ({err}); "
                               "re-fetch or regenerate the dataset") from err
        if image.size != (img["width"], img["height"]):
            raise DatasetError(f"{path}: is {image.size[0]}x{image.size[1]} but {self.source} says "
                               f"{img['width']}x{img['height']}")
        return image

    def target(self, index: int) -> dict:
        """The annotations of image `index` in torchvision's detection format (no decoding)."""
        img, targets = self.images[index]
        boxes = torch.tensor([t[0] for t in targets], dtype=torch.float32).reshape(-1, 4)
        return {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY",
                                              canvas_size=(img["height"], img["width"])),
            "labels": torch.tensor([t[1] for t in targets], dtype=torch.int64),
            "image_id": img["id"],
            "area": torch.tensor([t[2] for t in targets], dtype=torch.float32),
            "iscrowd": torch.tensor([t[3] for t in targets], dtype=torch.int64),
        }

    def __getitem__(self, index: int):
        image, target = self.transforms(self.load_image(index), self.target(index))
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
            pixels = torch.rand(3, img["height"], img["width"], generator=generator)
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


def collate(batch):
    """Detection batches stay lists: images differ in size and in their number of boxes."""
    return tuple(zip(*batch))


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_manifest(root: str | Path, decode_images: bool, splits=tuple(SPLIT_DIRS)) -> dict:
    """Check the splits load; summarise them. Decoding every image is for small datasets."""
    manifest = {"root": str(root), "splits": {}}
    for split in splits:
        dataset = CocoDetection(root, split, train=False)
        if decode_images:
            for index in range(len(dataset)):
                dataset.load_image(index)
        n_boxes = sum(len(t) for _, t in dataset.images)
        manifest["splits"][split] = {
            "annotation_file": str(dataset.source), "sha256": _sha256(dataset.source),
            "images": len(dataset), "boxes": n_boxes, "num_classes": dataset.num_classes,
            "skipped": dict(dataset.skipped)}
    return manifest
