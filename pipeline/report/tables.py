"""The study's two tables (published rows, then ours) and the report's other tables, as CSV,
Markdown and LaTeX. Our rows are sweep entries: the mean over their seeds, its spread and n.

No plotting here. The strategies' display names come from their specs (pipeline.strategies).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import pandas as pd

from ..runtime.files import atomic_path, write_text
from ..strategies import STRATEGIES
from .load import AP_COLUMNS, number, strategy_label
from .noise import Spread, difference

PUBLISHED_NAMES = {"dp": "DataParallel (DP)", "ddp": "DistributedDataParallel (DDP)"}
TEX_HEADERS = {"AP50": "AP$_{50}$", "AP75": "AP$_{75}$"}
# Each table column: (its key in the published values, its summary.csv column), with decimals.
AP_TABLE = {col: (col, col) for col in AP_COLUMNS}
AP_DECIMALS = {col: 3 for col in AP_COLUMNS}
TIME_TABLE = {
    "Time per iteration (s)": ("sec_per_iter", "sec_per_iter_mean"),
    "Progress per epoch": ("progress_per_epoch", "progress_per_epoch"),
}
TIME_DECIMALS = {col: 4 for col in TIME_TABLE}
SCALING_DECIMALS = {"images_per_second": 2, "speedup_vs_single": 3, "efficiency": 3}
TIME_TO_ACCURACY_DECIMALS = {"target_ap": 3, "final_ap": 3, "training_seconds": 1, "evaluation_seconds": 1}
DATA_MODE_DECIMALS = {"real images/s": 2, "synthetic images/s": 2, "loader share": 3, "data wait (s/iter)": 4}


def _method(row) -> str:
    workers = "?" if pd.isna(row["workers"]) else int(row["workers"])
    declared = STRATEGIES.get(str(row["strategy"]))
    strategy = declared.label if declared is not None else str(row["strategy"])
    return f"{row['entry']}: {strategy}, {workers} worker{'' if workers == 1 else 's'}"


def entry_means(summary: pd.DataFrame, columns: list[str]) -> pd.DataFrame:
    """One row per sweep entry of the completed runs: n, and each column's mean and its sample
    standard deviation over the entry's seeds (COLUMN_sd; empty for one run)."""
    done = summary[summary["status"] == "ok"]
    rows = []
    for entry, group in done.groupby("entry", sort=False):
        first = group.iloc[0]
        row = {
            "entry": entry,
            "strategy": first["strategy"],
            "variant": first["variant"],
            "workers": first["workers"],
            "global_batch": first["global_batch"],
            "images_per_worker": first["images_per_worker"],
            "data_mode": first["data_mode"],
            "n": len(group),
        }
        for col in columns:
            spread = Spread.of(group[col])
            row[col], row[f"{col}_sd"] = spread.mean, spread.sd
        rows.append(row)
    return pd.DataFrame(rows)


def source_label(dataset: str, preset: str) -> str:
    """What our rows are: measured by this benchmark on `dataset`. Only COCO 2017 rows are
    comparable with the study's; the others say which data they come from."""
    if dataset == "coco2017":
        return f"this benchmark, COCO 2017 ({preset})"
    if dataset.startswith("coco2017"):  # coco2017-quick: the recipe on a subset, a few epochs
        return f"this benchmark, a COCO 2017 subset and a short schedule, not comparable ({preset})"
    return f"this benchmark, {dataset} data, not COCO ({preset})"


