"""What the results say, in generated sentences: the answer (answer()) and the findings of each
table. The HTML report and the paper (numbers.py writes the sentences as LaTeX macros) read the
same sentences, so no number is typed by hand anywhere and the two cannot disagree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from ..runtime.records.equivalence import EquivalenceRecord
from ..strategies import REGISTERED, STRATEGIES
from .load import RunDir, baseline_mask
from .noise import Difference, Spread, difference
from .noise import spreads as noise_spreads
from .render import Section
from .tables import entry_means, significant, tex_escape

# torchvision's published box AP@[.5:.95] of fasterrcnn_resnet50_fpn (COCO_V1 weights) on COCO
# val2017, trained with its reference recipe (26 epochs): the model card's "box_map": 37.0.
TORCHVISION_BOX_AP = 0.370

# Columns of summary.csv whose per-entry mean (and sd) numbers.tex defines, with the decimals.
MACRO_COLUMNS = {"images_per_second": 2, "speedup_vs_single": 3, "sec_per_iter_mean": 4,
                 "time_data": 4, "time_compute": 4, "time_communication": 4,
                 "time_optimizer": 4, "AP": 3, "AP50": 3, "AP75": 3, "train_seconds": 1}


def scaling_findings(scaling: pd.DataFrame) -> list[str]:
    rows = scaling[(scaling["workers"] > 1) & scaling["speedup_vs_single"].notna()]
    return [f"{row['strategy']} with {int(row['workers'])} workers: {row['images_per_second']:.2f} "
            f"images/s, {row['speedup_vs_single']:.2f}x single ({row['baseline']}), scaling "
            f"efficiency {row['efficiency']:.0%}." for _, row in rows.iterrows()]


def data_mode_findings(table: pd.DataFrame) -> list[str]:
    return [f"{row['strategy']} with {row['workers']} worker(s): {row['real images/s']:.2f} "
            f"images/s with the loader, {row['synthetic images/s']:.2f} on in-memory tensors; "
            f"the loader costs {row['loader share']:.0%} of the throughput."
            for _, row in table.iterrows()]


def time_to_accuracy_findings(summary: pd.DataFrame) -> list[str]:
    scored = summary[(summary["status"] == "ok") & (summary["data_mode"] == "real")]
    if scored.empty or scored["target_ap"].isna().all():
        return []
    target = float(scored["target_ap"].iloc[0])
    found = []
    for entry, group in scored.groupby("entry", sort=False):
        reached = group["seconds_to_target"].dropna()
        if reached.empty:
            found.append(f"{entry} did not reach AP {target:.3f} in any of its {len(group)} runs.")
        else:
            found.append(f"{entry} reached AP {target:.3f} in {len(reached)} of {len(group)} runs, "
                         f"after {reached.mean():.1f} s of training on average.")
    return found


def macro(name: str, value: str) -> str:
    return f"\\newcommand{{\\{name}}}{{{value}}}\n"


def bytes_sentences() -> str:
    """How bytes per iteration compare with theory and how each strategy counts them, in the
    strategies' own words (Strategy.theory_text, bytes_counted): the report's and the paper's."""
    theory = "; ".join(cls.theory_text for cls in REGISTERED if cls.theory_text)
    counted = " ".join(cls.bytes_counted for cls in REGISTERED if cls.bytes_counted)
    return ("Bytes are per iteration for the rank that moves the most (sent + received), beside "
            f"the theory, for M bytes of gradients: {theory}. How they are counted differs. {counted}")


def communication_definition() -> str:
    """What the time split's communication holds, strategy by strategy
    (Strategy.communication_timed): the report's definition and the paper's."""
    timed = "; ".join(f"{cls.label}: {cls.communication_timed}" for cls in REGISTERED
                      if cls.communication_timed)
    inside = [cls.label for cls in REGISTERED if cls.communication_timed is None]
    within = (f"; {' and '.join(inside)} exchange inside the forward and backward passes, so their "
              "communication counts as compute and none is timed apart" if inside else "")
    return (f"communication = the strategy's own exchange ({timed}){within}; in a synchronous "
            "strategy it includes the wait for the slower worker, as its exchange cannot end "
            "before the last worker's compute does")


def memory_sentences() -> str:
    """What each strategy's busiest process holds by its analysis (Strategy.memory_text)."""
    held = "; ".join(f"{cls.label}: {cls.memory_text}" for cls in REGISTERED if cls.memory_text)
    return ("Memory is that of the process that holds the most: its peak (on a GPU the most its "
            "tensors held at once, torch.cuda.max_memory_allocated; on a CPU its peak resident "
            "set, the Python runtime and libraries included) and the parameters, gradients and "
            "optimizer state it owns, counted from its tensors, beside its strategy's analysis "
            f"for M bytes of gradients: {held}.")


