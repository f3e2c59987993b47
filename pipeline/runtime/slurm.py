"""Starting a multi-node run inside a SLURM allocation: one torchrun per node through `srun`,
with the rendezvous on the allocation's first node.

The launcher (pipeline/launch.py) asks `allocation()` whether it runs inside a SLURM job; outside
one it returns None and nothing here is used. The job's node list and CPUs per task are read
from the controller (`scontrol show job`), not from the environment: Snakemake's SLURM job step
removes most SLURM_* variables before it runs a job's command.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass

PORT_SPREAD = 1000  # rendezvous ports used: the configured one + job id % PORT_SPREAD


@dataclass(frozen=True)
class Allocation:
    job_id: str
    hosts: tuple[str, ...]  # node names, in the allocation's order
    first_address: str  # where the first node is reached (its NodeAddr)
    cpus_per_task: int


def _scontrol(*args: str) -> str:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, check=True).stdout


def _field(text: str, key: str) -> str | None:
    match = re.search(rf"(?:^|\s){re.escape(key)}=(\S+)", text)
    return match.group(1) if match else None


def allocation(environ=os.environ) -> Allocation | None:
    """The SLURM job this process runs in, or None outside SLURM."""
    job_id = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job_id:
        return None
    job = _scontrol("show", "job", "-o", job_id)
    nodelist = environ.get("SLURM_JOB_NODELIST") or _field(job, "NodeList")
    assert nodelist is not None  # scontrol's record of a job always holds its NodeList
    hosts = tuple(_scontrol("show", "hostnames", nodelist).split())
    # The node's NodeAddr (its name on most clusters) is the address Slurm itself uses for it.
    address = _field(_scontrol("show", "node", "-o", hosts[0]), "NodeAddr") or hosts[0]
    cpus = int(_field(job, "CPUs/Task") or 1)
    return Allocation(job_id, hosts, address, cpus)


def rdzv_endpoint(alloc: Allocation, configured: str) -> str:
    """The first node, on the configured port moved by the job id: two jobs that share a first
    node (or, in the tests, one host) do not rendezvous on the same port."""
    port = int(configured.rsplit(":", 1)[1]) + int(re.sub(r"\D", "", alloc.job_id)) % PORT_SPREAD
    return f"{alloc.first_address}:{port}"


def srun(alloc: Allocation, nodes: int) -> list[str]:
    """Command prefix that starts the rest once on each of `nodes` nodes (one torchrun per node).

    --overlap: Snakemake's job step may itself run inside a step that holds the job's CPUs and
    memory on the first node; without it this step would wait for them forever.
    --kill-on-bad-exit: a torchrun that fails takes the others down instead of leaving them
    waiting at the next collective.
    """
    return [
        shutil.which("srun") or "srun",
        "--overlap",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        f"--cpus-per-task={alloc.cpus_per_task}",
        "--kill-on-bad-exit=1",
    ]
