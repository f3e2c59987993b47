"""How far to trust a predicted images/s, and which strategies the prediction tells apart.

The band is the model's own record: predicted / measured images/s of a finished preset's
multi-process runs (pipeline/report/prediction.py's `ratio`), widened to at least the bound the
report holds the model to (a run off by more than it is a miss). A measured rate is then expected
in [predicted / highest ratio, predicted / lowest ratio]. It is a band seen in sample, on the
machine those runs ran on: a cluster the model has not seen can only be less certain. Two
strategies are told apart where their bands do not overlap. Everything here is a prediction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Band:
    """predicted / measured images/s from `low` to `high`, and where that range comes from."""

    low: float
    high: float
    source: str

    @classmethod
    def of(cls, ratios: list[float], bound: float, where: str) -> Band:
        """The range of `ratios` (runs of `where`), widened to 1 +- `bound` at least."""
        seen = [r for r in ratios if math.isfinite(r) and r > 0]
        low, high = min([1 - bound, *seen]), max([1 + bound, *seen])
        if not seen:
            return cls(
                low,
                high,
                f"the report's +-{bound:.0%} bound, x{low:.2f}-{high:.2f} (no "
                f"multi-process run with a prediction to widen it: {where})",
            )
        return cls(
            low,
            high,
            f"predicted/measured x{min(seen):.2f}-{max(seen):.2f} over {len(seen)} "
            f"multi-process run(s) of {where}, widened to at least the report's "
            f"+-{bound:.0%} bound: x{low:.2f}-{high:.2f}",
        )

    def around(self, predicted: float) -> tuple[float, float]:
        """The images/s a run predicted at `predicted` is expected to measure, lowest first."""
        return predicted / self.high, predicted / self.low

    def told_apart(self, faster: float, slower: float) -> bool:
        """Whether two predicted rates' bands do not overlap."""
        return self.around(faster)[0] > self.around(slower)[1]


@dataclass(frozen=True)
class Ranked:
    label: str
    rank: int  # 1: the fastest predicted
    low: float  # images/s its band allows, lowest and highest
    high: float
    apart_from_next: bool  # its band clears the next one's (the last: True)


def ranking(rates: dict[str, float], band: Band) -> list[Ranked]:
    """`rates` (label -> predicted images/s), fastest first, each with its band and whether the
    band tells it apart from the next. Rates equal to 9 significant digits (DataParallel's and
    one colocated server's, the same messages through device 0) keep the order given, the
    registry's: the sum's rounding does not decide between them."""
    order = sorted(rates, key=lambda label: float(f"{rates[label]:.9g}"), reverse=True)
    return [
        Ranked(
            label,
            i + 1,
            *band.around(rates[label]),
            i + 1 == len(order) or band.told_apart(rates[label], rates[order[i + 1]]),
        )
        for i, label in enumerate(order)
    ]
