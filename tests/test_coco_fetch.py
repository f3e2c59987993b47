"""COCO 2017 through DVC, against a real HTTP server on 127.0.0.1 serving COCO-layout archives
built from the embedded dataset: download, verify, resume, refuse, extract, push, pull; and a
user's directory at data.root is used as it is or refused, never deleted."""
from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml
from PIL import Image
from torchvision.models import resnet50

from pipeline.config import schema, stages
from pipeline.config.params import load_resolved
from pipeline.data.coco_fetch import FetchError, check_free_space, download, extract
from pipeline.data.dataset import CocoDetection
from pipeline.report import paper
from pipeline.runtime.files import MARKER, read_json

from .conftest import HANG_S, REPO
from .http_server import Server
from .workflow import jobs, on_disk

ARCHIVES = {"annotations": "annotations/annotations_trainval2017.zip",
            "train2017": "zips/train2017.zip", "val2017": "zips/val2017.zip"}


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def snapshot(path: Path) -> dict:
    """Everything about a tree that a data stage must leave alone: links, bytes, modes."""
    if path.is_symlink():
        return {"link": os.readlink(path)}
    if path.is_file():
        return {"bytes": path.read_bytes(), "mode": path.stat().st_mode}
    return {str(p.relative_to(path)): snapshot(p) for p in sorted(path.rglob("*"))} | {
        ".": path.stat().st_mode}


def build_archives(dataset: Path, out: Path) -> dict[str, dict]:
    """The official archives' layout: annotations/..., train2017/..., val2017/... inside."""
    for key, relative in ARCHIVES.items():
        target = out / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as archive:
            if key == "annotations":
                for split in ("train2017", "val2017"):
                    archive.write(dataset / "annotations" / f"instances_{split}.json",
                                  f"annotations/instances_{split}.json")
                archive.writestr("annotations/captions_train2017.json", "{}")  # not for detection
            else:
                archive.writestr(f"{key}/", "")
                for image in sorted((dataset / key).iterdir()):
                    archive.write(image, f"{key}/{image.name}")
    return {key: {"path": rel, "md5": md5(out / rel), "size": (out / rel).stat().st_size}
            for key, rel in ARCHIVES.items()}


# (width, height) of the served images in turn: landscape, portrait and square, as in COCO.
SIZES = [(128, 96), (96, 128), (160, 96), (96, 160), (112, 112), (144, 80)]


def varied_sizes(dataset: Path, out: Path) -> Path:
    """The embedded dataset with each image resized to one of SIZES (its boxes with it) and
    written again as JPEG: a COCO layout whose images differ in size and aspect ratio."""
    shutil.copytree(dataset, out, ignore=shutil.ignore_patterns(MARKER))
    for split in ("train2017", "val2017"):
        path = out / "annotations" / f"instances_{split}.json"
        document = json.loads(path.read_text())
        scale = {}
        for i, image in enumerate(document["images"]):
            width, height = SIZES[i % len(SIZES)]
            file = out / split / image["file_name"]
            with Image.open(file) as pixels:
                pixels.convert("RGB").resize((width, height)).save(file, "JPEG", quality=90)
            scale[image["id"]] = (width / image["width"], height / image["height"])
            image.update(width=width, height=height)
        for annotation in document["annotations"]:
            sx, sy = scale[annotation["image_id"]]
            x, y, w, h = annotation["bbox"]
            annotation["bbox"] = [x * sx, y * sy, w * sx, h * sy]
            annotation["area"] = w * sx * h * sy
        path.write_text(json.dumps(document))
    return out


def hashed_backbone(out: Path) -> Path:
    """A ResNet-50 state dict named as torchvision names its downloads: resnet50-<sha256[:8]>.pth
    (random weights: what is tested is how they are fetched, checked and loaded)."""
    out.mkdir(parents=True)
    staging = out / "resnet50.pth"
    torch.manual_seed(0)
    torch.save(resnet50(weights=None).state_dict(), staging)
    digest = hashlib.sha256(staging.read_bytes()).hexdigest()
    return staging.rename(out / f"resnet50-{digest[:8]}.pth")


