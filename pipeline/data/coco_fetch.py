"""COCO 2017: download the official archives, verify them, extract them into the loader's layout.

    python -m pipeline.data.coco_fetch download --params params.yaml --preset coco2017 --out data/archives/coco2017
    python -m pipeline.data.coco_fetch extract  --params params.yaml --preset coco2017 \\
        --archives data/archives/coco2017 --out data/coco2017

dvc.yaml runs these two as stages (so dvc.lock pins the archives' hashes and a DVC remote can
share the result); the Snakefile's data rule runs DVC. Guarantees:
  * downloads resume where they stopped (HTTP Range) and are retried with back-off; each shows
    its bytes, rate and time left on stderr (tqdm);
  * an archive enters the archive directory only after its size and MD5 match; a mismatch
    deletes it and says so;
  * free disk space is checked before each download and extraction;
  * an archive member with an absolute path or '..' is refused before anything is extracted;
  * extraction goes to a hidden staging directory renamed into place when complete, so an
    interrupted extraction never leaves a dataset that looks complete;
  * it replaces only a tree it extracted itself (marked with pipeline.runtime.files.MARKER): a user's
    directory or symlink at the output path is refused, untouched (pipeline/data/prepare.py uses
    such a directory as it is when it holds COCO 2017, before DVC runs).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

from ..config import cli, schema
from ..config.params import ParamsError, load_resolved
from ..runtime.files import ForeignDirectoryError, replacing_dir, write_json

log = logging.getLogger("coco_fetch")
ANNOTATIONS = "annotations"
SPLIT_ARCHIVES = {"train": "train2017", "val": "val2017"}
CHUNK = 1 << 20
PROGRESS_EVERY_S = 30.0  # a download's progress line in a log file (on a terminal: each second)
SAFETY_MARGIN = 1.05  # extracted size plus 5% for file-system overhead
FOREIGN_OUT_REMEDY = (
    "move it away to extract COCO 2017 there; or, if it is your own COCO 2017, "
    "leave it: the workflow's data stage uses a COCO 2017 layout at data.root as "
    "it is, without DVC (run snakemake, not dvc repro)"
)


class FetchError(RuntimeError):
    """The data cannot be fetched or prepared; the message says what and what to do."""


def archive_names(fetch: schema.Fetch) -> list[str]:
    """The archive keys this configuration needs: annotations always, images per split."""
    return [ANNOTATIONS] + [SPLIT_ARCHIVES[s] for s in fetch.splits]


def check_free_space(path: str | Path, needed: int, what: str) -> None:
    path = Path(path)
    probe = path if path.exists() else next(p for p in path.parents if p.exists())
    free = shutil.disk_usage(probe).free
    if free < needed:
        raise FetchError(
            f"{what} needs {needed / 1e9:.2f} GB in {probe}, but only "
            f"{free / 1e9:.2f} GB are free; free space or point data.root and the "
            "DVC cache (dvc cache dir) at a larger disk"
        )


def md5sum(path: Path) -> str:
    digest = hashlib.md5()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            digest.update(block)
    return digest.hexdigest()


def _remote_size(url: str, timeout: float) -> int | None:
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            length = response.headers.get("Content-Length")
            return int(length) if length is not None else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


class _Lines:
    """A log file (not a terminal) gets tqdm's updates one a line, not overwritten by '\r'."""

    def __init__(self, stream):
        self.stream, self.first = stream, True

    def write(self, text: str) -> None:
        if self.first and text:
            text, self.first = text.lstrip("\r"), False
        self.stream.write(text.replace("\r", "\n"))

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(name: str, size: int | None, have: int):
    """Bytes, rate and time left of one download on stderr (tqdm): updated each second on a
    terminal, every PROGRESS_EVERY_S in a log (a 19 GB download runs for hours)."""
    from tqdm import tqdm

    terminal = sys.stderr.isatty()
    return tqdm(
        total=size,
        initial=have,
        desc=name,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr if terminal else _Lines(sys.stderr),
        ascii=not terminal,
        mininterval=1.0 if terminal else PROGRESS_EVERY_S,
        dynamic_ncols=terminal,
    )