def comparison_table(
    summary: pd.DataFrame, published: dict, columns: dict[str, tuple[str, str]], preset: str, dataset: str
) -> pd.DataFrame:
    """Rows are methods: the published ones first (one run each, as the study reported), then
    one per sweep entry trained on real data (the study's layout), its values the mean over the
    entry's completed seeds with their standard deviation (COLUMN sd) and n. Entries without a
    value (runs on in-memory data are not scored) are left out.

    `columns` maps a table column to its key in the published values and its summary.csv column.
    """
    label = published.get("label", "published (2 GPUs, COCO 2017)")
    # The study's order (DP, then DDP): the config reaches us as key-sorted JSON.
    methods = [key for key in PUBLISHED_NAMES if isinstance(published.get(key), dict)]
    rows = [
        {
            "Method": PUBLISHED_NAMES[key],
            "Source": label,
            "n": 1,
            **{col: number(published[key].get(key_pub)) for col, (key_pub, _) in columns.items()},
        }
        for key in methods
    ]
    real = summary[summary["data_mode"] == "real"]
    means = entry_means(real, [key_csv for _, key_csv in columns.values()])
    for _, row in means.iterrows():
        if all(pd.isna(row[key_csv]) for _, key_csv in columns.values()):
            continue
        rows.append(
            {
                "Method": _method(row),
                "Source": source_label(dataset, preset),
                "n": int(row["n"]),
                **{col: row[key_csv] for col, (_, key_csv) in columns.items()},
                **{f"{col} sd": row[f"{key_csv}_sd"] for col, (_, key_csv) in columns.items()},
            }
        )
    return pd.DataFrame(rows, columns=["Method", "Source", "n", *columns, *[f"{col} sd" for col in columns]])


# How a reader sees a cell that holds nothing: a number that does not exist (one epoch's
# progress, the communication share of a strategy that exchanges inside its passes, a speed-up
# with no `single` run to compare with), and a text cell with nothing to say.
NO_NUMBER = "n/a"
NO_TEXT = "-"
# A column's name as the tables show it, where underscores alone do not make it readable, with
# its unit. The CSV files keep the names of summary.csv.
HEADERS = {
    "run_id": "run",
    "images_per_worker": "images per worker",
    "global_batch": "global batch",
    "images_per_second": "images/s",
    "speedup_vs_single": "speed-up over single",
    "efficiency": "scaling efficiency",
    "sec_per_iter_p50": "s/iter median",
    "sec_per_iter_p95": "s/iter p95",
    "communication_share": "communication share",
    "busiest_rank_bytes_per_iter": "bytes/iter, busiest rank",
    "busiest_rank_theory_bytes_per_iter": "bytes/iter by theory",
    "replicas_identical": "replicas identical",
    "peak_memory_mb": "peak memory (MiB)",
    "owned_state_mb": "state held (MiB)",
    "theory_state_mb": "state by analysis (MiB)",
    "target_ap": "target AP",
    "final_ap": "final AP",
    "training_seconds": "training (s)",
    "evaluation_seconds": "evaluation (s)",
    "compute_input": "compute input",
    "compute_fixed_s": "compute a step (s, fitted)",
    "compute_per_image_s": "compute per image (s, fitted)",
    "compute_overhead_s": "compute a step beside the other processes (s)",
    "shared_compute_factor": "shared-compute factor",
    "measured_images_per_second": "measured images/s",
    "predicted_images_per_second": "predicted images/s",
    "ratio": "predicted / measured",
    "measured_communication_s": "measured comm. (s)",
    "predicted_communication_s": "predicted comm. (s)",
    "predicted_in_step_communication_s": "predicted in-step comm. (s)",
    "communication_ratio": "in-step comm. predicted / measured",
    "speed_outlier": "speed outlier among its seeds",
    "flag": "flag",
    "data_mode": "data mode",
    "images_per_second sd": "images/s sd",
}


def header(column: str) -> str:
    """The column's name as a reader sees it (HEADERS, else its words)."""
    return HEADERS.get(column, column.replace("_", " "))


def places_for(values) -> int:
    """Decimals for a numeric column no table declares: whole numbers for counts, else three
    significant digits of its largest value (475.3 -> 475, 12.34 -> 12.3, 0.01234 -> 0.0123)."""
    finite = [abs(float(v)) for v in values if not pd.isna(v) and math.isfinite(float(v))]
    if not finite or all(v == int(v) for v in finite):
        return 0
    top = max(finite)
    return max(0, min(6, 2 - math.floor(math.log10(top)))) if top else 0


def significant(value: float, digits: int = 3) -> str:
    """`digits` significant digits, trailing zeros kept (0.0980, 42.0), never in exponent
    notation: how the verdict and the noise check say their numbers."""
    if value == 0 or not math.isfinite(value):
        return f"{value:.0f}"
    return f"{value:.{max(0, digits - 1 - math.floor(math.log10(abs(value))))}f}"


def signed(value: float, digits: int = 3) -> str:
    """significant() with its sign: +2.70, -0.0110."""
    return ("+" if value >= 0 else "-") + significant(abs(value), digits)