@pytest.fixture(scope="module")
def served(small_dataset, tmp_path_factory):
    """COCO's three archives (MD5s as published in params.yaml) and a backbone .pth, over HTTP."""
    root = tmp_path_factory.mktemp("served")
    archives = build_archives(varied_sizes(small_dataset, tmp_path_factory.mktemp("varied") / "coco"),
                              root)
    hashed_backbone(root / "weights")
    with Server(root) as server:
        yield server, archives


def test_download_resumes_after_a_cut_and_verifies(served, tmp_path):
    server, archives = served
    entry = archives["train2017"]
    server.cut_after["/" + entry["path"]] = entry["size"] // 2
    before = len(server.requests)
    dest = download(f"{server.url}/{entry['path']}", tmp_path / "train2017.zip", entry["md5"],
                    backoff=0.01)
    assert md5(dest) == entry["md5"]
    gets = [r for r in server.requests[before:] if r["method"] == "GET"]
    assert len(gets) == 2 and gets[0]["range"] is None
    assert gets[1]["range"] == f"bytes={entry['size'] // 2}-"  # resumed, not restarted
    assert not (tmp_path / "train2017.zip.part").exists()
    again = len(server.requests)
    download(f"{server.url}/{entry['path']}", dest, entry["md5"])  # present and verified: no traffic
    assert len(server.requests) == again


def test_a_download_shows_its_bytes_rate_and_time_left(served, tmp_path, capfd):
    """tqdm on stderr: the archive's name, bytes of its total size, the rate; in a log (not a
    terminal) each update on a line of its own."""
    from tqdm import tqdm

    server, archives = served
    entry = archives["val2017"]
    download(f"{server.url}/{entry['path']}", tmp_path / "val2017.zip", entry["md5"])
    lines = capfd.readouterr().err.splitlines()
    total = tqdm.format_sizeof(entry["size"], divisor=1024)
    assert lines[0].startswith("val2017.zip:   0%") and f"0.00/{total} [" in lines[0]
    assert re.match(rf"val2017\.zip: 100%\|#+\| {re.escape(total)}/{re.escape(total)} "
                    r"\[[\d:]+<00:00, +[\d.]+[kMG]?B/s\]$", lines[-1]), lines


def test_checksum_mismatch_keeps_the_file_out(served, tmp_path):
    server, archives = served
    entry = archives["val2017"]
    with pytest.raises(FetchError, match=r"MD5 [0-9a-f]{32} does not match the expected 0{32}"):
        download(f"{server.url}/{entry['path']}", tmp_path / "val2017.zip", "0" * 32)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FetchError, match="got .* bytes, expected 12"):
        download(f"{server.url}/{entry['path']}", tmp_path / "val2017.zip", None, size=12)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(FetchError, match="HTTP 404"):
        download(f"{server.url}/nope.zip", tmp_path / "nope.zip", None)


def test_zip_slip_is_refused(tmp_path):
    for evil in ("../escaped.txt", "/tmp/absolute.txt", "val2017/../../escaped.txt"):
        archive = tmp_path / "evil.zip"
        with zipfile.ZipFile(archive, "w") as z:
            z.writestr("val2017/1.jpg", b"x")
            z.writestr(evil, b"gotcha")
        with pytest.raises(FetchError, match="would be written outside the dataset directory"):
            extract({"val2017": archive}, tmp_path / "out")
        assert not (tmp_path / "out").exists() and not (tmp_path.parent / "escaped.txt").exists()


