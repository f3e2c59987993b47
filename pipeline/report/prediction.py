"""Predicted against measured: every run's iteration rebuilt by the cost model from what was
measured elsewhere (the `single` runs' compute, data wait and optimizer; the machine's links
from the commbench stage) and set beside what the run itself measured. A run the model misses
by more than BOUND is flagged, not hidden. Everything predicted is labelled as a prediction.

The compute input is `single`'s seconds per image. On a CPU the processes of one run share its
cores, so a process with fewer threads than `single` had computes proportionally slower (the
assumption stated in the report); on GPUs each process has its own device.
"""
from __future__ import annotations

import math

import pandas as pd

from ..costmodel import Iteration, Link

BOUND = 0.20  # |predicted / measured - 1| above this is a miss
BACKWARD_SHARE = 2 / 3  # of forward + backward: what DDP's all-reduce can overlap with
ASSUMPTIONS = (
    "Predictions (cost model): compute, data wait and optimizer per image from the mean of the "
    "`single` runs in the same data mode; on a CPU scaled by single's threads over the run's "
    "threads per process (the processes share the cores); the backward pass, which DDP's "
    "all-reduce overlaps, taken as 2/3 of compute; communication from each strategy's own "
    f"model over the links the commbench stage fitted on this machine. A miss is a ratio off 1 "
    f"by more than {BOUND:.0%}.")
COLUMNS = ["run_id", "entry", "strategy", "workers", "processes", "measured_images_per_second",
           "predicted_images_per_second", "ratio", "measured_communication_s",
           "predicted_communication_s", "flag"]


def links_of(commbench: dict | None) -> dict[str, Link]:
    """primitive -> Link, from one commbench JSON (empty without one)."""
    if not commbench:
        return {}
    return {name: Link(p["alpha_s"], p["beta_s_per_byte"])
            for name, p in commbench["primitives"].items()}


def single_inputs(runs: list[dict]) -> dict[str, dict]:
    """data mode -> per-image compute and data seconds, per-iteration optimizer seconds and
    threads, averaged over the ok `single` runs."""
    found: dict[str, list[dict]] = {}
    for run in runs:
        s = run["summary"]
        if run["status"] == "ok" and s.get("strategy") == "single" and s.get("time_split", {}).get("compute"):
            per_image = s["global_batch"]
            found.setdefault(s.get("data_mode", "real"), []).append({
                "compute": s["time_split"]["compute"] / per_image,
                "data": s["time_split"]["data"] / per_image,
                "optimizer": s["time_split"]["optimizer"], "threads": s["threads"]})
    return {mode: {k: sum(r[k] for r in rows) / len(rows) for k in rows[0]}
            for mode, rows in found.items()}


def predict_run(summary: dict, single: dict, links: dict[str, Link]) -> Iteration:
    """The cost model's iteration for one run (its summary), from single's inputs and links."""
    from pipeline.strategies import lookup  # imports torch: only when a prediction is made

    run = (summary.get("provenance") or {}).get("run") or {}
    run = {**run, "workers": summary["workers"]}
    scale = 1.0 if str(summary.get("device", "cpu")).startswith("cuda") else (
        single["threads"] / max(1, summary.get("threads") or 1))
    per_worker = summary["images_per_worker"]
    compute = single["compute"] * per_worker * scale
    grad_bytes = summary["ranks"][0]["gradient_bytes"]
    communication = lookup(summary["strategy"]).communication_seconds(
        run, grad_bytes, links, compute * BACKWARD_SHARE) if links else math.nan
    return Iteration(compute=compute, data=single["data"] * per_worker * scale,
                     optimizer=single["optimizer"] * scale, communication=communication,
                     images=summary["global_batch"])


def prediction_frame(runs: list[dict], commbench: dict[int, dict]) -> pd.DataFrame:
    """One row per ok run with more than one process: predicted and measured images/s and
    communication seconds, their ratio, and a flag where the model misses by more than BOUND.
    `commbench`: process count -> that stage's JSON."""
    inputs, rows = single_inputs(runs), []
    for run in runs:
        s = run["summary"]
        mode = s.get("data_mode", "real")
        if run["status"] != "ok" or (s.get("processes") or 1) < 2 or mode not in inputs:
            continue
        links = links_of(commbench.get(s["processes"]))
        predicted = predict_run(s, inputs[mode], links)
        measured = s["images_per_second"]
        ratio = predicted.images_per_second / measured if measured else math.nan
        flag = ("no commbench for this process count" if not links else
                "the strategy states no cost model" if math.isnan(predicted.communication) else
                "" if abs(ratio - 1) <= BOUND else f"missed by more than {BOUND:.0%}")
        rows.append({"run_id": run["run_id"], "entry": run["entry"], "strategy": s["strategy"],
                     "workers": s["workers"], "processes": s["processes"],
                     "measured_images_per_second": measured,
                     "predicted_images_per_second": predicted.images_per_second, "ratio": ratio,
                     "measured_communication_s": (s.get("time_split") or {}).get("communication", math.nan),
                     "predicted_communication_s": predicted.communication, "flag": flag})
    return pd.DataFrame(rows, columns=COLUMNS)


DECIMALS = {"measured_images_per_second": 2, "predicted_images_per_second": 2, "ratio": 3,
            "measured_communication_s": 4, "predicted_communication_s": 4}


def link_rows(commbench: dict[int, dict]) -> list[str]:
    """One sentence per fitted primitive and process count."""
    return [f"{n} processes, {name} over {found['backend']}: latency {prim['alpha_s'] * 1e6:.1f} us, "
            f"{(prim['bandwidth_gbit_s'] or math.nan):.1f} Gbit/s (fit R² {prim['r2']:.3f}, worst "
            f"relative residual {max(map(abs, prim['relative_residuals'])):.2f})"
            for n, found in sorted(commbench.items()) for name, prim in found["primitives"].items()]


def section(shown: pd.DataFrame, frame: pd.DataFrame, commbench: dict[int, dict]) -> dict:
    """The report's section: the assumptions, the measured links, the table, and every miss."""
    misses = [f"{row.run_id}: predicted {row.predicted_images_per_second:.1f} images/s against "
              f"{row.measured_images_per_second:.1f} measured (x{row.ratio:.2f}): {row.flag}"
              for row in frame.itertuples() if row.flag]
    within = int((frame["flag"] == "").sum())
    return {"title": "Predicted against measured (cost model)", "text": [
        ASSUMPTIONS, "The machine's links, as the commbench stage measured and fitted them: "
        + ("; ".join(link_rows(commbench)) if commbench else "none measured (no run of more than "
                                                             "one process on one node)") + ".",
        f"{within} of {len(frame)} multi-process runs are within {BOUND:.0%} of the model. "
        "Predictions are the model's, not measurements. Also prediction.csv and the prediction "
        "figure."], "table": shown, "bullets": misses or ["No run missed the bound."]}
