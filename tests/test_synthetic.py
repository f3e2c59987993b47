"""The embedded dataset: deterministic bytes, valid COCO, informative mix of objects."""
from __future__ import annotations

import contextlib
import hashlib
import io
import json

import pytest
from pycocotools.coco import COCO

from pipeline.config import schema
from pipeline.data import prepare, synthetic
from pipeline.data.dataset import SPLIT_DIRS, annotation_path
from pipeline.runtime.files import MARKER, EditedTreeError, ForeignDirectoryError

from .conftest import SMALL_SYNTHETIC, small_config
from .test_coco_fetch import snapshot


def digest(root) -> dict[str, str]:
    """The dataset's bytes, file by file (but the marker, which records the files' times)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != MARKER}


def test_same_settings_same_bytes(tmp_path, small_dataset):
    again = tmp_path / "again"
    synthetic.generate(again, SMALL_SYNTHETIC)
    assert digest(again) == digest(small_dataset)
    other = tmp_path / "other"
    synthetic.generate(other, schema.replaced(SMALL_SYNTHETIC, seed=SMALL_SYNTHETIC.seed + 1))
    assert digest(other) != digest(small_dataset)


def test_coco_layout_loads_in_pycocotools(small_dataset):
    for split, folder in SPLIT_DIRS.items():
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(annotation_path(small_dataset, split)))
        images = coco.loadImgs(coco.getImgIds())
        assert len(images) == getattr(SMALL_SYNTHETIC, f"{split}_images")
        assert all((small_dataset / folder / img["file_name"]).is_file() for img in images)
        assert len(coco.getCatIds()) == len(synthetic.CATEGORIES)
        size = SMALL_SYNTHETIC.image_size
        for ann in coco.loadAnns(coco.getAnnIds()):
            x, y, w, h = ann["bbox"]
            assert 0 <= x and 0 <= y and x + w <= size and y + h <= size and w > 0 and h > 0
            assert 0 < ann["area"] <= w * h and ann["iscrowd"] == 0


def test_objects_span_coco_size_classes_and_categories(tmp_path):
    settings = schema.replaced(SMALL_SYNTHETIC, image_size=128, train_images=200, val_images=1)
    synthetic.generate(tmp_path / "d", settings)
    document = json.loads(annotation_path(tmp_path / "d", "train").read_text())
    areas = [a["area"] for a in document["annotations"]]
    assert sum(a < 32**2 for a in areas) > 20                # small
    assert sum(32**2 <= a < 96**2 for a in areas) > 20       # medium
    assert sum(a >= 96**2 for a in areas) >= 2               # large
    assert {a["category_id"] for a in document["annotations"]} == set(range(1, 6))
    with_objects = {a["image_id"] for a in document["annotations"]}
    assert 0 < len(document["images"]) - len(with_objects) < 20  # a few empty images, as COCO
    per_image = [sum(a["image_id"] == i["id"] for a in document["annotations"]) for i in document["images"]]
    assert max(per_image) > 1                                # several objects, some overlapping


def test_regenerating_replaces_the_whole_directory_it_wrote_and_no_file_of_the_users(tmp_path):
    root = tmp_path / "d"
    synthetic.generate(root, SMALL_SYNTHETIC)
    synthetic.generate(root, schema.replaced(SMALL_SYNTHETIC, train_images=4))
    assert len(list((root / "train2017").iterdir())) == 4
    stray = root / "train2017" / "mine.jpg"
    stray.write_bytes(b"a user's picture")
    with pytest.raises(EditedTreeError, match="train2017/mine.jpg \\(added\\)"):
        synthetic.generate(root, schema.replaced(SMALL_SYNTHETIC, train_images=3))
    assert stray.read_bytes() == b"a user's picture" and len(list((root / "train2017").iterdir())) == 5
    stray.unlink()
    synthetic.generate(root, schema.replaced(SMALL_SYNTHETIC, train_images=3))
    assert len(list((root / "train2017").iterdir())) == 3
    assert [p.name for p in tmp_path.iterdir()] == ["d"]  # no staging directories left behind


def test_a_directory_it_did_not_write_is_refused_untouched(tmp_path, small_dataset):
    user = tmp_path / "d"
    user.mkdir()
    (user / "notes.txt").write_bytes(b"the user's own notes\n")
    link = tmp_path / "link"
    link.symlink_to(small_dataset)  # a link, even to a dataset written here, is the user's
    for root in (user, link):
        before = snapshot(root), snapshot(small_dataset)
        with pytest.raises(ForeignDirectoryError, match=f"{root} already exists and was not made "
                           "by this pipeline .*: move it away, or point data.root at another"):
            synthetic.generate(root, SMALL_SYNTHETIC)
        data_cfg = small_config(root).data.model_dump()  # the data section, as the workflow passes it
        with pytest.raises(SystemExit, match=f"error: {root} already exists"):  # the data stage
            prepare.main(["--config", json.dumps(data_cfg), "--manifest", str(tmp_path / "m.json")])
        assert (snapshot(root), snapshot(small_dataset)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "link"]
