"""Deterministic synthetic detection dataset in the exact COCO 2017 on-disk layout.

    root/annotations/instances_train2017.json
    root/annotations/instances_val2017.json
    root/train2017/000000000001.jpg ...
    root/val2017/...

Five shape categories in random colours on a textured background with unannotated clutter
strokes; objects small, medium and large in COCO's sense (area < 32², < 96², larger), placed
with limited overlap. Every image draws from its own seed (seed, split, index), so the bytes
depend only on the settings, never on the run. A few images carry no objects, as in COCO.

    python -m pipeline.data.synthetic --root data/synthetic --config '{"seed": 2017, ...}'
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from ..config import cli, schema
from ..runtime.files import MARKER, ForeignDirectoryError, replacing_dir, write_json

CATEGORIES = ["circle", "square", "triangle", "cross", "ring"]
SPLITS = {"train2017": 0, "val2017": 1}
# COCO size classes by area: small < 32², medium < 96², large above. Side ranges per class,
# as fractions of the image size so larger images keep the same mix.
SIZE_CLASSES = {"small": (0.07, 0.20), "medium": (0.28, 0.62), "large": (0.80, 0.95)}
SIZE_WEIGHTS = {"small": 0.40, "medium": 0.45, "large": 0.15}
EMPTY_IMAGE_FRACTION = 0.03
MAX_OVERLAP = 0.25  # intersection over the smaller box: objects stay mostly visible
FOREIGN_ROOT_REMEDY = "move it away, or point data.root at another directory"
# A generated tree edited since: the generator never writes over it, and never reads a tree it
# did not make, so keeping the edits means reading it as a user's dataset (docs/data.md).
EDITED_ROOT_REMEDY = (
    "move it away to have it generated afresh (what you changed stays in the moved copy); or, to "
    f"train on it as it is now, delete its {MARKER} file and run it as your own dataset: a preset "
    "of yours with data: {root: <this folder>, synthetic: null} (e.g. presets: {mine: {extends: "
    "demo, data: {name: mine, root: <this folder>, synthetic: null}}})"
)


def _colour(rng: np.random.Generator) -> tuple[int, int, int]:
    """A saturated colour: shapes are told apart by form, never by colour."""
    hue = rng.uniform(0, 6)
    x = 1 - abs(hue % 2 - 1)
    r, g, b = [(1, x, 0), (x, 1, 0), (0, 1, x), (0, x, 1), (x, 0, 1), (1, 0, x)][int(hue)]
    value, floor = rng.uniform(0.65, 1.0), rng.uniform(0.0, 0.3)

    def channel(c: float) -> int:
        return int(255 * value * (floor + (1 - floor) * c))

    return channel(r), channel(g), channel(b)


def _draw_shape(draw: ImageDraw.ImageDraw, category: str, box, fill) -> None:
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    if category == "circle":
        draw.ellipse(box, fill=fill)
    elif category == "square":
        draw.rectangle(box, fill=fill)
    elif category == "triangle":
        draw.polygon([(x0 + w / 2, y0), (x1, y1), (x0, y1)], fill=fill)
    elif category == "cross":
        t = max(w, h) / 3
        draw.rectangle((x0 + (w - t) / 2, y0, x0 + (w + t) / 2, y1), fill=fill)
        draw.rectangle((x0, y0 + (h - t) / 2, x1, y0 + (h + t) / 2), fill=fill)
    elif category == "ring":
        draw.ellipse(box, outline=fill, width=max(2, int(min(w, h) / 5)))
    else:  # pragma: no cover - CATEGORIES is closed
        raise ValueError(category)


def _background(rng: np.random.Generator, size: int, clutter: int) -> Image.Image:
    yy, xx = np.mgrid[0:size, 0:size] / size
    start, end = rng.uniform(40, 200, 3), rng.uniform(40, 200, 3)
    angle = rng.uniform(0, 2 * np.pi)
    t = (np.cos(angle) * xx + np.sin(angle) * yy + 1.5) / 3
    pixels = start + (end - start) * t[..., None] + rng.normal(0, 8, (size, size, 3))
    image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(image)
    for _ in range(clutter):  # thin strokes: edges and colour that are not objects
        points = [tuple(rng.uniform(0, size, 2)) for _ in range(int(rng.integers(2, 4)))]
        draw.line(points, fill=_colour(rng), width=int(rng.integers(1, 3)))
    return image


def _overlap(a, b) -> float:
    iw = min(a[2], b[2]) - max(a[0], b[0])
    ih = min(a[3], b[3]) - max(a[1], b[1])
    if iw <= 0 or ih <= 0:
        return 0.0
    smaller = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
    return iw * ih / smaller


def _place_objects(rng: np.random.Generator, size: int, max_objects: int) -> list[tuple]:
    if rng.random() < EMPTY_IMAGE_FRACTION:
        return []
    wanted = int(rng.integers(1, max_objects + 1))
    classes = list(SIZE_WEIGHTS)
    placed: list[tuple] = []
    for _ in range(wanted * 10):
        if len(placed) == wanted:
            break
        size_class = classes[rng.choice(len(classes), p=list(SIZE_WEIGHTS.values()))]
        lo, hi = SIZE_CLASSES[size_class]
        w = int(rng.uniform(lo, hi) * size)
        h = int(np.clip(w * rng.uniform(0.75, 1.33), 4, size - 2))
        x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
        box = (x0, y0, x0 + w, y0 + h)
        if all(_overlap(box, other[1]) <= MAX_OVERLAP for other in placed):
            placed.append((CATEGORIES[int(rng.integers(len(CATEGORIES)))], box, _colour(rng)))
    return placed


def render_image(
    seed: int, split_index: int, index: int, size: int, max_objects: int, clutter: int
) -> tuple[Image.Image, list[dict]]:
    """One image and its objects, from its own seed: (category, bbox xywh, visible area)."""
    rng = np.random.default_rng([seed, split_index, index])
    image = _background(rng, size, clutter)
    draw = ImageDraw.Draw(image)
    objects = _place_objects(rng, size, max_objects)
    masks = []
    for category, box, colour in objects:
        _draw_shape(draw, category, box, colour)
        mask = Image.new("L", (size, size))
        _draw_shape(ImageDraw.Draw(mask), category, box, 255)
        masks.append(np.asarray(mask) > 0)
    annotations = []
    for i, (category, _box, _) in enumerate(objects):
        visible = masks[i].copy()
        for later in masks[i + 1 :]:
            visible &= ~later
        ys, xs = np.nonzero(masks[i])
        x0, y0, x1, y1 = xs.min(), ys.min(), xs.max() + 1, ys.max() + 1
        annotations.append(
            {"category": category, "bbox": [int(x0), int(y0), int(x1 - x0), int(y1 - y0)], "area": int(visible.sum())}
        )
    return image, annotations


def generate(root: str | Path, settings: schema.Synthetic) -> dict:
    """Write the dataset to `root` (replacing it whole, atomically) and return counts per split.
    `root` must be absent or a dataset written here before: anything else is refused, untouched."""
    with replacing_dir(
        root,
        {"made_by": "pipeline.data.synthetic", "settings": settings.model_dump()},
        remedy=FOREIGN_ROOT_REMEDY,
        edited_remedy=EDITED_ROOT_REMEDY,
    ) as staging:
        (staging / "annotations").mkdir()
        sizes = {"train2017": settings.train_images, "val2017": settings.val_images}
        return {split: _write_split(staging, split, n_images, settings) for split, n_images in sizes.items()}


def _write_split(root: Path, split: str, n_images: int, settings: schema.Synthetic) -> dict:
    (root / split).mkdir()
    size = settings.image_size
    images: list[dict] = []
    annotations: list[dict] = []
    for index in range(n_images):
        image_id = index + 1
        file_name = f"{image_id:012d}.jpg"
        image, objects = render_image(settings.seed, SPLITS[split], index, size, settings.max_objects, settings.clutter)
        image.save(root / split / file_name, format="JPEG", quality=92)
        images.append(
            {
                "id": image_id,
                "file_name": file_name,
                "width": size,
                "height": size,
                "license": 0,
                "date_captured": "2017-01-01 00:00:00",
            }
        )
        for obj in objects:
            x, y, w, h = obj["bbox"]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": CATEGORIES.index(obj["category"]) + 1,
                    "bbox": [float(v) for v in obj["bbox"]],
                    "area": float(obj["area"]),
                    "iscrowd": 0,
                    "segmentation": [[x, y, x + w, y, x + w, y + h, x, y + h]],
                }
            )
    document = {
        "info": {
            "description": "Synthetic shapes in COCO 2017 layout (pipeline.data.synthetic)",
            "version": "1.0",
            "year": 2017,
            "contributor": "frcnn-dp-bench",
            "date_created": "2017-01-01",
            "generator_settings": settings.model_dump(),
        },
        "licenses": [{"id": 0, "name": "CC0", "url": ""}],
        "images": images,
        "annotations": annotations,
        "categories": [{"id": i + 1, "name": name, "supercategory": "shape"} for i, name in enumerate(CATEGORIES)],
    }
    write_json(root / "annotations" / f"instances_{split}.json", document)
    return {"images": len(images), "annotations": len(annotations)}


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        parser.add_argument("--root", required=True, help="dataset directory to (re)create")
        parser.add_argument("--config", required=True, help="data.synthetic settings as JSON")

    def body(args):
        counts = generate(args.root, schema.Synthetic.model_validate(json.loads(args.config)))
        print(f"wrote synthetic dataset to {args.root}: {json.dumps(counts)}")

    cli.run_stage(
        __doc__.split("\n\n")[0],
        body,
        arguments=arguments,
        errors=(ForeignDirectoryError,),
        follows_parent=False,
        argv=argv,
    )


if __name__ == "__main__":
    main()
