"""The study's two tables (published rows, then ours) and the report's other tables, as CSV,
Markdown and LaTeX. Our rows are sweep entries: the mean over their seeds, its spread and n.

No plotting here. The strategies' display names come from pipeline.strategies, which imports
torch, so that import waits until a table row needs a name.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..runtime.files import atomic_path, write_text
from .load import AP_COLUMNS, _number, strategy_label
from .noise import Spread

PUBLISHED_NAMES = {"dp": "DataParallel (DP)", "ddp": "DistributedDataParallel (DDP)"}
TEX_HEADERS = {"AP50": "AP$_{50}$", "AP75": "AP$_{75}$"}
# Each table column: (its key in the published values, its summary.csv column), with decimals.
AP_TABLE = {col: (col, col) for col in AP_COLUMNS}
AP_DECIMALS = {col: 3 for col in AP_COLUMNS}
TIME_TABLE = {"Time per iteration (s)": ("sec_per_iter", "sec_per_iter_mean"),
              "Progress per epoch": ("progress_per_epoch", "progress_per_epoch")}
TIME_DECIMALS = {col: 4 for col in TIME_TABLE}
SCALING_DECIMALS = {"images_per_second": 2, "speedup_vs_single": 3, "efficiency": 3}
TIME_TO_ACCURACY_DECIMALS = {"target_ap": 3, "final_ap": 3, "training_seconds": 1,
                             "evaluation_seconds": 1}
DATA_MODE_DECIMALS = {"real images/s": 2, "synthetic images/s": 2, "loader share": 3,
                      "data wait (s/iter)": 4}


def _method(row) -> str:
    from pipeline.strategies import STRATEGIES  # imports torch: only when a row is shown

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
        row = {"entry": entry, "strategy": first["strategy"], "variant": first["variant"],
               "workers": first["workers"], "global_batch": first["global_batch"],
               "images_per_worker": first["images_per_worker"], "data_mode": first["data_mode"],
               "n": len(group)}
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


def comparison_table(summary: pd.DataFrame, published: dict,
                     columns: dict[str, tuple[str, str]], preset: str,
                     dataset: str) -> pd.DataFrame:
    """Rows are methods: the published ones first (one run each, as the study reported), then
    one per sweep entry trained on real data (the study's layout), its values the mean over the
    entry's completed seeds with their standard deviation (COLUMN sd) and n. Entries without a
    value (runs on in-memory data are not scored) are left out.

    `columns` maps a table column to its key in the published values and its summary.csv column.
    """
    label = published.get("label", "published (2 GPUs, COCO 2017)")
    # The study's order (DP, then DDP): the config reaches us as key-sorted JSON.
    methods = [key for key in PUBLISHED_NAMES if isinstance(published.get(key), dict)]
    rows = [{"Method": PUBLISHED_NAMES[key], "Source": label, "n": 1,
             **{col: _number(published[key].get(key_pub)) for col, (key_pub, _) in columns.items()}}
            for key in methods]
    real = summary[summary["data_mode"] == "real"]
    means = entry_means(real, [key_csv for _, key_csv in columns.values()])
    for _, row in means.iterrows():
        if all(pd.isna(row[key_csv]) for _, key_csv in columns.values()):
            continue
        rows.append({"Method": _method(row), "Source": source_label(dataset, preset),
                     "n": int(row["n"]),
                     **{col: row[key_csv] for col, (_, key_csv) in columns.items()},
                     **{f"{col} sd": row[f"{key_csv}_sd"] for col, (_, key_csv) in columns.items()}})
    return pd.DataFrame(rows, columns=["Method", "Source", "n", *columns,
                                       *[f"{col} sd" for col in columns]])


def _formatted(table: pd.DataFrame, decimals: dict[str, int]) -> pd.DataFrame:
    """Numbers rounded for reading; a column with a `COLUMN sd` beside it shows 'mean ± sd'
    in one cell (the sd column itself stays in the CSV only)."""
    shown = table.astype(object)
    for col, places in decimals.items():
        values = [("n/a" if pd.isna(v) else f"{v:.{places}f}") for v in table[col]]
        if f"{col} sd" in table:
            values = [v + ("" if pd.isna(sd) else f" ± {sd:.{places}f}")
                      for v, sd in zip(values, table[f"{col} sd"])]
        shown[col] = values
    return shown.drop(columns=[c for c in table if c.endswith(" sd") and c[:-3] in decimals])


def markdown_table(shown: pd.DataFrame) -> str:
    lines = ["| " + " | ".join(shown.columns) + " |", "|" + "---|" * len(shown.columns)]
    lines += ["| " + " | ".join(str(v).replace("|", "\\|") for v in row) + " |"
              for row in shown.itertuples(index=False)]
    return "\n".join(lines) + "\n"


TEX_SPECIALS = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "_": r"\_", "#": r"\#",
                "$": r"\$", "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}",
                "^": r"\textasciicircum{}", "±": r"$\pm$"}


def _tex_escape(text: str) -> str:
    """Text for LaTeX: each special character replaced once (a replacement is not escaped
    again, so '±' stays the math symbol)."""
    return "".join(TEX_SPECIALS.get(char, char) for char in text)


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
    """Write NAME.csv (rounded numbers), NAME.md and NAME.tex; return the table as shown."""
    shown = _formatted(table, decimals)
    rounded = {**decimals, **{f"{c} sd": p for c, p in decimals.items() if f"{c} sd" in table}}
    with atomic_path(out_dir / f"{name}.csv") as tmp:
        table.round(rounded).to_csv(tmp, index=False)
    write_text(out_dir / f"{name}.md", markdown_table(shown))
    write_text(out_dir / f"{name}.tex", latex_table(shown, n_published))
    return shown


def time_to_accuracy_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per run scored during training: when its AP first reached the target (training seconds,
    evaluations excluded, and iterations), or 'not reached'; its final AP beside it."""
    scored = summary[(summary["status"] == "ok") & (summary["data_mode"] == "real")]
    reached = scored["seconds_to_target"].notna()
    return pd.DataFrame({
        "run_id": scored["run_id"], "target_ap": scored["target_ap"], "final_ap": scored["AP"],
        "reached after (s)": [f"{v:.1f}" if ok else ("no target set" if pd.isna(t) else "not reached")
                              for v, ok, t in zip(scored["seconds_to_target"], reached,
                                                  scored["target_ap"])],
        "iterations": [str(int(v)) if ok else "" for v, ok in
                       zip(scored["iterations_to_target"], reached)],
        "training_seconds": scored["train_seconds"],
        "evaluation_seconds": scored["evaluation_seconds"]}).reset_index(drop=True)


def data_mode_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per strategy, workers and batch run in both data modes: images/s with the real loader
    and with in-memory tensors (mean ± sd over seeds), and the loader's share of the time,
    1 - real / synthetic images/s."""
    columns = ["strategy", "workers", "images_per_worker", "real n", "synthetic n",
               "real images/s", "real images/s sd", "synthetic images/s",
               "synthetic images/s sd", "loader share", "data wait (s/iter)"]
    means = entry_means(summary, ["images_per_second", "time_data"])
    if means.empty:
        return pd.DataFrame(columns=columns)
    keys = ["strategy", "variant", "workers", "images_per_worker"]
    real = means[means["data_mode"] == "real"].set_index(keys)
    synthetic = means[means["data_mode"] == "synthetic"].set_index(keys)
    both = real.join(synthetic, how="inner", suffixes=("_real", "_synthetic"))
    rows = []
    for (strategy, variant, workers, per_worker), row in both.iterrows():
        rows.append({
            "strategy": strategy_label(strategy, variant),
            "workers": int(workers), "images_per_worker": int(per_worker),
            "real n": int(row["n_real"]), "synthetic n": int(row["n_synthetic"]),
            "real images/s": row["images_per_second_real"],
            "real images/s sd": row["images_per_second_sd_real"],
            "synthetic images/s": row["images_per_second_synthetic"],
            "synthetic images/s sd": row["images_per_second_sd_synthetic"],
            "loader share": 1 - row["images_per_second_real"] / row["images_per_second_synthetic"],
            "data wait (s/iter)": row["time_data_real"]})
    return pd.DataFrame(rows, columns=columns)
