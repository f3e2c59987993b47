"""The contract between the training loop and a strategy.

A strategy is built for one run: `Strategy(run, parallel)`, where `run` is a typed, filled sweep
entry (pipeline/runtime/run.py, filled by pipeline/strategies/sweep.py or `Strategy.filled`) and
`parallel` the preset's parallel section. Everything about it lives on
its class: its sweep options (with defaults and schema), the part of its run id that tells its
runs apart (`variant`), its display label, how many processes it starts and with which launcher,
for training and for evaluation, how it wraps the model and synchronises gradients, what it
communicates (measured and in theory), how its replicas are checksummed, and who checkpoints.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..costmodel.network import Flow, Link, Network
from ..runtime.distributed import available_cores, default_device
from ..runtime.run import RUN_FIELDS, Run

if TYPE_CHECKING:
    import torch

# torch is imported by what runs a process (each function below that needs it): the registry's
# facts (the sweep, the Snakefile, the report) are read where torch is not loaded.


@dataclass(frozen=True)
class Option:
    """A sweep-entry key that belongs to one strategy."""

    default: Any
    schema: dict  # JSON Schema of its value
    help: str = ""


def _cpu():
    import torch
    return torch.device("cpu")


@dataclass
class Context:
    """What one training process knows about its place in the job."""

    rank: int = 0                 # global process rank
    processes: int = 1            # processes in the job (a dedicated ps server included)
    device: torch.device = field(default_factory=_cpu)
    threads: int = 1
    backend: str = "none"
    shard: int | None = 0         # the part of the data this process trains on; None: no data
    shards: int = 1               # parts the data is split into (1 for single and dp)
    role: str = "worker"          # "worker", "server" (dedicated ps) or "server+worker"

    @property
    def reports(self) -> bool:
        """The first worker writes the iteration log and the run summary."""
        return self.shard == 0


@dataclass
class Traffic:
    """Bytes this process sent and received, and seconds the backward pass waited on
    communication, since the last `take()`."""

    sent: int = 0
    received: int = 0
    backward_wait: float = 0.0

    def take(self) -> "Traffic":
        taken = Traffic(self.sent, self.received, self.backward_wait)
        self.sent, self.received, self.backward_wait = 0, 0, 0.0
        return taken


def gradient_bytes(model: torch.nn.Module) -> int:
    """M: the bytes of one full set of gradients (the trainable parameters)."""
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def local_bytes(tensor) -> int:
    """Bytes this process holds of a tensor: a sharded one (FSDP's DTensor) counts its shard."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def owned_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters, gradients and optimizer state this process holds, counted from the
    tensors themselves (a sharded optimizer's inner one holds only its partition's state)."""
    import torch
    params = list(model.parameters())
    inner = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's local SGD
    return {"parameters": sum(local_bytes(p) for p in params),
            "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
            "optimizer": sum(local_bytes(v) for state in inner.state.values()
                             for v in state.values() if torch.is_tensor(v) and v.dim() > 0)}


def changing_buffers(model: torch.nn.Module) -> list:
    """The buffers training changes, which replicas must share: BatchNorm's running statistics.
    A frozen BatchNorm's (the pretrained backbone's) are constants, and integer batch counters
    are the same everywhere: syncing them would move R50's 0.4 MB, and launch a copy per
    tensor, every iteration for nothing."""
    from torchvision.ops.misc import FrozenBatchNorm2d
    return [b for module in model.modules() if not isinstance(module, FrozenBatchNorm2d)
            for b in module.buffers(recurse=False) if b.is_floating_point()]


def parameter_checksum(model: torch.nn.Module) -> str:
    """Of the parameters only: DDP ranks' BatchNorm buffers differ until the next forward pass
    copies rank 0's over them."""
    return tensor_checksum(model.parameters())


