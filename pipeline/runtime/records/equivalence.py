"""The one-step equivalence check's file, typed (results/equivalence/<preset>.json,
pipeline/equivalence.py): EquivalenceRecord, a StepCheck per strategy and the SplitDistance of
each cause of the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .base import OPTIONAL, Record


@dataclass(frozen=True)
class StepCheck(Record):
    """One strategy's step beside single's: the largest weight difference, absolute and relative
    to single's step, or why it was `skipped`."""

    max_abs_difference: float | None = None
    relative_to_step: float | None = None
    skipped: str | None = field(default=None, metadata=OPTIONAL)
    # |step - single's step| / |single's step| over all weights (None: before it was measured)
    step_distance: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class SplitDistance(Record):
    """Under one `norm`, how far 2 workers x 4 images move the step of 1 worker x 8, relative
    to its norm: `split` (4 + 4, averaged) and `resample` (the same 8 images, another sampling
    seed) from one process (pipeline/detection/split_probe.py); `launched`: ddp-w2's step
    against single's, the real strategies from the same weights (pipeline/equivalence.py)."""

    norm: str
    split: float
    resample: float
    launched: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class EquivalenceRecord(Record):
    """results/equivalence/<preset>.json (pipeline/equivalence.py): one SGD step of each
    strategy from the same weights and batch as the `reference` single run."""

    reference: str
    max_abs_step_of_single: float
    why: str
    strategies: dict[str, StepCheck] = field(default_factory=dict)
    # Each cause of the difference with and without it (the tiny model's norms; before: none)
    causes: list[SplitDistance] | None = field(default=None, metadata=OPTIONAL)

    @property
    def relative_steps(self) -> dict[str, float]:
        """strategy -> how far its step landed from single's, relative to the step, where run."""
        return {
            name: step.relative_to_step
            for name, step in self.strategies.items()
            if step.skipped is None and step.relative_to_step is not None
        }
