"""What a strategy does inside a running training process: the `Runtime` contract.

A strategy's spec (base.py `Strategy`) builds its runtime for one process with `spec.runtime()`.
The runtime starts the process, wraps the model, steps, counts what it communicates, gathers
a sharded model for checkpoints and scoring, and reports its own facts. Torch is imported in
the functions below: a strategy module holds its spec and its runtime, and its spec is read
where torch is not loaded (the Snakefile, the sweep, the report).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..runtime.distributed import available_cores, default_device

if TYPE_CHECKING:
    import torch


def _cpu():
    import torch

    return torch.device("cpu")


@dataclass
class Context:
    """What one training process knows about its place in the job."""

    rank: int = 0  # global process rank
    processes: int = 1  # processes in the job (a dedicated ps server included)
    device: torch.device = field(default_factory=_cpu)
    threads: int = 1
    backend: str = "none"
    shard: int | None = 0  # the part of the data this process trains on; None: no data
    shards: int = 1  # parts the data is split into (1 for single and dp)
    role: str = "worker"  # "worker", "server" (dedicated ps) or "server+worker"

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

    def take(self) -> Traffic:
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
    return {
        "parameters": sum(local_bytes(p) for p in params),
        "gradients": sum(local_bytes(p.grad) for p in params if p.grad is not None),
        "optimizer": sum(
            local_bytes(v)
            for state in inner.state.values()
            for v in state.values()
            if torch.is_tensor(v) and v.dim() > 0
        ),
    }


def changing_buffers(model: torch.nn.Module) -> list:
    """The buffers training changes, which replicas must share: BatchNorm's running statistics.
    A frozen BatchNorm's (the pretrained backbone's) are constants, and integer batch counters
    are the same everywhere: syncing them would move R50's 0.4 MB, and launch a copy per
    tensor, every iteration for nothing."""
    from torchvision.ops.misc import FrozenBatchNorm2d

    return [
        b
        for module in model.modules()
        if not isinstance(module, FrozenBatchNorm2d)
        for b in module.buffers(recurse=False)
        if b.is_floating_point()
    ]


def parameter_checksum(model: torch.nn.Module) -> str:
    """Of the parameters only: DDP ranks' BatchNorm buffers differ until the next forward pass
    copies rank 0's over them."""
    return tensor_checksum(model.parameters())


def tensor_checksum(tensors) -> str:
    digest = hashlib.sha256()
    for tensor in tensors:
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class Runtime:
    """One process of a run: defaults describe one process on one device; a strategy's runtime
    overrides what differs."""

    def __init__(self, spec):
        """`spec`: the run's strategy (base.py `Strategy`), which builds its runtime."""
        self.spec, self.run, self.parallel = spec, spec.run, spec.parallel
        self._traffic = Traffic()

    def start(self, threads: int) -> Context:
        import torch

        threads = threads or available_cores()
        torch.set_num_threads(threads)
        return Context(device=default_device(), threads=threads)

    # ---- the training step ---------------------------------------------------------------
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

    # ---- memory: what this process holds --------------------------------------------------
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
