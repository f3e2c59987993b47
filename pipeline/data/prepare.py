"""The data stage: make the configured dataset available, validate it, write its manifest.

    python -m pipeline.data.prepare --config '<data section JSON>' --manifest data/NAME.manifest.json
    python -m pipeline.data.prepare --params params.yaml --preset demo --manifest ...   (dvc.yaml)

The synthetic dataset is generated (deterministically) in place. A dataset with `data.fetch`
(COCO 2017) is brought by DVC: the verified archives are pulled from data.fetch.remote when that
holds them, else downloaded (then pushed to the remote, if one is set), and dvc.yaml's extract
stage makes the tree from them (DVC never caches that tree: see fetch_with_dvc). But when
data.root already holds a COCO 2017 layout that the pipeline did not make (a mount, a symlink,
a team copy), that is used as it is and DVC never runs (its extract stage would refuse to write
over it, untouched). Any other dataset must already be in the COCO 2017 layout under
data.root. The manifest (annotation checksums, counts, skips) is what training depends on.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from ..config import cli, params, schema
from ..runtime.files import ForeignDirectoryError, made_by_pipeline, refuse_edited, write_json
from . import synthetic, tree
from .dataset import SPLIT_DIRS, DatasetError, annotation_path, build_manifest

SHOWN_LINES_KEPT = 100  # of a DVC command's output shown as it came: the last, for its error


def extract_stage(name: str) -> str:
    """dvc.yaml's stage that prepares the COCO 2017 tree of dataset `name` (one per preset)."""
    return f"coco_extract@{name}"


def dvc(*args: str, cwd: str | Path | None = None, shown: bool = False) -> subprocess.CompletedProcess:
    """Run DVC from the interpreter running us, with its `python` first on PATH for stages.
    `shown`: its output (stdout and stderr, as one) also goes to our stderr as it comes, line
    by line: the download's progress reaches the data stage's log while it runs, not after."""
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [sys.executable, "-m", "dvc", *args]
    logging.info("running %s", " ".join(command[2:]))
    if not shown:
        return subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)
    said: collections.deque[str] = collections.deque(maxlen=SHOWN_LINES_KEPT)  # for the error message, where it fails
    with subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd
    ) as process:
        assert process.stdout is not None  # stdout=PIPE
        for line in process.stdout:
            sys.stderr.write(line)
            sys.stderr.flush()
            said.append(line)
    return subprocess.CompletedProcess(command, process.returncode, "".join(said), "")


DOWNLOAD_STAGE = "coco_download"  # dvc.yaml's stage whose output, the archives, DVC caches


def fetch_with_dvc(name: str, root: str | Path, fetch: schema.Fetch) -> str:
    """Extract the dataset from the verified archives: pulled from the team remote when it has
    them, else downloaded; then shared. Only the archives go through DVC's cache and remote:
    dvc.yaml leaves data/<name> uncached, so no `dvc pull` or `dvc checkout` ever writes over
    it, and the extract command replaces only a tree it made."""
    remote, stage = fetch.remote, extract_stage(name)
    if Path(root) != Path("data") / name:
        raise DatasetError(
            f"data.root is {root}, but dvc.yaml's {stage} extracts into data/{name}: "
            f"set data.root to data/{name}, or put a COCO 2017 copy at {root} to "
            "use it without downloading"
        )
    pulled = pull_archives(remote) if remote else False
    # Extraction, preceded by the download unless the pulled archives match dvc.lock.
    reproduced = dvc("repro", stage, shown=True)
    if reproduced.returncode != 0:
        raise DatasetError(
            f"dvc repro {stage} failed:\n{reproduced.stdout[-2000:]}"
            f"{reproduced.stderr[-2000:]}\n(a preset of your own that fetches "
            "needs its name in the foreach list of dvc.yaml's coco_extract)"
        )
    # repro leaves the downloaded archives a copy of what it put in the cache; relinking makes
    # the two one file wherever cache.type allows links (19 GB less for COCO). Pulled archives
    # are links already.
    relinked = dvc("checkout", "--relink", DOWNLOAD_STAGE)
    if relinked.returncode != 0:
        logging.warning(
            "dvc checkout --relink %s failed (the archives stay as copies): %s", DOWNLOAD_STAGE, relinked.stderr.strip()
        )
    if remote:  # also after a pull: a no-op then, unless the remote lacked part of them
        pushed = dvc("push", DOWNLOAD_STAGE)
        if pushed.returncode != 0:
            logging.warning("could not push the archives to %s: %s", remote, pushed.stderr.strip())
    source = f"pulled from {remote}" if pulled else "downloaded unless already there and verified"
    return f"extracted from the archives ({source})"


