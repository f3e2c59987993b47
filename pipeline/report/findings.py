"""The findings of each table and the definitions, in generated sentences: scaling, the data
modes, time to accuracy; how bytes are counted, what communication holds, what memory is. The
answer has its own module (answer.py). The HTML report and the paper (numbers.py writes the
sentences as LaTeX macros) read the same sentences, so no number is typed by hand anywhere and the
two cannot disagree.
"""

from __future__ import annotations

import pandas as pd

from ..strategies import REGISTERED

# torchvision's published box AP@[.5:.95] of fasterrcnn_resnet50_fpn (COCO_V1 weights) on COCO
# val2017, trained with its reference recipe (26 epochs): the model card's "box_map": 37.0.
TORCHVISION_BOX_AP = 0.370


def scaling_findings(scaling: pd.DataFrame) -> list[str]:
    rows = scaling[(scaling["workers"] > 1) & scaling["speedup_vs_single"].notna()]
    return [
        f"{row['strategy']} with {int(row['workers'])} workers: {row['images_per_second']:.2f} "
        f"images/s, {row['speedup_vs_single']:.2f}x single ({row['baseline']}), scaling "
        f"efficiency {row['efficiency']:.0%}."
        for _, row in rows.iterrows()
    ]


def data_mode_findings(table: pd.DataFrame) -> list[str]:
    return [
        f"{row['strategy']} with {row['workers']} worker(s): {row['real images/s']:.2f} "
        f"images/s with the loader, {row['synthetic images/s']:.2f} on in-memory tensors; "
        f"the loader costs {row['loader share']:.0%} of the throughput."
        for _, row in table.iterrows()
    ]


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
            found.append(
                f"{entry} reached AP {target:.3f} in {len(reached)} of {len(group)} runs, "
                f"after {reached.mean():.1f} s of training on average."
            )
    return found


def bytes_sentences() -> str:
    """How bytes per iteration compare with theory and how each strategy counts them, in the
    strategies' own words (Strategy.theory_text, bytes_counted): the report's and the paper's."""
    theory = "; ".join(cls.theory_text for cls in REGISTERED if cls.theory_text)
    counted = " ".join(cls.bytes_counted for cls in REGISTERED if cls.bytes_counted)
    return (
        "Bytes are per iteration for the rank that moves the most (sent + received), beside "
        f"the theory, for M bytes of gradients: {theory}. How they are counted differs. {counted}"
    )


def communication_definition() -> str:
    """What the time split's communication holds, strategy by strategy
    (Strategy.communication_timed): the report's definition and the paper's."""
    timed = "; ".join(f"{cls.label}: {cls.communication_timed}" for cls in REGISTERED if cls.communication_timed)
    inside = [cls.label for cls in REGISTERED if cls.communication_timed is None]
    within = (
        f"; {' and '.join(inside)} exchange inside the forward and backward passes, so their "
        "communication counts as compute and none is timed apart"
        if inside
        else ""
    )
    return (
        f"communication = the strategy's own exchange ({timed}){within}; in a synchronous "
        "strategy it includes the wait for the slower worker, as its exchange cannot end "
        "before the last worker's compute does"
    )


def memory_sentences() -> str:
    """What each strategy's busiest process holds by its analysis (Strategy.memory_text)."""
    held = "; ".join(f"{cls.label}: {cls.memory_text}" for cls in REGISTERED if cls.memory_text)
    return (
        "Memory is that of the process that holds the most: its peak (on a GPU the most its "
        "tensors held at once, torch.cuda.max_memory_allocated; on a CPU its peak resident "
        "set, the Python runtime and libraries included) and the parameters, gradients and "
        "optimizer state it owns, counted from its tensors, beside its strategy's analysis "
        f"for M bytes of gradients: {held}."
    )
