"""The what-if command: the cost model asked about your own cluster. Its every number is a
PREDICTION, never a measurement, and says so (its first printed line, the CSV's `label` column).

    python -m pipeline.whatif --cluster examples/cluster-8x8.yaml --from results --preset demo
    python -m pipeline.whatif --cluster my.yaml --gpu-seconds-per-image 0.33 --gradient-bytes 166131544

The cluster is a YAML or JSON file with report.predict's cluster keys, or flags, or both (flags
win), checked as params.yaml's clusters are (schema.Cluster; costmodel/clusters.py `read_cluster`). One GPU's
compute and M, the gradient bytes, come from a finished preset's baseline `single` run, read as
the report reads it (a GPU run where there is one), or are given. Each strategy's curve is the
report's (report/clusters.py `prediction_points`, the same function), so this command and the
report's predicted_scaling_points.csv agree on the same cluster. The uncertainty band is the
model's record on that preset's multi-process runs (costmodel/ranking.py); like the compute, it is
fitted without the preset's held-out entries (params.yaml's `held_out: true`: report/holdout.py),
which the report predicts out of sample instead. It imports the
strategies' specs, the cost model and the report's loaders, never torch: it runs in seconds on
any machine.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from .config import cli, schema, stages
from .config.params import load, load_resolved
from .costmodel.clusters import EXAMPLE, Cluster, Compute, read_cluster
from .costmodel.plan import Recipe, plan
from .costmodel.ranking import Band, ranking
from .report.causes import split_by_norm
from .report.clusters import COLUMNS, measured_compute, prediction_points
from .report.holdout import fitted, modelled
from .report.load import RunDir, load_run
from .report.prediction import BOUND, prediction_frame, single_inputs
from .runtime.files import atomic_path
from .runtime.records.commbench import CommbenchRecord
from .strategies import sweep

LABEL = "PREDICTION (cost model, not measured)"
PLAN_COLUMNS = [  # the recipe at each GPU count (costmodel/plan.py), each with its band
    "recipe_epochs",
    "recipe_images",
    *(f"predicted_{what}{end}" for what in ("hours", "gpu_hours", "cost") for end in ("_low", "", "_high")),
    "predicted_memory_mib_per_gpu",
    "gpu_memory_mib",
    "fits_in_gpu_memory",
]
CSV_COLUMNS = [
    "label",
    *COLUMNS,
    "predicted_images_per_second_low",
    "predicted_images_per_second_high",
    "predicted_rank",
    "told_apart_from_next",
    *PLAN_COLUMNS,
]
CLUSTER_FLAGS = {  # report.predict's cluster keys, as flags: (type, help)
    "name": (str, "the cluster's name (default: the file's)"),
    "gpus_per_node": (int, "GPUs in each node"),
    "nodes": (int, "nodes"),
    "intra_gbit_s": (float, "bandwidth between two GPUs of a node, Gbit/s each way"),
    "intra_latency_us": (float, "latency between two GPUs of a node, microseconds"),
    "inter_gbit_s": (float, "bandwidth of a node's network, Gbit/s each way"),
    "inter_latency_us": (float, "latency between nodes, microseconds"),
    "spare_cpu_machines_per_node": (int, "CPU machines per node free to run parameter servers"),
    "gpu_memory_gib": (float, "each GPU's memory, GiB (the strategies that do not fit are named)"),
}


class WhatIfError(ValueError):
    """What the command was given cannot be predicted from; the message says what to give."""


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster", type=Path, help=f"a YAML or JSON cluster file, as {EXAMPLE}")
    for key, (kind, text) in CLUSTER_FLAGS.items():
        parser.add_argument(f"--{key.replace('_', '-')}", dest=key, type=kind, help=text + " (over the file's)")
    parser.add_argument(
        "--from",
        dest="results",
        type=Path,
        help="a results folder holding the finished preset (results/runs/<preset>/, "
        "results/commbench/<preset>/): its single run's compute, its runs' band",
    )
    parser.add_argument("--preset", help="the finished preset under --from (default: params.yaml's preset)")
    parser.add_argument(
        "--gpu-seconds-per-image",
        type=float,
        help="one GPU's measured forward + backward (+ data wait, optimizer) per image",
    )
    parser.add_argument(
        "--gpu-points",
        type=gpu_points,
        help="one GPU's measured step seconds at two or more batch sizes, IMAGES:SECONDS,... "
        "(2:0.0475,16:0.225): a fixed cost per step and a cost per image are fitted",
    )
    parser.add_argument(
        "--gpu-bundle",
        type=Path,
        help="a GPU check's JSON (benchmarks/gpu_check.py; benchmarks/measured/): its throughput "
        "rows at each batch size, of --precision, are the points",
    )
    parser.add_argument("--precision", default="fp32", help="the GPU bundle's rows to read (default fp32)")
    parser.add_argument("--gradient-bytes", type=float, help="M, the model's gradient bytes (with any of the above)")
    parser.add_argument("--images-per-gpu", type=int, help="images per GPU a step (default: report.predict's)")
    parser.add_argument("--gpus", type=int, help="the GPU count to rank at (default: the whole cluster)")
    parser.add_argument(
        "--params",
        type=Path,
        default=stages.ROOT / "params.yaml",
        help="params.yaml, for report.predict's comm hook and images per GPU",
    )
    parser.add_argument(
        "--price", type=float, help="the price of one GPU-hour, in your currency: the recipe's cost is predicted"
    )
    parser.add_argument("--epochs", type=int, help="the recipe's epochs (default: the preset's train.epochs)")
    parser.add_argument("--train-images", type=int, help="the recipe's training images (default: the preset's data)")
    parser.add_argument("--csv", type=Path, help="also write every GPU count's prediction here")


def finished_runs(results: Path, preset: str) -> tuple[list[RunDir], dict[int, CommbenchRecord]]:
    """The preset's finished runs (a summary and metrics each; an accuracy ablation's runs under
    the other norm left out, as the report leaves them out of its model: another model's
    compute) and its commbench records."""
    folder = results / "runs" / preset
    runs, _ = split_by_norm(
        [
            load_run(summary.parent)
            for summary in sorted(folder.glob("*/train_summary.json"))
            if (summary.parent / "metrics.json").is_file()
        ]
    )
    if not runs:
        raise WhatIfError(
            f"{folder}: no finished run (a train_summary.json and metrics.json); finish "
            f"the preset first (snakemake --cores all --config preset={preset}), or give "
            "one GPU's --gpu-seconds-per-image and --gradient-bytes instead of --from"
        )
    links = {
        found.processes: found
        for found in map(CommbenchRecord.read, sorted((results / "commbench" / preset).glob("p*.json")))
    }
    return runs, links


def held_out_entries(params: Path, preset: str) -> tuple[str, ...]:
    """The held-out entries of `preset` in params.yaml (none where it is not one of its presets:
    a results folder from elsewhere)."""
    if preset not in (load(params).get("presets") or {}):
        return ()
    return tuple(sweep.held_out(load_resolved(params, preset), str(params)))


def preset_compute(runs: list[RunDir], preset: str, where: Path) -> Compute:
    """The baseline `single` runs on a GPU, as the report's predicted scaling takes them
    (report/clusters.py gpu_compute); without one, those on the CPU, said in its source.
    `runs`: the fitted ones (no held-out entry's)."""
    singles = [s for s in single_inputs(runs) if s["baseline"]]
    on_gpu = [s for s in singles if s["device"].startswith("cuda")]
    if not singles:
        raise WhatIfError(
            f"{where}: no finished baseline `single` run with a time split, whose "
            "compute the model scales; finish one, or give --gpu-seconds-per-image "
            "and --gradient-bytes"
        )
    chosen = on_gpu or singles
    if not math.isfinite(chosen[0]["gradient_bytes"]):
        raise WhatIfError(
            f"{where}/{chosen[0]['run_id']}: its summary records no gradient bytes; "
            "give --gpu-seconds-per-image and --gradient-bytes"
        )
    note = "" if on_gpu else ": no GPU run, so the cluster's GPUs are taken as fast as it"
    return measured_compute(chosen, preset, note)


def gpu_points(text: str) -> dict[int, float]:
    """--gpu-points: IMAGES:SECONDS pairs, comma-separated, each a positive whole number of images
    and positive seconds."""
    points: dict[int, float] = {}
    for pair in text.split(","):
        images, _, seconds = pair.partition(":")
        try:
            count, value = int(images), float(seconds)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{pair!r} is not IMAGES:SECONDS (a whole number of images a step, its seconds), e.g. 2:0.0475"
            ) from None
        if count < 1 or not value > 0 or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{pair!r}: images must be 1 or more and seconds above 0")
        points[count] = value
    return points


