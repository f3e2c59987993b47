"""The exchange inside a step, timed the way training issues it: while shared_compute.py times
the model's forward + backward with every process at once, each repeat also exchanges what a
strategy exchanges, in turn (`PATTERNS`), and the terms back-to-back timing misses are fitted
from it (pipeline/costmodel/in_step.py: the wait for the slower worker, contention with compute,
the fixed cost per bucket and per message, the hooks' own work):

  after_all_reduce  after the compute burst, DDP's last bucket of the model's gradients
                    (`ddp_buckets`) through DDP's own plain hook (its division by N, then the all-reduce and its
                    callback), as DDP's backward waits for it
  after_send_recv   after the compute burst, a parameter server's exchange with one server beside
                    the first worker (ps.py's synchronous step): every other worker sends it M
                    bytes of gradients and receives M bytes of weights, posted without waiting
  during            DDP's first bucket all-reduced while every process computes (the buckets
                    that overlap backward), its end stamped by its future's callback

The hooks' own work (fp16/bf16 compression and the copy back, plain's division) is timed apart,
on each process's bucket, back to back.
"""

from __future__ import annotations

import statistics
import time
import typing

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from ..costmodel import in_step
from ..costmodel.network import Link
from ..costmodel.predict import slowest_wait
from ..strategies.ddp import BUCKET_BYTES, HOOKS
from .links import reduced

PATTERNS = ("after_all_reduce", "after_send_recv", "during")
HOOK_REPEATS = 5


class Bucket:
    """What DDP's default hooks read of a GradBucket: its flat buffer."""

    def __init__(self, tensor: torch.Tensor):
        self._tensor = tensor

    def buffer(self) -> torch.Tensor:
        return self._tensor


def ddp_buckets(model: torch.nn.Module) -> list[int]:
    """Bytes of each of DDP's buckets of `model`'s gradients, in the order backward fills and
    reduces them: DDP's own assignment (its first bucket capped at 1 MiB, then BUCKET_BYTES)
    over the parameters in reverse, which is what its rebuild after the first step settles on
    for the demo's detector (measured: 3485736 + 591152 bytes)."""
    params: list[torch.Tensor] = list(reversed([p for p in model.parameters() if p.requires_grad]))
    indices, _ = dist._compute_bucket_assignment_by_size(
        params, [dist._DEFAULT_FIRST_BUCKET_BYTES, BUCKET_BYTES], [False] * len(params)
    )
    return [sum(params[i].numel() * params[i].element_size() for i in bucket) for bucket in indices]


