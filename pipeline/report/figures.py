"""The report's figures, kept in one registry: adding a figure is writing one decorated function.

    @figure("name", "caption")
    def draw_name(ax, data: ReportData) -> None: ...

FIGURES (name -> Figure) drives everything else: write_figures draws each entry, the reports
list each caption, and the Snakefile declares each figure file as an output. So that the Snakefile
can import this module cheaply, matplotlib and seaborn are imported only when drawing starts.
"""
from __future__ import annotations

import concurrent.futures
import io
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from ..runtime.distributed import available_cores
from ..runtime.files import atomic_path
from .load import AP_COLUMNS, TIME_SPLIT, baseline_mask, strategy_label


@dataclass(frozen=True)
class ReportData:
    """Everything a figure may draw from: the completed runs, one row per run (summary.csv),
    Table 1 and the scaling and data-mode tables."""
    ok: list[dict]
    table1: pd.DataFrame
    scaling: pd.DataFrame
    summary: pd.DataFrame
    data_modes: pd.DataFrame
    prediction: pd.DataFrame  # the cost model's images/s beside the measured (prediction.py)
    cluster_points: pd.DataFrame  # predicted scaling on hypothetical clusters (clusters.py)

    @property
    def first_seeds(self) -> list[dict]:
        """One run per sweep entry (its first seed): for figures that draw a run's every line."""
        seen, runs = set(), []
        for run in self.ok:
            if run["entry"] not in seen:
                seen.add(run["entry"])
                runs.append(run)
        return runs


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    draw: Callable[..., None]  # draw(ax, data: ReportData)
    tall: bool = False  # one bar per run: the figure grows with the number of runs


FIGURES: dict[str, Figure] = {}  # in drawing and report order


def figure(name: str, caption: str, tall: bool = False):
    """Register the decorated draw(ax, data) function as figure `name` with `caption`."""
    def register(draw):
        if name in FIGURES:
            raise ValueError(f"figure {name!r} is registered twice")
        FIGURES[name] = Figure(name, caption, draw, tall)
        return draw
    return register


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes or in CI
    import matplotlib.pyplot as plt

    return plt


def _seaborn():
    _pyplot()  # seaborn imports pyplot: choose the backend first
    import seaborn as sns

    return sns


@figure("loss_vs_time", "Training loss (rolling mean) versus elapsed training seconds, "
                        "one line per run (the first seed of each sweep entry)")
