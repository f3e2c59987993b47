"""Two sets of results side by side: two presets of one results tree, or one preset in two
trees (two clones at two revisions), entry by entry, with the noise rule's verdict.

    python -m pipeline.compare results results --preset-a demo --preset-b demo-quick
    python -m pipeline.compare ../before/results results --preset demo --csv compare.csv

Entries are matched by their name, the run id without its seed (ddp-w2-b4). For each entry and
metric (images/s, and AP where the runs were scored) it gives each side's mean over its seeds
with the 95 % t-interval of that mean, B's mean over A's, and the verdict of the report's noise
rule (pipeline/report/noise.py NOISE_RULE, pipeline/measure/stats.py `difference`): beyond the
noise, within it, or not judged where a side has fewer than 2 finished runs. Every finished run
under results/runs/<preset>/ counts (a skipped or failed one does not). It reads the run
summaries and metrics only, never torch: it runs in seconds on any machine.
"""

from __future__ import annotations

import argparse
import csv
import math
from dataclasses import dataclass
from pathlib import Path

from .config import cli
from .measure.stats import Difference, Spread, difference
from .report.load import RunDir, load_result
from .report.noise import NOISE_RULE
from .runtime.files import atomic_path

METRICS = {"images_per_second": ("images/s", 1), "AP": ("AP", 3)}  # name shown, decimals
CSV_COLUMNS = [
    "entry",
    "metric",
    "a_mean",
    "a_low",
    "a_high",
    "a_n",
    "b_mean",
    "b_low",
    "b_high",
    "b_n",
    "ratio",
    "difference_low",
    "difference_high",
    "verdict",
]


class CompareError(ValueError):
    """A path or preset that holds no results to compare; the message says what to give."""


@dataclass(frozen=True)
class Side:
    """One side of the comparison: a preset's finished runs in one results tree."""

    label: str  # A or B
    runs_dir: Path  # RESULTS/runs/<preset>
    runs: list[RunDir]

    def values(self, entry: str, metric: str) -> Spread:
        """`metric` over the entry's finished runs (AP: its scored runs), one per seed."""
        return Spread.of(value(run, metric) for run in self.runs if run.entry == entry and run.ok)

    @property
    def entries(self) -> list[str]:
        return list(dict.fromkeys(run.entry for run in self.runs))


def value(run: RunDir, metric: str) -> float | None:
    if metric == "AP":
        return run.metrics.AP if run.evaluated else None
    return getattr(run.summary, metric)


def presets_in(results: Path) -> list[str]:
    runs = results / "runs"
    if not runs.is_dir():
        raise CompareError(
            f"{results}: not a results tree (it has no runs/ folder); give the "
            "results/ folder of a finished workflow, e.g. `results` or "
            "`../other-clone/results`"
        )
    return sorted(p.name for p in runs.iterdir() if p.is_dir())


def side(label: str, results: Path, preset: str | None) -> Side:
    """RESULTS/runs/<preset>'s finished runs; the preset may be left out where the tree holds
    only one."""
    found = presets_in(results)
    if preset is None:
        if len(found) != 1:
            raise CompareError(
                f"{results}/runs holds {len(found)} presets ({', '.join(found) or 'none'}); "
                f"name one with --preset-{label.lower()} (or --preset for both sides)"
            )
        preset = found[0]
    runs_dir = results / "runs" / preset
    if preset not in found:
        raise CompareError(f"{runs_dir}: no such preset folder; {results}/runs holds {', '.join(found) or 'none'}")
    finished = sorted(d for d in runs_dir.iterdir() if (d / "train_summary.json").is_file())
    if not finished:
        raise CompareError(
            f"{runs_dir}: no finished run (no */train_summary.json); run the workflow for preset {preset} first"
        )
    return Side(label, runs_dir, [load_result(d) for d in finished])


