"""How the report's sentences say a number: a metric with numbers.tex's decimals, a ratio, a
size, a share, a duration, a count, a range, a list of names; and one numbers.tex macro. The
sentence modules (findings.py, answer.py, ranking.py, ranking_why.py, baseline_gap.py,
holdout.py) all say them alike through these.
"""

from __future__ import annotations

import math

from .tables import significant

# Columns of summary.csv whose per-entry mean (and sd) numbers.tex defines, with the decimals.
MACRO_COLUMNS = {
    "images_per_second": 2,
    "speedup_vs_single": 3,
    "sec_per_iter_mean": 4,
    "time_data": 4,
    "time_compute": 4,
    "time_communication": 4,
    "time_optimizer": 4,
    "AP": 3,
    "AP50": 3,
    "AP75": 3,
    "train_seconds": 1,
}


def macro(name: str, value: str) -> str:
    return f"\\newcommand{{\\{name}}}{{{value}}}\n"


def joined(items) -> str:
    """'a', 'a and b', 'a, b and c'."""
    items = list(items)
    if len(items) < 2:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def metric_text(value: float, metric: str) -> str:
    """As numbers.tex writes the metric (MACRO_COLUMNS' decimals)."""
    return f"{value:.{MACRO_COLUMNS[metric]}f}"


def times(ratio: float) -> str:
    return f"{ratio:.3f}x" if abs(ratio - 1) < 0.005 else f"{ratio:.2f}x"


def as_many(ratio: float, what: str, same: str = "as many") -> str:
    """'1.50x the bytes of' / 'as many bytes as' (the next word names the other)."""
    return f"{same} {what} as" if abs(ratio - 1) < 0.005 else f"{times(ratio)} the {what} of"


def byte_size(n_bytes: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n_bytes) >= scale:
            return f"{significant(n_bytes / scale)} {unit}"
    return f"{n_bytes:.0f} B"


def percent(fraction: float) -> str:
    return f"{fraction:.1%}" if fraction < 0.01 else f"{fraction:.0%}"


def duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def known(value) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def counted(n, thing: str) -> str:
    """'1 thread', '4 images'; 'n/a threads' where it was not recorded."""
    if not known(n):
        return f"n/a {thing}s"
    return f"{int(n)} {thing}" + ("" if int(n) == 1 else "s")


def span(values, places: int) -> str:
    """'0.064 to 0.067', or '0.064' where they show alike."""
    low, high = f"{min(values):.{places}f}", f"{max(values):.{places}f}"
    return low if low == high else f"{low} to {high}"


def bandwidth_text(gbit_s: float | None) -> str:
    """A fitted bandwidth, or why there is none: on a disturbed machine the fit's time per byte
    sits at its bound of 0 (more bytes no slower), which is no bandwidth at all."""
    if gbit_s is None or not math.isfinite(gbit_s) or gbit_s <= 0:
        return "no bandwidth resolved (the fit's time per byte sat at its bound of 0)"
    return f"{gbit_s:.1f} Gbit/s"
