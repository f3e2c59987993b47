"""Repeats and noise: the mean and spread of each sweep entry's runs, and whether two entries
differ by more than their run-to-run spread. The report's comparisons and the accuracy
benchmark over seeds (benchmarks/accuracy_seeds.py) both take their statistics from here.

The rule (said in the report and the paper, from NOISE_RULE): Welch's two-sided 95 % t-interval
of the difference of the two means; the difference is "beyond the noise" when the interval
excludes 0, "within the noise" when it contains 0, and cannot be judged when either side has
fewer than 2 runs (no spread to compare against). The statistics themselves (Spread, Welch's
difference, the t table) are pipeline/measure/stats.py's, which the GPU check shares.
"""

from __future__ import annotations

import math

import pandas as pd

from ..measure.stats import T975, Difference, Spread, difference, t975  # noqa: F401 (re-exported)

NOISE_RULE = (
    "Welch's 95% t-interval of the difference of two entries' means over their seeds: "
    "beyond the noise when it excludes 0, within the noise when it contains 0, not "
    "judged with fewer than 2 runs on a side"
)


def spreads(frame: pd.DataFrame, metric: str) -> dict[str, Spread]:
    """entry id -> the Spread of `metric` over that entry's runs (rows of summary.csv)."""
    return {entry: Spread.of(group[metric]) for entry, group in frame.groupby("entry", sort=False)}


def comparisons(summary: pd.DataFrame, metrics: dict[str, int]) -> pd.DataFrame:
    """Every pair of entries with the same workers and data mode, for each metric (its value:
    decimals shown): both means with spread, the ratio, the 95 % interval and the verdict."""
    done = summary[summary["status"] == "ok"]
    rows = []
    for (workers, mode), group in done.groupby(["workers", "data_mode"], sort=True):
        entries = list(dict.fromkeys(group["entry"]))
        for i, first in enumerate(entries):
            for second in entries[i + 1 :]:
                for metric, places in metrics.items():
                    values = spreads(group, metric)
                    if values[first].n == 0 or values[second].n == 0:
                        continue  # e.g. AP of a run that was not evaluated
                    d = difference(values[first], values[second])
                    rows.append(
                        {
                            "workers": int(workers),
                            "data_mode": mode,
                            "metric": metric,
                            "a": first,
                            "b": second,
                            "a_mean": d.a.mean,
                            "a_sd": d.a.sd,
                            "a_n": d.a.n,
                            "b_mean": d.b.mean,
                            "b_sd": d.b.sd,
                            "b_n": d.b.n,
                            "ratio": d.ratio,
                            "low": d.low,
                            "high": d.high,
                            "verdict": d.verdict,
                            "statement": statement(metric, first, second, d, places),
                        }
                    )
    return pd.DataFrame(
        rows,
        columns=[
            "workers",
            "data_mode",
            "metric",
            "a",
            "b",
            "a_mean",
            "a_sd",
            "a_n",
            "b_mean",
            "b_sd",
            "b_n",
            "ratio",
            "low",
            "high",
            "verdict",
            "statement",
        ],
    )


def statement(metric: str, a: str, b: str, d: Difference, places: int) -> str:
    """One generated sentence: 'ddp-w2-b4 reaches 1.08x the images/s of ps-colocated-w2-b4
    (35.1 ± 0.4, n=3 vs 32.5 ± 0.9, n=3): beyond the noise (95% interval of the difference
    +1.2 to +4.0).'"""
    name = "images/s" if metric == "images_per_second" else metric
    interval = (
        "" if math.isnan(d.low) else f"; 95% interval of the difference {d.low:+.{places}f} to {d.high:+.{places}f}"
    )
    return (
        f"{a} reaches {d.ratio:.3f}x the {name} of {b} ({d.a.text(places)} vs "
        f"{d.b.text(places)}): {d.verdict}{interval}."
    )