def number_text(value, places: int) -> str:
    """One number to `places` decimals; "n/a" where there is none (never "nan")."""
    if value is None or pd.isna(value):
        return NO_NUMBER
    if pd.api.types.is_bool(value):
        return "yes" if value else "no"
    return f"{float(value):.{places}f}"


def cell_text(value) -> str:
    """A text cell; "-" where it is empty, "yes"/"no" for a flag."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return NO_TEXT
    if pd.api.types.is_bool(value):
        return "yes" if value else "no"
    text = str(value)
    # an empty field, also as a frame made with .astype(str) spells it
    return NO_TEXT if not text.strip() or text in ("None", "nan", "NaN", "<NA>") else text


def _numeric(column: pd.Series) -> bool:
    return (pd.api.types.is_numeric_dtype(column) and not pd.api.types.is_bool_dtype(column)) or (
        column.dtype == object
        and len(column.dropna()) > 0
        and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in column.dropna())
    )


def formatted(table: pd.DataFrame, decimals: dict[str, int], hide=()) -> pd.DataFrame:
    """The table as a reader sees it: every number to its column's precision (`decimals`, else
    places_for), "n/a" and "-" for empty cells, headers in words (HEADERS). A column with a
    `COLUMN sd` beside it shows 'mean ± sd' in one cell; a `COLUMN note` marks its cells [1],
    [2] .. and its texts become the table's notes (shown.attrs["notes"]), said under it. The sd
    and note columns, and `hide`, stay in the CSV only."""
    shown = table.astype(object)
    notes: list[str] = []
    extra = {f"{c} sd" for c in table if f"{c} sd" in table} | {f"{c} note" for c in table if f"{c} note" in table}
    for col in table.columns:
        if col in extra or col in hide:
            continue
        if col in decimals or _numeric(table[col]):
            places = decimals.get(col, places_for(table[col]) if _numeric(table[col]) else 0)
            values = [number_text(v, places) for v in table[col]]
            if f"{col} sd" in table:
                values = [
                    v + ("" if pd.isna(sd) or v == NO_NUMBER else f" ± {sd:.{places}f}")
                    for v, sd in zip(values, table[f"{col} sd"], strict=False)
                ]
        else:
            values = [cell_text(v) for v in table[col]]
        if f"{col} note" in table:
            for i, note in enumerate(table[f"{col} note"]):
                if isinstance(note, str) and note:
                    notes.append(f"[{len(notes) + 1}] {note}")
                    values[i] = f"{values[i]} [{len(notes)}]"
        shown[col] = values
    shown = shown.drop(columns=[c for c in table if c in extra or c in hide])
    shown.columns = [header(c) for c in shown.columns]
    shown.attrs["notes"] = notes
    return shown


def markdown_table(shown: pd.DataFrame) -> str:
    lines = [
        "| " + " | ".join(shown.columns) + " |",
        "|" + "".join("---:|" if numeric else "---|" for numeric in numeric_columns(shown)),
    ]
    lines += [
        "| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |" for row in shown.itertuples(index=False)
    ]
    notes = shown.attrs.get("notes") or []
    return "\n".join(lines) + "\n" + "".join(f"\n{note}\n" for note in notes)


# A cell of numbers: 0.123, -4, 12.3 ± 0.4, 1.08x, 48 %, 0.000 [1], or n/a (not 3.11.9).
NUMBER_CELL = re.compile(r"^(n/a|[-+−]?\d+(\.\d+)?( ± \d+(\.\d+)?)?( ?%|x)?)( \[\d+\])?$")


def numeric_columns(shown: pd.DataFrame) -> list[bool]:
    """Which shown columns hold numbers (right-aligned): every cell a number, n/a or -."""
    cells = [[str(v) for v in shown.iloc[:, i]] for i in range(shown.shape[1])]
    return [
        any(v != NO_TEXT for v in column) and all(NUMBER_CELL.match(v) or v == NO_TEXT for v in column)
        for column in cells
    ]


def wrapping_columns(shown: pd.DataFrame) -> list[bool]:
    """Which shown columns hold prose that may wrap at its spaces (a reason, a strategy's
    name, a cluster): some cell longer than 18 characters with a space in it."""
    numeric = numeric_columns(shown)
    return [
        not numeric[i] and any(" " in str(v) and len(str(v)) > 18 for v in shown.iloc[:, i])
        for i in range(shown.shape[1])
    ]


TEX_SPECIALS = {
    "\\": r"\textbackslash{}",
    "&": r"\&",
    "%": r"\%",
    "_": r"\_",
    "#": r"\#",
    "$": r"\$",
    "{": r"\{",
    "}": r"\}",
    "~": r"\textasciitilde{}",
    "^": r"\textasciicircum{}",
    "±": r"$\pm$",
    "−": r"$-$",
    "≤": r"$\le$",
    "≥": r"$\ge$",
    "×": r"$\times$",
    "`": "",
}


def tex_escape(text: str) -> str:
    """Text for LaTeX: each special character replaced once (a replacement is not escaped
    again, so '±' stays the math symbol); Markdown's `code` becomes typewriter text."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(
        (r"\texttt{%s}" if i % 2 else "%s") % "".join(TEX_SPECIALS.get(char, char) for char in part)
        for i, part in enumerate(parts)
    )


