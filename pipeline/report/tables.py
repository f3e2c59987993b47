"""The study's two tables (published rows, then ours) as CSV, Markdown and LaTeX.

No plotting here. The strategies' display names come from pipeline.strategies, which imports
torch, so that import waits until a table row needs a name.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..files import atomic_path, write_text
from .load import AP_COLUMNS, _number

PUBLISHED_NAMES = {"dp": "DataParallel (DP)", "ddp": "DistributedDataParallel (DDP)"}
TEX_HEADERS = {"AP50": "AP$_{50}$", "AP75": "AP$_{75}$"}
# Each table column: (its key in the published values, its summary.csv column), with decimals.
AP_TABLE = {col: (col, col) for col in AP_COLUMNS}
AP_DECIMALS = {col: 3 for col in AP_COLUMNS}
TIME_TABLE = {"Time per iteration (s)": ("sec_per_iter", "sec_per_iter_mean"),
              "Progress per epoch": ("progress_per_epoch", "progress_per_epoch")}
TIME_DECIMALS = {col: 4 for col in TIME_TABLE}
SCALING_DECIMALS = {"images_per_second": 2, "speedup_vs_single": 3, "efficiency": 3}


def _method(row) -> str:
    from pipeline.strategies import label  # imports torch: only when a row is shown

    workers = "?" if pd.isna(row["workers"]) else int(row["workers"])
    strategy = label(str(row["strategy"]))
    return f"{row['run_id']}: {strategy}, {workers} worker{'' if workers == 1 else 's'}"


def source_label(dataset: str, preset: str) -> str:
    """What our rows are: measured by this benchmark on `dataset`. Only COCO 2017 rows are
    comparable with the study's; the others say which data they come from."""
    if dataset == "coco2017":
        return f"this benchmark, COCO 2017 ({preset})"
    return f"this benchmark, {dataset} data, not COCO ({preset})"


def comparison_table(summary: pd.DataFrame, published: dict,
                     columns: dict[str, tuple[str, str]], preset: str,
                     dataset: str) -> pd.DataFrame:
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
        rows.append({"Method": _method(row), "Source": source_label(dataset, preset),
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
    """Write NAME.csv (rounded numbers), NAME.md and NAME.tex; return the table as shown."""
    shown = _formatted(table, decimals)
    with atomic_path(out_dir / f"{name}.csv") as tmp:
        table.round(decimals).to_csv(tmp, index=False)
    write_text(out_dir / f"{name}.md", markdown_table(shown))
    write_text(out_dir / f"{name}.tex", latex_table(shown, n_published))
    return shown
