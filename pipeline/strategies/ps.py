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

`staleness: S` > 0 (dedicated servers) trains asynchronously with bounded staleness (SSP): a
server applies each worker's gradients (scaled by 1/N) as they arrive and answers that worker
at once with its current weights, unless the worker is more than S updates ahead of the
slowest, whose gradients it then waits for. Each gradient carries the version of the weights it
was computed on; how many updates the server applied in between is its staleness, counted in
the run summary. Bit-identity is lost by design; the synchronous path (S = 0) is unchanged.
Per iteration a worker moves M bytes of gradients each way (less its own shard's when it also
serves), a dedicated server N M/K, a colocated one M + (N-2) M/K: for K = 1 the 2(N-1)M through
one server that is the bottleneck the study is about, against 2(N-1)/N M per rank for ring
all-reduce (`phases` below).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..config import schema
from ..costmodel.network import Flow, Link, Network, Ports
from ..runtime import distributed
from ..runtime.records.base import Record, declare_facts
from ..runtime.records.training import RankReport, RunSummary
from ..runtime.run import Run
from .base import Option
from .process import Context, changing_buffers
from .torchrun import TorchrunRuntime, TorchrunStrategy

if TYPE_CHECKING:
    import torch
    import torch.distributed as dist


GRADIENTS, BUFFERS, WEIGHTS = 0, 1, 2  # message tags: each message matched by kind, not order


@dataclass
class Stale:
    """A server's asynchronous state: each worker's gradients applied so far (its clock), the
    updates applied in all (the weights' version), who waits for an answer."""

    clock: dict
    version: int = 0
    waiting: list = field(default_factory=list)
    sends: list = field(default_factory=list)  # answers on their way
    histogram: Counter = field(default_factory=Counter)
    max_ahead: int = 0  # the most updates an answered worker was ahead of the slowest


@dataclass(frozen=True)
class Staleness(Record):
    """With staleness > 0: the bound S, and how many gradients were applied how many updates
    after the weights they were computed on (str(updates) -> count), over every server."""

    bound: int
    histogram: dict


