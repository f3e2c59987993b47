"""The answer a user plans with: a preset's recipe (its epochs over its training images) on a
cluster, per strategy, in predicted hours, GPU-hours and cost, each with the uncertainty band,
and whether each strategy's memory fits the cluster's GPUs. Everything here is a PREDICTION.

Hours are the recipe's images over the predicted images/s: training steps only (no evaluation
pass, no start-up, no data preparation), a last partial batch counted as its share of a step.
GPU-hours are hours times the GPUs; a dedicated parameter server's CPU machines are not GPUs and
are not counted. Memory per GPU is the strategy's state by its analysis (weights, gradients,
optimizer state of its busiest process: Strategy.memory_theory) plus the activations of one GPU's
step where they were measured (Compute.activation_mb); without them it is the state alone, a
lower bound, and the fit is said to be a lower bound's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import schema

# COCO 2017's train2017 holds 118,287 images; 1,021 have no annotation, and torchvision's detection
# reference (like detectron2) trains on the other 117,266. This project's loader also skips an
# image whose boxes are all unusable, so the count it trains on is at most this.
COCO2017_TRAIN_IMAGES = 117_266


@dataclass(frozen=True)
class Recipe:
    """What one training of a preset sees: `epochs` passes over `images` training images."""

    epochs: int
    images: int
    source: str

    @property
    def total_images(self) -> int:
        return self.epochs * self.images

    @classmethod
    def of(cls, cfg: schema.Config, preset: str) -> Recipe:
        """A preset's epochs and training images, from its data section: the synthetic
        generator's count, a COCO subset's N, or COCO 2017's train2017."""
        data, epochs = cfg.data, cfg.train.epochs
        if data.fetch is None and data.synthetic is not None:
            return cls(epochs, data.synthetic.train_images, f"{preset}: data.synthetic.train_images")
        if data.fetch is not None and data.fetch.subset is not None:
            return cls(epochs, data.fetch.subset, f"{preset}: data.fetch.subset (images without a box are skipped)")
        return cls(
            epochs,
            COCO2017_TRAIN_IMAGES,
            f"{preset}: COCO 2017 train2017, the {COCO2017_TRAIN_IMAGES:,} images with an annotation",
        )


@dataclass(frozen=True)
class Plan:
    """One strategy's recipe at one GPU count, predicted: lowest, predicted, highest."""

    hours: tuple[float, float, float]
    gpu_hours: tuple[float, float, float]
    cost: tuple[float, float, float] | None  # None: no price given
    memory_mib: float  # per GPU: state, plus activations where known
    fits: str  # "yes", "no", "yes (state only)", "no (state only)", or "unknown" (no GPU memory given)


def plan(
    recipe: Recipe,
    gpus: int,
    rate: tuple[float, float, float],
    state_mib: float,
    activation_mib: float,
    gpu_memory_gib: float | None,
    price: float | None,
) -> Plan:
    """The recipe at `gpus` GPUs whose predicted images/s are `rate` (lowest, predicted,
    highest: the band); `state_mib` the strategy's state per GPU, `activation_mib` one GPU's
    step's activations (NaN: not measured); `price` per GPU-hour (None: not given)."""
    low, mid, high = rate

    def hours_at(images_per_second: float) -> float:
        return recipe.total_images / images_per_second / 3600 if images_per_second > 0 else math.inf

    hours = (hours_at(high), hours_at(mid), hours_at(low))  # the fastest rate: the fewest hours
    gpu_hours = (hours[0] * gpus, hours[1] * gpus, hours[2] * gpus)
    cost = (gpu_hours[0] * price, gpu_hours[1] * price, gpu_hours[2] * price) if price is not None else None
    known = math.isfinite(activation_mib)
    memory = state_mib + (activation_mib if known else 0.0)
    if gpu_memory_gib is None:
        fits = "unknown"
    else:
        fits = ("yes" if memory <= gpu_memory_gib * 1024 else "no") + ("" if known else " (state only)")
    return Plan(hours, gpu_hours, cost, memory, fits)
