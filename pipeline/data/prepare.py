"""The data stage: make the configured dataset available, validate it, write its manifest.

    python -m pipeline.data.prepare --config '<data section JSON>' --manifest data/NAME.manifest.json
    python -m pipeline.data.prepare --params params.yaml --preset demo --manifest ...   (dvc.yaml)

The synthetic dataset is generated (deterministically) in place. A dataset with `data.fetch`
(COCO 2017) is brought by DVC: `dvc pull` from data.fetch.remote when that holds it, otherwise
dvc.yaml's download and extract stages (then pushed to the remote, if one is set). But when
data.root already holds a COCO 2017 layout that the pipeline did not make (a mount, a symlink,
a team copy), that is used as it is and DVC never runs: `dvc repro` and `dvc checkout` delete
whatever an output directory holds before they write it. Any other dataset must already be in
the COCO 2017 layout under data.root. The manifest (annotation checksums, counts, skips) is
what training depends on.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

from ..config import cli, params
from ..runtime.files import ForeignDirectoryError, made_by_pipeline, write_json
from . import synthetic
from .dataset import SPLIT_DIRS, DatasetError, annotation_path, build_manifest



def extract_stage(name: str) -> str:
    """dvc.yaml's stage that prepares the COCO 2017 tree of dataset `name` (one per preset)."""
    return f"coco_extract@{name}"


def dvc(*args: str, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
    """Run DVC from the interpreter running us, with its `python` first on PATH for stages."""
    bindir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    command = [sys.executable, "-m", "dvc", *args]
    logging.info("running %s", " ".join(command[2:]))
    return subprocess.run(command, env=env, capture_output=True, text=True, cwd=cwd)


def fetch_with_dvc(name: str, root: str | Path, fetch: dict) -> str:
    """Pull the prepared data from the team remote if it has it, else fetch and extract it."""
    remote, stage = fetch["remote"], extract_stage(name)
    if Path(root) != Path("data") / name:
        raise DatasetError(f"data.root is {root}, but dvc.yaml's {stage} extracts into data/{name}: "
                           f"set data.root to data/{name}, or put a COCO 2017 copy at {root} to "
                           "use it without downloading")
    if remote:
        added = dvc("remote", "add", "--local", "--force", "--default", "team", remote)
        if added.returncode != 0:
            raise DatasetError(f"data.fetch.remote: DVC refused {remote!r}: {added.stderr.strip()}")
        if dvc("pull", stage).returncode == 0:
            return "pulled from " + remote
    reproduced = dvc("repro", stage)
    if reproduced.returncode != 0:
        raise DatasetError(f"dvc repro {stage} failed:\n{reproduced.stdout[-2000:]}"
                           f"{reproduced.stderr[-2000:]}\n(a preset of your own that fetches "
                           "needs its name in the foreach list of dvc.yaml's coco_extract)")
    # repro leaves the workspace a copy of what it put in the cache; relinking makes the two one
    # file wherever cache.type allows links (half the disk for 40 GB of COCO).
    relinked = dvc("checkout", "--relink", "coco_download", stage)
    if relinked.returncode != 0:
        logging.warning("dvc checkout --relink failed (the data stays as copies): %s",
                        relinked.stderr.strip())
    if remote:
        pushed = dvc("push", stage)
        if pushed.returncode != 0:
            logging.warning("could not push to %s: %s", remote, pushed.stderr.strip())
    return "fetched and extracted"


def missing_coco_layout(root: str | Path, splits) -> list[str]:
    """What `root` lacks of a COCO 2017 layout: both annotation files, the splits' image folders.
    (Presence only: build_manifest then checks the contents and names what is wrong.)"""
    needed = [annotation_path(root, split) for split in SPLIT_DIRS]
    needed += [Path(root) / SPLIT_DIRS[split] for split in splits]
    return [str(path.relative_to(root)) for path in needed if not path.exists()]


def fetch_unless_present(name: str, root: str | Path, fetch: dict) -> str:
    """Fetch through DVC into an absent or pipeline-made data.root; use a user's COCO as it is;
    refuse anything else at data.root before DVC can delete it."""
    root = Path(root)
    if not (root.exists() or root.is_symlink()) or made_by_pipeline(root):
        return fetch_with_dvc(name, root, fetch)
    missing = missing_coco_layout(root, fetch["splits"])
    if missing:
        raise DatasetError(
            f"{root} already exists, was not made by this pipeline and is not a COCO 2017 layout "
            f"(it lacks {', '.join(missing)}), so it was left untouched: move it away to let the "
            "data stage download COCO 2017 there, or complete the layout in it to use it as it is")
    return ("already holds a COCO 2017 layout (not made by this pipeline): using it as it is, "
            "without downloading")


def prepare(data_cfg: dict, manifest_path: str) -> dict:
    small = data_cfg["synthetic"] is not None
    splits = ("train", "val")
    if small:
        counts = synthetic.generate(data_cfg["root"], data_cfg["synthetic"])
        logging.info("generated %s: %s", data_cfg["root"], counts)
    elif data_cfg["fetch"] is not None:
        how = fetch_unless_present(data_cfg["name"], data_cfg["root"], data_cfg["fetch"])
        logging.info("%s %s", data_cfg["root"], how)
        splits = tuple(data_cfg["fetch"]["splits"])
    manifest = build_manifest(data_cfg["root"], decode_images=small, splits=splits)
    write_json(manifest_path, manifest)
    return manifest


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--config", help="the data section of the preset, as JSON (Snakefile)")
        source.add_argument("--params", help="a params.yaml to read the data section from (dvc.yaml)")
        parser.add_argument("--preset", help="with --params: the preset (default: the file's own)")
        parser.add_argument("--manifest", required=True)

    def body(args):
        if args.params:
            data_cfg = params.load_resolved(args.params, args.preset)["data"]
        else:
            data_cfg = json.loads(args.config)
        manifest = prepare(data_cfg, args.manifest)
        print(json.dumps(manifest["splits"], indent=1))

    cli.run_stage("Prepare and validate the configured dataset.", body, arguments=arguments,
                  errors=(DatasetError, ForeignDirectoryError, params.ParamsError),
                  follows_parent=False, argv=argv)


if __name__ == "__main__":
    main()
