"""The GPU check's protocol (benchmarks/interleave.py, benchmarks/segments.py) on CPU with the
demo's tiny model: configurations timed in turns, each segment of one configuration replaying
the same batches from the same trained state, so that its repeats differ by the machine alone."""
from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.interleave import Config, Protocol, interleave
from pipeline.data import synthetic


@pytest.fixture(scope="module")
def tiny_settings(tmp_path_factory) -> dict:
    """The check's CPU-smoke settings (tiny model, 64 px synthetic images), its data made."""
    work = tmp_path_factory.mktemp("protocol")
    sizes = gpu_check.CPU_SMOKE
    settings = gpu_check.overrides(sizes, 1, work / "data", work / "unused-backbone.pth")
    cfg = gpu_check.base_config(sizes, 1, work / "data", work / "unused-backbone.pth")
    settings["model"] = gpu_check.with_model(cfg, sizes, tiny=True)["model"]
    synthetic.generate(cfg["data"]["root"], cfg["data"]["synthetic"])
    return settings


def single(name: str, precision: str) -> Config:
    return Config(name, {"strategy": "single", "workers": 1, "images_per_worker": 2,
                         "precision": precision})


@pytest.mark.slow
def test_each_segment_of_a_configuration_replays_the_same_batches_from_the_same_state(
        tiny_settings, tmp_path):
    """Without the replay (benchmarks/repeat_agreement.py shows both ways) each segment took the
    loader's next batches, and the model trained on in between: other losses, other work."""
    protocol = Protocol(warmup=2, timed=3, repeats=3, rewarm=1)
    configs = interleave([single("b2-fp32", "fp32"), single("b2-bf16", "bf16")], tiny_settings,
                         tmp_path, protocol)
    for config in configs:
        assert not config.error and len(config.segments) == protocol.repeats, config.error
        digests = {s["batches"] for s in config.segments}
        # the same batches, in the same order, in every repeat ...
        assert len(digests) == 1 and None not in digests, digests
        # ... from the same weights and step: on CPU (deterministic algorithms) the very same
        # losses, although the other configuration trained in between
        losses = [s["losses"] for s in config.segments]
        assert all(len(l) == protocol.timed for l in losses) and losses[1:] == losses[:-1], losses
        assert config.row()["batches"] == sorted(digests)
        # the data wait's share is the loader-fed warm-up's: the timed steps wait on no loader
        assert 0 <= config.segments[0]["data_share"] < 1
    # the two configurations trained on the same kept batches (one loader order, one seed)
    assert configs[0].segments[0]["batches"] == configs[1].segments[0]["batches"]
    assert configs[0].segments[0]["losses"] != configs[1].segments[0]["losses"]  # fp32 vs bf16


def test_the_bundle_lists_the_configurations_whose_repeats_disagree_by_more_than_3_percent():
    """A row's `agree` (its repeats within 3 %, pipeline/measure/stats.py) and the bundle's line
    that names each row whose repeats did not, with how far apart they were."""
    steady = Config("steady", {}, segments=[{"images_per_second": v} for v in (100.0, 101.0, 100.5)])
    apart = Config("apart", {}, segments=[{"images_per_second": v} for v in (100.0, 104.0, 101.0)])
    rows = [steady.row(), apart.row()]
    assert [r["agree"] for r in rows] == [True, False]
    bundle = {"device": "CPU", "mode": "a test", "seconds": 1.0,
              "provenance": {"packages": {"torch": torch.__version__}, "git_revision": "HEAD"},
              "items": {"throughput": {"status": "done", "runs": rows}}}
    (line,) = [l for l in gpu_check.markdown(bundle).splitlines() if "more than 3 %" in l]
    assert "apart (4.0 %)" in line and "steady" not in line
