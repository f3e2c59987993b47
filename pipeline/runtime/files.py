"""Atomic file output: write beside the target, then rename, so a crash never leaves half a file.

Outputs get the modes a plain open() or mkdir() would give them (0o666 or 0o777 less the umask):
tempfile makes its files 0600 and its directories 0700, and a rename keeps that mode, which
would leave results private to whoever ran the workflow. A directory keeps the mode it was made
with, so a run under `umask 022` after one under `umask 077` would leave its outputs in folders
nobody else can enter: the folders an output is written into follow the umask of the run that
writes too. Which ones, without touching anything the pipeline did not make: the output's own
folder and those above it up to `results/` of the working directory (the workflow's output
tree, made by Snakemake or by us), each only where it is a real folder (not a link: a results/
linked to scratch space is the user's) owned by the user running the pipeline. An output written
elsewhere (an --out of the user's choosing, data/, which may hold the user's own dataset) changes
no folder's mode. Set-group-ID and sticky bits (a shared project folder's) are kept.

A directory the pipeline writes whole (a generated or extracted dataset) is built in a staging
directory, marked as ours (the marker lists what it holds: pipeline/runtime/listing.py), and
renamed into place. It replaces only a directory that carries that mark and still holds what the
listing says: anything else at the target (a user's data, a mount, a symlink, our tree or a copy
of it with a file added, changed or removed) is left untouched, and what differs is named.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path

from . import listing

MARKER = ".made-by-frcnn-dp-bench"  # in a directory tree this pipeline wrote whole (JSON: how)
OUTPUT_TREE = "results"  # the workflow's outputs, under its working directory (rules/common.smk)


class ForeignDirectoryError(FileExistsError):
    """The pipeline would replace a directory it did not make; it was left untouched."""


class OutputError(OSError):
    """An output could not be written (no space, no permission); the previous file is intact."""

    def __str__(self) -> str:  # the message alone, without OSError's "[Errno N]"
        return self.strerror or ""


REMEDIES = {
    errno.ENOSPC: "free space on the file system that holds {dir} (df -h {dir}) and rerun",
    errno.EDQUOT: "free space within your quota on {dir} and rerun",
    errno.EACCES: "make {dir} writable by you (or run from a copy of the project you can write) and rerun",
    errno.EROFS: "{dir} is on a read-only file system: run from a writable copy of the project",
}
REMEDIES[errno.EPERM] = REMEDIES[errno.EACCES]


def output_error(path: Path, err: OSError) -> OutputError | OSError:
    """A write that failed for want of space or permission, said with its remedy."""
    remedy = REMEDIES.get(err.errno) if err.errno is not None else None
    if remedy is None or err.errno is None:
        return err
    return OutputError(
        err.errno,
        f"{path}: cannot write it ({os.strerror(err.errno)}); "
        f"{remedy.format(dir=path.parent)}. The previous {path.name}, if any, "
        "is unchanged",
    )


def _remove_stale_temporaries(path: Path) -> None:
    """Temporaries of `path` left by a writer that was killed (names only we make)."""
    for stale in path.parent.glob(f".{path.name}.*.tmp"):
        if stale.is_dir() and not stale.is_symlink():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            stale.unlink(missing_ok=True)


def _umask_at_import() -> int:
    # os.umask can only read the mask by setting it: done once, at import, before any worker
    # threads; 022 (not 0) meanwhile, so a file another thread made then is not world-writable.
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK_AT_IMPORT = _umask_at_import()


def umask() -> int:
    """The process umask now, read without changing it (Linux), else as it was at import."""
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    return _UMASK_AT_IMPORT


def set_usual_mode(path: Path) -> None:
    """Give a file or directory we created the permissions open() or mkdir() would give it
    now; its set-group-ID and sticky bits stay."""
    info = path.stat()
    usual = (0o777 if stat.S_ISDIR(info.st_mode) else 0o666) & ~umask()
    os.chmod(path, stat.S_IMODE(info.st_mode) & ~0o777 | usual)


def _output_folders(path: Path) -> list[Path]:
    """The folders from `path`'s own up to results/ of the working directory (none for an
    output outside it): the ones whose mode follows the umask (module docstring)."""
    root = Path(os.path.abspath(OUTPUT_TREE))
    folder = Path(os.path.abspath(path.parent))
    chain = [folder, *folder.parents]
    return chain[: chain.index(root) + 1] if root in chain else []


def _folders_follow_umask(path: Path) -> None:
    """The folders of an output just written get the mode a mkdir would give them now, where
    they are real folders of ours (module docstring)."""
    usual = 0o777 & ~umask()
    for folder in _output_folders(path):
        with contextlib.suppress(OSError):  # a folder's mode is not worth failing a written output
            info = folder.lstat()
            if (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == os.geteuid()
                and stat.S_IMODE(info.st_mode) & 0o777 != usual
            ):
                set_usual_mode(folder)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path in the target's directory; on success rename it over `path`.
    Only one process writes a given output (Snakemake locks them), so temporaries of `path`
    found beside it are a killed writer's: they go first. No space or no permission is an
    OutputError that names the file and the remedy; `path` is then as it was."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(path)
        fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise output_error(path, err) from err
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        set_usual_mode(tmp)
        os.replace(tmp, path)
        _folders_follow_umask(path)
    except OSError as err:
        raise output_error(path, err) from err
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | Path, obj) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def read_json(path: str | Path):
    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found") from None
    except json.JSONDecodeError as err:
        raise ValueError(
            f"{path}: not valid JSON ({err.msg} at line {err.lineno}); delete it and rerun the stage that writes it"
        ) from err


def read_json_lines(path: str | Path) -> list:
    """A JSON-lines file's objects, in order (blank lines skipped)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def save_torch(obj, path: str | Path) -> None:
    """torch.save, atomically; serialised in memory first, so that a full disk is an OSError
    (ENOSPC) of the write, not an opaque error from inside torch's zip writer."""
    import torch

    buffer = io.BytesIO()
    torch.save(obj, buffer)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getbuffer())


