"""Outputs follow the user's umask like any other tool's, and a directory the pipeline writes
whole replaces only a directory it wrote itself."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from pipeline.config import schema
from pipeline.data import coco_fetch, synthetic
from pipeline.runtime import files
from pipeline.runtime.files import (
    MARKER,
    ForeignDirectoryError,
    atomic_path,
    replacing_dir,
    save_torch,
    write_json,
    write_text,
)

from .conftest import SMALL_SYNTHETIC
from .test_coco_fetch import build_archives

TINY_DATA = schema.replaced(SMALL_SYNTHETIC, train_images=2, val_images=1)


@pytest.fixture(params=[0o022, 0o027], ids=["umask022", "umask027"])
def mask(request):
    """Run the test under this umask, then restore the previous one."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def tree_modes(root: Path) -> dict[str, set[int]]:
    """The set of modes of the root and the directories below it, and of the files."""
    found = {"dirs": {mode(root)}, "files": set()}
    for path in root.rglob("*"):
        found["dirs" if path.is_dir() else "files"].add(mode(path))
    return found


def test_umask_is_read_without_changing_it(mask):
    assert files.umask() == mask
    assert files.umask() == mask


def test_written_files_get_the_mode_open_would_give(mask, tmp_path):
    expected = 0o666 & ~mask  # 0644 under 022, 0640 under 027
    write_text(tmp_path / "report.html", "<html></html>")
    write_json(tmp_path / "sub" / "summary.json", {"a": 1})
    save_torch({"step": 1}, tmp_path / "model_final.pt")
    with atomic_path(tmp_path / "summary.csv") as tmp:
        tmp.write_text("a,b\n")
    for name in ("report.html", "sub/summary.json", "model_final.pt", "summary.csv"):
        assert mode(tmp_path / name) == expected, name
    assert mode(tmp_path / "sub") == 0o777 & ~mask
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "model_final.pt", "report.html", "sub", "summary.csv"]  # no temporary files left


def test_synthetic_dataset_follows_the_umask(mask, tmp_path):
    root = tmp_path / "synthetic"
    synthetic.generate(root, TINY_DATA)
    assert tree_modes(root) == {"dirs": {0o777 & ~mask}, "files": {0o666 & ~mask}}


def test_extracted_coco_follows_the_umask(mask, small_dataset, tmp_path):
    archives = build_archives(small_dataset, tmp_path / "archives")
    paths = {key: tmp_path / "archives" / entry["path"] for key, entry in archives.items()}
    out = tmp_path / "coco2017"
    coco_fetch.extract(paths, out, subset=2)
    assert tree_modes(out) == {"dirs": {0o777 & ~mask}, "files": {0o666 & ~mask}}


def fill(staging: Path) -> None:
    (staging / "data.txt").write_text("made here")


def test_replacing_dir_creates_marks_and_replaces_its_own(tmp_path):
    target = tmp_path / "made"
    with replacing_dir(target, {"made_by": "test", "n": 1}, remedy="move it") as staging:
        fill(staging)
        (staging / "stale.txt").write_text("only in the first")
    marker = files.read_json(target / MARKER)
    assert {k: marker[k] for k in ("made_by", "n")} == {"made_by": "test", "n": 1}
    assert sorted(marker["listing"]) == ["data.txt", "stale.txt"]  # what it held when written
    with replacing_dir(target, {"made_by": "test", "n": 2}, remedy="move it") as staging:
        fill(staging)
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "data.txt"]
    assert files.read_json(target / MARKER)["n"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["made"]  # no staging or old copy left


def test_replacing_dir_leaves_the_target_as_it_was_on_error(tmp_path):
    target = tmp_path / "made"
    with replacing_dir(target, {"made_by": "test"}, remedy="move it") as staging:
        fill(staging)
    with pytest.raises(RuntimeError, match="interrupted"):
        with replacing_dir(target, {"made_by": "test"}, remedy="move it") as staging:
            (staging / "half.txt").write_text("half")
            raise RuntimeError("interrupted")
    assert sorted(p.name for p in target.iterdir()) == [MARKER, "data.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["made"]


def made_with_annotations(target: Path) -> Path:
    with replacing_dir(target, {"made_by": "test"}, remedy="move it") as staging:
        (staging / "annotations").mkdir()
        (staging / "annotations" / "instances_val2017.json").write_text('{"images": []}')
        (staging / "val2017").mkdir()
        (staging / "val2017" / "1.jpg").write_bytes(b"pixels")
    return target


def test_a_copy_of_a_made_tree_is_replaced_only_while_it_holds_what_was_written(tmp_path):
    """A teammate's `cp -a` of a tree the pipeline made carries its marker: it is replaced while
    it holds what the marker's listing says (a JSON file rewritten with the same bytes
    included), and refused, untouched, with each difference named, once anything in it was
    added, changed or removed."""
    made = made_with_annotations(tmp_path / "made")
    annotations = Path("annotations") / "instances_val2017.json"
    edits = {"added": lambda t: (t / "notes.txt").write_bytes(b"the user's own notes\n"),
             "changed": lambda t: (t / annotations).write_text('{"images": [1]}'),
             "image changed": lambda t: (t / "val2017" / "1.jpg").write_bytes(b"pixelz"),
             "removed": lambda t: (t / "val2017" / "1.jpg").unlink(),
             "no listing": lambda t: write_json(t / MARKER, {"made_by": "an older version"})}
    said = {"added": "notes.txt (added)", "changed": f"{annotations} (changed)",
            "image changed": "val2017/1.jpg (changed)", "removed": "val2017/1.jpg (removed)",
            "no listing": "its marker lists no files"}
    for name, edit in edits.items():
        copy = tmp_path / name
        shutil.copytree(made, copy)  # as `cp -a`: file times kept
        edit(copy)
        before = snapshot(copy)
        with pytest.raises(files.EditedTreeError) as refused:
            made_with_annotations(copy)
        message = str(refused.value)
        assert said[name] in message and "left untouched" in message, message
        assert f"delete its {MARKER} file" in message and "move it away" in message
        assert snapshot(copy) == before, name
    unchanged = tmp_path / "unchanged"
    shutil.copytree(made, unchanged)
    (unchanged / annotations).write_text('{"images": []}')  # same bytes, a new time: hashed
    made_with_annotations(unchanged)
    assert files.edits(unchanged) == ""


def users(tmp_path: Path) -> dict[str, Path]:
    """What a user may have at the target: a directory, an empty one, a symlink to a directory
    (even one the pipeline made), a dangling symlink, a file."""
    ours = tmp_path / "ours"
    with replacing_dir(ours, {"made_by": "test"}, remedy="move it") as staging:
        fill(staging)
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "notes.txt").write_bytes(b"the user's own notes\n")
    (tmp_path / "empty").mkdir()
    (tmp_path / "link").symlink_to(ours)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "file").write_bytes(b"a file\n")
    return {name: tmp_path / name for name in ("dir", "empty", "link", "dangling", "file")}