def inference_seconds(runs: list[RunDir]) -> dict[str, float]:
    """run id -> the seconds its final evaluation's inference took (metrics.json)."""
    return {run.run_id: float(run.metrics.inference_seconds or 0.0) for run in runs if run.ok}


# ---- The answer: what the results say, generated from them ----------------------------------
# The abstract, the results, the conclusion and the top of the report state it: for each worker
# count the entries ranked by images/s and by AP with the noise rule's verdicts (noise.py), by
# how much, and why in the data's terms (time split, communication share, bytes per iteration,
# memory per worker, the cost model's reading); the entries that did not run, once, with their
# reason; the counts. No number in it is typed: a different machine or preset gets its own.

BEYOND, WITHIN = "beyond the noise", "within the noise"   # noise.Difference.verdict
UNITS = {"images_per_second": "images/s", "AP": "AP"}
EXTREMES = {"images_per_second": ("the fastest", "the slowest"),
            "AP": ("the highest in AP", "the lowest in AP")}
SPLIT = ("data", "compute", "communication", "optimizer")  # load.TIME_SPLIT
MODES = {"real": "", "synthetic": " on in-memory tensors"}
# The per-entry means the why is told from (tables.entry_means: mean over the entry's seeds).
WHY_COLUMNS = ["sec_per_iter_mean", *(f"time_{part}" for part in SPLIT), "communication_share",
               "busiest_rank_bytes_per_iter", "busiest_rank_theory_bytes_per_iter",
               "owned_state_mb", "peak_memory_mb"]