def test_interrupted_extraction_never_looks_complete(served, tmp_path):
    _, archives = served
    good = served[0].directory
    broken = tmp_path / "val2017.zip"
    data = bytearray((good / archives["val2017"]["path"]).read_bytes())
    data[len(data) // 2] ^= 0xFF  # damage one stored image: its CRC check fails mid-way
    broken.write_bytes(bytes(data))
    paths = {"annotations": good / archives["annotations"]["path"], "val2017": broken}
    with pytest.raises(zipfile.BadZipFile):
        extract(paths, tmp_path / "coco2017")
    assert not (tmp_path / "coco2017").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["val2017.zip"]  # no staging left behind


def test_extract_subset_and_load(served, tmp_path):
    server, archives = served
    paths = {k: server.directory / v["path"] for k, v in archives.items()}
    counts = extract(paths, tmp_path / "coco2017", subset=3)
    assert counts["val2017 images extracted"] == 3 and counts["train2017 images extracted"] == 3
    assert sorted(p.name for p in (tmp_path / "coco2017" / "annotations").iterdir()) == [
        "instances_train2017.json", "instances_val2017.json"]
    dataset = CocoDetection(tmp_path / "coco2017", "val", train=False)
    assert len(dataset) == 3 and dataset[2][0].shape[0] == 3


def test_extract_replaces_only_its_own_tree(served, tmp_path):
    server, archives = served
    paths = {k: server.directory / v["path"] for k, v in archives.items()}
    md5s = {k: v["md5"] for k, v in archives.items()}
    out = tmp_path / "coco2017"
    extract(paths, out, subset=2, md5s=md5s)
    marker = read_json(out / MARKER)
    assert marker["archives"]["val2017"] == {"file": "val2017.zip", "md5": md5s["val2017"]}
    assert marker["subset"] == 2
    extract(paths, out, subset=3, md5s=md5s)  # its own tree: replaced
    assert len(list((out / "val2017").iterdir())) == 3 and read_json(out / MARKER)["subset"] == 3

    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_bytes(b"the user's own notes\n")
    link = tmp_path / "link"
    link.symlink_to(out)  # even a link to a tree extracted here is the user's link
    for target in (user, link):
        before = snapshot(target), snapshot(out)
        with pytest.raises(FetchError) as refused:
            extract(paths, target, subset=2)
        assert str(target) in str(refused.value)
        assert "move it away" in str(refused.value) and "uses a COCO 2017 layout at data.root as it is" in str(refused.value)
        assert (snapshot(target), snapshot(out)) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["coco2017", "link", "user"]


def test_free_space_is_checked_first(tmp_path):
    with pytest.raises(FetchError, match=r"needs 1000000000.00 GB in .* free space or point"):
        check_free_space(tmp_path / "not-yet", 10**18, "extracting everything")


# ---- the real DVC and Snakemake path ------------------------------------------------------

def attempt(command, cwd, **kwargs) -> subprocess.CompletedProcess:
    """Run `command` with this interpreter's bin first on PATH (DVC's stages run `python`)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=HANG_S, env=env,
                          **kwargs)


def run(command, cwd, **kwargs):
    result = attempt(command, cwd, **kwargs)
    assert result.returncode == 0, f"{command}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result.stdout + result.stderr


def test_dvc_yaml_extracts_every_preset_that_fetches():
    """dvc.yaml's coco_extract stages are the presets that set data.fetch: each extracts into
    its own data.root from the one download, which reads coco2017's archive list."""
    presets = yaml.safe_load((REPO / "params.yaml").read_text())["presets"]
    configs = {name: load_resolved(REPO / "params.yaml", name).data for name in presets}
    fetching = [name for name, data in configs.items() if data.fetch]
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["coco_extract"]
    assert stage["foreach"] == fetching and "coco2017-quick" in fetching
    assert stage["do"]["outs"] == [{"data/${item}": {"cache": False, "persist": True}}]
    shared = ("base_url", "splits", "archives")
    for name in fetching:
        assert configs[name].name == name and configs[name].root == f"data/{name}"
        assert {k: getattr(configs[name].fetch, k) for k in shared} == {
            k: getattr(configs["coco2017"].fetch, k) for k in shared}


def test_dvc_yaml_deps_are_the_files_the_stages_execute():
    """dvc.yaml's deps are no hand-kept list: the synthetic stage's are the files the
    Snakefile's data rule declares (pipeline/config/stages.py: code_files), the COCO stages'
    those that running pipeline.data.coco_fetch executes; so `dvc status` and Snakemake agree on
    which edits make the data stale."""
    dvc_stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    expected = {"synthetic": stages.code_files("data"),
                "coco_download": list(stages.module_files("pipeline.data.coco_fetch")),
                "coco_extract": ["data/archives/coco2017",
                                 *stages.module_files("pipeline.data.coco_fetch")]}
    for name, files in expected.items():
        deps = dvc_stages[name].get("do", dvc_stages[name])["deps"]
        paste = "".join(f"\n  - {f}" for f in files)
        assert deps == files, f"dvc.yaml: set the deps of stage {name} to:{paste}"


def test_dvc_checks_out_nothing_but_the_archives():
    """`dvc pull` and `dvc checkout` write only cached outputs, deleting (with --force) whatever
    their paths hold first. The one cached output is the archives' directory, which the pipeline
    owns; every dataset tree (data/synthetic, data/<preset>), where a user may put their own, is
    uncached, and every output persists: `dvc repro` deletes none before its stage runs."""
    outs = {}
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values():
        for out in stage.get("do", stage)["outs"]:
            ((path, flags),) = out.items() if isinstance(out, dict) else [(out, {})]
            outs[path] = flags
    assert sorted(outs) == ["data/${item}", "data/archives/coco2017", "data/synthetic"]
    assert [path for path, flags in outs.items() if flags.get("cache", True)] == [
        "data/archives/coco2017"]
    assert all(flags.get("persist") for flags in outs.values())


def coco_repo(repo: Path, server, archives) -> None:
    """A committed copy of the project whose coco2017 preset fetches from `server`: the recipe
    as it is (fasterrcnn_resnet50_fpn with its backbone weights, downloaded over HTTP with the
    hash check; aspect-ratio groups; data.workers auto; evaluation at batch 1), shrunk only in
    what costs minutes on 2 CPU cores: 12 training images for one epoch, images resized to
    64-96 px instead of 800-1333, and single and ddp at 2 processes (every other strategy
    runs through the same workflow in the demo's tests: tests/workflow.py)."""
    for name in ("Snakefile", "rules", "params.yaml", "dvc.yaml", "pipeline", "paper", ".dvc", ".dvcignore",
                 ".gitignore"):
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, repo / name, ignore=shutil.ignore_patterns("__pycache__", "tmp", "config.local"))
        else:
            repo.mkdir(exist_ok=True)
            shutil.copy2(source, repo / name)
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    coco = raw["presets"]["coco2017"]
    coco["data"]["fetch"].update(base_url=server.url, archives=archives, subset=12)
    (weights,) = (server.directory / "weights").iterdir()
    # 64-96 px: R50-FPN's smallest pyramid level still has cells (the GPU check's CPU smoke
    # trains it at 64 px), and each step costs a quarter of one at 128-192 px
    coco["model"].update(backbone_weights=f"{server.url}/weights/{weights.name}", min_size=64,
                         max_size=96)
    coco["train"].update(epochs=1, lr_steps=[], print_every=1)
    coco["commbench"] = {"max_bytes": 2**20, "repeats": 3, "compute_images": 1, "compute_repeats": 2,
                         "retries": 0}  # as tests/workflow.py: tiny_params
    coco["resources"] = {"memory_mb_per_process": 4096, "cpus_per_process": 1}
    coco["sweep"] = [{"strategy": "single", "workers": 1},
                     {"strategy": "ddp", "workers": 2}]
    raw["preset"] = "coco2017"
    (repo / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    run(["git", "init", "-q"], repo)
    run(["git", "add", "-A"], repo)
    run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy"], repo)


@pytest.mark.slow
def test_a_users_directory_at_data_root_is_used_or_refused_never_deleted(served, small_dataset,
                                                                          tmp_path):
    """The data stage with real DVC: a user's COCO copy (a directory, or a symlink to one) is
    used as it is with no download and no DVC command (dvc repro would first delete it); a
    directory without COCO in it is refused. Either way it stays byte for byte as it was."""
    server, archives = served
    repo = tmp_path / "repo"
    coco_repo(repo, server, archives)
    root = repo / "data" / "coco2017"
    team_copy = tmp_path / "team" / "coco2017"
    shutil.copytree(small_dataset, team_copy, ignore=shutil.ignore_patterns(MARKER))
    prepare = [sys.executable, "-m", "pipeline.data.prepare", "--params", "params.yaml",
               "--preset", "coco2017", "--manifest", "data/coco2017.manifest.json"]

    def data_stage(expect_ok: bool) -> str:
        requests = len(server.requests)
        result = subprocess.run(prepare, cwd=repo, capture_output=True, text=True, timeout=HANG_S)
        assert (result.returncode == 0) == expect_ok, result.stderr[-3000:]
        assert len(server.requests) == requests  # nothing downloaded
        assert "running dvc" not in result.stderr and not (repo / "dvc.lock").exists()
        return result.stderr

    shutil.copytree(team_copy, root)  # a copy with a user's file in it
    (root / "notes.txt").write_bytes(b"the user's own notes\n")
    before = snapshot(root)
    log = data_stage(expect_ok=True)
    assert ("data/coco2017 already holds a COCO 2017 layout (not made by this pipeline): using it "
            "as it is, without downloading") in log
    assert snapshot(root) == before
    assert read_json(repo / "data" / "coco2017.manifest.json")["splits"]["val"]["images"] == 8

    shutil.rmtree(root)
    root.symlink_to(team_copy)  # a link to a copy elsewhere
    before = snapshot(root), snapshot(team_copy)
    assert "using it as it is, without downloading" in data_stage(expect_ok=True)
    assert (snapshot(root), snapshot(team_copy)) == before

    root.unlink()
    root.mkdir()
    (root / "notes.txt").write_bytes(b"the user's own notes\n")  # no COCO in it: refused
    log = data_stage(expect_ok=False)
    assert "error: data/coco2017 already exists, was not made by this pipeline" in log
    assert "annotations/instances_train2017.json" in log and "move it away" in log
    assert [p.name for p in root.iterdir()] == ["notes.txt"]
    assert (root / "notes.txt").read_bytes() == b"the user's own notes\n"


def readme_dvc_commands() -> list[list[str]]:
    """The DVC commands the README's "COCO 2017 through DVC" tells a user to run (but for
    `dvc remote add`): in its shell block, each `dvc ...` between `&&`s, comments dropped."""
    block = readme_team_block()
    commands = []
    for line in block.splitlines():
        for part in line.split("#")[0].split("&&"):
            words = part.split()
            if words[:1] == ["dvc"] and words[1:3] != ["remote", "add"]:
                commands.append(words[1:])
    return commands


# What DVC's own messages suggest besides: "Can't remove the following unsaved files without
# confirmation. Use `--force` to force." (what `dvc pull` and `dvc checkout` said to a user's
# tree while DVC cached it), and "Use `dvc push`" after a repro; and what a user tries next.
DVC_SUGGESTS = [["pull"], ["pull", "--force"], ["checkout"], ["checkout", "--relink"],
                ["checkout", "--force"], ["repro", "coco_extract@coco2017"],
                ["repro", "--force", "coco_extract@coco2017-quick"], ["push"], ["status"]]


@pytest.mark.slow
def test_dvc_commands_leave_a_users_trees_alone(served, small_dataset, tmp_path):
    """With dvc.lock pinning both extracted trees (a teammate's fetch) and the team remote
    holding the data, a user's own trees in their place: a copy at data/coco2017-quick with a
    file of the user's in it, a symlink at data/coco2017 to a copy elsewhere. Every DVC command
    the README suggests, and every one DVC's messages suggest (--force included), leaves both
    byte for byte as they were, the link a link; the extract stage refuses them, naming them."""
    server, archives = served
    repo = tmp_path / "repo"
    coco_repo(repo, server, archives)
    dvc = [sys.executable, "-m", "dvc"]
    trees = {name: repo / "data" / name for name in ("coco2017-quick", "coco2017")}
    run(dvc + ["repro"] + [f"coco_extract@{name}" for name in trees], repo)
    run(dvc + ["remote", "add", "-d", "team", str(tmp_path / "team-remote")], repo)
    run(dvc + ["push"], repo)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())["stages"]
    assert all(lock[f"coco_extract@{name}"]["outs"][0]["md5"] for name in trees)

    elsewhere = tmp_path / "team" / "coco2017"
    shutil.copytree(small_dataset, elsewhere, ignore=shutil.ignore_patterns(MARKER))
    for tree in trees.values():
        shutil.rmtree(tree)
    shutil.copytree(elsewhere, trees["coco2017-quick"])
    (trees["coco2017-quick"] / "notes.txt").write_bytes(b"the user's own notes\n")
    trees["coco2017"].symlink_to(elsewhere)
    before = {path: snapshot(path) for path in (*trees.values(), elsewhere)}
    assert before[trees["coco2017"]] == {"link": str(elsewhere)}

    commands = readme_dvc_commands() + DVC_SUGGESTS
    assert ["pull", "coco_download"] in commands and ["checkout", "--relink"] in commands
    for command in commands:
        result = attempt(dvc + command, repo)
        output = result.stdout + result.stderr
        stage = next((word for word in command if word.startswith("coco_extract@")), None)
        if command[0] == "repro" and stage:  # the user's tree is in the way: refused, named
            name = stage.split("@")[1]
            assert result.returncode != 0, output
            assert (f"error: data/{name} already exists and was not made by this pipeline"
                    in output and "so it was left untouched" in output), output
        else:
            assert result.returncode == 0, f"dvc {' '.join(command)}:\n{output}"
        after = {path: snapshot(path) for path in before}
        assert after == before, f"dvc {' '.join(command)} changed a user's tree:\n{output}"


