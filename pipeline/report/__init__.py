"""The report stage: one table of every run, the two tables of the published study, figures, reports.

Data flow, one module per step:
    load.py     RUN_DIR/{train_summary.json, metrics.json, iterations.jsonl} -> RunDir (the
                records of pipeline/runtime/records/), the summary frame
    tables.py   summary -> table1 (AP) and table2 (time, progress): published rows, then ours;
                every table's Table (frame, decimals) written as .csv, .md and .tex
    noise.py    entries compared pair by pair: beyond the noise or within it
    prediction.py, clusters.py  the cost model against the measured runs, and past this machine
    holdout.py  the cost model out of sample: the sweep's held-out entries, fitted without and
                then predicted, apart from the fitted runs; its goal, met or missed, in the answer
    disturbance.py  noise like with like: each entry's seeds (a noisy machine, outlier runs
                named), the one-process strategies' overheads over single, commbench inputs
                outside their bands -> the report's measurement check, \\MachineNoise in
                numbers.tex, the cost model's verdict
    ranking.py  the entries of one worker count and data mode ranked by images/s or AP, each
                pair by the noise rule, in sentences: in full and in one
    ranking_why.py  why a throughput ranking is what it is: the time split, the communication
                share, bytes, memory per worker, the cost model's reading
    baseline_gap.py  the baseline's AP against the multi-worker entries at its global batch, and
                why they differ (the one-step equivalence check)
    answer.py   the answer in full, from the above: the counts, the rankings and their why, the
                gaps, the runs that did not complete, the time it took -> Answer
    findings.py every other generated sentence: each table's findings and the definitions
    wording.py  how those sentences say a number, a ratio, a size, a duration, a list
    verdict.py  the answer in at most five sentences, in a reader's words: the report's first
                lines (its figure under them) and the paper's abstract's
    causes.py   the accuracy ablation: single against ddp-w2 with and without batch statistics,
                its runs kept out of the other tables, its finding a typed CauseTest
    data.py     ReportData: all of the above, computed once (build.report_data)
    figures.py  ReportData -> figures, one registered function each (FIGURES)
    numbers.py  ReportData -> numbers.tex: every number the paper quotes, as LaTeX macros
    sections.py ReportData -> the report's sections, one registered function each (SECTIONS)
    render.py   sections -> report.md and report.html
    build.py    build_report: read, compute, write, render; __main__.py is its command line
    paper.py    the paper compiled from the report's files

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
