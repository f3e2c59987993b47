"""build_report: every run directory in, summary.csv and the whole report out."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..runtime.files import atomic_path, write_text
from ..runtime.record import CommbenchRecord, EquivalenceRecord
from . import clusters
from . import prediction as cost_model
from .disturbance import measurement_check
from .figures import FIGURES, ReportData, write_figures
from .findings import answer, inference_seconds, numbers_tex
from .load import read_input, dataset_of, load_run, scaling_frame, summary_frame, traffic_frame
from .noise import comparisons
from .render import (
    TORCHVISION_BOX_AP,
    equivalence_section,
    render_html,
    render_markdown,
    report_sections,
)
from .tables import (
    AP_DECIMALS,
    AP_TABLE,
    COMPARISON_CAPTION,
    DATA_MODE_DECIMALS,
    SCALING_DECIMALS,
    TIME_DECIMALS,
    TIME_TABLE,
    TIME_TO_ACCURACY_DECIMALS,
    tex_escape,
    comparison_pairs,
    comparison_table,
    data_mode_table,
    time_to_accuracy_table,
    write_table,
)

# What the report stage writes into its directory besides the figures (the Snakefile declares
# them): each table as .md, .csv and .tex, and these files. comparisons.csv holds every pair
# and metric with its means, spreads and interval; its .md and .tex, one compact row per pair.
TABLES = ("table1", "table2", "scaling", "time_to_accuracy", "data_modes", "prediction",
          "predicted_scaling", "comparisons")
FILES = ("report.html", "report.md", "traffic.csv", "numbers.tex", "figures.tex",
         "predicted_scaling_points.csv")
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
        "\\end{figure}\n" for name, entry in FIGURES.items())


def build_report(run_dirs, report_cfg: dict, preset: str, summary_path, out_dir,
                 equivalence=None, commbench=(), compute_runs=()) -> pd.DataFrame:
    """Read every run directory (and the commbench stage's files, and the run directories of
    report.predict's compute preset when that is another preset), write summary.csv and the
    whole report; return the summary."""
    out_dir = Path(out_dir)
    runs = [load_run(d) for d in run_dirs]
    summary = summary_frame(runs, preset, (report_cfg.get("target_ap") or {}).get(preset))
    with atomic_path(summary_path) as tmp:
        summary.to_csv(tmp, index=False)
    with atomic_path(out_dir / "traffic.csv") as tmp:
        traffic_frame(runs).to_csv(tmp, index=False)
    published = report_cfg.get("published") or {}
    n_published = sum(isinstance(v, dict) for v in published.values())
    dataset = dataset_of(runs)
    table1 = comparison_table(summary, published, AP_TABLE, preset, dataset)
    table2 = comparison_table(summary, published, TIME_TABLE, preset, dataset)
    shown = {"table1": write_table(table1, AP_DECIMALS, n_published, out_dir, "table1"),
             "table2": write_table(table2, TIME_DECIMALS, n_published, out_dir, "table2")}
    scaling = scaling_frame(summary)
    shown["scaling"] = write_table(scaling, SCALING_DECIMALS, 0, out_dir, "scaling")
    shown["time_to_accuracy"] = write_table(time_to_accuracy_table(summary),
                                            TIME_TO_ACCURACY_DECIMALS, 0, out_dir,
                                            "time_to_accuracy")
    data_modes = data_mode_table(summary)
    shown["data_modes"] = write_table(data_modes, DATA_MODE_DECIMALS, 0, out_dir, "data_modes")
    links = {found.processes: found for found in map(CommbenchRecord.read, commbench)}
    predicted = cost_model.prediction_frame(runs, links)
    shown["prediction"] = write_table(predicted, cost_model.DECIMALS, 0, out_dir, "prediction",
                                      hide=("entry",))  # the run id says it
    predict = report_cfg["predict"]
    compute = clusters.gpu_compute(predict, runs if predict["compute"]["preset"] == preset
                                     else [load_run(d) for d in compute_runs])
    points = clusters.prediction_points(predict, compute)
    with atomic_path(out_dir / "predicted_scaling_points.csv") as tmp:
        points.to_csv(tmp, index=False)
    compact = clusters.compact_table(points)
    shown["predicted_scaling"] = write_table(
        compact, {c: 1 if c.endswith("(predicted images/s)") else 0 for c in compact.columns
                  if c.endswith(("(predicted images/s)", "(predicted MiB per GPU)"))}, 0, out_dir,
        "predicted_scaling")
    compared = comparisons(summary, COMPARED)
    pairs, beyond = comparison_pairs(compared, COMPARED_NAMES)
    shown["comparisons"] = write_table(
        pairs, {f"{name} a/b": 3 for name in COMPARED_NAMES.values()}, 0, out_dir, "comparisons",
        csv=compared, long=(COMPARISON_CAPTION, "tab:comparisons"), rules_before={beyond})
    # Runs identical by construction that disagree, commbench inputs outside their bands: a
    # section of the report (its first when it warns) and the paper's \MachineNoise
    # (pipeline/report/disturbance.py)
    checked = measurement_check(runs, links)
    # The answer (findings.answer): the paper's and the report's first words
    checked_steps = EquivalenceRecord.from_json(read_input(Path(equivalence)), equivalence) if equivalence else None
    found = answer(summary, compared, predicted, checked_steps, dataset, inference_seconds(runs))
    write_text(out_dir / "numbers.tex",
               numbers_tex(runs, summary, compared, scaling, data_modes, preset, dataset,
                           published, TORCHVISION_BOX_AP, found) + checked.tex_macro())
    formats = list(report_cfg.get("figure_formats") or ["png"])
    write_text(out_dir / "figures.tex", figures_tex("pdf" if "pdf" in formats else formats[0]))
    ok = [run for run in runs if run.ok]
    pngs = write_figures(ReportData(ok, table1, scaling, summary, data_modes, predicted, points), out_dir, formats,
                         int(report_cfg.get("dpi", 150)))
    figure_ext = "png" if "png" in formats else formats[0]
    sections = report_sections(runs, summary, shown, published, preset, figure_ext, compared,
                               scaling, data_modes)
    results_end = [s["title"] for s in sections].index("Definitions")
    sections.insert(results_end, cost_model.section(shown["prediction"], predicted, links))
    sections.insert(results_end + 1, clusters.section(shown["predicted_scaling"], points, predict, compute))
    if equivalence:
        sections.insert(results_end + 2, equivalence_section(checked_steps))  # after the results
    # The answer opens the report, the measurement check right after it; a noisy machine or a
    # disturbed commbench is said in the answer's first line too.
    opening = found.section()
    if checked.warns:
        opening["text"] = [checked.lines()[0]] + list(opening["text"])
    sections[:0] = [opening, checked.section()]
    write_text(out_dir / "report.md", render_markdown(sections))
    write_text(out_dir / "report.html", render_html(sections, pngs))
    return summary
