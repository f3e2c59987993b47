"""The one loader for COCO 2017-layout detection data: the embedded synthetic set and real COCO.

Follows torchvision's references/detection recipe for what it skips, and logs each skip:
  * crowd annotations (iscrowd=1) are not training targets (they stay in the evaluation ground
    truth, where COCOeval ignores matches to them);
  * boxes are clamped to the image; a box with no area left (zero width or height, or entirely
    outside the image) is dropped (COCO itself has a few, so these cannot be errors);
  * training drops images left without a box; evaluation keeps every image.
Anything else wrong is an error naming the file and what to do: a missing, empty, truncated or
mislabelled (PNG named .jpg) image, malformed or non-COCO JSON, duplicate ids, dangling
references, a box no recipe can mean (negative size, NaN or infinite), an empty split.

`build_manifest` validates both splits; the data stage (pipeline/data/prepare.py) writes it.
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
MIRROR = v2.RandomHorizontalFlip(p=1.0)  # the image and its boxes, together
SPLIT_DIRS = {"train": "train2017", "val": "val2017"}
REQUIRED_KEYS = {"images": ("id", "file_name", "width", "height"),
                 "annotations": ("id", "image_id", "category_id", "bbox"),
                 "categories": ("id", "name")}
REFETCH = "re-fetch or regenerate the dataset"
# What an image's name promises, as PIL names formats. MPO is how PIL opens a JPEG that holds
# several pictures (some cameras write them); it decodes as the JPEG it is.
FORMATS = {".jpg": ("JPEG", "MPO"), ".jpeg": ("JPEG", "MPO"), ".png": ("PNG",)}
EXTENSIONS = {"JPEG": ".jpg", "MPO": ".jpg", "PNG": ".png"}
JSON_KINDS = {list: "a JSON list", str: "a JSON string", int: "a JSON number",
              float: "a JSON number", bool: "a JSON boolean", type(None): "JSON null"}


class DatasetError(ValueError):
    """The dataset on disk is unusable; the message names the file and the remedy."""


def annotation_path(root: str | Path, split: str) -> Path:
    return Path(root) / "annotations" / f"instances_{SPLIT_DIRS[split]}.json"


def load_annotations(root: str | Path, split: str) -> dict:
    """The split's annotation file, checked to be a COCO object whose entries have their keys
    and whose image and annotation ids are unique."""
    path = annotation_path(root, split)
    if not path.is_file():
        raise DatasetError(f"{path}: annotation file not found; expected the COCO 2017 layout "
                           f"(annotations/, train2017/, val2017/) under {root}")
    text = path.read_text()
    if not text:
        raise DatasetError(f"{path}: is empty (0 bytes); {REFETCH}")
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetError(f"{path}: not valid JSON ({err.msg}, line {err.lineno}); "
                           f"{REFETCH}") from err
    if not isinstance(document, dict):
        raise DatasetError(f"{path}: is {JSON_KINDS.get(type(document), 'not an object')}, not a "
                           f"COCO annotation object (images, annotations, categories); {REFETCH}")
    for section, keys in REQUIRED_KEYS.items():
        _check_entries(path, section, document.get(section), keys)
    _check_unique_ids(path, document)
    return document


def _check_entries(path: Path, section: str, entries, keys: tuple[str, ...]) -> None:
    if not isinstance(entries, list):
        raise DatasetError(f"{path}: missing the '{section}' list of a COCO annotation file; "
                           f"{REFETCH}")
    for entry in entries:
        if not isinstance(entry, dict):
            raise DatasetError(f"{path}: {section} holds {entry!r}, not an object; {REFETCH}")
        missing = [k for k in keys if k not in entry]
        if missing:
            raise DatasetError(f"{path}: {section} entry {entry.get('id', '?')} lacks "
                               f"{', '.join(missing)}; {REFETCH}")


def _check_unique_ids(path: Path, document: dict) -> None:
    """Both are looked up by id (here, and by pycocotools in evaluation): a repeated id would
    silently merge two images, or keep one of two annotations."""
    for section, kind in (("images", "image"), ("annotations", "annotation")):
        counts = Counter(entry["id"] for entry in document[section])
        repeated = [i for i, n in counts.items() if n > 1]
        if not repeated:
            continue
        first = repeated[0]
        names = [e["file_name"] for e in document["images"] if e["id"] == first]
        which = f" ({', '.join(names)})" if section == "images" else ""
        more = f" (and {len(repeated) - 1} more repeated ids)" if len(repeated) > 1 else ""
        raise DatasetError(f"{path}: {kind} id {first} is used by {counts[first]} entries of "
                           f"'{section}'{which}{more}; give each {kind} its own id")


def clean_box(bbox, width: int, height: int):
    """COCO [x, y, w, h] -> [x0, y0, x1, y1] clamped to the image, or None when no area is left
    (zero width or height, or entirely outside the image). A box no recipe can mean raises
    ValueError saying why: not 4 numbers, a NaN or infinite coordinate, a negative size."""
    try:
        x, y, w, h = (float(v) for v in bbox)
    except (TypeError, ValueError):
        raise ValueError("is not 4 numbers [x, y, width, height]") from None
    if not all(math.isfinite(v) for v in (x, y, w, h)):
        raise ValueError("has a NaN or infinite coordinate")
    if w < 0 or h < 0:
        raise ValueError("has a negative width or height")
    if w == 0 or h == 0:
        return None
    x0, y0 = min(max(x, 0.0), width), min(max(y, 0.0), height)
    x1, y1 = min(max(x + w, 0.0), width), min(max(y + h, 0.0), height)
    if x1 <= x0 or y1 <= y0:
        return None
    return [x0, y0, x1, y1]


def _why_undecodable(path: Path, err: Exception) -> str:
    """What is wrong with an image PIL could not decode, from its bytes (read only on failure):
    an empty file, or one cut short (no end marker), says more than PIL's message."""
    try:
        data = path.read_bytes()
    except OSError:
        return str(err)
    if not data:
        return "the file is empty (0 bytes)"
    if data.startswith(b"\xff\xd8\xff") and not data.rstrip(b"\0").endswith(b"\xff\xd9"):
        return (f"the file is truncated: its JPEG data stops after {len(data)} bytes, without "
                "the end-of-image marker")
    if data.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" not in data[-12:]:
        return (f"the file is truncated: its PNG data stops after {len(data)} bytes, without "
                "the IEND chunk")
    return str(err)


