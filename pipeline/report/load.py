"""Reading run directories into frames, and the metrics derived from them.

Only pandas here, no plotting: benchmark scripts import one metric from this module without
paying for matplotlib and seaborn.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from ..runtime.files import read_json

SUMMARY_COLUMNS = [
    "run_id", "entry", "seed", "data_mode", "preset", "strategy", "variant", "workers",
    "processes", "images_per_worker",
    "global_batch", "lr", "device", "backend", "threads", "status", "reason", "images_per_second",
    "speedup_vs_single", "sec_per_iter_mean", "sec_per_iter_p50", "sec_per_iter_p95",
    "time_data", "time_compute", "time_communication", "time_optimizer", "communication_share",
    "busiest_rank_bytes_per_iter", "busiest_rank_theory_bytes_per_iter", "replicas_identical",
    "progress_per_epoch", "AP", "AP50", "AP75", "APs", "APm", "APl", "train_seconds",
    "evaluation_seconds", "target_ap", "seconds_to_target", "iterations_to_target",
    "checkpoint_seconds", "checkpoints", "restarts", "resumed_at_steps"]
INTEGER_COLUMNS = ["seed", "workers", "processes", "images_per_worker", "global_batch", "threads",
                   "iterations_to_target", "checkpoints", "restarts"]
TRAFFIC_COLUMNS = ["run_id", "rank", "role", "sent_per_iter", "received_per_iter",
                   "theory_sent_per_iter", "theory_received_per_iter", "gradient_bytes"]
AP_COLUMNS = ["AP", "AP50", "AP75"]
TIME_SPLIT = ["data", "compute", "communication", "optimizer"]
# Kept beside progress_per_epoch so the report's definition cannot drift from the code.
PROGRESS_DEFINITION = (
    "training progress per epoch = mean decrease of the epoch-mean total training loss per epoch, "
    "(L_1 - L_E) / (E - 1) for E epochs with epoch-mean losses L_1..L_E; undefined (n/a) for a "
    "single epoch. The published study did not define its measure, so its values are quoted, "
    "not recomputed.")


def progress_per_epoch(epoch_loss: list[float]) -> float:
    """Training progress per epoch: the mean per-epoch decrease of the epoch-mean total loss.

    (epoch_loss[0] - epoch_loss[-1]) / (n_epochs - 1); NaN with fewer than two epochs, where no
    decrease can be measured. Positive means the loss went down.
    """
    if len(epoch_loss) < 2:
        return math.nan
    return (epoch_loss[0] - epoch_loss[-1]) / (len(epoch_loss) - 1)


def _read_input(path: Path) -> dict:
    """read_json, plus the remedy for a missing file and a check that it holds an object."""
    try:
        data = read_json(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: file not found; run the train and evaluate stages for "
                                "this run first (snakemake --cores all)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(data).__name__}; "
                         "delete it and rerun the stage that writes it")
    return data


def read_iterations(path: Path) -> pd.DataFrame:
    """iterations.jsonl as a frame, naming the file and line of any broken record."""
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found; the run says it finished, so delete "
                                "its run directory and rerun its training")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}: line {number} is not valid JSON ({err.msg}); delete "
                                 "the run directory and rerun its training") from err
    if not records:
        raise ValueError(f"{path}: no iteration records in a finished run; delete the run "
                         "directory and rerun its training")
    return pd.DataFrame.from_records(records)


def load_run(run_dir: str | Path) -> dict:
    """The three inputs of one run directory: train summary, metrics and (if ok) the iterations."""
    run_dir = Path(run_dir)
    summary = _read_input(run_dir / "train_summary.json")
    metrics = _read_input(run_dir / "metrics.json")
    status, reason = summary.get("status", "failed"), summary.get("reason", "")
    # A run trained on in-memory tensors is timed, not scored: it stays a completed run.
    evaluated = metrics.get("status", "ok") == "ok"
    if status == "ok" and not evaluated and summary.get("data_mode") != "synthetic":
        status, reason = metrics["status"], metrics.get("reason", "")  # evaluation failed
    if status == "ok" and evaluated and any(metrics.get(k) is None for k in AP_COLUMNS):
        raise ValueError(f"{run_dir / 'metrics.json'}: no AP values for a completed run; delete "
                         "it and rerun the evaluate stage")
    iterations = read_iterations(run_dir / "iterations.jsonl") if status == "ok" else None
    utilisation = run_dir / "utilisation.jsonl"  # absent for runs made before the sampler
    samples = ([json.loads(line) for line in utilisation.read_text().splitlines() if line.strip()]
               if status == "ok" and utilisation.exists() else [])
    run_id = summary.get("run_id", run_dir.name)
    return {"dir": run_dir, "run_id": run_id, "entry": summary.get("entry", run_id),
            "status": status, "reason": reason or "", "evaluated": status == "ok" and evaluated,
            "summary": summary, "metrics": metrics, "iterations": iterations,
            "utilisation": samples}


def has_variant(variant) -> bool:
    return isinstance(variant, str) and bool(variant)  # read back from CSV, '' becomes NaN


def strategy_label(strategy: str, variant, data_mode: str = "real") -> str:
    """How tables and figures name an entry's strategy: ps-dedicated-k2, ddp (synthetic data)."""
    return (strategy + (f"-{variant}" if has_variant(variant) else "")
            + ("" if data_mode == "real" else f" ({data_mode} data)"))


