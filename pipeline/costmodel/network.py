"""The cost model's shared half: links measured as latency + bytes x seconds-per-byte, their
least-squares fit from timings (pipeline/commbench/links.py), the network that carries a strategy's
messages (one host, or a cluster of GPU nodes), and the one place that adds compute, data wait,
optimizer and communication into a predicted iteration.

What each strategy communicates is the strategy's own (`Strategy.phases` in
pipeline/strategies/: the ring of all-reduce in ddp.py, the copies through device 0 in dp.py,
the gradients to and weights from the server shards in ps.py); `Network.seconds` times a phase
by its busiest link, and the strategy says what overlaps (`communication_seconds`). Everything
here is a prediction, and labelled as one where it is shown.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Link:
    """Seconds to move n bytes: alpha + beta * n (Hockney's model)."""

    alpha: float   # latency, seconds per message
    beta: float    # seconds per byte (1 / bandwidth)

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        return messages * self.alpha + nbytes * self.beta if nbytes > 0 else 0.0

    @classmethod
    def from_bandwidth(cls, gbit_per_s: float, latency_us: float) -> "Link":
        """A hypothetical link from its datasheet: bandwidth in Gbit/s, latency in microseconds."""
        return cls(latency_us * 1e-6, 8 / (gbit_per_s * 1e9))


@dataclass(frozen=True)
class Fit:
    link: Link
    residuals: list[float]   # measured - fitted seconds, per message size
    r2: float                # coefficient of determination of the fit

    @property
    def worst_relative_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)


def fit(sizes: list[float], seconds: list[float]) -> Fit:
    """Least-squares alpha and beta of `seconds = alpha + beta * size`, weighted by 1/seconds so
    that the small messages (where alpha shows) count as much as the large ones (where beta
    does): the fit minimises relative, not absolute, error. Residuals are relative."""
    x, y = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    if len(x) < 2 or len(set(x.tolist())) < 2:
        raise ValueError(f"a fit of latency and bandwidth needs timings at 2 or more message sizes, not {x.tolist()}")
    weights = 1 / y
    design = np.stack([np.ones_like(x), x], axis=1) * weights[:, None]
    (alpha, beta), *_ = np.linalg.lstsq(design, y * weights, rcond=None)
    fitted = alpha + beta * x
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - fitted) ** 2).sum()) / total if total > 0 else 1.0
    return Fit(Link(float(alpha), float(beta)), [float(r) for r in (y - fitted) / y], r2)


Endpoint = tuple[str, int]  # ("worker", i) or ("server", s): a process of the job


@dataclass(frozen=True)
class Flow:
    """Bytes one process sends another within a phase, in `messages` messages."""

    src: Endpoint
    dst: Endpoint
    nbytes: float
    messages: int = 1


@dataclass(frozen=True)
class Network:
    """Where a job's processes sit and what links them.

    One host (`gpus_per_node` None, the measured runs): every process has its own link,
    `intra` (the commbench fit of this machine), and `all_reduce` and `broadcast`, where
    measured, are those collectives' own fits. A cluster: workers fill nodes of `gpus_per_node` in rank order; two
    processes of one node talk over their own `intra` links (NVLink, PCIe), of two nodes over
    their nodes' `inter` link (the node's network, shared by its GPUs: a ring crosses it once
    each way, a parameter server's G workers send through it G times). Dedicated servers run
    on `server_machines` spare CPU machines (round robin), each with its own `inter` link, or,
    without any, on the GPU nodes' CPUs, sharing their networks."""

    intra: Link
    inter: Link | None = None
    gpus_per_node: int | None = None
    nodes: int = 1
    server_machines: int = 0
    all_reduce: Link | None = None
    broadcast: Link | None = None  # one broadcast collective's own fit, where timed
    calibrations: dict[str, dict] | None = None  # strategy -> what commbench timed of it on
    # the run's model (Strategy.calibrate: FSDP2's cost), where timed

    def node(self, end: Endpoint):
        kind, index = end
        if self.gpus_per_node is None:
            return 0
        if kind == "worker":
            return index // self.gpus_per_node
        return ("server machine", index % self.server_machines) if self.server_machines else index % self.nodes

    def _ports(self, flows: list[Flow]) -> dict[tuple, list[float]]:
        """(link, direction) -> [bytes, seconds] that the flows put on it."""
        ports: dict[tuple, list[float]] = {}
        for flow in flows:
            here, there = self.node(flow.src), self.node(flow.dst)
            if here == there:
                link, out, into = self.intra, ("link", flow.src), ("link", flow.dst)
            else:
                link, out, into = self.inter, ("network", here), ("network", there)
            for port in ((out, "out"), (into, "in")):
                load = ports.setdefault(port, [0.0, 0.0])
                load[0] += flow.nbytes
                load[1] += link.seconds(flow.nbytes, flow.messages)
        return ports

    def loads(self, flows: list[Flow]) -> dict[tuple, float]:
        """link -> bytes over it each way (the larger of out and in)."""
        loads: dict[tuple, float] = {}
        for (link, _), (nbytes, _) in self._ports(flows).items():
            loads[link] = max(loads.get(link, 0.0), nbytes)
        return loads

    def seconds(self, flows: list[Flow]) -> float:
        """A phase's time: its busiest link's (links are full duplex and work in parallel)."""
        return max((seconds for _, seconds in self._ports(flows).values()), default=0.0)


def slowest_wait(workers: int, variance_per_image: float, images: int) -> float:
    """Expected seconds by which the slowest of `workers` workers finishes its batch of `images`
    after the mean worker: each image's compute independent, with variance `variance_per_image`,
    so a batch's time is normal with standard deviation sqrt(variance x images), and the slowest
    of N lands that times E[max of N standard normals] (`expected_maximum`) past the mean. A
    synchronous step waits for that worker; 0 for one worker or no variance measured (NaN)."""
    if workers < 2 or not variance_per_image > 0:
        return 0.0
    return math.sqrt(variance_per_image * images) * expected_maximum(workers)


@functools.lru_cache(maxsize=None)
def expected_maximum(n: int) -> float:
    """E[max of n standard normals] (0.56 at 2, 1.03 at 4, 1.42 at 8), integrated numerically:
    the integral of x n pdf(x) cdf(x)^(n-1)."""
    x = np.linspace(-10.0, 10.0, 8001)
    pdf = np.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    cdf = 0.5 * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x]))
    return float(np.sum(x * n * pdf * cdf ** (n - 1)) * (x[1] - x[0]))


@dataclass(frozen=True)
class Iteration:
    """A predicted iteration, the one place its parts add up: compute, data wait and optimizer
    from measured runs, communication from a strategy's model (which subtracts what overlaps),
    and the wait for the slowest worker of a synchronous step (`slowest_wait`)."""

    compute: float          # forward + backward of one worker's batch (measured: single's)
    data: float             # waiting for the loader
    optimizer: float        # the update (on the worker, or on the server)
    communication: float    # exposed communication: what overlap with backward leaves
    images: int             # images per iteration over all workers
    wait: float = 0.0       # for the slowest worker, past the mean one's compute

    @property
    def seconds(self) -> float:
        return self.compute + self.data + self.optimizer + self.communication + self.wait

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else math.nan

