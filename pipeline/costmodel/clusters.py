"""The hypothetical clusters the cost model predicts on: those of `report.predict` (params.yaml),
or a user's own, read from a YAML or JSON file and flags and checked against the same schema
(`read_cluster`, for the what-if command pipeline/whatif.py); and one GPU's measured or assumed
compute (pipeline/report/clusters.py fills them in)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ..config import schema
from ..config.params import ParamsError, parse_yaml, schema_errors
from .network import Link, Network, fit

EXAMPLE = "examples/cluster-8x8.yaml"  # a cluster file to copy (README's what-if section)


@dataclass(frozen=True)
class Compute:
    """One GPU's work per step, a fixed cost and a cost per image, the gradient bytes M, and where
    they come from."""

    seconds_per_image: float  # forward + backward (+ data wait and optimizer, when measured)
    gradient_bytes: float
    source: str
    variance_per_image: float = math.nan  # of compute, when measured: the slowest worker's wait
    fixed_seconds: float = 0.0  # a step's cost whatever its images (fitted: `of_points`)
    fitted_images: tuple[int, ...] = ()  # the batch sizes the terms come from (none: one rate given)
    activation_mb_fixed: float = math.nan  # one GPU's step's memory past its state: fixed ...
    activation_mb_per_image: float = math.nan  # ... plus per image (NaN: not measured)

    def activation_mb(self, images: int) -> float:
        """One GPU's peak memory past its weights, gradients and optimizer state at `images` a
        step, MiB (NaN: not measured)."""
        return self.activation_mb_fixed + self.activation_mb_per_image * images

    def with_activations(self, points: dict[int, float]) -> Compute:
        """The compute with measured activations (`points`: images -> MiB past the state), fitted
        as a fixed part plus a part per image like the step (one batch size: per image alone)."""
        if not points:
            return self
        fitted = Compute.of_points(points, self.gradient_bytes, self.source)
        return replace(self, activation_mb_fixed=fitted.fixed_seconds, activation_mb_per_image=fitted.seconds_per_image)

    def step_seconds(self, images: int) -> float:
        """One GPU's step of `images` images."""
        return self.fixed_seconds + self.seconds_per_image * images

    def extrapolated(self, images: int) -> bool:
        """Whether `images` a step lies outside the batch sizes the terms were fitted at."""
        return bool(self.fitted_images) and not min(self.fitted_images) <= images <= max(self.fitted_images)

    def terms(self) -> str:
        """The compute as the model takes it: its terms, and the batch sizes they come from."""
        if not self.fixed_seconds and len(self.fitted_images) < 2:
            return f"{self.seconds_per_image:.4g} s per image"
        at = ", ".join(f"{images}: {self.step_seconds(images) * 1e3:.1f} ms" for images in self.fitted_images)
        return (
            f"{self.fixed_seconds * 1e3:.2f} ms a step + {self.seconds_per_image * 1e3:.2f} ms per image "
            f"(fitted at {len(self.fitted_images)} batch size(s); fitted step {at})"
        )

    @classmethod
    def of_points(cls, points: dict[int, float], gradient_bytes: float, source: str) -> Compute:
        """A fixed cost per step plus a cost per image, from one GPU's step seconds at two or more
        batch sizes (`points`: images -> seconds): the link fit's non-negative least squares of
        relative error (network.fit: its latency is the fixed cost, its time per byte the time
        per image); one batch size gives its time per image alone."""
        images = sorted(points)
        if len(images) == 1:
            return cls(points[images[0]] / images[0], gradient_bytes, source, fitted_images=tuple(images))
        line = fit(images, [points[i] for i in images]).link
        return cls(line.beta, gradient_bytes, source, fixed_seconds=line.alpha, fitted_images=tuple(images))

    @classmethod
    def measured(cls, singles: list[dict], source: str) -> Compute:
        """From `single` runs' inputs on one device (pipeline/report/prediction.py
        `single_inputs`): a step's compute, data wait and optimizer at each batch size they ran
        (the mean over its runs), fitted as `of_points` where they ran at two or more; the
        variance per image, the gradient bytes from the first."""
        steps = steps_by_batch(singles, lambda s: (s["compute"] + s["data"]) * s["images"] + s["optimizer"])
        first = singles[0]
        found = cls.of_points(steps, first["gradient_bytes"], source)
        return replace(found, variance_per_image=first["compute_variance"])


