"""The tests that share one finished demo workflow (`finished_demo`): a folder, so that a test
worker runs them all and builds it once (tests/conftest.py: unit)."""
from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class FinishedWorkflow:
    root: Path                             # never edited: tests copy it (workflow.copy_finished)
    result: subprocess.CompletedProcess    # the run that finished it: its job table, its log


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory) -> FinishedWorkflow:
    """The whole workflow on the shrunk demo (every strategy, two seeds of ddp, ddp on in-memory
    data, evaluations during training), run once per session and shared by this
    folder's workflow, integrity and fault tests (tests/workflow.py); xdist runs the folder on one
    worker (tests/conftest.py: unit), so it is built once."""
    from ..workflow import copy_workflow, edit_params, snakemake, with_repeats_and_modes

    root = copy_workflow(tmp_path_factory.mktemp("finished-demo"))
    edit_params(root, with_repeats_and_modes)
    return FinishedWorkflow(root, snakemake(root))
