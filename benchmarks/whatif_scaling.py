"""How the what-if command's time and memory grow with the cluster's size (issue 58: 1,000 nodes
x 8 GPUs must answer in 10 s and 500 MB, 100,000 GPUs must answer at all).

    .venv/bin/python benchmarks/whatif_scaling.py                      # 8 .. 100,000 GPUs
    .venv/bin/python benchmarks/whatif_scaling.py --nodes 1 8 100 --timeout 120

Each size is one `python -m pipeline.whatif` process, as a user runs it, on
examples/cluster-8x8.yaml with `--nodes` changed and the issue's compute (0.0141 s an image,
R50-FPN's 166,131,544 gradient bytes), so no results folder is needed. It prints, per GPU
count: the command's wall seconds, its peak resident memory (the child's own, from wait4), and
whether it answered; a size that runs past --timeout is stopped and reported as such, and every
larger size is then skipped (it would take longer still). The interpreter's start and imports
are included: they are what a user waits for too; the first row (8 GPUs) shows their share.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPUTE = ["--gpu-seconds-per-image", "0.0141", "--gradient-bytes", "166131544"]  # the R50-FPN


def whatif(nodes: int, timeout: float) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, outcome) of the what-if command on `nodes` nodes."""
    argv = [sys.executable, "-m", "pipeline.whatif", "--cluster", "examples/cluster-8x8.yaml", "--nodes", str(nodes)]
    start = time.perf_counter()
    child = subprocess.Popen(argv + COMPUTE, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    stopped = threading.Event()

    def stop() -> None:
        stopped.set()
        child.send_signal(signal.SIGKILL)

    timer = threading.Timer(timeout, stop)
    timer.start()
    _, status, usage = os.wait4(child.pid, 0)  # the child's own peak memory, not the largest so far
    wall = time.perf_counter() - start
    timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)
    error = child.stderr.read().decode(errors="replace").strip().splitlines() if child.stderr else []
    if stopped.is_set():
        outcome = f"stopped after {timeout:g} s"
    elif child.returncode != 0:
        outcome = f"failed (rc {child.returncode}): {error[-1] if error else 'no message'}"
    else:
        outcome = "answered"
    return wall, usage.ru_maxrss / 1024, outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--nodes", type=int, nargs="+", default=[1, 8, 32, 125, 250, 500, 1000, 2500, 12500], help="8-GPU nodes"
    )
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds before a size is stopped")
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.1f}")
    print(f"{'GPUs':>8} {'nodes':>6} {'seconds':>8} {'peak MB':>8}  outcome")
    for nodes in sorted(args.nodes):
        wall, peak, outcome = whatif(nodes, args.timeout)
        print(f"{nodes * 8:>8} {nodes:>6} {wall:>8.1f} {peak:>8.0f}  {outcome}", flush=True)
        if outcome != "answered":
            print(f"larger clusters skipped: {nodes * 8} GPUs did not answer")
            break


if __name__ == "__main__":
    main()
