"""The accuracy benchmark over seeds (benchmarks/accuracy_seeds.py), on a shrunk demo: two
configurations x 2 seeds, really trained and scored, with the report's statistics."""
from __future__ import annotations

import json
import math

import pytest

from benchmarks import accuracy_seeds

SHRUNK = ["data.synthetic.train_images=24", "data.synthetic.val_images=8", "train.epochs=1",
          "eval.every_epochs=0", "train.checkpoint_every=0", "train.lr_steps=[]"]


@pytest.mark.slow
def test_two_configurations_over_two_seeds(tmp_path, capsys):
    report = accuracy_seeds.main(["--preset", "demo", "--seeds", "2", "--parallel", "2",
                                  "--work", str(tmp_path), "--set", *SHRUNK,
                                  "--config", "recipe:", "--config", "warm-up 2: train.warmup_iters=2"])
    recipe, fixed = report["configurations"]["recipe"], report["configurations"]["warm-up 2"]
    # `auto` warms up over the epoch's iterations less one (the generator leaves out an image
    # without boxes now and then: 2 or 3 batches of 8); the other configuration's override took
    iterations = recipe["runs"][0]["iterations"]
    assert iterations in (2, 3) and [r["warmup_iters"] for r in recipe["runs"]] == [iterations - 1] * 2
    assert [r["warmup_iters"] for r in fixed["runs"]] == [2, 2]
    assert [r["seed"] for r in recipe["runs"]] == [0, 1]
    for config in (recipe, fixed):
        ap = config["AP"]
        assert ap["n"] == 2 and 0 <= ap["mean"] <= 1
        assert ap["mean"] == pytest.approx(sum(r["AP"] for r in config["runs"]) / 2)
        assert math.isnan(ap["interval95"][0]) or ap["interval95"][0] <= ap["mean"] <= ap["interval95"][1]
    assert {c["metric"] for c in report["comparisons"]} == {"AP", "AP50", "images_per_second"}
    saved = json.loads((tmp_path / "accuracy_seeds.json").read_text())
    assert saved["provenance"]["git_revision"] and saved["seeds"] == 2
    out = capsys.readouterr().out
    assert "recipe - warm-up 2: AP" in out and "Welch t" in out


def test_a_wrong_override_is_refused_with_its_key(tmp_path):
    with pytest.raises(SystemExit, match="warmup_itres"):
        accuracy_seeds.main(["--preset", "demo", "--seeds", "1", "--work", str(tmp_path),
                             "--config", "typo: train.warmup_itres=3"])
    with pytest.raises(SystemExit, match="is not KEY=VALUE"):
        accuracy_seeds.main(["--preset", "demo", "--work", str(tmp_path), "--set", "train.epochs"])
