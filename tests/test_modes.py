"""The folders an output is written into follow the umask of the run that writes it, like the
output itself: a rerun under umask 022 after one under 077 leaves nothing private. Nothing the
pipeline did not write into changes mode (pipeline/runtime/files.py's module docstring)."""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

import pytest

from pipeline.runtime.files import atomic_path, write_json, write_text

OUTPUTS = ["results/summary.csv", "results/report/report.html", "results/report/figures/a.png",
           "results/paper/paper.pdf", "results/runs/demo/single/metrics.json"]


@contextlib.contextmanager
def umask(mask: int):
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def write_all(names) -> None:
    for name in names:
        write_text(name, "x")


@pytest.fixture
def workdir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_a_rerun_gives_files_and_their_folders_its_umask(workdir):
    with umask(0o077):
        write_all(OUTPUTS)
        write_text("results/report/kept.txt", "not written again")
        os.makedirs("results/commbench")  # a folder no output goes into this time
    assert {mode(workdir / p) for p in ["results", "results/report/figures", "results/paper"]} == {0o700}
    with umask(0o022):
        write_all(OUTPUTS)
    for name in OUTPUTS:
        assert mode(workdir / name) == 0o644, name
        for folder in Path(name).parents[:-1]:  # up to results/, every folder on the way
            assert mode(workdir / folder) == 0o755, folder
    assert mode(workdir / "results/report/kept.txt") == 0o600  # a file not written keeps its mode
    assert mode(workdir / "results/commbench") == 0o700  # a folder not written into keeps it too
    assert mode(workdir) == stat.S_IMODE(os.stat(workdir).st_mode)  # above results/: untouched


def test_only_folders_of_ours_under_results_change(workdir, monkeypatch):
    elsewhere, users = workdir / "elsewhere", workdir / "users-scratch"
    with umask(0o077):
        write_text(elsewhere / "out.json", "{}")  # an --out of the user's choosing
        users.mkdir()
    os.makedirs("results")
    os.symlink(users, "results/linked")
    with umask(0o022):
        write_json(elsewhere / "out.json", {})
        write_text("results/linked/x.txt", "x")
    assert mode(elsewhere) == 0o700  # outside results/
    assert mode(users) == 0o700  # a link's target is the user's, not ours
    assert mode(workdir / "results/linked/x.txt") == 0o644
    with umask(0o077):
        write_text("results/report/a.txt", "x")
    monkeypatch.setattr(os, "geteuid", lambda: os.getuid() + 1)  # someone else's folders
    with umask(0o022):
        write_text("results/report/a.txt", "x")
    assert mode(workdir / "results/report") == 0o700
    assert mode(workdir / "results/report/a.txt") == 0o644  # the file is ours: we made it


def test_a_shared_folders_set_group_id_bit_stays(workdir):
    with umask(0o077):
        os.makedirs("results/report")
        os.chmod("results/report", 0o2700)
    with umask(0o002):
        with atomic_path("results/report/summary.csv") as tmp:
            tmp.write_text("a\n")
    assert mode(workdir / "results/report") == 0o2775
    assert mode(workdir / "results/report/summary.csv") == 0o664

