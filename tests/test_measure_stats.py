"""pipeline/measure/stats.py: the one torch-free reading of repeats and gaps that the GPU check
and the report's noise checks share."""
from __future__ import annotations

import math

import pytest

from pipeline.measure.stats import AGREEMENT, Repeats, gap, t975


def test_repeats_report_their_median_and_an_interval_that_widens_with_their_spread():
    quiet, noisy = Repeats.of([100.0, 101.0, 99.5]), Repeats.of([100.0, 110.0, 90.0])
    assert quiet.median == 100.0 and noisy.median == 100.0
    q_low, q_high = quiet.interval
    n_low, n_high = noisy.interval
    assert q_low < quiet.median < q_high and n_high - n_low > 5 * (q_high - q_low)
    # the t-interval of three repeats: mean ± t(0.975; 2) sd / sqrt(3)
    sd = quiet.spread.sd
    assert q_high - q_low == pytest.approx(2 * t975(2) * sd / math.sqrt(3))
    assert quiet.agree and not noisy.agree  # 1.5 % apart against 22 %
    assert quiet.disagreement == pytest.approx(101.0 / 99.5 - 1)
    assert quiet.disagreement < AGREEMENT < noisy.disagreement


def test_one_repeat_is_not_judged_and_missing_values_are_left_out():
    once = Repeats.of([50.0, None, float("nan")])
    assert once.values == (50.0,) and once.agree is None and math.isnan(once.interval[0])
    assert once.summary()["repeats"] == 1


def test_a_gap_beyond_the_noise_and_one_within_it():
    single = Repeats.of([60.0, 60.5, 59.8])
    slower = Repeats.of([54.0, 54.3, 53.9])
    same = Repeats.of([60.2, 59.7, 60.4])
    g = gap(slower, single)
    assert g.ratio == pytest.approx(54.0 / 60.0)
    assert g.low < g.ratio < g.high < 1 and g.verdict == "beyond the noise"
    h = gap(same, single)
    assert h.low < 1 < h.high and h.verdict == "within the noise"
    assert h.noise == pytest.approx(max(same.disagreement, single.disagreement))
