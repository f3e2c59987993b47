"""Why a throughput ranking (ranking.py) is what it is, in what the runs measured: where the time
of an iteration goes between the fastest and the slowest entry at one global batch, the
communication share, bytes per iteration, memory per worker (why_throughput; in one sentence,
short_why), and the cost model's reading of the same runs (model_reading; in one sentence,
model_summary).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..strategies import STRATEGIES
from .ranking import BEYOND, Ranking
from .tables import significant
from .wording import as_many, byte_size, counted, joined, known, percent

SPLIT = ("data", "compute", "communication", "optimizer")  # load.TIME_SPLIT
# The per-entry means the why is told from (tables.entry_means: mean over the entry's seeds).
WHY_COLUMNS = [
    "sec_per_iter_mean",
    *(f"time_{part}" for part in SPLIT),
    "communication_share",
    "busiest_rank_bytes_per_iter",
    "busiest_rank_theory_bytes_per_iter",
    "owned_state_mb",
    "peak_memory_mb",
]


def _strategy(summary: pd.DataFrame, entry: str):
    return STRATEGIES.get(summary.loc[summary["entry"] == entry, "strategy"].iloc[0])


def why_throughput(r: Ranking, means: pd.DataFrame, summary: pd.DataFrame, predicted: pd.DataFrame | None) -> list[str]:
    """Why the ranking is what it is, in what the runs measured: where the time of an iteration
    goes (the fastest against the slowest at the same global batch), the communication share,
    bytes per iteration, memory per worker, and the cost model's reading of the same runs."""
    found = []
    moved = [
        e
        for e in r.order
        if known(means.loc[e, "busiest_rank_bytes_per_iter"]) and means.loc[e, "busiest_rank_bytes_per_iter"] > 0
    ]
    if not moved:
        return [
            "None of them moves a byte between processes, so there is no communication to "
            "tell them apart; their time split and memory are in the report's tables."
        ]
    fast, slow, judged = extremes(r, means) or (r.order[0], r.order[0], False)
    F, S = means.loc[fast], means.loc[slow]
    if slow != fast and known(S["sec_per_iter_mean"]) and known(F["sec_per_iter_mean"]):
        gap = S["sec_per_iter_mean"] - F["sec_per_iter_mean"]
        parts = {
            part: S[f"time_{part}"] - F[f"time_{part}"]
            for part in SPLIT
            if known(S[f"time_{part}"]) and known(F[f"time_{part}"])
        }
        other = gap - sum(parts.values())
        listed = [f"{part} {d:+.4f} s" for part, d in sorted(parts.items(), key=lambda kv: -abs(kv[1]))]
        if abs(other) >= 0.00005:
            listed.append(f"{other:+.4f} s outside the time split")
        found.append(
            f"{'Why' if judged else 'Why the means differ (not judged)'}: an "
            f"iteration of {slow} takes {S['sec_per_iter_mean']:.4f} s and one of "
            f"{fast} {F['sec_per_iter_mean']:.4f} s; of the {gap:.4f} s between them, "
            f"{', '.join(listed)} (the time split's means over seeds)."
        )
        inside = [e for e in (fast, slow) if (s := _strategy(summary, e)) and s.communication_timed is None]
        if inside:
            found.append(
                f"{joined(inside)} exchange{'s' if len(inside) == 1 else ''} inside the "
                "forward and backward passes, so there compute holds the communication."
            )
    timed = [
        (e, means.loc[e, "communication_share"])
        for e in moved
        if known(means.loc[e, "communication_share"]) and (s := _strategy(summary, e)) and s.communication_timed
    ]
    if timed:
        found.append(
            "Communication timed apart takes "
            + joined(f"{percent(share)} of the iteration of {e}" for e, share in timed)
            + "."
        )
    moved_bytes = [
        (e, means.loc[e, "busiest_rank_bytes_per_iter"], means.loc[e, "busiest_rank_theory_bytes_per_iter"])
        for e in moved
    ]
    if moved_bytes:
        as_theory = all(known(t) and t > 0 and abs(b / t - 1) <= 0.01 for _, b, t in moved_bytes)
        found.append(
            "Bytes per iteration of the busiest rank (sent + received)"
            + (", each within 1% of its strategy's theory" if as_theory else "")
            + ": "
            + ", ".join(
                f"{e} {byte_size(b)}" + ("" if as_theory or not known(t) else f" (theory {byte_size(t)})")
                for e, b, t in moved_bytes
            )
            + "."
        )
        sizes = {e: b for e, b, _ in moved_bytes}
        if fast in sizes and slow in sizes and slow != fast and sizes[fast]:
            found.append(f"{slow} moves {as_many(sizes[slow] / sizes[fast], 'bytes')} {fast}.")
    held = [e for e in r.order if known(means.loc[e, "owned_state_mb"])]
    if held:
        found.append(
            "Memory per worker, in the process that holds the most (parameters, gradients "
            "and optimizer state it owns / its peak): "
            + ", ".join(
                f"{e} {significant(means.loc[e, 'owned_state_mb'])} / {significant(means.loc[e, 'peak_memory_mb'])} MiB"
                for e in held
            )
            + "."
        )
    found += model_reading(r, predicted)
    return found


def extremes(r: Ranking, means: pd.DataFrame) -> tuple[str, str, bool] | None:
    """The fastest and the slowest entry at the fastest's global batch whose gap the why
    explains, and whether the noise rule judged it beyond the noise: among the judged entries
    where two or more are (None if those two are within the noise), else among all."""
    pool = r.judged if len(r.judged) >= 2 else list(r.order)
    fast = pool[0]
    slow = [e for e in pool if means.loc[e, "global_batch"] == means.loc[fast, "global_batch"]][-1]
    judged = len(r.judged) >= 2
    if slow == fast or (judged and r.verdict(fast, slow) != BEYOND):
        return None
    return fast, slow, judged