def pull_archives(remote: str) -> bool:
    """Make `remote` the project's default DVC remote (this clone only) and pull the archives
    dvc.lock pins from it: False when it lacks them, dvc.lock pins none, or something of the
    user's is in the archives' directory (DVC then refuses without --force, which this never
    passes)."""
    added = dvc("remote", "add", "--local", "--force", "--default", "team", remote)
    if added.returncode != 0:
        raise DatasetError(f"data.fetch.remote: DVC refused {remote!r}: {added.stderr.strip()}")
    pulled = dvc("pull", DOWNLOAD_STAGE)
    if pulled.returncode != 0:
        # A 19 GB download where a pull was meant: said where it shows (dvc.lock, committed
        # after the first fetch, is what `dvc pull` needs: README, COCO 2017 through DVC)
        logging.warning(
            "the archives were not pulled from %s, so they are downloaded instead "
            "(does this clone have the dvc.lock of the fetch that pushed them? the "
            "data stage never runs DVC with --force: anything DVC names here is "
            "kept): %s",
            remote,
            pulled.stderr.strip()[-1000:],
        )
    return pulled.returncode == 0


def missing_coco_layout(root: str | Path, splits) -> list[str]:
    """What `root` lacks of a COCO 2017 layout: both annotation files, the splits' image folders.
    (Presence only: build_manifest then checks the contents and names what is wrong.)"""
    needed = [annotation_path(root, split) for split in SPLIT_DIRS]
    needed += [Path(root) / SPLIT_DIRS[split] for split in splits]
    return [str(path.relative_to(root)) for path in needed if not path.exists()]


def fetch_unless_present(name: str, root: str | Path, fetch: schema.Fetch) -> str:
    """Fetch through DVC into an absent or pipeline-made data.root; use a user's COCO as it is;
    refuse anything else at data.root before DVC can delete it."""
    root = Path(root)
    if not (root.exists() or root.is_symlink()) or made_by_pipeline(root):
        refuse_edited(root)  # before DVC: its extract stage would refuse it too, less plainly
        return fetch_with_dvc(name, root, fetch)
    missing = missing_coco_layout(root, fetch.splits)
    if missing:
        raise DatasetError(
            f"{root} already exists, was not made by this pipeline and is not a COCO 2017 layout "
            f"(it lacks {', '.join(missing)}), so it was left untouched: move it away to let the "
            "data stage download COCO 2017 there, or complete the layout in it to use it as it is"
        )
    return "already holds a COCO 2017 layout (not made by this pipeline): using it as it is, without downloading"


def prepare(data_cfg: schema.Data, manifest_path: str, tree_state: str = "") -> dict:
    small = data_cfg.synthetic is not None
    splits: tuple[str, ...] = ("train", "val")
    if data_cfg.synthetic is not None:
        counts = synthetic.generate(data_cfg.root, data_cfg.synthetic)
        logging.info("generated %s: %s", data_cfg.root, counts)
    elif data_cfg.fetch is not None:
        how = fetch_unless_present(data_cfg.name, data_cfg.root, data_cfg.fetch)
        logging.info("%s %s", data_cfg.root, how)
        splits = tuple(data_cfg.fetch.splits)
    if not small:
        refuse_missing_splits(data_cfg.root, splits)
    manifest = build_manifest(data_cfg.root, splits, data_cfg.exif_orientation, data_cfg.category_mismatch)
    # What the workflow compares with the tree each time it plans (rules/data.smk), and the
    # data's identity in every checkpoint trained on it (pipeline/data/tree.py).
    manifest["files"] = tree.signature(data_cfg.root)
    manifest["identity"] = tree.identity(manifest["files"])
    manifest["tree_state"] = tree_state  # the planner's, returned while the tree is unchanged
    write_json(manifest_path, manifest)
    return manifest


def refuse_missing_splits(root: str | Path, splits) -> None:
    """A tree that lacks a split it must have (its annotations or its image folder) is refused
    by name, not read as a smaller dataset: a split that disappeared since the last run too."""
    missing = missing_coco_layout(root, splits)
    if missing:
        raise DatasetError(
            f"{root}: lacks {', '.join(missing)} of the COCO 2017 layout the "
            f"dataset needs (splits: {', '.join(splits)}); put them back, or point "
            "data.root at a complete copy"
        )


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--config", help="the data section of the preset, as JSON (Snakefile)")
        source.add_argument("--params", help="a params.yaml to read the data section from (dvc.yaml)")
        parser.add_argument("--preset", help="with --params: the preset (default: the file's own)")
        parser.add_argument("--manifest", required=True)
        parser.add_argument(
            "--tree-state", default="", help="the workflow's rerun trigger for the tree (pipeline/data/tree.py: plan)"
        )

    def body(args):
        if args.params:
            data_cfg = params.load_resolved(args.params, args.preset).data
        else:
            data_cfg = schema.DataStage.model_validate({"data": json.loads(args.config)}).data
        manifest = prepare(data_cfg, args.manifest, args.tree_state)
        print(json.dumps(manifest["splits"], indent=1))

    cli.run_stage(
        "Prepare and validate the configured dataset.",
        body,
        arguments=arguments,
        errors=(DatasetError, ForeignDirectoryError, params.ParamsError),
        follows_parent=False,
        argv=argv,
    )


if __name__ == "__main__":
    main()
