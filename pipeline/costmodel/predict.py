"""A predicted iteration of one strategy on one network, from compute measured elsewhere: the one
place compute, data wait, optimizer, exposed communication and the wait for the slowest worker
add up.

The strategy is an argument (its spec: `StrategyModel` below), so the cost model names no
strategy and stays below them in the layers. Everything here is a prediction, and labelled as
one where it is shown (pipeline/report/prediction.py, clusters.py).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from ..runtime.run import Run
from .clusters import Cluster, Compute
from .network import Network, Ports, link_loads

BACKWARD_SHARE = 2 / 3  # of forward + backward: what DDP's all-reduce can overlap with


class StrategyModel(Protocol):
    """What the cost model reads of a strategy (pipeline/strategies/base.py states each)."""

    name: str

    def filled(self, **given) -> Run: ...

    def phase_ports(self, run: Run, grad_bytes: float, network: Network) -> list[Ports] | None: ...

    def algorithms(self, run: Run, grad_bytes: float, network: Network) -> str: ...

    def communication_seconds(self, run: Run, grad_bytes: float, network: Network, backward: float) -> float: ...

    def timed_communication_seconds(self, run: Run, grad_bytes: float, network: Network, backward: float) -> float: ...

    def waits_for_slowest(self, run: Run) -> bool: ...

    def memory_theory(self, run: Run, grad_bytes: float) -> dict[str, float]: ...


@dataclass(frozen=True)
class Iteration:
    """A predicted iteration: compute, data wait and optimizer from measured runs,
    communication from a strategy's model (which subtracts what overlaps), and the wait for
    the slowest worker of a synchronous step (`slowest_wait`)."""

    compute: float  # forward + backward of one worker's batch (measured: single's)
    data: float  # waiting for the loader
    optimizer: float  # the update (on the worker, or on the server)
    communication: float  # exposed communication: what overlap with backward leaves
    images: int  # images per iteration over all workers
    wait: float = 0.0  # for the slowest worker, past the mean one's compute
    timed_communication: float = math.nan  # what of `communication` a run's time split counts

    @property
    def in_step_communication(self) -> float:
        """What a run measures as communication (Strategy.communication_timed): the exchange,
        and the wait for the slowest worker that it holds, in a strategy that waits (a run's
        exchange cannot end before the last worker's compute)."""
        return self.timed_communication + self.wait

    @property
    def seconds(self) -> float:
        return self.compute + self.data + self.optimizer + self.communication + self.wait

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else math.nan


def slowest_wait(workers: int, variance_per_image: float, images: int) -> float:
    """Expected seconds by which the slowest of `workers` workers finishes its batch of `images`
    after the mean worker: each image's compute independent, with variance `variance_per_image`,
    so a batch's time is normal with standard deviation sqrt(variance x images), and the slowest
    of N lands that times E[max of N standard normals] (`expected_maximum`) past the mean. A
    synchronous step waits for that worker; 0 for one worker or no variance measured (NaN)."""
    if workers < 2 or not variance_per_image > 0:
        return 0.0
    return math.sqrt(variance_per_image * images) * expected_maximum(workers)


@functools.cache
def expected_maximum(n: int) -> float:
    """E[max of n standard normals] (0.56 at 2, 1.03 at 4, 1.42 at 8), integrated numerically:
    the integral of x n pdf(x) cdf(x)^(n-1)."""
    x = np.linspace(-10.0, 10.0, 8001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    return float(np.sum(x * n * pdf * cdf ** (n - 1)) * (x[1] - x[0]))


def iteration(
    strategy: StrategyModel,
    run: Run,
    *,
    compute: float,
    gradient_bytes: float,
    network: Network | None,
    variance_per_image: float,
    images_per_worker: int,
    images: int,
    data: float = 0.0,
    optimizer: float = 0.0,
    run_variance_per_image: float = math.nan,
) -> Iteration:
    """`strategy`'s iteration of `run` (a sweep entry with its workers): `compute` seconds of
    one worker's forward + backward, its variance per image, M = `gradient_bytes`, over
    `network` (None: no links measured, communication NaN). The wait for the slowest worker
    takes the variance of one process's compute, of the best source there is:
    `run_variance_per_image`, measured in runs of as many processes (their iteration-to-iteration
    jitter, report/prediction.py's process_jitter); else, where commbench measured the exchange
    inside a step (`network.in_step`), the one it measured across the processes computing at
    once; else `variance_per_image` (single's, over its iterations alone). Single's holds the
    slowdowns every process shares at once, which make nobody wait (on a loaded 2-core machine
    it put the wait at 460 ms where the runs measured 70 ms of communication, the wait
    included); commbench's 15 repeats read 30 ms of a 2-process step's 28-52 in the runs."""
    backward = compute * BACKWARD_SHARE
    communication = strategy.communication_seconds(run, gradient_bytes, network, backward) if network else math.nan
    timed = strategy.timed_communication_seconds(run, gradient_bytes, network, backward) if network else math.nan
    if run_variance_per_image > 0:
        variance_per_image = run_variance_per_image
    elif network and network.in_step:
        variance_per_image = network.in_step.variance_per_image
    wait = (
        slowest_wait(run.workers, variance_per_image, images_per_worker) if strategy.waits_for_slowest(run) else 0.0
    )  # none without a measured variance
    return Iteration(compute, data, optimizer, communication, images, wait, timed)


def predict_point(strategy: StrategyModel, run: Run, compute: Compute, per_gpu: int, network: Network) -> dict | None:
    """Predicted images/s, efficiency, exposed communication, the busiest link's bytes, the
    memory per GPU and the collectives' algorithms of one run (a sweep entry with its workers)
    on one network; None where the strategy cannot run there (DataParallel past one node)."""
    gpus = run.workers
    predicted = iteration(
        strategy,
        run,
        compute=compute.step_seconds(per_gpu),
        gradient_bytes=compute.gradient_bytes,
        network=network,
        variance_per_image=compute.variance_per_image,
        images_per_worker=per_gpu,
        images=per_gpu * gpus,
    )
    if math.isnan(predicted.communication):
        return None
    rate = predicted.images_per_second
    loads = link_loads(strategy.phase_ports(run, compute.gradient_bytes, network) or [])
    return {
        "predicted_images_per_second": rate,
        "predicted_efficiency": rate * compute.step_seconds(per_gpu) / per_gpu / gpus,  # of one GPU's rate
        "predicted_communication_s": predicted.communication,
        "busiest_link_bytes": max(loads.values(), default=0.0),
        # weights, gradients and optimizer state of the process that holds the most
        "predicted_state_mb_per_gpu": sum(strategy.memory_theory(run, compute.gradient_bytes).values()) / 2**20,
        "collectives": strategy.algorithms(run, compute.gradient_bytes, network),  # as NCCL would run them
    }


def saturation(strategy: StrategyModel, cluster: Cluster, compute: Compute, per_gpu: int) -> int | None:
    """The fewest GPUs (a power of 2) at which `strategy`, were they all in one machine on its
    intra-node links, would spend as long communicating as computing (efficiency below 50 %):
    where its design, not the machine's size, stops it (DataParallel's device 0). None: not up
    to the cluster's GPUs."""
    for gpus in (2**i for i in range(1, 16)):
        if gpus > cluster.gpus_per_node * cluster.nodes:
            return None
        point = predict_point(
            strategy, strategy.filled(workers=gpus), compute, per_gpu, Network(intra=cluster.intra, gpus_per_node=gpus)
        )
        if point is None:  # it cannot run there: no size of its own to state
            return None
        if point["predicted_efficiency"] < 0.5:
            return gpus
    return None
