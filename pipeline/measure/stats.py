"""Repeats, noise and gaps, without torch or pandas: the one statistics module that the GPU
check (benchmarks/gpu_check.py) and the report's noise checks (pipeline/report/noise.py,
disturbance.py) share.

The rule of both ("like with like"): machine noise is read from repeats of one configuration
(`Repeats`: their median, the 95 % t-interval of their mean, how far apart they are, which of
them are outliers), and a configuration's gap to a reference (a strategy's to single, HEAD's to
another revision) is the ratio of their medians with the 95 % Welch interval of the difference
of their means, put on the reference's scale (`gap`; a configuration run once borrows the
reference's spread). No scipy: the t quantiles are a table.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# Two-sided 95 % quantiles of Student's t, t(0.975; df) for df = 1..30; 1.96 (normal) beyond.
T975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)
AGREEMENT = 0.03  # repeats of one configuration in one sitting agree when max/min - 1 <= this
# A repeat is an outlier (Repeats.outliers) when it lies more than OUTLIER_MADS scaled median
# absolute deviations (Iglewicz and Hoaglin's 3.5) AND more than the caller's relative margin
# from the median of its repeats: a robust rule, which one slow repeat cannot hide from by
# widening the spread it is judged against, as it would a mean and standard deviation.
OUTLIER_MADS = 3.5
MAD_SCALE = 1.4826  # MAD x this estimates a normal distribution's standard deviation


def t975(df: float) -> float:
    """The quantile at the largest tabulated whole df not above `df` (conservative)."""
    whole = max(1, int(math.floor(df)))
    return T975[whole - 1] if whole <= len(T975) else 1.96


def _present(value) -> bool:
    """A number, not None or NaN (pandas' NA included: float() of it raises TypeError)."""
    try:
        return value is not None and not math.isnan(float(value))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Spread:
    mean: float
    sd: float  # sample standard deviation (n - 1); NaN for one run
    n: int

    @classmethod
    def of(cls, values) -> Spread:
        values = [float(v) for v in values if _present(v)]
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
    low: float  # the 95 % interval of mean(a) - mean(b); NaN when not judged
    high: float
    t: float = math.nan  # Welch's t statistic and its Welch-Satterthwaite degrees of freedom
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
    va, vb = a.sd**2 / a.n, b.sd**2 / b.n
    se = math.sqrt(va + vb)
    if se == 0:  # identical runs on both sides: any difference is beyond their (zero) spread
        return Difference(a, b, diff, diff, math.copysign(math.inf, diff) if diff else 0.0)
    df = (va + vb) ** 2 / (va**2 / (a.n - 1) + vb**2 / (b.n - 1))
    half = t975(df) * se
    return Difference(a, b, diff - half, diff + half, diff / se, df)


@dataclass(frozen=True)
class Repeats:
    """Repeats of one configuration in one sitting (e.g. images/s of each timed segment): the
    figure to report (their median), its 95 % interval (the t-interval of their mean), and
    whether they agree (max/min - 1 <= AGREEMENT): where they do not, the machine was noisy."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values) -> Repeats:
        return cls(tuple(float(v) for v in values if _present(v)))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else math.nan

    @property
    def spread(self) -> Spread:
        return Spread.of(self.values)

    @property
    def interval(self) -> tuple[float, float]:
        return self.spread.interval

    @property
    def disagreement(self) -> float:
        """How far apart the repeats are: max / min - 1 (NaN with fewer than 2)."""
        if len(self.values) < 2 or min(self.values) <= 0:
            return math.nan
        return max(self.values) / min(self.values) - 1

    def outliers(self, margin: float) -> tuple[float, ...]:
        """The repeats far outside the others (OUTLIER_MADS scaled MADs and more than `margin`,
        relative, from their median); none with fewer than 3 repeats (two cannot say which)."""
        if len(self.values) < 3:
            return ()
        median = self.median
        mad = MAD_SCALE * statistics.median(abs(v - median) for v in self.values)
        return tuple(v for v in self.values if abs(v - median) > OUTLIER_MADS * mad and abs(v / median - 1) > margin)

    def without(self, values) -> Repeats:
        """These repeats but `values` (each left out once)."""
        kept = list(self.values)
        for value in values:
            kept.remove(value)
        return Repeats(tuple(kept))

    @property
    def agree(self) -> bool | None:
        """Within AGREEMENT of each other; None with fewer than 2 repeats."""
        spread = self.disagreement
        return None if math.isnan(spread) else spread <= AGREEMENT

    def summary(self) -> dict:
        low, high = self.interval
        return {
            "median": self.median,
            "low": low,
            "high": high,
            "repeats": len(self.values),
            "disagreement": self.disagreement,
            "agree": self.agree,
        }


@dataclass(frozen=True)
class Gap:
    """A configuration against its reference (a strategy against single; HEAD against another
    revision), both measured in repeats in one sitting: the ratio of their medians, the 95 %
    interval of that ratio (Welch's interval of the difference of the means over the
    reference's mean), the noise each side showed, and the verdict."""

    ratio: float
    low: float
    high: float
    noise: float  # the larger disagreement of the two sides' repeats (machine noise)
    verdict: str
    # config - reference in the values' own unit (medians), and the 95 % interval of the
    # difference of the means
    delta: float = math.nan
    delta_low: float = math.nan
    delta_high: float = math.nan

    def summary(self) -> dict:
        return {
            "ratio": self.ratio,
            "ratio_low": self.low,
            "ratio_high": self.high,
            "noise": self.noise,
            "verdict": self.verdict,
        }


def borrowed_difference(a: Spread, reference: Spread) -> Difference:
    """The 95 % interval of a.mean - reference.mean where `a` ran once: its one run is taken to
    vary as the reference's repeats do (like with like: the same cost, other seeds), so the
    difference's standard error is reference.sd * sqrt(1/1 + 1/n), on n - 1 degrees of freedom."""
    diff = a.mean - reference.mean
    if a.n != 1 or reference.n < 2:
        return difference(a, reference)
    se = reference.sd * math.sqrt(1 + 1 / reference.n)
    if se == 0:
        return Difference(a, reference, diff, diff, math.copysign(math.inf, diff) if diff else 0.0)
    half = t975(reference.n - 1) * se
    return Difference(a, reference, diff - half, diff + half, diff / se, reference.n - 1)


def gap(config: Repeats, reference: Repeats, borrow: bool = False) -> Gap:
    """`config`'s gap to `reference` (higher is faster where the values are rates). `borrow`:
    a configuration measured once takes the reference's spread (borrowed_difference), so its
    gap still has an interval; else it is not judged."""
    d = (borrowed_difference if borrow else difference)(config.spread, reference.spread)
    scale = reference.spread.mean
    ratio = config.median / reference.median if reference.median else math.nan
    low, high = (math.nan, math.nan) if math.isnan(d.low) or not scale else (1 + d.low / scale, 1 + d.high / scale)
    noise = max((r.disagreement for r in (config, reference) if not math.isnan(r.disagreement)), default=math.nan)
    return Gap(ratio, low, high, noise, d.verdict, config.median - reference.median, d.low, d.high)
