"""One run of the sweep, typed: what a strategy, the launcher and the training read of it.

The sweep fills it once (pipeline/strategies/sweep.py `fill`: every default applied, every key
checked against its strategy); `to_json`/`from_json` carry it across the launch boundary (the
launcher's and the training's --entry), into the provenance and the run summary. Its JSON is the
filled sweep entry as it always was, so run ids, checkpoint fingerprints and Snakemake's params
stay what they were.

It lives on the ground floor because the run record (records/training.py) carries it; it knows no
strategy: a strategy's options are a mapping here, declared and defaulted by the strategy.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any


class RunError(KeyError):
    """A run read for an option its strategy does not declare: the message names it."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class Run:
    """A filled sweep entry with its seed. The defaults here are those of an entry made by hand
    (a predicted curve, a test): the sweep states every field from the preset."""

    strategy: str
    workers: int
    images_per_worker: int = 1
    data_mode: str = "real"  # real: the loader decodes and augments; synthetic: in memory
    precision: str = "fp32"  # runs before mixed precision: fp32
    norm: str = "batchnorm"  # the tiny model's normalisation (model.norm; runs before it: batchnorm)
    seed: int = 0
    options: Mapping[str, Any] = field(default_factory=dict)  # the strategy's declared options

    def option(self, key: str) -> Any:
        try:
            return self.options[key]
        except KeyError:
            raise RunError(
                f"{self.strategy} run: no option '{key}' (its options: "
                f"{', '.join(self.options) or 'none'}); declare it among the "
                "strategy's `options`, or fill the run through "
                "pipeline/strategies/sweep.py"
            ) from None

    def to_json(self) -> dict:
        """The filled sweep entry: the common keys, the options beside them, then the seed."""
        common = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("seed", "options")}
        if self.norm == "batchnorm":  # as every run before the knob wrote it: same params, same ids
            del common["norm"]
        return {**common, **self.options, "seed": self.seed}

    @classmethod
    def from_json(cls, raw: Mapping, where: str = "run") -> Run:
        """A run from its JSON object: every key that is not a common field is an option."""
        try:
            return cls(
                **{k: v for k, v in raw.items() if k in RUN_FIELDS},
                options={k: v for k, v in raw.items() if k not in RUN_FIELDS},
            )
        except TypeError as err:  # strategy or workers missing
            raise ValueError(f"{where}: not a run ({err}); a run names at least its strategy and workers") from None

    def replace(self, **changes) -> Run:
        """This run with some common fields or options changed (an option stays an option)."""
        return Run.from_json({**self.to_json(), **changes})


RUN_FIELDS = tuple(f.name for f in fields(Run) if f.name != "options")  # what no option is named
NORMS = ("batchnorm", "groupnorm")  # model.norm and a sweep entry's `norm` (detection/model.py)

__all__ = ["NORMS", "RUN_FIELDS", "Run", "RunError"]
