"""Fetch -> verify -> extract of a ~500 MB COCO-layout archive from a local HTTP server, against a
plain `curl` + `unzip` of the same archive, and the disk a DVC-managed copy takes.

    .venv/bin/python benchmarks/fetch_vs_curl.py [--megabytes 500] [--repeats 2]

Both sides run alternately in this one invocation (best of --repeats each); the ratio is what
to read. The pipeline's side also computes the MD5 and stages the extraction atomically.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.data.coco_fetch import download, extract, md5sum  # noqa: E402
from pipeline.data.prepare import dvc  # noqa: E402

IMAGE_BYTES = 160_000  # about a COCO JPEG


def build(root: Path, megabytes: int) -> dict:
    """val2017.zip of incompressible 'images' (stored, as JPEGs barely compress) + annotations."""
    (root / "zips").mkdir(parents=True)
    (root / "annotations").mkdir()
    n = megabytes * 1_000_000 // IMAGE_BYTES
    images = [{"id": i, "file_name": f"{i:012d}.jpg", "width": 640, "height": 480} for i in range(1, n + 1)]
    with zipfile.ZipFile(root / "zips" / "val2017.zip", "w", zipfile.ZIP_STORED) as z:
        for img in images:
            z.writestr(f"val2017/{img['file_name']}", os.urandom(IMAGE_BYTES))
    document = {"images": images, "annotations": [], "categories": [{"id": 1, "name": "thing"}]}
    with zipfile.ZipFile(root / "annotations" / "annotations_trainval2017.zip", "w") as z:
        z.writestr("annotations/instances_val2017.json", json.dumps(document))
        z.writestr("annotations/instances_train2017.json", json.dumps(document))
    return {
        "annotations": root / "annotations" / "annotations_trainval2017.zip",
        "val2017": root / "zips" / "val2017.zip",
    }


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(root: Path) -> http.server.ThreadingHTTPServer:
    handler = functools.partial(QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def pipeline_side(url: str, archives: dict, work: Path, md5s: dict) -> float:
    start = time.perf_counter()
    local = {}
    for key, path in archives.items():
        relative = path.relative_to(path.parents[1])
        local[key] = download(f"{url}/{relative}", work / "archives" / path.name, md5s[key])
    counts = extract(local, work / "coco2017")
    seconds = time.perf_counter() - start
    with zipfile.ZipFile(archives["val2017"]) as z:  # the same work as unzip: every image
        assert counts["val2017 images extracted"] == sum(not i.is_dir() for i in z.infolist())
    return seconds


def curl_side(url: str, archives: dict, work: Path, md5s: dict) -> float:
    start = time.perf_counter()
    for path in archives.values():
        relative = path.relative_to(path.parents[1])
        target = work / "archives" / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["curl", "-s", "-f", "-o", str(target), f"{url}/{relative}"], check=True)
        subprocess.run(["unzip", "-q", "-o", str(target), "-d", str(work / "coco2017")], check=True)
    return time.perf_counter() - start


def du(*paths: Path) -> int:
    """Bytes on disk, hard links counted once (as du does for one invocation)."""
    out = subprocess.run(["du", "-s", "-B1", "-c", *map(str, paths)], capture_output=True, text=True).stdout
    return int(out.strip().splitlines()[-1].split()[0])


def dvc_disk(url: str, archives: dict, md5s: dict, base: Path) -> dict[str, int]:
    """Run dvc.yaml's coco stages in a scratch copy of the repository; measure what they keep."""
    import yaml

    repo = base / "repo"
    shutil.copytree(
        REPO,
        repo,
        ignore=shutil.ignore_patterns(
            ".venv", ".git", "data", "results", "logs", ".snakemake", "__pycache__", "config.local"
        ),
    )
    raw = yaml.safe_load((repo / "params.yaml").read_text())
    fetch = raw["presets"]["coco2017"]["data"]["fetch"]
    fetch.update(base_url=url, splits=["val"])
    for key, path in archives.items():
        fetch["archives"][key] = {
            "path": str(path.relative_to(path.parents[1])),
            "md5": md5s[key],
            "size": path.stat().st_size,
        }
    (repo / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for args in (["repro", "-q", "coco_extract"], ["checkout", "--relink", "-q", "coco_download", "coco_extract"]):
        if dvc(*args, cwd=repo).returncode != 0:
            raise RuntimeError(f"dvc {' '.join(args)} failed in {repo}")
    parts = {
        "archives": repo / "data" / "archives",
        "extracted": repo / "data" / "coco2017",
        "dvc cache": repo / ".dvc" / "cache",
    }
    sizes = {name: du(path) for name, path in parts.items()}
    sizes["total (links counted once)"] = du(*parts.values())
    return sizes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--megabytes", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="fetch-bench-"))
    try:
        archives = build(base / "served", args.megabytes)
        md5s = {key: md5sum(path) for key, path in archives.items()}
        size = sum(p.stat().st_size for p in archives.values())
        server = serve(base / "served")
        url = f"http://127.0.0.1:{server.server_address[1]}"
        times: dict[str, list[float]] = {"pipeline": [], "curl+unzip": []}
        for i in range(args.repeats):
            for name, side in (("pipeline", pipeline_side), ("curl+unzip", curl_side)):
                work = base / f"{name}-{i}"
                times[name].append(side(url, archives, work, md5s))
                shutil.rmtree(work)
        best = {k: min(v) for k, v in times.items()}
        print(f"archive: {size / 1e6:.0f} MB ({len(archives)} files), best of {args.repeats}")
        for name, seconds in best.items():
            print(f"  {name:<12} {seconds:7.2f} s  {size / 1e6 / seconds:7.1f} MB/s")
        print(f"  ratio pipeline / curl+unzip: {best['pipeline'] / best['curl+unzip']:.2f}")
        print("disk with DVC (dvc repro coco_extract + checkout --relink; cache.type reflink,hardlink,copy):")
        for name, used in dvc_disk(url, archives, md5s, base).items():
            print(f"  {name:<28} {used / 1e6:8.0f} MB")
        server.shutdown()
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
