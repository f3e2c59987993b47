"""What a COCO-layout tree holds, cheaply: its identity, so that data which changes is noticed.

The manifest (pipeline/data/prepare.py) records the tree's `signature` when the data stage
checks it; the workflow compares it with the tree as it is now each time it plans
(rules/data.smk, `plan`: a rerun trigger, no file written), so a training image added, an
annotation file edited or a split removed makes
the data stage run again, and everything trained on the old data with it. A run's checkpoint
carries the data's `identity` too (pipeline/training/identity.py): a resumed run never mixes
old and new data.

The signature is, per split, the annotation file's SHA-256 (reused from a known signature while
its size and modification time are unchanged, so planning does not hash COCO's 450 MB on every
run) and a digest of the image folder's file names. An image replaced by another of the same
name is not noticed: the names, not the pixels, are hashed (reading 19 GB to plan is too slow).
No torch here: the workflow imports it to plan.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..runtime.listing import file_sha256

SPLIT_DIRS = {"train": "train2017", "val": "val2017"}
MISSING = "missing"


def annotation_path(root: str | Path, split: str) -> Path:
    return Path(root) / "annotations" / f"instances_{SPLIT_DIRS[split]}.json"


def _annotations(path: Path, known: dict | None) -> dict | str:
    try:
        stat = path.stat()
    except FileNotFoundError:
        return MISSING
    entry = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    if isinstance(known, dict) and {k: known.get(k) for k in entry} == entry and known.get("sha256"):
        return dict(entry, sha256=known["sha256"])
    return dict(entry, sha256=file_sha256(path))


def _images(folder: Path) -> dict | str:
    try:
        names = sorted(entry.name for entry in os.scandir(folder) if not entry.name.startswith("."))
    except (FileNotFoundError, NotADirectoryError):
        return MISSING
    return {"count": len(names), "names_sha256": hashlib.sha256("\n".join(names).encode()).hexdigest()}


def signature(root: str | Path, known: dict | None = None) -> dict:
    """{split: {"annotations": {size, mtime_ns, sha256} or "missing", "images": {count,
    names_sha256} or "missing"}} of both COCO splits under `root`. `known`: an earlier signature
    of the same tree, whose hashes are reused for files whose size and time are unchanged."""
    known = known or {}
    return {
        split: {
            "annotations": _annotations(annotation_path(root, split), known.get(split, {}).get("annotations")),
            "images": _images(Path(root) / folder),
        }
        for split, folder in SPLIT_DIRS.items()
    }


def identity(sig: dict) -> str:
    """The data's identity: the signature without file times (a copy of the same data, or the
    same files restored by DVC with new times, is the same data)."""
    content = {
        split: {
            "annotations": parts["annotations"] if parts["annotations"] == MISSING else parts["annotations"]["sha256"],
            "images": parts["images"],
        }
        for split, parts in sorted(sig.items())
    }
    return hashlib.sha256(repr(content).encode()).hexdigest()[:16]


def changes(before: dict, now: dict) -> list[str]:
    """What differs between two signatures, said for a person: "val2017: 8 -> 10 images"."""
    said = []
    for split, folder in SPLIT_DIRS.items():
        old, new = before.get(split, {}), now[split]
        # each part: its record, or MISSING where there was none
        old_images: Any = old.get("images") or MISSING
        old_ann: Any = old.get("annotations") or MISSING
        if old_images != new["images"]:
            counts = [
                parts if parts == MISSING else f"{parts['count']} images" for parts in (old_images, new["images"])
            ]
            said.append(
                f"{folder}: {counts[0]} -> {counts[1]}" if counts[0] != counts[1] else f"{folder}: other file names"
            )
        new_ann = new["annotations"]
        if (old_ann == MISSING or new_ann == MISSING) and old_ann != new_ann:
            said.append(f"{annotation_path('', split)}: {'missing' if new_ann == MISSING else 'appeared'}")
        elif old_ann != MISSING and old_ann["sha256"] != new_ann["sha256"]:
            said.append(f"{annotation_path('', split)}: other contents")
    return said


def _manifest(manifest_path: str | Path) -> dict | None:
    try:
        manifest = json.loads(Path(manifest_path).read_text())
    except (FileNotFoundError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) else None


def recorded(manifest_path: str | Path) -> dict | None:
    """The signature a manifest recorded; None without one (no manifest yet, or an older one)."""
    files = (_manifest(manifest_path) or {}).get("files")
    return files if isinstance(files, dict) else None


def stale_manifest(root: str | Path, manifest_path: str | Path) -> tuple[dict, list[str]] | None:
    """The tree's signature now and what changed, when its identity differs from the one its
    manifest recorded; None while they agree, or before there is a manifest to compare with."""
    known = recorded(manifest_path)
    if known is None:
        return None
    now = signature(root, known=known)
    if identity(now) == identity(known):
        return None
    return now, changes(known, now) or ["other contents"]


@dataclass(frozen=True)
class Plan:
    """What the planner makes of the tree: `state`, the data rule's param (a rerun trigger),
    and `changes`, said for a person when the tree differs from its manifest."""

    state: str
    changes: tuple[str, ...] = ()


def plan(root: str | Path, manifest_path: str | Path) -> Plan:
    """The data rule's rerun trigger, computed without writing anything (`snakemake -n` leaves
    the disk as it was). Snakemake stores a rule's params as they were planned, and reruns the
    rule when they differ: while the tree agrees with its manifest, the state is the one the
    manifest recorded (the data stage stores the state it ran with, `--tree-state`); when it
    differs, the state names the tree's identity now. So a change plans the data stage and all
    that was trained on the data, and data put back as it was (any file times) plans nothing."""
    manifest = _manifest(manifest_path) or {}
    stale = stale_manifest(root, manifest_path)
    if stale is None:
        return Plan(str(manifest.get("tree_state", "")))
    now, said = stale
    return Plan(f"changed: {identity(now)}", tuple(said))
