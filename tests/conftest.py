"""Shared fixtures: a small synthetic dataset and a fast demo configuration built from the
real params.yaml, so the tests exercise the same settings users run."""
from __future__ import annotations

import json
import os
from pathlib import Path

# Before torch loads OpenMP, here and in every process a test starts (they inherit it): two
# test workers share 2 cores, each running 2-thread training and evaluation processes. OpenMP
# threads that spin while they wait then burn the slices their partners need: two concurrent
# 2-thread ResNet-50 steps took 1.3-1.8 s each spinning, 0.59 s waiting passively (alone:
# 0.73 s). It changes how threads wait, not what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from pipeline.config import params, schema  # noqa: E402
from pipeline.data import synthetic  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL_DATA = {"seed": 7, "image_size": 96, "train_images": 24, "val_images": 8,
              "max_objects": 3, "clutter": 3}  # as params.yaml writes data.synthetic
SMALL_SYNTHETIC = schema.Synthetic.model_validate(SMALL_DATA)


def small_config(root: Path, **train_overrides) -> schema.Config:
    """The demo preset, shrunk to seconds: small images, few iterations."""
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    return schema.replaced(
        cfg, data={"root": str(root), "synthetic": dict(SMALL_DATA)},
        model={"min_size": 96, "max_size": 96, "channels": 32, "representation_size": 128},
        train={"epochs": 2, "images_per_worker": 4, "base_batch": 4, "warmup_iters": 4,
               "lr_steps": [], "print_every": 5, **train_overrides},
        eval={"batch_size": 4})


def user_data(root: Path, **changes) -> schema.Data:
    """The data section of a COCO-layout tree of the user's at `root` (no generator, no fetch),
    refusing what the defaults refuse; `changes` (exif_orientation=..., ...) over it."""
    demo = params.load_resolved(REPO / "params.yaml", preset="demo").data
    return schema.replaced(demo, **{"name": "mine", "root": str(root), "synthetic": None, "fetch": None,
                                    "exif_orientation": "refuse", "category_mismatch": "refuse", **changes})


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    synthetic.generate(root, SMALL_SYNTHETIC)
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


# ---- two test processes (pytest-xdist: `-n 2` in pyproject.toml) ----------------------------
# One process alone leaves about a third of 2 cores idle (process start-up, SLURM's status
# polls, waits for a checkpoint to kill), so two workers share the machine. A fixture is built
# once per worker that asks for it, so each worker runs whole units:

def unit(nodeid: str) -> str:
    """The tests one worker runs together: a folder under tests/ whole (its tests share a
    session fixture its conftest.py builds: tests/finished_demo/), else one file (its module
    fixtures: a trained run, a SLURM cluster, an HTTP server)."""
    return "/".join(nodeid.split("::", 1)[0].split("/")[:2])


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling by `unit` (its `--dist loadgroup` marks do not reach the test
    ids under pytest 9), taking the units in the workers' order (below)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    config.option.loadscopereorder = False
    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker, the units that hold a slow test first (a worker that starts the
    finished workflow last ends last); a stable sort keeps each unit's own order."""
    if not hasattr(config, "workerinput"):
        return
    slow = {unit(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: unit(item.nodeid) not in slow)