def bundle_points(path: Path, precision: str) -> tuple[dict[int, float], dict[int, float], str]:
    """Step seconds per batch size from a GPU check's JSON: its throughput rows of `precision` on
    the tree it measured (the baseline: no compile, no other optimizer), images / images per
    second; and, where the rows recorded them, the peak memory past the state (peak_memory_mb
    less owned_state_mb, MiB) per batch size."""
    import json

    try:
        found = json.loads(path.read_text())
        runs = found["items"]["throughput"]["runs"]
    except OSError as err:
        raise WhatIfError(f"{path}: cannot read the GPU bundle ({err.strerror})") from err
    except (ValueError, KeyError, TypeError):
        raise WhatIfError(
            f"{path}: not a GPU check's JSON with throughput rows (items.throughput.runs); give the "
            "JSON benchmarks/gpu_check.py wrote (as in benchmarks/measured/)"
        ) from None
    rows = [
        row
        for row in runs
        if row.get("status") == "ok"
        and row.get("tree", "HEAD") == "HEAD"  # a comparison bundle's other tree is not this one
        and row.get("precision") == precision
        and not row.get("compile")
        and not row.get("optimizer")
        and row.get("images_per_second", 0) > 0
    ]
    if not rows:
        precisions = sorted({str(row.get("precision")) for row in runs})
        raise WhatIfError(f"{path}: no throughput row of precision {precision}; it has {', '.join(precisions)}")
    points = {int(row["images_per_gpu"]): row["images_per_gpu"] / row["images_per_second"] for row in rows}
    memory = {
        int(row["images_per_gpu"]): row["peak_memory_mb"] - row["owned_state_mb"]
        for row in rows
        if row.get("peak_memory_mb", 0) > row.get("owned_state_mb", math.inf)
    }
    return points, memory, f"{path.name} on {found.get('device', 'a GPU')}, {precision}"


