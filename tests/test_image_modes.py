"""Images read as they are, or refused by name (pipeline/data/images.py): each stored mode a
user's tree may hold is read by its stated rule, by the data stage and by training alike, and
the data stage's manifest counts the modes it saw. The refusals' messages are cases of
tests/test_bad_inputs.py (image-mode-without-rule, transparent-pixels)."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from pipeline.data.dataset import CocoDetection, DatasetError, build_manifest

from .conftest import write_coco

SIZE = (64, 48)  # width, height
RNG = np.random.default_rng(0)
# 12-bit values in a 16-bit file, as a thermal camera or a microscope writes them: read over
# the mode's full range (0..65535) they are nearly black, clipped to 8 bits (PIL's convert)
# nearly all white.
TWELVE_BIT = RNG.integers(100, 4096, (SIZE[1], SIZE[0])).astype(np.uint16)
FLOATS = RNG.normal(20.0, 5.0, (SIZE[1], SIZE[0])).astype(np.float32)  # e.g. degrees Celsius
RGB = RNG.integers(0, 256, (SIZE[1], SIZE[0], 3)).astype(np.uint8)


def stretched(values: np.ndarray) -> np.ndarray:
    """The stated rule for 16-bit and float gray: the image's own min..max to 0..255."""
    low, high = float(values.min()), float(values.max())
    return np.rint((values.astype(np.float64) - low) * 255.0 / (high - low)).astype(np.uint8)


def dataset_with(root, image: Image.Image, name: str, fmt: str, **options) -> None:
    """Both splits: image 1 stored as given, image 2 an ordinary RGB JPEG; one box each."""
    for split in ("train", "val"):
        images = [{"id": 1, "file_name": name, "width": SIZE[0], "height": SIZE[1]},
                  {"id": 2, "file_name": "2.jpg", "width": SIZE[0], "height": SIZE[1]}]
        boxes = [{"id": i, "image_id": i, "category_id": 1, "bbox": [4, 4, 20, 20],
                  "area": 400.0, "iscrowd": 0} for i in (1, 2)]
        write_coco(root, split, images, boxes)
        image.save(root / f"{split}2017" / name, format=fmt, **options)
        Image.fromarray(RGB).save(root / f"{split}2017" / "2.jpg")


def gray(values: np.ndarray) -> np.ndarray:
    return np.repeat(values[..., None], 3, axis=2)


# (id, image, file name, format, stored mode as counted, the RGB pixels the rule gives)
MODES = [
    ("16-bit-png", Image.fromarray(TWELVE_BIT), "1.png", "PNG", "I;16",
     gray(stretched(TWELVE_BIT))),
    ("16-bit-big-endian-tiff", Image.fromarray(TWELVE_BIT.astype(">u2")), "1.tif",
     "TIFF", "I;16B", gray(stretched(TWELVE_BIT))),
    ("32-bit-integer-tiff", Image.fromarray(TWELVE_BIT.astype(np.int32)), "1.tif", "TIFF", "I",
     gray(stretched(TWELVE_BIT))),
    ("float-tiff", Image.fromarray(FLOATS), "1.tif", "TIFF", "F", gray(stretched(FLOATS))),
    ("bilevel", Image.fromarray(TWELVE_BIT > 2000), "1.png", "PNG", "1",
     gray(np.where(TWELVE_BIT > 2000, 255, 0).astype(np.uint8))),
    ("opaque-rgba", Image.fromarray(np.dstack([RGB, np.full(SIZE[::-1], 255, np.uint8)])),
     "1.png", "PNG", "RGBA", RGB),
    ("opaque-gray-alpha",
     Image.merge("LA", [Image.fromarray(RGB[..., 0]), Image.new("L", SIZE, 255)]),
     "1.png", "PNG", "LA", gray(RGB[..., 0])),
]


