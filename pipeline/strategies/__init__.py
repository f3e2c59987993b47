"""Data-parallel strategies: one module each, its spec and its runtime (base.py, process.py).

    single.py    one process, one device: the reference
    dp.py        torch.nn.DataParallel: one process, GPU 0 scatters, gathers and updates
    ddp.py       DistributedDataParallel: ring all-reduce during backward, optional compression
    ps.py        parameter server over point-to-point messages, co-located or dedicated
    zero.py      ZeRO-1: DDP with ZeroRedundancyOptimizer, each rank steps 1/N of the weights
    fsdp.py      FSDP2 (fully_shard): weights, gradients and optimizer state sharded per block
    torchrun.py  what the multi-process ones (ddp, ps, zero, fsdp) share: torchrun, the
                 process group, the machine checks
    sweep.py     the sweep's entries filled from their defaults, checked and named
    base.py      the spec every strategy declares: options, processes, launcher, cost model, texts
    process.py   the runtime every strategy builds in a training process: wrap, step, state

The training loop in pipeline/training/train.py is the same for all of them. A new strategy is a module
here and one entry in REGISTERED below; nothing else in the pipeline names strategies:
what the study says of one (its display name, its equivalence entry, its predicted curves, how
its bytes are counted, whether it is the baseline) is declared on its spec (base.py), its
options too (the sweep fills them into a typed Run: pipeline/runtime/run.py), and the facts it
records of its own in its module (pipeline/runtime/records/base.py `declare_facts`). Its spec is read
where torch is not loaded (the Snakefile, the sweep, the report); torch is imported by its
runtime, built by `get(run, parallel).runtime()` in a training process.
"""

from __future__ import annotations

import functools

from ..config import schema, stages
from ..runtime.run import Run
from .base import Option, Strategy
from .ddp import DDP
from .dp import DataParallel
from .fsdp import FSDP
from .process import Context, Runtime, Traffic
from .ps import ParameterServer
from .single import Single
from .zero import Zero

REGISTERED: tuple[type[Strategy], ...] = (Single, DataParallel, DDP, ParameterServer, Zero, FSDP)
STRATEGIES: dict[str, type[Strategy]] = {cls.name: cls for cls in REGISTERED}


def lookup(name: str | None) -> type[Strategy]:
    try:
        return STRATEGIES[name]  # type: ignore[index]  # None (no strategy given) is not a key: refused below
    except KeyError:
        raise ValueError(f"sweep.strategy: unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}") from None


@functools.cache  # asked once per run while the workflow plans
def not_run_by(name: str) -> frozenset[str]:
    """The registered strategies' modules that a run of strategy `name` does not execute: all
    but its own and those it builds on (zero on ddp). This registry imports them all, but a run
    calls only its own, so an edit to ddp.py retrains ddp's and zero's runs, not single's
    (pipeline/config/stages.py: a run's code files; its checkpoint's fingerprint)."""
    own = stages.executed_modules((lookup(name).__module__,), frozenset({__name__}))
    return frozenset(cls.__module__ for cls in REGISTERED) - set(own)


def get(run: Run, parallel: schema.Parallel) -> Strategy:
    """The spec of one run's strategy; `.runtime()` builds it in a training process."""
    return lookup(run.strategy)(run, parallel)


def recorded(run: Run) -> Run:
    """A run as a summary recorded it, with the options it predates at their declared defaults
    (what it ran with): what the cost model reads of a run folder of any age."""
    return lookup(run.strategy).filled(**run.to_json())


__all__ = [
    "DDP",
    "FSDP",
    "Context",
    "DataParallel",
    "Option",
    "ParameterServer",
    "REGISTERED",
    "Run",
    "Runtime",
    "Single",
    "Strategy",
    "STRATEGIES",
    "Traffic",
    "Zero",
    "get",
    "lookup",
    "not_run_by",
    "recorded",
]