def inputs(args: argparse.Namespace, predict: schema.Predict, preset: str) -> tuple[Compute, Band]:
    """One GPU's compute (given, or the preset's) and the band (the preset's runs, or the bound)."""
    offered = {
        "--gpu-seconds-per-image": args.gpu_seconds_per_image,
        "--gpu-points": args.gpu_points,
        "--gpu-bundle": args.gpu_bundle,
    }
    ways = [flag for flag, value in offered.items() if value is not None]
    if len(ways) > 1:
        raise WhatIfError(f"give one of {' and '.join(ways)}: each is one GPU's compute")
    given = (args.gpu_seconds_per_image, args.gradient_bytes)
    if bool(ways) != (given[1] is not None):
        raise WhatIfError(f"give {ways[0] if ways else '--gpu-seconds-per-image'} and --gradient-bytes together")
    if given[0] is not None and not (given[0] > 0 and given[1] > 0):
        raise WhatIfError(
            f"--gpu-seconds-per-image {given[0]:g} and --gradient-bytes {given[1]:g}: both must be above 0"
        )
    if given[1] is not None and not given[1] > 0:
        raise WhatIfError(f"--gradient-bytes {given[1]:g}: it must be above 0")
    if args.results is None and not ways:
        raise WhatIfError(
            "no compute to predict from: give --from RESULTS (a finished preset), or "
            "--gpu-seconds-per-image, --gpu-points or --gpu-bundle with --gradient-bytes"
        )
    runs: list[RunDir] = []
    links: dict[int, CommbenchRecord] = {}
    where: Path | None = None
    held: tuple[str, ...] = ()
    if args.results is not None:
        runs, links = finished_runs(args.results, preset)
        where = args.results / "runs" / preset
        found = {run.entry for run in runs}
        held = tuple(entry for entry in held_out_entries(args.params, preset) if entry in found)
    if given[0] is not None:
        compute = Compute(given[0], given[1], "given on the command line")
    elif args.gpu_points is not None:
        compute = Compute.of_points(args.gpu_points, given[1], "--gpu-points")
    elif args.gpu_bundle is not None:
        points, memory, source = bundle_points(args.gpu_bundle, args.precision)
        compute = Compute.of_points(points, given[1], source).with_activations(memory)
    else:
        assert where is not None  # without --from, the checks above stopped the command
        compute = preset_compute([run for run in runs if run.entry not in held], preset, where)
    frame = fitted(prediction_frame(runs, links, held), held) if runs else pd.DataFrame(columns=["ratio", "flag"])
    source = (
        f"{where}" + (f", its held-out {', '.join(held)} left out" if held else "") if where else "--from not given"
    )
    return compute, Band.of(list(frame[modelled(frame)]["ratio"]), BOUND, source)


