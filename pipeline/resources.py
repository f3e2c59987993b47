"""What each of the workflow's jobs asks a scheduler for, from the resolved config (`cfg`, from
pipeline.config.params.resolve) and the sweep's runs (pipeline.strategies.sweep.runs(cfg)).

The Snakefile (rules/common.smk) hands these dicts to its rules' `resources:`; locally Snakemake
only counts them, on a cluster snakemake-executor-plugin-slurm maps them onto `sbatch` (its
names: profiles/slurm, docs/clusters.md). Plain functions of the config, so tests/test_resources.py checks
them without Snakemake.
"""

from __future__ import annotations

from . import strategies
from .commbench import job as commbench_job
from .config import schema
from .runtime.run import Run
from .strategies import sweep


def scheduler(cfg: schema.Config) -> dict:
    """What every job asks SLURM for besides its processes (snakemake-executor-plugin-slurm's
    names; profiles/slurm). None leaves a resource unset: the cluster's default partition, no
    account."""
    resources = cfg.resources
    return {
        "runtime": resources.runtime_minutes,
        "slurm_partition": resources.partition,
        "slurm_account": resources.account,
    }


def job_resources(cfg: schema.Config, nodes: int, per_node: int, gpus_per_node: int) -> dict:
    """A job of `per_node` processes on each of `nodes` nodes, in the executor plugin's terms.

    - tasks: one task per node. The job's script runs once, and the launcher starts one torchrun
      per node itself (srun inside the allocation), which starts the node's processes.
    - mem_mb: per node, like sbatch --mem.
    - gpu: Snakemake's standard resource, the job's GPUs (sbatch --gpus counts all its nodes).
    - tasks_per_gpu: the plugin reads `tasks` of a GPU job as tasks per GPU; 0 turns that off.
    - mpi: a job over several nodes starts its own srun; with an `mpi` resource the plugin's job
      step runs the command once in the batch script, not inside a one-node `srun -n1` step.

    None leaves a resource unset (Snakemake drops it)."""
    resources = cfg.resources
    return {
        **scheduler(cfg),
        "nodes": nodes,
        "processes": per_node,
        "tasks": nodes,
        "cpus_per_task": per_node * resources.cpus_per_process,
        "mem_mb": per_node * resources.memory_mb_per_process,
        "gpu": nodes * gpus_per_node,
        "tasks_per_gpu": 0 if gpus_per_node else None,
        "mpi": "srun" if nodes > 1 else None,
    }


def resource_names(cfg: schema.Config) -> list[str]:
    """The names job_resources sets, the same for every job."""
    return list(job_resources(cfg, 1, 1, 0))


def one_process_resources(cfg: schema.Config) -> dict:
    """A job of one process without GPUs (the data, report and paper rules): one process's CPUs
    and memory, so a cluster's default memory per job does not decide whether it fits."""
    return job_resources(cfg, 1, 1, 0)


def run_resources(cfg: schema.Config, run: Run, stage: str = "train") -> dict:
    """What one run's training (or evaluation) job asks a scheduler for: its nodes, processes
    per node, their CPUs and memory, GPUs where it uses them. `run` is a filled sweep entry (a
    value of sweep.runs(cfg)). Evaluation runs on one node."""
    strategy = strategies.get(run, cfg.parallel)
    if stage == "evaluate":
        processes = strategy.evaluation_processes()
        return job_resources(cfg, 1, processes, min(strategy.gpus(), processes))
    return job_resources(cfg, strategy.nodes(), strategy.processes_per_node(), strategy.gpus())


def equivalence_resources(cfg: schema.Config) -> dict:
    """One step of each of pipeline/equivalence.py's entries, one after another, on one node
    (pipeline/equivalence.py runs them with nnodes=1 whatever parallel.nnodes says): the job is
    as large as the largest of them, in processes and in GPUs."""
    steps = [
        strategies.get(entry, cfg.parallel.model_copy(update={"nnodes": 1})) for entry in sweep.equivalence_runs(cfg)
    ]
    return job_resources(cfg, 1, max(s.processes() for s in steps), max(s.gpus() for s in steps))


def commbench_resources(cfg: schema.Config, processes: int) -> dict:
    """What the commbench job at `processes` processes asks for: one node, its GPUs
    (pipeline/commbench/job.py)."""
    return job_resources(cfg, 1, processes, commbench_job.gpus(processes, cfg.parallel))


def commbench_processes(cfg: schema.Config, runs: dict[str, Run]) -> list[int]:
    """The process counts whose links the cost model needs: every multi-process run on one node
    that this machine can run (a run over several nodes crosses links commbench does not time)."""
    steps = [strategies.get(run, cfg.parallel) for run in runs.values()]
    return sorted({s.processes() for s in steps if s.processes() > 1 and s.nodes() == 1 and s.unavailable() is None})
