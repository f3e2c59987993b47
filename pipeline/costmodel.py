"""The cost model's shared half: links measured as latency + bytes x seconds-per-byte, their
least-squares fit from timings (pipeline/commbench.py), and the one place that adds compute,
data wait, optimizer and communication into a predicted iteration.

What each strategy communicates, and so how long it takes, is the strategy's own
(`Strategy.link_bytes` and `Strategy.communication_seconds` in pipeline/strategies/): ring
all-reduce in ddp.py, the scatter and gather through device 0 in dp.py, the parameter server's
busiest link in ps.py. Everything here is a prediction, and labelled as one where it is shown.
"""
from __future__ import annotations

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


@dataclass(frozen=True)
class Iteration:
    """A predicted iteration, the one place its parts add up: compute, data wait and optimizer
    from measured runs, communication from a strategy's model (which subtracts what overlaps)."""

    compute: float          # forward + backward of one worker's batch (measured: single's)
    data: float             # waiting for the loader
    optimizer: float        # the update (on the worker, or on the server)
    communication: float    # exposed communication: what overlap with backward leaves
    images: int             # images per iteration over all workers

    @property
    def seconds(self) -> float:
        return self.compute + self.data + self.optimizer + self.communication

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds > 0 else math.nan

