"""`python -m pipeline.compare`: two results trees (or two presets of one) side by side, entry
by entry, with the report's noise rule (issue 50, point 4). Made-up finished run folders of the
real format (tests/test_report.py's make_ok_run, seed by seed); no training, no torch."""
from __future__ import annotations

import csv
import math
import subprocess
import sys

import pytest

from pipeline import compare

from .conftest import HANG_S, REPO
from .test_disturbance import seeded_dirs


def tree(root, preset: str, entries: dict[str, list[float]], ap: float = 0.1):
    """A results tree holding `preset`'s runs: entry -> images/s seed by seed (AP: `ap`, plus
    0.002 a seed)."""
    seeded_dirs(root / "runs" / preset, entries, ap=ap)
    return root


def rows_by(rows: list[dict]) -> dict[tuple[str, str], dict]:
    return {(row["entry"], row["metric"]): row for row in rows}


def test_entries_are_matched_by_name_and_each_gets_the_noise_rules_verdict(tmp_path, capsys):
    a = tree(tmp_path / "a", "demo", {"single-w1-b8": [30.0, 30.3, 29.9], "ddp-w2-b4": [40.0, 41.0, 39.0],
                                      "ps-w2-b4": [20.0]})
    b = tree(tmp_path / "b", "demo", {"single-w1-b8": [30.2, 29.8, 30.1], "ddp-w2-b4": [50.0, 50.5, 49.5],
                                      "ps-w2-b4": [21.0], "zero-w2-b4": [35.0, 35.5]})
    compare.main([str(a), str(b), "--csv", str(tmp_path / "out" / "compare.csv")])
    printed = capsys.readouterr().out
    with open(tmp_path / "out" / "compare.csv") as handle:
        rows = rows_by(list(csv.DictReader(handle)))

    single, ddp = rows["single-w1-b8", "images_per_second"], rows["ddp-w2-b4", "images_per_second"]
    assert single["verdict"] == "within the noise" and float(single["a_n"]) == 3
    assert ddp["verdict"] == "beyond the noise"
    assert float(ddp["ratio"]) == pytest.approx(50.0 / 40.0)
    assert float(ddp["a_low"]) < 40.0 < float(ddp["a_high"])  # the 95 % interval of A's mean
    assert float(ddp["difference_low"]) > 0  # B faster: the interval of B - A excludes 0
    # the same AP on both sides, seed by seed: no difference to find
    assert rows["ddp-w2-b4", "AP"]["verdict"] == "within the noise"
    assert rows["ps-w2-b4", "images_per_second"]["verdict"] == "not judged (fewer than 2 runs)"
    assert rows["zero-w2-b4", "images_per_second"]["verdict"] == "only in B"
    assert rows["zero-w2-b4", "AP"]["a_n"] == "0"
    # the table says the same, with the rule spelt out once
    assert f"A: {a / 'runs' / 'demo'} (7 runs)" in printed and "verdict: Welch's 95% t-interval" in printed
    line = next(line for line in printed.splitlines() if line.startswith("ddp-w2-b4") and "images/s" in line)
    assert "40.0 [" in line and "n=3" in line and "1.250" in line and line.endswith("beyond the noise")


def test_two_presets_of_one_tree_and_a_side_without_finished_runs(tmp_path):
    results = tree(tmp_path, "demo", {"single-w1-b8": [30.0, 30.2, 29.8]}, ap=0.10)
    tree(tmp_path, "demo-quick", {"single-w1-b8": [30.1, 29.9], "dp-w2-b4": []}, ap=0.05)
    (results / "runs" / "demo-quick" / "dp-w2-b4-s0").mkdir()  # a run not yet finished: not read
    a = compare.side("A", results, "demo")
    b = compare.side("B", results, "demo-quick")
    rows = rows_by(compare.compare(a, b))
    assert rows["single-w1-b8", "AP"]["verdict"] == "beyond the noise"
    assert rows["single-w1-b8", "AP"]["ratio"] == pytest.approx(0.051 / 0.102)
    assert rows["single-w1-b8", "images_per_second"]["verdict"] == "within the noise"
    assert ("dp-w2-b4", "images_per_second") not in rows


def test_a_skipped_entry_is_named_not_judged(tmp_path):
    a = tree(tmp_path / "a", "demo", {"single-w1-b8": [30.0, 30.1], "dp-w2-b4": [1.0]})
    skipped = a / "runs" / "demo" / "dp-w2-b4-s0" / "train_summary.json"
    skipped.write_text(skipped.read_text().replace('"status": "ok"', '"status": "skipped"'))
    rows = rows_by(compare.compare(compare.side("A", a, None), compare.side("B", a, None)))
    assert rows["dp-w2-b4", "images_per_second"]["verdict"] == "no finished run in A and B"
    assert math.isnan(rows["dp-w2-b4", "images_per_second"]["ratio"])


def test_what_is_not_a_results_tree_is_named_with_the_remedy(tmp_path):
    with pytest.raises(SystemExit, match=rf"error: {tmp_path}: not a results tree \(it has no runs/ folder\)"):
        compare.main([str(tmp_path), str(tmp_path)])
    two = tree(tree(tmp_path / "two", "demo", {"single-w1-b8": [30.0]}), "coco2017", {"single-w1-b2": [3.0]})
    with pytest.raises(SystemExit, match=r"holds 2 presets \(coco2017, demo\); name one with --preset-a"):
        compare.main([str(two), str(two)])
    with pytest.raises(SystemExit, match=r"runs/demo-quick: no such preset folder; .* holds coco2017, demo"):
        compare.main([str(two), str(two), "--preset", "demo-quick"])
    (two / "runs" / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"runs/empty: no finished run .*run the workflow for preset empty"):
        compare.main([str(two), str(two), "--preset-a", "demo", "--preset-b", "empty"])


def test_the_command_runs_without_torch(tmp_path):
    results = tree(tmp_path, "demo", {"single-w1-b8": [30.0, 30.2]})
    code = ("import runpy, sys; sys.argv = ['compare', sys.argv[1], sys.argv[1]]; "
            "runpy.run_module('pipeline.compare', run_name='__main__'); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    done = subprocess.run([sys.executable, "-c", code, str(results)], cwd=REPO, capture_output=True,
                          text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert "single-w1-b8" in done.stdout and "within the noise" in done.stdout
