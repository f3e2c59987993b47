"""`single`: one process, one device, no synchronisation. The baseline every strategy is
compared with; its update is the reference the others must reproduce.

`threads: T` pins its torch threads (0: train.threads, as every strategy). A pinned run is not
the baseline: it is the cost model's compute input at the threads each process of a
multi-process CPU run gets (cores / processes), measured rather than scaled
(pipeline/report/prediction.py)."""

from __future__ import annotations

from ..runtime.run import Run
from .base import Option, Strategy
from .process import Context, Runtime


class Single(Strategy):
    name = "single"
    label = "single process"
    max_workers = 1
    options = {"threads": Option(0, {"type": "integer", "minimum": 0}, "torch threads of this run (0: train.threads)")}
    # The reference every multi-worker strategy's one step is compared with: the same 8 images.
    equivalence_entry = {"workers": 1, "images_per_worker": 8}

    @classmethod
    def is_baseline(cls, variant: str) -> bool:
        """`single` as configured; one with pinned threads is the cost model's input."""
        return not variant

    @classmethod
    def variant(cls, run: Run) -> str:
        threads = run.option("threads")
        return f"t{threads}" if threads else ""

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> list:
        return []  # nothing to synchronise

    def runtime(self) -> SingleRuntime:
        return SingleRuntime(self)


class SingleRuntime(Runtime):
    def start(self, threads: int) -> Context:
        return super().start(self.run.option("threads") or threads)