@pytest.mark.slow
def test_the_coco_recipe_end_to_end_then_push_pull_without_retraining(served, tmp_path, monkeypatch):
    """The coco2017 path as a GPU user runs it, on CPU through the real workflow: DVC fetches
    and extracts the served archives, R50-FPN trains as single and ddp, is scored, reported
    and written up; then DVC shares the archives through a remote, another copy extracts its
    tree from them, and nothing retrains."""
    server, archives = served
    repo = tmp_path / "repo"
    coco_repo(repo, server, archives)
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch-home"))  # where the backbone is cached
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "2"]
    dvc = [sys.executable, "-m", "dvc"]

    run(snakemake, repo)  # data rule: dvc repro (download, verify, extract) -> train -> report
    # each archive's download shown in the data stage's log as it came (tqdm, through DVC)
    data_log = (repo / "logs" / "data" / "coco2017.log").read_text()
    assert all(re.search(rf"^{name}\.zip: 100%.*B/s\]$", data_log, re.MULTILINE)
               for name in ("annotations_trainval2017", "train2017", "val2017")), data_log[-3000:]
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    assert lock["stages"]["coco_download"]["outs"][0]["md5"]  # the archives are pinned
    assert lock["stages"]["coco_extract@coco2017"]["outs"][0]["md5"]  # the tree too, uncached
    table = repo / "results" / "summary" / "coco2017.csv"  # results/<kind>/<preset>
    rows = {row["run_id"]: row for row in csv.DictReader(table.open())}
    assert sorted(rows) == ["ddp-w2-b2-s0", "single-w1-b2-s0"]
    for run_id, row in rows.items():
        assert row["status"] == "ok" and row["replicas_identical"] == "True", run_id
        assert 0 <= float(row["AP"]) <= 1, run_id
        assert float(row["busiest_rank_bytes_per_iter"]) == pytest.approx(
            float(row["busiest_rank_theory_bytes_per_iter"]), rel=1e-6), run_id
        log = (repo / "logs" / "train" / "coco2017" / f"{run_id}.log").read_text()
        # COCO's mix of shapes, grouped as the recipe does; a loader process beside each trainer
        groups = re.search(r"in (\d+) aspect-ratio group\(s\), 1 worker process\(es\) per process", log)
        assert groups and int(groups[1]) > 1, log[-3000:]
        metrics = json.loads((repo / "results" / "runs" / "coco2017" / run_id / "metrics.json").read_text())
        assert metrics["images"] == 8 and metrics["batch_size"] == 1
        summary = json.loads((repo / "results" / "runs" / "coco2017" / run_id /
                              "train_summary.json").read_text())
        assert summary["iterations"] > 0
    assert [p.name for p in (tmp_path / "torch-home").rglob("*.pth")] == [
        next((server.directory / "weights").iterdir()).name]  # downloaded once, checked, cached
    assert (repo / "results" / "report" / "coco2017" / "report.html").is_file()
    if not paper.missing_tools():
        assert (repo / "results" / "paper" / "coco2017" / "paper.pdf").stat().st_size > 0
    assert len(CocoDetection(repo / "data" / "coco2017", "val", train=False)) == 8
    archive = repo / "data" / "archives" / "coco2017" / "val2017.zip"
    assert archive.stat().st_nlink == 2  # the archives link to DVC's cache: one copy on disk
    image = next((repo / "data" / "coco2017" / "val2017").iterdir())
    assert image.stat().st_nlink == 1  # the tree is no DVC output to check out: a plain copy

    def elsewhere() -> None:
        """A machine with this project and its dvc.lock, but none of the data."""
        for made in ("data/coco2017", "data/archives", ".dvc/cache"):
            shutil.rmtree(repo / made)

    remote = tmp_path / "team-remote"
    run(dvc + ["remote", "add", "-d", "team", str(remote)], repo)
    run(dvc + ["push"], repo)
    assert len([p for p in remote.rglob("*") if p.is_file()]) == 4  # the 3 archives and their list
    elsewhere()
    served_before = len(server.requests)
    run(dvc + ["pull", "coco_download"], repo)  # as the README says
    run(dvc + ["repro", "coco_extract@coco2017"], repo)
    assert len(server.requests) == served_before  # from the remote, not the internet
    assert len(CocoDetection(repo / "data" / "coco2017", "train", train=True)) > 0
    assert "Nothing to be done" in run(snakemake + ["--dry-run"], repo)  # new file times: no retraining

    # The data rule itself prefers the remote once one is configured.
    elsewhere()
    data_cfg = load_resolved(repo / "params.yaml", "coco2017").data  # as the Snakefile passes it
    data_cfg = schema.replaced(data_cfg, fetch={"remote": str(remote)})
    output = run([sys.executable, "-m", "pipeline.data.prepare", "--config", json.dumps(data_cfg.model_dump()),
                  "--manifest", "data/coco2017.manifest.json"], repo)
    assert f"extracted from the archives (pulled from {remote})" in output
    assert len(server.requests) == served_before
    assert archive.stat().st_nlink == 2 and len(CocoDetection(repo / "data" / "coco2017", "val",
                                                              train=False)) == 8


