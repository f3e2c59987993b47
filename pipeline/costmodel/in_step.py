"""The exchange inside a step: what a collective costs when a training step issues it, beyond
what commbench's back-to-back timings of the links show. Fitted here, without torch, from the
timings pipeline/commbench/in_step.py takes with every process computing the model's forward +
backward, as training does. Each term is named, and shown in the report:

  wait        for the slower worker: a synchronous exchange ends only after the last worker's
              compute, so worker r waits max_i(c_i) - c_r, c the compute of each process. Measured
              directly (`wait_s`), and the variance of one process's compute about the others' with
              every process computing at once (`variance_s2`), from which predict.slowest_wait's formula
              predicts it (`formula_wait_s`: the check of that formula on this machine).
  contention  of a collective with the compute threads: a bucket all-reduced while every process
              computes takes `contention` x its back-to-back time (DDP's buckets but the last).
  fixed cost  per bucket of DDP's all-reduce, the communication hook's own work (plain: the
              division by N) included (`bucket_s`), and per point-to-point message of a parameter
              server's exchange (`message_s`): what the exchange after a compute burst takes
              beyond the wait and the link's back-to-back seconds at its size.
  hook work   seconds per byte of a bucket that each hook spends on its own (fp16/bf16: the
              compression and the copy back), beside plain's (`hook_s_per_byte`).

A step's exchange on this host is then its links' seconds + the fixed costs + the wait (each
strategy's `communication_seconds` adds the fixed costs; predict.iteration the wait, from
`variance_s2` in place of single's variance over its iterations alone). A term its timings did
not resolve (nan, negative: noise larger than the effect) is taken at its floor, and the record
says why (`resolved`): the cost model never adds or multiplies a nan or a negative time.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class InStepTerms:
    """The terms one commbench job measured at `processes` processes, `images` per process."""

    processes: int
    images: int
    wait_s: float  # measured, the mean process's, per step of `images`
    variance_s2: float  # of one process's compute of `images`, all computing at once
    alone_variance_s2: float  # ... of rank 0's computing alone (the others at a barrier)
    contention: float  # a bucket's all-reduce during compute over its back-to-back
    bucket_s: float  # fixed cost of one all-reduce bucket after compute (plain hook)
    message_s: float  # fixed cost of one point-to-point message after compute
    buckets: list[float] = field(default_factory=list)  # DDP's buckets of the model, in order
    hook_s_per_byte: dict[str, float] = field(default_factory=dict)  # hook -> its own work

    @classmethod
    def of(cls, record) -> InStepTerms:
        """The terms of a commbench JSON's `in_step` (runtime/records/commbench.py InStep)."""
        return cls(
            record.processes,
            record.images,
            record.wait_s,
            record.variance_s2,
            record.alone_variance_s2,
            record.contention,
            record.bucket_s,
            record.message_s,
            list(record.buckets),
            dict(record.hook_s_per_byte),
        )

    def buckets_of(self, grad_bytes: float) -> list[float] | None:
        """DDP's buckets as commbench found them on the model, where it is the model of
        `grad_bytes` (None: another model's, whose tensors were not seen)."""
        total = sum(self.buckets)
        return list(self.buckets) if total and abs(total - grad_bytes) <= 0.01 * grad_bytes else None

    @property
    def variance_per_image(self) -> float:
        """The variance of compute per image that sets one process apart from the others, with
        every process computing at once (images taken as independent, as slowest_wait does)."""
        return self.variance_s2 / max(1, self.images)

    def bucket_cost(self, hook: str, nbytes: float) -> float:
        """Fixed seconds of one all-reduce bucket of `nbytes` through `hook` (none, fp16, bf16;
        an unmeasured hook as plain): plain's fixed cost plus what the hook's own work adds."""
        per_byte = self.hook_s_per_byte
        extra = per_byte.get(hook, per_byte.get("none", 0.0)) - per_byte.get("none", 0.0)
        return self.bucket_s + extra * nbytes


def wait_of(compute: list[list[float]]) -> float:
    """The mean wait for the slowest process: over repeats (each every rank's compute seconds,
    started together), the mean over ranks of max(c) - c_r."""
    waits = [max(row) - c for row in compute for c in row]
    return statistics.fmean(waits) if waits else math.nan


def variance_of(compute: list[list[float]]) -> float:
    """The variance of one process's compute about its repeat's mean over the processes (the
    mean over repeats of each repeat's variance across the ranks): what sets one process apart
    from the others, and so the wait. A slowdown every process shares at once (another job on
    the machine, a repeat that computes more) makes no one wait, and is left out; over repeats
    per process it was counted, and slowest_wait's formula then overstated the measured wait
    2.2x on a loaded 2-core machine."""
    rows = [row for row in compute if len(row) > 1]
    return statistics.fmean(statistics.variance(row) for row in rows) if rows else math.nan


def fixed_cost_of(exchange: list[list[float]], compute: list[list[float]], link_s: float, messages: int = 1) -> float:
    """Seconds per message that an exchange after a compute burst takes beyond its wait and its
    link's back-to-back `link_s` (for all its `messages`): the median over repeats and ranks of
    exchange - wait - link_s, over `messages`. `exchange` and `compute` are [repeat][rank]."""
    extra = [
        t - (max(row) - c) - link_s
        for times, row in zip(exchange, compute, strict=False)
        for t, c in zip(times, row, strict=False)
    ]
    return statistics.median(extra) / messages if extra else math.nan


def contention_of(during: list[float], link_s: float) -> float:
    """How much longer a collective takes while the processes compute than back to back: the
    median of its seconds `during` compute over `link_s`."""
    return statistics.median(during) / link_s if during and link_s > 0 else math.nan


# What a term is taken as where its timings did not resolve it: no wait, no variance, no
# contention (x1: as back to back), no fixed cost. Each is the term's physical floor.
NEUTRAL = {
    "wait_s": 0.0,
    "variance_s2": 0.0,
    "alone_variance_s2": 0.0,
    "contention": 1.0,
    "bucket_s": 0.0,
    "message_s": 0.0,
}


def resolved(terms: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """The terms with each one its timings did not resolve (nan: nothing to fit it from;
    negative or infinite: noise larger than the effect, e.g. an exchange that took less than
    its link's back-to-back seconds) replaced by its NEUTRAL floor, and why, by term: no term
    the cost model multiplies or adds is ever nan, infinite or negative."""
    kept, why = dict(terms), {}
    for key, floor in NEUTRAL.items():
        value = terms.get(key)
        if not isinstance(value, float | int) or (math.isfinite(value) and value >= 0):
            continue
        found = (
            "no timings to fit it from"
            if math.isnan(value)
            else f"it came out {value:.3g}, noise larger than the effect"
        )
        kept[key] = floor
        why[key] = f"not resolved ({found}): taken as {floor:g}"
    return kept, why
