"""The bad-input catalogue: each input a user can get wrong, and the message it gets.

Every case checks that the message has the form `<file or key>: <what is wrong>; <remedy>`,
naming the file, key or value and saying what to do, and that the failure touched nothing:
what was written before (an earlier manifest or result, the dataset itself) keeps its bytes
and mtime, and nothing new (half-written) appears. README's table of messages follows these.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipeline.config import params
from pipeline.config.params import canonical
from pipeline.data import prepare
from pipeline.data.dataset import CocoDetection, DatasetError, annotation_path, build_manifest
from pipeline.strategies import sweep
from pipeline.training.train import train

from .conftest import REPO, small_config, write_coco

REFETCH = "re-fetch or regenerate the dataset"
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

def noise_jpeg(path: Path, seed: int, kind: str = "JPEG") -> None:
    """64x48 noise: its JPEG scan data is most of the file, so half the file is a cut scan."""
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
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


def duplicate_image_id(doc: dict) -> None:
    doc["images"][1]["id"] = 1


def duplicate_annotation_id(doc: dict) -> None:
    doc["annotations"][1]["id"] = 1


# (id, damage, when, what, remedy); `what` and `remedy` are functions of the dataset root.
# when: "load" fails when the dataset is opened; "decode" when the image is read (training
# reads lazily; the data stage of a synthetic dataset decodes every image).
DATA_CASES = [
    ("truncated-jpeg", truncate, "decode",
     lambda r: f"{image_file(r)}: cannot decode image 1: the file is truncated: its JPEG data "
               "stops after", lambda r: REFETCH),
    ("zero-byte-jpeg", lambda r: image_file(r).write_bytes(b""), "decode",
     lambda r: f"{image_file(r)}: cannot decode image 1: the file is empty (0 bytes)",
     lambda r: REFETCH),
    ("png-named-jpg", as_png, "decode",
     lambda r: f"{image_file(r)}: holds PNG data although its name says JPEG",
     lambda r: f"re-encode it as JPEG, or rename it to 1.png and change its file_name in {ann_file(r)}"),
    ("size-differs-from-annotations", edit(lambda doc: doc["images"][0].update(width=100)), "decode",
     lambda r: f"{image_file(r)}: is 64x48 but {ann_file(r)} says 100x48", lambda r: REFETCH),
    ("missing-image", lambda r: image_file(r).unlink(), "load",
     lambda r: f"{r / 'train2017'}: 1 image(s) listed in {ann_file(r)} are missing, e.g. ['1.jpg']",
     lambda r: REFETCH),
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
    ("unknown-image", edit(lambda doc: doc["annotations"][0].update(image_id=99)), "load",
     lambda r: f"{ann_file(r)}: annotation 1 refers to image 99, which is not in 'images'",
     lambda r: "add the image or remove the annotation"),
    ("duplicate-image-id", edit(duplicate_image_id), "load",
     lambda r: f"{ann_file(r)}: image id 1 is used by 2 entries of 'images' (1.jpg, 2.jpg)",
     lambda r: "give each image its own id"),
    ("duplicate-annotation-id", edit(duplicate_annotation_id), "load",
     lambda r: f"{ann_file(r)}: annotation id 1 is used by 2 entries of 'annotations'",
     lambda r: "give each annotation its own id"),
    ("malformed-json", lambda r: ann_file(r).write_text('{"images": ['), "load",
     lambda r: f"{ann_file(r)}: not valid JSON (Expecting value, line 1)", lambda r: REFETCH),
    ("json-list", lambda r: ann_file(r).write_text("[]"), "load",
     lambda r: f"{ann_file(r)}: is a JSON list, not a COCO annotation object (images, "
               "annotations, categories)", lambda r: REFETCH),
    ("empty-annotation-file", lambda r: ann_file(r).write_bytes(b""), "load",
     lambda r: f"{ann_file(r)}: is empty (0 bytes)", lambda r: REFETCH),
    ("missing-section", edit(lambda doc: doc.pop("annotations")), "load",
     lambda r: f"{ann_file(r)}: missing the 'annotations' list of a COCO annotation file",
     lambda r: REFETCH),
]


@pytest.mark.parametrize("case", DATA_CASES, ids=[c[0] for c in DATA_CASES])
def test_bad_data(case, tmp_path):
    _, damage, when, what, remedy = case
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    damage(root)
    manifest = tmp_path / "data" / "mine.manifest.json"
    write_earlier(manifest, '{"earlier": true}\n')
    before = snapshot(tmp_path)

    # The data stage: it validates (and, for a synthetic dataset, decodes) before it writes.
    with pytest.raises(DatasetError) as err:
        build_manifest(root, decode_images=True)
    assert_message(str(err.value), what(root), remedy(root))
    if when == "load":  # the data stage as it runs for a dataset it did not make
        with pytest.raises(DatasetError) as err:
            prepare.prepare({"root": str(root), "synthetic": None, "fetch": None}, str(manifest))
        assert_message(str(err.value), what(root), remedy(root))
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
    _, bbox, skipped, clamped, warning = case
    root = tmp_path / "data" / "mine"
    good_dataset(root)
    set_bbox(bbox)(root)
    before = snapshot(tmp_path)
    with caplog.at_level(logging.WARNING, logger="pipeline.data.dataset"):
        evaluation = CocoDetection(root, "train", train=False)
        manifest = build_manifest(root, decode_images=True)
    assert f"{ann_file(root)}: {warning}" in caplog.text
    assert evaluation.skipped == skipped and evaluation.clamped == clamped
    assert manifest["splits"]["train"]["skipped"] == skipped
    boxes = evaluation.target(0)["boxes"].tolist()
    assert boxes == ([[60, 40, 64, 48]] if clamped else [])
    assert snapshot(tmp_path) == before


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
    del raw["defaults"]["train"]["momentum"]  # no preset sets it: it comes from defaults


DEMO = "params.yaml: presets.demo"
PARAMS_CASES = [
    ("wrong-type", set_train(epochs="ten"),
     f"{DEMO}.train.epochs: 'ten' is not of type 'integer'", "write a whole number"),
    ("quoted-number", set_train(epochs="10"),
     f"{DEMO}.train.epochs: '10' is not of type 'integer'", "write a whole number, without quotes"),
    ("wrong-type-nullable", lambda raw: raw["presets"]["coco2017"]["data"]["fetch"].update(subset="all"),
     "params.yaml: presets.coco2017.data.fetch.subset: 'all' is not of type 'null' or 'integer'",
     "write null or a whole number"),
    ("unknown-key", unknown_key,
     f"{DEMO}.train: unknown key 'lr_step' (did you mean 'lr_steps'?)", "allowed keys: base_batch, "),
    ("missing-key", missing_key,
     f"{DEMO}.train: 'momentum' is a required property", "add it (see the demo preset"),
    ("not-one-of", lambda raw: demo(raw)["model"].update(arch="resnet9000"),
     f"{DEMO}.model.arch: 'resnet9000' is not one of ['tiny', 'fasterrcnn_resnet50_fpn']",
     "use one of those"),
    ("negative-epochs", set_train(epochs=-1),
     f"{DEMO}.train.epochs: -1 is less than the minimum of 1", "set it to 1 or more"),
    ("nested-negative", lambda raw: demo(raw)["data"]["synthetic"].update(train_images=-5),
     f"{DEMO}.data.synthetic.train_images: -5 is less than the minimum of 1", "set it to 1 or more"),
    ("unknown-preset", lambda raw: raw.update(preset="coco2014"),
     "params.yaml: preset: 'coco2014' is not one of the presets (demo, demo-parity, coco2017, coco2017-quick)",
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
]


@pytest.mark.parametrize("case", PARAMS_CASES, ids=[c[0] for c in PARAMS_CASES])
def test_bad_params(case, tmp_path, monkeypatch):
    _, change, what, remedy = case
    monkeypatch.chdir(tmp_path)  # where the workflow would write
    write_earlier(tmp_path / "results" / "runs" / "demo" / "single-w1-b8-s0" / "train_summary.json",
                  '{"status": "ok"}\n')
    before = snapshot(tmp_path)
    raw = params.load(REPO / "params.yaml")
    change(raw)
    with pytest.raises(params.ParamsError) as err:
        sweep.runs(params.resolve(raw))  # as the Snakefile does, before any job
    assert_message(str(err.value), what, remedy)
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
    """A run stopped after its step-2 checkpoint: (cfg, run, its directory)."""
    cfg = small_config(small_dataset, epochs=1)
    cfg["train"]["checkpoint_every"] = 2
    run = next(iter(sweep.runs(cfg).values()))
    out = tmp_path_factory.mktemp("checkpointed") / "results" / "runs" / "demo" / sweep.run_id(run)
    train(cfg, run, out, max_steps=3)
    assert (out / "state" / "checkpoint.pt").exists()
    return cfg, run, out


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
    command = [sys.executable, "-m", "pipeline.training.train", "--config", canonical(cfg),
               "--entry", canonical(run), "--out", str(out)]
    if setup:
        # Inside the namespace, after the run: the checkpoint still there, byte for byte.
        check = f"cmp {out}/state/checkpoint.pt {checkpointed[2]}/state/checkpoint.pt && ls -a {out}/state"
        command = in_mount_namespace(setup[0], ["sh", "-c", '"$@"; rc=$?; ' + check + '; exit $rc',
                                                "sh", *command])
    result = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error: "), result.stderr[-3000:]
    assert_message(error.removeprefix("error: "), what, remedy)
    if setup:  # what the namespace saw: the checkpoint intact, no temporary left beside it
        assert ".tmp" not in result.stdout and "checkpoint.pt" in result.stdout, result.stdout
    if case != "disk-full-writing-a-checkpoint":
        assert snapshot(out) == before