def made_by_pipeline(path: str | Path) -> bool:
    """A real directory (not a link to one) that carries our marker (a copy of one does too:
    `edits` then tells whether anything in it is not as the pipeline wrote it)."""
    path = Path(path)
    return path.is_dir() and not path.is_symlink() and (path / MARKER).is_file()


NO_LISTING = "(its marker lists no files: written by an older version, so changes cannot be told)"
EDITED_REMEDY = (
    f"move it away to have it made afresh (what you changed stays in the moved copy); "
    f"or, to keep it as your own data, delete its {MARKER} file: the pipeline then "
    "never replaces it, and uses a COCO 2017 layout there as it is"
)


def edits(target: str | Path) -> str:
    """What differs in a tree the pipeline made from the listing its marker recorded when it
    was written (pipeline/runtime/listing.py), said for a person; "" when nothing does."""
    target = Path(target)
    try:
        recorded = json.loads((target / MARKER).read_text()).get("listing")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if not isinstance(recorded, dict):
        return NO_LISTING
    return listing.compare(target, recorded, skip=MARKER).said()


class EditedTreeError(ForeignDirectoryError):
    """A tree the pipeline made holds files added or changed since: it was left untouched."""


def check_replaceable(target: str | Path, remedy: str, edited_remedy: str = EDITED_REMEDY) -> None:
    """Refuse, before any work, to replace anything at `target` that the pipeline did not make,
    or that it made but that differs from what it wrote (a file added, changed or removed):
    `remedy` and `edited_remedy` end the two messages."""
    target = Path(target)
    if (target.exists() or target.is_symlink()) and not made_by_pipeline(target):
        raise ForeignDirectoryError(
            f"{target} already exists and was not made by this pipeline (that would be a "
            f"directory, not a link, holding {MARKER}), so it was left untouched: {remedy}"
        )
    refuse_edited(target, edited_remedy)


def refuse_edited(target: str | Path, remedy: str = EDITED_REMEDY) -> None:
    """An EditedTreeError naming what differs, where `target` is a tree the pipeline made and
    something in it is not as the pipeline wrote it; `remedy` ends it (the default: for a tree
    the pipeline fetched, which a user's copy without the marker replaces as their own)."""
    target = Path(target)
    changed = made_by_pipeline(target) and edits(target)
    if changed:
        raise EditedTreeError(
            f"{target} was made by this pipeline, but is not as it was written: {changed}. It "
            f"was left untouched, not replaced: {remedy}"
        )


@contextlib.contextmanager
def replacing_dir(
    target: str | Path, provenance: dict, remedy: str, edited_remedy: str = EDITED_REMEDY
) -> Iterator[Path]:
    """Yield an empty staging directory beside `target`; once the caller has filled it, mark it
    with `provenance` and put it in place of `target`, which must be absent or ours (see
    check_replaceable; `remedy` ends its message). An error leaves `target` as it was."""
    target = Path(target)
    check_replaceable(target, remedy, edited_remedy)
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        yield staging
        # What the tree holds as written, for check_replaceable to compare with next time
        # (compact JSON: COCO's listing has 123k entries)
        recorded = dict(provenance, listing=listing.record(staging, skip=MARKER))
        write_text(staging / MARKER, json.dumps(recorded, separators=(",", ":")) + "\n")
        set_usual_mode(staging)
        check_replaceable(target, remedy, edited_remedy)  # again: something may have appeared there meanwhile
        _swap(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _swap(staging: Path, target: Path) -> None:
    """Rename `staging` to `target`, moving our previous tree aside first, deleting it after."""
    old = staging.with_name(staging.name + ".old")
    if made_by_pipeline(target):
        target.rename(old)
    try:
        staging.rename(target)
    except OSError:
        if old.exists():
            old.rename(target)  # put the previous tree back
        raise
    shutil.rmtree(old, ignore_errors=True)
