"""One process at a time trains or evaluates a run: an exclusive lock on its run directory.

Snakemake locks the outputs of one workflow, but two instances started at the same instant (or
with --nolock, or from two working copies sharing results/) can both start the same job. Two
writers in one run directory corrupt each other: each removes the other's temporaries as a
killed writer's (runtime/files.py), and a resumed checkpoint interleaves two runs' iterations.
So the launcher (pipeline/launch.py), the one process of each train or evaluate job, takes
`<run dir>/.lock` before anything is restored or written, and refuses to start if another holds it.

The lock is a flock on a descriptor that stays open and inheritable across the launcher's exec
of torchrun, python or srun, so it lives exactly as long as the job: the kernel releases it when
the last process holding the descriptor ends, killed (-9) or not, and a lock is never stale. The
holder writes its pid (and its start time, host, and what it does) into the file once it holds
the lock, for the refusal to name; a refused process changes nothing in the run directory. A
busy lock whose named holder still runs on this host is refused at once; one whose holder is
gone (a job just killed, whose loader workers or torchrun children still hold the descriptor)
or runs on another host is waited for up to PATIENCE_S, as those children end. The file stays
after the job (naming its last holder): deleting it could let two processes lock two files.
On a file system without locks (Lustre mounted without -o flock) the launcher warns and goes on.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import sys
import time
from pathlib import Path

from .files import output_error
from .stale_locks import process_start, process_stat

LOCK_NAME = ".lock"  # not an output of any rule (train_summary.json, metrics.json, ...)
DOING = {"train": "training", "evaluate": "evaluating"}
# A file system without working locks (Lustre mounted without -o flock, NFS without lockd)
NO_LOCKS = (errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOLCK, errno.EINVAL)
PATIENCE_S = 10.0  # how long a busy lock is waited for before the job is refused


class RunBusyError(RuntimeError):
    """Another process trains or evaluates this run: this one did not start and changed nothing."""


def holder(run_dir: str | Path) -> dict:
    """What the lock file says of the process that holds (or last held) the run's lock."""
    try:
        return json.loads((Path(run_dir) / LOCK_NAME).read_text())
    except (OSError, ValueError):  # absent, or read between the holder's lock and its write
        return {}


def busy_message(run_dir: str | Path) -> str:
    found = holder(run_dir)
    pid, host = found.get("pid"), found.get("host")
    who = (f"pid {pid}" if pid else "pid unknown") + (f" on {host}" if host and host != socket.gethostname() else "")
    stop = f"stop it (kill {pid})" if pid else "stop it"
    return (
        f"another process ({who}) is {found.get('doing', 'working on')} this run "
        f"({run_dir}): wait for it to end, or {stop}, then rerun"
    )


def holder_runs(run_dir: str | Path) -> bool:
    """Whether the process the lock file names runs on this host (not a zombie, and not another
    process under its reused pid: the start time it wrote). False where it cannot be told: no
    pid written yet, another host, or a process that is gone."""
    found = holder(run_dir)
    pid = found.get("pid")
    if not isinstance(pid, int) or found.get("host") != socket.gethostname():
        return False
    fields = process_stat(pid)  # None: gone (or no /proc: then no waiting is lost, only skipped)
    return fields is not None and fields[0] != "Z" and found.get("start") in (None, fields[19])


def _lock(fd: int, run_dir: Path, patience_s: float = PATIENCE_S) -> None:
    """flock, retried for `patience_s` while the holder named in `run_dir`'s lock file is gone:
    the processes of a job that was just killed (its loader workers, a torchrun) hold the
    descriptor until they are gone too, which takes a moment. A holder that still runs is not
    waited for: it will not end within the patience."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except OSError as err:
            if err.errno != errno.EWOULDBLOCK or time.monotonic() > deadline or holder_runs(run_dir):
                raise
            time.sleep(0.2)


def hold(run_dir: str | Path, stage: str) -> int | None:
    """Lock `run_dir` (made if missing) for this process and whatever it execs into; the
    descriptor, None where the file system has no locks (said on stderr). RunBusyError where
    another process holds it."""
    run_dir = Path(run_dir)
    path = run_dir / LOCK_NAME
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # opening changes nothing in it
    except OSError as err:
        raise output_error(path, err) from err
    try:
        _lock(fd, run_dir)
    except OSError as err:
        os.close(fd)
        if err.errno == errno.EWOULDBLOCK:
            raise RunBusyError(busy_message(run_dir)) from None
        if err.errno in NO_LOCKS:
            print(
                f"warning: {path}: cannot be locked ({os.strerror(err.errno)}); make sure no "
                "other process trains or evaluates this run meanwhile",
                file=sys.stderr,
            )
            return None
        raise
    os.ftruncate(fd, 0)
    os.write(
        fd,
        json.dumps(
            {
                "pid": os.getpid(),
                "start": process_start(os.getpid()),
                "host": socket.gethostname(),
                "doing": DOING.get(stage, stage),
            }
        ).encode()
        + b"\n",
    )
    os.set_inheritable(fd, True)  # held on by torchrun, python or srun after our exec
    return fd