def compare(a: Side, b: Side) -> list[dict]:
    """One row per entry and metric, A's entries first in their order, then B's own."""
    rows = []
    for entry in dict.fromkeys(a.entries + b.entries):
        for metric in METRICS:
            sa, sb = a.values(entry, metric), b.values(entry, metric)
            if metric == "AP" and sa.n == 0 and sb.n == 0:
                continue  # timed only (in-memory data), or never scored
            d = difference(sb, sa)  # B - A: B's ratio over A
            (a_low, a_high), (b_low, b_high) = sa.interval, sb.interval
            rows.append(
                {
                    "entry": entry,
                    "metric": metric,
                    "a_mean": sa.mean,
                    "a_low": a_low,
                    "a_high": a_high,
                    "a_n": sa.n,
                    "b_mean": sb.mean,
                    "b_low": b_low,
                    "b_high": b_high,
                    "b_n": sb.n,
                    "ratio": d.ratio,
                    "difference_low": d.low,
                    "difference_high": d.high,
                    "verdict": verdict(entry in a.entries, entry in b.entries, d),
                }
            )
    return rows


def verdict(in_a: bool, in_b: bool, d: Difference) -> str:
    """The noise rule's verdict, or why there is none: an entry one side did not sweep, or
    one whose runs there were all skipped or failed."""
    if not (in_a and in_b):
        return f"only in {'A' if in_a else 'B'}"
    missing = [label for label, spread in (("A", d.b), ("B", d.a)) if spread.n == 0]
    return f"no finished run in {' and '.join(missing)}" if missing else d.verdict


def shown(mean: float, low: float, high: float, n: int, places: int) -> str:
    """'35.1 [34.2, 36.0] n=3'; one run: its value and n=1; none: '-'."""
    if n == 0:
        return "-"
    interval = "" if math.isnan(low) else f" [{low:.{places}f}, {high:.{places}f}]"
    return f"{mean:.{places}f}{interval} n={n}"


def table(rows: list[dict], a: Side, b: Side) -> str:
    """What the command prints: both sides, the rule, then one line per entry and metric."""
    header = ["entry", "metric", "A: mean [95% interval] runs", "B: mean [95% interval] runs", "B/A", "verdict"]
    lines = [header]
    for row in rows:
        name, places = METRICS[row["metric"]]
        ratio = "" if math.isnan(row["ratio"]) else f"{row['ratio']:.3f}"
        lines.append(
            [
                row["entry"],
                name,
                shown(row["a_mean"], row["a_low"], row["a_high"], row["a_n"], places),
                shown(row["b_mean"], row["b_low"], row["b_high"], row["b_n"], places),
                ratio,
                row["verdict"],
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    body = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=False)).rstrip() for line in lines]
    return "\n".join(
        [
            f"A: {a.runs_dir} ({len(a.runs)} runs)",
            f"B: {b.runs_dir} ({len(b.runs)} runs)",
            f"verdict: {NOISE_RULE}",
            "",
            *body,
        ]
    )


def write_csv(rows: list[dict], path: Path) -> None:
    with atomic_path(path) as tmp, open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        writer.writerows(rows)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results_a", type=Path, metavar="RESULTS_A", help="a results/ folder (side A)")
    parser.add_argument("results_b", type=Path, metavar="RESULTS_B", help="a results/ folder (side B; may be the same)")
    parser.add_argument("--preset", help="the preset of both sides (default: the one each tree holds)")
    parser.add_argument("--preset-a", help="side A's preset (over --preset)")
    parser.add_argument("--preset-b", help="side B's preset (over --preset)")
    parser.add_argument("--csv", type=Path, help="also write the rows to this CSV file")


def body(args: argparse.Namespace) -> None:
    a = side("A", args.results_a, args.preset_a or args.preset)
    b = side("B", args.results_b, args.preset_b or args.preset)
    rows = compare(a, b)
    print(table(rows, a, b))
    if args.csv:
        write_csv(rows, args.csv)
        print(f"\nwritten: {args.csv}")


def main(argv: list[str] | None = None) -> None:
    cli.run_stage(
        "Put two presets, or one preset of two results trees, side by side, entry by "
        "entry, with the noise rule's verdict.",
        body,
        arguments=arguments,
        errors=(ValueError, OSError),
        follows_parent=False,
        prog="python -m pipeline.compare",
        argv=argv,
    )


if __name__ == "__main__":
    main()
