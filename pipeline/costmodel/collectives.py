"""Collectives over a job's workers, and what each puts on a network's links: on one host, the
flows of a ring as they were measured (each rank to the next, `flows`); on a cluster of GPU
nodes, in closed form as NCCL runs them (`on_cluster`), so that 100,000 GPUs cost what 8 do.

NCCL's own cost model (src/graph/tuning.cc, "Simple" protocol) is followed, with this project's
links in place of its hardware tables:
  ring    2(N-1) steps for all-reduce, N-1 for all-gather and reduce-scatter, of which 2(n-1)
          and n-1 cross between the n nodes (NCCL orders a ring through each node's GPUs before
          leaving it): latency (steps - inter steps) x intra latency + inter steps x inter
          latency; each rank, and each node's network, moves steps/N of the buffer.
  tree    all-reduce only (a double binary tree across nodes, a chain through each node's
          GPUs): latency 2 ((N/n - 1) x intra latency + floor(log2 n) x inter latency); the
          buffer goes up and down (2 S), at NCCL's 90 % of the ring's bus bandwidth.
The bandwidth is the slower of a GPU's link and (across nodes) its node's network. NCCL chooses
the algorithm with the least predicted time for the size and scale; so does `on_cluster`, and
it names its choice. Left out: NCCL's LL and LL128 protocols for small messages, its per-size
tree corrections and per-generation caps (docs/measurements.md, "The cost model", compares the
closed forms with published nccl-tests figures).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from .network import Flow, Link, Network, Ports

TREE_BANDWIDTH = 0.9  # NCCL's tree bus bandwidth, of the ring's (tuning.cc: busBw * .9)
STEPS = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1}  # ring passes of N-1 steps


class Collective(NamedTuple):
    """One collective among the ranks ("worker", 0 .. workers-1) of a buffer of `nbytes` (the
    whole buffer: what all-reduce averages, all-gather assembles, reduce-scatter splits)."""

    kind: str  # a key of STEPS
    workers: int
    nbytes: float


class Timed(NamedTuple):
    """A collective as NCCL would run it on a cluster: its algorithm, seconds, and the bytes
    each way over each GPU's link and each node's network."""

    algorithm: str
    seconds: float
    link_bytes: float


Phase = list[Flow] | Collective  # what a strategy states of one phase of its iteration


def flows(collective: Collective) -> list[Flow]:
    """The collective as a ring of point-to-point flows, each rank to the next: all-reduce
    2(N-1)/N of the buffer in 2(N-1) messages, all-gather and reduce-scatter (N-1)/N in N-1."""
    n = collective.workers
    if n < 2:
        return []
    passes = STEPS[collective.kind]
    nbytes = collective.nbytes * passes * (n - 1) / n
    return [Flow(("worker", i), ("worker", (i + 1) % n), nbytes, passes * (n - 1)) for i in range(n)]


def as_flows(phase: Phase) -> list[Flow]:
    """A phase's flows (a collective's: its ring's)."""
    return flows(phase) if isinstance(phase, Collective) else phase


def ring(collective: Collective, network: Network) -> Timed:
    n, nodes = collective.workers, nodes_of(collective, network)
    passes = STEPS[collective.kind]
    steps, inter_steps = passes * (n - 1), passes * (nodes - 1)
    latency = (steps - inter_steps) * network.intra.alpha + (inter_steps and inter_steps * inter(network).alpha)
    nbytes = collective.nbytes * steps / n
    return Timed("ring", latency + nbytes * seconds_per_byte(network, nodes), nbytes)


def tree(collective: Collective, network: Network) -> Timed:
    n, nodes = collective.workers, nodes_of(collective, network)
    hops = math.floor(math.log2(nodes))  # across nodes, up (and down) the tree
    latency = 2 * ((n / nodes - 1) * network.intra.alpha + (hops and hops * inter(network).alpha))
    nbytes = 2 * collective.nbytes
    return Timed("tree", latency + nbytes * seconds_per_byte(network, nodes) / TREE_BANDWIDTH, nbytes)


def on_cluster(collective: Collective, network: Network) -> Timed:
    """NCCL's choice for `collective` on a cluster `network`: the algorithm of least predicted
    time (the ring on a tie, and for all but all-reduce, as NCCL has no other)."""
    if collective.workers < 2:
        return Timed("none", 0.0, 0.0)
    options = [ring(collective, network)] + ([tree(collective, network)] if collective.kind == "all_reduce" else [])
    return min(options, key=lambda timed: timed.seconds)


def ports(phase: Phase, network: Network) -> Ports:
    """What one phase puts on each (link, direction) of `network` ([bytes, seconds]): flows as
    `Network.ports` places them; a collective on one host as its ring's flows, on a cluster
    as NCCL runs it, its whole time on every GPU's link and node's network each way (NCCL's
    pipeline keeps them all busy for all of it; the ports stand for every GPU and node alike)."""
    if not isinstance(phase, Collective):
        return network.ports(phase)
    if network.gpus_per_node is None:
        return network.ports(flows(phase))
    timed = on_cluster(phase, network)
    if timed.seconds == 0:
        return {}
    links = [("link", "every GPU")] + ([("network", "every node")] if nodes_of(phase, network) > 1 else [])
    return {(link, way): [timed.link_bytes, timed.seconds] for link in links for way in ("out", "in")}


def algorithms(phases: Sequence[Phase], network: Network) -> str:
    """The collectives of `phases` and the algorithm NCCL would choose for each on a cluster
    `network` ("all_reduce: tree, all_gather: ring"); on one host, the rings measured there.
    "point-to-point" for flows alone, "none" where nothing is communicated."""
    named: dict[str, str] = {}
    for phase in phases:
        if isinstance(phase, Collective) and phase.workers > 1:
            chosen = on_cluster(phase, network).algorithm if network.gpus_per_node else "ring"
            named.setdefault(phase.kind, chosen)
    if not named:
        return "point-to-point" if any(as_flows(phase) for phase in phases) else "none"
    return ", ".join(f"{kind}: {algorithm}" for kind, algorithm in named.items())


def nodes_of(collective: Collective, network: Network) -> int:
    return math.ceil(collective.workers / network.gpus_per_node) if network.gpus_per_node else 1


def inter(network: Network) -> Link:
    """The link between nodes (read only where a collective spans more than one)."""
    if network.inter is None:
        raise ValueError("a collective across nodes, but no inter-node link was given")
    return network.inter


def seconds_per_byte(network: Network, nodes: int) -> float:
    """The slower of a GPU's link and, across nodes, its node's network."""
    return max(network.intra.beta, inter(network).beta) if nodes > 1 else network.intra.beta
