"""What the results say, in generated sentences, and every number the paper quotes, as LaTeX
macros (numbers.tex). The HTML report and the paper read the same sentences, so no number is
typed by hand anywhere and the two cannot disagree.

numbers.tex defines
  \\Preset, \\Dataset, \\RunCount, \\CompletedCount, \\EntryCount, \\TargetAP, \\NoiseRule,
  \\GitRevision, \\Hardware, \\TorchVersion
  \\published{dp|ddp}{KEY}   the study's published values (report.published), e.g. {dp}{AP50}
  \\TorchvisionAP             torchvision's published box AP of fasterrcnn_resnet50_fpn
  \\result{ENTRY}{COLUMN}     an entry's mean over its seeds of a summary.csv column, e.g.
                             \\result{ddp-w2-b4}{images_per_second}; COLUMN_sd its spread, n its runs
  \\ComparisonFindings, \\ScalingFindings, \\DataModeFindings, \\TimeToAccuracyFindings
                             itemized generated sentences (or a sentence saying there are none)
"""
from __future__ import annotations

import math

import pandas as pd

from .noise import NOISE_RULE
from .tables import _tex_escape, entry_means

# Columns of summary.csv whose per-entry mean (and sd) numbers.tex defines, with the decimals.
MACRO_COLUMNS = {"images_per_second": 2, "speedup_vs_single": 3, "sec_per_iter_mean": 4,
                 "time_data": 4, "time_compute": 4, "time_communication": 4,
                 "time_optimizer": 4, "AP": 3, "AP50": 3, "AP75": 3, "train_seconds": 1}


def scaling_findings(scaling: pd.DataFrame) -> list[str]:
    rows = scaling[(scaling["workers"] > 1) & scaling["speedup_vs_single"].notna()]
    return [f"{row['strategy']} with {int(row['workers'])} workers: {row['images_per_second']:.2f} "
            f"images/s, {row['speedup_vs_single']:.2f}x single ({row['baseline']}), scaling "
            f"efficiency {row['efficiency']:.0%}." for _, row in rows.iterrows()]


def data_mode_findings(table: pd.DataFrame) -> list[str]:
    return [f"{row['strategy']} with {row['workers']} worker(s): {row['real images/s']:.2f} "
            f"images/s with the loader, {row['synthetic images/s']:.2f} on in-memory tensors; "
            f"the loader costs {row['loader share']:.0%} of the throughput."
            for _, row in table.iterrows()]


def time_to_accuracy_findings(summary: pd.DataFrame) -> list[str]:
    scored = summary[(summary["status"] == "ok") & (summary["data_mode"] == "real")]
    if scored.empty or scored["target_ap"].isna().all():
        return []
    target = float(scored["target_ap"].iloc[0])
    found = []
    for entry, group in scored.groupby("entry", sort=False):
        reached = group["seconds_to_target"].dropna()
        if reached.empty:
            found.append(f"{entry} did not reach AP {target:.3f} in any of its {len(group)} runs.")
        else:
            found.append(f"{entry} reached AP {target:.3f} in {len(reached)} of {len(group)} runs, "
                         f"after {reached.mean():.1f} s of training on average.")
    return found


def _itemize(sentences: list[str], none: str) -> str:
    if not sentences:
        return _tex_escape(none)
    return ("\\begin{itemize}\n" + "".join(f"  \\item {_tex_escape(s)}\n" for s in sentences)
            + "\\end{itemize}")


def _macro(name: str, value: str) -> str:
    return f"\\newcommand{{\\{name}}}{{{value}}}\n"


def _provenance(runs: list[dict]) -> tuple[str, str, str]:
    """The git revision(s), hardware and torch version the completed runs recorded."""
    records = [run["summary"].provenance for run in runs if run["status"] == "ok"]
    revisions = sorted({p.get("git_revision", "none recorded") for p in records}) or ["none"]
    hardware = sorted({f"{(p.get('hardware') or {}).get('processor') or (p.get('hardware') or {}).get('machine', '?')}"
                       f", {(p.get('hardware') or {}).get('cpu_count', '?')} cores"
                       + (f", GPUs: {', '.join(p['hardware']['gpus'])}"
                          if (p.get("hardware") or {}).get("gpus") else ", no GPU")
                       for p in records}) or ["unknown"]
    torch = sorted({(p.get("packages") or {}).get("torch", "?") for p in records}) or ["?"]
    return ", ".join(revisions), "; ".join(hardware), ", ".join(torch)


def bytes_sentences() -> str:
    """How bytes per iteration compare with theory and how each strategy counts them, in the
    strategies' own words (Strategy.theory_text, bytes_counted): the report's and the paper's."""
    from pipeline.strategies import REGISTERED  # imports torch: only when the report is built

    theory = "; ".join(cls.theory_text for cls in REGISTERED if cls.theory_text)
    counted = " ".join(cls.bytes_counted for cls in REGISTERED if cls.bytes_counted)
    return ("Bytes are per iteration for the rank that moves the most (sent + received), beside "
            f"the theory, for M bytes of gradients: {theory}. How they are counted differs. {counted}")


