"""COCO annotation files read and checked: the keys every loader and COCOeval read, unique ids,
boxes, and the two splits' agreement on categories. No torch, no pixels.

COCOeval (pycocotools' cocoeval.py, and faster-coco-eval, its C++ twin) reads, of the ground
truth: annotations' id, image_id, category_id, bbox, area and iscrowd; images' id (width and
height for masks); categories' id. Each is checked here, at the data stage, so that no
evaluation fails after training: `area` and `iscrowd` are optional in files many tools export,
and where absent are filled in for evaluation, in memory only (`for_evaluation`), as the box's
width x height and 0 (not a crowd), with one logged line; the user's file is never changed.
"""

from __future__ import annotations

import copy
import json
import logging
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .errors import DatasetError, remedy
from .tree import annotation_path

log = logging.getLogger(__name__)
REQUIRED_KEYS = {
    "images": ("id", "file_name", "width", "height"),
    "annotations": ("id", "image_id", "category_id", "bbox"),
    "categories": ("id", "name"),
}
# What COCOeval reads that COCO files may leave out, and what it means where absent.
FILLED = {"area": "the box's width x height", "iscrowd": "0 (not a crowd)"}
JSON_KINDS = {
    list: "a JSON list",
    str: "a JSON string",
    int: "a JSON number",
    float: "a JSON number",
    bool: "a JSON boolean",
    type(None): "JSON null",
}
CATEGORY_MODES = ("refuse", "warn")  # data.category_mismatch


def load_annotations(root: str | Path, split: str) -> dict:
    """The split's annotation file, checked to be a COCO object whose entries have their keys,
    whose image and annotation ids are unique, and whose optional keys COCOeval reads hold what
    it can read."""
    path = annotation_path(root, split)
    if not path.is_file():
        raise DatasetError(
            f"{path}: annotation file not found; expected the COCO 2017 layout "
            f"(annotations/, train2017/, val2017/) under {root}"
        )
    text = path.read_text()
    if not text:
        raise DatasetError(
            f"{path}: is empty (0 bytes); {remedy('restore it from your copy of the annotations', root)}"
        )
    try:
        document = json.loads(text)
    except json.JSONDecodeError as err:
        raise DatasetError(
            f"{path}: not valid JSON ({err.msg}, line {err.lineno}); "
            f"{remedy('correct the JSON there, or restore the file', root)}"
        ) from err
    if not isinstance(document, dict):
        own = "write it as one object with the lists images, annotations and categories"
        raise DatasetError(
            f"{path}: is {JSON_KINDS.get(type(document), 'not an object')}, not a "
            f"COCO annotation object (images, annotations, categories); "
            f"{remedy(own, root)}"
        )
    for section, keys in REQUIRED_KEYS.items():
        _check_entries(path, root, section, document.get(section), keys)
    _check_numbers(path, document)
    _check_unique_ids(path, document)
    _check_unique_file_names(path, document)
    _check_evaluated_values(path, document)
    return document


def _check_entries(path: Path, root, section: str, entries, keys: tuple[str, ...]) -> None:
    if not isinstance(entries, list):
        raise DatasetError(
            f"{path}: missing the '{section}' list of a COCO annotation file; "
            f"{remedy('add it (an empty list if it has no entries)', root)}"
        )
    for entry in entries:
        if not isinstance(entry, dict):
            own = f"make it an object with {', '.join(keys)}, or remove it"
            raise DatasetError(f"{path}: {section} holds {entry!r}, not an object; {remedy(own, root)}")
    lacking = [entry for entry in entries if any(k not in entry for k in keys)]
    if not lacking:
        return
    missing = [k for k in keys if k not in lacking[0]]
    more = f" (and {len(lacking) - 1} more of its entries lack some of {', '.join(keys)})" if len(lacking) > 1 else ""
    # An annotation exported with a segmentation only (a mask tool's) has no box to learn from.
    own = (
        "give each such annotation a bbox [x, y, width, height] (its object's bounding box), or remove it"
        if "bbox" in missing
        else f"add {', '.join(missing)} to each such entry, or remove it"
    )
    raise DatasetError(
        f"{path}: {section} entry {lacking[0].get('id', '?')} lacks {', '.join(missing)}{more}; {remedy(own, root)}"
    )


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
        raise DatasetError(
            f"{path}: {kind} id {first} is used by {counts[first]} entries of "
            f"'{section}'{which}{more}; give each {kind} its own id"
        )


