"""The code checks itself: ruff's lint over pipeline/ and benchmarks/ (pyproject.toml's
[tool.ruff]) is clean. (Its format check and mypy are not clean yet: docs/testing.md.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from .conftest import REPO

BIN = Path(sys.executable).parent  # the environment's bin: the lock's ruff


def test_ruff_lint_is_clean():
    result = subprocess.run([str(BIN / "ruff"), "check", "--no-cache", "pipeline", "benchmarks"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