def draw_loss_vs_time(ax, data: ReportData) -> None:
    frames = []
    for run in data.first_seeds:
        it = run["iterations"].sort_values("elapsed")
        # Per-iteration loss is noisy; smooth over ~2% of the run (at least 5 iterations), then
        # keep at most ~2000 points so a 26-epoch COCO run still gives a light PDF.
        window = max(5, len(it) // 50)
        it = it.assign(smoothed=it["loss"].rolling(window, min_periods=1).mean(), run=run["entry"])
        frames.append(it.iloc[::max(1, len(it) // 2000)])
    _seaborn().lineplot(pd.concat(frames), x="elapsed", y="smoothed", hue="run", estimator=None,
                        ax=ax)
    ax.set(xlabel="elapsed training time (s)", ylabel="total loss (rolling mean)")


@figure("loss_vs_epoch", "Epoch-mean training loss per epoch: mean over each sweep entry's "
                         "seeds, band: 95% interval")
def draw_loss_vs_epoch(ax, data: ReportData) -> None:
    rows = [{"entry": run["entry"], "epoch": i + 1, "loss": loss} for run in data.ok
            for i, loss in enumerate(run["summary"].epoch_loss)]
    _seaborn().lineplot(pd.DataFrame(rows), x="epoch", y="loss", hue="entry", marker="o", ax=ax)
    ax.set(xlabel="epoch", ylabel="epoch-mean total loss")
    ax.xaxis.get_major_locator().set_params(integer=True)


@figure("ap", "COCO box AP, AP50 and AP75 per sweep entry (mean over its seeds), with the "
              "published DP and DDP values", tall=True)
def draw_ap(ax, data: ReportData) -> None:
    long = data.table1.melt(id_vars=["Method", "Source"], value_vars=AP_COLUMNS,
                            var_name="metric", value_name="value")
    # short bar labels: "DP (published)" for the study, the run id for ours
    long["method"] = [f"{m.split('(')[-1].rstrip(')')} (published)" if src.startswith("published")
                      else m.split(":")[0] for m, src in zip(long["Method"], long["Source"])]
    _seaborn().barplot(long, y="method", x="value", hue="metric", orient="h", ax=ax)
    ax.set(xlabel="COCO box AP", ylabel="")


@figure("time_split", "Mean seconds per iteration split into data wait, compute, communication "
                      "and optimizer, per sweep entry (mean over its seeds)", tall=True)
def draw_time_split(ax, data: ReportData) -> None:
    done = data.summary[data.summary["status"] == "ok"]
    columns = [f"time_{k}" for k in TIME_SPLIT]
    split = done.groupby("entry", sort=False)[columns].mean()
    split.columns = list(TIME_SPLIT)
    split.plot(kind="barh", stacked=True, ax=ax,
               color=_seaborn().color_palette(n_colors=len(TIME_SPLIT)))
    ax.set(xlabel="mean seconds per iteration", ylabel="")
    ax.invert_yaxis()  # first run on top, as in the tables
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1))


@figure("utilisation", "Utilisation over training time: each training process's CPU (100 % = "
                       "one core) and, where used, each GPU (NVML); the first seed of each entry")
def draw_utilisation(ax, data: ReportData) -> None:
    rows = []
    for run in data.first_seeds:
        for s in run.get("utilisation") or []:
            rows.append({"t": s["t"], "util": s["cpu_percent"],
                         "line": f"{run['entry']} rank {s['rank']} CPU"})
            rows += [{"t": s["t"], "util": g["util_percent"],
                      "line": f"{run['entry']} rank {s['rank']} GPU {g['index']}"}
                     for g in s["gpus"]]
    if not rows:
        ax.text(0.5, 0.5, "no utilisation samples", ha="center", va="center",
                transform=ax.transAxes)
        return
    _seaborn().lineplot(pd.DataFrame(rows), x="t", y="util", hue="line", estimator=None, ax=ax)
    ax.set(xlabel="seconds since training started", ylabel="utilisation (%)")
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=6)


@figure("throughput", "Images/s against the number of workers, per strategy (mean over seeds, "
                      "bars: 95% interval); dashed: linear scaling of single")
def draw_throughput(ax, data: ReportData) -> None:
    done = data.summary[data.summary["status"] == "ok"].astype({"workers": float})
    baseline = baseline_mask(done)
    done = done.assign(strategy=[strategy_label(s, v, m) for s, v, m in
                                 zip(done["strategy"], done["variant"], done["data_mode"])])
    _seaborn().lineplot(done, x="workers", y="images_per_second", hue="strategy", marker="o",
                        err_style="bars", ax=ax)
    single = done[baseline]["images_per_second"].mean()
    top = max(2.0, float(done["workers"].max()))
    if single == single:  # not NaN
        ax.plot([1, top], [single, single * top], linestyle="--", color="grey", label="linear")
    ax.set(xlabel="workers", ylabel="images/s")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1))


@figure("memory", "Memory per worker against workers, per strategy: the parameters, gradients "
                  "and optimizer state that its busiest process holds, counted from its tensors "
                  "(solid), beside the strategy's analysis (dashed); each process's peak memory "
                  "is in summary.csv (peak_memory_mb)")
def draw_memory(ax, data: ReportData) -> None:
    done = data.summary[(data.summary["status"] == "ok") & data.summary["owned_state_mb"].notna()]
    if done.empty:
        return _no_runs(ax)
    done = done.assign(strategy=[strategy_label(s, v, m) for s, v, m in
                                 zip(done["strategy"], done["variant"], done["data_mode"])])
    for colour, (name, rows) in enumerate(done.groupby("strategy", sort=True)):
        rows = rows.groupby("workers", as_index=False)[["owned_state_mb", "theory_state_mb"]].mean()
        ax.plot(rows["workers"], rows["owned_state_mb"], marker="o", color=f"C{colour}", label=name)
        ax.plot(rows["workers"], rows["theory_state_mb"], linestyle="--", color=f"C{colour}")
    ax.set(xlabel="workers", ylabel="MiB held by the busiest process")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=7)


