"""The report's figures, kept in one registry: adding a figure is writing one decorated function.

    @figure("name", "caption")
    def draw_name(ax, data: ReportData) -> None: ...

FIGURES (name -> Figure) drives everything else: write_figures draws each entry, the reports
list each caption, and the Snakefile declares each figure file as an output. So that the Snakefile
can import this module cheaply, matplotlib and seaborn are imported only when drawing starts.

Every figure is drawn at the paper's text width (WIDTH_IN) and printed at that size, so its
fonts (FONT_PT, no text smaller than MIN_PT) are the sizes a reader sees; its height is fitted
to what it holds (Figure.height: rows of bars, the legend). Legends sit outside the data
(outside_legend), every axis says its unit, and a figure that shows published values beside
ours says on each axis which is which.
"""

from __future__ import annotations

import concurrent.futures
import io
import logging
import math
import multiprocessing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from ..runtime.distributed import available_cores
from ..runtime.files import atomic_path
from .data import ReportData
from .load import AP_COLUMNS, TIME_SPLIT, baseline_mask, reader_name, reader_names, required, strategy_label
from .noise import Spread
from .tables import significant

WIDTH_IN = 6.2  # the paper's text is 16 cm (6.3 in) wide: figures print at 1:1
MAX_HEIGHT_IN = 7.5  # the paper includes figures up to 0.8 of its 9.7 in of text height
MIN_PT = 7  # no text of a figure smaller, at print size
FONT_PT = {
    "font.size": 8.5,
    "axes.labelsize": 9,
    "axes.titlesize": 9,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "legend.title_fontsize": 8.5,
}


def _default_height(data: ReportData) -> float:
    return 3.0


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str
    draw: Callable[..., None]  # draw(ax, data: ReportData)
    # inches for the data, from what the figure holds (rows of bars); the legend adds its own
    height: Callable[[ReportData], float] = _default_height


FIGURES: dict[str, Figure] = {}  # in drawing and report order


def figure(name: str, caption: str, height: Callable[[ReportData], float] = _default_height):
    """Register the decorated draw(ax, data) function as figure `name` with `caption`;
    `height(data)`: the inches its data need, where they grow with the runs."""

    def register(draw):
        if name in FIGURES:
            raise ValueError(f"figure {name!r} is registered twice")
        FIGURES[name] = Figure(name, caption, draw, height)
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


def outside_legend(ax, where: str = "right", ncols: int = 1, extra=()):
    """Move the axes' legend (seaborn's or matplotlib's, plus the labelled artists drawn after
    it and `extra` (handle, label) pairs) out of the data: to the figure's right or below it.
    The figure's layout makes room for it; it never covers a curve."""
    handles, labels, title = [], [], None
    legend = ax.get_legend()
    if legend is not None:
        handles, labels = list(legend.legend_handles), [t.get_text() for t in legend.get_texts()]
        title = legend.get_title().get_text() or None
        legend.remove()
    for handle, label in [*zip(*ax.get_legend_handles_labels(), strict=False), *extra]:
        if label not in labels:
            handles.append(handle)
            labels.append(label)
    if not handles:
        return None
    fig = ax.figure
    loc = "outside right upper" if where == "right" else "outside lower center"
    for columns in range(ncols, 0, -1):  # below: as many columns as the figure's width holds
        legend = fig.legend(handles, labels, loc=loc, ncols=columns, title=title, frameon=False)
        if columns == 1 or legend.get_window_extent(fig.canvas.get_renderer()).width <= fig.bbox.width:
            return legend
        legend.remove()


def _bar_rows(per_row: float, rows: Callable[[ReportData], int], base: float = 0.8):
    """A height for horizontal bars: `per_row` inches a row, within MAX_HEIGHT_IN."""
    return lambda data: min(MAX_HEIGHT_IN - 0.5, base + per_row * max(1, rows(data)))