def snapshot(path: Path) -> dict:
    if path.is_symlink():
        return {"link": os.readlink(path)}
    if path.is_file():
        return {"bytes": path.read_bytes(), "mode": mode(path)}
    return {str(p.relative_to(path)): snapshot(p) for p in sorted(path.rglob("*"))} | {
        ".": mode(path)}


def test_replacing_dir_refuses_what_it_did_not_make(tmp_path):
    for name, target in users(tmp_path).items():
        before = snapshot(target)
        with pytest.raises(ForeignDirectoryError) as refused:
            with replacing_dir(target, {"made_by": "test"}, remedy="move it away") as staging:
                fill(staging)
        message = str(refused.value)
        assert str(target) in message and "not made by this pipeline" in message, name
        assert message.endswith("move it away"), name
        assert snapshot(target) == before, name
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "dangling", "dir", "empty", "file", "link", "ours"]  # no staging left behind


def copy_without_times(source: Path, target: Path) -> None:
    """As `cp -r`: the same bytes, every file with the time of the copy."""
    shutil.copytree(source, target, copy_function=shutil.copy)


def test_a_copy_with_new_times_is_told_from_an_edit_and_each_remedy_works(tmp_path):
    """A `cp -r` of a generated tree (same bytes, new times) is replaced, not refused as every
    file changed; an edited one is refused, and its remedy, followed, trains on it as the user's
    own data; a listing of an older version (no hashes but JSON's) says the times alone differ."""
    import json

    from pipeline.config import params
    from pipeline.data import prepare
    from pipeline.runtime import listing

    from .conftest import REPO

    made = tmp_path / "data" / "made"
    synthetic.generate(made, SMALL_SYNTHETIC)
    copied = tmp_path / "data" / "copied"
    copy_without_times(made, copied)
    assert files.edits(copied) == ""  # each file's time differs, its bytes do not
    synthetic.generate(copied, SMALL_SYNTHETIC)  # replaced: nothing of the user's in it

    edited = tmp_path / "data" / "edited"
    copy_without_times(made, edited)
    annotations = edited / "annotations" / "instances_train2017.json"
    document = json.loads(annotations.read_text())
    document["annotations"][0]["bbox"][0] += 1  # the user's own change
    annotations.write_text(json.dumps(document))
    with pytest.raises(files.EditedTreeError) as refused:
        synthetic.generate(edited, SMALL_SYNTHETIC)
    message = str(refused.value)
    assert "annotations/instances_train2017.json (changed)" in message and message.count("(changed)") == 1, message
    assert message.endswith(synthetic.EDITED_ROOT_REMEDY)
    from .test_bad_inputs import check_readme_row

    check_readme_row("edited-generated-tree", message, root=edited)
    # the remedy: the marker deleted, a preset of the user's reads the tree as it is now
    (edited / MARKER).unlink()
    raw = params.load(REPO / "params.yaml")
    raw["presets"]["mine"] = {"extends": "demo", "data": {"name": "mine", "root": str(edited), "synthetic": None}}
    cfg = params.resolve(dict(raw, preset="mine"))
    manifest = prepare.prepare(cfg.data, str(tmp_path / "data" / "mine.manifest.json"))
    assert manifest["splits"]["train"]["sha256"] == listing.file_sha256(annotations)  # the edited file

    older = tmp_path / "data" / "older"  # a marker whose listing hashes the JSON files only
    shutil.copytree(made, older)
    marker = json.loads((older / MARKER).read_text())
    for name, entry in marker["listing"].items():
        marker["listing"][name] = entry if name.endswith(".json") else entry[:2]
    (older / MARKER).write_text(json.dumps(marker))
    retimed = tmp_path / "data" / "retimed"
    copy_without_times(older, retimed)
    said = files.edits(retimed)
    assert "(changed)" not in said and said.startswith("32 files (e.g. train2017/000000000001.jpg) differ only in their "
                                                       "modification times"), said