def tensor_checksum(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Strategy:
    """Defaults describe one process on one device; strategies override what differs."""

    name = "base"      # the sweep's `strategy` value
    label = "base"     # its one display name: tables, figures, the report's and paper's prose
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
    def predicted_curves(cls, predict: dict) -> dict[str, dict]:
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
            raise ValueError(f"{cls.name}: no option '{unknown[0]}' (its options: "
                             f"{', '.join(cls.options) or 'none'})")
        return Run.from_json({**{k: o.default for k, o in cls.options.items()}, **given,
                              "strategy": cls.name})

    def __init__(self, run: Run, parallel: dict):
        self.run, self.parallel = run, parallel
        self._traffic = Traffic()

    # ---- what the sweep and the report need (no process is started) -----------------------
    @classmethod
    def variant(cls, run: Run) -> str:
        """What tells this strategy's runs apart besides workers and batch ('' if nothing)."""
        return ""

    @classmethod
    def invalid(cls, run: Run) -> str | None:
        """Why this sweep entry makes no sense for the strategy (checked before any job)."""
        if cls.max_workers is not None and run.workers > cls.max_workers:
            return (f"{cls.name} runs at most {cls.max_workers} worker(s), not {run.workers} "
                    "(use ddp, ps or dp for more)")
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

    def start(self, threads: int) -> Context:
        import torch
        threads = threads or available_cores()
        torch.set_num_threads(threads)
        return Context(device=default_device(), threads=threads)

    # ---- the training step ---------------------------------------------------------------
    def batch_per_process(self) -> int:
        return self.run.images_per_worker

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        return model

    def optimizer(self, params, **sgd) -> torch.optim.Optimizer:
        """The optimizer over `params` (SGD's keywords): SGD, unless the strategy shards it."""
        import torch
        return torch.optim.SGD(params, **sgd)

    def grad_scaler(self, device: torch.device):
        """fp16's loss scaler (pipeline/training/precision.py). Every process that steps must
        skip the same steps: true where each holds the whole averaged gradients."""
        import torch
        return torch.amp.GradScaler(device.type)

    def step(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: Context) -> float:
        """Synchronise gradients and update the weights; return seconds spent communicating."""
        optimizer.step()
        return 0.0

    def traffic(self) -> Traffic:
        """What this process communicated since the last call."""
        return self._traffic.take()

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        """Bytes per iteration this process should send and receive, by the algorithm's analysis."""
        return {"sent": 0.0, "received": 0.0}

    # ---- the cost model (its shared half is pipeline/costmodel/network.py) --------------------------------
    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> list[list[Flow]] | None:
        """The messages of one iteration by the algorithm's analysis, for M = grad_bytes, phase
        by phase (a phase starts when the one before has ended). None: no model is stated
        (the report says so); []: nothing is communicated."""
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
        flows = [flow for phase in cls.phases(run, grad_bytes) or [] for flow in phase]
        loads = Network(Link(0.0, 0.0)).loads(flows)
        return {"worker": loads.get(("link", ("worker", run.workers - 1)), 0.0),
                "busiest": max(loads.values(), default=0.0)}

    @classmethod
    def communication_seconds(cls, run: Run, grad_bytes: float, network: Network,
                              backward: float) -> float:
        """Predicted communication seconds per iteration that no computation hides, given
        `backward` seconds of backward pass to overlap with: by default the phases one after
        the other, none overlapping. NaN: this strategy states no model (the report says so)."""
        phases = cls.phases(run, grad_bytes)
        return math.nan if phases is None else sum(network.seconds(phase) for phase in phases)

    # ---- memory: what each process holds ----------------------------------------------------
    @classmethod
    def memory_theory(cls, run: Run, grad_bytes: float) -> dict[str, float]:
        """Bytes of parameters, gradients and optimizer state (SGD's momentum) that the process
        holding the most keeps, by the algorithm's analysis, for M = grad_bytes: a whole copy
        of each, unless the strategy shards them."""
        return {"parameters": grad_bytes, "gradients": grad_bytes, "optimizer": grad_bytes}

    def owned_state(self, model: torch.nn.Module, optimizer) -> dict[str, int]:
        """What this process holds, counted from its tensors (called by every process after
        the last step, before the run's report)."""
        return owned_state(model, getattr(optimizer, "_optimizer", optimizer))

    def gpus_in_use(self, ctx: Context) -> list[int]:
        """The GPU indices this process computes on (sampled by pipeline/training/monitor.py)."""
        return [ctx.device.index or 0] if ctx.device.type == "cuda" else []

    def unwrap(self, model: torch.nn.Module) -> torch.nn.Module:
        return getattr(model, "module", model)

    # ---- replicas and checkpoints ----------------------------------------------------------
    def checkpoint_state(self, model: torch.nn.Module, optimizer) -> dict:
        """The model's and the optimizer's stateful parts as a checkpoint saves and loads them
        (state_dict / load_state_dict; state_dict is read after `consolidate`, by the process
        that `saves_checkpoint`, load_state_dict by every process)."""
        return {"model": self.unwrap(model), "optimizer": optimizer}

    def model_state(self, model: torch.nn.Module) -> dict:
        """The whole model's state dict, as model_final.pt holds it (after `consolidate`)."""
        return self.unwrap(model).state_dict()

    def scoring_model(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module | None:
        """The whole model to score during training, in the process that reports (called by
        every process: a sharded model is gathered first); None in the others."""
        return self.unwrap(model) if ctx.reports else None

    def checksum(self, model: torch.nn.Module) -> str:
        """Equal on every replica of a correct run (compared in the run summary)."""
        return parameter_checksum(self.unwrap(model))

    def rank_facts(self, ctx: Context) -> dict:
        """What this process observed of the strategy, for the run's rank report."""
        return {}

    def summary_facts(self, ranks: list[dict]) -> dict:
        """What the strategy adds to the run summary from every rank's report."""
        return {}

    def consolidate(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: Context) -> None:
        """Make every process hold the whole model and rank 0 the whole optimizer state, where
        the strategy spreads them (a sharded parameter server): called by every process before
        a checkpoint and before the run's report."""

    def saves_checkpoint(self, ctx: Context) -> bool:
        """The process whose model and optimizer state is the run's: rank 0 in every strategy
        here (the ps server holds the only momentum)."""
        return ctx.rank == 0

    def finish(self, ctx: Context) -> None:
        pass
