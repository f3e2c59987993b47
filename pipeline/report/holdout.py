"""Held-out sweep entries: the cost model checked out of sample.

An entry marked `held_out: true` in a preset's sweep (pipeline/strategies/sweep.py) is trained
and measured like any other run. The cost model takes none of its runs as an input (prediction.py
`prediction_frame(..., held_out)`: single's compute, data wait and optimizer; the report's
predicted scaling and the what-if command's uncertainty band, costmodel/ranking.py, are fitted
on the other runs) and then predicts them. The report shows them in a section of their own,
labelled as predictions, apart from the runs the model was fitted beside: per run predicted and
measured images/s and their ratio, the mean bias (the mean of log(predicted / measured); above 0
the model is optimistic) and the mean |log(predicted / measured)|, against the goal: every
held-out entry's prediction within GOAL_RATIO of the median of its seeds (which cost the same:
the median is the entry's measurement), and a mean |log| over the held-out runs of at most
GOAL_LOG. On a noisy machine (disturbance.py: an entry's seeds further apart than its tolerance)
a miss or a hit may be the machine's, so the goal is said to be not judged, the figures shown.
Whether the goal is met is said in the answer too (answer.py, and after the verdict where it is
missed), never only here.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass, field

import pandas as pd

from .load import RunDir
from .tables import formatted
from .wording import joined

GOAL_RATIO = 0.15  # every held-out entry's predicted / median measured images/s within 1 +- this
GOAL_LOG = 0.08  # and the held-out runs' mean |log(predicted / measured)| at most this
GOAL = (
    f"every held-out entry within {GOAL_RATIO:.0%} of the median images/s of its seeds, and a "
    f"mean |log(predicted / measured)| over the held-out runs of at most {GOAL_LOG:.2f}"
)
DECIMALS = {
    "predicted images/s (model)": 2,
    "measured images/s": 2,
    "predicted / measured": 3,
    "log(predicted / measured)": 3,
}


def modelled(frame: pd.DataFrame) -> pd.Series:
    """The rows of prediction_frame the model predicts (a miss too), not those it cannot (no
    commbench for the process count, no cost model)."""
    return (frame["flag"] == "") | frame["flag"].str.startswith("missed")


def fitted(frame: pd.DataFrame, held_out: Collection[str]) -> pd.DataFrame:
    """prediction_frame's rows of the runs the model was fitted beside: no held-out entry's."""
    return frame[~frame["entry"].isin(list(held_out))].reset_index(drop=True)


def marked(frame: pd.DataFrame, held_out: Collection[str]) -> pd.DataFrame:
    """Every row, with whether its entry was held out (prediction.csv)."""
    return frame.assign(held_out=frame["entry"].isin(list(held_out)))


def _why_unpredicted(runs: list[RunDir]) -> tuple[str, bool]:
    """Why an entry's runs have no prediction row, and whether that is the model's failure (a
    completed run of more than one process it cannot predict) rather than nothing to judge."""
    if not runs:
        return "no run of it among the results", False
    done = [run for run in runs if run.ok]
    if not done:
        first = runs[0].summary
        return f"not completed ({first.status}: {first.reason})", False
    if (done[0].summary.processes or 1) < 2:
        return (
            "one process: the model predicts runs of more than one (its runs are left out of "
            "the model's inputs all the same)"
        ), False
    return f"no `single` run in its data mode ({done[0].summary.data_mode}) to take compute from", True


@dataclass(frozen=True)
class HeldOut:
    """The held-out entries and the model's predictions of their runs."""

    entries: tuple[str, ...] = ()  # entry ids, in sweep order
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)  # prediction_frame's, predicted ones
    not_judged: dict[str, str] = field(default_factory=dict)  # entry -> why (nothing to predict)
    unmodelled: dict[str, str] = field(default_factory=dict)  # entry -> why the model cannot
    noise: str = ""  # why the machine was noisy ('' where it was quiet): the goal is not judged

    @classmethod
    def of(cls, frame: pd.DataFrame, runs: list[RunDir], entries: Collection[str], noise: str = "") -> HeldOut:
        """From prediction_frame's rows (every run's, the model fitted without `entries`);
        `noise`: why the machine was noisy, '' where it was quiet."""
        entries = tuple(dict.fromkeys(entries))
        mine = frame[frame["entry"].isin(list(entries))]
        rows = mine[modelled(mine)].reset_index(drop=True)
        rows = rows.assign(log_ratio=[math.log(r) if r > 0 else math.nan for r in rows["ratio"]])
        not_judged: dict[str, str] = {}
        unmodelled: dict[str, str] = {}
        for entry in entries:
            if entry in set(rows["entry"]):
                continue
            flags = mine.loc[mine["entry"] == entry, "flag"]
            why, counts = (
                (flags.iloc[0], True) if len(flags) else _why_unpredicted([run for run in runs if run.entry == entry])
            )
            (unmodelled if counts else not_judged)[entry] = why
        return cls(entries, rows, not_judged, unmodelled, noise)

    @property
    def bias(self) -> float:
        """The mean of log(predicted / measured) over the held-out runs: above 0, optimistic."""
        return float(self.rows["log_ratio"].mean()) if len(self.rows) else math.nan

    @property
    def mean_abs_log(self) -> float:
        return float(self.rows["log_ratio"].abs().mean()) if len(self.rows) else math.nan

    @property
    def by_entry(self) -> pd.DataFrame:
        """Per held-out entry with a prediction: its runs, the median of their predictions and of
        their measured images/s (its seeds cost the same), and predicted over measured."""
        grouped = self.rows.groupby("entry", sort=False)
        found = pd.DataFrame(
            {
                "runs": grouped.size(),
                "predicted": grouped["predicted_images_per_second"].median(),
                "measured": grouped["measured_images_per_second"].median(),
            }
        ).reset_index()
        return found.assign(ratio=found["predicted"] / found["measured"])

    @property
    def outside(self) -> pd.DataFrame:
        """The held-out entries whose prediction is off the median of their seeds by more than
        GOAL_RATIO."""
        entries = self.by_entry
        return entries[~((entries["ratio"] - 1).abs() <= GOAL_RATIO)]

    @property
    def judged(self) -> bool:
        return len(self.rows) > 0 or bool(self.unmodelled)

    @property
    def met(self) -> bool:
        return (
            len(self.rows) > 0
            and not self.noise
            and self.outside.empty
            and not self.unmodelled
            and self.mean_abs_log <= GOAL_LOG
        )

    def table(self) -> pd.DataFrame:
        rows = self.rows
        return pd.DataFrame(
            {
                "run_id": rows["run_id"],
                "compute input": rows["compute_input"],
                "predicted images/s (model)": rows["predicted_images_per_second"],
                "measured images/s": rows["measured_images_per_second"],
                "predicted / measured": rows["ratio"],
                "log(predicted / measured)": rows["log_ratio"],
                f"within {GOAL_RATIO:.0%}": ["yes" if abs(r - 1) <= GOAL_RATIO else "no" for r in rows["ratio"]],
            }
        )

    def _figures(self) -> str:
        """'its 2 held-out runs at predicted/measured x0.95-1.10, each entry within 15% of its
        seeds' median, with a mean bias of ... and a mean |log(predicted/measured)| of ... (goal:
        at most 0.08)'."""
        ratios, outside = self.rows["ratio"], self.outside
        low, high = f"{ratios.min():.2f}", f"{ratios.max():.2f}"
        span = f"x{low}-{high}" if high != low else f"x{low}" + (" each" if len(ratios) > 1 else "")
        lean = "optimistic" if self.bias > 0 else "pessimistic" if self.bias < 0 else "unbiased"
        within = (
            f"each entry within {GOAL_RATIO:.0%} of its seeds' median"
            if outside.empty
            else joined([f"{row.entry} (x{row.ratio:.2f} of its seeds' median)" for row in outside.itertuples()])
            + f" outside {GOAL_RATIO:.0%}"
        )
        runs = f"{len(ratios)} held-out run" + ("s" if len(ratios) > 1 else "")
        return (
            f"its {runs} at predicted/measured {span}, {within}, with a mean bias of "
            f"{self.bias:+.3f} ({lean}) and a mean |log(predicted/measured)| of "
            f"{self.mean_abs_log:.3f} (goal: at most {GOAL_LOG:.2f})"
        )

    def sentence(self) -> str:
        """The answer's one sentence on the model out of sample; '' where nothing was held out."""
        if not self.entries:
            return ""
        if not self.judged:
            return (
                f"The cost model is not checked out of sample: none of its {len(self.entries)} "
                "held-out entries has a run it could predict ("
                + "; ".join(f"{e}: {why}" for e, why in self.not_judged.items())
                + ")."
            )
        unmodelled = (
            "; it has no prediction for " + joined([f"{e} ({why})" for e, why in self.unmodelled.items()])
            if self.unmodelled
            else ""
        )
        if not len(self.rows):
            return f"Out of sample the cost model misses its goal{unmodelled}."
        if self.noise:
            return (
                "Whether the cost model meets its goal out of sample cannot be judged: "
                f"{self.noise}. Fitted without them, it predicts {self._figures()}{unmodelled}."
            )
        return (
            f"Out of sample the cost model {'meets' if self.met else 'misses'} its goal: fitted "
            f"without them, it predicts {self._figures()}{unmodelled}."
        )

    def section(self) -> dict:
        """The report's section: what was held out, the goal, the table and the verdict."""
        title = "Held-out entries: the cost model out of sample (predictions)"
        if not self.entries:
            return {
                "title": title,
                "text": [
                    "No sweep entry was held out, so the cost model is checked only beside the runs "
                    "it was fitted on (the section above). Mark an entry `held_out: true` in the "
                    "preset's sweep to check it out of sample: it is trained and measured like any "
                    "other run, and the model is fitted without it."
                ],
            }
        return {
            "title": title,
            "text": [
                f"Predictions, not measurements, for the sweep entries held out ({', '.join(self.entries)}): "
                "the cost model was fitted without their runs (none of them is one of its inputs: "
                "single's compute, data wait and optimizer, the predicted scaling's compute and the "
                "what-if command's uncertainty band), then predicted them; each was trained and "
                f"measured like any other run. The goal: {GOAL}. Mean bias is the mean of "
                "log(predicted / measured) over the held-out runs (above 0: the model predicts them "
                "faster than they ran).",
                self.sentence(),
            ],
            "table": formatted(self.table(), DECIMALS) if len(self.rows) else None,
            "bullets": [f"{e}: no prediction, {why}" for e, why in {**self.unmodelled, **self.not_judged}.items()],
        }
