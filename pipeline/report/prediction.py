"""Predicted against measured: every run's iteration rebuilt by the cost model
(pipeline/costmodel/predict.py) from what was measured elsewhere (the `single` runs' compute,
data wait and optimizer; the machine's links from the commbench stage) and set beside what the
run itself measured. A run the model misses by more than BOUND is flagged, not hidden.
Everything predicted is labelled as a prediction.

The compute input is `single`'s step: a fixed cost plus a cost per image, fitted from its runs at
two or more batch sizes (the demo runs `single` with `threads: 1` at 4 and 8 images a step for
its 2-process runs), or its time per image where it ran at one. On a CPU the processes of one
run share its cores, so it is taken from the `single` runs with as many threads as each process
had; without one, single's time is scaled by the ratio of threads (an assumption, named per
row). On GPUs each process has its own device. The terms and the runs they come from are
columns of every row (compute_input, compute_fixed_s, compute_per_image_s).
Either way `single` had the host to itself, and a run's processes share it: its compute a step
is single's plus what the runs of the other entries of as many processes computed a step over
single's at their batch (`in_run_overhead`: their median, its strategy's first, never its own
entry's, so that a held-out entry is predicted from the others); where there are none, single's
times the slowdown commbench measured with every process computing at once
(pipeline/commbench/shared_compute.py), 1 where that was not measured. On the demo's 2-core
machine the runs computed +8 to +15 ms a step over single at 2, 4 and 6 images a worker, where
commbench's factor on the model's step alone was x1.04. A commbench input that
stayed outside its band is not used silently (pipeline/report/disturbance.py): a disturbed
shared-compute factor is replaced by a quiet machine's (1 where the processes have the cores to
themselves), named per row; disturbed links and strategy timings are used, flagged; the
section's verdict says which inputs the model trusted.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Collection
from statistics import fmean
from typing import cast

import pandas as pd

from ..costmodel.clusters import Compute, steps_by_batch
from ..costmodel.network import Network, measured_network
from ..costmodel.predict import Iteration, iteration
from ..runtime.records.commbench import CommbenchRecord
from ..runtime.records.training import RunSummary
from ..strategies import lookup, recorded
from .disturbance import commbench_inputs, entry_repeats, shared_factor_disturbed, verdict
from .load import RunDir, is_baseline, required
from .wording import bandwidth_text

BOUND = 0.20  # |predicted / measured - 1| above this is a miss
ASSUMPTIONS = (
    "Predictions (cost model): data wait per image from the mean of the `single` runs in the "
    "same data mode; compute and optimizer from the `single` runs (on a CPU, those with the "
    "threads each of the run's processes had, as the processes share the cores; without one, "
    "single's time scaled by its threads over theirs, an assumption named in the table; a step's "
    "compute a fixed cost plus a cost per image, fitted where those runs took two or more batch "
    "sizes, else their time per image: the terms are in the table), plus the compute a step "
    "that the runs of the other entries of as many processes measured over single's (single "
    "had the host to itself; their median, the run's strategy first, never its own entry's), "
    "or, without such runs, times the slowdown of the model's forward + backward with all of "
    "the run's processes computing at once over one alone, which the commbench stage "
    "measured; the "
    "backward pass, which DDP's "
    "all-reduce overlaps, taken as 2/3 of compute; a synchronous step waits for its slowest "
    "worker: the expected maximum of N normal compute times, their variance that of one "
    "process's compute from one iteration to the next in the runs of as many processes the "
    "model is fitted on (half the variance of successive differences: a slowdown every process "
    "shares makes nobody wait), scaled to the worker's images (images taken as independent); "
    "without such runs, the variance commbench measured across its processes computing at "
    "once, else single's; communication from each strategy's own "
    f"model over the links the commbench stage fitted on this machine. A miss is a ratio off 1 "
    f"by more than {BOUND:.0%}."
)
COLUMNS = [
    "run_id",
    "entry",
    "strategy",
    "workers",
    "processes",
    "compute_input",
    "compute_fixed_s",
    "compute_per_image_s",
    "compute_overhead_s",
    "shared_compute_factor",
    "measured_images_per_second",
    "predicted_images_per_second",
    "ratio",
    "measured_communication_s",
    "predicted_communication_s",
    "predicted_in_step_communication_s",
    "communication_ratio",
    "speed_outlier",
    "flag",
]
COMMUNICATION_BOUND = 1.5  # predicted in-step communication within this factor of the measured


def single_inputs(runs: list[RunDir]) -> list[dict]:
    """Per ok `single` run with a time split: its data mode, threads, device, per-image
    compute and data seconds, the variance of compute per image (`compute_variance`), per-iteration
    optimizer seconds and images per iteration, its gradient bytes, and whether it is the
    baseline (not a variant such as pinned threads)."""
    found = []
    for run in runs:
        s = run.summary
        split = s.time_split
        if run.ok and s.strategy == "single" and split and split.compute:
            images = required(s.global_batch, f"{run.run_id}'s global_batch")
            gradient_bytes = s.ranks[0].gradient_bytes if s.ranks else None
            found.append(
                {
                    "run_id": run.run_id,
                    "mode": s.data_mode,
                    "threads": s.threads,
                    "device": str(s.device or "cpu"),
                    "baseline": is_baseline(s.strategy, s.variant),
                    "compute": split.compute / images,
                    "data": required(split.data, f"{run.run_id}'s data wait") / images,
                    "compute_variance": compute_variance(run) / images,
                    "optimizer": split.optimizer,
                    "images": images,
                    "gradient_bytes": math.nan if gradient_bytes is None else gradient_bytes,
                }
            )
    return found


def timed_compute(run: RunDir) -> pd.Series | None:
    """One iteration's compute seconds over the run's timed iterations (those its summary's
    statistics keep), in order; None where they were not recorded."""
    frame = run.iterations
    if frame is None or "time_compute" not in frame:
        return None
    return frame["time_compute"].iloc[run.summary.timing_excludes_first_iterations or 0 :].dropna()


def compute_variance(run: RunDir) -> float:
    """The variance of one iteration's compute seconds over the run's timed iterations; NaN
    where they were not recorded."""
    timed = timed_compute(run)
    return float(timed.var()) if timed is not None and len(timed) > 1 else math.nan


def compute_input(summary: RunSummary, singles: list[dict]) -> tuple[dict, str] | None:
    """single's inputs for one run and how they were chosen (None: no single run in its data
    mode). Data wait: from the `single` runs in the run's data mode. Compute and optimizer: on
    GPUs each process has its own device, so any `single` run; on a CPU the processes share
    the cores, so the `single` runs with the threads each process had, in any data mode (the
    model's work does not depend on it); without one, single's time scaled by its threads
    over the run's (the stated assumption, which overstates the cost of fewer threads where
    threads do not scale linearly). A step has a cost of its own besides its images' (held out
    at 2 images a worker, compute scaled per image from 4 predicted x1.16-1.25 too fast), so
    where those runs took two or more batch sizes, a step's compute is fitted as a fixed cost
    plus a cost per image (costmodel/clusters.py `Compute.of_points`) and taken at the run's
    images per worker; with one batch size, its time per image, scaled. The dict's
    `compute_fixed_s` and `compute_per_image_s` are the terms the model used."""
    mode, threads = summary.data_mode, max(1, summary.threads or 1)
    same_mode = [row for row in singles if row["mode"] == mode]
    if not same_mode:
        return None
    same_threads = [row for row in singles if row["threads"] == threads]
    if str(summary.device or "cpu").startswith("cuda"):
        chosen, scale, how = same_mode, 1.0, "single on its GPU"
    elif same_threads:
        chosen, scale, how = same_threads, 1.0, f"single at {threads} thread(s), measured"
    else:
        most = max(row["threads"] for row in same_mode)
        chosen = [row for row in same_mode if row["threads"] == most]
        scale, how = most / threads, f"single at {most} thread(s), scaled x{most / threads:.2g} (assumption)"
    per_worker = required(summary.images_per_worker, f"{summary.run_id}'s images_per_worker")
    fixed, per_image, how = compute_terms(chosen, per_worker, how)
    return (
        {
            "compute": (fixed / per_worker + per_image) * scale,
            "compute_fixed_s": fixed * scale,
            "compute_per_image_s": per_image * scale,
            "compute_variance": fmean(row["compute_variance"] for row in chosen) * scale**2,
            "optimizer": fmean(row["optimizer"] for row in chosen) * scale,
            "data": fmean(row["data"] for row in same_mode),
        },
        how,
    )


def compute_terms(chosen: list[dict], per_worker: int, how: str) -> tuple[float, float, str]:
    """A step's compute as (fixed seconds, seconds per image) from the chosen `single` runs, and
    `how` said further: fitted where they took two or more batch sizes (each size's mean step),
    else their mean time per image."""
    steps = steps_by_batch(chosen, lambda row: row["compute"] * row["images"])
    sizes = sorted(steps)
    if len(sizes) < 2:
        said = f"{sizes[0]} images a step" if sizes[0] == per_worker else f"per image of {sizes[0]} a step"
        return 0.0, fmean(row["compute"] for row in chosen), f"{how}, {said}"
    fitted = Compute.of_points(steps, math.nan, how)
    outside = f", extrapolated to {per_worker}" if fitted.extrapolated(per_worker) else ""
    return (
        fitted.fixed_seconds,
        fitted.seconds_per_image,
        f"{how}, fitted at {'/'.join(map(str, sizes))} images a step: "
        f"{fitted.fixed_seconds * 1e3:.2f} ms a step + {fitted.seconds_per_image * 1e3:.2f} ms per image{outside}",
    )


def shared_factor(commbench: CommbenchRecord | None) -> float:
    """How much slower a process computes beside the others of its run (commbench's
    `shared_compute`); 1 where it was not measured; where commbench marked it disturbed, the
    factor of a quiet machine (its `expected`: 1 where the processes have the cores to
    themselves) in its place."""
    shared = commbench.shared_compute if commbench else None
    if shared is None:
        return 1.0
    return shared.expected if shared.disturbed else shared.factor


def predict_run(
    summary: RunSummary, single: dict, network: Network | None, shared: float = 1.0, jitter: float = math.nan
) -> Iteration:
    """The cost model's iteration for one run (its summary), from single's inputs, the host's
    network, the slowdown `shared` of compute beside the run's other processes and the
    variance per image of one process's compute in runs of as many processes (`jitter`:
    process_jitter's; NaN: none measured)."""
    run = recorded(required(summary.run, f"{summary.run_id}'s run"))
    per_worker = required(summary.images_per_worker, f"{summary.run_id}'s images_per_worker")
    return iteration(
        lookup(summary.strategy),
        run,
        compute=single["compute"] * per_worker * shared,
        # None (a run before gradient bytes were recorded) is read only with a network, so it
        # passes through unchecked as before.
        gradient_bytes=cast(float, summary.ranks[0].gradient_bytes),
        network=network,
        variance_per_image=single["compute_variance"] * shared**2,
        images_per_worker=per_worker,
        images=required(summary.global_batch, f"{summary.run_id}'s global_batch"),
        data=single["data"] * per_worker,
        optimizer=single["optimizer"],
        run_variance_per_image=jitter,
    )


def process_jitter(runs: list[RunDir]) -> dict[int, float]:
    """Process count -> the variance per image of one process's compute, with every process of
    a run computing: the mean over the ok runs of that many processes whose strategy waits for
    the slowest worker and keeps its exchange out of compute (fsdp's compute holds its
    gathers), each from its first worker's iterations, half the variance of successive
    differences over its images a step. Successive differences leave out a slowdown that lasts
    many iterations (another job, a slower phase), which every process shares and which makes
    nobody wait; what one process's compute does from one step to the next is what the wait
    follows (the runs' own jitter put their measured communication at x0.71-0.97 of
    the exchange plus that wait, on the demo)."""
    found: dict[int, list[float]] = {}
    for run in runs:
        s, compute = run.summary, timed_compute(run)
        if not run.ok or not s.processes or s.processes < 2 or compute is None:
            continue
        strategy = lookup(s.strategy)
        if strategy.communication_timed is None or not strategy.waits_for_slowest(recorded(required(s.run, s.run_id))):
            continue
        if len(compute) > 2 and s.images_per_worker:
            found.setdefault(s.processes, []).append(float(compute.diff().dropna().var()) / 2 / s.images_per_worker)
    return {processes: fmean(variances) for processes, variances in found.items()}


def in_run_overheads(runs: list[RunDir], singles: list[dict]) -> list[dict]:
    """Per ok run of more than one process whose strategy keeps its exchange out of compute (as
    process_jitter): its measured compute a step over what `single` computes at its images a
    step (compute_input's fitted step), in seconds, with its entry, strategy and process count.
    single had the host to itself; a run's processes compute beside each other's exchange and
    loaders, and on the demo's 2-core machine that cost about the same a step at 2, 4 and 6
    images a worker (+8 to +15 ms), where commbench's factor, taken on the model's step alone,
    saw x1.04."""
    found = []
    for run in runs:
        s = run.summary
        split = s.time_split
        if not run.ok or not s.processes or s.processes < 2 or not split or not split.compute:
            continue
        if lookup(s.strategy).communication_timed is None or not s.images_per_worker:
            continue
        chosen = compute_input(s, singles)
        if chosen is None:
            continue
        step = chosen[0]["compute"] * s.images_per_worker
        found.append(
            {
                "entry": run.entry,
                "strategy": s.strategy,
                "processes": s.processes,
                "seconds": split.compute - step,
            }
        )
    return found


def in_run_overhead(summary: RunSummary, entry: str, overheads: list[dict]) -> tuple[float, str] | None:
    """A run's compute overhead a step beside its other processes, from the runs of the other
    entries of as many processes (never its own: their median, those of its strategy where there
    are any), and how it was chosen; None where there are none."""
    others = [o for o in overheads if o["processes"] == summary.processes and o["entry"] != entry]
    mine = [o for o in others if o["strategy"] == summary.strategy]
    chosen = mine or others
    if not chosen:
        return None
    seconds = statistics.median(o["seconds"] for o in chosen)
    whose = f"of {summary.strategy}'s other entries" if mine else "of the other entries"
    median = f"the median of {len(chosen)} runs {whose}"
    return seconds, f"{seconds * 1e3:+.1f} ms a step beside its other processes ({median})"


def measured_communication(summary: RunSummary) -> float:
    """The run's communication seconds per iteration, as its time split timed them: the mean
    over its workers' own splits (each process keeps one), as the predicted wait is the mean
    worker's (the first worker alone waits for the second in one iteration and not in the
    next: the two differed up to 3x in one run); the first worker's where the ranks kept none.
    NaN where its strategy exchanges inside the forward and backward
    (Strategy.communication_timed None: the split holds them in compute) or the split was off."""
    split = summary.time_split
    if lookup(summary.strategy).communication_timed is None or not split or split.communication is None:
        return math.nan
    workers = [rank.time_split for rank in summary.ranks if rank.role != "server"]
    if workers and all(s is not None and s.communication is not None for s in workers):
        return fmean(cast(float, s.communication) for s in workers if s is not None)
    return split.communication


def prediction_frame(
    runs: list[RunDir], commbench: dict[int, CommbenchRecord], held_out: Collection[str] = ()
) -> pd.DataFrame:
    """One row per ok run with more than one process: predicted and measured images/s and
    communication seconds, their ratio, and a flag where the model misses by more than BOUND.
    `commbench`: process count -> that stage's JSON. `held_out`: entry ids the model is fitted
    without (none of their runs is an input), then predicts (report/holdout.py)."""
    fitted = [run for run in runs if run.entry not in held_out]
    inputs, jitter, rows = single_inputs(fitted), process_jitter(fitted), []
    overheads = in_run_overheads(fitted, inputs)
    outliers = {run_id for repeats in entry_repeats(runs) for run_id, _ in repeats.outliers}
    for run in runs:
        s = run.summary
        chosen = compute_input(s, inputs) if run.ok else None
        if s.processes is None or s.processes < 2 or chosen is None:
            continue
        single, how = chosen
        bench = commbench.get(s.processes)
        network = measured_network(bench)
        shared = shared_factor(bench)
        overhead = in_run_overhead(s, run.entry, overheads)
        if overhead is not None:  # measured in the runs themselves: commbench's factor not applied
            shared, (extra, said) = 1.0, overhead
            per_worker = required(s.images_per_worker, f"{s.run_id}'s images_per_worker")
            single = {**single, "compute": single["compute"] + extra / per_worker, "compute_overhead_s": extra}
            how = f"{how}; {said}"
        elif bench is not None and bench.shared_compute is not None and shared_factor_disturbed(bench):
            disturbed = bench.shared_compute.factor
            how = f"{how}; shared-compute factor x{shared:g} assumed (commbench's x{disturbed:.3f} disturbed)"
        predicted = predict_run(s, single, network, shared, jitter.get(s.processes, math.nan))
        measured = s.images_per_second
        ratio = predicted.images_per_second / measured if measured else math.nan
        flag = (
            "no commbench for this process count"
            if network is None
            else "the strategy states no cost model"
            if math.isnan(predicted.communication)
            else ""
            if abs(ratio - 1) <= BOUND
            else f"missed by more than {BOUND:.0%}"
        )
        rows.append(
            {
                "run_id": run.run_id,
                "entry": run.entry,
                "strategy": s.strategy,
                "workers": s.workers,
                "processes": s.processes,
                "compute_input": how,
                "compute_fixed_s": single["compute_fixed_s"],
                "compute_per_image_s": single["compute_per_image_s"],
                "compute_overhead_s": single.get("compute_overhead_s", math.nan),
                "shared_compute_factor": shared,
                "measured_images_per_second": measured,
                "predicted_images_per_second": predicted.images_per_second,
                "ratio": ratio,
                "measured_communication_s": measured_communication(s),
                "predicted_communication_s": predicted.communication,
                **in_step_columns(predicted, measured_communication(s)),
                "speed_outlier": run.run_id in outliers,
                "flag": flag,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS)


def in_step_columns(predicted: Iteration, measured: float) -> dict:
    """The predicted in-step communication, like for like with what the run measured as
    communication (the exchange its time split counts, and the wait for the slowest worker it
    holds), and predicted over measured (NaN where either is missing)."""
    in_step = predicted.in_step_communication
    return {
        "predicted_in_step_communication_s": in_step,
        "communication_ratio": in_step / measured if measured and measured > 0 else math.nan,
    }


def communication_by_entry(frame: pd.DataFrame) -> pd.DataFrame:
    """Per entry with a timed communication: its predicted in-step communication beside the
    median of what its runs measured, the runs whose speed was an outlier among the entry's
    seeds (report/disturbance.py) aside, and their ratio. The same entry's runs must cost the
    same, so their median is the entry's measurement; one run's moves 2-4x between seeds on a
    busy 2-core machine, as its wait for the slower worker follows that run's compute jitter."""
    timed = frame[frame["communication_ratio"].notna() & ~frame["speed_outlier"].astype(bool)]
    rows = [
        {
            "entry": entry,
            "runs": len(group),
            "measured_communication_s": float(group["measured_communication_s"].median()),
            "predicted_in_step_communication_s": float(group["predicted_in_step_communication_s"].median()),
        }
        for entry, group in timed.groupby("entry", sort=False)
    ]
    found = pd.DataFrame(
        rows, columns=["entry", "runs", "measured_communication_s", "predicted_in_step_communication_s"]
    )
    found["communication_ratio"] = found["predicted_in_step_communication_s"] / found["measured_communication_s"]
    return found


def communication_within(frame: pd.DataFrame) -> tuple[int, int]:
    """(within COMMUNICATION_BOUND, judged): the entries whose predicted in-step communication is
    within the factor of their runs' median measured (communication_by_entry)."""
    ratios = communication_by_entry(frame)["communication_ratio"].dropna()
    return (int(((ratios <= COMMUNICATION_BOUND) & (ratios >= 1 / COMMUNICATION_BOUND)).sum()), len(ratios))


def entry_ratios(frame: pd.DataFrame) -> str:
    """Each judged entry's predicted over measured in-step communication, in words."""
    return ", ".join(
        f"{row.entry} x{row.communication_ratio:.2f} ({row.predicted_in_step_communication_s * 1e3:.1f} ms "
        f"against {row.measured_communication_s * 1e3:.1f} over {row.runs} run{'s' if row.runs > 1 else ''})"
        for row in communication_by_entry(frame).itertuples()
    )


DECIMALS = {
    "compute_fixed_s": 4,
    "compute_per_image_s": 4,
    "compute_overhead_s": 4,
    "shared_compute_factor": 3,
    "measured_images_per_second": 2,
    "predicted_images_per_second": 2,
    "ratio": 3,
    "measured_communication_s": 4,
    "predicted_communication_s": 4,
    "predicted_in_step_communication_s": 4,
    "communication_ratio": 3,
}

IN_STEP_TEXT = (
    "A run measures as communication what its strategy's time split counts (below, per "
    "strategy); in a synchronous strategy that includes the wait for the slower worker, since "
    "the exchange cannot end before the last worker's compute. So the predicted in-step "
    "communication beside it is the exchange the run times (for zero: the all-reduce, its "
    "broadcast counting as optimizer), predicted over the links plus the fixed costs below, "
    "plus the predicted wait for the slowest worker (prediction)."
)


def in_step_rows(commbench: dict[int, CommbenchRecord]) -> list[str]:
    """One sentence per process count where commbench timed the exchange inside a step: each
    term, as measured on this machine."""
    rows = []
    for n, found in sorted(commbench.items()):
        terms = found.shared_compute.in_step if found.shared_compute else None
        if terms is None:
            continue
        hooks = ", ".join(f"{hook} {seconds * 1e9:.2f} ns" for hook, seconds in terms.hook_s_per_byte.items())
        rows.append(
            f"{n} processes, each computing the model's forward + backward of {terms.images} "
            f"images: the wait for the slower worker {terms.wait_s * 1e3:.1f} ms measured "
            f"(slowest_wait's formula from the variance of compute with every process at once: "
            f"{(terms.formula_wait_s or math.nan) * 1e3:.1f} ms; that variance "
            f"{terms.variance_s2 * 1e6:.0f} ms², alone {terms.alone_variance_s2 * 1e6:.0f} ms²); "
            f"contention of a bucket's all-reduce with compute x{terms.contention:.2f} its "
            f"back-to-back time; a fixed cost of {terms.bucket_s * 1e3:.2f} ms per DDP bucket "
            f"(the plain hook's work included; DDP's buckets of the model: "
            f"{' + '.join(f'{b / 2**20:.2f}' for b in terms.buckets)} MiB) and "
            f"{terms.message_s * 1e3:.2f} ms per point-to-point message; the hooks' own work per "
            f"byte of a bucket: {hooks}" + "".join(f"; {term} {why}" for term, why in (terms.untrusted or {}).items())
        )
    return rows


def link_rows(commbench: dict[int, CommbenchRecord]) -> list[str]:
    """One sentence per fitted primitive and process count, one per strategy timed on the
    model, and one per shared-compute timing."""
    links = [
        f"{n} processes, {name} over {found.backend}: "
        f"latency {prim.alpha_s * 1e6:.1f} us, {bandwidth_text(prim.bandwidth_gbit_s)} (fit R² "
        f"{prim.r2:.3f}, worst relative residual {max(map(abs, prim.relative_residuals)):.2f})"
        + (f"; not trusted: {prim.untrusted}" if prim.untrusted else "")
        for n, found in sorted(commbench.items())
        for name, prim in found.primitives.items()
    ]
    timed = [
        f"{n} processes, {name} timed on the model (forward + backward of {found.calibrations.images} "
        "images, every process at once): "
        + ", ".join(f"{key.removesuffix('_s')} {seconds * 1e3:.1f} ms" for key, seconds in by_setting.items())
        for n, found in sorted(commbench.items())
        if found.calibrations
        for name, by_setting in found.calibrations.strategies.items()
    ]
    return (
        links
        + timed
        + [
            f"{n} processes computing at once: forward + backward of {shared.images} "
            f"images {required(shared.alone_s, f'{n} processes alone_s') * 1e3:.1f} ms alone, "
            f"{required(shared.together_s, f'{n} processes together_s') * 1e3:.1f} ms "
            f"together (x{shared.factor:.3f})"
            for n, found in sorted(commbench.items())
            if (shared := found.shared_compute)
        ]
    )


def section(shown: pd.DataFrame, frame: pd.DataFrame, commbench: dict[int, CommbenchRecord]) -> dict:
    """The report's section: the assumptions, the measured links, the table, and every miss."""
    misses = [
        f"{row.run_id}: predicted {row.predicted_images_per_second:.1f} images/s against "
        f"{row.measured_images_per_second:.1f} measured (x{row.ratio:.2f}): {row.flag}"
        for row in frame.itertuples()
        if row.flag
    ]
    within = int((frame["flag"] == "").sum())
    close, judged_communication = communication_within(frame)
    terms = in_step_rows(commbench)
    judged = verdict(commbench) if commbench else ""
    caveat = (
        " Not all of the model's inputs were trusted (above): read this count with care."
        if any(i.status != "trusted" for i in commbench_inputs(commbench))
        else ""
    )
    return {
        "title": "Predicted against measured (cost model)",
        "text": [
            ASSUMPTIONS,
            "The machine's links, as the commbench stage measured and fitted them, and "
            "its compute shared between processes: "
            + (
                "; ".join(link_rows(commbench))
                if commbench
                else "none measured (no run of more than one process on one node)"
            )
            + ".",
            *([f"The model's verdict on these inputs: {judged}"] if judged else []),
            IN_STEP_TEXT + " The terms inside a step, as the commbench stage measured them on this "
            "machine: "
            + (
                "; ".join(terms)
                if terms
                else "not measured (a commbench JSON from before they were; rerun the commbench stage)"
            )
            + ".",
            f"{close} of {judged_communication} multi-process entries with a timed communication have "
            f"their predicted in-step communication within {COMMUNICATION_BOUND:g}x of the measured: "
            "the median over the entry's seeds, a seed whose speed was an outlier among them aside, "
            "each run's the mean over its workers (communication_ratio, per run: predicted over "
            "measured)" + (f"; {entries}" if (entries := entry_ratios(frame)) else "") + ".",
            f"{within} of {len(frame)} multi-process runs are within {BOUND:.0%} of the model.{caveat} "
            "Predictions are the model's, not measurements. Also prediction.csv and the prediction "
            "figure.",
        ],
        "table": shown,
        "bullets": misses or ["No run missed the bound."],
    }