def steps_by_batch(singles: list[dict], step: Callable[[dict], float]) -> dict[int, float]:
    """The mean of `step` (one row's seconds a step) over `single` rows of each batch size
    (`images`): the points `Compute.of_points` fits."""
    found: dict[int, list[float]] = {}
    for single in singles:
        found.setdefault(int(single["images"]), []).append(step(single))
    return {images: sum(seconds) / len(seconds) for images, seconds in found.items()}


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    nodes: int
    intra: Link
    inter: Link
    spare_cpu_machines_per_node: int

    @classmethod
    def of(cls, spec: schema.Cluster) -> Cluster:
        return cls(
            spec.name,
            spec.gpus_per_node,
            spec.nodes,
            Link.from_bandwidth(spec.intra_gbit_s, spec.intra_latency_us),
            Link.from_bandwidth(spec.inter_gbit_s, spec.inter_latency_us),
            spec.spare_cpu_machines_per_node,
        )

    def gpu_counts(self) -> list[int]:
        """1, 2, 4 .. one node's GPUs, then whole nodes doubling up to all of them."""
        within = [g for g in (2**i for i in range(12)) if g < self.gpus_per_node] + [self.gpus_per_node]
        across = [self.gpus_per_node * n for n in (2**i for i in range(1, 12)) if n < self.nodes]
        return within + across + ([self.gpus_per_node * self.nodes] if self.nodes > 1 else [])

    def nodes_for(self, gpus: int) -> int:
        return math.ceil(gpus / self.gpus_per_node)

    def network(self, gpus: int) -> Network:
        return Network(
            intra=self.intra,
            inter=self.inter,
            gpus_per_node=self.gpus_per_node,
            nodes=self.nodes_for(gpus),
            server_machines=self.servers(gpus, spare_only=True),
        )

    def servers(self, gpus: int, spare_only: bool = False) -> int:
        """K of the sharded parameter server: one per spare CPU machine (without any, one on
        the GPU nodes; `spare_only`: the spare machines alone)."""
        spare = self.spare_cpu_machines_per_node * self.nodes_for(gpus)
        return spare if spare_only else max(1, spare)


class ClusterError(ValueError):
    """A cluster description is malformed; the message names the file, the key and the remedy."""


def read_cluster(path: str | Path | None, given: dict) -> schema.Cluster:
    """One cluster as report.predict states one: the YAML or JSON file at `path` (None: none),
    with the values `given` (flags, None where not given) over it, checked. The name defaults
    to the file's stem."""
    found, source = {}, "the command line"
    if path is not None:
        source = str(path)
        try:
            found = parse_yaml(Path(path).read_text(), str(path))  # JSON is YAML too
        except OSError as err:
            raise ClusterError(
                f"{path}: cannot read the cluster file ({err.strerror}); give the "
                f"path of a YAML or JSON file such as {EXAMPLE}"
            ) from err
        except ParamsError as err:
            raise ClusterError(str(err)) from None
        if not isinstance(found, dict):
            raise ClusterError(
                f"{path}: expected a mapping of the cluster's keys (as in {EXAMPLE}), found {type(found).__name__}"
            )
    cluster = {**found, **{k: v for k, v in given.items() if v is not None}}
    cluster.setdefault("name", Path(path).stem if path is not None else "your cluster")
    wanted = schema.json_schema(schema.Cluster)
    # a misspelt key is named as such first, not only as the key it leaves missing
    errors = schema_errors(cluster, {**wanted, "required": []}, source)
    missing = [key for key in wanted["required"] if key not in cluster]
    if missing:
        errors.append(
            f"{source}: no {', '.join(missing)}; add "
            + ("them" if len(missing) > 1 else "it")
            + f" to the file (as in {EXAMPLE}) or give --{missing[0].replace('_', '-')}"
        )
    if errors:
        raise ClusterError("invalid cluster:\n  " + "\n  ".join(errors))
    return schema.Cluster.model_validate(cluster)