@figure(
    "loss_vs_time",
    "Training loss (rolling mean) versus elapsed training seconds, "
    "one line per run (the first seed of each sweep entry)",
)
def draw_loss_vs_time(ax, data: ReportData) -> None:
    frames = []
    for run in data.first_seeds:
        it = required(run.iterations, f"{run.run_id}'s iterations").sort_values("elapsed")
        # Per-iteration loss is noisy; smooth over ~2% of the run (at least 5 iterations), then
        # keep at most ~2000 points so a 26-epoch COCO run still gives a light PDF.
        window = max(5, len(it) // 50)
        it = it.assign(smoothed=it["loss"].rolling(window, min_periods=1).mean(), run=run.entry)
        frames.append(it.iloc[:: max(1, len(it) // 2000)])
    _seaborn().lineplot(pd.concat(frames), x="elapsed", y="smoothed", hue="run", estimator=None, ax=ax)
    ax.set(xlabel="elapsed training time (s)", ylabel="total loss (rolling mean)")
    outside_legend(ax)


@figure("loss_vs_epoch", "Epoch-mean training loss per epoch: mean over each sweep entry's seeds, band: 95% interval")
def draw_loss_vs_epoch(ax, data: ReportData) -> None:
    rows = [
        {"entry": run.entry, "epoch": i + 1, "loss": loss}
        for run in data.ok
        for i, loss in enumerate(run.summary.epoch_loss)
    ]
    _seaborn().lineplot(pd.DataFrame(rows), x="epoch", y="loss", hue="entry", marker="o", ax=ax)
    ax.set(xlabel="epoch", ylabel="epoch-mean total loss")
    ax.xaxis.get_major_locator().set_params(integer=True)
    outside_legend(ax)


@figure(
    "ap",
    "COCO box AP, AP50 and AP75: the published DP and DDP values (top, COCO 2017) "
    "and each sweep entry of this benchmark (bottom, mean over its seeds), each on "
    "its own axis",
    height=_bar_rows(0.34, lambda data: len(data.table1) if data.table1 is not None else 1, base=1.3),
)
def draw_ap(ax, data: ReportData) -> None:
    table = data.table1
    published = table["Source"].astype(str).str.startswith("published")
    # each panel's axis says whose values it holds: the table's Source of its rows
    parts = [
        (rows, str(rows["Source"].iloc[0]) if len(rows) else "this benchmark: no run scored")
        for rows in (table[published], table[~published])
    ]
    parts = [(rows, label) for rows, label in parts if len(rows)] or parts[1:]
    # Published and reproduced values never share an axis: one panel each, its axis saying whose
    fig = ax.figure
    ax.remove()
    axes = fig.subplots(len(parts), 1, height_ratios=[max(1, len(rows)) for rows, _ in parts], squeeze=False)[:, 0]
    colours = _seaborn().color_palette(n_colors=len(AP_COLUMNS))
    for panel, (rows, label) in zip(axes, parts, strict=False):
        names = [
            m.split("(")[-1].rstrip(")") if label.startswith("published") else m.split(":")[0] for m in rows["Method"]
        ]
        height = 0.8 / len(AP_COLUMNS)
        for k, (metric, colour) in enumerate(zip(AP_COLUMNS, colours, strict=False)):
            panel.barh(
                [i - 0.4 + height * (k + 0.5) for i in range(len(rows))],
                rows[metric].astype(float).fillna(0),
                height=height,
                color=colour,
                label=metric,
            )
        panel.set_yticks(range(len(rows)), names)
        panel.invert_yaxis()
        panel.set_xlabel(f"COCO box AP: {label}")
        panel.set_xlim(
            0,
            max(
                0.05,
                1.1 * float(rows[AP_COLUMNS].astype(float).max().max()) if rows[AP_COLUMNS].notna().any().any() else 1,
            ),
        )
    outside_legend(axes[0])


@figure(
    "time_split",
    "Mean seconds per iteration split into data wait, compute, communication "
    "and optimizer, per sweep entry (mean over its seeds)",
    height=_bar_rows(0.26, lambda data: data.entries),
)
def draw_time_split(ax, data: ReportData) -> None:
    done = data.summary[data.summary["status"] == "ok"]
    columns = [f"time_{k}" for k in TIME_SPLIT]
    split = done.groupby("entry", sort=False)[columns].mean()
    split.columns = list(TIME_SPLIT)
    split.plot(kind="barh", stacked=True, ax=ax, color=_seaborn().color_palette(n_colors=len(TIME_SPLIT)))
    ax.set(xlabel="mean seconds per iteration", ylabel="")
    ax.invert_yaxis()  # first run on top, as in the tables
    outside_legend(ax)


def _utilisation(data: ReportData) -> pd.DataFrame:
    """One row per entry and device kind (CPU, GPU) with samples: the median utilisation of a
    process (CPU, 100 % = one core) or a GPU over every sample of every rank of its runs, and
    the quartiles around it."""
    rows, names = [], reader_names(data.summary) if data.summary is not None else {}
    for run in data.ok:
        s = run.summary
        name = names.get(run.entry) or reader_name(s.strategy, s.variant, s.data_mode, s.workers)
        for sample in run.utilisation:
            rows.append({"entry": run.entry, "name": name, "kind": "CPU per process", "util": sample["cpu_percent"]})
            rows += [
                {"entry": run.entry, "name": name, "kind": "GPU", "util": g["util_percent"]} for g in sample["gpus"]
            ]
    if not rows:
        return pd.DataFrame(columns=["entry", "name", "kind", "median", "q1", "q3"])
    grouped = pd.DataFrame(rows).groupby(["entry", "name", "kind"], sort=False)["util"]
    return pd.DataFrame(
        {"median": grouped.median(), "q1": grouped.quantile(0.25), "q3": grouped.quantile(0.75)}
    ).reset_index()


@figure(
    "utilisation",
    "Utilisation while training, per entry: the median over every sample of "
    "its runs of each training process's CPU (100 % = one core) and, where "
    "used, each GPU's (NVML); lines: the middle half of the samples",
    height=_bar_rows(0.2, lambda data: max(1, _utilisation(data)["entry"].nunique())),
)
def draw_utilisation(ax, data: ReportData) -> None:
    found = _utilisation(data)
    if found.empty:
        return _no_runs(ax, "no utilisation samples")
    names = list(dict.fromkeys(found["name"]))
    kinds = list(dict.fromkeys(found["kind"]))
    height = 0.8 / len(kinds)
    colours = _seaborn().color_palette(n_colors=max(2, len(kinds)))
    for k, (kind, colour) in enumerate(zip(kinds, colours, strict=False)):
        rows = found[found["kind"] == kind]
        y = [names.index(n) - 0.4 + height * (k + 0.5) for n in rows["name"]]
        ax.barh(y, rows["median"], height=height, color=colour, label=kind)
        for yi, q1, q3 in zip(y, rows["q1"], rows["q3"], strict=False):
            ax.plot([q1, q3], [yi, yi], color="black", linewidth=1)
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set(xlabel="median utilisation while training (%)", ylabel="")
    outside_legend(ax, where="below", ncols=2)


VERDICT_FIGURE = "throughput"  # drawn under the verdict, at the report's top (sections.answer)


def _entry_speeds(data: ReportData) -> pd.DataFrame:
    """One row per entry of completed runs on the real loader (all modes where none ran on it):
    a reader's name, workers, the mean images/s over seeds, its 95 % t-interval, the seeds'
    values, and whether it is the baseline; by workers, then fastest first."""
    done = data.summary[data.summary["status"] == "ok"]
    real = done[done["data_mode"] == "real"]
    done = real if len(real) else done
    rows, names = [], reader_names(done)
    for entry, group in done.groupby("entry", sort=False):
        first = group.iloc[0]
        spread = Spread.of(group["images_per_second"])
        low, high = spread.interval
        rows.append(
            {
                "entry": entry,
                "workers": int(first["workers"]),
                "name": names[entry],
                "mean": spread.mean,
                "low": low,
                "high": high,
                "values": [float(v) for v in group["images_per_second"].dropna()],
                "baseline": bool(baseline_mask(group.head(1)).iloc[0]),
            }
        )
    frame = pd.DataFrame(rows)
    return frame.sort_values(["workers", "mean"], ascending=[True, False], kind="stable") if rows else frame


@figure(
    VERDICT_FIGURE,
    "Images/s of each strategy and worker count on the real loader: bar, the "
    "mean over its seeds; line, its 95% interval; dots, each seed; dashed, "
    "single process's level",
    height=_bar_rows(0.24, lambda data: len(_entry_speeds(data)), base=0.6),
)
def draw_throughput(ax, data: ReportData) -> None:
    speeds = _entry_speeds(data)
    if speeds.empty:
        return _no_runs(ax)
    colours = _seaborn().color_palette(n_colors=max(2, speeds["workers"].nunique()))
    colour = dict(zip(sorted(speeds["workers"].unique()), colours, strict=False))
    rows = range(len(speeds))
    ax.barh(rows, speeds["mean"], color=[colour[w] for w in speeds["workers"]], height=0.7)
    for i, row in zip(rows, speeds.itertuples(), strict=False):
        if row.high == row.high:  # an interval: 2 or more seeds
            ax.plot([row.low, row.high], [i, i], color="black", linewidth=1.2)
        ax.plot(row.values, [i] * len(row.values), linestyle="", marker="o", markersize=2.5, color="black", alpha=0.6)
    ax.set_yticks(list(rows), speeds["name"])
    ax.invert_yaxis()
    single = speeds[speeds["baseline"]]
    if len(single):
        level = float(single["mean"].iloc[0])
        ax.axvline(level, linestyle="--", color="grey", label=f"single process: {significant(level)} images/s")
    from matplotlib.patches import Patch

    ax.set(xlabel="throughput (images/s)", ylabel="")
    outside_legend(
        ax,
        where="below",
        ncols=4,
        extra=[(Patch(color=colour[w]), f"{w} worker{'s' if w != 1 else ''}") for w in colour],
    )


@figure(
    "memory",
    "Memory per worker against workers, per strategy: the parameters, gradients "
    "and optimizer state that its busiest process holds, counted from its tensors "
    "(solid), beside the strategy's analysis (dashed); each process's peak memory "
    "is in summary.csv (peak_memory_mb)",
)
def draw_memory(ax, data: ReportData) -> None:
    done = data.summary[(data.summary["status"] == "ok") & data.summary["owned_state_mb"].notna()]
    if done.empty:
        return _no_runs(ax, "no completed run recorded the state it holds")
    done = done.assign(
        strategy=[
            strategy_label(s, v, m)
            for s, v, m in zip(done["strategy"], done["variant"], done["data_mode"], strict=False)
        ]
    )
    for colour, (name, rows) in enumerate(done.groupby("strategy", sort=True)):
        rows = rows.groupby("workers", as_index=False)[["owned_state_mb", "theory_state_mb"]].mean()
        ax.plot(rows["workers"], rows["owned_state_mb"], marker="o", color=f"C{colour}", label=name)
        ax.plot(rows["workers"], rows["theory_state_mb"], linestyle="--", color=f"C{colour}")
    ax.set(xlabel="workers", ylabel="state held by the busiest process (MiB)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    from matplotlib.lines import Line2D

    outside_legend(
        ax,
        extra=[
            (Line2D([], [], color="black", marker="o"), "counted (solid)"),
            (Line2D([], [], color="black", linestyle="--"), "by the analysis (dashed)"),
        ],
    )


@figure(
    "scaling",
    "Speed-up over single (at the same global batch, else the same images per "
    "worker) against the number of workers, per strategy, its scaling efficiency "
    "(speed-up / workers) at each number of workers in the legend; dashed: linear",
)
def draw_scaling(ax, data: ReportData) -> None:
    scaling = data.scaling.astype({"workers": float})
    # The efficiencies go in the legend, one line per strategy: labels beside the points
    # collide where strategies reach the same speed-up.
    efficiency = {
        name: ", ".join(
            f"{e:.0%} at {int(w)}" for w, e in zip(rows["workers"], rows["efficiency"], strict=False) if e == e
        )
        for name, rows in scaling.groupby("strategy", sort=False)
    }
    scaling = scaling.assign(strategy=[f"{s}: {efficiency[s]}" if efficiency[s] else s for s in scaling["strategy"]])
    _seaborn().lineplot(scaling, x="workers", y="speedup_vs_single", hue="strategy", marker="o", ax=ax)
    top = max(2.0, float(scaling["workers"].max()))
    ax.plot([1, top], [1, top], linestyle="--", color="grey", label="linear")
    ax.set(xlabel="workers", ylabel="speed-up over single (x)")
    ax.xaxis.get_major_locator().set_params(integer=True)
    legend = outside_legend(ax)
    if legend is not None:
        legend.set_title("strategy: efficiency at N workers")


@figure(
    "ap_vs_time",
    "Time to accuracy: COCO box AP on the validation split during training "
    "against training seconds (evaluations excluded); dotted: the target",
)
def draw_ap_vs_time(ax, data: ReportData) -> None:
    rows = [
        {"run": run.run_id, "entry": run.entry, "seconds": e.train_seconds, "AP": e.AP}
        for run in data.ok
        for e in run.summary.evaluations
    ]
    if not rows:
        return _no_runs(ax, "no evaluations during training (eval.every_epochs: 0)")
    _seaborn().lineplot(
        pd.DataFrame(rows), x="seconds", y="AP", hue="entry", units="run", estimator=None, marker="o", ax=ax
    )
    targets = data.summary["target_ap"].dropna()
    if len(targets):
        ax.axhline(float(targets.iloc[0]), linestyle=":", color="grey", label="target")
    ax.set(xlabel="training time, evaluations excluded (s)", ylabel="COCO box AP")
    outside_legend(ax)


@figure(
    "data_modes",
    "Images/s with the real loader and with in-memory tensors (no loader), "
    "per strategy and workers (mean over seeds), with the loader's share",
    height=_bar_rows(0.5, lambda data: len(data.data_modes)),
)
def draw_data_modes(ax, data: ReportData) -> None:
    table = data.data_modes
    if table.empty:
        return _no_runs(ax, "no entry ran in both data modes")
    labels = [f"{s}, {w} worker(s)" for s, w in zip(table["strategy"], table["workers"], strict=False)]
    long = pd.DataFrame(
        {
            "run": labels * 2,
            "mode": ["real loader"] * len(table) + ["in-memory"] * len(table),
            "images/s": list(table["real images/s"]) + list(table["synthetic images/s"]),
        }
    )
    _seaborn().barplot(long, y="run", x="images/s", hue="mode", orient="h", ax=ax)
    top = float(long["images/s"].max())
    notes = table["loader share note"] if "loader share note" in table else [""] * len(table)
    for i, (real, synthetic, share, note) in enumerate(
        zip(table["real images/s"], table["synthetic images/s"], table["loader share"], notes, strict=False)
    ):
        # beside the longer bar, in the margin kept free for it
        ax.annotate(
            f"loader {share:.0%}" + (" (measured below 0)" if note else ""),
            (max(real, synthetic), i),
            xytext=(4, 0),
            textcoords="offset points",
            va="center",
            fontsize=MIN_PT + 0.5,
        )
    ax.set_xlim(0, 1.45 * top)
    ax.set(xlabel="throughput (images/s)", ylabel="")
    outside_legend(ax)


@figure(
    "prediction",
    "Prediction (cost model) against measurement: images/s of every "
    "multi-process run, the held-out ones (the model fitted without them) "
    "marked; the line is equality, the band ±20 %",
)
def draw_prediction(ax, data: ReportData) -> None:
    frame = data.prediction
    if data.held_out is not None and len(data.held_out.rows):
        frame = pd.concat([frame, data.held_out.rows.assign(flag="held out")], ignore_index=True)
    frame = frame.dropna(subset=["predicted_images_per_second"])
    if frame.empty:
        return _no_runs(ax, "no multi-process run with a commbench measurement")
    _seaborn().scatterplot(
        frame.assign(flag=frame["flag"].replace("", "within 20%")),
        x="measured_images_per_second",
        y="predicted_images_per_second",
        hue="strategy",
        style="flag",
        ax=ax,
    )
    top = 1.1 * float(max(frame["measured_images_per_second"].max(), frame["predicted_images_per_second"].max()))
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="prediction = measurement")
    ax.fill_between(
        [0, top],
        [0, 0.8 * top],
        [0, 1.2 * top],
        color="grey",
        alpha=0.15,
        linewidth=0,
        label="within ±20% of the measurement",
    )
    ax.set(
        xlabel="measured throughput (images/s)",
        ylabel="predicted throughput (images/s, model)",
        xlim=(0, top),
        ylim=(0, top),
    )
    ax.set_aspect("equal")
    outside_legend(ax)


def _predicted_scaling(ax, data: ReportData, column: str, measured_column: str, ylabel: str, log_y: bool) -> None:
    """One line per cluster (style) and strategy model (colour) against GPUs, and this preset's
    measured runs as black crosses: predictions and measurements apart, on one pair of axes."""
    points = data.cluster_points
    _seaborn().lineplot(points, x="gpus", y=column, hue="model", style="cluster", marker="o", markersize=3, ax=ax)
    measured = data.scaling.dropna(subset=[measured_column])
    device = data.summary["device"].dropna().iloc[0] if data.summary["device"].notna().any() else "?"
    ax.scatter(
        measured["workers"].astype(float),
        measured[measured_column],
        marker="x",
        color="black",
        zorder=5,
        label=f"measured: this preset's runs ({device})",
    )
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter("{x:g}")  # 1, 2, 4 .. 256 GPUs, not powers of two
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter("{x:g}")  # 10, 100, 1000: no superscripts of 70 % size
    ax.set(xlabel="GPUs (workers)", ylabel=ylabel)
    outside_legend(ax, where="below", ncols=2)


@figure(
    "predicted_throughput",
    "PREDICTION (cost model) past this machine: images/s against "
    "GPUs on the hypothetical clusters of report.predict, per "
    "strategy; crosses: this preset's measured runs (their own "
    "model and hardware)",
)
def draw_predicted_throughput(ax, data: ReportData) -> None:
    _predicted_scaling(
        ax,
        data,
        "predicted_images_per_second",
        "images_per_second",
        "throughput (images/s; lines predicted,\ncrosses measured)",
        log_y=True,
    )


@figure(
    "predicted_efficiency",
    "PREDICTION (cost model) past this machine: scaling "
    "efficiency (images/s over GPUs times one GPU's) against GPUs; "
    "crosses: this preset's measured runs",
)
def draw_predicted_efficiency(ax, data: ReportData) -> None:
    _predicted_scaling(
        ax,
        data,
        "predicted_efficiency",
        "efficiency",
        "scaling efficiency (lines predicted,\ncrosses measured)",
        log_y=False,
    )
    ax.set_ylim(0, 1.1)


def _no_runs(ax, text: str = "no completed runs") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=14, transform=ax.transAxes)
    ax.set_axis_off()


def write_figures(data: ReportData, out_dir: Path, formats: list[str], dpi: int) -> dict[str, bytes]:
    """Draw each registered figure, save it in every format, and return its PNG bytes for the
    HTML report. Two processes draw at once where there are two cores (forked: they share
    `data`); the files are written here, each atomically."""
    global _DRAWING
    _DRAWING = (data, formats, dpi)
    names = list(FIGURES)
    if available_cores() > 1 and "fork" in multiprocessing.get_all_start_methods():
        context = multiprocessing.get_context("fork")
        with concurrent.futures.ProcessPoolExecutor(2, mp_context=context) as pool:
            drawn = dict(zip(names, pool.map(_draw_figure, names), strict=False))
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
    assert _DRAWING is not None  # set by write_figures before its processes fork
    data, formats, dpi = _DRAWING
    plt = _pyplot()
    fig = drawn(FIGURES[name], data)
    try:
        files = {}
        for fmt in dict.fromkeys(["png", *formats]):  # each savefig draws the figure again
            buffer = io.BytesIO()
            fig.savefig(buffer, format=fmt, dpi=dpi)
            files[fmt] = buffer.getvalue()
        return files
    finally:
        plt.close(fig)


def drawn(entry: Figure, data: ReportData):
    """The figure of a registry entry, drawn: WIDTH_IN wide, as tall as its data need
    (Figure.height) plus its legend and labels. The caller closes it."""
    plt = _pyplot()
    _seaborn().set_theme(style="whitegrid", context="paper", rc=FONT_PT)
    plt.rcParams.update({"pdf.fonttype": 42, "ps.fonttype": 42})  # text stays text in the PDF
    logging.getLogger("fontTools").setLevel(logging.WARNING)  # its subsetting logs every table
    fig = plt.figure(figsize=(WIDTH_IN, entry.height(data)), layout="constrained")
    ax = fig.add_subplot()
    try:
        if data.ok:
            entry.draw(ax, data)
        else:
            _no_runs(ax)
        fit_height(fig, entry.height(data))
    except BaseException:
        plt.close(fig)
        raise
    return fig


def fit_height(fig, data_in: float) -> None:
    """Make the figure as tall as its data (`data_in` inches of axes) plus what lies above and
    below them (a legend below, tick labels, axis labels), and at least as tall as a legend at
    its side; never taller than MAX_HEIGHT_IN."""
    fig.canvas.draw()
    axes = [ax for ax in fig.axes if ax.get_visible()]
    if not axes:
        return
    height = fig.get_figheight()
    inside = sum(ax.get_position().height for ax in axes) * height
    side = max((legend.get_window_extent().height / fig.dpi + 0.2 for legend in fig.legends), default=0.0)
    wanted = max(height - inside + data_in, side)
    if not math.isclose(wanted, height, rel_tol=0.02):
        fig.set_figheight(min(MAX_HEIGHT_IN, wanted))
        fig.canvas.draw()