def short_why(r: Ranking, means: pd.DataFrame) -> str:
    """The largest part of the gap beyond the noise between the fastest and the slowest entry
    at one global batch, and their bytes and owned state ('' where no gap is judged)."""
    fast, slow, judged = extremes(r, means) or (None, None, False)
    if not judged or not known(means.loc[slow, "sec_per_iter_mean"]):
        return ""
    F, S = means.loc[fast], means.loc[slow]
    parts = {
        part: S[f"time_{part}"] - F[f"time_{part}"]
        for part in SPLIT
        if known(S[f"time_{part}"]) and known(F[f"time_{part}"])
    }
    gap = S["sec_per_iter_mean"] - F["sec_per_iter_mean"]
    found = f"{slow}'s iteration is {gap:.4f} s longer than {fast}'s"
    if parts:
        part, d = max(parts.items(), key=lambda kv: abs(kv[1]))
        found += f", {d:+.4f} s of it in {part}"
    extra = []
    for column, verb, what, same in (
        ("busiest_rank_bytes_per_iter", "moves", "bytes", "as many"),
        ("owned_state_mb", "owns", "state per worker", "as much"),
    ):
        if known(F[column]) and F[column] > 0 and known(S[column]):
            extra.append(f"{verb} {as_many(S[column] / F[column], what, same)} {fast}")
    return found + (f"; it {joined(extra)}" if extra else "") + "."


@dataclass(frozen=True)
class ModelFacts:
    """The cost model's images/s against the measured, entry by entry (means over seeds)."""

    unmodelled: dict[str, str]  # entry -> why the model has no prediction
    predicted: dict[str, float]
    measured: dict[str, float]
    misses: list[str]  # off by more than prediction.BOUND
    ordered: list[tuple[str, str]]  # pairs the measurement ranks beyond the noise
    reversed: list[tuple[str, str]]  # ... that the model ranks the other way


def model_facts(r: Ranking, predicted: pd.DataFrame | None) -> ModelFacts | None:
    """None where the model predicts nothing for the ranking (one worker, no prediction)."""
    from .prediction import BOUND

    if predicted is None or predicted.empty or r.workers < 2:
        return None
    rows = predicted[predicted["entry"].isin(r.order)]
    if rows.empty:
        return None
    unmodelled = {
        e: flag for e, flag in zip(rows["entry"], rows["flag"], strict=False) if flag and not flag.startswith("missed")
    }
    means = (
        rows[~rows["entry"].isin(unmodelled)]
        .groupby("entry", sort=False)[["predicted_images_per_second", "measured_images_per_second"]]
        .mean()
    )
    entries = [e for e in r.order if e in means.index]
    pred = {e: float(means.loc[e, "predicted_images_per_second"]) for e in entries}
    meas = {e: float(means.loc[e, "measured_images_per_second"]) for e in entries}
    misses = [e for e in entries if abs(pred[e] / meas[e] - 1) > BOUND]
    ordered = [
        (a, b)
        for i, a in enumerate(r.order)
        for b in r.order[i + 1 :]
        if a in pred and b in pred and r.verdict(a, b) == BEYOND
    ]
    return ModelFacts(unmodelled, pred, meas, misses, ordered, [(a, b) for a, b in ordered if pred[a] < pred[b]])


def model_reading(r: Ranking, predicted: pd.DataFrame | None) -> list[str]:
    """The cost model's images/s for the ranking's entries (prediction.py: from single's compute
    and the links commbench measured), where it misses them, and the pairs it orders otherwise
    than the measurement does beyond the noise."""
    from .prediction import BOUND

    facts = model_facts(r, predicted)
    if facts is None:
        return []
    found = []
    if facts.unmodelled:
        found.append(
            "The cost model has no prediction for "
            + "; ".join(f"{e} ({flag})" for e, flag in facts.unmodelled.items())
            + "."
        )
    if not facts.predicted:
        return found
    misses = [
        f"{e} (predicted {facts.predicted[e]:.2f} against {facts.measured[e]:.2f} measured, "
        f"x{facts.predicted[e] / facts.measured[e]:.2f})"
        for e in facts.misses
    ]
    found.append(
        f"The cost model (a prediction from single's compute and the measured links, "
        f"not a measurement) comes within {BOUND:.0%} of the measured images/s for "
        f"{len(facts.predicted) - len(misses)} of the {len(facts.predicted)} entries it "
        "models" + (f"; it misses {joined(misses)}" if misses else "") + "."
    )
    if facts.reversed:
        found.append(
            f"The model and the measurement disagree on {len(facts.reversed)} of the "
            f"{len(facts.ordered)} pairs that differ beyond the noise: it predicts "
            + joined(f"{b} faster than {a}" for a, b in facts.reversed)
            + "."
        )
    elif facts.ordered:
        found.append(f"It orders all {len(facts.ordered)} pairs that differ beyond the noise as the measurement does.")
    return found


def model_summary(r: Ranking, predicted: pd.DataFrame | None) -> str:
    """The cost model's reading in one sentence, for the conclusion."""
    from .prediction import BOUND

    facts = model_facts(r, predicted)
    if facts is None or not facts.predicted:
        return ""
    n = len(facts.predicted)
    order = (
        f", and orders {len(facts.ordered) - len(facts.reversed)} of the {len(facts.ordered)} "
        "pairs that differ beyond the noise as measured"
        if facts.ordered
        else ""
    )
    return (
        f"With {counted(r.workers, 'worker')}, the cost model comes within {BOUND:.0%} of the measured "
        f"images/s for {n - len(facts.misses)} of the {n} entries it models{order}."
    )
