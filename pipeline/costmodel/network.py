"""The cost model's shared half: links measured as latency + bytes x seconds-per-byte, their
non-negative least-squares fit from timings (pipeline/commbench/links.py), and the network that carries a
strategy's messages (one host as commbench measured it, or a cluster of GPU nodes).

What each strategy communicates is the strategy's own (`Strategy.phases` in
pipeline/strategies/: the ring of all-reduce in ddp.py, the copies through device 0 in dp.py,
the gradients to and weights from the server shards in ps.py); `Network.seconds` times a phase
by its busiest link, and the strategy says what overlaps (`communication_seconds`). Everything
here is a prediction, and labelled as one where it is shown.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..runtime.records.commbench import CommbenchRecord
from .in_step import InStepTerms


@dataclass(frozen=True)
class Link:
    """Seconds to move n bytes: alpha + beta * n (Hockney's model)."""

    alpha: float  # latency, seconds per message
    beta: float  # seconds per byte (1 / bandwidth)

    def seconds(self, nbytes: float, messages: int = 1) -> float:
        return messages * self.alpha + nbytes * self.beta if nbytes > 0 else 0.0

    @classmethod
    def from_bandwidth(cls, gbit_per_s: float, latency_us: float) -> Link:
        """A hypothetical link from its datasheet: bandwidth in Gbit/s, latency in microseconds."""
        return cls(latency_us * 1e-6, 8 / (gbit_per_s * 1e9))


@dataclass(frozen=True)
class Fit:
    link: Link
    residuals: list[float]  # measured - fitted seconds, per message size
    r2: float  # coefficient of determination of the fit
    untrusted: str | None = None  # why a term sits at its bound of 0 (None: both resolved)

    @property
    def worst_relative_residual(self) -> float:
        return max((abs(r) for r in self.residuals), default=0.0)


NO_BANDWIDTH = (
    "the larger messages took no longer than the small ones, so the fit's time per byte sits at "
    "its bound of 0: no bandwidth resolved (a busy machine, or messages too small to show it); "
    "the link is taken as its latency alone"
)
NO_LATENCY = (
    "the smallest messages took no longer than their bytes at the fitted bandwidth, so the "
    "fit's latency sits at its bound of 0: no latency resolved; the link is taken as its bytes alone"
)


def fit(sizes: Sequence[float], seconds: Sequence[float]) -> Fit:
    """Non-negative least-squares alpha and beta of `seconds = alpha + beta * size` (neither a
    latency nor a time per byte can be negative: on a busy machine an unconstrained fit gave
    beta < 0, and 64 MiB then took negative seconds), weighted by 1/seconds so that the small
    messages (where alpha shows) count as much as the large ones (where beta does): the fit
    minimises relative, not absolute, error. Residuals are relative. A term at its bound of 0
    was not resolved by these timings: `untrusted` says which, and why."""
    x, y = np.asarray(sizes, dtype=float), np.asarray(seconds, dtype=float)
    if len(x) < 2 or len(set(x.tolist())) < 2:
        raise ValueError(f"a fit of latency and bandwidth needs timings at 2 or more message sizes, not {x.tolist()}")
    if not (np.isfinite(y).all() and (y > 0).all() and np.isfinite(x).all() and (x > 0).all()):
        raise ValueError(
            "a fit of latency and bandwidth needs positive, finite sizes and seconds, "
            f"not {x.tolist()} and {y.tolist()}"
        )
    from scipy.optimize import nnls  # here, not at the top: every training process imports this module

    weights = 1 / y
    scale = x.max()  # bytes in units of the largest message: both columns near 1, a well-posed problem
    design = np.stack([np.ones_like(x), x / scale], axis=1) * weights[:, None]
    (alpha, beta_scaled), _ = nnls(design, y * weights)
    alpha, beta = float(alpha), float(beta_scaled / scale)
    fitted = alpha + beta * x
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1 - float(((y - fitted) ** 2).sum()) / total if total > 0 else 1.0
    untrusted = NO_BANDWIDTH if beta == 0 else NO_LATENCY if alpha == 0 else None
    return Fit(Link(alpha, beta), [float(r) for r in (y - fitted) / y], r2, untrusted)


Endpoint = tuple[str, int]  # ("worker", i) or ("server", s): a process of the job


class Flow(NamedTuple):
    """Bytes one process sends another within a phase, in `messages` messages (a tuple, cheap
    to make: a parameter server's phase at 256 workers and 256 shards holds 65536)."""

    src: Endpoint
    dst: Endpoint
    nbytes: float
    messages: int = 1


Ports = dict[tuple, list[float]]  # (link, "out" | "in") -> [bytes, seconds] that a phase puts on it


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
    in_step: InStepTerms | None = None  # what an exchange inside a step adds (in_step.py):
    # where measured, each message on it costs `message_s` more than its link's back to back

    def node(self, end: Endpoint) -> int | tuple[str, int]:
        """The machine `end` runs on: a node's index, or a spare server machine."""
        kind, index = end
        if self.gpus_per_node is None:
            return 0
        if kind == "worker":
            return index // self.gpus_per_node
        return ("server machine", index % self.server_machines) if self.server_machines else index % self.nodes

    def ports(self, flows: list[Flow]) -> Ports:
        """What the flows of one phase put on each (link, direction): [bytes, seconds]."""
        ports: Ports = {}
        fixed = self.message_s
        # each process's node, once: a parameter server's phase has N x K flows among N + K processes
        node = {end: self.node(end) for end in {end for flow in flows for end in (flow.src, flow.dst)}}
        for flow in flows:
            here, there = node[flow.src], node[flow.dst]
            link: Link | None
            out: tuple
            into: tuple
            if here == there:
                link, out, into = self.intra, ("link", flow.src), ("link", flow.dst)
            else:
                link, out, into = self.inter, ("network", here), ("network", there)
            if link is None:
                raise ValueError(f"a flow from node {here} to node {there}, but no inter-node link was given")
            seconds = link.seconds(flow.nbytes, flow.messages) + fixed * flow.messages
            for port in ((out, "out"), (into, "in")):
                load = ports.setdefault(port, [0.0, 0.0])
                load[0] += flow.nbytes
                load[1] += seconds
        return ports

    @property
    def message_s(self) -> float:
        """What each message costs past its link's time back to back (`in_step`, where measured)."""
        return self.in_step.message_s if self.in_step else 0.0

    def loads(self, flows: list[Flow]) -> dict[tuple, float]:
        """link -> bytes over it each way (the larger of out and in)."""
        return link_loads([self.ports(flows)])

    def seconds(self, flows: list[Flow]) -> float:
        """A phase's time: its busiest link's (links are full duplex and work in parallel)."""
        return busiest_seconds(self.ports(flows))


def busiest_seconds(ports: Ports) -> float:
    """A phase's time from its ports: its busiest link's (links are full duplex and work in parallel)."""
    return max((seconds for _, seconds in ports.values()), default=0.0)


def link_loads(phases: list[Ports]) -> dict[tuple, float]:
    """link -> bytes over it each way in all `phases` together (the larger of out and in)."""
    totals: dict[tuple, float] = {}
    for ports in phases:
        for port, (nbytes, _) in ports.items():
            totals[port] = totals.get(port, 0.0) + nbytes
    loads: dict[tuple, float] = {}
    for (link, _), nbytes in totals.items():
        loads[link] = max(loads.get(link, 0.0), nbytes)
    return loads


def measured_network(commbench: CommbenchRecord | None) -> Network | None:
    """This host's network as one commbench JSON measured it (None without one): each
    process's point-to-point link, all-reduce and broadcast where timed, what it timed of
    strategies on the model (`calibrations`) and of an exchange inside a step (`in_step`)."""
    if not commbench:
        return None
    links = {name: Link(p.alpha_s, p.beta_s_per_byte) for name, p in commbench.primitives.items()}
    measured = commbench.shared_compute.in_step if commbench.shared_compute else None
    return Network(
        intra=links["send_recv"],
        all_reduce=links.get("all_reduce"),
        broadcast=links.get("broadcast"),
        calibrations=commbench.calibrations.strategies if commbench.calibrations else None,
        in_step=InStepTerms.of(measured) if measured else None,
    )
