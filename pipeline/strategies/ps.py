"""`ps`: a parameter server over torch.distributed point-to-point messages, launched by torchrun.

The trainable parameters are split into `servers: K` shards of whole tensors, balanced by bytes
(each tensor, largest first, onto the shard with the fewest bytes so far, as ps-lite and BytePS
spread keys over servers); shard s lives on server rank s. Every iteration:
  1. each worker computes gradients on its part of the batch and sends each server the
     gradients of that server's parameters;
  2. each server averages them, steps its optimizer on its own parameters only (the only
     momentum they have), and
  3. sends their new values back; server 0 adds the BatchNorm buffers of the first worker (as
     DDP takes rank 0's), so every replica leaves the step identical.

Placement `colocated`: ranks 0..K-1 serve and train (DataParallel's master device is K = 1).
Placement `dedicated`: ranks 0..K-1 only serve; the N workers are ranks K..K+N-1.
Per iteration a worker moves M bytes of gradients each way (less its own shard's when it also
serves), a dedicated server N M/K, a colocated one M + (N-2) M/K: for K = 1 the 2(N-1)M through
one server that is the bottleneck the study is about, against 2(N-1)/N M per rank for ring
all-reduce (`link_bytes` below).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from .. import distributed
from ..costmodel import Link
from .base import Context, Option
from .torchrun import TorchrunStrategy

GRADIENTS, BUFFERS, WEIGHTS = 0, 1, 2  # message tags: each message matched by kind, not order


def servers(run: dict) -> int:
    """K; a run written before shards existed had one server."""
    return run.get("servers", 1)


def balanced_shards(sizes: list[int], k: int) -> list[int]:
    """The shard of each tensor: largest first onto the lightest shard (ties: the lowest)."""
    load, owner = [0] * k, [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        shard = min(range(k), key=lambda s: (load[s], s))
        owner[index] = shard
        load[shard] += sizes[index]
    return owner


class ParameterServer(TorchrunStrategy):
    name = "ps"
    label = "parameter server"
    options = {"placement": Option("colocated", {"enum": ["colocated", "dedicated"]},
                                   "servers beside the first workers, or in their own processes"),
               "servers": Option(1, {"type": "integer", "minimum": 1},
                                 "K: server shards the parameters are split over")}
    evaluates_on_workers = True  # as ddp: one process per worker predicts its share

    def __init__(self, run: dict, parallel: dict):
        super().__init__(run, parallel)
        self.dedicated = run["placement"] == "dedicated"
        self.servers = servers(run)
        self.extra_processes = self.servers if self.dedicated else 0
        self.first_worker = self.servers if self.dedicated else 0

    @classmethod
    def variant(cls, run: dict) -> str:
        # always named: ps-colocated-w2-b4, ps-dedicated-w2-b4; shards when more than one
        return run["placement"] + (f"-k{servers(run)}" if servers(run) > 1 else "")

    @classmethod
    def invalid(cls, run: dict) -> str | None:
        if run.get("precision") == "fp16":  # the workers' loss scale would have to follow the server's
            return ("fp16 needs a loss scale every process agrees on, and only the server steps; "
                    "use precision: bf16 (no scaler) for ps")
        if run["placement"] == "colocated" and servers(run) > run["workers"]:
            return (f"colocated servers live on workers: {servers(run)} servers need at least as "
                    f"many workers, not {run['workers']} (or use placement: dedicated)")
        return super().invalid(run)

    def unavailable(self) -> str | None:
        if self.parallel["sync_batchnorm"]:
            return "sync_batchnorm is implemented for ddp only; ps takes the first worker's buffers"
        return super().unavailable()

    def place(self, ctx: Context) -> Context:
        if ctx.rank < self.servers:
            ctx.role = "server" if self.dedicated else "server+worker"
        ctx.shard = None if ctx.role == "server" else ctx.rank - self.first_worker
        self.workers = list(range(self.first_worker, ctx.processes))
        ctx.shards = len(self.workers)
        return ctx

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        self.params = [p for p in model.parameters() if p.requires_grad]
        # Float buffers (BatchNorm running statistics) travel with server 0's parameters; the
        # integer batch counters are the same everywhere anyway.
        self.buffers = [b for b in model.buffers() if b.is_floating_point()]
        self.owner = balanced_shards([p.numel() * p.element_size() for p in self.params], self.servers)
        self.shards = [[p for p, o in zip(self.params, self.owner) if o == s] for s in range(self.servers)]
        state = self._flat(self.params + self.buffers)
        dist.broadcast(state, src=0)  # every replica starts from server 0's weights
        self._unflatten(state, self.params + self.buffers)
        return model

    def _state(self, server: int) -> list[torch.Tensor]:
        """What server `server` sends back: its parameters, and server 0 the buffers too."""
        return self.shards[server] + (self.buffers if server == 0 else [])

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

    @staticmethod
    def _gradients(params) -> torch.Tensor:
        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        self._traffic.sent += tensor.numel() * tensor.element_size()
        return dist.isend(tensor, dst, tag=tag)

    def _recv(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        self._traffic.received += tensor.numel() * tensor.element_size()
        return dist.irecv(tensor, src, tag=tag)

    def _empty(self, tensors, ctx: Context) -> torch.Tensor:
        return torch.empty(sum(t.numel() for t in tensors), device=ctx.device)

    def step(self, model, optimizer, ctx: Context) -> float:
        """Every message is posted without waiting, so a process that serves and trains never
        blocks the others: as a worker it sends each other server its gradients; as a server
        it waits for its shard's gradients, steps and sends the new values; as a worker it then
        waits for the other servers' values. Returns the seconds spent communicating (a
        server's update itself is not counted)."""
        start, update = time.perf_counter(), 0.0
        serves, trains = ctx.rank < self.servers, ctx.role != "server"
        others = [s for s in range(self.servers) if s != ctx.rank]
        pending = []
        if trains:
            pending += [self._send(self._gradients(self.shards[s]), s, GRADIENTS) for s in others]
            if ctx.rank == self.first_worker and self.buffers and ctx.rank != 0:
                pending.append(self._send(self._flat(self.buffers), 0, BUFFERS))
        if serves:
            update = self._serve(optimizer, ctx, pending)
        states = {s: self._empty(self._state(s), ctx) for s in others} if trains else {}
        pending += [self._recv(state, s, WEIGHTS) for s, state in states.items()]
        for work in pending:
            work.wait()
        for s, state in states.items():
            self._unflatten(state, self._state(s))
        return time.perf_counter() - start - update

    def _serve(self, optimizer, ctx: Context, pending: list) -> float:
        """Average this shard's gradients from every worker, update it, post its new values to
        the other workers (onto `pending`). Returns the seconds of the update."""
        mine, remote = self.shards[ctx.rank], [w for w in self.workers if w != ctx.rank]
        grads = {w: self._empty(mine, ctx) for w in remote}
        works = [self._recv(grads[w], w, GRADIENTS) for w in remote]
        buffers = None
        if ctx.rank == 0 and self.first_worker != 0 and self.buffers:
            buffers = self._empty(self.buffers, ctx)
            works.append(self._recv(buffers, self.first_worker, BUFFERS))
        for work in works:
            work.wait()
        start = time.perf_counter()
        total = sum(grads.values()) if remote else torch.zeros(0, device=ctx.device)
        if ctx.role == "server+worker":
            total = total + self._gradients(mine) if remote else self._gradients(mine)
        for p in self.params:  # the optimizer steps what has a gradient: this shard only
            p.grad = None
        for p, piece in self._pieces(total / len(self.workers), mine):
            p.grad = piece.clone()
        optimizer.step()  # <- the parameter server updates the weights here, and only here
        if buffers is not None:
            self._unflatten(buffers, self.buffers)
        update = time.perf_counter() - start
        state = self._flat(self._state(ctx.rank))
        pending += [self._send(state, w, WEIGHTS) for w in remote]
        return update

    def consolidate(self, model, optimizer, ctx: Context) -> None:
        """Before a checkpoint or the run's report: every server's parameters and optimizer
        state to every process, so that rank 0 saves the whole run and all replicas (a
        dedicated server's included) are the same model. Nothing to do with one server."""
        if self.servers == 1:
            return
        mine = [i for i, owner in enumerate(self.owner) if owner == ctx.rank]  # none for a worker
        shard = {i: (self.params[i].detach().cpu(),
                     {k: v.cpu() for k, v in optimizer.state.get(self.params[i], {}).items()}) for i in mine}
        for part in distributed.all_gather(shard):
            for i, (value, state) in part.items():
                self.params[i].data.copy_(value)
                if state:
                    optimizer.state[self.params[i]] = {k: v.to(ctx.device) for k, v in state.items()}

    @classmethod
    def link_bytes(cls, run: dict, grad_bytes: float) -> dict[str, float]:
        """N workers, K server shards of M/K each. A worker sends its gradients and receives
        the weights: M each way, less the M/K of its own shard when it serves one (colocated).
        A shard's server receives N gradients of M/K and sends N weight slices of M/K, less
        its own worker's when colocated. Colocated server-worker: M + (N-2)M/K each way
        (K = 1: (N-1)M; K = N: 2(N-1)/N M, ring all-reduce's). Dedicated: worker M,
        server N M/K."""
        n, k, m = run["workers"], servers(run), grad_bytes
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
        n, k = run["workers"], servers(run)
        busiest = cls.link_bytes(run, grad_bytes)["busiest"]
        return 2 * link.seconds(busiest, messages=max(1, n // k))

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        """This process's bytes each way: as a worker, the gradients of the shards others
        serve; as a server, its shard from and to every other worker."""
        serves, trains = ctx.rank < self.servers, ctx.role != "server"
        shard = sum(p.numel() * p.element_size() for p in self.shards[ctx.rank]) if serves else 0
        remote = len([w for w in self.workers if w != ctx.rank])
        moved = (grad_bytes - shard if trains else 0) + (remote * shard if serves else 0)
        return {"sent": moved, "received": moved}