def _tex_header(text: str, align: str, wrap: bool) -> str:
    """A header cell: in a column that wraps, its words; else stacked in lines of at most 11
    characters, so that a long name does not make its column of short numbers wide."""
    if wrap or len(text) <= 11:
        return TEX_HEADERS.get(text, tex_escape(text))
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= 11:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return (
        rf"\begin{{tabular}}[b]{{@{{}}{align}@{{}}}}"
        + r" \\ ".join(tex_escape(line) for line in lines)
        + r"\end{tabular}"
    )


def latex_table(
    shown: pd.DataFrame, n_published: int = 0, *, long: tuple[str, str] | None = None, rules_before=()
) -> str:
    """A booktabs fragment at the width of the text: prose columns wrap (tabularx X), numbers
    are right-aligned, long headers stacked; a rule separates the published rows from ours
    (and comes before each row index of `rules_before`). `long`: (caption, label) makes it a
    longtable, which breaks across pages, with its caption. The table's notes follow it."""
    numeric, wrap = numeric_columns(shown), wrapping_columns(shown)
    spec = "".join(
        r">{\raggedright\arraybackslash}X" if w else ("r" if n else "l") for n, w in zip(numeric, wrap, strict=False)
    )
    header_row = (
        " & ".join(
            _tex_header(str(c), "r" if n else "l", w) for c, n, w in zip(shown.columns, numeric, wrap, strict=False)
        )
        + r" \\"
    )
    rules = set(rules_before) | ({n_published} if n_published else set())
    body = []
    for i, row in enumerate(shown.itertuples(index=False)):
        if i in rules and i > 0:
            body.append(r"\midrule")
        body.append(" & ".join(tex_escape(str(v)) for v in row) + r" \\")
    notes = [
        rf"\multicolumn{{{shown.shape[1]}}}{{@{{}}p{{\linewidth}}@{{}}}}{{{tex_escape(note)}}} \\"
        for note in shown.attrs.get("notes") or []
    ]
    if long:
        caption, label = long
        # longtable has no X columns: prose columns get an equal share of what is left
        spec = spec.replace(
            r">{\raggedright\arraybackslash}X",
            r">{\raggedright\arraybackslash}p{%.2f\linewidth}" % (0.6 / max(1, sum(wrap))),
        )
        head = [r"\toprule", header_row, r"\midrule"]
        # its own size: it is \\input in the running text, not in a float that sets one
        return (
            "\n".join(
                [
                    r"\begingroup\small\setlength{\tabcolsep}{4pt}\setlength{\LTcapwidth}{\linewidth}",
                    r"\begin{longtable}{@{}" + spec + "@{}}",
                    rf"\caption{{{tex_escape(caption)}}}\label{{{label}}} \\",
                    *head,
                    r"\endfirsthead",
                    *head,
                    r"\endhead",
                    r"\bottomrule",
                    r"\endfoot",
                    *body,
                    *notes,
                    r"\end{longtable}",
                    r"\endgroup",
                ]
            )
            + "\n"
        )
    env = ("tabularx", r"{\linewidth}") if any(wrap) else ("tabular", "")
    return (
        "\n".join(
            [
                rf"\begin{{{env[0]}}}{env[1]}{{@{{}}{spec}@{{}}}}",
                r"\toprule",
                header_row,
                r"\midrule",
                *body,
                r"\bottomrule",
                *notes,
                rf"\end{{{env[0]}}}",
            ]
        )
        + "\n"
    )