def recipe_of(args: argparse.Namespace, preset: str) -> Recipe:
    """The recipe the hours are of: the preset's (params.yaml), with --epochs and --train-images
    over it; both flags where the preset is not one of params.yaml's."""
    for flag, value in (("--epochs", args.epochs), ("--train-images", args.train_images)):
        if value is not None and value < 1:
            raise WhatIfError(f"{flag} {value}: set it to 1 or more")
    if preset in (load(args.params).get("presets") or {}):
        found = Recipe.of(load_resolved(args.params, preset), preset)
    elif args.epochs is None or args.train_images is None:
        raise WhatIfError(
            f"--preset {preset}: not a preset of {args.params}, so its recipe is not known; give "
            "--epochs and --train-images (the training images of one epoch)"
        )
    else:
        return Recipe(args.epochs, args.train_images, "given on the command line")
    if args.epochs is None and args.train_images is None:
        return found
    return Recipe(
        args.epochs or found.epochs, args.train_images or found.images, f"{found.source}, with the flags given over it"
    )


def predicted_frame(
    points: pd.DataFrame,
    band: Band,
    recipe: Recipe,
    compute: Compute,
    per_gpu: int,
    gpu_memory_gib: float | None,
    price: float | None,
) -> pd.DataFrame:
    """The report's points, in its order, with the label, the band and the rank at their GPU
    count, and the recipe's hours, GPU-hours, cost and memory there (costmodel/plan.py)."""
    if price is not None and not (price >= 0 and math.isfinite(price)):
        raise WhatIfError(f"--price {price:g}: give the price of one GPU-hour, 0 or more")
    ranked = {
        (gpus, r.label): r
        for gpus, at in points.groupby("gpus")
        for r in ranking(dict(zip(at["model"], at["predicted_images_per_second"], strict=False)), band)
    }
    activations = compute.activation_mb(per_gpu)
    rows = []
    for row in points.to_dict("records"):
        r = ranked[row["gpus"], row["model"]]
        rate = (r.low, row["predicted_images_per_second"], r.high)
        found = plan(recipe, row["gpus"], rate, row["predicted_state_mb_per_gpu"], activations, gpu_memory_gib, price)
        cost = found.cost or (math.nan, math.nan, math.nan)
        rows.append(
            {
                "label": LABEL,
                **row,
                "predicted_images_per_second_low": r.low,
                "predicted_images_per_second_high": r.high,
                "predicted_rank": r.rank,
                "told_apart_from_next": r.apart_from_next,
                "recipe_epochs": recipe.epochs,
                "recipe_images": recipe.images,
                **{
                    f"predicted_{what}{end}": value
                    for what, values in (("hours", found.hours), ("gpu_hours", found.gpu_hours), ("cost", cost))
                    for end, value in zip(("_low", "", "_high"), values, strict=True)
                },
                "predicted_memory_mib_per_gpu": found.memory_mib,
                "gpu_memory_mib": gpu_memory_gib * 1024 if gpu_memory_gib is not None else math.nan,
                "fits_in_gpu_memory": found.fits,
            }
        )
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def described(spec: schema.Cluster, per_gpu: int) -> str:
    return (
        f"{spec.name}: {spec.gpus_per_node} GPU(s) per node x {spec.nodes} node(s); within "
        f"a node {spec.intra_gbit_s:g} Gbit/s, {spec.intra_latency_us:g} us; between nodes "
        f"{spec.inter_gbit_s:g} Gbit/s, {spec.inter_latency_us:g} us; "
        f"{spec.spare_cpu_machines_per_node} spare CPU machine(s) per node; {per_gpu} image(s) per GPU"
    )


