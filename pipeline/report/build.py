"""build_report: every run directory in, summary.csv and the whole report out, in four steps:
read (the run directories and the other stages' files), compute (report_data: every frame and
table, the checks and the answer, once), write (summary.csv, the tables, numbers.tex, the
figures), render (the registered sections, sections.py, as report.md and report.html)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..config import schema
from ..runtime.files import atomic_path, write_text
from ..runtime.records.commbench import CommbenchRecord
from ..runtime.records.equivalence import EquivalenceRecord
from . import causes, clusters, holdout, prediction
from .answer import answer, inference_seconds
from .data import ReportData
from .disturbance import measurement_check
from .figures import FIGURES, write_figures
from .load import (
    RunDir,
    dataset_of,
    load_run,
    read_input,
    required,
    scaling_frame,
    summary_frame,
    traffic_frame,
)
from .noise import comparisons
from .numbers import numbers_tex
from .render import render_html, render_markdown
from .sections import report_sections
from .tables import (
    AP_DECIMALS,
    AP_TABLE,
    COMPARISON_CAPTION,
    DATA_MODE_DECIMALS,
    SCALING_DECIMALS,
    TIME_DECIMALS,
    TIME_TABLE,
    TIME_TO_ACCURACY_DECIMALS,
    Table,
    comparison_pairs,
    comparison_table,
    data_mode_table,
    tex_escape,
    time_to_accuracy_table,
)
from .verdict import CauseFinding, VerdictInput, verdict

# What the report stage writes into its directory besides the figures (the Snakefile declares
# them): each table as .md, .csv and .tex, and these files. comparisons.csv holds every pair
# and metric with its means, spreads and interval; its .md and .tex, one compact row per pair.
TABLES = (
    "table1",
    "table2",
    "scaling",
    "time_to_accuracy",
    "data_modes",
    "prediction",
    "predicted_scaling",
    "comparisons",
)
# What each table holds: its caption in Snakemake's own report (rules/captions/tables.rst).
TABLE_CAPTIONS = {
    "table1": "COCO box AP, AP50 and AP75: the study's published DP and DDP rows (its Table 1), "
    "then each sweep entry's mean and spread over its seeds",
    "table2": "time per iteration and training progress per epoch: the study's published rows "
    "(its Table 2), then each sweep entry's",
    "scaling": "images/s against the number of workers per strategy, the speed-up over single "
    "and the scaling efficiency",
    "time_to_accuracy": "when each run first reached the target AP, in training seconds",
    "data_modes": "images/s with the real loader and on in-memory tensors, and the loader's share",
    "prediction": "the cost model's images/s for every multi-process run beside the measured",
    "predicted_scaling": "the cost model's predictions past this machine, on the hypothetical "
    "clusters of report.predict: predictions, not measurements",
    "comparisons": "every pair of entries with the same workers and data mode, in images/s and "
    "AP: both means and spreads, the ratio, Welch's 95% interval and the verdict",
}
FILES = ("report.html", "report.md", "traffic.csv", "numbers.tex", "figures.tex", "predicted_scaling_points.csv")
# The metrics every pair of entries is compared on, with the decimals their sentences show,
# and their names in the comparisons table.
COMPARED = {"images_per_second": 2, "AP": 3}
COMPARED_NAMES = {"images_per_second": "images/s", "AP": "AP"}


def figures_tex(figure_ext: str = "pdf") -> str:
    """A figure environment per registered figure, for paper/paper.tex to \\input: the paper
    shows every figure the report draws, with the same caption. Each is drawn at the text's
    width (figures.WIDTH_IN), so it prints at the size its fonts were chosen for."""
    return "".join(
        "\\begin{figure}[tbp]\n  \\centering\n"
        "  \\includegraphics[width=\\linewidth,height=0.8\\textheight,keepaspectratio]"
        f"{{\\reportdir/figures/{name}.{figure_ext}}}\n"
        f"  \\caption{{{tex_escape(entry.caption)}}}\n  \\label{{fig:{name}}}\n"
        "\\end{figure}\n"
        for name, entry in FIGURES.items()
    )


def figure_formats(report_cfg: schema.Report) -> list[str]:
    return list(report_cfg.figure_formats)


def report_data(
    runs: list[RunDir],
    report_cfg: schema.Report,
    preset: str,
    links: dict[int, CommbenchRecord] | None = None,
    equivalence: EquivalenceRecord | None = None,
    compute_runs: list[RunDir] | None = None,
    accuracy_cause: CauseFinding | None = None,
    held_out: tuple[str, ...] = (),
) -> ReportData:
    """Every frame, table, check and conclusion of the report, from the runs read, the
    commbench stage's records (process count -> record), the one-step check, the runs of
    report.predict's compute preset (None: `runs`, the same preset), the accuracy gap's
    tested cause (None: the accuracy ablation's, where the sweep ran it; else the verdict words
    its causes as hypotheses) and the sweep's held-out entries (the cost model is fitted
    without them, then predicts them: holdout.py)."""
    links = links or {}
    every_run = runs
    runs, ablated = causes.split_by_norm(runs)  # the ablation's runs: their own section only
    summary = summary_frame(runs, preset, report_cfg.target_ap.get(preset))
    published = report_cfg.published.model_dump()  # the study's values: rows of tables 1 and 2
    n_published = sum(isinstance(v, dict) for v in published.values())
    dataset = dataset_of(runs)
    table1 = comparison_table(summary, published, AP_TABLE, preset, dataset)
    scaling, data_modes = scaling_frame(summary), data_mode_table(summary)
    every_prediction = prediction.prediction_frame(runs, links, held_out)
    predicted = holdout.fitted(every_prediction, held_out)
    checked = measurement_check(runs, links)
    out_of_sample = holdout.HeldOut.of(every_prediction, runs, held_out, checked.noise)
    predict = report_cfg.predict
    fitted_runs = [run for run in runs if run.entry not in held_out]
    compute = clusters.gpu_compute(predict, fitted_runs if compute_runs is None else compute_runs)
    points = clusters.prediction_points(predict, compute)
    compact = clusters.compact_table(points)
    compared = comparisons(summary, COMPARED)
    pairs, beyond = comparison_pairs(compared, COMPARED_NAMES)
    tables = {  # TABLES, by file name
        "table1": Table(table1, AP_DECIMALS, n_published),
        "table2": Table(comparison_table(summary, published, TIME_TABLE, preset, dataset), TIME_DECIMALS, n_published),
        "scaling": Table(scaling, SCALING_DECIMALS),
        "time_to_accuracy": Table(time_to_accuracy_table(summary), TIME_TO_ACCURACY_DECIMALS),
        "data_modes": Table(data_modes, DATA_MODE_DECIMALS),
        # the run id says the entry and the strategy, the compute input the terms in words; the
        # CSV holds each as a column, and the held-out runs too, marked
        "prediction": Table(
            predicted,
            prediction.DECIMALS,
            hide=("entry", "strategy", "compute_fixed_s", "compute_per_image_s", "compute_overhead_s"),
            csv=holdout.marked(every_prediction, held_out).round(prediction.DECIMALS),
        ),
        "predicted_scaling": Table(
            compact,
            {
                c: 1 if c.endswith("(predicted images/s)") else 0
                for c in compact.columns
                if c.endswith(("(predicted images/s)", "(predicted MiB per GPU)"))
            },
        ),
        "comparisons": Table(
            pairs,
            {f"{name} a/b": 3 for name in COMPARED_NAMES.values()},
            csv=compared,
            tex={"long": (COMPARISON_CAPTION, "tab:comparisons"), "rules_before": {beyond}},
        ),
    }
    formats = figure_formats(report_cfg)
    tested = causes.cause_tests(every_run)  # the accuracy ablation, where the sweep ran it
    return ReportData(
        runs=runs,
        summary=summary,
        preset=preset,
        dataset=dataset,
        published=published,
        table1=table1,
        scaling=scaling,
        data_modes=data_modes,
        compared=compared,
        prediction=predicted,
        held_out=out_of_sample,
        cluster_points=points,
        tables=tables,
        links=links,
        equivalence=equivalence,
        predict=predict,
        compute=compute,
        # Each entry's seeds and their outliers, the one-process strategies' overheads,
        # commbench inputs outside their bands (pipeline/report/disturbance.py)
        checked=checked,
        # The verdict (verdict.verdict): the report's first lines and the abstract's
        verdict=verdict(VerdictInput(summary, compared, checked, accuracy_cause or causes.finding(tested))),
        # The answer (answer.answer): the paper's and the report's first words
        answer=answer(
            summary, compared, predicted, equivalence, dataset, inference_seconds(runs), out_of_sample.sentence()
        ),
        ablated=ablated,
        causes=tested,
        figure_ext="png" if "png" in formats else formats[0],
    )


def build_report(
    run_dirs,
    report_cfg: schema.Report,
    preset: str,
    summary_path,
    out_dir,
    equivalence=None,
    commbench=(),
    compute_runs=(),
    held_out=(),
) -> pd.DataFrame:
    """Read every run directory (and the commbench stage's files, the one-step check's, and
    the run directories of report.predict's compute preset when that is another preset), write
    summary.csv and the whole report; return the summary. `held_out`: the sweep's held-out
    entry ids."""
    out_dir = Path(out_dir)
    runs = [load_run(d) for d in run_dirs]
    links = {found.processes: found for found in map(CommbenchRecord.read, commbench)}
    steps = EquivalenceRecord.from_json(read_input(Path(equivalence)), str(equivalence)) if equivalence else None
    same_preset = report_cfg.predict.compute.preset == preset
    data = report_data(
        runs,
        report_cfg,
        preset,
        links,
        steps,
        None if same_preset else [load_run(d) for d in compute_runs],
        held_out=tuple(held_out),
    )

    with atomic_path(summary_path) as tmp:
        data.summary.to_csv(tmp, index=False)
    with atomic_path(out_dir / "traffic.csv") as tmp:
        traffic_frame(runs).to_csv(tmp, index=False)
    for name, table in data.tables.items():
        table.write(out_dir, name)
    with atomic_path(out_dir / "predicted_scaling_points.csv") as tmp:
        data.cluster_points.to_csv(tmp, index=False)
    write_text(out_dir / "numbers.tex", numbers_tex(data) + required(data.checked, "ReportData.checked").tex_macro())
    formats = figure_formats(report_cfg)
    write_text(out_dir / "figures.tex", figures_tex("pdf" if "pdf" in formats else formats[0]))
    pngs = write_figures(data, out_dir, formats, report_cfg.dpi)

    sections = report_sections(data)
    write_text(out_dir / "report.md", render_markdown(sections))
    write_text(out_dir / "report.html", render_html(sections, pngs))
    return data.summary
