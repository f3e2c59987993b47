"""The contract between the workflow and a strategy: its spec, read without torch.

A strategy is one module holding two classes. Its spec, `Strategy(run, parallel)` registered
here, is built for one run: `run` a typed, filled sweep entry (pipeline/runtime/run.py, filled by
pipeline/strategies/sweep.py or `Strategy.filled`) and `parallel` the preset's parallel section.
The spec holds what the sweep, the workflow, the cost model and the report read: its sweep
options (with defaults and schema), the part of its run id that tells its runs apart
(`variant`), its display label, how many processes it starts and with which launcher, for
training and for evaluation, what it communicates and holds in theory, and what the study says
of it. Its runtime (process.py `Runtime`, built by `spec.runtime()` inside a training process)
wraps the model, synchronises gradients, counts what it communicates, checksums the replicas
and gathers the state a checkpoint saves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..config import schema
from ..costmodel import collectives
from ..costmodel.collectives import Phase
from ..costmodel.network import Link, Network, Ports, busiest_seconds
from ..runtime.run import RUN_FIELDS, Run
from .process import Runtime


@dataclass(frozen=True)
class Option:
    """A sweep-entry key that belongs to one strategy."""

    default: Any
    schema: dict  # JSON Schema of its value
    help: str = ""


class Strategy:
    """The spec: defaults describe one process on one device; strategies override what differs."""

    name = "base"  # the sweep's `strategy` value
    label = "base"  # its one display name: tables, figures, the report's and paper's prose
    options: dict[str, Option] = {}
    max_workers: int | None = None  # a strategy that cannot use more workers says so

    # ---- what the study says of it: read by the report, the paper and the workflow ----------
    # Its entry in the one-step equivalence check (pipeline/equivalence.py): workers and images
    # per worker, the same global batch as the baseline's; None: not checked (say why).
    equivalence_entry: dict | None = None
    # Its bytes per iteration by theory, for M bytes of gradients, and how its measured bytes
    # are counted: the report's and the paper's sentences ("" where nothing is communicated).
    theory_text = ""
    bytes_counted = ""
    # What its busiest process holds, by memory_theory (the report's memory sentence)
    memory_text = "the whole weights, gradients and momentum, M each (3M)"
    # What the time split's communication holds for its runs (the report's and paper's
    # definition): "" where nothing is communicated; None where its exchanges run inside the
    # forward and backward passes, so that the loop cannot time them apart from compute
    communication_timed: str | None = ""

    @classmethod
    def is_baseline(cls, variant: str) -> bool:
        """Whether runs of this variant are the ones every speed-up is measured against."""
        return False

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        """The predicted-scaling curves it draws (pipeline/report/clusters.py): label -> its
        sweep entry without workers; `predict` is the report.predict section."""
        return {}

    @classmethod
    def filled(cls, **given) -> Run:
        """A run of this strategy: the fields and options `given`, every other option at its
        declared default. The sweep fills its entries so (sweep.fill); so are the runs nobody
        swept (a predicted curve, a timing, a test) and a run recorded before one of the
        options existed (it ran with what is now the default)."""
        unknown = sorted(set(given) - set(RUN_FIELDS) - set(cls.options))
        if unknown:
            raise ValueError(f"{cls.name}: no option '{unknown[0]}' (its options: {', '.join(cls.options) or 'none'})")
        return Run.from_json({**{k: o.default for k, o in cls.options.items()}, **given, "strategy": cls.name})

    def __init__(self, run: Run, parallel: schema.Parallel):
        self.run, self.parallel = run, parallel

    # ---- what the sweep and the report need (no process is started) -----------------------
    @classmethod
    def variant(cls, run: Run) -> str:
        """What tells this strategy's runs apart besides workers and batch ('' if nothing)."""
        return ""

    @classmethod
    def invalid(cls, run: Run) -> str | None:
        """Why this sweep entry makes no sense for the strategy (checked before any job)."""
        if cls.max_workers is not None and run.workers > cls.max_workers:
            return (
                f"{cls.name} runs at most {cls.max_workers} worker(s), not {run.workers} (use ddp, ps or dp for more)"
            )
        return None

    def processes(self) -> int:
        """How many processes the job starts (over all nodes)."""
        return 1

    def nodes(self) -> int:
        """Machines the job spans (one process, or one DataParallel process: one machine)."""
        return 1

    def processes_per_node(self) -> int:
        return self.processes()

    def gpus(self) -> int:
        """GPUs the job needs on one node (0: runs on CPU, or uses a GPU where one is visible)."""
        return 0

    def evaluation_processes(self) -> int:
        """How many processes evaluation starts (always on one node)."""
        return 1

    def unavailable(self) -> str | None:
        """Why this run cannot run on this machine (checked before any process starts)."""
        return None

    # ---- how processes start -----------------------------------------------------------
    def launcher(self, python: str) -> list[str]:
        """Command prefix that starts the processes of `-m pipeline.training.train ...`."""
        return [python]

    def evaluation_launcher(self, python: str) -> list[str]:
        """Command prefix that starts the processes of `-m pipeline.detection.evaluate ...`."""
        return [python]

    def batch_per_process(self) -> int:
        """Images each training process loads per iteration."""
        return self.run.images_per_worker

    # ---- the cost model (its shared half is pipeline/costmodel/network.py) ----------------
    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> Sequence[Phase] | None:
        """The messages of one iteration by the algorithm's analysis, for M = grad_bytes, phase
        by phase (a phase starts when the one before has ended): point-to-point flows, or a
        collective (costmodel/collectives.py, which times it as NCCL runs it on a cluster).
        None: no model is stated (the report says so); []: nothing is communicated."""
        return None

    @classmethod
    def calibrate(cls, timed) -> dict[str, float] | None:
        """What the commbench stage times of this strategy on the preset's own model, where no
        link model sees its cost, for its `communication_seconds` (`network.calibrations`):
        `timed(wrap)` is the mean rank's median seconds of one forward + backward of the model
        wrapped by `wrap(model)` (None: as it is), every process at once. None: nothing to time,
        its links say it all."""
        return None

    @classmethod
    def waits_for_slowest(cls, run: Run) -> bool:
        """Whether each step waits for every worker's batch, so that the cost model adds the
        expected wait for the slowest worker (costmodel.predict.slowest_wait): true for a
        synchronous strategy of more than one worker."""
        return run.workers > 1

    @classmethod
    def link_bytes(cls, run: Run, grad_bytes: float) -> dict[str, float]:
        """Bytes per iteration, each way, over the last worker's link and over the job's
        busiest link (a server's, device 0's), all processes on one host."""
        flows = [flow for phase in cls.phases(run, grad_bytes) or [] for flow in collectives.as_flows(phase)]
        loads = Network(Link(0.0, 0.0)).loads(flows)
        return {
            "worker": loads.get(("link", ("worker", run.workers - 1)), 0.0),
            "busiest": max(loads.values(), default=0.0),
        }

    @classmethod
    def communication_seconds(cls, run: Run, grad_bytes: float, network: Network, backward: float) -> float:
        """Predicted communication seconds per iteration that no computation hides, given
        `backward` seconds of backward pass to overlap with: by default the phases one after
        the other, none overlapping. NaN: this strategy states no model (the report says so)."""
        ports = cls.phase_ports(run, grad_bytes, network)
        return math.nan if ports is None else sum(map(busiest_seconds, ports))

    @classmethod
    def phase_ports(cls, run: Run, grad_bytes: float, network: Network) -> list[Ports] | None:
        """What each phase puts on each link of `network` (`Network.ports`): by default its
        flows' (`phases`), one by one. A strategy whose flows grow faster than its processes
        counts them in closed form instead (ps.py: N workers x K servers)."""
        phases = cls.phases(run, grad_bytes)
        return None if phases is None else [collectives.ports(phase, network) for phase in phases]

    @classmethod
    def algorithms(cls, run: Run, grad_bytes: float, network: Network) -> str:
        """The collectives of `phases` and the algorithm each runs on `network` (NCCL's choice
        on a cluster), for the what-if's output ("point-to-point": flows alone; "none")."""
        return collectives.algorithms(cls.phases(run, grad_bytes) or [], network)

    @classmethod
    def timed_communication_seconds(cls, run: Run, grad_bytes: float, network: Network, backward: float) -> float:
        """The part of `communication_seconds` that a run's time split counts as communication
        (`communication_timed`): the cost model's like for like with what a run measures. By
        default all of it."""
        return cls.communication_seconds(run, grad_bytes, network, backward)

    # ---- memory: what each process holds ----------------------------------------------------
    @classmethod
    def memory_theory(cls, run: Run, grad_bytes: float) -> dict[str, float]:
        """Bytes of parameters, gradients and optimizer state (SGD's momentum) that the process
        holding the most keeps, by the algorithm's analysis, for M = grad_bytes: a whole copy
        of each, unless the strategy shards them."""
        return {"parameters": grad_bytes, "gradients": grad_bytes, "optimizer": grad_bytes}

    # ---- inside a training process ---------------------------------------------------------
    def runtime(self) -> Runtime:
        """This run's strategy in one training process (process.py)."""
        return Runtime(self)