@figure("scaling", "Speed-up over single (at the same global batch, else the same images per "
                   "worker) against the number of workers, per strategy; dashed: linear")
def draw_scaling(ax, data: ReportData) -> None:
    scaling = data.scaling.astype({"workers": float})
    _seaborn().lineplot(scaling, x="workers", y="speedup_vs_single", hue="strategy",
                        marker="o", ax=ax)
    top = max(2.0, float(scaling["workers"].max()))
    ax.plot([1, top], [1, top], linestyle="--", color="grey", label="linear")
    for _, row in scaling.iterrows():  # the efficiency beside each point
        ax.annotate(f"{row['efficiency']:.0%}", (row["workers"], row["speedup_vs_single"]),
                    textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set(xlabel="workers", ylabel="speed-up over single (images/s)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1))


@figure("ap_vs_time", "Time to accuracy: COCO box AP on the validation split during training "
                      "against training seconds (evaluations excluded); dotted: the target")
def draw_ap_vs_time(ax, data: ReportData) -> None:
    rows = [{"run": run["run_id"], "entry": run["entry"], "seconds": e.train_seconds, "AP": e.AP}
            for run in data.ok for e in run["summary"].evaluations]
    if not rows:
        ax.text(0.5, 0.5, "no evaluations during training (eval.every_epochs: 0)",
                ha="center", va="center", transform=ax.transAxes)
        return
    _seaborn().lineplot(pd.DataFrame(rows), x="seconds", y="AP", hue="entry", units="run",
                        estimator=None, marker="o", ax=ax)
    targets = data.summary["target_ap"].dropna()
    if len(targets):
        ax.axhline(float(targets.iloc[0]), linestyle=":", color="grey", label="target")
    ax.set(xlabel="training seconds", ylabel="COCO box AP")
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1))


@figure("data_modes", "Images/s with the real loader and with in-memory tensors (no loader), "
                      "per strategy and workers (mean over seeds)")
def draw_data_modes(ax, data: ReportData) -> None:
    table = data.data_modes
    if table.empty:
        ax.text(0.5, 0.5, "no entry ran in both data modes", ha="center", va="center",
                transform=ax.transAxes)
        return
    labels = [f"{s}, {w} worker(s)" for s, w in zip(table["strategy"], table["workers"])]
    long = pd.DataFrame({
        "run": labels * 2, "mode": ["real loader"] * len(table) + ["in-memory"] * len(table),
        "images/s": list(table["real images/s"]) + list(table["synthetic images/s"])})
    _seaborn().barplot(long, y="run", x="images/s", hue="mode", orient="h", ax=ax)
    for label, share in zip(labels, table["loader share"]):
        ax.annotate(f"loader {share:.0%}", (0, labels.index(label)), xytext=(4, 0),
                    textcoords="offset points", va="center", fontsize=7, color="white")
    ax.set(xlabel="images/s", ylabel="")


@figure("prediction", "Prediction (cost model) against measurement: images/s of every "
                      "multi-process run; the line is equality, the band ±20 %")
def draw_prediction(ax, data: ReportData) -> None:
    frame = data.prediction.dropna(subset=["predicted_images_per_second"])
    if frame.empty:
        ax.text(0.5, 0.5, "no multi-process run with a commbench measurement", ha="center",
                va="center", transform=ax.transAxes)
        return
    _seaborn().scatterplot(frame, x="measured_images_per_second", y="predicted_images_per_second",
                           hue="strategy", style="flag", ax=ax)
    top = 1.1 * float(max(frame["measured_images_per_second"].max(), frame["predicted_images_per_second"].max()))
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8)
    ax.fill_between([0, top], [0, 0.8 * top], [0, 1.2 * top], color="grey", alpha=0.15, linewidth=0)
    ax.set(xlabel="measured images/s", ylabel="predicted images/s (model)", xlim=(0, top), ylim=(0, top))
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=6)


