"""The report stage: one table of every run, the two tables of the published study, figures, reports.

    python -m pipeline.report --report-config '<report section JSON>' --preset NAME \\
        --summary results/summary.csv --out-dir results/report RUN_DIR [RUN_DIR ...]

Reads, in each RUN_DIR: train_summary.json, metrics.json and (for completed runs) iterations.jsonl.
Writes:
  SUMMARY (results/summary.csv)  one row per training run, skipped and failed runs included
  OUT_DIR/table1.{md,csv,tex}    AP at IoU .5:.95, .5 and .75: published DP and DDP beside our runs
  OUT_DIR/table2.{md,csv,tex}    time per iteration and training progress per epoch, same layout
  OUT_DIR/figures/{loss_vs_time,loss_vs_epoch,ap,time_split}.<each of report.figure_formats>
  OUT_DIR/report.md              what was run, the tables, definitions, figures, provenance
  OUT_DIR/report.html            the same, self-contained (figures embedded as base64 PNG)
The .tex tables are booktabs tabular fragments for paper/paper.tex to \\input.
Every file is written atomically (pipeline/files.py), so a crash never leaves half a report.
"""
from __future__ import annotations

import argparse
import base64
import html
import io
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on cluster nodes or in CI
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from .files import atomic_path, read_json, write_text  # noqa: E402

SUMMARY_COLUMNS = [
    "run_id", "preset", "strategy", "variant", "world_size", "processes", "images_per_worker",
    "global_batch", "lr", "device", "backend", "threads", "status", "reason", "images_per_second",
    "speedup_vs_single", "sec_per_iter_mean", "sec_per_iter_p50", "sec_per_iter_p95",
    "time_data", "time_compute", "time_communication", "time_optimizer", "communication_share",
    "busiest_rank_bytes_per_iter", "busiest_rank_theory_bytes_per_iter", "replicas_identical",
    "progress_per_epoch", "AP", "AP50", "AP75", "APs", "APm", "APl", "train_seconds"]
INTEGER_COLUMNS = ["world_size", "processes", "images_per_worker", "global_batch", "threads"]
TRAFFIC_COLUMNS = ["run_id", "rank", "role", "sent_per_iter", "received_per_iter",
                   "theory_sent_per_iter", "theory_received_per_iter", "gradient_bytes"]
AP_COLUMNS = ["AP", "AP50", "AP75"]
TIME_SPLIT = ["data", "compute", "communication", "optimizer"]
STRATEGY_NAMES = {"single": "single process", "dp": "DataParallel", "ddp": "DDP",
                  "ps": "parameter server"}
PUBLISHED_NAMES = {"dp": "DataParallel (DP)", "ddp": "DistributedDataParallel (DDP)"}
TEX_HEADERS = {"AP50": "AP$_{50}$", "AP75": "AP$_{75}$"}
FIGURES = {"loss_vs_time": "Training loss (rolling mean) versus elapsed training seconds",
           "loss_vs_epoch": "Epoch-mean training loss per epoch",
           "ap": "COCO box AP, AP50 and AP75 per run, with the published DP and DDP values",
           "time_split": "Mean seconds per iteration split into data, compute, communication "
                         "and optimizer"}
PROGRESS_DEFINITION = (
    "training progress per epoch = mean decrease of the epoch-mean total training loss per epoch, "
    "(L_1 - L_E) / (E - 1) for E epochs with epoch-mean losses L_1..L_E; undefined (n/a) for a "
    "single epoch. The published study did not define its measure, so its values are quoted, "
    "not recomputed.")


def progress_per_epoch(epoch_loss: list[float]) -> float:
    """Training progress per epoch: the mean per-epoch decrease of the epoch-mean total loss.

    (epoch_loss[0] - epoch_loss[-1]) / (n_epochs - 1); NaN with fewer than two epochs, where no
    decrease can be measured. Positive means the loss went down.
    """
    if len(epoch_loss) < 2:
        return math.nan
    return (epoch_loss[0] - epoch_loss[-1]) / (len(epoch_loss) - 1)


