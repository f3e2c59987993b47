"""The noise rule: means and spreads over seeds, Welch's interval, and the sentences built on
them, which must say 'beyond the noise' only when the spread allows it."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from pipeline.report.noise import Spread, comparisons, difference, t975


def runs(entry: str, values: list[float], workers: int = 2, metric: str = "images_per_second"):
    return [{"run_id": f"{entry}-s{i}", "entry": entry, "status": "ok", "workers": workers,
             "data_mode": "real", metric: v, "AP": 0.5} for i, v in enumerate(values)]


def test_spread_is_the_sample_standard_deviation():
    spread = Spread.of([10.0, 12.0, 14.0])
    assert (spread.mean, spread.sd, spread.n) == (12.0, 2.0, 3)
    assert math.isnan(Spread.of([3.0]).sd) and Spread.of([3.0]).text(1) == "3.0 (n=1)"
    assert Spread.of([10.0, 12.0, 14.0]).text(2) == "12.00 ± 2.00 (n=3)"


def test_welch_interval_matches_the_textbook():
    # Equal n and sd: df = 2(n-1) = 4, t = 2.776, se = sqrt(2 * 1/3)
    d = difference(Spread.of([11.0, 12.0, 13.0]), Spread.of([9.0, 10.0, 11.0]))
    half = 2.776 * math.sqrt(2 / 3)
    assert (d.low, d.high) == pytest.approx((2 - half, 2 + half))
    assert d.verdict == "within the noise" and d.ratio == pytest.approx(1.2)  # 2 ± 2.27
    assert t975(4.9) == 2.776 and t975(100) == 1.96
    assert d.t == pytest.approx(2 / math.sqrt(2 / 3)) and d.df == pytest.approx(4)
    # the mean's own interval: 12 ± t(2) * 1 / sqrt(3)
    assert Spread.of([11.0, 12.0, 13.0]).interval == pytest.approx((12 - 4.303 / math.sqrt(3),
                                                                     12 + 4.303 / math.sqrt(3)))
    assert all(math.isnan(x) for x in Spread.of([1.0]).interval)


def test_the_statement_flips_when_the_spread_outgrows_the_difference():
    tight = pd.DataFrame(runs("ddp-w2-b4", [50.0, 50.5, 51.0]) + runs("ps-w2-b4", [45.0, 45.5, 46.0]))
    found = comparisons(tight, {"images_per_second": 2})
    row = found[found["metric"] == "images_per_second"].iloc[0]
    assert row["verdict"] == "beyond the noise"
    assert row["statement"].startswith("ddp-w2-b4 reaches 1.110x the images/s of ps-w2-b4")
    assert "beyond the noise" in row["statement"]
    # Same means, but seeds that scatter by more than the difference between the strategies.
    loose = pd.DataFrame(runs("ddp-w2-b4", [40.0, 50.5, 61.0]) + runs("ps-w2-b4", [35.0, 45.5, 56.0]))
    row = comparisons(loose, {"images_per_second": 2}).iloc[0]
    assert row["a_mean"] == pytest.approx(50.5) and row["b_mean"] == pytest.approx(45.5)
    assert row["verdict"] == "within the noise" and "within the noise" in row["statement"]


def test_only_entries_with_the_same_workers_and_data_mode_are_compared():
    frame = pd.DataFrame(runs("single-w1-b8", [40.0, 41.0], workers=1)
                         + runs("ddp-w2-b4", [60.0, 61.0]) + runs("ps-w2-b4", [55.0])
                         + [dict(r, data_mode="synthetic", entry="ddp-w2-b4-synthetic")
                            for r in runs("x", [70.0, 71.0])])
    found = comparisons(frame, {"images_per_second": 2})
    assert list(zip(found["a"], found["b"])) == [("ddp-w2-b4", "ps-w2-b4")]
    assert found.iloc[0]["verdict"] == "not judged (fewer than 2 runs)"
