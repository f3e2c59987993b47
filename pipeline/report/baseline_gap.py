"""The baseline entry's AP against the multi-worker entries at its global batch, by the noise
rule (BaselineGap, baseline_gaps), said in full and in one sentence; and why they differ, from the
one-step equivalence check (equivalence_sentence, equivalence_short).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..runtime.records.equivalence import EquivalenceRecord
from .load import baseline_mask
from .noise import Spread, difference
from .noise import spreads as noise_spreads
from .ranking import BEYOND, WITHIN
from .tables import significant
from .wording import joined, span


@dataclass(frozen=True)
class BaselineGap:
    """The baseline entry's AP against the multi-worker entries at its global batch and data
    mode, by the noise rule."""

    baseline: str
    spread: Spread
    workers: int
    batch: int
    above: list[tuple[str, float]]  # (entry, baseline - entry) beyond the noise
    below: list[tuple[str, float]]
    within: list[str]
    unjudged: list[str]
    others: dict[str, Spread]


def baseline_gaps(summary: pd.DataFrame, metric: str = "AP") -> list[BaselineGap]:
    done = summary[(summary["status"] == "ok") & summary[metric].notna()]
    firsts = done.groupby("entry", sort=False).first()
    spreads = noise_spreads(done, metric)
    found = []
    for b, base in firsts[baseline_mask(firsts)].iterrows():
        same = firsts[
            (firsts["global_batch"] == base["global_batch"])
            & (firsts["data_mode"] == base["data_mode"])
            & (firsts["workers"] > base["workers"])
        ]
        for workers, group in same.groupby("workers", sort=True):
            above: list[tuple[str, float]] = []
            below: list[tuple[str, float]] = []
            within: list[str] = []
            unjudged: list[str] = []
            for e in group.index:
                verdict = difference(spreads[b], spreads[e]).verdict
                gap = spreads[b].mean - spreads[e].mean
                if verdict == BEYOND:
                    (above if gap > 0 else below).append((e, gap))
                elif verdict == WITHIN:
                    within.append(e)
                else:
                    unjudged.append(e)
            found.append(
                BaselineGap(
                    b,
                    spreads[b],
                    int(workers),
                    int(base["global_batch"]),
                    above,
                    below,
                    within,
                    unjudged,
                    {e: spreads[e] for e in group.index},
                )
            )
    return found


def gap_sentence(g: BaselineGap) -> str:
    def by(gaps):
        return f"{joined(e for e, _ in gaps)} beyond the noise (by {span([abs(v) for _, v in gaps], 3)})"

    parts = (
        ([f"above {by(g.above)}"] if g.above else [])
        + ([f"below {by(g.below)}"] if g.below else [])
        + ([f"within the noise of {joined(g.within)}"] if g.within else [])
        + ([f"not judged against {joined(g.unjudged)} (one run on a side)"] if g.unjudged else [])
    )
    listed = ", ".join(f"{e} {s.text(3)}" for e, s in g.others.items())
    return (
        f"{g.baseline}'s AP, {g.spread.text(3)}, against the {g.workers}-worker entries at the "
        f"same global batch of {g.batch} images ({listed}): {'; '.join(parts)}."
    )


def gap_headline(g: BaselineGap) -> str:
    n = len(g.others)
    values = span([s.mean for s in g.others.values()], 3)
    whom = f"{'every' if n > 1 else 'the'} {g.workers}-worker entry"
    if g.above and len(g.above) == n:
        return (
            f"{g.baseline} reached a higher AP ({g.spread.mean:.3f}) than {whom} at the same "
            f"global batch ({values}), beyond the noise."
        )
    if g.below and len(g.below) == n:
        return (
            f"{g.baseline} reached a lower AP ({g.spread.mean:.3f}) than {whom} at the same "
            f"global batch ({values}), beyond the noise."
        )
    if len(g.within) == n:
        return (
            f"{g.baseline}'s AP ({g.spread.mean:.3f}) is within the noise of every "
            f"{g.workers}-worker entry's at the same global batch ({values})."
        )
    if len(g.unjudged) == n:
        return (
            f"{g.baseline}'s AP ({g.spread.mean:.3f}) against the {g.workers}-worker "
            f"entr{'y' if n == 1 else 'ies'}' at the same global batch ({values}) is not "
            "judged: one run on a side."
        )

    def many(k: int) -> str:
        return "all of them" if k == n and n > 1 else "it" if n == 1 else f"{k} of them"

    verdicts = (
        ([f"above {many(len(g.above))} beyond the noise"] if g.above else [])
        + ([f"below {many(len(g.below))} beyond the noise"] if g.below else [])
        + ([f"within the noise of {many(len(g.within))}"] if g.within else [])
        + ([f"not judged against {many(len(g.unjudged))} (one run on a side)"] if g.unjudged else [])
    )
    return (
        f"{g.baseline}'s AP ({g.spread.mean:.3f}) against the {g.workers}-worker "
        f"entr{'y' if n == 1 else 'ies'}' at the same global batch ({values}): "
        f"{joined(verdicts)}."
    )


def equivalence_sentence(equivalence: EquivalenceRecord | None) -> str:
    """What the one-step check (pipeline/equivalence.py) found, and its why."""
    checked = equivalence.relative_steps if equivalence else {}
    if not checked:
        return ""
    assert equivalence is not None  # it gave `checked`
    values = {significant(v) for v in checked.values()}
    away = (
        f"{values.pop()} of single's step"
        if len(values) == 1
        else ", ".join(f"{name} {significant(v)}" for name, v in checked.items()) + " of single's step"
    )
    return (
        f"From the same weights and the same global batch, one SGD step of each of "
        f"{joined(checked)} lands {away} away from that of {equivalence.reference} (the "
        f"one-step equivalence check). "
        + (
            f"{equivalence.why} (each cause's share measured by the same check: the accuracy gap, cause by cause)"
            if equivalence.causes
            else f"Hypothesis, as this check measured no cause (the model.norm ablation does): {equivalence.why}"
        )
    )


def equivalence_short(equivalence: EquivalenceRecord | None) -> str:
    """The one-step check in one clause: how far the strategies' step lands from single's."""
    checked = list(equivalence.relative_steps.values()) if equivalence else []
    if not checked:
        return ""
    return (
        f"one SGD step of each of the {len(checked)} strategies checked lands "
        f"{span(checked, 4) if len(checked) > 1 else f'{checked[0]:.4f}'} of single's step "
        "away from single's, from the same weights and the same batch"
    )
