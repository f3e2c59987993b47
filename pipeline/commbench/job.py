"""What one commbench job is, without torch: the Snakefile sizes it (pipeline/resources.py) and
pipeline/launch.py starts it from here while the workflow plans.

The job is `processes` processes on one node (commbench times one host's links), one GPU each
where the backend runs on GPUs, started by torchrun like a training run's processes.
"""

from __future__ import annotations

from ..config import schema
from ..runtime import distributed
from ..strategies.torchrun import torchrun

MODULE = "pipeline.commbench"  # what the launcher runs in each process


def one_node(parallel: schema.Parallel) -> schema.Parallel:
    """parallel for the job: one node, and no restarts (a restart is a knob, rerunning nothing,
    and a benchmark this short needs none)."""
    return parallel.model_copy(update={"nnodes": 1, "max_restarts": 0})


def launcher(python: str, processes: int, parallel: schema.Parallel) -> list[str]:
    return torchrun(python, processes, one_node(parallel), "")


def gpus(processes: int, parallel: schema.Parallel) -> int:
    return processes if distributed.uses_gpus(parallel.backend) else 0
