"""`ddp`: DistributedDataParallel, one process per worker, launched by torchrun.

Gradients are averaged by ring all-reduce while the backward pass runs: DDP groups them into
buckets and hands each full bucket to a communication hook. Ours wraps the chosen hook
(plain all-reduce, fp16/bf16 compression, or PowerSGD) to count the bytes on the wire and the
time the backward pass waits for the last bucket. Every rank then steps its own optimizer on
identical averaged gradients, so the replicas stay identical. BatchNorm running statistics come
from rank 0 at every forward (DDP's forward_sync_buffers), or SyncBatchNorm if configured; a
model whose only buffers are constants (the frozen BatchNorm of a pretrained backbone) syncs none.
Gradients are views of DDP's buckets, as its documentation advises: no copy per parameter out
of the bucket after each all-reduce.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..config import schema
from ..costmodel import collectives
from ..costmodel.collectives import Collective, Phase
from ..costmodel.network import Network, busiest_seconds
from ..runtime import compat, distributed
from ..runtime.run import Run
from .base import Option
from .process import Context, Traffic, changing_buffers
from .torchrun import TorchrunRuntime, TorchrunStrategy

if TYPE_CHECKING:
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook


HOOKS = {"none": "allreduce_hook", "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}
WIRE_BYTES = {"none": 4, "fp16": 2, "bf16": 2}  # bytes per gradient element on the wire
BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default


def ring_factor(processes: int) -> float:
    """Ring all-reduce: each rank sends (and receives) 2(N-1)/N of the payload."""
    return 2 * (processes - 1) / processes


def powersgd_payload_elements(state: powerSGD_hook.PowerSGDState, bucket) -> int:
    """Elements PowerSGD all-reduces for one bucket: the uncompressed tensors, plus the P and Q
    factors (n*r + m*r) of each matrix it compresses. Mirrors powerSGD_hook's own choice."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if state.iter < state.start_powerSGD_iter:
        return bucket.buffer().numel()
    rank, elements = state.matrix_approximation_rank, 0
    for tensor in bucket.gradients():
        n, m = tensor.shape[0], tensor.numel() // max(tensor.shape[0], 1)
        r = min(n, m, rank)
        compress, _, _ = powerSGD_hook._should_compress(n, m, rank, state.min_compression_rate)
        elements += (n * r + m * r) if tensor.ndimension() > 1 and compress else tensor.numel()
    return elements


def counting_hook(kind: str, processes: int, traffic: Traffic):
    """The real hook, plus counting: bytes on the wire and the backward pass's wait for the
    last bucket (the rest of the all-reduce overlaps the backward computation)."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    def hook(state, bucket):
        if kind == "powersgd":
            payload = powersgd_payload_elements(state, bucket) * 4
            future = powerSGD_hook.powerSGD_hook(state, bucket)
            if dist.get_backend() == "gloo":
                # PowerSGD chains each bucket's all-reduces (P, then Q) in callbacks that run as
                # collectives complete, so two buckets' chains can reach gloo in a different
                # order on each rank: a mismatched collective (seen 1 run in 8 here; PyTorch's
                # own test of it was skipped on gloo, pytorch/pytorch#58467). Over gloo, one
                # bucket's chain ends before the next starts; NCCL keeps the overlap.
                future.wait()
        else:
            payload = bucket.buffer().numel() * WIRE_BYTES[kind]
            future = getattr(default_hooks, HOOKS[kind])(state, bucket)
        wire = int(payload * ring_factor(processes))
        traffic.sent += wire
        traffic.received += wire
        launched = time.perf_counter()

        def done(fut):
            if bucket.is_last():  # backward cannot finish before the last bucket is reduced
                traffic.backward_wait += time.perf_counter() - launched
            return fut.value()

        return future.then(done)

    hook.__name__ = hook.__qualname__ = f"counting_{kind}_hook"  # DDP logs hooks by name
    return hook


def wrapped_in_ddp(model: torch.nn.Module, ctx: Context, parallel: schema.Parallel, hook: str, traffic: Traffic):
    """The model in DistributedDataParallel, its all-reduce through the gradient hook `hook`
    (a `comm_hook` value), counted into `traffic`: ddp's wrapping, and zero's."""
    import torch
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

    if parallel.sync_batchnorm:
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
    # Rank 0's BatchNorm statistics at every forward, where the model has any that change;
    # the gradients are views of DDP's buckets (not copied out of them after each all-reduce).
    wrapped = torch.nn.parallel.DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        gradient_as_bucket_view=True,
        **compat.ddp_buffer_sync(bool(changing_buffers(model))),
    )
    state = None
    if hook == "powersgd":
        # Compress from the third iteration on (the fewest PowerSGD's error feedback
        # allows): the demo is too short for the default 1000 of plain all-reduce.
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=parallel.powersgd_rank, start_powerSGD_iter=2
        )
    wrapped.register_comm_hook(state, counting_hook(hook, ctx.processes, traffic))
    return wrapped


def sync_batchnorm_unavailable(parallel: schema.Parallel) -> str | None:
    if parallel.sync_batchnorm and not distributed.gpu_count():
        return "SyncBatchNorm needs GPUs (set parallel.sync_batchnorm: false on CPU)"
    return None


def ring_all_reduce(workers: int, grad_bytes: float, hook: str) -> list[Phase]:
    """One all-reduce of the (compressed) payload: on one host a ring in which every rank
    sends its successor 2(N-1)/N of it in 2(N-1) steps; on a cluster as NCCL runs it
    (costmodel/collectives.py). PowerSGD's payload depends on the shapes; it is counted, not
    predicted (as fp32 here)."""
    if workers < 2:
        return []
    return [Collective("all_reduce", workers, grad_bytes * WIRE_BYTES.get(hook, 4) / 4)]


def all_reduce_seconds(workers: int, grad_bytes: float, hook: str, network: Network, backward: float) -> float:
    """Each bucket is one all-reduce: timed as such where commbench measured all-reduce at
    this process count, else as the ring over the network's links. Buckets start as
    backward fills them, so all but the last overlap it: what stays exposed is the last
    bucket, or the excess of all over the backward. Where commbench timed the exchange inside
    a step on this model (`network.in_step`), DDP's own buckets as it found them, each with its
    fixed cost and hook's work, the ones overlapping backward slowed by the contention."""
    if workers < 2:
        return 0.0
    in_step = network.in_step
    sizes = in_step.buckets_of(grad_bytes) if in_step else None
    if sizes is None:
        buckets = max(1, math.ceil(grad_bytes / BUCKET_BYTES))
        per_bucket = bucket_seconds(workers, bucket_bytes(grad_bytes), hook, network)
        return max(per_bucket, buckets * per_bucket - backward)
    assert in_step is not None  # sizes come from it
    times = [bucket_seconds(workers, size, hook, network) for size in sizes]
    fixed = [in_step.bucket_cost(hook, size) for size in sizes]
    overlapped = sum(t * in_step.contention + f for t, f in zip(times[:-1], fixed[:-1], strict=False))
    return times[-1] + fixed[-1] + max(0.0, overlapped - backward)


