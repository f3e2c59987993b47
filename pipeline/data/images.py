"""Images read as they are, or refused by name: how each stored mode becomes the RGB the model
takes, EXIF orientation, and the checks against the annotations (format, size).

`ImageReader` reads every image the same way for training, evaluation and the data stage, so
what the data stage passed is what training and evaluation read. The rule for each mode
(`MODE_RULES`; docs/data.md's "Your own images and annotations" says the same):
  * RGB as stored; L (gray) and 1 (black and white: 0 and 255) repeated in R, G and B;
    P through its palette; CMYK and YCbCr by PIL's conversion (no colour profile).
  * 16-bit and 32-bit integer and float gray (I;16 and its byte orders I;16L, I;16B, I;16N; I;
    F) are stretched linearly from the image's own minimum..maximum to 0..255 (a constant image
    reads as 0). Why not the mode's full range: thermal cameras, microscopes and X-ray
    detectors write 12- or 14-bit values into 16-bit files, so scaled from 0..65535 their
    images would be nearly black (4095 is 6 % of it), and a float image has no full range to
    scale from; the image's own range is what ImageJ's auto-contrast and a thermal camera's AGC
    show. The price: one raw value may get different levels in two images. A float image with
    a NaN or infinite pixel is refused.
  * With an alpha channel or a transparency key (RGBA, LA, PA, a P, L or RGB PNG with tRNS):
    read without it when every pixel is opaque (nothing is lost); refused when some pixel is
    transparent, since its colour then depends on the background a viewer shows, and which
    background the boxes were drawn on cannot be told.
  * Any other mode (LAB, HSV, RGBa, I;16S, ...) is refused, naming the file and its mode.

An image whose EXIF orientation is not 1 is shown by a viewer turned from its stored pixels,
and nothing says which of the two its boxes were drawn on: `data.exif_orientation` says
(refuse, the default; apply; ignore).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from .errors import DatasetError, remedy
from .tree import SPLIT_DIRS, annotation_path

# What PIL raises for bytes it cannot decode (UnidentifiedImageError and "image file is
# truncated" are OSErrors; a broken PNG chunk is a SyntaxError; a decompression bomb has its own).
DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)
EXIF_ORIENTATION = 0x0112  # the EXIF/TIFF tag; 1 (or absent): the stored pixels are upright
# Orientation -> what a viewer does to the stored pixels (ExifTool's names) and the PIL
# transpose that does it (PIL's ImageOps.exif_transpose table); other values mean 1.
ORIENTATIONS = {
    2: ("mirror horizontal", Image.Transpose.FLIP_LEFT_RIGHT),
    3: ("rotate 180", Image.Transpose.ROTATE_180),
    4: ("mirror vertical", Image.Transpose.FLIP_TOP_BOTTOM),
    5: ("mirror horizontal and rotate 270 CW", Image.Transpose.TRANSPOSE),
    6: ("rotate 90 CW", Image.Transpose.ROTATE_270),
    7: ("mirror horizontal and rotate 90 CW", Image.Transpose.TRANSVERSE),
    8: ("rotate 270 CW", Image.Transpose.ROTATE_90),
}
EXIF_MODES = ("refuse", "apply", "ignore")
EXIF_REMEDY = (
    "set data.exif_orientation: apply if the boxes were drawn on the images as a "
    "viewer shows them, or ignore if they were drawn on the stored pixels; or rewrite "
    "the images upright (orientation 1), their boxes to match"
)
# What an image's name promises, as PIL names formats. MPO is how PIL opens a JPEG that holds
# several pictures (some cameras write them); it decodes as the JPEG it is.
FORMATS = {".jpg": ("JPEG", "MPO"), ".jpeg": ("JPEG", "MPO"), ".png": ("PNG",)}
EXTENSIONS = {"JPEG": ".jpg", "MPO": ".jpg", "PNG": ".png"}

WIDE = "stretched to 8 bits from the image's own min..max, gray"
OPAQUE_ONLY = "alpha dropped where every pixel is opaque; a transparent pixel is refused"
# PIL mode -> how it is read as RGB (the module's docstring says why); any other is refused.
MODE_RULES = {
    "RGB": "as stored",
    "L": "gray",
    "1": "black and white as 0 and 255, gray",
    "P": "through its palette",
    "CMYK": "PIL's conversion, no colour profile",
    "YCbCr": "PIL's conversion (ITU-R BT.601)",
    **{mode: WIDE for mode in ("I;16", "I;16L", "I;16B", "I;16N", "I", "F")},
    **{mode: OPAQUE_ONLY for mode in ("RGBA", "LA", "PA")},
}
TRANSPARENCY_KEY = " with transparency"  # a P, L or RGB image whose tRNS names a see-through value
ALPHA_MODES = ("RGBA", "LA", "PA")
KEYED_MODES = ("P", "L", "RGB")  # those whose transparency key is read (to 8-bit RGBA)


class ExifOrientationError(DatasetError):
    """An image with an EXIF orientation other than 1, read under data.exif_orientation: refuse."""

    def __init__(self, message: str, orientation: int, mode: str):
        super().__init__(message)
        self.orientation, self.mode = orientation, mode


class ImageModeError(DatasetError):
    """An image whose stored mode has no rule, or whose pixels its rule refuses."""

    def __init__(self, message: str, mode: str | None):
        super().__init__(message)
        self.mode = mode  # None where even the header could not be read


class ModeRefused(Exception):
    """An image whose stored mode has no rule, or whose pixels the rule cannot read: what is
    wrong and what to do, for ImageReader to say with the file's name."""

    def __init__(self, why: str, fix: str):
        super().__init__(why)
        self.why, self.fix = why, fix