def write_table(
    table: pd.DataFrame,
    decimals: dict[str, int],
    n_published: int,
    out_dir: Path,
    name: str,
    hide=(),
    csv: pd.DataFrame | None = None,
    **tex,
) -> pd.DataFrame:
    """Write NAME.csv (rounded numbers; or `csv` as it is), NAME.md and NAME.tex (latex_table's
    `tex` options); return the table as shown (the columns of `hide` left out)."""
    shown = formatted(table, decimals, hide)
    rounded = {**decimals, **{f"{c} sd": p for c, p in decimals.items() if f"{c} sd" in table}}
    with atomic_path(out_dir / f"{name}.csv") as tmp:
        (table.round(rounded) if csv is None else csv).to_csv(tmp, index=False)
    write_text(out_dir / f"{name}.md", markdown_table(shown))
    write_text(out_dir / f"{name}.tex", latex_table(shown, n_published, **tex))
    return shown


@dataclass(frozen=True, eq=False)
class Table:
    """One table of the report: its frame, the decimals it is shown with, the published rows
    that open it (a rule under them), the columns kept to its CSV (`hide`), a CSV of its own
    (`csv`: every comparison, where the table shows one row a pair) and latex_table's `tex`
    options."""

    frame: pd.DataFrame
    decimals: dict[str, int] = field(default_factory=dict)
    n_published: int = 0
    hide: tuple[str, ...] = ()
    csv: pd.DataFrame | None = None
    tex: dict = field(default_factory=dict)

    @cached_property
    def shown(self) -> pd.DataFrame:
        """As a reader sees it (formatted)."""
        return formatted(self.frame, self.decimals, self.hide)

    def write(self, out_dir: Path, name: str) -> None:
        write_table(self.frame, self.decimals, self.n_published, out_dir, name, self.hide, self.csv, **self.tex)