def _read_input(path: Path) -> dict:
    """read_json, plus the remedy for a missing file and a check that it holds an object."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found; run the train and evaluate stages for "
                                "this run first (snakemake --cores all)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}; "
                         "delete it and rerun the stage that writes it")
    return data


def read_iterations(path: Path) -> pd.DataFrame:
    """iterations.jsonl as a frame, naming the file and line of any broken record."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found; the run says it finished, so delete "
                                "its run directory and rerun its training")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number} is not valid JSON ({err.msg}); delete "
                                 "the run directory and rerun its training") from err
    if not records:
        raise ValueError(f"{path}: no iteration records in a finished run; delete the run "
                         "directory and rerun its training")
    return pd.DataFrame.from_records(records)


def load_run(run_dir: str | Path) -> dict:
    """The three inputs of one run directory: train summary, metrics and (if ok) the iterations."""
    run_dir = Path(run_dir)
    summary = _read_input(run_dir / "train_summary.json")
    metrics = _read_input(run_dir / "metrics.json")
    status, reason = summary.get("status", "failed"), summary.get("reason", "")
    if status == "ok" and metrics.get("status", "ok") != "ok":  # evaluation failed after training
        status, reason = metrics["status"], metrics.get("reason", "")
    if status == "ok" and any(metrics.get(k) is None for k in AP_COLUMNS):
        raise ValueError(f"{run_dir / 'metrics.json'}: no AP values for a completed run; delete "
                         "it and rerun the evaluate stage")
    iterations = read_iterations(run_dir / "iterations.jsonl") if status == "ok" else None
    return {"dir": run_dir, "run_id": summary.get("run_id", run_dir.name), "status": status,
            "reason": reason or "", "summary": summary, "metrics": metrics,
            "iterations": iterations}


def _number(value) -> float:
    """NaN for missing values and for COCO's -1 ('no objects of that size'), so means stay honest."""
    return math.nan if value is None or value == -1 else float(value)


def busiest_rank_bytes(summary: dict, key: str) -> float:
    """Bytes sent plus received per iteration by the rank that moves the most (the server, for
    a parameter server; any rank, for all-reduce)."""
    totals = [r[key]["sent"] + r[key]["received"] for r in summary.get("ranks") or []]
    return max(totals) if totals else math.nan


def traffic_frame(runs: list[dict]) -> pd.DataFrame:
    rows = [{"run_id": run["run_id"], "rank": r["rank"], "role": r["role"],
             "sent_per_iter": r["bytes_per_iteration"]["sent"],
             "received_per_iter": r["bytes_per_iteration"]["received"],
             "theory_sent_per_iter": r["theory_bytes_per_iteration"]["sent"],
             "theory_received_per_iter": r["theory_bytes_per_iteration"]["received"],
             "gradient_bytes": r["gradient_bytes"]}
            for run in runs if run["status"] == "ok" for r in run["summary"].get("ranks") or []]
    return pd.DataFrame(rows, columns=TRAFFIC_COLUMNS)


def summary_frame(runs: list[dict], preset: str) -> pd.DataFrame:
    rows = []
    # Speed-up is against `single` at the same global batch: the same work per iteration.
    single = {r["summary"].get("global_batch"): _number(r["summary"].get("images_per_second"))
              for r in runs if r["status"] == "ok" and r["summary"].get("strategy") == "single"}
    for run in runs:
        s, m = run["summary"], run["metrics"]
        times = s.get("sec_per_iter") or {}
        split = s.get("time_split") or {}
        rows.append({
            "run_id": run["run_id"], "preset": preset,
            **{k: s.get(k) for k in ("strategy", "variant", "world_size", "processes",
                                     "images_per_worker", "global_batch", "lr", "device",
                                     "backend", "threads")},
            "status": run["status"], "reason": run["reason"],
            "images_per_second": _number(s.get("images_per_second")),
            "speedup_vs_single": _number(s.get("images_per_second")) / single.get(s.get("global_batch"), math.nan),
            **{f"sec_per_iter_{k}": _number(times.get(k)) for k in ("mean", "p50", "p95")},
            **{f"time_{k}": _number(split.get(k)) for k in TIME_SPLIT},
            "communication_share": _number(s.get("communication_share")),
            "busiest_rank_bytes_per_iter": busiest_rank_bytes(s, "bytes_per_iteration"),
            "busiest_rank_theory_bytes_per_iter": busiest_rank_bytes(s, "theory_bytes_per_iteration"),
            "replicas_identical": s.get("replicas_identical"),
            "progress_per_epoch": progress_per_epoch(s.get("epoch_loss") or []),
            **{k: _number(m.get(k)) for k in AP_COLUMNS + ["APs", "APm", "APl"]},
            "train_seconds": _number(s.get("train_seconds"))})
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    # Integer counts stay integers (2, not 2.0) even when a skipped run leaves them empty
    for col in INTEGER_COLUMNS:
        frame[col] = pd.to_numeric(frame[col]).astype("Int64")
    return frame


