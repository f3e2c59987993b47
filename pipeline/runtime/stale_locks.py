"""A Snakemake killed with SIGKILL (an OOM kill, a lost login session, `kill -9`) leaves its
lock files in .snakemake/locks, and every later run refuses to start until `--unlock`.

So the workflow records, once Snakemake holds its locks (`onstart`), which lock files are its
own and which process holds them: host, pid, the process's start time and the boot. A later
run on the same host removes exactly those files, and only when that process is gone (not
merely its pid reused) and the files are the very ones it wrote (same inode and size). Any other
lock (a Snakemake still running, on this host or another) is left to Snakemake, which refuses
to start and says so.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from .files import write_json

OWNER = Path(".snakemake") / "frcnn-dp-bench.lock-owner.json"


def process_stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command's name: its state first (Z: a zombie),
    its start time at index 19 (field 22); None: no such process (or no /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()  # the name before ")" may hold spaces


def process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (None: no such process): with the
    pid, who it is (a pid alone may be reused)."""
    fields = process_stat(pid)
    return None if fields is None else fields[19]


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _identity(path: Path) -> list[int] | None:
    try:
        stat = path.stat()
    except OSError:
        return None
    return [stat.st_ino, stat.st_size]


def record_owner(lock_files, workdir: Path = Path(".")) -> None:
    """Called in `onstart`: these lock files are held by this Snakemake process."""
    pid = os.getpid()
    files = {str(f): _identity(Path(f)) for f in lock_files}
    write_json(
        workdir / OWNER,
        {"host": socket.gethostname(), "boot": _boot_id(), "pid": pid, "start": process_start(pid), "files": files},
    )


def release_stale(workdir: Path = Path(".")) -> str | None:
    """Remove the lock files of a recorded Snakemake that is gone; say what was done."""
    path = workdir / OWNER
    try:
        owner = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    alive = owner.get("boot") == _boot_id() and process_start(owner.get("pid", -1)) == owner.get("start")
    if owner.get("host") != socket.gethostname() or alive:
        return None  # another host's, or still running: Snakemake's own check decides
    removed = []
    for name, identity in owner.get("files", {}).items():
        lock = workdir / name
        if identity is not None and _identity(lock) == identity:
            lock.unlink()
            removed.append(name)
    path.unlink(missing_ok=True)
    if removed:
        return (
            f"Removed the locks of an earlier Snakemake (pid {owner['pid']}) that was killed "
            f"before it could: {', '.join(removed)}"
        )
    return None