def stored_mode(image: Image.Image) -> str:
    """The image's PIL mode as its header says (no decoding), with TRANSPARENCY_KEY appended
    where a tRNS chunk makes some value see-through: what the data stage counts."""
    if image.mode not in ALPHA_MODES and "transparency" in image.info:
        return image.mode + TRANSPARENCY_KEY
    return image.mode


def mode_rule(mode: str) -> str | None:
    """How an image stored in `mode` (as `stored_mode` names it) is read; None: refused."""
    if mode.endswith(TRANSPARENCY_KEY):  # (a 16-bit one would be clipped on its way to RGBA)
        return OPAQUE_ONLY if mode.removesuffix(TRANSPARENCY_KEY) in KEYED_MODES else None
    return MODE_RULES.get(mode)


def to_rgb(image: Image.Image) -> Image.Image:
    """The image as 8-bit RGB by its mode's rule (MODE_RULES); ModeRefused where there is none
    or the rule refuses its pixels. Decodes it all: a truncated file fails here."""
    mode = stored_mode(image)
    rule = mode_rule(mode)
    if rule is None:
        raise ModeRefused(
            f"is stored in PIL mode {mode}, which has no rule here to be read as RGB (the modes "
            f"read: {', '.join(MODE_RULES)}, and P, L or RGB with a transparency key)",
            "convert it to 8-bit RGB (or to one of those modes)",
        )
    if rule == WIDE:
        return _stretched(image).convert("RGB")
    if rule == OPAQUE_ONLY:
        return _opaque(image.convert("RGBA"), mode)
    return image.convert("RGB")


def _stretched(image: Image.Image) -> Image.Image:
    """A 16- or 32-bit gray image linearly from its own min..max to 0..255 (module docstring)."""
    values = np.asarray(image).astype(np.float64)
    if not np.isfinite(values).all():
        raise ModeRefused(
            f"holds NaN or infinite pixel values (PIL mode {image.mode}), which no scaling to 8 bits can read",
            "replace them with finite values",
        )
    low, high = (values.min(), values.max()) if values.size else (0.0, 0.0)
    scale = 255.0 / (high - low) if high > low else 0.0
    return Image.fromarray(np.rint((values - low) * scale).astype(np.uint8), mode="L")


def _opaque(rgba: Image.Image, mode: str) -> Image.Image:
    """RGB, where no pixel is see-through; else ModeRefused (module docstring)."""
    alpha = np.asarray(rgba.getchannel("A"))
    transparent = int(np.count_nonzero(alpha < 255))
    if transparent:
        raise ModeRefused(
            f"has {transparent} transparent or translucent pixels (PIL mode {mode}), whose "
            "colour depends on the background a viewer shows them on, and which background "
            "its boxes were drawn on cannot be told",
            "flatten it onto that background (e.g. magick IN -background white -flatten OUT)",
        )
    return rgba.convert("RGB")


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
        return f"the file is truncated: its JPEG data stops after {len(data)} bytes, without the end-of-image marker"
    if data.startswith(b"\x89PNG\r\n\x1a\n") and b"IEND" not in data[-12:]:
        return f"the file is truncated: its PNG data stops after {len(data)} bytes, without the IEND chunk"
    return str(err)


def orientation_name(orientation: int) -> str:
    return f"{orientation}: {ORIENTATIONS[orientation][0]}"