def is_baseline(strategy, variant) -> bool:
    """The runs every speed-up is measured against, as their strategy declares
    (Strategy.is_baseline: `single` as configured, not a variant of it)."""
    from pipeline.strategies import STRATEGIES  # imports torch: only when runs are compared

    declared = STRATEGIES.get(strategy)
    return declared is not None and declared.is_baseline(variant if has_variant(variant) else "")


def baseline_mask(frame: pd.DataFrame) -> pd.Series:
    """Which rows of a frame with strategy and variant columns are baseline runs."""
    return pd.Series([is_baseline(s, v) for s, v in zip(frame["strategy"], frame["variant"])],
                     index=frame.index, dtype=bool)


def workers_of(record: dict):
    """The run's count of workers; run directories written before the rename say `world_size`."""
    return record.get("workers", record.get("world_size"))


def _number(value) -> float:
    """NaN for missing values and for COCO's -1 ('no objects of that size'), so means stay honest."""
    return math.nan if value is None or value == -1 else float(value)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def busiest_rank_bytes(summary: dict, key: str) -> float:
    """Bytes sent plus received per iteration by the rank that moves the most (the server, for
    a parameter server; any rank, for all-reduce)."""
    totals = [r[key]["sent"] + r[key]["received"] for r in summary.get("ranks") or []]
    return max(totals) if totals else math.nan


def traffic_frame(runs: list[dict]) -> pd.DataFrame:
    rows = [{"run_id": run["run_id"], "rank": r["rank"], "role": r["role"],
             "sent_per_iter": r["bytes_per_iteration"]["sent"],
             "received_per_iter": r["bytes_per_iteration"]["received"],
             "theory_sent_per_iter": r["theory_bytes_per_iteration"]["sent"],
             "theory_received_per_iter": r["theory_bytes_per_iteration"]["received"],
             "gradient_bytes": r["gradient_bytes"]}
            for run in runs if run["status"] == "ok" for r in run["summary"].get("ranks") or []]
    return pd.DataFrame(rows, columns=TRAFFIC_COLUMNS)


def dataset_of(runs: list[dict]) -> str:
    """The data the runs trained on (data.name in their provenance); 'unknown' if none says."""
    names = {((run["summary"].get("provenance") or {}).get("params") or {}).get("data", {}).get("name")
             for run in runs}
    names.discard(None)
    return ", ".join(sorted(names)) or "unknown"


def scaling_frame(summary: pd.DataFrame) -> pd.DataFrame:
    """Throughput against the number of workers, per strategy (and variant) and data mode: the
    mean images/s over each entry's seeds, the speed-up over `single` in the same data mode, and
    the scaling efficiency, speed-up / workers (1.0 is linear). The baseline is the `single`
    entry at the same global batch where there is one (strong scaling: the same work per
    iteration, the demo's sweep), else the one with the same images per worker (weak scaling:
    the batch grows with the workers, the COCO recipe's sweep)."""
    done = summary[summary["status"] == "ok"]
    keys = ["entry", "strategy", "variant", "data_mode", "workers", "global_batch",
            "images_per_worker"]
    means = (done.groupby("entry", sort=False)
             .agg(**{k: (k, "first") for k in keys[1:]},
                  images_per_second=("images_per_second", "mean"),
                  images_per_second_sd=("images_per_second", "std"), n=("run_id", "count"))
             .reset_index())
    single = means[baseline_mask(means)]
    by_batch = {(m, b): v for m, b, v in zip(single["data_mode"], single["global_batch"],
                                              single["images_per_second"])}
    by_per_worker = {(m, p): v for m, p, v in zip(single["data_mode"], single["images_per_worker"],
                                                  single["images_per_second"])}
    baselines = [("same global batch", by_batch[(m, b)]) if (m, b) in by_batch else
                 ("same images per worker", by_per_worker[(m, p)]) if (m, p) in by_per_worker else
                 ("no single run", math.nan)
                 for m, b, p in zip(means["data_mode"], means["global_batch"],
                                    means["images_per_worker"])]
    speedup = means["images_per_second"].to_numpy() / [value for _, value in baselines]
    frame = pd.DataFrame({
        "strategy": [strategy_label(s, v, mode) for s, v, mode in
                     zip(means["strategy"], means["variant"], means["data_mode"])],
        "workers": means["workers"].astype("Int64").to_numpy(),
        "global_batch": means["global_batch"].astype("Int64").to_numpy(),
        "n": means["n"].to_numpy(),
        "images_per_second": means["images_per_second"].to_numpy(),
        "images_per_second sd": means["images_per_second_sd"].to_numpy(),
        "speedup_vs_single": speedup,
        "efficiency": speedup / means["workers"].astype(float).to_numpy(),
        "baseline": [name for name, _ in baselines]})
    return frame.sort_values(["strategy", "workers"], kind="stable").reset_index(drop=True)