@pytest.mark.slow
def test_an_edited_copy_of_the_extracted_tree_is_refused_or_used_as_planned(served, tmp_path):
    """The issue's reproduction, through the real Snakemake and DVC: data/coco2017 extracted by
    the data rule, replaced by a teammate's `cp -a` copy of it, a file added to it and one
    validation annotation deleted. The planner says the data stage will refuse it, and it does,
    naming both; `dvc repro` refuses it too; nothing in it changes. With its marker deleted (the
    remedy) the data stage uses it as it is. A dry run
    writes nothing; an annotation file put back byte for byte (a new time) plans nothing."""
    server, archives = served
    repo = tmp_path / "repo"
    coco_repo(repo, server, archives)
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "2"]
    manifest = "data/coco2017.manifest.json"
    root, team = repo / "data" / "coco2017", tmp_path / "team"
    run(snakemake + ["--", manifest], repo)  # data rule: DVC downloads and extracts
    val_boxes = read_json(repo / manifest)["splits"]["val"]["boxes"]

    run(["cp", "-a", str(root), str(team)], repo)
    shutil.rmtree(root)
    run(["cp", "-a", str(team), str(root)], repo)
    (root / "notes.txt").write_bytes(b"the user's own notes\n")
    annotations = root / "annotations" / "instances_val2017.json"
    document = json.loads(annotations.read_text())
    document["annotations"].pop()
    annotations.write_text(json.dumps(document))
    edits = ("data/coco2017 was made by this pipeline, but is not as it was written: notes.txt "
             "(added), annotations/instances_val2017.json (changed)")
    before = on_disk(repo)
    planned = attempt(snakemake + ["-n", "--", manifest], repo)
    assert on_disk(repo) == before  # planning wrote nothing
    assert jobs(planned) == {"data": 1}
    assert ("data/coco2017 changed since data/coco2017.manifest.json (annotations/"
            "instances_val2017.json: other contents): the data stage refuses it, untouched"
            in planned.stderr), planned.stderr[-3000:]
    assert "notes.txt (added), annotations/instances_val2017.json (changed)" in planned.stderr
    tree = snapshot(root)
    refused = attempt(snakemake + ["--", manifest], repo)
    assert refused.returncode != 0
    log = (repo / "logs" / "data" / "coco2017.log").read_text()
    assert edits in log and "running dvc" not in log, log[-3000:]
    assert f"delete its {MARKER} file" in log
    repro = attempt([sys.executable, "-m", "dvc", "repro", "coco_extract@coco2017"], repo)
    assert repro.returncode != 0 and edits in repro.stdout + repro.stderr
    assert snapshot(root) == tree

    (root / MARKER).unlink()  # the remedy: the tree is now the user's, used as it is
    # (Snakemake removed the manifest when the refused job started: no record to compare with)
    assert jobs(attempt(snakemake + ["-n", "--", manifest], repo)) == {"data": 1}
    used = run(snakemake + ["--", manifest], repo)
    assert read_json(repo / manifest)["splits"]["val"]["boxes"] == val_boxes - 1, used[-3000:]
    assert "using it as it is, without downloading" in (repo / "logs" / "data" / "coco2017.log").read_text()
    assert (root / "notes.txt").read_bytes() == b"the user's own notes\n"
    assert jobs(attempt(snakemake + ["-n", "--", manifest], repo)) == {}

    kept = annotations.read_bytes()
    annotations.write_text(json.dumps(dict(document, annotations=[])))
    assert jobs(attempt(snakemake + ["-n", "--", manifest], repo)) == {"data": 1}
    annotations.write_bytes(kept)  # put back byte for byte, with a new time
    before = on_disk(repo)
    assert jobs(attempt(snakemake + ["-n", "--", manifest], repo)) == {}
    assert on_disk(repo) == before


