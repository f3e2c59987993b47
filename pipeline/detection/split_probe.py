"""Why a 2-worker step differs from single's, cause by cause: one gradient of the detector at its
initial weights on the first 8 training images, taken whole and split 4 + 4.

Two causes can move the averaged gradient of 2 workers x 4 images away from that of 1 worker x 8
(pipeline/equivalence.py measures the whole step with the real strategies):

* batch statistics: BatchNorm normalises over each worker's 4 images, not the 8;
* per-worker sampling: the RPN and the box head draw their anchors and proposals per worker,
  with its own random stream, and normalise by that worker's count.

Here each is measured in one process, where the two can be told apart: `split` is the distance
of the 4 + 4 average from the gradient of the 8 (both causes at play), `resample` that of the 8
images again with another sampling seed (sampling alone). Under GroupNorm (`model.norm`) batch
statistics are gone, so what `split` keeps beyond `resample` is the split's own.
"""

from __future__ import annotations

import copy

import torch

from ..config import schema
from ..data.dataset import CocoDetection, collate, to_model_input
from ..runtime.records.equivalence import SplitDistance
from .model import build_model

IMAGES = 8  # single's batch in the demo; split into two halves


def gradient(model, images, targets, sampling_seed: int) -> torch.Tensor:
    """The flat gradient of the summed losses; `sampling_seed` seeds the RPN's and the box
    head's draws (torch's global stream, as in training). A copy of the model takes the step,
    so BatchNorm's running buffers stay those of the initial weights."""
    model = copy.deepcopy(model)
    torch.manual_seed(sampling_seed)
    losses = model(list(images), list(targets))
    sum(losses.values()).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def distance(moved: torch.Tensor, reference: torch.Tensor) -> float:
    """|moved - reference| / |reference|: how far, relative to the reference's own size."""
    return ((moved - reference).norm() / reference.norm()).item()


def measure(cfg: schema.TrainStage, norm: str) -> SplitDistance:
    """The two distances (SplitDistance's `split` and `resample`: 2 x 4 images each with its
    own sampling seed, and the 8 again with another) of the preset `cfg`'s model under `norm`,
    at train.seed's initial weights."""
    dataset = CocoDetection(
        cfg.data.root, "train", train=True, horizontal_flip=0.0, exif_orientation=cfg.data.exif_orientation
    )
    images, targets = collate([dataset[i] for i in range(IMAGES)])
    images = [to_model_input(image, "cpu") for image in images]
    seed = cfg.train.seed
    torch.manual_seed(seed)
    model = build_model(cfg.model.model_copy(update={"norm": norm, "backbone_weights": None}), dataset.num_classes)
    model.train()
    whole = gradient(model, images, targets, seed)
    half = IMAGES // 2
    split = (
        gradient(model, images[:half], targets[:half], seed) + gradient(model, images[half:], targets[half:], seed + 1)
    ) / 2
    resampled = gradient(model, images, targets, seed + 1)
    return SplitDistance(norm=norm, split=distance(split, whole), resample=distance(resampled, whole))