@pytest.mark.parametrize("case", MODES, ids=[c[0] for c in MODES])
def test_each_mode_is_read_by_its_rule_and_counted(case, tmp_path):
    _, image, name, fmt, mode, expected = case
    root = tmp_path / "mine"
    dataset_with(root, image, name, fmt)
    manifest = build_manifest(root)  # the data stage
    assert manifest["splits"]["train"]["image_modes"] == {mode: 1, "RGB": 1}
    for train in (True, False):  # training and evaluation read what the data stage read
        pixels = CocoDetection(root, "train", train=train)[0][0].permute(1, 2, 0).numpy()
        assert np.array_equal(pixels, expected)


def test_a_16_bit_image_is_not_read_as_white(tmp_path):
    """What PIL's convert("RGB") made of it: every pixel above 255 clipped to white."""
    clipped = np.asarray(Image.fromarray(TWELVE_BIT).convert("RGB"))
    assert (clipped == 255).mean() > 0.9
    root = tmp_path / "mine"
    dataset_with(root, Image.fromarray(TWELVE_BIT), "1.png", "PNG")
    pixels = CocoDetection(root, "train", train=False)[0][0]
    assert pixels.min() == 0 and pixels.max() == 255 and (pixels == 255).float().mean() < 0.01


def test_a_palette_image_with_a_transparency_key_is_read_where_nothing_is_see_through(tmp_path):
    """A P (palette) PNG's tRNS chunk names a see-through index: unused, the image is opaque
    and read through its palette; used, it is refused like any transparent pixel."""
    palette_image = Image.fromarray(RGB).quantize(16)
    indices = np.asarray(palette_image)
    unused = next(i for i in range(256) if i not in indices)
    root = tmp_path / "opaque"
    dataset_with(root, palette_image, "1.png", "PNG", transparency=unused)
    manifest = build_manifest(root)
    assert manifest["splits"]["val"]["image_modes"] == {"P with transparency": 1, "RGB": 1}
    pixels = CocoDetection(root, "val", train=False)[0][0].permute(1, 2, 0).numpy()
    assert np.array_equal(pixels, np.asarray(palette_image.convert("RGB")))

    root = tmp_path / "see-through"
    dataset_with(root, palette_image, "1.png", "PNG", transparency=int(indices[0, 0]))
    with pytest.raises(DatasetError) as err:
        build_manifest(root)
    seen = int((indices == indices[0, 0]).sum())
    assert (f"{root / 'train2017' / '1.png'}: image 1 has {seen} transparent or translucent "
            "pixels (PIL mode P with transparency)") in str(err.value)


def test_a_float_image_with_nan_is_refused_by_name(tmp_path):
    values = FLOATS.copy()
    values[0, 0] = np.nan
    root = tmp_path / "mine"
    dataset_with(root, Image.fromarray(values), "1.tif", "TIFF")
    with pytest.raises(DatasetError) as err:
        build_manifest(root)
    assert (f"{root / 'train2017' / '1.tif'}: image 1 holds NaN or infinite pixel values (PIL "
            "mode F)") in str(err.value)
    assert "replace them with finite values" in str(err.value)


def test_a_constant_16_bit_image_reads_as_black(tmp_path):
    root = tmp_path / "mine"
    dataset_with(root, Image.fromarray(np.full(SIZE[::-1], 3000, np.uint16)), "1.png", "PNG")
    assert CocoDetection(root, "train", train=False)[0][0].max() == 0


def test_a_16_bit_image_with_a_transparency_key_is_refused_not_clipped(tmp_path):
    """Its way to RGBA would clip it to 8 bits: no rule reads it, and the data stage says so."""
    root = tmp_path / "mine"
    dataset_with(root, Image.fromarray(TWELVE_BIT), "1.png", "PNG", transparency=0)
    with pytest.raises(DatasetError) as err:
        build_manifest(root)
    assert (f"{root / 'train2017' / '1.png'}: image 1 is stored in PIL mode I;16 with "
            "transparency, which has no rule here") in str(err.value)
