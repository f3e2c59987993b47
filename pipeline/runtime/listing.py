"""What a directory tree the pipeline wrote whole held when it was written, and what differs now.

pipeline/runtime/files.py records a listing in the marker of every tree it puts in place (a
generated or extracted dataset) and compares the tree with it before replacing it: a file added
or changed since (a user's notes, an edited annotation, a teammate's copy with extras) makes it
refuse, so no byte a user wrote is lost, whoever copied the tree where.

Cheap for COCO's 123k files and 19 GB: the listing holds each file's size and modification time
(a `cp -a` copy keeps both), and a SHA-256 only for the JSON files (the annotations, 450 MB). The
comparison stats every file and reads only a JSON file whose size or time differs; an image
whose size or time differs counts as changed, unread (hashing 19 GB to find out costs minutes).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

HASHED_SUFFIX = ".json"  # the files whose bytes are hashed: annotations, small beside the images


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _files(root: Path, skip: str) -> dict[str, os.stat_result]:
    """Every file (or link) under `root` by its relative path, but `skip` at the top."""
    found = {}
    for folder, dirs, names in os.walk(root):  # links to folders are listed, not followed
        links = [d for d in dirs if os.path.islink(os.path.join(folder, d))]
        dirs[:] = [d for d in dirs if d not in links]
        for name in names + links:
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, root)
            if relative != skip:
                found[relative] = os.lstat(path)
    return found


def record(root: str | Path, skip: str) -> dict[str, list]:
    """{relative path: [size, mtime_ns] or [size, mtime_ns, sha256]} of every file under
    `root` (`skip`, the marker itself, aside)."""
    root = Path(root)
    listing = {}
    for relative, info in _files(root, skip).items():
        entry: list[int | str] = [info.st_size, info.st_mtime_ns]
        if relative.endswith(HASHED_SUFFIX) and not os.path.islink(root / relative):
            entry.append(file_sha256(root / relative))
        listing[relative] = entry
    return listing


@dataclass
class Differences:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.changed or self.removed)

    def said(self, most: int = 10) -> str:
        """ "notes.txt (added), annotations/x.json (changed), ... and 3 more", for a person."""
        items = (
            [f"{p} (added)" for p in self.added]
            + [f"{p} (changed)" for p in self.changed]
            + [f"{p} (removed)" for p in self.removed]
        )
        rest = f" and {len(items) - most} more" if len(items) > most else ""
        return ", ".join(items[:most]) + rest


def compare(root: str | Path, listing: dict[str, list], skip: str) -> Differences:
    """What differs between the tree at `root` and its `listing` (record): sizes and times
    first, then the hash of a listed JSON file whose time differs but size does not."""
    root = Path(root)
    differences = Differences()
    now = _files(root, skip)
    for relative, info in sorted(now.items()):
        entry = listing.get(relative)
        if entry is None:
            differences.added.append(relative)
        elif info.st_size != entry[0]:
            differences.changed.append(relative)
        elif info.st_mtime_ns != entry[1] and (len(entry) < 3 or file_sha256(root / relative) != entry[2]):
            differences.changed.append(relative)
    differences.removed = sorted(set(listing) - set(now))
    return differences