def _check_numbers(path: Path, document: dict) -> None:
    """The ids every loader and COCOeval look up, and the box they do arithmetic on, are JSON
    numbers: a string ("10") would pass Python's float() here and crash the C++ evaluation
    after training (pybind11's cast error, naming no file). An annotation's own id, its area
    and iscrowd are checked with what COCOeval reads of them (_check_evaluated_values)."""
    for image in document["images"]:
        if not _is_whole(image["id"]):
            raise DatasetError(
                f"{path}: images entry {image['id']!r} ({image['file_name']}) has id {image['id']!r}, "
                "not a whole number; write the id as a JSON number, without quotes"
            )
    for ann in document["annotations"]:
        where = f"{path}: annotation {ann['id']!r}"
        for key in ("image_id", "category_id"):  # its own id, area and iscrowd: _check_evaluated_values
            if not _is_whole(ann[key]):
                raise DatasetError(
                    f"{where} has {key} {ann[key]!r}, not a whole number; write {key} as a JSON number, without quotes"
                )
        bbox = ann["bbox"]
        if isinstance(bbox, list) and any(isinstance(v, str | bool) or v is None for v in bbox):
            raise DatasetError(
                f"{where} (image {ann['image_id']}) has bbox {bbox!r}, which holds a "
                "value that is not a number; write bbox as 4 JSON numbers [x, y, width, height], "
                "without quotes"
            )


def _is_whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_unique_file_names(path: Path, document: dict) -> None:
    """One picture under two image ids would be scored twice, each time against the boxes of
    one id only: each copy's detections of the other id's objects count as false positives."""
    ids: dict[str, list] = {}
    for image in document["images"]:
        ids.setdefault(image["file_name"], []).append(image["id"])
    repeated = {name: found for name, found in ids.items() if len(found) > 1}
    if not repeated:
        return
    name, found = next(iter(repeated.items()))
    more = f" (and {len(repeated) - 1} more files listed twice)" if len(repeated) > 1 else ""
    raise DatasetError(
        f"{path}: file_name {name!r} is listed under {len(found)} image ids ({', '.join(map(repr, found))}){more}; "
        f"an image is listed once: keep one entry (id {found[0]!r}) and give its annotations that image_id "
        f"(those of id(s) {', '.join(map(repr, found[1:]))} too), or point each entry at its own file"
    )


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_evaluated_values(path: Path, document: dict) -> None:
    """What COCOeval does arithmetic on: an annotation's id (kept in a float array of
    matches), its area (compared with the size ranges) and iscrowd (0 or 1) where given."""
    for ann in document["annotations"]:
        bad = []  # (what it holds, what COCOeval can read)
        if not (isinstance(ann["id"], int) and not isinstance(ann["id"], bool)):
            bad.append((f"id {ann['id']!r}", "a whole number"))
        if "area" in ann and not (_is_number(ann["area"]) and ann["area"] >= 0):
            bad.append(
                (f"area {ann['area']!r}", "a number from 0, or no area key: then the box's width x height is used")
            )
        if "iscrowd" in ann and ann["iscrowd"] not in (0, 1):
            bad.append((f"iscrowd {ann['iscrowd']!r}", "0 or 1"))
        if bad:
            wanted = "; ".join(f"{held.split()[0]}: {want}" for held, want in bad)
            raise DatasetError(
                f"{path}: annotation {ann['id']!r} of image {ann['image_id']} has "
                f"{' and '.join(held for held, _ in bad)}, which COCOeval cannot "
                f"read; write {wanted}"
            )


