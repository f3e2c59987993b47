"""The completed entries of one worker count and data mode, ranked by a metric with the noise
rule's verdict on every pair (Ranking, rankings), and the ranking said in sentences: in full, with
each entry's mean, sd and n and by how much the steps beyond the noise go (ranking_sentences), and
in one sentence, the top against the bottom (headline). Why a throughput ranking is what it is:
ranking_why.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from .noise import Difference, Spread, difference
from .noise import spreads as noise_spreads
from .wording import MACRO_COLUMNS, counted, joined, metric_text, times

BEYOND, WITHIN = "beyond the noise", "within the noise"  # noise.Difference.verdict
UNITS = {"images_per_second": "images/s", "AP": "AP"}
EXTREMES = {"images_per_second": ("the fastest", "the slowest"), "AP": ("the highest in AP", "the lowest in AP")}
MODES = {"real": "", "synthetic": " on in-memory tensors"}


def _with_unit(spread: Spread, metric: str) -> str:
    """'47.31 ± 0.52 images/s (n=3)', 'AP 0.089 (n=1)'."""
    places, unit = MACRO_COLUMNS[metric], UNITS[metric]
    value = spread.text(places).rsplit(" (", 1)[0]
    return (f"AP {value}" if metric == "AP" else f"{value} {unit}") + f" (n={spread.n})"


@dataclass(frozen=True)
class Ranking:
    """The completed entries of one worker count and data mode, ranked by a metric's mean over
    their seeds, with the noise rule's verdict on each pair (the comparisons frame's)."""

    metric: str
    workers: int
    mode: str
    order: tuple[str, ...]  # highest mean first
    spreads: dict[str, Spread]
    pairs: dict[frozenset, tuple[str, Difference]]  # the pair's first entry, first - second
    qualifiers: dict[str, str]  # ' (4 images a step)' where the group's differ

    @property
    def judged(self) -> list[str]:
        return [e for e in self.order if self.spreads[e].n >= 2]

    @property
    def unjudged(self) -> list[str]:
        return [e for e in self.order if self.spreads[e].n < 2]

    @property
    def lead(self) -> str:
        return f"With {counted(self.workers, 'worker')}{MODES.get(self.mode, f' ({self.mode} data)')}"

    def verdict(self, a: str, b: str) -> str:
        return self.pairs[frozenset((a, b))][1].verdict

    def difference(self, a: str, b: str) -> tuple[float, float, float]:
        """a's mean over b's, and the 95 % interval of a - b."""
        first, d = self.pairs[frozenset((a, b))]
        if first == a:
            return d.ratio, d.low, d.high
        return (1 / d.ratio if d.ratio else math.nan), -d.high, -d.low

    def value(self, entry: str) -> str:
        return metric_text(self.spreads[entry].mean, self.metric)


def rankings(summary: pd.DataFrame, compared: pd.DataFrame, metric: str) -> list[Ranking]:
    """One Ranking per worker count and data mode with a completed run that has `metric`. The
    verdicts are those of `compared` (noise.comparisons), a pair it lacks judged by the same rule."""
    done = summary[(summary["status"] == "ok") & summary[metric].notna()]
    rows = compared[compared["metric"] == metric] if len(compared) else compared
    decided = {(int(r.workers), r.data_mode, r.a, r.b): r for r in rows.itertuples()}
    found = []
    for (workers, mode), group in done.groupby(["workers", "data_mode"], sort=True):
        spreads = noise_spreads(group, metric)
        order = tuple(sorted(spreads, key=lambda e: -spreads[e].mean))  # stable: sweep order on ties
        pairs = {}
        for i, a in enumerate(order):
            for b in order[i + 1 :]:
                row = decided.get((int(workers), mode, a, b)) or decided.get((int(workers), mode, b, a))
                pairs[frozenset((a, b))] = (
                    (a, difference(spreads[a], spreads[b]))
                    if row is None
                    else (
                        row.a,
                        Difference(
                            Spread(row.a_mean, row.a_sd, int(row.a_n)),
                            Spread(row.b_mean, row.b_sd, int(row.b_n)),
                            row.low,
                            row.high,
                        ),
                    )
                )
        firsts = group.groupby("entry", sort=False).first()
        differing = [
            (column, unit, after)
            for column, unit, after in (("global_batch", "image", " a step"), ("threads", "thread", ""))
            if firsts[column].nunique(dropna=False) > 1
        ]
        qualifiers = {
            e: (
                " (" + ", ".join(counted(firsts.loc[e, c], u) + after for c, u, after in differing) + ")"
                if differing
                else ""
            )
            for e in order
        }
        found.append(Ranking(metric, int(workers), mode, order, spreads, pairs, qualifiers))
    return found


def ranking_sentences(r: Ranking) -> list[str]:
    """The ranking with each entry's mean ± sd (n), the steps beyond the noise by how much, the
    pairs within it in one sentence, and the entries too few runs leave unjudged."""
    unit, places = UNITS[r.metric], MACRO_COLUMNS[r.metric]
    if len(r.order) == 1:
        (only,) = r.order
        did = "was scored" if r.metric == "AP" else "ran"
        return [f"{r.lead}, only {only}{r.qualifiers[only]} {did}: {_with_unit(r.spreads[only], r.metric)}."]
    found = [
        f"{r.lead}, ranked by {unit}: "
        + ", ".join(f"{e}{r.qualifiers[e]} {r.spreads[e].text(places)}" for e in r.order)
        + "."
    ]
    judged = r.judged
    if len(judged) >= 2:
        pairs = [(a, b) for i, a in enumerate(judged) for b in judged[i + 1 :]]
        beyond = [(a, b) for a, b in pairs if r.verdict(a, b) == BEYOND]
        within = [(a, b) for a, b in pairs if r.verdict(a, b) == WITHIN]

        def by_how_much(listed) -> str:
            return "; ".join(
                f"{a} reaches {times(ratio)} the {unit} of {b} (95% interval of the "
                f"difference {low:+.{places}f} to {high:+.{places}f})"
                for a, b in listed
                for ratio, low, high in [r.difference(a, b)]
            )

        if not beyond:
            found.append(
                "The two are within the noise of each other."
                if len(judged) == 2
                else "No two of them differ beyond the noise."
            )
        elif not within:
            steps = list(zip(judged, judged[1:], strict=False))
            found.append(
                "Every pair of them differs beyond the noise, in the order of the "
                f"ranking; step by step: {by_how_much(steps)}."
            )
        elif len(beyond) <= len(within):  # the shorter list named, pair by pair
            found.append(f"Beyond the noise: {by_how_much(beyond)}. Every other pair of them is within the noise.")
        else:
            steps = [(a, b) for a, b in zip(judged, judged[1:], strict=False) if (a, b) in beyond]
            rest = len(beyond) - len(steps)
            found.append(
                f"Beyond the noise, down the ranking: {by_how_much(steps)}. Within the "
                "noise of each other: "
                + "; ".join(f"{a} and {b} ({times(r.difference(a, b)[0])})" for a, b in within)
                + "."
                + (
                    ""
                    if not rest
                    else " The other pair of them differs beyond the noise too, in the order of the ranking."
                    if rest == 1
                    else f" The other {rest} pairs of them differ beyond the noise too, in the order of the ranking."
                )
            )
    if r.unjudged:
        whose = "its" if len(r.unjudged) == 1 else "their"
        found.append(
            f"{joined(r.unjudged)} ran once: {whose} differences from the others are "
            "not judged (fewer than 2 runs on a side)."
        )
    return found


def headline(r: Ranking) -> str:
    """The ranking in one sentence: the top and the bottom by the noise rule, and by how much."""
    unit = UNITS[r.metric]
    high, low = EXTREMES[r.metric]
    if len(r.order) == 1:
        return f"{r.lead}, only {r.order[0]} ran ({_with_unit(r.spreads[r.order[0]], r.metric)})."
    name = {e: e + r.qualifiers[e] for e in r.order}
    judged = r.judged
    unjudged = (
        f" ({joined(r.unjudged)}, with one run, {'is' if len(r.unjudged) == 1 else 'are'} not judged.)"
        if r.unjudged and len(judged) >= 2
        else ""
    )
    if len(judged) < 2:
        return (
            f"{r.lead}, {name[r.order[0]]} had the highest mean {unit} ({r.value(r.order[0])}) "
            f"and {name[r.order[-1]]} the lowest ({r.value(r.order[-1])}); with one run on a "
            "side, no difference among them is judged."
        )
    first, last = judged[0], judged[-1]
    if r.verdict(first, last) != BEYOND:
        return (
            f"{r.lead}, no entry differs from another beyond the noise "
            f"({r.value(last)} to {r.value(first)} {unit}).{unjudged}"
        )
    top = [first] + [e for e in judged[1:] if r.verdict(first, e) == WITHIN]
    bottom = [e for e in judged[:-1] if r.verdict(e, last) == WITHIN and e not in top] + [last]

    def group(entries: list[str], extreme: str, verb: str, anchor: str) -> str:
        values = joined(r.value(e) for e in entries)
        together = (
            ""
            if len(entries) == 1
            else ", within the noise of each other"
            if len(entries) == 2
            else f", each within the noise of {anchor}"
        )
        return f"{joined(name[e] for e in entries)}{verb} {extreme} ({values} {unit}{together})"

    plural = " were" if len(top) > 1 else " was"
    return (
        f"{r.lead}, {group(top, high, plural, first)} and {group(bottom, low, '', last)}: "
        f"{first} reaches {times(r.difference(first, last)[0])} the {unit} of {last}, "
        "beyond the noise."
        f"{unjudged}"
    )