# What a run with staleness > 0 records (summary_facts, rank_facts): the servers' staleness;
# each server's histogram of it, and the most updates an answered worker was ahead of the slowest
declare_facts(RunSummary, staleness=Staleness)
declare_facts(RankReport, staleness_histogram=dict, max_ahead=int)


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
    options = {
        "placement": Option(
            "colocated",
            {"enum": ["colocated", "dedicated"]},
            "servers beside the first workers, or in their own processes",
        ),
        "servers": Option(1, {"type": "integer", "minimum": 1}, "K: server shards the parameters are split over"),
        "staleness": Option(
            0, {"type": "integer", "minimum": 0}, "S: updates a worker may run ahead of the slowest (0: synchronous)"
        ),
    }
    evaluates_on_workers = True  # as ddp: one process per worker predicts its share
    equivalence_entry = {"workers": 2, "images_per_worker": 4}
    theory_text = (
        "2(N-1)M through a co-located server and 2NM through a dedicated one (split "
        "over K server shards: 2(M + (N-2)M/K) and 2NM/K)"
    )
    communication_timed = "a worker's sending its gradients and receiving the updated weights"
    bytes_counted = "The parameter server counts the bytes of the messages it really sends and receives."
    memory_text = (
        "the whole weights and gradients on every process, the momentum 1/K on each "
        "server (a colocated server: 2M + M/K)"
    )
    SHARDED = "PS, K servers (dedicated, spare CPU machines)"  # compared in the report's sentences

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        """One server beside the first worker, and K dedicated shards (K follows the cluster:
        costmodel/clusters.py Cluster.servers)."""
        return {
            "PS, 1 server (colocated)": {"strategy": cls.name, "placement": "colocated", "servers": 1},
            cls.SHARDED: {"strategy": cls.name, "placement": "dedicated", "servers": "K"},
        }

    def __init__(self, run: Run, parallel: schema.Parallel):
        super().__init__(run, parallel)
        # a dedicated server is a process of its own, beside the workers
        self.extra_processes = run.option("servers") if run.option("placement") == "dedicated" else 0

    @classmethod
    def variant(cls, run: Run) -> str:
        # always named: ps-colocated-w2-b4, ps-dedicated-w2-b4; shards when more than one,
        # bounded staleness when not synchronous: ps-dedicated-k2-ssp1-w2-b4
        k, staleness = run.option("servers"), run.option("staleness")
        return run.option("placement") + (f"-k{k}" if k > 1 else "") + (f"-ssp{staleness}" if staleness else "")

    @classmethod
    def invalid(cls, run: Run) -> str | None:
        placement, k = run.option("placement"), run.option("servers")
        if run.precision == "fp16":  # the workers' loss scale would have to follow the server's
            return (
                "fp16 needs a loss scale every process agrees on, and only the server steps; "
                "use precision: bf16 (no scaler) for ps"
            )
        if run.option("staleness") and placement != "dedicated":
            return (
                "staleness > 0 needs placement: dedicated (a colocated server would stop "
                "serving while it computes its own gradients)"
            )
        if placement == "colocated" and k > run.workers:
            return (
                f"colocated servers live on workers: {k} servers need at least as "
                f"many workers, not {run.workers} (or use placement: dedicated)"
            )
        return super().invalid(run)

    def unavailable(self) -> str | None:
        if self.parallel.sync_batchnorm:
            return "sync_batchnorm is implemented for ddp only; ps takes the first worker's buffers"
        return super().unavailable()

    @classmethod
    def waits_for_slowest(cls, run: Run) -> bool:
        """With staleness S > 0 a worker runs ahead of the slowest by up to S updates."""
        return super().waits_for_slowest(run) and not run.option("staleness")

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> list[list[Flow]]:
        """N workers, K server shards of M/K each: every worker sends each shard's server its
        gradients, then (after the update; the server needs every worker's) receives its
        weights. A colocated server keeps its own worker's slice local. So a dedicated server
        moves N M/K each way and a worker M; a colocated server-worker M + (N-2)M/K (K = 1: the
        2(N-1)M through one server the study is about; K = N: ring all-reduce's 2(N-1)/N M)."""
        n, k = run.workers, run.option("servers")
        dedicated = run.option("placement") == "dedicated"
        kind, shard = ("server" if dedicated else "worker"), grad_bytes / k
        gradients = [
            Flow(("worker", w), (kind, s), shard)
            for w in range(n)
            for s in range(k)
            if dedicated or s != w  # a colocated server's own worker's slice stays local
        ]
        return [gradients, [Flow(f.dst, f.src, f.nbytes) for f in gradients]]

    @classmethod
    def phase_ports(cls, run: Run, grad_bytes: float, network: Network) -> list[Ports]:
        """`phases` on `network`, counted rather than listed: their N x K flows put 1,000 nodes
        of 8 GPUs (K = 1,000) past 8 million tuples a phase; this is linear in N + K and gives
        the same [bytes, seconds] on every port (tests/test_costmodel.py checks it against the
        flows). The weights come back over the same ports the other way."""
        gradients = push_ports(
            run.workers, run.option("servers"), run.option("placement") == "dedicated", grad_bytes, network
        )
        flip = {"out": "in", "in": "out"}
        return [gradients, {(link, flip[way]): load for (link, way), load in gradients.items()}]

    @classmethod
    def algorithms(cls, run: Run, grad_bytes: float, network: Network) -> str:
        """Messages between workers and servers, no collective (without listing `phases`' N x K)."""
        return "point-to-point"

    @classmethod
    def memory_theory(cls, run: Run, grad_bytes: float) -> dict[str, float]:
        """Every process keeps the whole weights; a worker its whole gradients; the momentum
        lives on the servers, 1/K of it each. The busiest: a colocated server (whole gradients
        and its 1/K), or a dedicated one with K = 1 (its shard's gradients: all of them)."""
        k = run.option("servers")
        worker = {"parameters": grad_bytes, "gradients": grad_bytes, "optimizer": 0.0}
        if run.option("placement") == "colocated":
            return dict(worker, optimizer=grad_bytes / k)
        server = {"parameters": grad_bytes, "gradients": grad_bytes / k, "optimizer": grad_bytes / k}
        return max(worker, server, key=lambda parts: sum(parts.values()))

    def runtime(self) -> ParameterServerRuntime:
        return ParameterServerRuntime(self)


