"""The code checks itself, over pipeline/ and benchmarks/, with the settings of pyproject.toml:
ruff's lint ([tool.ruff.lint]), ruff's format check (the layout `ruff format` writes) and mypy
([tool.mypy]: the pydantic plugin; every module's annotations). docs/testing.md says how to run
each by hand."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import HANG_S, REPO

BIN = Path(sys.executable).parent  # the environment's bin: the lock's ruff and mypy
CHECKED = ["pipeline", "benchmarks"]


def check(argv: list[str], timeout: int = 120) -> None:
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def test_ruff_lint_is_clean():
    check([str(BIN / "ruff"), "check", "--no-cache", *CHECKED])


def test_ruff_format_leaves_every_file_as_it_is():
    check([str(BIN / "ruff"), "format", "--check", "--no-cache", *CHECKED])



def test_mypy_finds_no_type_error():
    # mypy's own incremental cache, .mypy_cache/ (git-ignored), as `mypy pipeline benchmarks` by
    # hand keeps it: a fresh clone (CI) checks cold, and a fast tier rerun while working reads
    # the cache (docs/testing.md).
    check([str(BIN / "mypy"), *CHECKED], timeout=HANG_S)
