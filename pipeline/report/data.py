"""ReportData: everything the report is made from, computed once by build.report_data.

The figures draw from it (figures.py), the sections say it (sections.py), numbers.tex quotes it
(numbers.numbers_tex), and build_report writes its tables. Only pandas and the run records at
import: the Snakefile imports the figures' registry, which names this type.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pandas as pd

from ..config import schema
from ..runtime.records.commbench import CommbenchRecord
from ..runtime.records.equivalence import EquivalenceRecord
from .load import RunDir
from .tables import Table

if TYPE_CHECKING:  # each of these imports the report's modules that import this one
    from .answer import Answer
    from .causes import CauseTest
    from .clusters import Compute
    from .disturbance import MeasurementCheck
    from .holdout import HeldOut
    from .verdict import Verdict


@dataclass(frozen=True, eq=False)
class ReportData:
    """The runs, their frames and tables, the other stages' records and what was concluded.
    Every field has an empty default, so a test can build the part a figure or section reads.
    The frames are typed as frames, not optional: build() sets every one, and what reads them
    (a figure, a section) runs on its result; a test's partial ReportData leaves the rest None
    (pandas ships no types, so the type checker cannot tell frames apart anyway)."""

    runs: list[RunDir] = field(default_factory=list)  # every run directory, skipped ones too
    summary: pd.DataFrame = None  # summary.csv: one row per run
    preset: str = ""
    dataset: str = "unknown"  # what the runs trained on (load.dataset_of)
    published: dict = field(default_factory=dict)  # report.published: the study's values
    table1: pd.DataFrame = None  # AP, published rows then ours
    scaling: pd.DataFrame = None
    data_modes: pd.DataFrame = None
    compared: pd.DataFrame = None  # noise.comparisons: every pair of entries, every metric
    prediction: pd.DataFrame = None  # the cost model's images/s beside the measured (fitted runs)
    held_out: HeldOut | None = None  # the cost model's predictions of the held-out entries
    cluster_points: pd.DataFrame = None  # predicted scaling on hypothetical clusters
    tables: dict[str, Table] = field(default_factory=dict)  # every table written, by file name
    links: dict[int, CommbenchRecord] = field(default_factory=dict)  # process count -> commbench
    equivalence: EquivalenceRecord | None = None  # the one-step check, where it ran
    predict: schema.Predict | None = None  # report.predict: the clusters to predict
    compute: Compute | None = None  # one GPU's time per image, measured or assumed
    checked: MeasurementCheck | None = None  # noisy machine, disturbed commbench inputs
    answer: Answer | None = None  # what the results say (answer.answer)
    verdict: Verdict | None = None  # the answer in at most five sentences (verdict.verdict)
    # The accuracy ablation (causes.py): its runs under the other norm, out of `runs`, and what
    # they say of the accuracy gap's cause
    ablated: list[RunDir] = field(default_factory=list)
    causes: list[CauseTest] = field(default_factory=list)
    figure_ext: str = "png"  # the figure files the Markdown report links

    @property
    def ok(self) -> list[RunDir]:
        """The completed runs: what the figures draw."""
        return [run for run in self.runs if run.ok]

    @property
    def first_seeds(self) -> list[RunDir]:
        """One run per sweep entry (its first seed): for figures that draw a run's every line."""
        seen, runs = set(), []
        for run in self.ok:
            if run.entry not in seen:
                seen.add(run.entry)
                runs.append(run)
        return runs

    @property
    def entries(self) -> int:
        return len({run.entry for run in self.ok})

    def shown(self, name: str) -> pd.DataFrame:
        """Table `name` as a reader sees it."""
        return self.tables[name].shown