def all_reduced(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """`tensor` all-reduced as DDP's plain hook does it on a bucket (the division by N too)."""
    # the hook reads only the bucket's buffer (Bucket); None: the default group
    return default_hooks.allreduce_hook(None, Bucket(tensor))  # type: ignore[arg-type]


def waited(works: list[dist.Work | None]) -> None:
    """Wait for each posted message (None only for a rank outside the group)."""
    for work in works:
        assert work is not None
        work.wait()


class Exchanges:
    """Called around each timed compute burst of shared_compute.together_timed: `before(i)`
    starts repeat i's `during` all-reduce, `after(i, seconds)` keeps the burst's seconds and
    runs repeat i's exchange after it. `fitted` gathers every rank's timings and fits."""

    def __init__(self, buckets: list[int], rank: int, processes: int, device: torch.device):
        self.rank, self.processes, self.device = rank, processes, device
        self.grad_bytes = sum(buckets)
        self.buckets = buckets
        self.last_bucket, self.full_bucket = buckets[-1], buckets[0]
        # the buffers, made once (DDP's buckets and a server's messages exist before a step)
        self._last = torch.ones(self.last_bucket // 4, device=device)
        self._full = torch.ones(self.full_bucket // 4, device=device)
        self._sent = torch.ones(self.grad_bytes // 4, device=device)
        self._received = {w: torch.empty(self.grad_bytes // 4, device=device) for w in range(processes)}
        self.compute: list[float] = []
        self.exchange: list[float] = []  # seconds after the burst until the exchange ended
        self.during: list[float] = []  # seconds of the all-reduce launched before the burst
        self._ended: list[float] = []

    def pattern(self, i: int) -> str:
        return PATTERNS[i % len(PATTERNS)]

    def before(self, i: int) -> None:
        if self.pattern(i) != "during":
            return
        launched, self._ended = time.perf_counter(), []
        future = all_reduced(self._full)
        self._during = (launched, future.then(lambda fut: self._ended.append(time.perf_counter())))

    def after(self, i: int, seconds: float) -> None:
        self.compute.append(seconds)
        start, pattern = time.perf_counter(), self.pattern(i)
        if pattern == "after_all_reduce":
            all_reduced(self._last).then(lambda fut: fut.value()).wait()  # the counting hook's own callback
        elif pattern == "after_send_recv":
            self._server_exchange()
        else:
            launched, ended = self._during
            ended.wait()
            self.during.append(self._ended[0] - launched)
        self.exchange.append(time.perf_counter() - start if pattern != "during" else 0.0)

    def _server_exchange(self) -> None:
        """ps.py's synchronous step with one server, rank 0, which also trains: the gradients
        in, their mean, the weights out."""
        if self.rank == 0:
            grads = {w: self._received[w] for w in range(1, self.processes)}
            waited([dist.irecv(g, w) for w, g in grads.items()])
            weights = typing.cast(torch.Tensor, sum(grads.values())) / self.processes
            waited([dist.isend(weights, w) for w in grads])
        else:
            waited([dist.isend(self._sent, 0), dist.irecv(self._received[0], 0)])

    def _gathered(self, values: list[float]) -> list[list[float]]:
        """[repeat][rank] of `values` (this rank's, one per repeat), on every rank."""
        flat = [0.0] * (len(values) * self.processes)
        flat[self.rank :: self.processes] = values
        flat = reduced(flat, self.device)
        return [flat[i * self.processes : (i + 1) * self.processes] for i in range(len(values))]

    def hook_seconds_per_byte(self) -> dict[str, float]:
        """Each hook's own work on a full bucket, per byte, this rank's median (the mean rank's
        on every rank): what default_hooks does besides the all-reduce (plain: the division
        by N; fp16/bf16: the cast and division, and the copy back of the reduced values)."""
        tensor = torch.empty_like(self._full)

        def work(kind: str) -> None:
            if kind == "none":
                tensor.div_(self.processes)
            else:
                compressed = tensor.to(torch.float16 if kind == "fp16" else torch.bfloat16)
                tensor.copy_(compressed.div_(self.processes))

        medians = []
        for kind in HOOKS:
            samples = []
            for _ in range(HOOK_REPEATS):
                tensor.fill_(1.0)  # values that stay normal floats however often divided
                start = time.perf_counter()
                work(kind)
                samples.append(time.perf_counter() - start)
            medians.append(statistics.median(samples) / self.full_bucket)
        return dict(zip(HOOKS, (s / self.processes for s in reduced(medians, self.device)), strict=False))

    def fitted(self, primitives: dict, alone: list[float], images: int) -> dict:
        """The terms (costmodel/in_step.InStepTerms' fields) and what they were fitted from,
        the same on every rank. `primitives`: links.measure's fits (the back-to-back seconds);
        `alone`: rank 0's compute alone (its variance; others pass [])."""
        compute = self._gathered(self.compute)
        rows = {p: [i for i in range(len(compute)) if self.pattern(i) == p] for p in PATTERNS}
        exchange = self._gathered(self.exchange)
        during = [d for row in self._gathered_during() for d in row]
        link = {name: Link(p["alpha_s"], p["beta_s_per_byte"]) for name, p in primitives.items()}
        others = self.processes - 1
        (alone_variance,) = reduced([statistics.variance(alone) if len(alone) > 1 else 0.0], self.device)
        terms = {
            "processes": self.processes,
            "images": images,
            "wait_s": in_step.wait_of(compute),
            "variance_s2": in_step.variance_of(compute),
            "alone_variance_s2": alone_variance,
            "contention": in_step.contention_of(during, link["all_reduce"].seconds(self.full_bucket)),
            "bucket_s": in_step.fixed_cost_of(
                [exchange[i] for i in rows["after_all_reduce"]],
                [compute[i] for i in rows["after_all_reduce"]],
                link["all_reduce"].seconds(self.last_bucket),
            ),
            # the server's port carries each other worker's gradients in, then its weights out
            "message_s": in_step.fixed_cost_of(
                [exchange[i] for i in rows["after_send_recv"]],
                [compute[i] for i in rows["after_send_recv"]],
                2 * others * link["send_recv"].seconds(self.grad_bytes),
                messages=2 * others,
            ),
            "bucket_bytes": self.last_bucket,
            "buckets": self.buckets,
            "hook_s_per_byte": self.hook_seconds_per_byte(),
        }
        terms, untrusted = in_step.resolved(terms)
        terms["formula_wait_s"] = slowest_wait_check(terms)
        return {
            **terms,
            **({"untrusted": untrusted} if untrusted else {}),
            "timings": {
                "compute_s": compute,
                "exchange_s": exchange,
                "during_s": during,
                "patterns": [self.pattern(i) for i in range(len(compute))],
            },
        }

    def _gathered_during(self) -> list[list[float]]:
        return self._gathered(self.during) if self.during else []


def slowest_wait_check(terms: dict) -> float:
    """What predict.slowest_wait's formula makes of the variance measured with every process
    computing: set beside the wait measured directly, it checks the formula on this machine."""
    return slowest_wait(terms["processes"], terms["variance_s2"] / terms["images"], terms["images"])
