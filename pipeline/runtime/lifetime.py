"""No process outlives its job.

torchrun starts its workers in sessions of their own, so killing a job's process group (what a
scheduler, an OOM kill or `kill -9 -PGID` does) does not reach them, and nothing reaches the
children of a SIGKILLed parent. So every process of a job asks the kernel to kill it when its
parent exits (Linux's PR_SET_PDEATHSIG): the launcher with respect to Snakemake (the rule's
shell `exec`s it, so Snakemake is its parent; the setting survives the launcher's own `exec` of
torchrun), each worker with respect to torchrun, an evaluation or equivalence step likewise.
This holds under torchrun, plain python, srun (the parent is slurmstepd) and in a container;
it needs no polling and nothing to clean up.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
# The pid of the process that starts a job's workers (the launcher, which becomes torchrun).
# A worker compares its parent with it: a parent that died before the worker asked to follow
# it (while the worker was still importing torch) leaves the worker with another parent.
LAUNCHER_PID = "BENCH_LAUNCHER_PID"


def die_with_parent(parent: int | None = None, sig: int = signal.SIGKILL) -> None:
    """From now on the kernel sends `sig` to this process when its parent exits; if the parent
    (`parent`, else the launcher named in the environment, else the parent now) is gone
    already, go now."""
    if not sys.platform.startswith("linux"):  # pragma: no cover - the pipeline runs on Linux
        return
    launcher = os.environ.get(LAUNCHER_PID)
    if parent is None and launcher == str(os.getpid()):
        return  # the launcher after its exec: it asked already, and the request survives exec
    expected = parent or (int(launcher) if launcher else os.getppid())
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != expected:
        os.kill(os.getpid(), sig)


def become_launcher(parent: int | None = None) -> None:
    """For a process about to exec the job's launcher (torchrun, or the worker itself): die
    with our parent, and tell the workers we start that we are theirs."""
    die_with_parent(parent)
    os.environ[LAUNCHER_PID] = str(os.getpid())


def exit_finished() -> None:
    """End a training or evaluation process whose work is done and written, skipping the
    interpreter's teardown. A process group it left (runtime/distributed.py keeps the groups,
    and a model wrapper may reference them: DDP's reducer, FSDP's device mesh) is otherwise
    destroyed during finalization, when gloo's worker threads can no longer take the GIL: seen as
    "terminate called without an active exception" and SIGABRT after a finished run, about one
    run in 20 here (pytorch/pytorch#179291 describes the teardown). Every output is complete
    by now (written to a temporary file and renamed); only the streams need flushing."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
