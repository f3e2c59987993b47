"""A real SLURM cluster on this one host, for tests: munged, slurmctld and two slurmd nodes
(n1, n2: both this machine, reached at 127.0.0.1 on their own ports).

    with SlurmCluster() as cluster:   # raises Unavailable (the test skips) if it cannot start
        subprocess.run(["srun", "-N2", "hostname"])

Nothing is left behind: every daemon started here is stopped by its PID, its configuration,
state and logs live in a temporary directory, and /etc/slurm/slurm.conf (which Slurm's client
commands read, and which the Snakemake executor plugin needs: its job step drops SLURM_CONF) is
written only where there is none and removed only if this module wrote it.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from .conftest import free_ports

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]  # Debian; also in apt/tests.txt
COMMANDS = ["munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "sinfo"]
SLURM_CONF = Path("/etc/slurm/slurm.conf")
MARK = "# written by tests/slurm_cluster.py; removed when its cluster stops"
NODES = ("n1", "n2")
CPUS = 2            # per node (both nodes are this host)
MEMORY_MB = 20000   # per node, what jobs may ask for


class Unavailable(Exception):
    """The daemons cannot run here (the reason says why); the SLURM tests skip with it."""


def install() -> None:
    """Debian's packages, where a command is missing (as .ci/run does from apt/tests.txt)."""
    if all(shutil.which(c) for c in COMMANDS):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise Unavailable(f"SLURM is not installed and cannot be installed here (needs root and "
                          f"apt-get): apt-get install {' '.join(PACKAGES)}")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    result = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *PACKAGES],
                            capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise Unavailable(f"apt-get install {' '.join(PACKAGES)} failed: {result.stderr[-500:]}")


class SlurmCluster:
    def __init__(self):
        self.dir: Path | None = None
        self.processes: list[subprocess.Popen] = []
        self.wrote_conf = False

    # ---- start ------------------------------------------------------------------------
    def __enter__(self) -> "SlurmCluster":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        if os.geteuid() != 0:
            raise Unavailable("slurmd must run as root to start jobs (run the tests as root)")
        install()
        if SLURM_CONF.exists() and MARK not in SLURM_CONF.read_text():
            raise Unavailable(f"{SLURM_CONF} exists and belongs to another cluster; not touching it")
        # Readable by the munge user (munged runs as it); pytest's tmp_path is root-only.
        self.dir = Path(tempfile.mkdtemp(prefix="slurm-test-"))
        self.dir.chmod(0o755)
        self._start_munge()
        SLURM_CONF.parent.mkdir(parents=True, exist_ok=True)
        SLURM_CONF.write_text(self._config())
        self.wrote_conf = True
        self._spawn("slurmctld", ["slurmctld", "-D", "-i"])
        self._wait(["scontrol", "ping"], lambda out: "UP" in out, "slurmctld to answer")
        for node in NODES:
            self._spawn(f"slurmd.{node}", ["slurmd", "-D", "-N", node])
        self._wait(["sinfo", "-h", "-N", "-o", "%N %t"],
                   lambda out: sorted(l.split()[0] for l in out.splitlines()
                                      if l.split()[1] in ("idle", "mix", "alloc")) == list(NODES),
                   "both nodes to be idle")

    def _start_munge(self) -> None:
        """munged as the munge user on a socket of its own (a host's munged, if any, is left
        alone); slurm.conf's AuthInfo points Slurm at it."""
        munge = self.dir / "munge"
        munge.mkdir()
        shutil.chown(munge, "munge", "munge")
        self.munge_socket = munge / "munge.socket"
        key = Path("/etc/munge/munge.key")
        if not key.exists():
            raise Unavailable(f"{key} is missing (the munge package creates it)")
        self._spawn("munged", ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups",
                               "munged", "-F", f"--socket={self.munge_socket}",
                               f"--pid-file={munge / 'munged.pid'}", f"--seed-file={munge / 'seed'}",
                               f"--log-file={munge / 'munged.log'}"])
        deadline = time.monotonic() + 120  # a busy machine starts daemons slowly
        while not self.munge_socket.exists():
            if time.monotonic() > deadline or self.processes[-1].poll() is not None:
                raise Unavailable(f"munged did not start: {self._log('munged')}")
            time.sleep(0.1)

    def _config(self) -> str:
        d, host = self.dir, socket.gethostname()
        (d / "state").mkdir()
        ctld_port, *node_ports = free_ports(1 + len(NODES))  # distinct: chosen together
        nodes = "\n".join(f"NodeName={n} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
                          f"CPUs={CPUS} RealMemory={MEMORY_MB} State=UNKNOWN" for n, port in zip(NODES, node_ports, strict=True))
        return f"""{MARK}
ClusterName=testcluster
SlurmctldHost={host}
SlurmctldPort={ctld_port}
SlurmUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/slurmd.%n
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.%n.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerParameters=sched_interval=1
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / f"{name}.out", "w")
        self.processes.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL))
        log.close()

    def _log(self, name: str) -> str:
        texts = [p.read_text(errors="replace")[-1500:] for p in sorted(self.dir.glob(f"{name}*"))
                 if p.is_file()]
        return "\n".join(texts)

    def _wait(self, argv: list[str], ready, what: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [p.args for p in self.processes if p.poll() is not None]
            if dead:
                raise Unavailable(f"{dead[0][0]} exited while waiting for {what}:\n"
                                  f"{self._log('slurm')}")
            result = subprocess.run(argv, capture_output=True, text=True)
            if result.returncode == 0 and ready(result.stdout):
                return
            time.sleep(0.3)
        raise Unavailable(f"timed out waiting for {what}:\n{self._log('slurm')}")

    # ---- use ----------------------------------------------------------------------------
    def log(self) -> str:
        """The daemons' logs (for a failing test's message)."""
        return self._log("slurm") if self.dir else ""

    # ---- stop -----------------------------------------------------------------------------
    def stop(self) -> None:
        """Cancel what is still queued, stop our daemons (slurmd first) by PID, remove our files."""
        if self.processes and shutil.which("scancel"):
            subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True, timeout=30)
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()
        if self.wrote_conf and SLURM_CONF.exists() and MARK in SLURM_CONF.read_text():
            SLURM_CONF.unlink()
        self.wrote_conf = False
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