def _predicted_scaling(ax, data: ReportData, column: str, measured_column: str, ylabel: str,
                       log_y: bool) -> None:
    """One line per cluster (style) and strategy model (colour) against GPUs, and this preset's
    measured runs as black crosses: predictions and measurements apart, on one pair of axes."""
    points = data.cluster_points
    _seaborn().lineplot(points, x="gpus", y=column, hue="model", style="cluster", marker="o",
                        markersize=3, ax=ax)
    measured = data.scaling.dropna(subset=[measured_column])
    device = (data.summary["device"].dropna().iloc[0] if data.summary["device"].notna().any() else "?")
    ax.scatter(measured["workers"].astype(float), measured[measured_column], marker="x",
               color="black", zorder=5, label=f"measured: this preset's runs ({device})")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter("{x:g}")  # 1, 2, 4 .. 256 GPUs, not powers of two
    if log_y:
        ax.set_yscale("log")
    ax.set(xlabel="GPUs (workers)", ylabel=ylabel)
    ax.legend(title="", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=5)


@figure("predicted_throughput", "PREDICTION (cost model) past this machine: images/s against "
                                "GPUs on the hypothetical clusters of report.predict, per "
                                "strategy; crosses: this preset's measured runs (their own "
                                "model and hardware)")
def draw_predicted_throughput(ax, data: ReportData) -> None:
    _predicted_scaling(ax, data, "predicted_images_per_second", "images_per_second",
                       "images/s (predicted; crosses measured)", log_y=True)


@figure("predicted_efficiency", "PREDICTION (cost model) past this machine: scaling "
                                "efficiency (images/s over GPUs times one GPU's) against GPUs; "
                                "crosses: this preset's measured runs")
def draw_predicted_efficiency(ax, data: ReportData) -> None:
    _predicted_scaling(ax, data, "predicted_efficiency", "efficiency",
                       "efficiency (predicted; crosses measured)", log_y=False)
    ax.set_ylim(0, 1.1)


def _no_runs(ax) -> None:
    ax.text(0.5, 0.5, "no completed runs", ha="center", va="center", fontsize=14,
            transform=ax.transAxes)
    ax.set_axis_off()


def write_figures(data: ReportData, out_dir: Path, formats: list[str],
                  dpi: int) -> dict[str, bytes]:
    """Draw each registered figure, save it in every format, and return its PNG bytes for the
    HTML report. Two processes draw at once where there are two cores (forked: they share
    `data`); the files are written here, each atomically."""
    global _DRAWING
    _DRAWING = (data, formats, dpi)
    names = list(FIGURES)
    if available_cores() > 1 and "fork" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
            drawn = dict(zip(names, pool.map(_draw_figure, names)))
    else:
        drawn = {name: _draw_figure(name) for name in names}
    for name, files in drawn.items():
        for fmt in formats:
            with atomic_path(out_dir / "figures" / f"{name}.{fmt}") as tmp:
                tmp.write_bytes(files[fmt])
    return {name: files["png"] for name, files in drawn.items()}


_DRAWING: tuple | None = None  # what write_figures draws from, set before its processes fork


def _draw_figure(name: str) -> dict[str, bytes]:
    """One registered figure, as bytes in every format and PNG."""
    data, formats, dpi = _DRAWING
    plt = _pyplot()
    _seaborn().set_theme(style="whitegrid", context="paper")
    entry = FIGURES[name]
    fig, ax = plt.subplots(figsize=(6.4, 3.6 + 0.25 * len(data.ok) * entry.tall))
    try:
        if data.ok:
            entry.draw(ax, data)
        else:
            _no_runs(ax)
        ax.set_title(entry.caption, fontsize=9)
        files = {}
        for fmt in dict.fromkeys(["png", *formats]):  # each savefig draws the figure again
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, dpi=dpi, bbox_inches="tight")
            files[fmt] = buffer.getvalue()
        return files
    finally:
        plt.close(fig)