def bucket_bytes(grad_bytes: float) -> float:
    """One bucket's bytes where no measurement says how DDP cut them: M in equal buckets of at
    most its 25 MiB cap."""
    return grad_bytes / max(1, math.ceil(grad_bytes / BUCKET_BYTES))


def bucket_seconds(workers: int, nbytes: float, hook: str, network: Network) -> float:
    """One bucket's all-reduce back to back: commbench's all-reduce fit where measured, else
    the ring over the host's links, or NCCL's choice on a cluster."""
    if network.all_reduce is not None:
        return network.all_reduce.seconds(nbytes * WIRE_BYTES.get(hook, 4) / 4)
    return busiest_seconds(collectives.ports(ring_all_reduce(workers, nbytes, hook)[0], network))


class DDP(TorchrunStrategy):
    name = "ddp"
    label = "DDP"
    options = {
        "comm_hook": Option(
            "none",
            {"enum": ["none", "fp16", "bf16", "powersgd"]},
            "gradient compression of the all-reduce (none: plain fp32)",
        )
    }
    evaluates_on_workers = True  # each rank predicts its share; one COCOeval of the gathered
    equivalence_entry = {"workers": 2, "images_per_worker": 4}
    theory_text = "2(N-1)/N M per rank for ring all-reduce"
    bytes_counted = (
        "DDP's are derived from the size of each bucket its communication hook "
        "hands to the all-reduce, times the ring's 2(N-1)/N (not read from the network)."
    )
    memory_text = (
        "the whole weights, gradients and momentum, M each (3M), and another M in its "
        "gradient buckets (not counted as owned state)"
    )
    communication_timed = (
        "the time backward waits for the last all-reduce bucket once its "
        "gradients are ready, the rest of the all-reduce overlapping compute"
    )
    RING = "DDP (ring all-reduce)"  # the curve the report's sentences compare with

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        hook = predict.ddp_comm_hook
        return {
            cls.RING: {"strategy": cls.name, "comm_hook": "none"},
            f"DDP + {hook} compression": {"strategy": cls.name, "comm_hook": hook},
        }

    @classmethod
    def variant(cls, run: Run) -> str:
        hook = run.option("comm_hook")
        return "" if hook == "none" else hook

    def unavailable(self) -> str | None:
        return sync_batchnorm_unavailable(self.parallel) or super().unavailable()

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> Sequence[Phase]:
        return ring_all_reduce(run.workers, grad_bytes, run.option("comm_hook"))

    @classmethod
    def communication_seconds(cls, run: Run, grad_bytes: float, network: Network, backward: float) -> float:
        return all_reduce_seconds(run.workers, grad_bytes, run.option("comm_hook"), network, backward)

    @classmethod
    def algorithms(cls, run: Run, grad_bytes: float, network: Network) -> str:
        """The algorithm of each bucket's all-reduce: the size NCCL chooses it for."""
        return collectives.algorithms(
            ring_all_reduce(run.workers, bucket_bytes(grad_bytes), run.option("comm_hook")), network
        )

    def runtime(self) -> DDPRuntime:
        return DDPRuntime(self)


class DDPRuntime(TorchrunRuntime):
    """A rank: the model in DDP, its all-reduce through the counting hook."""

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        return wrapped_in_ddp(model, ctx, self.parallel, self.run.option("comm_hook"), self._traffic)