def _method(row) -> str:
    strategy = STRATEGY_NAMES.get(row["strategy"], str(row["strategy"]))
    workers = "?" if pd.isna(row["world_size"]) else int(row["world_size"])
    return f"{row['run_id']}: {strategy}, {workers} worker{'' if workers == 1 else 's'}"


def comparison_table(summary: pd.DataFrame, published: dict,
                     columns: dict[str, tuple[str, str]], preset: str) -> pd.DataFrame:
    """Rows are methods: the published ones first, then one per completed run (the study's layout).

    `columns` maps a table column to its key in the published values and its summary.csv column.
    """
    label = published.get("label", "published (2 GPUs, COCO 2017)")
    # The study's order (DP, then DDP): the config reaches us as key-sorted JSON.
    methods = [key for key in PUBLISHED_NAMES if isinstance(published.get(key), dict)]
    rows = [{"Method": PUBLISHED_NAMES[key], "Source": label,
             **{col: _number(published[key].get(key_pub)) for col, (key_pub, _) in columns.items()}}
            for key in methods]
    for _, row in summary[summary["status"] == "ok"].iterrows():
        rows.append({"Method": _method(row), "Source": f"reproduced ({preset})",
                     **{col: row[key_csv] for col, (_, key_csv) in columns.items()}})
    return pd.DataFrame(rows, columns=["Method", "Source", *columns])


def _formatted(table: pd.DataFrame, decimals: dict[str, int]) -> pd.DataFrame:
    shown = table.astype(object)
    for col, places in decimals.items():
        shown[col] = [("n/a" if pd.isna(v) else f"{v:.{places}f}") for v in table[col]]
    return shown


def markdown_table(shown: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(shown.columns) + " |", "|" + "---|" * len(shown.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |"
              for row in shown.itertuples(index=False)]
    return "\n".join(lines) + "\n"


def _tex_escape(text: str) -> str:
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%"), ("_", r"\_"),
                          ("#", r"\#"), ("$", r"\$"), ("{", r"\{"), ("}", r"\}")):
        text = text.replace(char, escaped)
    return text


def latex_table(shown: pd.DataFrame, n_published: int) -> str:
    """A booktabs tabular fragment; a rule separates the published rows from ours."""
    header = [TEX_HEADERS.get(c, _tex_escape(c)) for c in shown.columns]
    lines = [r"\begin{tabular}{ll" + "r" * (len(shown.columns) - 2) + "}", r"\toprule",
             " & ".join(header) + r" \\", r"\midrule"]
    for i, row in enumerate(shown.itertuples(index=False)):
        if i == n_published and i > 0:
            lines.append(r"\midrule")
        lines.append(" & ".join(_tex_escape(str(v)) for v in row) + r" \\")
    return "\n".join(lines + [r"\bottomrule", r"\end{tabular}"]) + "\n"


def write_table(table: pd.DataFrame, decimals: dict[str, int], n_published: int, out_dir: Path,
                name: str) -> pd.DataFrame:
    shown = _formatted(table, decimals)
    with atomic_path(out_dir / f"{name}.csv") as tmp:
        table.round(decimals).to_csv(tmp, index=False)
    write_text(out_dir / f"{name}.md", markdown_table(shown))
    write_text(out_dir / f"{name}.tex", latex_table(shown, n_published))
    return shown


def _no_runs(ax) -> None:
    ax.text(0.5, 0.5, "no completed runs", ha="center", va="center", fontsize=14,
            transform=ax.transAxes)
    ax.set_axis_off()


