"""Repeats and noise: the mean and spread of each sweep entry's runs, and whether two entries
differ by more than their run-to-run spread. The report's comparisons and the accuracy
benchmark over seeds (benchmarks/accuracy_seeds.py) both take their statistics from here.

The rule (said in the report and the paper, from NOISE_RULE): Welch's two-sided 95 % t-interval
of the difference of the two means; the difference is "beyond the noise" when the interval
excludes 0, "within the noise" when it contains 0, and cannot be judged when either side has
fewer than 2 runs (no spread to compare against). No scipy here: the t quantiles are a table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

NOISE_RULE = ("Welch's 95% t-interval of the difference of two entries' means over their seeds: "
              "beyond the noise when it excludes 0, within the noise when it contains 0, not "
              "judged with fewer than 2 runs on a side")
# Two-sided 95 % quantiles of Student's t, t(0.975; df) for df = 1..30; 1.96 (normal) beyond.
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
        2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
        2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t975(df: float) -> float:
    """The quantile at the largest tabulated whole df not above `df` (conservative)."""
    whole = max(1, int(math.floor(df)))
    return T975[whole - 1] if whole <= len(T975) else 1.96


@dataclass(frozen=True)
class Spread:
    mean: float
    sd: float   # sample standard deviation (n - 1); NaN for one run
    n: int

    @classmethod
    def of(cls, values) -> "Spread":
        values = [float(v) for v in values if not pd.isna(v)]
        n = len(values)
        mean = sum(values) / n if n else math.nan
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else math.nan
        return cls(mean, sd, n)

    @property
    def interval(self) -> tuple[float, float]:
        """The 95 % t-interval of the mean; NaN with fewer than 2 runs."""
        if self.n < 2:
            return math.nan, math.nan
        half = t975(self.n - 1) * self.sd / math.sqrt(self.n)
        return self.mean - half, self.mean + half

    def text(self, places: int) -> str:
        """0.548 ± 0.010 (n=3); a single run shows its value and n=1."""
        if self.n == 0:
            return "n/a"
        spread = "" if math.isnan(self.sd) else f" ± {self.sd:.{places}f}"
        return f"{self.mean:.{places}f}{spread} (n={self.n})"


@dataclass(frozen=True)
class Difference:
    a: Spread
    b: Spread
    low: float    # the 95 % interval of mean(a) - mean(b); NaN when not judged
    high: float
    t: float = math.nan   # Welch's t statistic and its Welch-Satterthwaite degrees of freedom
    df: float = math.nan

    @property
    def verdict(self) -> str:
        if math.isnan(self.low):
            return "not judged (fewer than 2 runs)"
        return "within the noise" if self.low <= 0 <= self.high else "beyond the noise"

    @property
    def ratio(self) -> float:
        return self.a.mean / self.b.mean if self.b.mean else math.nan


def difference(a: Spread, b: Spread) -> Difference:
    """Welch's 95 % interval of a.mean - b.mean (unequal variances, Welch-Satterthwaite df)."""
    diff = a.mean - b.mean
    if a.n < 2 or b.n < 2:
        return Difference(a, b, math.nan, math.nan)
    va, vb = a.sd ** 2 / a.n, b.sd ** 2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:  # identical runs on both sides: any difference is beyond their (zero) spread
        return Difference(a, b, diff, diff, math.copysign(math.inf, diff) if diff else 0.0)
    df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))
    half = t975(df) * se
    return Difference(a, b, diff - half, diff + half, diff / se, df)


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
            for second in entries[i + 1:]:
                for metric, places in metrics.items():
                    values = spreads(group, metric)
                    if values[first].n == 0 or values[second].n == 0:
                        continue  # e.g. AP of a run that was not evaluated
                    d = difference(values[first], values[second])
                    rows.append({
                        "workers": int(workers), "data_mode": mode, "metric": metric,
                        "a": first, "b": second, "a_mean": d.a.mean, "a_sd": d.a.sd, "a_n": d.a.n,
                        "b_mean": d.b.mean, "b_sd": d.b.sd, "b_n": d.b.n, "ratio": d.ratio,
                        "low": d.low, "high": d.high, "verdict": d.verdict,
                        "statement": statement(metric, first, second, d, places)})
    return pd.DataFrame(rows, columns=[
        "workers", "data_mode", "metric", "a", "b", "a_mean", "a_sd", "a_n", "b_mean", "b_sd",
        "b_n", "ratio", "low", "high", "verdict", "statement"])


def statement(metric: str, a: str, b: str, d: Difference, places: int) -> str:
    """One generated sentence: 'ddp-w2-b4 reaches 1.08x the images/s of ps-colocated-w2-b4
    (35.1 ± 0.4, n=3 vs 32.5 ± 0.9, n=3): beyond the noise (95% interval of the difference
    +1.2 to +4.0).'"""
    name = "images/s" if metric == "images_per_second" else metric
    interval = ("" if math.isnan(d.low) else
                f"; 95% interval of the difference {d.low:+.{places}f} to {d.high:+.{places}f}")
    return (f"{a} reaches {d.ratio:.3f}x the {name} of {b} ({d.a.text(places)} vs "
            f"{d.b.text(places)}): {d.verdict}{interval}.")
