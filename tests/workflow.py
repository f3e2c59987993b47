"""The real workflow on the shrunk demo, shared by the tests that run it: copying the
repository's workflow into a directory, editing its params, running Snakemake and reading the
jobs it ran. `finished_demo` (tests/finished_demo/conftest.py) runs it once per session; each test module that
needs a finished workflow works on its own copy (`copy_finished`), which Snakemake sees as up to
date, so no module pays for the whole workflow again."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

import pipeline.report.paper

from .conftest import HANG_S, REPO, SMALL_DATA

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
COPIED = ["Snakefile", "rules", "params.yaml", "dvc.yaml", "pipeline", "paper", "profiles", ".dvc",
          ".dvcignore", ".gitignore"]


def tiny_params(raw: dict) -> dict:
    demo = raw["presets"]["demo"]
    demo["data"].update(synthetic=dict(SMALL_DATA))
    demo["model"].update(min_size=96, max_size=96, channels=32, representation_size=128)
    demo["train"].update(epochs=2, images_per_worker=4, base_batch=4, warmup_iters=4, lr_steps=[])
    demo["eval"].update(batch_size=4)
    # PNG figures only, small: a report with PDFs too costs twice the CPU; tests/test_report.py
    # draws every figure in both formats, and the finished demo keeps both (with_repeats_and_modes)
    raw["report"].update(figure_formats=["png"], dpi=50)  # the schema's least
    # timed in seconds; no retries: the suite's other worker keeps every measurement outside a
    # quiet machine's band, so retrying would only triple the stage (retrying is tested in
    # tests/test_commbench.py and tests/test_disturbance.py)
    demo["commbench"] = {"max_bytes": 2**20, "repeats": 3, "compute_repeats": 5, "retries": 0}
    # Every strategy through the workflow; dp is skipped (with its reason) on a CPU machine.
    demo["sweep"] = [{"strategy": "single", "workers": 1},
                     {"strategy": "ddp", "workers": 2, "images_per_worker": 2},
                     {"strategy": "ps", "workers": 2, "images_per_worker": 2},
                     {"strategy": "dp", "workers": 2, "images_per_worker": 2},
                     {"strategy": "zero", "workers": 2, "images_per_worker": 2},
                     {"strategy": "fsdp", "workers": 2, "images_per_worker": 2}]
    return raw


PAPER_JOB = {} if pipeline.report.paper.missing_tools() else {"paper": 1}  # with a LaTeX toolchain


def edit_params(workdir: Path, change) -> None:
    path = workdir / "params.yaml"
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def copy_workflow(root: Path) -> Path:
    """The files the workflow needs, copied into `root` (a test may edit them there)."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", "tmp"))
        else:
            shutil.copy2(source, root / name)
    return root


def with_repeats_and_modes(raw: dict) -> dict:
    """tiny_params, plus what the report compares: seeds of one entry, and one entry on
    in-memory data, with evaluations during training; and a checkpoint every 4 iterations of
    the 6 an epoch, so that the integrity tests' kills land mid-epoch."""
    tiny_params(raw)
    demo = raw["presets"]["demo"]
    demo["eval"]["every_epochs"] = 1
    raw["report"]["figure_formats"] = ["png", "pdf"]  # the paper's figures as users get them
    demo["train"]["checkpoint_every"] = 4
    demo["sweep"][1]["repeats"] = 2  # ddp: two seeds (one of each other entry keeps it short)
    demo["sweep"].append({"strategy": "ddp", "workers": 2, "images_per_worker": 2,
                          "data_mode": "synthetic"})
    return raw


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(SNAKEMAKE + ["--cores", "2", *args], cwd=workdir, capture_output=True,
                            text=True, timeout=HANG_S)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}"
                             f"{failed_logs(workdir, result.stdout + result.stderr)}")
    return result


def failed_logs(workdir: Path, output: str) -> str:
    """The end of each failed job's log, which the next command of a test may overwrite."""
    tails = []
    for log in dict.fromkeys(re.findall(r"log: (\S+\.log) \(check log", output)):
        path = workdir / log
        if path.exists():
            tails.append(f"\n--- {log} (last 40 lines)\n" + "\n".join(path.read_text().splitlines()[-40:]))
    return "".join(tails)


def jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table Snakemake prints before running (or dry-running) jobs."""
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:", 1)[1].split("total", 1)[0]
    return {name: int(count) for name, count in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def copy_finished(finished: Path, root: Path) -> Path:
    """A finished workflow directory copied whole, times kept: Snakemake finds nothing to do."""
    shutil.copytree(finished, root, symlinks=True, dirs_exist_ok=True)
    return root


PLAN_RECORDS = ("metadata", "incomplete")  # what of .snakemake a later plan reads


def on_disk(path: Path) -> dict:
    """Every file and folder under `path` with its size, time and mode: what a dry run must
    leave as it was (a folder's time moves when anything is made or deleted in it). Of
    .snakemake, only the records a later plan reads (each output's params, code and input;
    the incomplete jobs): Snakemake rewrites its I/O cache (read only with --trust-io-cache) and
    makes its locks folder on every dry run, and the workflow clears a killed Snakemake's
    locks (pipeline/runtime/stale_locks.py) when it plans."""
    def kept(relative: Path) -> bool:
        return ".git" not in relative.parts and (
            relative.parts[:1] != (".snakemake",) or relative.parts[1:2] and relative.parts[1] in PLAN_RECORDS)
    return {str(p.relative_to(path)): (p.lstat().st_size, p.lstat().st_mtime_ns, p.lstat().st_mode)
            for p in [path, *path.rglob("*")] if kept(p.relative_to(path))}