def time_to_accuracy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per run scored during training: when its AP first reached the target (training seconds,
    evaluations excluded, and iterations), or 'not reached'; its final AP beside it."""
    scored = summary[(summary["status"] == "ok") & (summary["data_mode"] == "real")]
    reached = scored["seconds_to_target"].notna()
    return pd.DataFrame(
        {
            "run_id": scored["run_id"],
            "target_ap": scored["target_ap"],
            "final_ap": scored["AP"],
            "reached after (s)": [
                f"{v:.1f}" if ok else ("no target set" if pd.isna(t) else "not reached")
                for v, ok, t in zip(scored["seconds_to_target"], reached, scored["target_ap"], strict=False)
            ],
            "iterations": [
                str(int(v)) if ok else "" for v, ok in zip(scored["iterations_to_target"], reached, strict=False)
            ],
            "training_seconds": scored["train_seconds"],
            "evaluation_seconds": scored["evaluation_seconds"],
        }
    ).reset_index(drop=True)


def loader_share(real: Spread, synthetic: Spread) -> tuple[float, str]:
    """The loader's share of the time, 1 - real / in-memory images/s, and a note where the
    measurement cannot be one. A loader costs time or nothing, so a negative share (the real
    loader's runs were the faster) is no share: it is shown as 0, with the measured value and
    whether the two throughputs differ beyond their noise (noise.difference)."""
    measured = 1 - real.mean / synthetic.mean
    if not measured < 0:  # NaN stays NaN
        return measured, ""
    d = difference(real, synthetic)
    why = (
        "within the noise: the loader's cost is too small to measure here"
        if d.verdict == "within the noise"
        else "not judged (fewer than 2 runs on a side): the loader's cost is too small to measure here"
        if d.verdict.startswith("not judged")
        else "beyond the noise: the in-memory runs were slower, which a loader cannot explain; check those runs"
    )
    interval = "" if math.isnan(d.low) else f" (95% interval of the difference {d.low:+.2f} to {d.high:+.2f} images/s)"
    return 0.0, (
        f"measured {measured:.3f}: the real loader's runs were {-measured:.1%} faster "
        f"than those on in-memory tensors{interval}, {why}; shown as 0"
    )


def data_mode_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per strategy, workers and batch run in both data modes: images/s with the real loader
    and with in-memory tensors (mean ± sd over seeds), and the loader's share of the time,
    1 - real / synthetic images/s (never below 0: loader_share, whose note says why)."""
    columns = [
        "strategy",
        "workers",
        "images_per_worker",
        "real n",
        "synthetic n",
        "real images/s",
        "real images/s sd",
        "synthetic images/s",
        "synthetic images/s sd",
        "loader share",
        "loader share note",
        "data wait (s/iter)",
    ]
    means = entry_means(summary, ["images_per_second", "time_data"])
    if means.empty:
        return pd.DataFrame(columns=columns)
    keys = ["strategy", "variant", "workers", "images_per_worker"]
    real = means[means["data_mode"] == "real"].set_index(keys)
    synthetic = means[means["data_mode"] == "synthetic"].set_index(keys)
    both = real.join(synthetic, how="inner", suffixes=("_real", "_synthetic"))
    rows = []
    for (strategy, variant, workers, per_worker), row in both.iterrows():
        share, note = loader_share(
            Spread(row["images_per_second_real"], row["images_per_second_sd_real"], int(row["n_real"])),
            Spread(row["images_per_second_synthetic"], row["images_per_second_sd_synthetic"], int(row["n_synthetic"])),
        )
        label = strategy_label(strategy, variant)
        rows.append(
            {
                "strategy": label,
                "workers": int(workers),
                "images_per_worker": int(per_worker),
                "real n": int(row["n_real"]),
                "synthetic n": int(row["n_synthetic"]),
                "real images/s": row["images_per_second_real"],
                "real images/s sd": row["images_per_second_sd_real"],
                "synthetic images/s": row["images_per_second_synthetic"],
                "synthetic images/s sd": row["images_per_second_sd_synthetic"],
                "loader share": share,
                "loader share note": note and f"{label}, {int(workers)} worker(s): {note}",
                "data wait (s/iter)": row["time_data_real"],
            }
        )
    return pd.DataFrame(rows, columns=columns)


# The noise comparisons (noise.comparisons: one row per pair and metric) as one compact table.
VERDICTS = {"beyond the noise": "beyond", "within the noise": "within"}
COMPARISON_CAPTION = (
    "Every pair of configurations a, b with the same number of workers and data mode: the "
    "ratio of their means over seeds (a/b) and whether their difference is beyond the "
    "run-to-run noise (Welch's 95% interval of the difference excludes 0), within it, or not "
    "judged (fewer than 2 runs on a side). Pairs beyond the noise come first. Means, spreads "
    "and intervals: comparisons.csv."
)


def comparison_pairs(compared: pd.DataFrame, metrics: dict[str, str]) -> tuple[pd.DataFrame, int]:
    """One row per pair of entries, and for each metric (column -> the name shown) the ratio
    a/b and the verdict (beyond, within, not judged; "-" where the pair has no value of it):
    the pairs beyond the noise in some metric first, the most different first, then those
    within it, then those not judged. Returns the table and how many pairs are beyond."""
    columns = ["a", "b", *[c for name in metrics.values() for c in (f"{name} a/b", f"{name} verdict")]]
    rows = []
    for (a, b), pair in compared.groupby(["a", "b"], sort=False):
        row = {"a": a, "b": b}
        for metric, name in metrics.items():
            found = pair[pair["metric"] == metric]
            row[f"{name} a/b"] = float(found["ratio"].iloc[0]) if len(found) else math.nan
            row[f"{name} verdict"] = VERDICTS.get(found["verdict"].iloc[0], "not judged") if len(found) else ""
        verdicts = [row[f"{name} verdict"] for name in metrics.values()]
        beyond = [
            abs(math.log(row[f"{name} a/b"]))
            for name in metrics.values()
            if row[f"{name} verdict"] == "beyond" and row[f"{name} a/b"] > 0
        ]
        row["_order"] = (0 if "beyond" in verdicts else 1 if "within" in verdicts else 2, -max(beyond, default=0.0))
        rows.append(row)
    rows.sort(key=lambda r: r["_order"])
    n_beyond = sum(r["_order"][0] == 0 for r in rows)
    return pd.DataFrame(rows, columns=columns), n_beyond
