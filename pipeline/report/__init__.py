"""The report stage: one table of every run, the two tables of the published study, figures, reports.

Data flow, one module per step:
    load.py     RUN_DIR/{train_summary.json, metrics.json, iterations.jsonl} -> runs, summary frame
    tables.py   summary -> table1 (AP) and table2 (time, progress): published rows, then ours
    figures.py  runs and table1 -> figures, one registered function each (FIGURES)
    render.py   all of it -> report sections -> report.md and report.html
    disturbance.py  runs identical by construction that disagree (a noisy machine) and commbench
                inputs outside their bands -> the report's measurement check (its first section
                when it warns), \\MachineNoise in numbers.tex, the cost model's verdict
    noise.py    repeats: each entry's mean and spread, and whether two entries differ
    prediction.py  every run's iteration predicted by the cost model, beside what it measured
    clusters.py predicted scaling on the hypothetical clusters of report.predict
    findings.py what the results say in sentences, and numbers.tex for the paper
    build.py    build_report: the steps above in order; __main__.py is its command line
    paper.py    the paper stage: paper/paper.tex compiled with latexmk into one PDF

Writes:
  SUMMARY (results/summary/<preset>.csv) one row per training run, skipped and failed runs included
  OUT_DIR/traffic.csv            bytes per iteration of each rank of each completed run
  OUT_DIR/table1.{md,csv,tex}    AP at IoU .5:.95, .5 and .75: published DP and DDP beside our runs
  OUT_DIR/table2.{md,csv,tex}    time per iteration and training progress per epoch, same layout
  OUT_DIR/figures/<each name in figures.FIGURES>.<each of report.figure_formats>
  OUT_DIR/report.md              what was run, the tables, definitions, figures, provenance
  OUT_DIR/report.html            the same, self-contained (figures embedded as base64 PNG)
The .tex tables are booktabs tabular fragments for paper/paper.tex to \\input.
Every file is written atomically (pipeline/runtime/files.py), so a crash never leaves half a report.

No module imports matplotlib or seaborn until a figure is drawn, so importing pipeline.report.load
(benchmarks) or pipeline.report.figures (the Snakefile) stays light.
"""
from __future__ import annotations

from .build import build_report
from .load import SUMMARY_COLUMNS, progress_per_epoch

__all__ = ["SUMMARY_COLUMNS", "build_report", "progress_per_epoch"]
