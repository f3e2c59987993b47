"""On a GPU, the loop, every strategy and the measuring queue their work without waiting for
the device: a few iterations of each strategy at one process under
torch.cuda.set_sync_debug_mode("error") (train.sync_debug; the detector's own forward is let
off: torchvision's detection ops read sizes on the host). A synchronisation raises where it
happens, and the run fails naming it."""
from __future__ import annotations

import json

import pytest

from benchmarks.common import one_process_entry, train
from pipeline.runtime import distributed
from pipeline.strategies import REGISTERED, sweep
from pipeline.training.train import SYNC_CHECK_AFTER

from .conftest import small_config

pytestmark = pytest.mark.skipif(
    distributed.gpu_count() == 0,
    reason="needs a GPU: torch.cuda.set_sync_debug_mode sees CUDA synchronisations only, and "
           "CI has no GPU (benchmarks/gpu_check.py's `sync` item checks the detector there)")


@pytest.mark.parametrize("strategy", [cls for cls in REGISTERED], ids=lambda cls: cls.name)
def test_a_strategy_at_one_process_synchronises_nothing(small_dataset, tmp_path, strategy):
    cfg = small_config(small_dataset, epochs=1, precision="bf16", sync_debug=True)
    run = sweep.fill(dict(one_process_entry(strategy, cfg), images_per_worker=2), cfg)
    summary = train(cfg, run, tmp_path / "run")
    if summary.status == "skipped":
        pytest.skip(summary.reason)
    assert summary.status == "ok", summary.reason
    records = [json.loads(line) for line in (tmp_path / "run" / "iterations.jsonl").read_text().splitlines()]
    assert len(records) > SYNC_CHECK_AFTER + 2  # iterations were checked, not only warmed up
