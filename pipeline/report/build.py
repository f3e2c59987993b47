"""build_report: every run directory in, summary.csv and the whole report out."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..files import atomic_path, write_text
from .figures import ReportData, write_figures
from .load import dataset_of, load_run, scaling_frame, summary_frame, traffic_frame
from .render import equivalence_section, render_html, render_markdown, report_sections
from .tables import (AP_DECIMALS, AP_TABLE, SCALING_DECIMALS, TIME_DECIMALS, TIME_TABLE,
                     comparison_table, write_table)


def build_report(run_dirs, report_cfg: dict, preset: str, summary_path, out_dir,
                 equivalence=None) -> pd.DataFrame:
    """Read every run directory, write summary.csv and the whole report; return the summary."""
    out_dir = Path(out_dir)
    runs = [load_run(d) for d in run_dirs]
    summary = summary_frame(runs, preset)
    with atomic_path(summary_path) as tmp:
        summary.to_csv(tmp, index=False)
    with atomic_path(out_dir / "traffic.csv") as tmp:
        traffic_frame(runs).to_csv(tmp, index=False)
    published = report_cfg.get("published") or {}
    n_published = sum(isinstance(v, dict) for v in published.values())
    dataset = dataset_of(runs)
    table1 = comparison_table(summary, published, AP_TABLE, preset, dataset)
    table2 = comparison_table(summary, published, TIME_TABLE, preset, dataset)
    shown1 = write_table(table1, AP_DECIMALS, n_published, out_dir, "table1")
    shown2 = write_table(table2, TIME_DECIMALS, n_published, out_dir, "table2")
    formats = list(report_cfg.get("figure_formats") or ["png"])
    ok = [run for run in runs if run["status"] == "ok"]
    scaling = scaling_frame(summary)
    shown_scaling = write_table(scaling, SCALING_DECIMALS, 0, out_dir, "scaling")
    pngs = write_figures(ReportData(ok, table1, scaling), out_dir, formats,
                         int(report_cfg.get("dpi", 150)))
    figure_ext = "png" if "png" in formats else formats[0]
    sections = report_sections(runs, summary, shown1, shown2, published, preset, figure_ext,
                               shown_scaling)
    if equivalence:
        results_end = [s["title"] for s in sections].index("Definitions")
        sections.insert(results_end, equivalence_section(equivalence))  # after the results
    write_text(out_dir / "report.md", render_markdown(sections))
    write_text(out_dir / "report.html", render_html(sections, pngs))
    return summary
