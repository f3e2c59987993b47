"""A commbench file, typed (results/commbench/<preset>/p<N>.json, pipeline/commbench/):
CommbenchRecord, with a LinkFit per primitive, the SharedCompute factor and its InStep, the
strategies' Calibrations, and each measurement's Check against its bands. All are OpenRecords:
the timings behind a fit are kept as other keys.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import OPTIONAL, OpenRecord
from .provenance import Provenance


@dataclass(frozen=True)
class Check(OpenRecord):
    """How a commbench measurement was checked against its bands (costmodel/bands.py): its
    attempts, the one kept, and why it is `disturbed` (None: inside its bands)."""

    attempts: list[dict] = field(default_factory=list)
    kept: int | None = None
    disturbed: str | None = None


@dataclass(frozen=True)
class LinkFit(OpenRecord):
    """One primitive's fit, seconds = alpha_s + beta_s_per_byte x bytes, over its timings."""

    alpha_s: float
    beta_s_per_byte: float
    bandwidth_gbit_s: float | None = None
    r2: float | None = None
    relative_residuals: list[float] = field(default_factory=list)
    check: Check | None = None
    untrusted: str | None = field(default=None, metadata=OPTIONAL)  # why a term sits at its bound of 0 (network.fit)


@dataclass(frozen=True)
class InStep(OpenRecord):
    """The exchange inside a step (pipeline/commbench/in_step.py, fitted by
    pipeline/costmodel/in_step.py): the wait for the slower worker (measured, and what
    slowest_wait's formula makes of `variance_s2`), contention with compute, the fixed cost per
    DDP bucket and per point-to-point message, each hook's own work per byte; DDP's `buckets`
    of the model. Its timings are kept as other keys."""

    processes: int
    images: int
    wait_s: float
    variance_s2: float
    alone_variance_s2: float
    contention: float
    bucket_s: float
    message_s: float
    bucket_bytes: float
    buckets: list[float] = field(default_factory=list)
    hook_s_per_byte: dict[str, float] = field(default_factory=dict)
    formula_wait_s: float | None = None
    untrusted: dict[str, str] | None = field(default=None, metadata=OPTIONAL)  # term -> why it was not resolved


@dataclass(frozen=True)
class SharedCompute(OpenRecord):
    """Forward + backward of `images` alone and with every process at once: `factor` slower;
    `in_step`, what an exchange costs inside such a step (None: before it was measured)."""

    factor: float
    expected: float = 1.0  # a quiet machine's factor (before it was recorded: 1)
    images: int | None = None
    alone_s: float | None = None
    together_s: float | None = None
    check: Check | None = None
    in_step: InStep | None = field(default=None, metadata=OPTIONAL)

    @property
    def disturbed(self) -> bool:
        return bool(self.check and self.check.disturbed)


@dataclass(frozen=True)
class Calibrations(OpenRecord):
    """Strategies timed on the model: name -> setting -> seconds (fsdp: keep_s, reshard_s)."""

    strategies: dict[str, dict[str, float]] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)
    images: int | None = None


@dataclass(frozen=True)
class CommbenchRecord(OpenRecord):
    """results/commbench/<preset>/p<N>.json (pipeline/commbench/): this host's links at
    `processes` processes, the shared-compute factor and the strategies timed on the model."""

    processes: int
    primitives: dict[str, LinkFit] = field(default_factory=dict)  # send_recv, all_reduce, ...
    backend: str | None = None
    shared_compute: SharedCompute | None = None
    calibrations: Calibrations | None = None
    disturbed: list[str] = field(default_factory=list)
    provenance: Provenance | None = None
