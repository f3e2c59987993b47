"""`allgather` (test-only): every rank all-gathers every rank's gradients and averages them
itself, in `chunks` pieces. The simplest correct synchronisation, with (N-1) M bytes each way
per rank instead of ring all-reduce's 2(N-1)/N M. Each rank reports how many all-gathers it ran,
a fact of its own. tests/test_new_strategy.py drops this module into a copy of the repository,
adds it to the registry, and runs the whole workflow with it."""
from __future__ import annotations

import time

from ..config import schema
from ..costmodel.network import Flow
from ..runtime.records.base import declare_facts
from ..runtime.records.training import RankReport
from ..runtime.run import Run
from .base import Option
from .process import Context
from .torchrun import TorchrunRuntime, TorchrunStrategy

declare_facts(RankReport, all_gathers=int)  # its rank_facts: the all-gathers this rank ran


class AllGather(TorchrunStrategy):
    name = "allgather"
    label = "gradient all-gather"
    options = {"chunks": Option(1, {"type": "integer", "minimum": 1},
                                "pieces each rank's gradients are all-gathered in")}
    # What the study says of it: its one-step check, its theory, how it counts, its curve
    equivalence_entry = {"workers": 2, "images_per_worker": 4}
    theory_text = "(N-1)M each way per rank for a gradient all-gather"
    bytes_counted = "The gradient all-gather counts the bytes of the tensors it gathers."

    @classmethod
    def predicted_curves(cls, predict: schema.Predict) -> dict[str, dict]:
        return {"gradient all-gather": {"strategy": cls.name}}

    @classmethod
    def variant(cls, run: Run) -> str:
        chunks = run.option("chunks")
        return f"c{chunks}" if chunks > 1 else ""

    @classmethod
    def phases(cls, run: Run, grad_bytes: float) -> list[list[Flow]]:
        """Every rank sends its whole gradients to every other rank, at once."""
        n = run.workers
        return [[Flow(("worker", i), ("worker", j), grad_bytes) for i in range(n) for j in range(n) if i != j]]

    def runtime(self) -> AllGatherRuntime:
        return AllGatherRuntime(self)


class AllGatherRuntime(TorchrunRuntime):
    """A rank: every rank's gradients gathered and averaged here, its all-gathers counted."""

    all_gathers = 0

    def step(self, model, optimizer, ctx: Context) -> float:
        import torch  # in the runtime only: the spec is read where torch is not loaded
        import torch.distributed as dist

        start = time.perf_counter()
        params = [p for p in model.parameters() if p.requires_grad]
        mine = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
                          for p in params])
        pieces = []
        for chunk in torch.tensor_split(mine, self.run.option("chunks")):
            everyone = [torch.empty_like(chunk) for _ in range(ctx.processes)]
            dist.all_gather(everyone, chunk)
            self.all_gathers += 1
            pieces.append(torch.stack(everyone))
        moved = mine.numel() * mine.element_size() * (ctx.processes - 1)
        self._traffic.sent += moved
        self._traffic.received += moved
        average, offset = torch.cat(pieces, dim=1).mean(0), 0
        for p in params:
            p.grad = average[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        seconds = time.perf_counter() - start
        optimizer.step()  # every rank updates its own replica with the same average
        return seconds

    def rank_facts(self, ctx: Context) -> dict:
        return {"all_gathers": self.all_gathers}

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        moved = (ctx.processes - 1) * grad_bytes
        return {"sent": moved, "received": moved}
