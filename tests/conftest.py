"""Shared fixtures: a small synthetic dataset and a fast demo configuration built from the
real params.yaml, so the tests exercise the same settings users run."""
from __future__ import annotations

import copy
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from pipeline.config import params
from pipeline.data import synthetic

REPO = Path(__file__).resolve().parents[1]
SMALL_DATA = {"seed": 7, "image_size": 96, "train_images": 24, "val_images": 8,
              "max_objects": 3, "clutter": 3}


def small_config(root: Path, **train_overrides) -> dict:
    """The demo preset, shrunk to seconds: small images, few iterations."""
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    cfg = copy.deepcopy(cfg)
    cfg["data"].update(root=str(root), synthetic=dict(SMALL_DATA))
    cfg["model"].update(min_size=96, max_size=96, channels=32, representation_size=128)
    cfg["train"].update({"epochs": 2, "images_per_worker": 4, "base_batch": 4, "warmup_iters": 4,
                         "lr_steps": [], "print_every": 5, **train_overrides})
    cfg["eval"].update(batch_size=4)
    return cfg


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    synthetic.generate(root, SMALL_DATA)
    return root


def write_coco(root: Path, split: str, images: list[dict], annotations: list[dict],
               categories=({"id": 1, "name": "thing"},)) -> Path:
    """A hand-built COCO annotation file, for the bad-input and evaluation tests."""
    path = root / "annotations" / f"instances_{split}2017.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": list(categories)}))
    (root / f"{split}2017").mkdir(parents=True, exist_ok=True)
    return path


@dataclass(frozen=True)
class FinishedWorkflow:
    root: Path                             # never edited: tests copy it (workflow.copy_finished)
    result: subprocess.CompletedProcess    # the run that finished it: its job table, its log


@pytest.fixture(scope="session")
def finished_demo(tmp_path_factory) -> FinishedWorkflow:
    """The whole workflow on the shrunk demo (every strategy, two seeds of ddp, ddp on in-memory
    data, evaluations during training), run once per session and shared by the workflow,
    integrity and fault tests (tests/workflow.py)."""
    from .workflow import copy_workflow, edit_params, snakemake, with_repeats_and_modes

    root = copy_workflow(tmp_path_factory.mktemp("finished-demo"))
    edit_params(root, with_repeats_and_modes)
    return FinishedWorkflow(root, snakemake(root))
