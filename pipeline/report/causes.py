"""The accuracy gap between single and ddp-w2, cause by cause: which explanation the runs support.

With the tiny model's BatchNorm, 2 workers of 4 images each normalise over 4 images, not 8, and
evaluate with rank 0's running statistics. The sweep trains single and ddp-w2 again under
GroupNorm (`norm: groupnorm`, per image: the same on any split of the batch), at the same seeds.
If single's AP lead over ddp-w2 is beyond the noise with BatchNorm and within it under GroupNorm,
the runs support batch statistics as its cause; if a gap remains beyond the noise under
GroupNorm, batch statistics are not the whole cause, and what else differs between the two
(per-worker sampling in the RPN and the box head) stays a hypothesis, since no run removes it.

The runs under the other norm are an ablation: the report's other tables and findings compare the
sweep's main runs only (`split_by_norm`), so a GroupNorm single never becomes single's level.
`CauseTest` is the typed record the answer reads.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pandas as pd

from ..measure.stats import Difference, Spread, difference
from ..runtime.records.equivalence import EquivalenceRecord
from ..runtime.run import NORMS
from .load import RunDir, is_baseline, required
from .render import Section
from .tables import signed
from .verdict import CauseFinding

WITH, WITHOUT = NORMS  # batch statistics at play, and removed
CAUSE = "BatchNorm's per-worker batch statistics"
REMOVED_BY = "GroupNorm (model.norm: groupnorm)"
OTHER_CAUSE = "per-worker sampling of anchors and proposals in the RPN and the box head"


def norm_of(run: RunDir) -> str:
    return run.summary.run.norm if run.summary.run is not None else WITH


def split_by_norm(runs: list[RunDir]) -> tuple[list[RunDir], list[RunDir]]:
    """The sweep's main runs (the norm most of its runs train with; BatchNorm on a tie) and the
    ablation's runs under the other norm."""
    counts = Counter(norm_of(r) for r in runs)
    main = max(NORMS, key=lambda n: (counts[n], n == WITH))
    return ([r for r in runs if norm_of(r) == main], [r for r in runs if norm_of(r) != main])


@dataclass(frozen=True)
class CauseTest:
    """single's AP minus ddp-w2's at the same global batch and seeds, with the cause and with it
    removed, each with the 95 % Welch interval of the difference."""

    cause: str
    removed_by: str
    baseline: str  # the entries compared with the cause (their ids)
    compared: str
    gap_with: Difference  # a: the baseline's AP, b: the compared entry's
    gap_without: Difference
    verdict: str  # supported | not the whole cause | undecided

    @property
    def supported(self) -> bool:
        return self.verdict == "supported"

    @property
    def ap_gap_with(self) -> float:
        return self.gap_with.a.mean - self.gap_with.b.mean

    @property
    def ap_gap_without(self) -> float:
        return self.gap_without.a.mean - self.gap_without.b.mean

    @property
    def interval_without(self) -> tuple[float, float]:
        return self.gap_without.low, self.gap_without.high


def _judged(d: Difference) -> bool:
    return not math.isnan(d.low)


def verdict_of(gap_with: Difference, gap_without: Difference) -> str:
    if not (_judged(gap_with) and _judged(gap_without)) or gap_with.low <= 0:
        return "undecided"  # one run on a side, or no lead of single's to explain
    return "supported" if gap_without.low <= 0 <= gap_without.high else "not the whole cause"


def _ap_spreads(runs: list[RunDir], norm: str) -> dict[str, Spread]:
    """The AP of each entry of single at 1 worker and plain ddp at 2, on real data, under `norm`."""
    values: dict[str, list[float]] = {}
    for r in runs:
        s = r.summary
        wanted = (is_baseline(s.strategy, s.variant) and s.workers == 1) or (
            s.strategy == "ddp" and not s.variant and s.workers == 2
        )
        if r.ok and r.evaluated and s.data_mode == "real" and norm_of(r) == norm and wanted:
            values.setdefault(r.entry, []).append(required(r.metrics.AP, f"{r.run_id}'s AP"))
    return {entry: Spread.of(v) for entry, v in values.items()}


def _pair(spreads: dict[str, Spread], runs: list[RunDir]) -> tuple[str, str] | None:
    """(single's entry, ddp-w2's entry) at the same global batch, where both ran."""
    batch = {r.entry: (r.summary.workers or 0) * (r.summary.images_per_worker or 0) for r in runs}
    singles = [e for e in spreads if e.startswith(("single",))]
    for base in singles:
        for other in spreads:
            if other != base and other not in singles and batch[other] == batch[base]:
                return base, other
    return None