def _join(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _number(value: float, metric: str) -> str:
    """As numbers.tex writes the metric (MACRO_COLUMNS' decimals)."""
    return f"{value:.{MACRO_COLUMNS[metric]}f}"


def _times(ratio: float) -> str:
    return f"{ratio:.3f}x" if abs(ratio - 1) < 0.005 else f"{ratio:.2f}x"


def _as_many(ratio: float, what: str, same: str = "as many") -> str:
    """'1.50x the bytes of' / 'as many bytes as' (the next word names the other)."""
    return f"{same} {what} as" if abs(ratio - 1) < 0.005 else f"{_times(ratio)} the {what} of"


def _size(n_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            return f"{significant(n_bytes / scale)} {unit}"
    return f"{n_bytes:.0f} B"


def _share(fraction: float) -> str:
    return f"{fraction:.1%}" if fraction < 0.01 else f"{fraction:.0%}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _count(n, thing: str) -> str:
    """'1 thread', '4 images'; 'n/a threads' where it was not recorded."""
    if not _known(n):
        return f"n/a {thing}s"
    return f"{int(n)} {thing}" + ("" if int(n) == 1 else "s")


def _workers(n: int) -> str:
    return _count(n, "worker")


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
    order: tuple[str, ...]                  # highest mean first
    spreads: dict[str, Spread]
    pairs: dict[frozenset, tuple[str, Difference]]  # the pair's first entry, first - second
    qualifiers: dict[str, str]              # ' (4 images a step)' where the group's differ

    @property
    def judged(self) -> list[str]:
        return [e for e in self.order if self.spreads[e].n >= 2]

    @property
    def unjudged(self) -> list[str]:
        return [e for e in self.order if self.spreads[e].n < 2]

    @property
    def lead(self) -> str:
        return f"With {_workers(self.workers)}{MODES.get(self.mode, f' ({self.mode} data)')}"

    def verdict(self, a: str, b: str) -> str:
        return self.pairs[frozenset((a, b))][1].verdict

    def difference(self, a: str, b: str) -> tuple[float, float, float]:
        """a's mean over b's, and the 95 % interval of a - b."""
        first, d = self.pairs[frozenset((a, b))]
        if first == a:
            return d.ratio, d.low, d.high
        return (1 / d.ratio if d.ratio else math.nan), -d.high, -d.low

    def value(self, entry: str) -> str:
        return _number(self.spreads[entry].mean, self.metric)


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
            for b in order[i + 1:]:
                row = decided.get((int(workers), mode, a, b)) or decided.get((int(workers), mode, b, a))
                pairs[frozenset((a, b))] = (a, difference(spreads[a], spreads[b])) if row is None else (
                    row.a, Difference(Spread(row.a_mean, row.a_sd, int(row.a_n)),
                                      Spread(row.b_mean, row.b_sd, int(row.b_n)), row.low, row.high))
        firsts = group.groupby("entry", sort=False).first()
        differing = [(column, unit, after) for column, unit, after in
                     (("global_batch", "image", " a step"), ("threads", "thread", ""))
                     if firsts[column].nunique(dropna=False) > 1]
        qualifiers = {e: (" (" + ", ".join(_count(firsts.loc[e, c], u) + after
                                           for c, u, after in differing)
                          + ")" if differing else "") for e in order}
        found.append(Ranking(metric, int(workers), mode, order, spreads, pairs, qualifiers))
    return found


def ranking_sentences(r: Ranking) -> list[str]:
    """The ranking with each entry's mean ± sd (n), the steps beyond the noise by how much, the
    pairs within it in one sentence, and the entries too few runs leave unjudged."""
    unit, places = UNITS[r.metric], MACRO_COLUMNS[r.metric]
    if len(r.order) == 1:
        (only,) = r.order
        did = "was scored" if r.metric == "AP" else "ran"
        return [f"{r.lead}, only {only}{r.qualifiers[only]} {did}: "
                f"{_with_unit(r.spreads[only], r.metric)}."]
    found = [f"{r.lead}, ranked by {unit}: " + ", ".join(
        f"{e}{r.qualifiers[e]} {r.spreads[e].text(places)}" for e in r.order) + "."]
    judged = r.judged
    if len(judged) >= 2:
        pairs = [(a, b) for i, a in enumerate(judged) for b in judged[i + 1:]]
        beyond = [(a, b) for a, b in pairs if r.verdict(a, b) == BEYOND]
        within = [(a, b) for a, b in pairs if r.verdict(a, b) == WITHIN]

        def by_how_much(listed) -> str:
            return "; ".join(f"{a} reaches {_times(ratio)} the {unit} of {b} (95% interval of the "
                             f"difference {low:+.{places}f} to {high:+.{places}f})"
                             for a, b in listed for ratio, low, high in [r.difference(a, b)])

        if not beyond:
            found.append("The two are within the noise of each other." if len(judged) == 2 else
                         "No two of them differ beyond the noise.")
        elif not within:
            steps = list(zip(judged, judged[1:]))
            found.append("Every pair of them differs beyond the noise, in the order of the "
                         f"ranking; step by step: {by_how_much(steps)}.")
        elif len(beyond) <= len(within):  # the shorter list named, pair by pair
            found.append(f"Beyond the noise: {by_how_much(beyond)}. Every other pair of them is "
                         "within the noise.")
        else:
            steps = [(a, b) for a, b in zip(judged, judged[1:]) if (a, b) in beyond]
            rest = len(beyond) - len(steps)
            found.append(f"Beyond the noise, down the ranking: {by_how_much(steps)}. Within the "
                         "noise of each other: " + "; ".join(
                             f"{a} and {b} ({_times(r.difference(a, b)[0])})" for a, b in within)
                         + "." + ("" if not rest else " The other pair of them differs beyond the "
                                  "noise too, in the order of the ranking." if rest == 1 else
                                  f" The other {rest} pairs of them differ beyond the noise too, "
                                  "in the order of the ranking."))
    if r.unjudged:
        whose = "its" if len(r.unjudged) == 1 else "their"
        found.append(f"{_join(r.unjudged)} ran once: {whose} differences from the others are "
                     "not judged (fewer than 2 runs on a side).")
    return found


def headline(r: Ranking) -> str:
    """The ranking in one sentence: the top and the bottom by the noise rule, and by how much."""
    unit = UNITS[r.metric]
    high, low = EXTREMES[r.metric]
    if len(r.order) == 1:
        return f"{r.lead}, only {r.order[0]} ran ({_with_unit(r.spreads[r.order[0]], r.metric)})."
    name = {e: e + r.qualifiers[e] for e in r.order}
    judged = r.judged
    unjudged = (f" ({_join(r.unjudged)}, with one run, {'is' if len(r.unjudged) == 1 else 'are'} "
                "not judged.)" if r.unjudged and len(judged) >= 2 else "")
    if len(judged) < 2:
        return (f"{r.lead}, {name[r.order[0]]} had the highest mean {unit} ({r.value(r.order[0])}) "
                f"and {name[r.order[-1]]} the lowest ({r.value(r.order[-1])}); with one run on a "
                "side, no difference among them is judged.")
    first, last = judged[0], judged[-1]
    if r.verdict(first, last) != BEYOND:
        return (f"{r.lead}, no entry differs from another beyond the noise "
                f"({r.value(last)} to {r.value(first)} {unit}).{unjudged}")
    top = [first] + [e for e in judged[1:] if r.verdict(first, e) == WITHIN]
    bottom = [e for e in judged[:-1] if r.verdict(e, last) == WITHIN and e not in top] + [last]

    def group(entries: list[str], extreme: str, verb: str, anchor: str) -> str:
        values = _join(r.value(e) for e in entries)
        together = ("" if len(entries) == 1 else ", within the noise of each other"
                    if len(entries) == 2 else f", each within the noise of {anchor}")
        return f"{_join(name[e] for e in entries)}{verb} {extreme} ({values} {unit}{together})"

    plural = " were" if len(top) > 1 else " was"
    return (f"{r.lead}, {group(top, high, plural, first)} and {group(bottom, low, '', last)}: "
            f"{first} reaches {_times(r.difference(first, last)[0])} the {unit} of {last}, "
            "beyond the noise."
            f"{unjudged}")


def _strategy(summary: pd.DataFrame, entry: str):
    return STRATEGIES.get(summary.loc[summary["entry"] == entry, "strategy"].iloc[0])


def why_throughput(r: Ranking, means: pd.DataFrame, summary: pd.DataFrame,
                   predicted: pd.DataFrame | None) -> list[str]:
    """Why the ranking is what it is, in what the runs measured: where the time of an iteration
    goes (the fastest against the slowest at the same global batch), the communication share,
    bytes per iteration, memory per worker, and the cost model's reading of the same runs."""
    found = []
    moved = [e for e in r.order if _known(means.loc[e, "busiest_rank_bytes_per_iter"])
             and means.loc[e, "busiest_rank_bytes_per_iter"] > 0]
    if not moved:
        return ["None of them moves a byte between processes, so there is no communication to "
                "tell them apart; their time split and memory are in the report's tables."]
    fast, slow, judged = extremes(r, means) or (r.order[0], r.order[0], False)
    F, S = means.loc[fast], means.loc[slow]
    if slow != fast and _known(S["sec_per_iter_mean"]) and _known(F["sec_per_iter_mean"]):
        gap = S["sec_per_iter_mean"] - F["sec_per_iter_mean"]
        parts = {part: S[f"time_{part}"] - F[f"time_{part}"] for part in SPLIT
                 if _known(S[f"time_{part}"]) and _known(F[f"time_{part}"])}
        other = gap - sum(parts.values())
        listed = [f"{part} {d:+.4f} s" for part, d in sorted(parts.items(), key=lambda kv: -abs(kv[1]))]
        if abs(other) >= 0.00005:
            listed.append(f"{other:+.4f} s outside the time split")
        found.append(f"{'Why' if judged else 'Why the means differ (not judged)'}: an "
                     f"iteration of {slow} takes {S['sec_per_iter_mean']:.4f} s and one of "
                     f"{fast} {F['sec_per_iter_mean']:.4f} s; of the {gap:.4f} s between them, "
                     f"{', '.join(listed)} (the time split's means over seeds).")
        inside = [e for e in (fast, slow)
                  if (s := _strategy(summary, e)) and s.communication_timed is None]
        if inside:
            found.append(f"{_join(inside)} exchange{'s' if len(inside) == 1 else ''} inside the "
                         "forward and backward passes, so there compute holds the communication.")
    timed = [(e, means.loc[e, "communication_share"]) for e in moved
             if _known(means.loc[e, "communication_share"])
             and (s := _strategy(summary, e)) and s.communication_timed]
    if timed:
        found.append("Communication timed apart takes " + _join(
            f"{_share(share)} of the iteration of {e}" for e, share in timed) + ".")
    moved = [(e, means.loc[e, "busiest_rank_bytes_per_iter"],
              means.loc[e, "busiest_rank_theory_bytes_per_iter"]) for e in moved]
    if moved:
        as_theory = all(_known(t) and t > 0 and abs(b / t - 1) <= 0.01 for _, b, t in moved)
        found.append("Bytes per iteration of the busiest rank (sent + received)"
                     + (", each within 1% of its strategy's theory" if as_theory else "") + ": "
                     + ", ".join(f"{e} {_size(b)}" + ("" if as_theory or not _known(t) else
                                                      f" (theory {_size(t)})")
                                 for e, b, t in moved) + ".")
        sizes = {e: b for e, b, _ in moved}
        if fast in sizes and slow in sizes and slow != fast and sizes[fast]:
            found.append(f"{slow} moves {_as_many(sizes[slow] / sizes[fast], 'bytes')} {fast}.")
    held = [e for e in r.order if _known(means.loc[e, "owned_state_mb"])]
    if held:
        found.append("Memory per worker, in the process that holds the most (parameters, gradients "
                     "and optimizer state it owns / its peak): " + ", ".join(
                         f"{e} {significant(means.loc[e, 'owned_state_mb'])} / "
                         f"{significant(means.loc[e, 'peak_memory_mb'])} MiB" for e in held) + ".")
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


@dataclass(frozen=True)
class ModelFacts:
    """The cost model's images/s against the measured, entry by entry (means over seeds)."""

    unmodelled: dict[str, str]            # entry -> why the model has no prediction
    predicted: dict[str, float]
    measured: dict[str, float]
    misses: list[str]                     # off by more than prediction.BOUND
    ordered: list[tuple[str, str]]        # pairs the measurement ranks beyond the noise
    reversed: list[tuple[str, str]]       # ... that the model ranks the other way


def model_facts(r: Ranking, predicted: pd.DataFrame | None) -> ModelFacts | None:
    """None where the model predicts nothing for the ranking (one worker, no prediction)."""
    from .prediction import BOUND

    if predicted is None or predicted.empty or r.workers < 2:
        return None
    rows = predicted[predicted["entry"].isin(r.order)]
    if rows.empty:
        return None
    unmodelled = {e: flag for e, flag in zip(rows["entry"], rows["flag"])
                  if flag and not flag.startswith("missed")}
    means = rows[~rows["entry"].isin(unmodelled)].groupby("entry", sort=False)[
        ["predicted_images_per_second", "measured_images_per_second"]].mean()
    entries = [e for e in r.order if e in means.index]
    pred = {e: float(means.loc[e, "predicted_images_per_second"]) for e in entries}
    meas = {e: float(means.loc[e, "measured_images_per_second"]) for e in entries}
    misses = [e for e in entries if abs(pred[e] / meas[e] - 1) > BOUND]
    ordered = [(a, b) for i, a in enumerate(r.order) for b in r.order[i + 1:]
               if a in pred and b in pred and r.verdict(a, b) == BEYOND]
    return ModelFacts(unmodelled, pred, meas, misses, ordered,
                      [(a, b) for a, b in ordered if pred[a] < pred[b]])


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
        found.append("The cost model has no prediction for " + "; ".join(
            f"{e} ({flag})" for e, flag in facts.unmodelled.items()) + ".")
    if not facts.predicted:
        return found
    misses = [f"{e} (predicted {facts.predicted[e]:.2f} against {facts.measured[e]:.2f} measured, "
              f"x{facts.predicted[e] / facts.measured[e]:.2f})" for e in facts.misses]
    found.append(f"The cost model (a prediction from single's compute and the measured links, "
                 f"not a measurement) comes within {BOUND:.0%} of the measured images/s for "
                 f"{len(facts.predicted) - len(misses)} of the {len(facts.predicted)} entries it "
                 "models" + (f"; it misses {_join(misses)}" if misses else "") + ".")
    if facts.reversed:
        found.append(f"The model and the measurement disagree on {len(facts.reversed)} of the "
                     f"{len(facts.ordered)} pairs that differ beyond the noise: it predicts "
                     + _join(f"{b} faster than {a}" for a, b in facts.reversed) + ".")
    elif facts.ordered:
        found.append(f"It orders all {len(facts.ordered)} pairs that differ beyond the noise as "
                     "the measurement does.")
    return found


def model_summary(r: Ranking, predicted: pd.DataFrame | None) -> str:
    """The cost model's reading in one sentence, for the conclusion."""
    from .prediction import BOUND

    facts = model_facts(r, predicted)
    if facts is None or not facts.predicted:
        return ""
    n = len(facts.predicted)
    order = (f", and orders {len(facts.ordered) - len(facts.reversed)} of the {len(facts.ordered)} "
             "pairs that differ beyond the noise as measured" if facts.ordered else "")
    return (f"With {_workers(r.workers)}, the cost model comes within {BOUND:.0%} of the measured "
            f"images/s for {n - len(facts.misses)} of the {n} entries it models{order}.")


@dataclass(frozen=True)
class BaselineGap:
    """The baseline entry's AP against the multi-worker entries at its global batch and data
    mode, by the noise rule."""

    baseline: str
    spread: Spread
    workers: int
    batch: int
    above: list[tuple[str, float]]      # (entry, baseline - entry) beyond the noise
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
        same = firsts[(firsts["global_batch"] == base["global_batch"])
                      & (firsts["data_mode"] == base["data_mode"])
                      & (firsts["workers"] > base["workers"])]
        for workers, group in same.groupby("workers", sort=True):
            above, below, within, unjudged = [], [], [], []
            for e in group.index:
                verdict = difference(spreads[b], spreads[e]).verdict
                gap = spreads[b].mean - spreads[e].mean
                if verdict == BEYOND:
                    (above if gap > 0 else below).append((e, gap))
                elif verdict == WITHIN:
                    within.append(e)
                else:
                    unjudged.append(e)
            found.append(BaselineGap(b, spreads[b], int(workers), int(base["global_batch"]),
                                     above, below, within, unjudged,
                                     {e: spreads[e] for e in group.index}))
    return found


def gap_sentence(g: BaselineGap) -> str:
    def by(gaps):
        return f"{_join(e for e, _ in gaps)} beyond the noise (by {_span([abs(v) for _, v in gaps], 3)})"

    parts = ([f"above {by(g.above)}"] if g.above else []) + (
        [f"below {by(g.below)}"] if g.below else []) + (
        [f"within the noise of {_join(g.within)}"] if g.within else []) + (
        [f"not judged against {_join(g.unjudged)} (one run on a side)"] if g.unjudged else [])
    listed = ", ".join(f"{e} {s.text(3)}" for e, s in g.others.items())
    return (f"{g.baseline}'s AP, {g.spread.text(3)}, against the {g.workers}-worker entries at the "
            f"same global batch of {g.batch} images ({listed}): {'; '.join(parts)}.")


def _span(values, places: int) -> str:
    """'0.064 to 0.067', or '0.064' where they show alike."""
    low, high = f"{min(values):.{places}f}", f"{max(values):.{places}f}"
    return low if low == high else f"{low} to {high}"


def gap_headline(g: BaselineGap) -> str:
    n = len(g.others)
    values = _span([s.mean for s in g.others.values()], 3)
    whom = f"{'every' if n > 1 else 'the'} {g.workers}-worker entry"
    if g.above and len(g.above) == n:
        return (f"{g.baseline} reached a higher AP ({g.spread.mean:.3f}) than {whom} at the same "
                f"global batch ({values}), beyond the noise.")
    if g.below and len(g.below) == n:
        return (f"{g.baseline} reached a lower AP ({g.spread.mean:.3f}) than {whom} at the same "
                f"global batch ({values}), beyond the noise.")
    if len(g.within) == n:
        return (f"{g.baseline}'s AP ({g.spread.mean:.3f}) is within the noise of every "
                f"{g.workers}-worker entry's at the same global batch ({values}).")
    if len(g.unjudged) == n:
        return (f"{g.baseline}'s AP ({g.spread.mean:.3f}) against the {g.workers}-worker "
                f"entr{'y' if n == 1 else 'ies'}' at the same global batch ({values}) is not "
                "judged: one run on a side.")

    def many(k: int) -> str:
        return "all of them" if k == n and n > 1 else "it" if n == 1 else f"{k} of them"

    verdicts = ([f"above {many(len(g.above))} beyond the noise"] if g.above else []) + (
        [f"below {many(len(g.below))} beyond the noise"] if g.below else []) + (
        [f"within the noise of {many(len(g.within))}"] if g.within else []) + (
        [f"not judged against {many(len(g.unjudged))} (one run on a side)"] if g.unjudged else [])
    return (f"{g.baseline}'s AP ({g.spread.mean:.3f}) against the {g.workers}-worker "
            f"entr{'y' if n == 1 else 'ies'}' at the same global batch ({values}): "
            f"{_join(verdicts)}.")


def equivalence_sentence(equivalence: EquivalenceRecord | None) -> str:
    """What the one-step check (pipeline/equivalence.py) found, and its why."""
    checked = equivalence.relative_steps if equivalence else {}
    if not checked:
        return ""
    values = {significant(v) for v in checked.values()}
    away = (f"{values.pop()} of single's step" if len(values) == 1 else
            ", ".join(f"{name} {significant(v)}" for name, v in checked.items()) + " of single's step")
    return (f"From the same weights and the same global batch, one SGD step of each of "
            f"{_join(checked)} lands {away} away from that of {equivalence.reference} (the "
            f"one-step equivalence check). " + (
                f"{equivalence.why} (each cause's share measured by the same check: the accuracy "
                "gap, cause by cause)" if equivalence.causes else
                f"Hypothesis, as this check measured no cause (the model.norm ablation does): "
                f"{equivalence.why}"))


def equivalence_short(equivalence: EquivalenceRecord | None) -> str:
    """The one-step check in one clause: how far the strategies' step lands from single's."""
    checked = list(equivalence.relative_steps.values()) if equivalence else []
    if not checked:
        return ""
    return (f"one SGD step of each of the {len(checked)} strategies checked lands "
            f"{_span(checked, 4) if len(checked) > 1 else f'{checked[0]:.4f}'} of single's step "
            "away from single's, from the same weights and the same batch")


def not_run_sentence(summary: pd.DataFrame) -> str:
    """Every entry with a run that did not complete, once, with its reason."""
    bad = summary[summary["status"] != "ok"]
    if bad.empty:
        return "Every run of the sweep completed."
    verbs = {"skipped": "was skipped", "failed": "failed"}
    found = []
    for (status, reason), group in bad.fillna({"reason": ""}).groupby(["status", "reason"], sort=False):
        named = []
        for entry, runs_ in group.groupby("entry", sort=False):
            first, total = runs_.iloc[0], int((summary["entry"] == entry).sum())
            count = (f"{len(runs_)} of its {total} runs" if len(runs_) < total else
                     f"{total} run{'s' if total > 1 else ''}")
            declared = STRATEGIES.get(first["strategy"])
            named.append(f"{declared.label if declared else first['strategy']} ({entry}, {count})")
        why = str(reason).strip().rstrip(".")
        said = f"{_join(named)} {verbs.get(status, f'ended {status}')}" + (f": {why}." if why else ".")
        found.append(said[0].upper() + said[1:])
    return "Not run on this machine, so neither ranked nor discussed: " + " ".join(found)


@dataclass(frozen=True)
class Answer:
    """The answer in generated sentences, and the counts numbers.tex defines."""

    counts: dict[str, int]
    counts_sentence: str
    time_sentence: str
    workflow_time: str
    throughput: list[str]      # paragraphs, one per worker count (and data mode)
    accuracy: list[str]        # paragraphs
    not_run: str
    abstract: str
    conclusion: str
    scope: str
    out_of_sample: str = ""    # the cost model on the held-out entries (holdout.py); '' if none

    def section(self) -> Section:
        """The report's long-form answer, right under the verdict (verdict.py)."""
        return Section("The answer in full: rankings, intervals and entries", [
            self.counts_sentence, *self.throughput, *filter(None, [self.out_of_sample]),
            *self.accuracy, self.not_run, self.time_sentence, self.scope])

    def macros(self) -> str:
        paragraphs = {"AnswerCounts": [self.counts_sentence], "AnswerTime": [self.time_sentence],
                      "WorkflowTime": [self.workflow_time],
                      "AnswerThroughput": self.throughput, "AnswerAccuracy": self.accuracy,
                      "NotRun": [self.not_run], "AnswerAbstract": [self.abstract],
                      "AnswerConclusion": [self.conclusion], "AnswerScope": [self.scope]}
        return ("".join(macro(name, str(value)) for name, value in self.counts.items())
                + "".join(macro(name, "\n\n".join(tex_escape(p) for p in texts))
                          for name, texts in paragraphs.items()))


def counts_of(summary: pd.DataFrame) -> tuple[dict[str, int], str]:
    ok = summary["status"] == "ok"
    skipped = int((summary["status"] == "skipped").sum())
    failed = int(len(summary) - ok.sum() - skipped)
    per_entry = summary[ok].groupby("entry", sort=False).size()
    seeded = per_entry[per_entry >= 2]
    counts = {"RunCount": len(summary), "CompletedCount": int(ok.sum()),
              "SkippedCount": skipped, "FailedCount": failed,
              "EntryCount": int(summary["entry"].nunique()), "CompletedEntryCount": len(per_entry),
              "SeededEntries": len(seeded), "SingleSeedEntries": int((per_entry == 1).sum())}
    repeats = [f"{count} ran over {n} seeds" for n, count in
               sorted(seeded.value_counts().items(), reverse=True)]
    once = counts["SingleSeedEntries"]
    ran = _join(repeats + ([f"{once} ran once"] if once else []))
    return counts, (
        f"{counts['RunCount']} training runs of {counts['EntryCount']} sweep entries (an entry's "
        f"runs differ only in their seed): {counts['CompletedCount']} completed, {skipped} skipped"
        + (f", {failed} failed" if failed else "") + ". "
        + (f"Of the {len(per_entry)} entries that ran, {ran}." if len(per_entry) else
           "No entry completed a run."))


def time_of(summary: pd.DataFrame, inference: dict[str, float]) -> tuple[str, str]:
    """The completed runs' recorded seconds of training and evaluation, summed, and what that
    leaves out."""
    done = summary[summary["status"] == "ok"]
    seconds = float(done["train_seconds"].fillna(0).sum() + done["evaluation_seconds"].fillna(0).sum()
                    + sum(inference.get(run, 0.0) or 0.0 for run in done["run_id"]))
    text = _duration(seconds)
    return text, (
        f"The {len(done)} completed runs trained and evaluated for {text} in all on their "
        "machine: the sum of the "
        "seconds their records hold for training, for the evaluations during training and for "
        "the final evaluation's inference. Process start-up, data preparation, the link "
        "benchmark, the equivalence check and the report are not in it, so the workflow takes "
        "longer.")


def scope_sentence(dataset: str) -> str:
    if dataset == "coco2017":
        return ("These runs train on COCO 2017, the published study's data; only its own recipe "
                "and hardware make their AP and time comparable with the published values.")
    return (f"These runs train on {dataset} data, not COCO 2017: they show that every strategy "
            "trains and is measured the same way and how the strategies compare on this machine; "
            "their absolute AP and times are not comparable with the published values.")


def answer(summary: pd.DataFrame, compared: pd.DataFrame, predicted: pd.DataFrame | None = None,
           equivalence: EquivalenceRecord | None = None, dataset: str = "unknown",
           inference: dict[str, float] | None = None, out_of_sample: str = "") -> Answer:
    """The answer from the results: `summary` (load.summary_frame, every run), `compared`
    (noise.comparisons), `predicted` (prediction.prediction_frame: the runs the model was fitted
    beside), `equivalence` (the one-step check's record), `inference` (run id -> its final
    evaluation's seconds), `out_of_sample` (holdout.HeldOut.sentence: the model on the held-out
    entries, '' where none was held out)."""
    counts, counts_sentence = counts_of(summary)
    workflow_time, time_sentence = time_of(summary, inference or {})
    done = summary[summary["status"] == "ok"]
    primary = "real" if (done["data_mode"] == "real").any() else None
    means = entry_means(summary, WHY_COLUMNS).set_index("entry") if len(done) else None

    def shown(r: Ranking) -> bool:  # an in-memory entry alone at its workers: the loader's table
        return r.mode == primary or primary is None or len(r.order) > 1

    speed = [r for r in rankings(summary, compared, "images_per_second") if shown(r)]
    throughput = [" ".join(ranking_sentences(r) + (why_throughput(r, means, summary, predicted)
                                                   if len(r.order) > 1 else []))
                  for r in speed]
    aside = [e for r in rankings(summary, compared, "images_per_second") if not shown(r)
             for e in r.order]
    if aside:
        one = len(aside) == 1
        throughput.append(f"{_join(aside)} ran on in-memory tensors, alone at "
                          f"{'its' if one else 'their'} worker count: "
                          f"{'it measures' if one else 'they measure'} the loader's share (the "
                          "data modes' table), not a ranking.")
    quality = [r for r in rankings(summary, compared, "AP") if shown(r)]
    gaps = baseline_gaps(summary)
    accuracy = [" ".join(ranking_sentences(r)) for r in quality]
    beyond = [g for g in gaps if g.above or g.below]
    accuracy += [gap_sentence(g) for g in gaps]
    if beyond and (why := equivalence_sentence(equivalence)):
        accuracy.append(f"Why they differ: the multi-worker strategies do not take single's step. {why}")
    if not accuracy:
        accuracy = ["No completed run was scored (AP)."]
    not_run = not_run_sentence(summary)
    headlines = [headline(r) for r in speed if len(r.order) > 1 and r.mode == (primary or r.mode)]
    abstract = " ".join([counts_sentence, *headlines, *(gap_headline(g) for g in gaps)])
    multi = [r for r in speed if len(r.order) > 1 and r.workers > 1]
    why_ap = equivalence_short(equivalence)
    conclusion = " ".join([
        *headlines, *filter(None, (short_why(r, means) for r in multi)),
        *filter(None, (model_summary(r, predicted) for r in multi)), *filter(None, [out_of_sample]),
        *(gap_headline(g)[:-1] + (f": {why_ap}." if why_ap and (g.above or g.below) else ".")
          for g in gaps)]) or "No two entries ran at one worker count."
    return Answer(counts, counts_sentence, time_sentence, workflow_time, throughput, accuracy,
                  not_run, abstract, conclusion, scope_sentence(dataset), out_of_sample)


def short_why(r: Ranking, means: pd.DataFrame) -> str:
    """The largest part of the gap beyond the noise between the fastest and the slowest entry
    at one global batch, and their bytes and owned state ('' where no gap is judged)."""
    fast, slow, judged = extremes(r, means) or (None, None, False)
    if not judged or not _known(means.loc[slow, "sec_per_iter_mean"]):
        return ""
    F, S = means.loc[fast], means.loc[slow]
    parts = {part: S[f"time_{part}"] - F[f"time_{part}"] for part in SPLIT
             if _known(S[f"time_{part}"]) and _known(F[f"time_{part}"])}
    gap = S["sec_per_iter_mean"] - F["sec_per_iter_mean"]
    found = f"{slow}'s iteration is {gap:.4f} s longer than {fast}'s"
    if parts:
        part, d = max(parts.items(), key=lambda kv: abs(kv[1]))
        found += f", {d:+.4f} s of it in {part}"
    extra = []
    for column, verb, what, same in (("busiest_rank_bytes_per_iter", "moves", "bytes", "as many"),
                                     ("owned_state_mb", "owns", "state per worker", "as much")):
        if _known(F[column]) and F[column] > 0 and _known(S[column]):
            extra.append(f"{verb} {_as_many(S[column] / F[column], what, same)} {fast}")
    return found + (f"; it {_join(extra)}" if extra else "") + "."