def _figure(value: float) -> str:
    """3 significant digits, whole numbers from 100 on (1,234, not 1.23e+03)."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _banded(at: pd.DataFrame, what: str) -> list[str]:
    """'12.3 (10.1-15.0)' per row: a plan column and its band."""
    return [
        f"{_figure(mid)} ({_figure(low)}-{_figure(high)})"
        for low, mid, high in zip(
            at[f"predicted_{what}_low"], at[f"predicted_{what}"], at[f"predicted_{what}_high"], strict=True
        )
    ]


def memory_text(frame: pd.DataFrame, spec: schema.Cluster, per_gpu: int, compute: Compute) -> str:
    """How memory per GPU is predicted, and which strategies do not fit the cluster's GPUs."""
    activations = compute.activation_mb(per_gpu)
    how = (
        f"Memory per GPU (prediction): each strategy's state by its analysis plus one GPU's "
        f"activations at {per_gpu} image(s), {activations:.0f} MiB ({compute.source})"
        if math.isfinite(activations)
        else "Memory per GPU (prediction): each strategy's state by its analysis only; its "
        "activations were not measured (a GPU bundle with peak memory gives them), so it is a lower bound"
    )
    if spec.gpu_memory_gib is None:
        return how + "; the cluster states no gpu_memory_gib, so whether it fits is not checked."
    misfits = sorted(set(frame.loc[frame["fits_in_gpu_memory"].str.startswith("no"), "model"]))
    return (
        how
        + f"; against {spec.gpu_memory_gib:g} GiB per GPU: "
        + (f"does not fit for {', '.join(misfits)}." if misfits else "every strategy fits.")
    )