def cause_tests(runs: list[RunDir]) -> list[CauseTest]:
    """The batch-statistics test where the runs hold single and ddp-w2 under both norms."""
    spreads = {norm: _ap_spreads(runs, norm) for norm in NORMS}
    pairs = {norm: _pair(spreads[norm], runs) for norm in NORMS}
    with_pair, without_pair = pairs[WITH], pairs[WITHOUT]
    if with_pair is None or without_pair is None:
        return []
    (b, c), (b0, c0) = with_pair, without_pair
    with_, without = (
        difference(spreads[WITH][b], spreads[WITH][c]),
        difference(spreads[WITHOUT][b0], spreads[WITHOUT][c0]),
    )
    return [CauseTest(CAUSE, REMOVED_BY, b, c, with_, without, verdict_of(with_, without))]


def finding(tests: list[CauseTest]) -> CauseFinding | None:
    """The verdict's input (verdict.CauseFinding): the cause the runs tested, and the gap left
    with it removed, in a reader's words; supported None where the runs cannot decide."""
    if not tests:
        return None
    t = tests[0]
    gap = f"single's AP lead is {signed(t.ap_gap_with)} with it"
    if _judged(t.gap_without):
        gap += (
            f" and {signed(t.ap_gap_without)} without it (95% interval "
            f"{signed(t.gap_without.low)} to {signed(t.gap_without.high)})"
        )
    supported = {"supported": True, "not the whole cause": False}.get(t.verdict)
    return CauseFinding(f"{t.cause} (removed by {t.removed_by})", gap, supported)


def _interval(d: Difference) -> str:
    return f"95 % interval {d.low:+.3f} to {d.high:+.3f}" if _judged(d) else "not judged"


def sentence(t: CauseTest) -> str:
    """What the runs say of the cause, worded as a finding only where they decide it."""
    gaps = (
        f"single's AP lead over ddp-w2 is {t.ap_gap_with:+.3f} ({_interval(t.gap_with)}) with "
        f"BatchNorm and {t.ap_gap_without:+.3f} ({_interval(t.gap_without)}) under GroupNorm"
    )
    if t.verdict == "supported":
        return (
            f"{gaps}: with batch statistics removed the gap is within the noise, so the runs "
            f"support {t.cause} as the cause of the accuracy gap."
        )
    if t.verdict == "not the whole cause":
        return (
            f"{gaps}: a gap beyond the noise remains without batch statistics, so {t.cause} "
            f"is not the whole cause; {OTHER_CAUSE} is the remaining hypothesis (no run "
            "removes it)."
        )
    return f"{gaps}: the runs cannot decide; that {t.cause} or {OTHER_CAUSE} causes the gap is a hypothesis."


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def step_sentence(equivalence: EquivalenceRecord | None) -> str:
    """The one-step check's distances with and without each cause, where it measured them."""
    causes = (equivalence.causes or []) if equivalence else []
    if not causes:
        return ""
    parts = [
        f"under {c.norm}, splitting 8 images into 4 + 4 moves the gradient by "
        f"{_percent(c.split)} of its norm and resampling the same 8 by {_percent(c.resample)}"
        + (f" (ddp-w2's whole step: {_percent(c.launched)} from single's)" if c.launched is not None else "")
        for c in causes
    ]
    return "One step from the same weights (the equivalence check): " + "; ".join(parts) + "."


def section(tests: list[CauseTest], equivalence: EquivalenceRecord | None) -> Section | None:
    """The report's section: the finding and its table, or None without the ablation's runs."""
    if not tests:
        return None
    rows = [
        {
            "norm": norm,
            "single AP": d.a.text(3),
            "ddp-w2 AP": d.b.text(3),
            "single - ddp-w2": f"{d.a.mean - d.b.mean:+.3f}",
            "95 % interval": f"{d.low:+.3f} to {d.high:+.3f}" if _judged(d) else "not judged",
        }
        for t in tests
        for norm, d in ((WITH, t.gap_with), (WITHOUT, t.gap_without))
    ]
    paragraphs = [sentence(t) for t in tests] + [p for p in [step_sentence(equivalence)] if p]
    return Section("The accuracy gap, cause by cause", paragraphs, pd.DataFrame(rows))