def figure_loss_vs_time(ax, ok: list[dict]) -> None:
    frames = []
    for run in ok:
        it = run["iterations"].sort_values("elapsed")
        # Per-iteration loss is noisy; smooth over ~2% of the run (at least 5 iterations), then
        # keep at most ~2000 points so a 26-epoch COCO run still gives a light PDF.
        window = max(5, len(it) // 50)
        it = it.assign(smoothed=it["loss"].rolling(window, min_periods=1).mean(), run=run["run_id"])
        frames.append(it.iloc[::max(1, len(it) // 2000)])
    sns.lineplot(pd.concat(frames), x="elapsed", y="smoothed", hue="run", estimator=None, ax=ax)
    ax.set(xlabel="elapsed training time (s)", ylabel="total loss (rolling mean)")


def figure_loss_vs_epoch(ax, ok: list[dict]) -> None:
    rows = [{"run": run["run_id"], "epoch": i + 1, "loss": loss} for run in ok
            for i, loss in enumerate(run["summary"].get("epoch_loss") or [])]
    sns.lineplot(pd.DataFrame(rows), x="epoch", y="loss", hue="run", marker="o", ax=ax)
    ax.set(xlabel="epoch", ylabel="epoch-mean total loss")
    ax.xaxis.get_major_locator().set_params(integer=True)


def figure_ap(ax, table1: pd.DataFrame) -> None:
    long = table1.melt(id_vars=["Method", "Source"], value_vars=AP_COLUMNS,
                       var_name="metric", value_name="value")
    # short bar labels: "DP (published)" for the study, the run id for ours
    long["method"] = [f"{m.split('(')[-1].rstrip(')')} (published)" if src.startswith("published")
                      else m.split(":")[0] for m, src in zip(long["Method"], long["Source"])]
    sns.barplot(long, y="method", x="value", hue="metric", orient="h", ax=ax)
    ax.set(xlabel="COCO box AP", ylabel="")


def figure_time_split(ax, ok: list[dict]) -> None:
    split = pd.DataFrame([{k: (run["summary"].get("time_split") or {}).get(k, math.nan)
                           for k in TIME_SPLIT} for run in ok],
                         index=[run["run_id"] for run in ok])
    split.plot(kind="barh", stacked=True, ax=ax, color=sns.color_palette(n_colors=len(TIME_SPLIT)))
    ax.set(xlabel="mean seconds per iteration", ylabel="")
    ax.invert_yaxis()  # first run on top, as in the tables
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1))


def write_figures(ok: list[dict], table1: pd.DataFrame, out_dir: Path, formats: list[str],
                  dpi: int) -> dict[str, bytes]:
    """Draw each figure, save it in every format, and return its PNG bytes for the HTML report."""
    sns.set_theme(style="whitegrid", context="paper")
    drawers = {"loss_vs_time": lambda ax: figure_loss_vs_time(ax, ok),
               "loss_vs_epoch": lambda ax: figure_loss_vs_epoch(ax, ok),
               "ap": lambda ax: figure_ap(ax, table1),
               "time_split": lambda ax: figure_time_split(ax, ok)}
    pngs = {}
    for name, draw in drawers.items():
        fig, ax = plt.subplots(figsize=(6.4, 3.6 + 0.25 * len(ok) * (name in ("ap", "time_split"))))
        try:
            _no_runs(ax) if not ok else draw(ax)
            ax.set_title(FIGURES[name], fontsize=9)
            for fmt in formats:
                with atomic_path(out_dir / "figures" / f"{name}.{fmt}") as tmp:
                    fig.savefig(tmp, format=fmt, dpi=dpi, bbox_inches="tight")
            buffer = io.BytesIO()
            fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
            pngs[name] = buffer.getvalue()
        finally:
            plt.close(fig)
    return pngs


def provenance_bullets(runs: list[dict]) -> list[str]:
    bullets = []
    for run in runs:
        p = run["summary"].get("provenance") or {}
        if not p:
            bullets.append(f"{run['run_id']}: no provenance ({run['status']}: {run['reason']})")
            continue
        hw = {k: v for k, v in (p.get("hardware") or {}).items() if k != "hostname"}
        packages = ", ".join(f"{k} {v}" for k, v in (p.get("packages") or {}).items())
        bullets.append(
            f"{run['run_id']}: git {p.get('git_revision', 'unknown')}; seed {p.get('seed')}; "
            f"threads {p.get('threads')}; world size {p.get('world_size')}; device "
            f"{p.get('device')}; backend {p.get('backend')}; packages: {packages}; hardware: "
            + ", ".join(f"{k} {v}" for k, v in hw.items()))
    return bullets


def report_sections(runs, summary, shown1, shown2, published, preset, figure_ext) -> list[dict]:
    """The report's content once; render_markdown and render_html only lay it out."""
    run_cols = ["run_id", "strategy", "variant", "world_size", "processes", "images_per_worker",
                "global_batch", "device", "backend", "threads", "status", "reason"]
    speed_cols = ["run_id", "images_per_second", "speedup_vs_single", "sec_per_iter_p50",
                  "sec_per_iter_p95", "communication_share", "busiest_rank_bytes_per_iter",
                  "busiest_rank_theory_bytes_per_iter", "replicas_identical"]
    completed = summary[summary["status"] == "ok"]
    ok = int((summary["status"] == "ok").sum())
    # Each run records how many warm-up iterations its timing statistics leave out.
    warmup = sorted({str(run["summary"]["timing_excludes_first_iterations"]) for run in runs
                     if "timing_excludes_first_iterations" in run["summary"]}) or ["an unrecorded number of"]
    return [
        {"title": "What was run", "text": [
            f"Preset {preset}: {len(runs)} training runs, {ok} completed. Skipped and failed "
            "runs are listed with their reason and left out of the tables and figures."],
         "table": summary[run_cols].astype(object).fillna("").astype(str)},
        {"title": "Table 1: COCO box AP", "text": [
            "AP at IoU .5:.95, .5 and .75 on the validation split. Published values: "
            f"{published.get('source', 'the DP-vs-DDP study')}."], "table": shown1},
        {"title": "Table 2: time per iteration and training progress per epoch",
         "text": ["Same layout as Table 1."], "table": shown2},
        {"title": "Throughput and communication", "text": [
            "Speed-up is images/s over `single` at the same global batch. Bytes are per "
            "iteration for the rank that moves the most (sent + received), as counted by the "
            "strategy (DDP: a counting communication hook on the all-reduce buckets; parameter "
            "server: its point-to-point messages) beside the theory: 2(N-1)/N M per rank for "
            "ring all-reduce, 2(N-1)M through a co-located server and 2NM through a dedicated "
            "one, for M bytes of gradients. Per-rank detail: traffic.csv."],
         "table": completed[speed_cols].astype(object).map(
             lambda v: f"{v:.4g}" if isinstance(v, float) else str(v))},
        {"title": "Definitions", "bullets": [
            f"time per iteration = mean wall-clock seconds per training iteration, excluding the "
            f"first {' or '.join(warmup)} (warm-up) iterations of the run", PROGRESS_DEFINITION,
            "time split: data = waiting for the next batch; compute = forward and backward; "
            "communication = the strategy's own exchange (parameter server: sending gradients "
            "and receiving weights; DDP: the time backward waits for the last all-reduce bucket "
            "once its gradients are ready, the rest of the all-reduce overlapping compute); "
            "optimizer = the weight update",
            "AP, AP50, AP75 = COCO box average precision (pycocotools); a size-range AP of -1 "
            "(no objects of that size) is left empty in summary.csv"]},
        {"title": "Figures", "figures": [(name, f"figures/{name}.{figure_ext}", caption)
                                         for name, caption in FIGURES.items()]},
        {"title": "Provenance", "bullets": provenance_bullets(runs)},
    ]


def render_markdown(sections: list[dict]) -> str:
    out = ["# Data-parallel Faster R-CNN benchmark: report\n"]
    for section in sections:
        out.append(f"## {section['title']}\n")
        out += [text + "\n" for text in section.get("text", [])]
        if section.get("table") is not None:
            out.append(markdown_table(section["table"]))
        if section.get("bullets"):
            out.append("".join(f"- {b}\n" for b in section["bullets"]))
        out += [f"![{caption}]({path})\n" for _, path, caption in section.get("figures", [])]
    return "\n".join(out)


CSS = ("body{font-family:sans-serif;max-width:60em;margin:2em auto;color:#222}"
       "table{border-collapse:collapse;margin:1em 0}th,td{border-bottom:1px solid #ccc;"
       "padding:.25em .6em;text-align:left}img{max-width:100%}figcaption{font-size:.9em}")


def render_html(sections: list[dict], pngs: dict[str, bytes]) -> str:
    esc = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>",
           "<title>Data-parallel Faster R-CNN benchmark: report</title>",
           f"<style>{CSS}</style></head><body>",
           "<h1>Data-parallel Faster R-CNN benchmark: report</h1>"]
    for section in sections:
        out.append(f"<h2>{esc(section['title'])}</h2>")
        out += [f"<p>{esc(text)}</p>" for text in section.get("text", [])]
        if section.get("table") is not None:
            out.append(section["table"].to_html(index=False, escape=True, border=0))
        if section.get("bullets"):
            out.append("<ul>" + "".join(f"<li>{esc(b)}</li>" for b in section["bullets"]) + "</ul>")
        for name, _, caption in section.get("figures", []):
            data = base64.b64encode(pngs[name]).decode("ascii")
            out.append(f"<figure><img alt='{esc(caption)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{esc(caption)}</figcaption></figure>")
    return "\n".join(out + ["</body></html>"]) + "\n"


def equivalence_section(path) -> dict:
    """One step of each strategy against `single` on Faster R-CNN (pipeline/equivalence.py)."""
    found = _read_input(Path(path))
    # No '|' in headers: it would split the Markdown table's columns.
    rows = [{"run": name, "largest weight difference from single after one step": (
                f"{r['max_abs_difference']:.3g}" if "skipped" not in r else "skipped"),
             "relative to single's step": (
                f"{r['relative_to_step']:.3g}" if r.get("relative_to_step") is not None else
                r.get("skipped", ""))}
            for name, r in found["strategies"].items()]
    return {"title": "Equivalence with single", "text": [
        f"From the same weights and the same global batch, one SGD step of each strategy, "
        f"compared with {found['reference']} (whose largest weight change was "
        f"{found['max_abs_step_of_single']:.3g}). Why they differ: {found['why']}"],
        "table": pd.DataFrame(rows)}


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
    table1 = comparison_table(summary, published, {c: (c, c) for c in AP_COLUMNS}, preset)
    table2 = comparison_table(
        summary, published, {"Time per iteration (s)": ("sec_per_iter", "sec_per_iter_mean"),
                             "Progress per epoch": ("progress_per_epoch", "progress_per_epoch")},
        preset)
    shown1 = write_table(table1, {c: 3 for c in AP_COLUMNS}, n_published, out_dir, "table1")
    shown2 = write_table(table2, {"Time per iteration (s)": 4, "Progress per epoch": 4},
                         n_published, out_dir, "table2")
    formats = list(report_cfg.get("figure_formats") or ["png"])
    ok = [run for run in runs if run["status"] == "ok"]
    pngs = write_figures(ok, table1, out_dir, formats, int(report_cfg.get("dpi", 150)))
    figure_ext = "png" if "png" in formats else formats[0]
    sections = report_sections(runs, summary, shown1, shown2, published, preset, figure_ext)
    if equivalence:
        sections.insert(4, equivalence_section(equivalence))
    write_text(out_dir / "report.md", render_markdown(sections))
    write_text(out_dir / "report.html", render_html(sections, pngs))
    return summary


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Summary table, paper tables, figures and "
                                                 "reports of all runs (see module docstring).")
    parser.add_argument("--report-config", required=True, help="the report section as JSON")
    parser.add_argument("--preset", required=True)
    parser.add_argument("--summary", required=True, help="CSV with one row per run")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--equivalence", help="results/equivalence.json (pipeline.equivalence)")
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    args = parser.parse_args(argv)
    try:
        report_cfg = json.loads(args.report_config)
    except json.JSONDecodeError as err:
        raise SystemExit(f"error: --report-config is not valid JSON ({err.msg}); pass the report "
                         "section of params.yaml as JSON") from None
    try:
        build_report(args.run_dirs, report_cfg, args.preset, args.summary, args.out_dir,
                     args.equivalence)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
