"""The GPU check's protocol (benchmarks/interleave.py, benchmarks/segments.py) on CPU with the
demo's tiny model: configurations timed in turns, each segment of one configuration replaying
the same batches from the same trained state, so that its repeats differ by the machine alone."""
from __future__ import annotations

import pytest
import torch

from benchmarks import gpu_check
from benchmarks.interleave import Config, Protocol, interleave
from pipeline.data import synthetic

from .conftest import HANG_S


@pytest.fixture(scope="module")
def tiny_settings(tmp_path_factory) -> dict:
    """The check's CPU-smoke settings (tiny model, 64 px synthetic images), its data made."""
    work = tmp_path_factory.mktemp("protocol")
    sizes = gpu_check.CPU_SMOKE
    settings = gpu_check.overrides(sizes, 1, work / "data", work / "unused-backbone.pth")
    cfg = gpu_check.base_config(sizes, 1, work / "data", work / "unused-backbone.pth")
    settings["model"] = gpu_check.with_model(cfg, sizes, tiny=True).model.model_dump()
    synthetic.generate(cfg.data.root, cfg.data.synthetic)
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


def test_a_knob_an_older_tree_lacks_is_left_out_at_its_default_and_refused_otherwise(tmp_path):
    """--against with f484bdb: model.norm (newer) at its default is what f484bdb does without the
    knob, so it is left out there; at another value the older tree refuses it by name. The
    tree's own params loader reads it, in a process of its own, as segments.py's worker does."""
    import json
    import subprocess
    import sys

    import yaml

    from .conftest import REPO
    tree = gpu_check.against_tree("f484bdb", tmp_path)
    defaults = yaml.safe_load((REPO / "params.yaml").read_text())["defaults"]
    code = ("import importlib.util, json, os, sys; tree, defaults, norm = sys.argv[1], "
            "json.loads(sys.argv[2]), sys.argv[3]; sys.path.insert(0, tree); os.chdir(tree); "
            f"spec = importlib.util.spec_from_file_location('segments', {str(REPO / 'benchmarks' / 'segments.py')!r}); "
            "segments = importlib.util.module_from_spec(spec); spec.loader.exec_module(segments)\n"
            "try:\n    cfg = segments.load_cfg(__import__('pathlib').Path(tree), "
            "{'model': {'norm': norm, 'min_size': 64}}, defaults=defaults); "
            "print(json.dumps({'norm' in cfg['model']: cfg['model']['min_size']}))\n"
            "except KeyError as err:\n    print('refused:', err)")

    def load(norm: str) -> str:
        done = subprocess.run([sys.executable, "-c", code, str(tree), json.dumps(defaults), norm],
                              capture_output=True, text=True, timeout=HANG_S)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    assert defaults["model"]["norm"] == "batchnorm"
    assert load("batchnorm") == '{"false": 64}'  # left out; the other key applied
    assert load("groupnorm").startswith("refused:") and "has no norm in this tree" in load("groupnorm")