def push_ports(workers: int, servers: int, dedicated: bool, grad_bytes: float, network: Network) -> Ports:
    """What every worker's gradients to every server (its shard of M/K, one message each) put
    on each port of `network` (`Network.ports` of `ParameterServer.phases`' first phase),
    counted per process and per node. A colocated server is worker s and gets no message from
    itself."""
    shard, fixed = grad_bytes / servers, network.message_s
    kind = "server" if dedicated else "worker"  # a colocated server is its worker's process
    home = {(kind, s): network.node((kind, s)) for s in range(servers)}
    workers_on = Counter(network.node(("worker", w)) for w in range(workers))
    servers_on = Counter(home.values())
    ports: Ports = {}

    def put(port: tuple, link: Link | None, count: int) -> None:
        if count > 0:
            if link is None:
                raise ValueError(f"flows off {port[0]}, but no inter-node link was given")
            ports[port] = [count * shard, count * (link.seconds(shard) + fixed)]

    for w in range(workers):  # to the servers of its own node, each over its own link
        here = network.node(("worker", w))
        put((("link", ("worker", w)), "out"), network.intra, servers_on[here] - (not dedicated and w < servers))
    for end, there in home.items():  # from the workers of its node, itself aside
        put((("link", end), "in"), network.intra, workers_on[there] - (not dedicated))
    for node in workers_on.keys() | servers_on.keys():  # across nodes: each node's one network
        put((("network", node), "out"), network.inter, workers_on[node] * (servers - servers_on[node]))
        put((("network", node), "in"), network.inter, servers_on[node] * (workers - workers_on[node]))
    return ports


