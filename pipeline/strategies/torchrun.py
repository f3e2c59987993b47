"""What the multi-process strategies (ddp, ps, zero, fsdp) share: one process per worker started
by torchrun (one launcher per node, c10d rendezvous across nodes) and the checks of what this
machine can run (the spec), a torch.distributed process group (the runtime)."""

from __future__ import annotations

from ..config import schema
from ..runtime import distributed
from .base import Strategy
from .process import Context, Runtime


class TorchrunStrategy(Strategy):
    extra_processes = 0  # processes besides the workers (a dedicated server)
    evaluates_on_workers = False  # evaluate with as many processes as trained

    def processes(self) -> int:
        return self.run.workers + self.extra_processes

    def per_node(self) -> tuple[int, str | None]:
        """torchrun's --nproc-per-node, or why the processes do not split over the nodes."""
        total, nodes = self.processes(), self.parallel.nnodes
        if total % nodes:
            return 0, f"{total} processes do not split evenly over {nodes} nodes"
        return total // nodes, None

    def nodes(self) -> int:
        return self.parallel.nnodes

    def processes_per_node(self) -> int:
        return max(1, self.per_node()[0])  # an uneven split is skipped; ask for one process

    def gpus(self) -> int:
        return self.per_node()[0] if distributed.uses_gpus(self.parallel.backend) else 0

    def unavailable(self) -> str | None:
        per_node, why = self.per_node()
        if why:
            return why
        gpus = distributed.gpu_count()
        if self.parallel.backend == "nccl" and gpus == 0:
            return "NCCL needs GPUs and none is visible (set parallel.backend to auto or gloo)"
        if gpus:
            return None if per_node <= gpus else f"{per_node} processes per node but {gpus} GPU(s)"
        cores = distributed.available_cores()
        return None if per_node <= cores else f"{per_node} processes per node but {cores} CPU core(s)"

    def launcher(self, python: str) -> list[str]:
        return torchrun(python, self.per_node()[0], self.parallel, f"{self.name}-{self.run.workers}")

    def evaluation_processes(self) -> int:
        return self.run.workers if self.evaluates_on_workers else 1

    def evaluation_launcher(self, python: str) -> list[str]:
        if not self.evaluates_on_workers:
            return [python]
        # Evaluation runs on one node only (its job asks for one), one process per worker.
        return torchrun(python, self.evaluation_processes(), self.parallel.model_copy(update={"nnodes": 1}), "")

    def runtime(self) -> TorchrunRuntime:
        return TorchrunRuntime(self)


def torchrun(python: str, per_node: int, parallel: schema.Parallel, job_id: str) -> list[str]:
    """The standard launcher: one torchrun per node (pipeline/runtime/elastic.py: torchrun, naming the
    process that died), c10d rendezvous at parallel.rdzv_endpoint, elastic restarts."""
    command = [
        python,
        "-m",
        "pipeline.runtime.elastic",
        f"--nproc-per-node={per_node}",
        f"--nnodes={parallel.nnodes}",
        f"--max-restarts={parallel.max_restarts}",
    ]
    if parallel.nnodes == 1:
        return command + ["--standalone"]
    return command + ["--rdzv-backend=c10d", f"--rdzv-endpoint={parallel.rdzv_endpoint}", f"--rdzv-id={job_id}"]


class TorchrunRuntime(Runtime):
    """A process of a torchrun job: a member of the process group."""

    def theory_bytes(self, ctx: Context, grad_bytes: int) -> dict[str, float]:
        """What every rank sends and receives by `phases`: the last worker's link, each way."""
        wire = self.spec.link_bytes(self.run, grad_bytes)["worker"]
        return {"sent": wire, "received": wire}

    def start(self, threads: int) -> Context:
        member = distributed.init_process_group(self.parallel.backend, self.parallel.timeout_s, threads)
        ctx = Context(
            rank=member.rank,
            processes=member.processes,
            device=member.device,
            threads=member.threads,
            backend=member.backend,
            shard=member.rank,
            shards=member.processes,
        )
        return self.place(ctx)

    def place(self, ctx: Context) -> Context:
        """Each process is a worker with its own shard; a strategy with other roles says so."""
        return ctx

    def finish(self, ctx: Context) -> None:
        distributed.destroy_process_group()