def _fetch_once(url: str, part: Path, timeout: float, size: int | None = None) -> None:
    """Append the rest of `url` to `part`, asking for the missing range only."""
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        if have and response.status != 206:  # the server ignored the range: start over
            have = 0
        with (
            part.open("ab" if have else "wb") as handle,
            progress_bar(part.name.removesuffix(".part"), size, have) as shown,
        ):
            for block in iter(lambda: response.read(CHUNK), b""):
                handle.write(block)
                shown.update(len(block))


def download(
    url: str,
    dest: str | Path,
    md5: str | None,
    size: int | None = None,
    retries: int = 5,
    timeout: float = 60.0,
    backoff: float = 2.0,
) -> Path:
    """Download `url` to `dest`, resuming a partial `dest.part`; verify; then rename into place."""
    dest = Path(dest)
    if dest.exists() and (md5 is None or md5sum(dest) == md5):
        log.info("%s: already present and verified", dest)
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    size = size or _remote_size(url, timeout)
    if size:
        check_free_space(dest.parent, size - (part.stat().st_size if part.exists() else 0), f"downloading {url}")
    for attempt in range(1, retries + 1):
        try:
            _fetch_once(url, part, timeout, size)
            if size is None or part.stat().st_size >= size:
                break
            raise OSError(f"connection closed after {part.stat().st_size} of {size} bytes")
        except (urllib.error.URLError, OSError) as err:
            if isinstance(err, urllib.error.HTTPError) and err.code in (403, 404, 410):
                raise FetchError(f"{url}: HTTP {err.code}; check data.fetch.base_url") from err
            if attempt == retries:
                raise FetchError(
                    f"{url}: download failed after {retries} attempts ({err}); "
                    f"{part.name} is kept and the next run resumes it"
                ) from err
            wait = backoff**attempt
            log.warning("%s: attempt %d failed (%s); resuming in %.0f s", url, attempt, err, wait)
            time.sleep(wait)
    got_size = part.stat().st_size
    if size is not None and got_size != size:
        part.unlink()
        raise FetchError(
            f"{url}: got {got_size} bytes, expected {size}; the partial file was "
            "removed, run again to download it afresh"
        )
    if md5 is not None:
        got = md5sum(part)
        if got != md5:
            part.unlink()
            raise FetchError(
                f"{url}: MD5 {got} does not match the expected {md5}; the file was "
                "removed and did not enter the dataset. Run again, or correct "
                "data.fetch.md5 if the archive has legitimately changed"
            )
    os.replace(part, dest)
    return dest


def safe_members(archive: zipfile.ZipFile, source: Path) -> list[zipfile.ZipInfo]:
    """Every member, after refusing any that would land outside the target (zip-slip)."""
    for info in archive.infolist():
        name = PurePosixPath(info.filename.replace("\\", "/"))
        if name.is_absolute() or ".." in name.parts or (name.parts and ":" in name.parts[0]):
            raise FetchError(
                f"{source}: member {info.filename!r} would be written outside the "
                "dataset directory; refusing to extract this archive"
            )
    return archive.infolist()


