"""Predicted scaling where the hardware stops: images/s and scaling efficiency against GPUs on
the hypothetical clusters of `report.predict` (params.yaml), for each strategy's cost model.

One GPU's compute is measured where `single` runs of `report.predict.compute.preset` ran on a
GPU (their summaries, with M, the gradient bytes: a fixed cost per step plus a cost per image
where they ran at two or more batch sizes, their time per image at one); otherwise the stated assumption of
params is used, and the report says which. Communication is each strategy's own model
(`Strategy.communication_seconds` over a `costmodel.Network` of the cluster), predicted by
pipeline/costmodel/predict.py; this module makes its frames, table and sentences. Every number
here is a prediction and is labelled as one; the measured runs are marked beside the curves,
never mixed into them.
"""

from __future__ import annotations

import math

import pandas as pd

from ..config import schema
from ..costmodel.clusters import Cluster, Compute
from ..costmodel.predict import BACKWARD_SHARE, predict_point, saturation
from ..strategies import DDP, REGISTERED, DataParallel, ParameterServer, lookup
from .load import RunDir
from .prediction import single_inputs

COLUMNS = [
    "cluster",
    "model",
    "gpus",
    "nodes",
    "predicted_images_per_second",
    "predicted_efficiency",
    "predicted_communication_s",
    "busiest_link_bytes",
    "predicted_state_mb_per_gpu",
    "collectives",
]
SHOWN_GPUS = (1, 8, 64, 256)  # the compact table's columns (where a cluster reaches them)


def models(predict: schema.Predict) -> dict[str, dict]:
    """label -> the sweep entry (without workers) whose strategy's cost model draws the curve:
    each registered strategy's own curves (Strategy.predicted_curves), in registry order. The
    sharded server's K follows the cluster (`Cluster.servers`)."""
    return {label: entry for cls in REGISTERED for label, entry in cls.predicted_curves(predict).items()}


def gpu_compute(predict: schema.Predict, runs: list[RunDir]) -> Compute:
    """The measured single-GPU baseline runs among `runs` (those of report.predict's compute
    preset) where there are any, else the assumption of params."""
    wanted = predict.compute
    on_gpu = [s for s in single_inputs(runs) if s["baseline"] and s["device"].startswith("cuda")]
    if on_gpu:
        return measured_compute(on_gpu, wanted.preset)
    return Compute(wanted.assumed_seconds_per_image, wanted.gradient_bytes, f"assumed: {wanted.assumed_source}")


def measured_compute(singles: list[dict], preset: str, note: str = "") -> Compute:
    """One GPU's compute from `single` runs' inputs on the first one's device (a fixed cost and a
    cost per image where they ran at two or more batch sizes: Compute.measured), its source
    naming them."""
    device = singles[0]["device"]
    mine = [s for s in singles if s["device"] == device]
    names = ", ".join(s["run_id"] for s in mine)
    return Compute.measured(mine, f"measured: {names} of the {preset} preset on {device}{note}")


def prediction_points(predict: schema.Predict, compute: Compute) -> pd.DataFrame:
    """One row per cluster, model and GPU count: predicted images/s, scaling efficiency
    (images/s over GPUs times one GPU's), exposed communication seconds per iteration and the
    bytes each way over the busiest link."""
    rows = []
    for cluster in map(Cluster.of, predict.clusters):
        for label, entry in models(predict).items():
            for gpus in cluster.gpu_counts():
                shards = {"servers": cluster.servers(gpus)} if entry.get("servers") == "K" else {}
                strategy = lookup(entry["strategy"])
                run = strategy.filled(**{**entry, **shards}, workers=gpus, images_per_worker=predict.images_per_gpu)
                point = predict_point(strategy, run, compute, predict.images_per_gpu, cluster.network(gpus))
                if point:
                    rows.append(
                        {
                            "cluster": cluster.name,
                            "model": label,
                            "gpus": gpus,
                            "nodes": cluster.nodes_for(gpus),
                            **point,
                        }
                    )
    return pd.DataFrame(rows, columns=COLUMNS)


def compact_table(points: pd.DataFrame) -> pd.DataFrame:
    """Predicted images/s per cluster and model at a few GPU counts, and the memory per GPU
    there (the report's table)."""
    shown = points[points["gpus"].isin(SHOWN_GPUS)]
    parts = []
    for column, name in (
        ("predicted_images_per_second", "predicted images/s"),
        ("predicted_state_mb_per_gpu", "predicted MiB per GPU"),
    ):
        part = shown.pivot_table(index=["cluster", "model"], columns="gpus", values=column, sort=False)
        part.columns = [f"{g} GPUs ({name})" for g in part.columns]
        parts.append(part)
    return pd.concat(parts, axis=1).reset_index()