def printed(
    frame: pd.DataFrame,
    spec: schema.Cluster,
    per_gpu: int,
    compute: Compute,
    band: Band,
    gpus: int,
    recipe: Recipe,
    price: float | None,
) -> str:
    """What the command prints: the prediction's label and inputs, the ranking at `gpus` with the
    recipe's hours, GPU-hours and cost, and images/s at every GPU count."""
    at = frame[frame["gpus"] == gpus].sort_values("predicted_rank")
    table = pd.DataFrame(
        {
            "rank": at["predicted_rank"],
            "strategy": at["model"].str.ljust(at["model"].str.len().max()),
            "images/s": at["predicted_images_per_second"].map("{:.1f}".format),
            "band": [
                f"{lo:.1f}-{hi:.1f}"
                for lo, hi in zip(
                    at["predicted_images_per_second_low"], at["predicted_images_per_second_high"], strict=False
                )
            ],
            "efficiency": at["predicted_efficiency"].map("{:.0%}".format),
            "hours (band)": _banded(at, "hours"),
            "GPU-hours (band)": _banded(at, "gpu_hours"),
            **({"cost (band)": _banded(at, "cost")} if price is not None else {}),
            "MiB per GPU": at["predicted_memory_mib_per_gpu"].map("{:.0f}".format),
            "fits": at["fits_in_gpu_memory"],
            "apart from next": [
                ("yes" if apart else "no") if rank < len(at) else "-"
                for apart, rank in zip(at["told_apart_from_next"], at["predicted_rank"], strict=False)
            ],
            "collectives (NCCL's choice)": at["collectives"],
        }
    )
    missing = sorted(set(frame["model"]) - set(at["model"]))
    curves = frame.pivot_table(index="model", columns="gpus", values="predicted_images_per_second", sort=False)
    return "\n".join(
        [
            f"{LABEL}: {described(spec, per_gpu)}.",
            f"One GPU's compute: {compute.terms()}; gradient bytes M "
            f"{compute.gradient_bytes / 1e6:.1f} MB ({compute.source}).",
            *(
                [
                    f"{per_gpu} image(s) per GPU lies outside the batch sizes the compute was fitted at "
                    f"({', '.join(map(str, compute.fitted_images))}): its step is extrapolated."
                ]
                if compute.extrapolated(per_gpu)
                else []
            ),
            f"Uncertainty band: {band.source}; a measured rate is expected in [predicted / "
            f"{band.high:.2f}, predicted / {band.low:.2f}]; strategies whose bands overlap are not "
            "told apart.",
            f"The recipe: {recipe.epochs} epoch(s) of {recipe.images:,} training images ({recipe.source}); "
            "hours are its training steps at the predicted images/s (no evaluation, no start-up), "
            "GPU-hours those times the GPUs"
            + (f", cost the GPU-hours at {price:g} per GPU-hour" if price is not None else "")
            + f"; at {gpus} GPUs an epoch is {recipe.images / (gpus * per_gpu):.3g} steps of a global batch "
            f"of {gpus * per_gpu:,} images (the recipe's learning rate, scaled to it, is the user's to judge).",
            memory_text(at, spec, per_gpu, compute),
            f"Predicted ranking at {gpus} GPUs ({frame.loc[frame['gpus'] == gpus, 'nodes'].iloc[0]} node(s)):",
            table.to_string(index=False),
            *(
                [f"Not predicted at {gpus} GPUs (the strategy cannot run there): {', '.join(missing)}."]
                if missing
                else []
            ),
            "Predicted images/s at each GPU count:",
            curves.map(lambda rate: "-" if math.isnan(rate) else f"{rate:.1f}").to_string(),
            "(-: the strategy cannot run at that size)" if curves.isna().any().any() else "",
        ]
    ).rstrip()


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """Atomically; an existing file only where it is one this command wrote (its header)."""
    if path.exists() or path.is_symlink():
        try:
            with path.open() as handle:
                ours = handle.readline().rstrip("\n") == ",".join(CSV_COLUMNS)
        except (OSError, UnicodeDecodeError):
            ours = False
        if not ours or path.is_symlink():
            raise WhatIfError(
                f"{path}: exists and is not a CSV this command wrote, so it was left "
                "untouched; give --csv a new path, or move that file away"
            )
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def body(args: argparse.Namespace) -> str:
    spec = read_cluster(args.cluster, {key: getattr(args, key) for key in CLUSTER_FLAGS})
    config = load_resolved(args.params)  # report.predict; the preset need not be one of its own
    predict = config.report.predict.model_copy(update={"clusters": [spec]})
    if args.images_per_gpu is not None:
        if args.images_per_gpu < 1:
            raise WhatIfError(f"--images-per-gpu {args.images_per_gpu}: set it to 1 or more")
        predict = predict.model_copy(update={"images_per_gpu": args.images_per_gpu})
    compute, band = inputs(args, predict, args.preset or config.preset)
    cluster = Cluster.of(spec)
    gpus = args.gpus or cluster.gpus_per_node * cluster.nodes
    if gpus not in cluster.gpu_counts():
        raise WhatIfError(
            f"--gpus {gpus}: the model predicts {spec.name} at "
            f"{', '.join(map(str, cluster.gpu_counts()))} GPUs; use one of those"
        )
    recipe = recipe_of(args, args.preset or config.preset)
    frame = predicted_frame(
        prediction_points(predict, compute),
        band,
        recipe,
        compute,
        predict.images_per_gpu,
        spec.gpu_memory_gib,
        args.price,
    )
    text = printed(frame, spec, predict.images_per_gpu, compute, band, gpus, recipe, args.price)
    if args.csv is not None:
        write_csv(frame, args.csv)
        text += f"\nEvery GPU count's prediction: {args.csv}"
    print(text)
    return text


def main(argv: list[str] | None = None) -> None:
    cli.run_stage(
        "Predict each strategy's images/s, efficiency and memory per GPU on your own cluster "
        "(the cost model: predictions, not measurements).",
        body,
        arguments=arguments,
        errors=(ValueError, OSError),
        follows_parent=False,
        prog="python -m pipeline.whatif",
        argv=argv,
    )


if __name__ == "__main__":
    main()