@dataclass(frozen=True)
class ReadImage:
    """One image as ImageReader read it: RGB pixels, its EXIF orientation, its stored mode."""

    image: Image.Image
    orientation: int
    mode: str


@dataclass(frozen=True)
class ImageReader:
    """How a split's images are read: by training and evaluation (through CocoDetection) and by
    the data stage's check (`build_manifest`) alike, so what the data stage passed is what
    training reads. Small, so the data stage's pool sends it with each image."""

    root: Path
    split: str
    exif_orientation: str = "refuse"

    def __post_init__(self):
        if self.exif_orientation not in EXIF_MODES:
            raise ValueError(f"exif_orientation: {self.exif_orientation!r} is not one of {', '.join(EXIF_MODES)}")

    @property
    def source(self) -> Path:
        return annotation_path(self.root, self.split)

    @property
    def image_dir(self) -> Path:
        return self.root / SPLIT_DIRS[self.split]

    def read(self, info: dict) -> ReadImage:
        """Image `info` (its entry in 'images') as RGB by its mode's rule, its EXIF orientation
        and stored mode: the stored pixels, or with `apply` the pixels as a viewer shows them;
        the size checked against the annotations'. DatasetError naming the file and the remedy
        where it cannot be."""
        path = self.image_dir / info["file_name"]
        read = self._decode(path, info)
        image, orientation = read.image, read.orientation
        if orientation != 1 and self.exif_orientation == "refuse":
            raise ExifOrientationError(
                f"{path}: has EXIF orientation {orientation_name(orientation)}, so a viewer shows "
                f"it turned from its stored pixels, and data.exif_orientation is refuse; "
                f"{EXIF_REMEDY}",
                orientation,
                read.mode,
            )
        if orientation != 1 and self.exif_orientation == "apply":
            image = image.transpose(ORIENTATIONS[orientation][1])
        self._check_size(path, info, image.size, orientation)
        return ReadImage(image, orientation, read.mode)

    def _decode(self, path: Path, info: dict) -> ReadImage:
        removal = f"remove it: its entry in 'images' and its annotations in {self.source}"
        mode = None  # where even the header cannot be read
        try:
            with Image.open(path) as handle:
                self._check_format(path, handle.format)
                mode = stored_mode(handle)
                image = to_rgb(handle)
                # read after the pixels: a PNG's eXIf chunk may follow them
                orientation = handle.getexif().get(EXIF_ORIENTATION, 1)
        except DatasetError:
            raise
        except ModeRefused as err:
            raise ImageModeError(
                f"{path}: image {info['id']} {err.why}; {remedy(f'{err.fix}, or {removal}', self.root)}", mode
            ) from None
        except DECODE_ERRORS as err:
            own = f"replace the file with a readable copy, or {removal}"
            raise DatasetError(
                f"{path}: cannot decode image {info['id']}: {_why_undecodable(path, err)}; {remedy(own, self.root)}"
            ) from err
        # EXIF defines 1 to 8; anything else means 1, as it does to PIL and to viewers
        return ReadImage(image, orientation if orientation in range(2, 9) else 1, mode)

    def _check_format(self, path: Path, found: str | None) -> None:
        """The header names the format (no decoding): data that is not what its name says is
        refused, since other tools (and a re-encode to JPEG) trust the extension."""
        expected = FORMATS.get(path.suffix.lower())
        if expected and found not in expected:
            extension = EXTENSIONS.get(found or "", f".{str(found).lower()}")
            raise DatasetError(
                f"{path}: holds {found} data although its name says "
                f"{expected[0]}; re-encode it as {expected[0]}, or rename it to "
                f"{path.stem}{extension} and change its file_name in {self.source}"
            )

    def _check_size(self, path: Path, info: dict, size: tuple[int, int], orientation: int) -> None:
        if size == (info["width"], info["height"]):
            return
        hint = ""
        if orientation in (5, 6, 7, 8) and size == (info["height"], info["width"]):
            other = "ignore" if self.exif_orientation == "apply" else "apply"
            hint = (
                f" (its EXIF orientation {orientation_name(orientation)} swaps width and "
                f"height: data.exif_orientation: {other} reads it as "
                f"{info['width']}x{info['height']})"
            )
        own = (
            f"correct width and height of image {info['id']} in {self.source}, or replace "
            "the file with the image they describe"
        )
        raise DatasetError(
            f"{path}: is {size[0]}x{size[1]} but {self.source} says "
            f"{info['width']}x{info['height']}{hint}; {remedy(own, self.root)}"
        )