def communication_definition() -> str:
    """What the time split's communication holds, strategy by strategy
    (Strategy.communication_timed): the report's definition and the paper's."""
    from pipeline.strategies import REGISTERED

    timed = "; ".join(f"{cls.label}: {cls.communication_timed}" for cls in REGISTERED
                      if cls.communication_timed)
    inside = [cls.label for cls in REGISTERED if cls.communication_timed is None]
    within = (f"; {' and '.join(inside)} exchange inside the forward and backward passes, so their "
              "communication counts as compute and none is timed apart" if inside else "")
    return f"communication = the strategy's own exchange ({timed}){within}"


def memory_sentences() -> str:
    """What each strategy's busiest process holds by its analysis (Strategy.memory_text)."""
    from pipeline.strategies import REGISTERED

    held = "; ".join(f"{cls.label}: {cls.memory_text}" for cls in REGISTERED if cls.memory_text)
    return ("Memory is that of the process that holds the most: its peak (on a GPU the most its "
            "tensors held at once, torch.cuda.max_memory_allocated; on a CPU its peak resident "
            "set, the Python runtime and libraries included) and the parameters, gradients and "
            "optimizer state it owns, counted from its tensors, beside its strategy's analysis "
            f"for M bytes of gradients: {held}.")


def numbers_tex(runs: list[dict], summary: pd.DataFrame, comparisons: pd.DataFrame,
                scaling: pd.DataFrame, data_modes: pd.DataFrame, preset: str,
                dataset: str, published: dict, torchvision_ap: float) -> str:
    done = summary[summary["status"] == "ok"]
    target = summary["target_ap"].dropna()
    revision, hardware, torch = _provenance(runs)
    out = ["% Generated by the report stage (pipeline/report/findings.py) from results/summary/<preset>.csv;\n"
           "% do not edit: rerun the workflow.\n",
           _macro("Preset", _tex_escape(preset)), _macro("Dataset", _tex_escape(dataset)),
           _macro("RunCount", str(len(summary))), _macro("CompletedCount", str(len(done))),
           _macro("EntryCount", str(done["entry"].nunique())),
           _macro("TargetAP", f"{float(target.iloc[0]):.3f}" if len(target) else "none set"),
           _macro("NoiseRule", _tex_escape(NOISE_RULE)),
           _macro("GitRevision", _tex_escape(revision)), _macro("Hardware", _tex_escape(hardware)),
           _macro("TorchVersion", _tex_escape(torch)),
           _macro("TorchvisionAP", f"{torchvision_ap:.3f}"),
           _macro("BytesCounted", _tex_escape(bytes_sentences())),
           _macro("CommunicationTimed", _tex_escape(communication_definition())),
           "\\newcommand{\\published}[2]{\\csname published@#1@#2\\endcsname}\n",
           "\\newcommand{\\result}[2]{\\csname result@#1@#2\\endcsname}\n"]
    out += [f"\\expandafter\\def\\csname published@{method}@{key}\\endcsname{{{value}}}\n"
            for method, values in sorted(published.items()) if isinstance(values, dict)
            for key, value in sorted(values.items())]
    means = entry_means(summary, list(MACRO_COLUMNS))
    for _, row in means.iterrows():
        values = {"n": str(int(row["n"]))}
        for column, places in MACRO_COLUMNS.items():
            for key in (column, f"{column}_sd"):
                if not (isinstance(row[key], float) and math.isnan(row[key])):
                    values[key] = f"{row[key]:.{places}f}"
        out += [f"\\expandafter\\def\\csname result@{row['entry']}@{key}\\endcsname{{{value}}}\n"
                for key, value in values.items()]
    out += [_macro("ComparisonFindings", _itemize(list(comparisons["statement"]),
                                                  "No two entries share a number of workers.")),
            _macro("ScalingFindings", _itemize(scaling_findings(scaling),
                                               "No run used more than one worker.")),
            _macro("DataModeFindings", _itemize(data_mode_findings(data_modes),
                                                "No entry ran in both data modes.")),
            _macro("TimeToAccuracyFindings", _itemize(time_to_accuracy_findings(summary),
                                                      "No target AP was set for this preset, or no "
                                                      "run evaluated during training."))]
    return "".join(out)


def parse_numbers(text: str) -> dict[tuple[str, str], str]:
    """(entry, column) -> value as written in numbers.tex: what tests compare with summary.csv."""
    import re

    return {(entry, key): value for entry, key, value in
            re.findall(r"\\csname result@([^@]+)@([^\\]+)\\endcsname\{([^}]*)\}", text)}