def extract(
    archives: dict[str, Path], out: str | Path, subset: int | None = None, md5s: dict[str, str | None] | None = None
) -> dict:
    """Extract annotation and image archives into `out` (annotations/, train2017/, val2017/),
    optionally keeping only the first `subset` images (by id) of each split. `out` must be
    absent or a tree this function extracted before; `md5s` (as verified by download) are
    recorded in its marker."""
    out = Path(out)
    provenance = {
        "made_by": "pipeline.data.coco_fetch extract",
        "subset": subset,
        "archives": {key: {"file": path.name, "md5": (md5s or {}).get(key)} for key, path in archives.items()},
    }
    opened = {key: zipfile.ZipFile(path) for key, path in archives.items()}
    try:
        members = {key: safe_members(z, archives[key]) for key, z in opened.items()}
        needed = sum(i.file_size for m in members.values() for i in m)
        with replacing_dir(out, provenance, remedy=FOREIGN_OUT_REMEDY) as staging:
            check_free_space(out.parent, int(needed * SAFETY_MARGIN), f"extracting into {out}")
            counts = _extract_into(staging, opened, members, subset)
    except ForeignDirectoryError as err:
        raise FetchError(str(err)) from None
    finally:
        for z in opened.values():
            z.close()
    return counts


def _extract_into(staging: Path, opened: dict, members: dict, subset: int | None) -> dict:
    keep: dict[str, set[str] | None] = {}
    counts = {}
    (staging / "annotations").mkdir()
    for info in members[ANNOTATIONS]:
        name = PurePosixPath(info.filename).name
        split = next((s for s in SPLIT_ARCHIVES.values() if name == f"instances_{s}.json"), None)
        if split is None:
            continue  # captions and keypoints: not used by detection
        document = json.loads(opened[ANNOTATIONS].read(info))
        if subset is not None:
            document = _subset(document, subset)
        keep[split] = {img["file_name"] for img in document["images"]} if subset is not None else None
        write_json(staging / "annotations" / name, document)
        counts[f"{split} images listed"] = len(document["images"])
    for key, archive in opened.items():
        if key == ANNOTATIONS:
            continue
        wanted = keep.get(key)
        target = staging / key
        target.mkdir()
        n = 0
        for info in members[key]:
            path = PurePosixPath(info.filename)
            if info.is_dir() or (wanted is not None and path.name not in wanted):
                continue
            with archive.open(info) as source, (target / path.name).open("wb") as sink:
                shutil.copyfileobj(source, sink, CHUNK)
            n += 1
        counts[f"{key} images extracted"] = n
    return counts


def _subset(document: dict, n: int) -> dict:
    """The first n images by id, with their annotations: a quick run on real data."""
    images = sorted(document["images"], key=lambda i: i["id"])[:n]
    ids = {img["id"] for img in images}
    return {**document, "images": images, "annotations": [a for a in document["annotations"] if a["image_id"] in ids]}


def fetch_config(params_path: str, preset: str | None) -> schema.Fetch:
    fetch = load_resolved(params_path, preset).data.fetch
    if fetch is None:
        raise FetchError(f"{params_path}: preset {preset or '(default)'} has no data.fetch settings")
    return fetch


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        parser.add_argument("action", choices=["download", "extract"])
        parser.add_argument("--params", default="params.yaml")
        parser.add_argument("--preset", default="coco2017")
        parser.add_argument("--archives", help="directory of the downloaded archives (extract)")
        parser.add_argument("--out", required=True)

    def body(args):
        fetch = fetch_config(args.params, args.preset)
        names = archive_names(fetch)
        if args.action == "download":
            Path(args.out).mkdir(parents=True, exist_ok=True)
            for name in names:
                archive = getattr(fetch.archives, name)
                download(
                    f"{fetch.base_url.rstrip('/')}/{archive.path}",
                    Path(args.out) / Path(archive.path).name,
                    archive.md5,
                    archive.size,
                    retries=fetch.retries,
                )
        else:
            archives = {name: Path(args.archives) / Path(getattr(fetch.archives, name).path).name for name in names}
            md5s = {name: getattr(fetch.archives, name).md5 for name in names}
            counts = extract(archives, args.out, fetch.subset, md5s)
            print(json.dumps(counts))

    cli.run_stage(
        "Fetch and extract COCO 2017 (see module docstring).",
        body,
        arguments=arguments,
        errors=(FetchError, ParamsError),
        follows_parent=False,
        argv=argv,
    )


if __name__ == "__main__":
    main()
