"""Where a stage's result came from, typed: runtime/provenance.collect's record (the stage's
params, code revision, package versions, its Hardware). The run summary, metrics.json and
commbench's files carry one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import OPTIONAL, OpenRecord


@dataclass(frozen=True)
class Hardware(OpenRecord):
    """The machine a stage ran on (runtime/provenance.hardware); GPU fields where torch saw CUDA."""

    machine: str | None = field(default=None, metadata=OPTIONAL)
    processor: str | None = field(default=None, metadata=OPTIONAL)
    cpu_count: int | None = field(default=None, metadata=OPTIONAL)
    hostname: str | None = field(default=None, metadata=OPTIONAL)
    os: str | None = field(default=None, metadata=OPTIONAL)
    cuda_available: bool | None = field(default=None, metadata=OPTIONAL)
    gpus: list[str] | None = field(default=None, metadata=OPTIONAL)
    cuda: str | None = field(default=None, metadata=OPTIONAL)
    driver: str | None = field(default=None, metadata=OPTIONAL)

    @property
    def model(self) -> str:
        """The processor's name, else the architecture, else '?'."""
        return self.processor or (self.machine if self.machine is not None else "?")

    @property
    def cores(self) -> str:
        return "?" if self.cpu_count is None else str(self.cpu_count)


@dataclass(frozen=True)
class Provenance(OpenRecord):
    """runtime/provenance.collect's record: the stage's params, code revision, package versions
    and hardware, plus the facts the stage adds (a training run: its sweep entry, seed, shape)."""

    params: dict | None = field(default=None, metadata=OPTIONAL)
    git_revision: str | None = field(default=None, metadata=OPTIONAL)
    packages: dict[str, str] | None = field(default=None, metadata=OPTIONAL)
    hardware: Hardware | None = field(default=None, metadata=OPTIONAL)
    argv: list[str] | None = field(default=None, metadata=OPTIONAL)
    knobs: dict | None = field(default=None, metadata=OPTIONAL)
    run: dict | None = field(default=None, metadata=OPTIONAL)  # the filled sweep entry
    seed: int | None = field(default=None, metadata=OPTIONAL)
    workers: int | None = field(default=None, metadata=OPTIONAL)
    processes: int | None = field(default=None, metadata=OPTIONAL)
    threads: int | None = field(default=None, metadata=OPTIONAL)
    device: str | None = field(default=None, metadata=OPTIONAL)
    backend: str | None = field(default=None, metadata=OPTIONAL)

    def package(self, name: str) -> str | None:
        return (self.packages or {}).get(name)

    @property
    def dataset(self) -> str | None:
        """The data the stage read: data.name of its params."""
        return ((self.params or {}).get("data") or {}).get("name")