class CocoDetection(torch.utils.data.Dataset):
    """(uint8 image tensor (C, H, W), target dict) pairs in torchvision's detection format; the
    model takes each image through `to_model_input` (float32 in [0, 1], made on its device).

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

    def _annotations_by_image(self, document: dict) -> dict[int, list[dict]]:
        by_image = {img["id"]: [] for img in document["images"]}
        for ann in document["annotations"]:
            if ann["image_id"] not in by_image:
                raise DatasetError(f"{self.source}: annotation {ann['id']} refers to image "
                                   f"{ann['image_id']}, which is not in 'images'; add the image "
                                   "or remove the annotation")
            if ann["category_id"] not in self.categories:
                raise DatasetError(f"{self.source}: annotation {ann['id']} has category_id "
                                   f"{ann['category_id']}, which is not in 'categories'; add the "
                                   "category or fix the annotation's category_id")
            by_image[ann["image_id"]].append(ann)
        return by_image

    def _check_images(self) -> None:
        """Every kept image is on disk (its bytes are checked when it is decoded), and some are."""
        missing = [img["file_name"] for img, _ in self.images
                   if not (self.image_dir / img["file_name"]).is_file()]
        if missing:
            raise DatasetError(f"{self.image_dir}: {len(missing)} image(s) listed in {self.source} "
                               f"are missing, e.g. {missing[:3]}; {REFETCH}")
        if not self.images:
            why = " (every image lacks a valid non-crowd box)" if self.train else ""
            raise DatasetError(f"{self.source}: no usable images in the {self.split} split{why}; "
                               f"{REFETCH}")

    def _skip(self, reason: str, example: str) -> None:
        self.skipped[reason] += 1
        self._examples.setdefault(reason, example)

    def _log_skips(self) -> None:
        """One warning per kind of skip, with a count and an example; each box at INFO."""
        for reason, count in sorted(self.skipped.items()):
            log.warning("%s: skipped %d %s (e.g. %s)", self.source, count, reason,
                        self._examples[reason])
        if self.clamped:
            log.warning("%s: clamped %d boxes that extend past their image to its edges",
                        self.source, self.clamped)

    def _targets(self, img: dict, annotations: list[dict]) -> list[tuple]:
        kept = []
        for ann in annotations:
            if self.train and ann.get("iscrowd", 0):
                self._skip("crowd annotations (training)", f"annotation {ann['id']}")
                continue
            box = self._box(img, ann)
            if box is not None:
                kept.append((box, ann["category_id"], ann.get("area", 0.0), ann.get("iscrowd", 0)))
        return kept

    def _box(self, img: dict, ann: dict) -> list[float] | None:
        """The annotation's box clamped to its image; None (skipped, counted) if none is left."""
        try:
            box = clean_box(ann["bbox"], img["width"], img["height"])
        except ValueError as err:
            raise DatasetError(f"{self.source}: annotation {ann['id']} of image {img['id']} "
                               f"({img['file_name']}): bbox {ann['bbox']} {err}; fix or remove "
                               "the annotation") from None
        x, y, w, h = (float(v) for v in ann["bbox"])
        if box is None:
            reason = ("boxes of zero width or height" if w == 0 or h == 0
                      else "boxes entirely outside their image")
            self._skip(reason, f"annotation {ann['id']}")
            log.info("%s: annotation %s of image %s: %s %s; skipped", self.source, ann["id"],
                     img["file_name"], reason, ann["bbox"])
        elif box != [x, y, x + w, y + h]:
            self.clamped += 1
            log.info("%s: annotation %s of image %s: box %s clamped to %s", self.source,
                     ann["id"], img["file_name"], ann["bbox"], box)
        return box

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
                self._check_format(path, handle.format)
                image = handle.convert("RGB")
        except (UnidentifiedImageError, OSError) as err:
            raise DatasetError(f"{path}: cannot decode image {img['id']}: "
                               f"{_why_undecodable(path, err)}; {REFETCH}") from err
        if image.size != (img["width"], img["height"]):
            raise DatasetError(f"{path}: is {image.size[0]}x{image.size[1]} but {self.source} says "
                               f"{img['width']}x{img['height']}; {REFETCH}")
        return image

    def _check_format(self, path: Path, found: str | None) -> None:
        """The header names the format (no decoding): data that is not what its name says is
        refused, since other tools (and a re-encode to JPEG) trust the extension."""
        expected = FORMATS.get(path.suffix.lower())
        if expected and found not in expected:
            extension = EXTENSIONS.get(found, f".{str(found).lower()}")
            raise DatasetError(f"{path}: holds {found} data although its name says "
                               f"{expected[0]}; re-encode it as {expected[0]}, or rename it to "
                               f"{path.stem}{extension} and change its file_name in {self.source}")

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
            pixels = torch.randint(0, 256, (3, img["height"], img["width"]), dtype=torch.uint8,
                                   generator=generator)
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