def readme_team_block() -> str:
    """The README's shell block that shares the archives through a team remote: the first one
    under its heading "COCO 2017 through DVC" (of any level)."""
    section = re.split(r"\n#+ COCO 2017 through DVC\n", (REPO / "README.md").read_text())[1]
    return section.split("```sh\n")[1].split("```")[0]


@pytest.mark.slow
def test_the_readme_team_block_shares_the_archives_between_two_fresh_clones(served, tmp_path):
    """The README's team block as written, in two fresh clones of one repository with a
    directory as the DVC remote: the first fetches, pushes and commits dvc.lock and .dvc/config;
    the second, cloned after that commit, pulls the archives and extracts its tree without one
    request to the archives' server, and DVC then finds both stages up to date. A clone without
    the commit falls back to the download with a warning."""
    server, archives = served
    coco_repo(tmp_path / "project", server, archives)
    origin = tmp_path / "origin.git"
    run(["git", "clone", "-q", "--bare", str(tmp_path / "project"), str(origin)], tmp_path)
    block = readme_team_block().replace("/shared/dvc-store", str(tmp_path / "dvc-store"))
    block = block.replace(". .venv/bin/activate\n", "")  # attempt() puts this interpreter first on PATH
    once, everywhere = block.split("# everywhere else")
    first, second = tmp_path / "first", tmp_path / "second"

    run(["git", "clone", "-q", str(origin), str(first)], tmp_path)
    run(["git", "config", "user.name", "t"], first)
    run(["git", "config", "user.email", "t@t"], first)
    requests = len(server.requests)
    run(["bash", "-euo", "pipefail", "-c", once], first)
    assert len(server.requests) > requests  # the first clone downloaded the archives
    run(["git", "clone", "-q", str(origin), str(second)], tmp_path)
    assert (second / "dvc.lock").is_file() and "dvc-store" in (second / ".dvc" / "config").read_text()
    requests = len(server.requests)
    output = run(["bash", "-euo", "pipefail", "-c", "# everywhere else" + everywhere], second)
    assert len(server.requests) == requests, output  # pulled from the remote: no download
    assert len(CocoDetection(second / "data" / "coco2017", "val", train=False)) == 8
    status = run([sys.executable, "-m", "dvc", "status", "coco_download", "coco_extract@coco2017"],
                 second)
    assert "Data and pipelines are up to date" in status, status

    # A clone without that commit (the project as it was): the pull fails, and the data rule's
    # fallback to the 19 GB download is said at WARNING level.
    pull = ("import logging, sys; logging.basicConfig(format='%(levelname)s %(message)s'); "
            "from pipeline.data.prepare import pull_archives; "
            "sys.exit(pull_archives(sys.argv[1]))")
    missed = attempt([sys.executable, "-c", pull, str(tmp_path / "dvc-store")], tmp_path / "project")
    assert missed.returncode == 0, missed.stderr[-3000:]  # pull_archives returned False
    assert "WARNING the archives were not pulled from" in missed.stderr, missed.stderr[-3000:]