def findings(points: pd.DataFrame, predict: schema.Predict, compute: Compute) -> list[str]:
    """Generated sentences per cluster: where, by the model, the sharded parameter server
    overtakes ring all-reduce in bytes over the busiest link and in images/s, and where
    DataParallel's device 0 saturates."""
    ring, sharded = DDP.RING, ParameterServer.SHARDED
    sentences = []
    for cluster in map(Cluster.of, predict.clusters):
        frame = points[points["cluster"] == cluster.name]
        rate, load = (
            frame.pivot_table(index="gpus", columns="model", values=column)[[ring, sharded]]
            for column in ("predicted_images_per_second", "busiest_link_bytes")
        )
        top = int(rate.index.max())
        fewer = load.index[(load[sharded] < load[ring]).to_numpy()]
        faster = rate.index[(rate[sharded] > rate[ring]).to_numpy()]
        sentences.append(
            f"{cluster.name}: by the model, the sharded parameter server "
            + (
                f"moves fewer bytes over its busiest link than ring all-reduce from {int(fewer.min())} "
                f"GPUs on ({load.loc[top, sharded] / 1e6:.0f} against {load.loc[top, ring] / 1e6:.0f} "
                f"MB each way at {top})"
                if len(fewer)
                else f"never moves fewer bytes over its busiest link than ring all-reduce up to {top} GPUs "
                f"({load.loc[top, sharded] / 1e6:.0f} against {load.loc[top, ring] / 1e6:.0f} MB each "
                f"way at {top}: the {cluster.gpus_per_node} workers of a node each send their whole "
                "gradients over its one network; BytePS sums them within the node first, this "
                "project's server does not)"
            )
            + (
                f", and overtakes it in images/s at {int(faster.min())} GPUs "
                f"({rate.loc[int(faster.min()), sharded]:.0f} against {rate.loc[int(faster.min()), ring]:.0f})."
                if len(faster)
                else f", but stays behind it in images/s up to {top} GPUs ({rate.loc[top, sharded]:.0f} "
                f"against {rate.loc[top, ring]:.0f}): its gradients leave only after the backward "
                "pass and its weights return only after the update, while DDP's buckets overlap "
                "the backward pass."
            )
        )
        saturated = saturation(DataParallel, cluster, compute, predict.images_per_gpu)
        within = frame[frame["model"] == DataParallel.DEVICE_0]
        widest = within.loc[within["gpus"].idxmax()]
        sentences.append(
            f"{cluster.name}: DataParallel needs 2 GPUs in one machine; this cluster has {cluster.gpus_per_node}."
            if cluster.gpus_per_node < 2
            else f"{cluster.name}: DataParallel keeps {widest['predicted_efficiency']:.0%} efficiency "
            f"at the node's {int(widest['gpus'])} GPUs and cannot span nodes; by the model its "
            "device 0 would saturate (efficiency below 50 %) "
            + (
                f"at {saturated} GPUs in one machine."
                if saturated
                else f"at no size up to {cluster.gpus_per_node * cluster.nodes} GPUs in one machine."
            )
        )
    return sentences


def section(shown: pd.DataFrame, points: pd.DataFrame, predict: schema.Predict, compute: Compute) -> dict:
    """The report's section: inputs, the generated findings and the compact table."""
    return {
        "title": "Predicted scaling past this machine (cost model)",
        "text": [
            "Predictions, not measurements: each strategy's cost model on the hypothetical clusters "
            "of report.predict, at "
            f"{predict.images_per_gpu} images per GPU. One GPU's compute: "
            f"{compute.terms()}; gradient bytes M: {compute.gradient_bytes / 1e6:.1f} "
            f"MB ({compute.source}). Backward, which DDP's buckets overlap, is {BACKWARD_SHARE:.2f} of "
            "it. A synchronous step waits for its slowest GPU: "
            + (
                f"the expected maximum of N normal compute times, {math.sqrt(compute.variance_per_image):.3g} s "
                "of standard deviation per image as the measured run's iterations spread (images taken "
                "as independent). "
                if compute.variance_per_image > 0
                else "no spread of the compute is known, so no wait is added. "
            )
            + "Efficiency is images/s over GPUs times one GPU's. The parameter server with K "
            "servers has one per spare CPU machine. Memory per GPU (predicted_state_mb_per_gpu) is "
            "the weights, gradients and optimizer state its busiest process holds by its "
            "strategy's analysis. The figures predicted_throughput and "
            "predicted_efficiency draw every point (predicted_scaling_points.csv) and mark this "
            "preset's measured runs beside them.",
            *(
                f"{c.name}: {c.gpus_per_node} GPU(s) per node, up to {c.nodes} nodes; "
                f"within a node {c.intra_gbit_s:g} Gbit/s, {c.intra_latency_us:g} us; between "
                f"nodes {c.inter_gbit_s:g} Gbit/s, {c.inter_latency_us:g} us; "
                f"{c.spare_cpu_machines_per_node} spare CPU machine(s) per node."
                for c in predict.clusters
            ),
        ],
        "table": shown,
        "bullets": findings(points, predict, compute),
    }
