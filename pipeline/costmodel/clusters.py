"""The hypothetical clusters of `report.predict` (params.yaml) the cost model predicts on, and one
GPU's measured or assumed compute (pipeline/report/clusters.py fills them in)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from .network import Link, Network


@dataclass(frozen=True)
class Compute:
    """One GPU's work per image and the gradient bytes M, and where they come from."""

    seconds_per_image: float  # forward + backward (+ data wait and optimizer, when measured)
    gradient_bytes: float
    source: str
    variance_per_image: float = math.nan  # of compute, when measured: the slowest worker's wait


@dataclass(frozen=True)
class Cluster:
    name: str
    gpus_per_node: int
    nodes: int
    intra: Link
    inter: Link
    spare_cpu_machines_per_node: int

    @classmethod
    def of(cls, cfg: dict) -> "Cluster":
        return cls(cfg["name"], cfg["gpus_per_node"], cfg["nodes"],
                   Link.from_bandwidth(cfg["intra_gbit_s"], cfg["intra_latency_us"]),
                   Link.from_bandwidth(cfg["inter_gbit_s"], cfg["inter_latency_us"]),
                   cfg["spare_cpu_machines_per_node"])

    def gpu_counts(self) -> list[int]:
        """1, 2, 4 .. one node's GPUs, then whole nodes doubling up to all of them."""
        within = [g for g in (2 ** i for i in range(12)) if g < self.gpus_per_node] + [self.gpus_per_node]
        across = [self.gpus_per_node * n for n in (2 ** i for i in range(1, 12)) if n < self.nodes]
        return within + across + ([self.gpus_per_node * self.nodes] if self.nodes > 1 else [])

    def nodes_for(self, gpus: int) -> int:
        return math.ceil(gpus / self.gpus_per_node)

    def network(self, gpus: int) -> Network:
        return Network(intra=self.intra, inter=self.inter, gpus_per_node=self.gpus_per_node,
                       nodes=self.nodes_for(gpus), server_machines=self.servers(gpus, spare_only=True))

    def servers(self, gpus: int, spare_only: bool = False) -> int:
        """K of the sharded parameter server: one per spare CPU machine (without any, one on
        the GPU nodes; `spare_only`: the spare machines alone)."""
        spare = self.spare_cpu_machines_per_node * self.nodes_for(gpus)
        return spare if spare_only else max(1, spare)