def box_area(ann: dict) -> float:
    """The annotation's area as COCOeval sizes it: its own, else its box's width x height."""
    if "area" in ann:
        return float(ann["area"])
    _, _, width, height = (float(v) for v in ann["bbox"])
    return width * height


def missing_optional(document: dict) -> dict[str, int]:
    """How many annotations lack each key of FILLED (those with none left out)."""
    counts = {key: sum(key not in ann for ann in document["annotations"]) for key in FILLED}
    return {key: n for key, n in counts.items() if n}


def filled_line(source: str | Path, missing: dict[str, int]) -> str:
    """The one line that says what was filled in, and that the file is not changed."""
    return (
        f"{source}: "
        + "; ".join(f"{n} annotations lack {key}, read as {FILLED[key]}" for key, n in missing.items())
        + " (in memory, for evaluation; the file is not changed)"
    )


def for_evaluation(path: str | Path) -> dict:
    """The ground truth COCOeval gets from annotation file `path`: the file's document, with
    each left-out key of FILLED filled in (one logged line); the file itself is not changed."""
    document = json.loads(Path(path).read_text())
    missing = missing_optional(document)
    if not missing:
        return document
    document = copy.deepcopy(document)
    for ann in document["annotations"]:
        ann.setdefault("area", box_area(ann))
        ann.setdefault("iscrowd", 0)
    log.info(filled_line(path, missing))
    return document


@dataclass(frozen=True)
class CategoryUse:
    """A split's categories as its annotation file names them, and its non-crowd boxes of each
    (crowd boxes are neither learnt nor scored)."""

    path: Path
    names: dict[int, str]
    boxes: Counter

    @classmethod
    def of(cls, path: Path, document: dict) -> CategoryUse:
        return cls(
            path,
            {c["id"]: c["name"] for c in document["categories"]},
            Counter(a["category_id"] for a in document["annotations"] if not a.get("iscrowd", 0)),
        )


def check_split_categories(train: CategoryUse, val: CategoryUse, mode: str) -> list[str]:
    """The model learns the categories of training's boxes, and is scored on validation's: a
    category validation's boxes use that no training box does cannot be predicted (each such
    box is a miss), and an id named differently in the two files is not one category. Refused
    (DatasetError) under data.category_mismatch: refuse; under warn, each is logged and the
    splits are used as they are. The lines said, for the manifest."""
    if mode not in CATEGORY_MODES:
        raise ValueError(f"category_mismatch: {mode!r} is not one of {', '.join(CATEGORY_MODES)}")
    absent = sorted(i for i in val.boxes if i not in train.boxes)
    renamed = sorted(i for i in val.names if i in train.names and val.names[i] != train.names[i])
    problems = []
    if absent:
        named = ", ".join(f"{i} ({val.names.get(i)!r}, {val.boxes[i]} boxes)" for i in absent)
        problems.append(
            f"{val.path}: category id(s) {named} are used by validation boxes but by no training "
            f"box in {train.path}, so the model can never predict them and each such box counts "
            "as missed"
        )
    if renamed:
        named = ", ".join(f"{i} ({train.names[i]!r} in train, {val.names[i]!r} in val)" for i in renamed)
        problems.append(
            f"{val.path}: category id(s) {named} are named differently in "
            f"{train.path}, so one id does not mean one category"
        )
    if not problems:
        return []
    if mode == "refuse":
        fix = (
            "give both annotation files the same categories (one id for one name), with "
            "training boxes of each category validation uses; or set data.category_mismatch: "
            "warn to train and evaluate on them as they are"
        )
        raise DatasetError("\n".join(f"{p}; {fix}" for p in problems))
    for problem in problems:
        log.warning("%s; data.category_mismatch: warn uses both splits as they are", problem)
    return problems


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
