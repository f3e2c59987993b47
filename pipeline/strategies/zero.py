"""`zero`: ZeRO stage 1, DDP with torch.distributed.optim.ZeroRedundancyOptimizer, by torchrun.

Gradients are all-reduced by DDP during the backward pass, as in `ddp`. The optimizer state is
sharded: the parameters are split into one partition per rank (whole tensors, balanced by size),
each rank keeps the momentum of its own partition only (1/N of it) and steps only that; then
every rank broadcasts its updated partition to the others, so each leaves the step with the
whole, identical model. What it saves: (N-1)/N of the optimizer state per rank. What it costs:
the broadcast of the updated weights, (N-1)/N M each way per rank, after the step, where
nothing overlaps it. With DDP's all-reduce that is 3(N-1)/N M per rank; an implementation that
reduce-scatters the gradients instead (DeepSpeed's ZeRO-1/2) moves 2(N-1)/N M, ring's bytes.

Each rank's parameters live in one flat bucket (`parameters_as_bucket_view`), so the broadcast is
N collectives, one a rank. torch's default broadcasts every tensor as a collective of its own:
with the demo's 32 tensors in flight at once, the step's broadcasts took 11.4 ms after a forward
+ backward on 2 CPU processes, against 1.55 ms bucketed (measured; the bytes are the same).

A checkpoint is consolidated: every rank sends its partition's state to rank 0, whose state
dict then has the layout of a plain SGD's (global parameter indices), so it loads into any
strategy (`single` included), and into `zero` at any world size.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..config import schema
from ..costmodel import collectives
from ..costmodel.collectives import Collective, Phase
from ..costmodel.network import Network, busiest_seconds
from ..runtime.run import Run
from .ddp import all_reduce_seconds, bucket_bytes, ring_all_reduce, sync_batchnorm_unavailable, wrapped_in_ddp
from .process import Context
from .torchrun import TorchrunRuntime, TorchrunStrategy


def partition_bytes(optimizer) -> list[int]:
    """Bytes of each rank's partition of the parameters: what it steps, then broadcasts."""
    # _partition_parameters is the optimizer's own assignment (private, unchanged since 1.8).
    return [
        sum(p.numel() * p.element_size() for group in groups for p in group["params"])
        for groups in optimizer._partition_parameters()
    ]


PLAIN = "none"  # DDP's gradient all-reduce as it is: plain fp32, no compression hook


class Zero(TorchrunStrategy):
    """DDP's all-reduce (ddp.py), composed with a sharded optimizer."""

    name = "zero"
    label = "ZeRO-1"
    evaluates_on_workers = True  # as ddp: each rank predicts its share
    equivalence_entry = {"workers": 2, "images_per_worker": 4}
    theory_text = (
        "3(N-1)/N M per rank for ZeRO-1 (a ring all-reduce of the gradients, then a "
        "broadcast of each rank's updated 1/N of the weights)"
    )
    memory_text = (
        "the whole weights and gradients and 1/N of the momentum (2M + M/N), and DDP's "
        "M of gradient buckets; its partitions are whole tensors, so a model with one "
        "large tensor (the demo's box head) leaves more than 1/N on its busiest rank"
    )
    communication_timed = (
        "DDP's wait for the last all-reduce bucket (the broadcast of the "
        "updated weights is one call with the step: optimizer time)"
    )
    bytes_counted = (
        "ZeRO-1's are DDP's, plus the bytes of the partitions its optimizer "
        "broadcasts after each step, read from the optimizer's own partition."
    )

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        return {"ZeRO-1 (all-reduce + broadcast)": {"strategy": cls.name}}

    def unavailable(self) -> str | None:
        return sync_batchnorm_unavailable(self.parallel) or super().unavailable()

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> Sequence[Phase]:
        """DDP's ring all-reduce, then the updated weights: each rank's 1/N to every other, as
        a ring all-gather moves it ((N-1)/N M per rank in N-1 steps)."""
        n = run.workers
        if n < 2:
            return []
        return ring_all_reduce(n, grad_bytes, PLAIN) + [Collective("all_gather", n, grad_bytes)]

    @classmethod
    def communication_seconds(cls, run: Run, grad_bytes: float, network: Network, backward: float) -> float:
        """The all-reduce overlaps the backward pass as DDP's does; the weights' broadcast comes
        after the step, exposed: where commbench timed broadcast, one from each rank's bucket,
        N latencies and M's bytes once. Otherwise the all-gather ring of `phases`."""
        n = run.workers
        if n < 2:
            return 0.0
        overlapped = all_reduce_seconds(n, grad_bytes, PLAIN, network, backward)
        if network.broadcast is not None:
            return overlapped + network.broadcast.seconds(grad_bytes, messages=n)
        return overlapped + busiest_seconds(collectives.ports(cls.phases(run, grad_bytes)[-1], network))

    @classmethod
    def algorithms(cls, run: Run, grad_bytes: float, network: Network) -> str:
        """DDP's buckets' all-reduce, then the weights' all-gather."""
        phases = [*ring_all_reduce(run.workers, bucket_bytes(grad_bytes), PLAIN), *cls.phases(run, grad_bytes)[-1:]]
        return collectives.algorithms(phases, network)

    @classmethod
    def timed_communication_seconds(cls, run: Run, grad_bytes: float, network: Network, backward: float) -> float:
        """DDP's all-reduce only: the broadcast's seconds count as the optimizer's in a run
        (`communication_timed`)."""
        return all_reduce_seconds(run.workers, grad_bytes, PLAIN, network, backward)

    @classmethod
    def memory_theory(cls, run: Run, grad_bytes: float) -> dict[str, float]:
        n = run.workers
        return {"parameters": grad_bytes, "gradients": grad_bytes, "optimizer": grad_bytes / n}

    def runtime(self) -> ZeroRuntime:
        return ZeroRuntime(self)


class ZeroRuntime(TorchrunRuntime):
    """A rank: DDP's wrapping and all-reduce (ddp.py), then its partition's step and broadcast."""

    _sizes: list[int] | None = None  # bytes of each rank's partition

    def wrap(self, model, ctx: Context):
        return wrapped_in_ddp(model, ctx, self.parallel, PLAIN, self._traffic)

    def optimizer(self, params, **sgd):
        import torch
        from torch.distributed import optim as zero_optim

        # Every rank builds the whole SGD's parameter list, but holds state for its partition;
        # the parameters become views of one bucket a rank, broadcast whole (module docstring)
        return zero_optim.ZeroRedundancyOptimizer(
            params, optimizer_class=torch.optim.SGD, parameters_as_bucket_view=True, **sgd
        )

    def step(self, model, optimizer, ctx: Context) -> float:
        """The local step of this rank's partition, then the broadcast of every partition: the
        weights are updated here, each rank its own 1/N (the broadcast's seconds count in the
        optimizer's phase: the two happen in one call)."""
        optimizer.step()
        if self._sizes is None:  # the partitions never change: read once
            self._sizes = partition_bytes(getattr(optimizer, "_optimizer", optimizer))  # under fp16's scaler
        sizes = self._sizes
        # A broadcast: the owner sends its partition to each other rank, which receives it
        self._traffic.sent += sizes[ctx.rank] * (ctx.processes - 1)
        self._traffic.received += sum(sizes) - sizes[ctx.rank]
        return 0.0

    def consolidate(self, model, optimizer, ctx: Context) -> None:
        """Rank 0 gathers every partition's momentum: its state dict is then the whole one."""
        optimizer.consolidate_state_dict(to=0)


__all__ = ["Zero", "ZeroRuntime", "partition_bytes"]
