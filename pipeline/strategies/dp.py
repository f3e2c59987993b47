"""`dp`: torch.nn.DataParallel over the visible GPUs, one process.

DataParallel is a parameter-server design inside one process: every iteration GPU 0 copies the
weights to the other GPUs, scatters the batch, runs the replicas in threads, gathers their
outputs, and the backward pass sums the gradients back onto GPU 0, where the one optimizer
updates the weights (`step` below). Through GPU 0 pass about 2(N-1)M bytes per iteration.

Its stock scatter chunks every tensor along dimension 0, which breaks torchvision's detection
models (pytorch/pytorch#25627, pytorch/vision#1659): it would split each image's channels
instead of splitting the list of images and targets. `detection_data_parallel()` scatters by sample
and gathers the loss dictionaries (training) or detection lists (evaluation) correctly.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

from ..config import schema
from ..costmodel.network import Flow, Network
from ..runtime import distributed
from ..runtime.run import Run
from .base import Strategy
from .process import Context, Runtime, Traffic, gradient_bytes

if TYPE_CHECKING:
    import torch


def _to(obj, device):
    import torch

    if torch.is_tensor(obj):
        return obj.to(device, non_blocking=True)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(v, device) for v in obj)
    return obj


def scatter_by_sample(inputs: tuple, devices: list) -> list[tuple]:
    """Split (images, targets) or (images,) into per-device chunks of whole samples, in order.
    Fewer samples than devices use fewer devices."""
    images = inputs[0]
    n = min(len(devices), len(images))
    bounds = [round(i * len(images) / n) for i in range(n + 1)]
    return [tuple(_to(list(part[bounds[i] : bounds[i + 1]]), devices[i]) for part in inputs) for i in range(n)]


def gather_outputs(outputs: list, device):
    """Loss dictionaries: the mean over replicas (as DDP averages gradients). Detections: the
    per-image lists concatenated in input order."""
    import torch

    if isinstance(outputs[0], dict):
        return {k: torch.stack([o[k].to(device) for o in outputs]).mean() for k in outputs[0]}
    return [_to(d, device) for replica in outputs for d in replica]


@functools.cache
def detection_data_parallel() -> type:
    """`DetectionDataParallel`: DataParallel whose scatter and gather understand detection
    inputs and outputs. Made at first use, as its base is torch's class: the registry imports
    this module without torch."""
    import torch

    class DetectionDataParallel(torch.nn.DataParallel):
        def __init__(self, module, device_ids, traffic: Traffic):
            super().__init__(module, device_ids=device_ids)
            self.traffic = traffic

        def scatter(self, inputs, kwargs, device_ids):
            chunks = scatter_by_sample(inputs, [torch.device("cuda", i) for i in device_ids])
            return chunks, [dict(kwargs) for _ in chunks]

        def replicate(self, module, device_ids):
            # The weight broadcast from GPU 0 (and, in backward, the gradient reduction to it).
            copies = (len(device_ids) - 1) * gradient_bytes(module)
            self.traffic.sent += copies
            self.traffic.received += copies
            return super().replicate(module, device_ids)

        def gather(self, outputs, output_device):
            return gather_outputs(
                outputs, torch.device("cuda", output_device) if isinstance(output_device, int) else output_device
            )

    return DetectionDataParallel


class DataParallel(Strategy):
    name = "dp"
    label = "DataParallel"
    # Not in the one-step equivalence check: it needs 2 GPUs in one process, and that job runs
    # where the workflow runs (tests/test_strategies.py checks its step where GPUs exist).
    equivalence_entry = None
    theory_text = "(N-1)M replicated from and reduced to device 0 by DataParallel"
    communication_timed = None  # replicate, scatter and gather happen inside forward and backward
    bytes_counted = "DataParallel's are counted from the size of the weights it replicates."
    DEVICE_0 = "DataParallel (device 0)"  # the curve the report's sentences compare with

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        return {cls.DEVICE_0: {"strategy": cls.name}}

    def gpus(self) -> int:
        return self.run.workers

    def unavailable(self) -> str | None:
        gpus, needed = distributed.gpu_count(), max(2, self.run.workers)
        if gpus < needed:
            return f"DataParallel needs at least {needed} GPUs in one process; found {gpus}"
        if self.parallel.nnodes != 1:
            return "DataParallel runs in one process on one machine (parallel.nnodes must be 1)"
        return None

    def batch_per_process(self) -> int:
        return self.run.images_per_worker * self.run.workers  # split by scatter_by_sample

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> list[list[Flow]]:
        """Device 0 copies the weights to the N-1 others before the forward pass, and their
        gradients come back to it after backward: (N-1)M each way over its link, M over each
        other device's. Nothing overlaps."""
        others = range(1, run.workers)
        return [
            [Flow(("worker", 0), ("worker", i), grad_bytes) for i in others],
            [Flow(("worker", i), ("worker", 0), grad_bytes) for i in others],
        ]

    @classmethod
    def communication_seconds(cls, run: Run, grad_bytes: float, network: Network, backward: float) -> float:
        if network.nodes > 1:
            return math.nan  # one process: DataParallel cannot span machines
        return super().communication_seconds(run, grad_bytes, network, backward)

    def runtime(self) -> DataParallelRuntime:
        return DataParallelRuntime(self)


class DataParallelRuntime(Runtime):
    """The one process: the model replicated over the run's GPUs at every forward."""

    def gpus_in_use(self, ctx: Context) -> list[int]:
        return list(range(self.run.workers))  # GPU 0 and the replicas' GPUs

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        return detection_data_parallel()(model, list(range(self.run.workers)), self._traffic)

    def step(self, model, optimizer, ctx: Context) -> float:
        optimizer.step()  # GPU 0 holds the only weights that are updated
        return 0.0

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        through_master = self.spec.link_bytes(self.run, grad_bytes)["busiest"]
        return {"sent": through_master, "received": through_master}