class ParameterServerRuntime(TorchrunRuntime):
    """A server, a worker or both: the messages of the module docstring, and the step."""

    def __init__(self, spec: ParameterServer):
        super().__init__(spec)
        self.dedicated = self.run.option("placement") == "dedicated"
        self.servers = self.run.option("servers")  # K
        self.first_worker = self.servers if self.dedicated else 0
        self.staleness = self.run.option("staleness")
        self.ssp: Stale | None = None  # a server's asynchronous state

    def place(self, ctx: Context) -> Context:
        if ctx.rank < self.servers:
            ctx.role = "server" if self.dedicated else "server+worker"
        ctx.shard = None if ctx.role == "server" else ctx.rank - self.first_worker
        self.workers = list(range(self.first_worker, ctx.processes))
        ctx.shards = len(self.workers)
        return ctx

    def wrap(self, model: torch.nn.Module, ctx: Context) -> torch.nn.Module:
        import torch
        import torch.distributed as dist

        self.params = [p for p in model.parameters() if p.requires_grad]
        self.buffers = changing_buffers(model)  # they travel with server 0's parameters
        self.owner = balanced_shards([p.numel() * p.element_size() for p in self.params], self.servers)
        self.shards = [
            [p for p, o in zip(self.params, self.owner, strict=False) if o == s] for s in range(self.servers)
        ]
        self.versions = torch.zeros(self.servers, device=ctx.device)  # of each shard's weights held (SSP)
        state = self._flat(self.params + self.buffers)
        dist.broadcast(state, src=0)  # every replica starts from server 0's weights
        self._unflatten(state, self.params + self.buffers)
        return model

    def _state(self, server: int) -> list[torch.Tensor]:
        """What server `server` sends back: its parameters, and server 0 the buffers too."""
        return self.shards[server] + (self.buffers if server == 0 else [])

    @staticmethod
    def _flat(tensors) -> torch.Tensor:
        import torch

        return torch.cat([t.detach().reshape(-1) for t in tensors])

    @staticmethod
    def _pieces(flat: torch.Tensor, tensors):
        """(tensor, its slice of the flat message) for each tensor, in order."""
        offset = 0
        for tensor in tensors:
            yield tensor, flat[offset : offset + tensor.numel()].view_as(tensor)
            offset += tensor.numel()

    def _unflatten(self, flat: torch.Tensor, tensors) -> None:
        for tensor, piece in self._pieces(flat, tensors):
            tensor.data.copy_(piece)

    @staticmethod
    def _gradients(params) -> torch.Tensor:
        import torch

        return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])

    def _send(self, tensor: torch.Tensor, dst: int, tag: int) -> dist.Work:
        import torch.distributed as dist

        self._traffic.sent += tensor.numel() * tensor.element_size()
        work = dist.isend(tensor, dst, tag=tag)
        assert work is not None  # None only for a rank outside the group: every rank is in it
        return work

    def _recv(self, tensor: torch.Tensor, src: int, tag: int) -> dist.Work:
        import torch.distributed as dist

        self._traffic.received += tensor.numel() * tensor.element_size()
        work = dist.irecv(tensor, src, tag=tag)
        assert work is not None  # as in _send
        return work

    def _empty(self, tensors, ctx: Context) -> torch.Tensor:
        import torch

        return torch.empty(sum(t.numel() for t in tensors), device=ctx.device)

    def step(self, model, optimizer, ctx: Context) -> float:
        if self.staleness:
            return self._stale_serve(optimizer, ctx) if ctx.role == "server" else self._stale_worker_step(ctx)
        return self._synchronous_step(optimizer, ctx)

    def _synchronous_step(self, optimizer, ctx: Context) -> float:
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
        import torch

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
        total: torch.Tensor = sum(grads.values()) if remote else torch.zeros(0, device=ctx.device)  # type: ignore[assignment]  # a sum of tensors is a tensor
        if ctx.role == "server+worker":
            total = total + self._gradients(mine) if remote else self._gradients(mine)
        # The mean; one worker's gradient is its own mean (x / 1 is x: no pass over it)
        self._apply(optimizer, mine, total / len(self.workers) if len(self.workers) > 1 else total, buffers)
        update = time.perf_counter() - start
        if remote:  # with no other worker there is nobody to send the new values to
            state = self._flat(self._state(ctx.rank))
            pending += [self._send(state, w, WEIGHTS) for w in remote]
        return update

    def _apply(self, optimizer, mine: list, gradient: torch.Tensor, buffers: torch.Tensor | None) -> None:
        """Step this server's parameters `mine` with `gradient` (flat), and take `buffers`."""
        for p in self.params:  # the optimizer steps what has a gradient: this shard only
            p.grad = None
        for p, piece in self._pieces(gradient, mine):
            p.grad = piece  # a view of this step's own flat gradient: nothing else writes it
        optimizer.step()  # <- the parameter server updates the weights here, and only here
        if buffers is not None:
            self._unflatten(buffers, self.buffers)

    # ---- bounded staleness (staleness: S > 0) ------------------------------------------------
    def _message_size(self, server: int) -> int:
        """A gradient message to `server`: its shard's gradients, server 0's the buffer slot
        (filled by the first worker; every message has the same size, so the server can take
        them from any worker as they come), and the weights' version."""
        size = sum(p.numel() for p in self.shards[server]) + 1
        return size + (sum(b.numel() for b in self.buffers) if server == 0 else 0)

    def _stale_worker_step(self, ctx: Context) -> float:
        """Send each server this worker's gradients with the version of the weights they were
        computed on (and the first worker's buffers to server 0); take the weights it answers
        with, and their version."""
        import torch

        start = time.perf_counter()
        works = []
        for s in range(self.servers):
            parts = [self._gradients(self.shards[s])]
            if s == 0 and self.buffers:
                parts.append(
                    self._flat(self.buffers)
                    if ctx.rank == self.first_worker
                    else torch.zeros(sum(b.numel() for b in self.buffers), device=ctx.device)
                )
            works.append(self._send(torch.cat(parts + [self.versions[s : s + 1]]), s, GRADIENTS))
        states = {
            s: torch.empty(sum(t.numel() for t in self._state(s)) + 1, device=ctx.device) for s in range(self.servers)
        }
        works += [self._recv(state, s, WEIGHTS) for s, state in states.items()]
        for work in works:
            work.wait()
        for s, state in states.items():
            self._unflatten(state[:-1], self._state(s))
            self.versions[s] = state[-1]
        return time.perf_counter() - start

    def _stale_serve(self, optimizer, ctx: Context) -> float:
        """Apply gradients as they arrive, from whichever worker, as many as there are workers
        (so the server's step count and the workers' stay equal), answering each worker unless
        that would put it more than S updates ahead of the slowest. Returns the seconds not
        spent updating."""
        import torch
        import torch.distributed as dist

        if self.ssp is None:
            self.ssp = Stale(clock={w: 0 for w in self.workers})
        mine, ssp, start, update = self.shards[ctx.rank], self.ssp, time.perf_counter(), 0.0
        size = sum(p.numel() for p in mine)
        message = torch.empty(self._message_size(ctx.rank), device=ctx.device)
        for _ in self.workers:
            self._traffic.received += message.numel() * message.element_size()
            worker = dist.recv(message, tag=GRADIENTS)  # from any worker: the first to send
            begin = time.perf_counter()
            buffers = message[size:-1] if ctx.rank == 0 and worker == self.first_worker and self.buffers else None
            ssp.histogram[ssp.version - int(message[-1])] += 1
            self._apply(optimizer, mine, message[:size] / len(self.workers), buffers)
            update += time.perf_counter() - begin
            ssp.version += 1
            ssp.clock[worker] += 1
            ssp.waiting.append(worker)
            self._answer(ctx)
        for work in ssp.sends:
            work.wait()
        ssp.sends.clear()
        return time.perf_counter() - start - update

    def _answer(self, ctx: Context) -> None:
        """Send the current weights to every waiting worker within S of the slowest."""
        import torch

        ssp = self.ssp
        assert ssp is not None  # a stale server's state, made where it starts serving
        slowest = min(ssp.clock.values())
        for w in [w for w in ssp.waiting if ssp.clock[w] - slowest <= self.staleness]:
            ssp.waiting.remove(w)
            ssp.max_ahead = max(ssp.max_ahead, ssp.clock[w] - slowest)
            state = torch.cat(
                [self._flat(self._state(ctx.rank)), torch.tensor([float(ssp.version)], device=ctx.device)]
            )
            ssp.sends.append(self._send(state, w, WEIGHTS))

    def summary_facts(self, ranks: list[dict]) -> dict:
        """The staleness the servers observed: updates applied between a gradient's weights and
        its own application, counted over every gradient of the run."""
        if not self.staleness:
            return {}
        histogram: Counter[int] = Counter()
        for rank in ranks:
            histogram.update({int(k): v for k, v in (rank.get("staleness_histogram") or {}).items()})
        return {"staleness": {"bound": self.staleness, "histogram": {str(k): histogram[k] for k in sorted(histogram)}}}

    def rank_facts(self, ctx: Context) -> dict:
        if self.ssp is None:
            return {}
        return {"staleness_histogram": dict(self.ssp.histogram), "max_ahead": self.ssp.max_ahead}

    def consolidate(self, model, optimizer, ctx: Context) -> None:
        """Before a checkpoint or the run's report: every server's parameters and optimizer
        state to every process, so that rank 0 saves the whole run and all replicas (a
        dedicated server's included) are the same model. Nothing to do with one synchronous
        server, whose workers already hold its weights."""
        if self.servers == 1 and not self.staleness:
            return
        mine = [i for i, owner in enumerate(self.owner) if owner == ctx.rank]  # none for a worker
        shard = {
            i: (self.params[i].detach().cpu(), {k: v.cpu() for k, v in optimizer.state.get(self.params[i], {}).items()})
            for i in mine
        }
        for part in distributed.all_gather(shard):
            for i, (value, state) in part.items():
                self.params[i].data.copy_(value)
                if state:
                    optimizer.state[self.params[i]] = {k: v.to(ctx.device) for k, v in state.items()}

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        """This process's bytes each way: as a worker, the gradients of the shards others
        serve; as a server, its shard from and to every other worker."""
        serves, trains = ctx.rank < self.servers, ctx.role != "server"
        shard = sum(p.numel() * p.element_size() for p in self.shards[ctx.rank]) if serves else 0
        remote = len([w for w in self.workers if w != ctx.rank])
        moved = (grad_bytes - shard if trains else 0) + (remote * shard if serves else 0)
        sent, received = moved, moved
        # BatchNorm statistics (synchronous steps): the first worker's go to server 0, whose
        # weights carry them to every other worker.
        buffers = sum(b.numel() * b.element_size() for b in self.buffers)
        if buffers and not self.staleness:
            if ctx.rank == 0:
                sent += remote * buffers
                received += buffers if self.first_worker != 0 else 0
            elif trains:
                received += buffers
                sent += buffers if ctx.rank == self.first_worker else 0
        return {"sent": sent, "received": received}
