"""`ps`: a parameter server over torch.distributed point-to-point messages, launched by torchrun.

Rank 0 is the server. Every iteration:
  1. each worker computes gradients on its shard of the batch and sends them to the server;
  2. the server averages them, steps the one optimizer (the only one that holds momentum), and
  3. sends the new parameters back, with the BatchNorm buffers of the first worker (as DDP takes
     rank 0's), so every replica leaves the step identical.

Placement `colocated`: rank 0 is also a worker, as DataParallel's master device is.
Placement `dedicated`: rank 0 only serves; ranks 1..N are the workers (N + 1 processes).
Through the server pass 2(N-1)M bytes per iteration colocated and 2NM dedicated, for M bytes of
gradients, against 2(N-1)/N M per rank for ring all-reduce: the bottleneck the study is about.
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..costmodel import Link
from .base import Context, Option
from .torchrun import TorchrunStrategy

SERVER = 0
GRADIENTS, BUFFERS, WEIGHTS = 0, 1, 2  # message tags: each message matched by kind, not order


class ParameterServer(TorchrunStrategy):
    name = "ps"
    label = "parameter server"
    options = {"placement": Option("colocated", {"enum": ["colocated", "dedicated"]},
                                   "server on rank 0 beside a worker, or its own process")}
    evaluates_on_workers = True  # as ddp: one process per worker predicts its share

    def __init__(self, run: dict, parallel: dict):
        super().__init__(run, parallel)
        self.dedicated = run["placement"] == "dedicated"
        self.extra_processes = 1 if self.dedicated else 0
        self.first_worker = 1 if self.dedicated else 0

    @classmethod
    def variant(cls, run: dict) -> str:
        return run["placement"]  # always named: ps-colocated-w2-b4, ps-dedicated-w2-b4

    @classmethod
    def invalid(cls, run: dict) -> str | None:
        if run.get("precision") == "fp16":  # the workers' loss scale would have to follow the server's
            return ("fp16 needs a loss scale every process agrees on, and only the server steps; "
                    "use precision: bf16 (no scaler) for ps")
        return super().invalid(run)

    def unavailable(self) -> str | None:
        if self.parallel["sync_batchnorm"]:
            return "sync_batchnorm is implemented for ddp only; ps takes the first worker's buffers"
        return super().unavailable()

    def place(self, ctx: Context) -> Context:
        if ctx.rank == SERVER:
            ctx.role = "server" if self.dedicated else "server+worker"
        ctx.shard = None if ctx.role == "server" else ctx.rank - self.first_worker
        self.workers = list(range(self.first_worker, ctx.processes))
        ctx.shards = len(self.workers)
        return ctx

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Float buffers (BatchNorm running statistics) travel with the parameters; the integer
        # batch counters are the same everywhere anyway.
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        state = self._flat(self.params + self.buffers)
        dist.broadcast(state, src=SERVER)  # every replica starts from the server's weights
        self._unflatten(state, self.params + self.buffers)
        return model

    @staticmethod
    def _flat(tensors) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    @staticmethod
    def _pieces(flat: torch.Tensor, tensors):
        """(tensor, its slice of the flat message) for each tensor, in order."""
        offset = 0
        for tensor in tensors:
            yield tensor, flat[offset:offset + tensor.numel()].view_as(tensor)
            offset += tensor.numel()

    def _unflatten(self, flat: torch.Tensor, tensors) -> None:
        for tensor, piece in self._pieces(flat, tensors):
            tensor.data.copy_(piece)

    def _gradients(self) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in self.params])

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        self._traffic.sent += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, dst, tag=tag)

    def _recv(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        self._traffic.received += tensor.numel() * tensor.element_size()
        return dist.irecv(tensor, src, tag=tag)

    def step(self, model, optimizer, ctx: Context) -> float:
        if ctx.role == "worker":
            return self._worker_step(ctx)
        return self._server_step(optimizer, ctx)

    def _worker_step(self, ctx: Context) -> float:
        """Send my gradients (and, first worker, my buffers); wait for the new weights."""
        start = time.perf_counter()
        works = [self._send(self._gradients(), SERVER, GRADIENTS)]
        if ctx.rank == self.first_worker and self.buffers:
            works.append(self._send(self._flat(self.buffers), SERVER, BUFFERS))
        state = torch.empty(sum(t.numel() for t in self.params + self.buffers),
                            device=ctx.device)
        works.append(self._recv(state, SERVER, WEIGHTS))
        for work in works:
            work.wait()
        self._unflatten(state, self.params + self.buffers)
        return time.perf_counter() - start

    def _server_step(self, optimizer, ctx: Context) -> float:
        """Gather and average the workers' gradients, update the weights, send them back.
        Returns the seconds spent communicating (the update itself is not counted)."""
        start = time.perf_counter()
        remote = [w for w in self.workers if w != SERVER]
        grads = {w: torch.empty(sum(p.numel() for p in self.params), device=ctx.device)
                 for w in remote}
        works = [self._recv(grads[w], w, GRADIENTS) for w in remote]
        buffers = None
        if self.dedicated and self.buffers:
            buffers = torch.empty(sum(b.numel() for b in self.buffers), device=ctx.device)
            works.append(self._recv(buffers, self.first_worker, BUFFERS))
        for work in works:
            work.wait()
        received = time.perf_counter()

        total = sum(grads.values()) if remote else torch.zeros(0, device=ctx.device)
        if ctx.role == "server+worker":
            total = total + self._gradients() if remote else self._gradients()
        average = total / len(self.workers)
        self._set_gradients(average)
        optimizer.step()  # <- the parameter server updates the weights here, and only here
        if buffers is not None:
            self._unflatten(buffers, self.buffers)
        updated = time.perf_counter()

        state = self._flat(self.params + self.buffers)
        for work in [self._send(state, w, WEIGHTS) for w in remote]:
            work.wait()
        return (received - start) + (time.perf_counter() - updated)

    def _set_gradients(self, flat: torch.Tensor) -> None:
        for p, piece in self._pieces(flat, self.params):
            p.grad = piece.clone()

    @classmethod
    def link_bytes(cls, run: dict, grad_bytes: float) -> dict[str, float]:
        """N workers, K server shards of M/K each. A worker sends its gradients and receives
        the weights: M each way, less the M/K of its own shard when it serves one (colocated).
        A shard's server receives N gradients of M/K and sends N weight slices of M/K, less
        its own worker's when colocated. Colocated server-worker: M + (N-2)M/K each way
        (K = 1: (N-1)M; K = N: 2(N-1)/N M, ring all-reduce's). Dedicated: worker M,
        server N M/K."""
        n, k, m = run["workers"], run.get("servers", 1), grad_bytes
        if run["placement"] == "dedicated":
            return {"worker": m, "busiest": max(m, n * m / k)}
        if n == 1:
            return {"worker": 0.0, "busiest": 0.0}
        serving = m + (n - 2) * m / k
        return {"worker": m if n > k else serving, "busiest": serving}

    @classmethod
    def communication_seconds(cls, run: dict, grad_bytes: float, link: Link, backward: float) -> float:
        """Gradients in, then (after the update) weights out, over the busiest link: two phases
        that cannot overlap each other or the backward pass (the server needs every gradient)."""
        n, k = run["workers"], run.get("servers", 1)
        busiest = cls.link_bytes(run, grad_bytes)["busiest"]
        return 2 * link.seconds(busiest, messages=max(1, n // k))

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        if ctx.rank == SERVER:
            remote = len([w for w in self.workers if w != SERVER])
            return {"sent": remote * grad_bytes, "received": remote * grad_bytes}
        return {"sent": grad_bytes, "received": grad_bytes}