def time_to_target(evaluations: list[dict], target: float | None) -> tuple[float, float]:
    """(training seconds, iterations) when the run's evaluations during training first reached
    AP >= target; NaN for no target, no evaluations, or never reached."""
    if target is None:
        return math.nan, math.nan
    for record in evaluations:
        if record["AP"] >= target:
            return float(record["train_seconds"]), float(record["step"])
    return math.nan, math.nan


def summary_frame(runs: list[dict], preset: str, target_ap: float | None = None) -> pd.DataFrame:
    """One row per run; `target_ap` (report.target_ap of the preset) for the time to reach it."""
    rows = []
    # Speed-up is against `single` (the mean over its seeds) at the same global batch and in the
    # same data mode: the same work per iteration.
    single: dict[tuple, list[float]] = {}
    for r in runs:
        s = r["summary"]
        if r["status"] == "ok" and is_baseline(s.get("strategy"), s.get("variant")):
            key = (s.get("data_mode", "real"), s.get("global_batch"))
            single.setdefault(key, []).append(_number(s.get("images_per_second")))
    for run in runs:
        s, m = run["summary"], run["metrics"]
        times = s.get("sec_per_iter") or {}
        split = s.get("time_split") or {}
        to_target = time_to_target(s.get("evaluations") or [], target_ap)
        rows.append({
            "run_id": run["run_id"], "entry": run["entry"], "preset": preset,
            "seed": s.get("seed", (s.get("provenance") or {}).get("seed")),
            "data_mode": s.get("data_mode", "real"),
            **{k: s.get(k) for k in ("strategy", "variant", "processes", "images_per_worker",
                                     "global_batch", "lr", "device", "backend", "threads")},
            "workers": workers_of(s),
            "status": run["status"], "reason": run["reason"],
            "images_per_second": _number(s.get("images_per_second")),
            "speedup_vs_single": _number(s.get("images_per_second")) / _mean(
                single.get((s.get("data_mode", "real"), s.get("global_batch")), [])),
            **{f"sec_per_iter_{k}": _number(times.get(k)) for k in ("mean", "p50", "p95")},
            **{f"time_{k}": _number(split.get(k)) for k in TIME_SPLIT},
            "communication_share": _number(s.get("communication_share")),
            "busiest_rank_bytes_per_iter": busiest_rank_bytes(s, "bytes_per_iteration"),
            "busiest_rank_theory_bytes_per_iter": busiest_rank_bytes(s, "theory_bytes_per_iteration"),
            "replicas_identical": s.get("replicas_identical"),
            "progress_per_epoch": progress_per_epoch(s.get("epoch_loss") or []),
            **{k: _number(m.get(k)) for k in AP_COLUMNS + ["APs", "APm", "APl"]},
            "train_seconds": _number(s.get("train_seconds")),
            "evaluation_seconds": _number(s.get("evaluation_seconds")),
            "target_ap": _number(target_ap), "seconds_to_target": to_target[0],
            "iterations_to_target": to_target[1],
            # How the run survived faults: checkpoint cost, torchrun's restarts, where it resumed
            "checkpoint_seconds": _number((s.get("checkpoints") or {}).get("seconds")),
            "checkpoints": (s.get("checkpoints") or {}).get("count"),
            "restarts": s.get("restarts"),
            "resumed_at_steps": " ".join(map(str, s.get("resumed_at_steps") or []))})
    frame = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)  # the columns fix the order, not the dicts
    # Integer counts stay integers (2, not 2.0) even when a skipped run leaves them empty
    for col in INTEGER_COLUMNS:
        frame[col] = pd.to_numeric(frame[col]).astype("Int64")
    return frame
