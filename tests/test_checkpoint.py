"""The Checkpointer (pipeline/training/checkpoint.py) on its own, in one process: named stateful
parts saved and restored, a checkpoint of other settings cleared, one of another run refused.
No model and no loop: the parts here are the loop's own small ones (state.py)."""
from __future__ import annotations

import pytest
import torch

from pipeline.training.checkpoint import CheckpointError, Checkpointer
from pipeline.training.state import Moved, TrainState


def checkpointer(state_dir, fingerprint="f1", run="demo/single-w1-b4-s0") -> Checkpointer:
    return Checkpointer(state_dir, fingerprint, run, parts={"train_state": TrainState(), "scaler": None},
                        rank_parts={"moved": Moved()})


def test_what_is_saved_is_restored(tmp_path):
    saved = checkpointer(tmp_path / "state")
    assert not saved.restore(rank=0, reports=True)  # nothing to resume: a clean start
    saved.parts["train_state"].step = 7
    saved.rank_parts["moved"].add(100, 50)
    saved.save(writes=True)
    assert torch.load(tmp_path / "state" / "checkpoint.pt", weights_only=True)["scaler"] is None
    resumed = checkpointer(tmp_path / "state")
    assert resumed.restore(rank=0, reports=True)
    assert resumed.parts["train_state"].step == 7
    assert (resumed.rank_parts["moved"].sent, resumed.rank_parts["moved"].iterations) == (100, 1)


def test_a_checkpoint_of_other_settings_is_cleared_and_the_run_starts_over(tmp_path):
    checkpointer(tmp_path / "state").save(writes=True)
    assert not checkpointer(tmp_path / "state", fingerprint="f2").restore(rank=0, reports=True)
    assert list((tmp_path / "state").iterdir()) == []


def test_a_checkpoint_of_another_run_is_refused_and_kept(tmp_path):
    checkpointer(tmp_path / "state").save(writes=True)
    with pytest.raises(CheckpointError, match="was written for run 'demo/single-w1-b4-s0'"):
        checkpointer(tmp_path / "state", run="demo/ddp-w2-b4-s0").restore(rank=0, reports=True)
    assert (tmp_path / "state" / "checkpoint.pt").exists()
