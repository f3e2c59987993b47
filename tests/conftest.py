"""Shared fixtures: a small synthetic dataset and a fast demo configuration built from the
real params.yaml, so the tests exercise the same settings users run."""
from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

# Before torch loads OpenMP, here and in every process a test starts (they inherit it): two
# test workers share 2 cores, each running 2-thread training and evaluation processes. OpenMP
# threads that spin while they wait then burn the slices their partners need: two concurrent
# 2-thread ResNet-50 steps took 1.3-1.8 s each spinning, 0.59 s waiting passively (alone:
# 0.73 s). It changes how threads wait, not what they compute.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

from pipeline.config import params, schema  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.runtime.stale_locks import process_stat  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SMALL_DATA = {"seed": 7, "image_size": 96, "train_images": 24, "val_images": 8,
              "max_objects": 3, "clutter": 3}  # as params.yaml writes data.synthetic
SMALL_SYNTHETIC = schema.Synthetic.model_validate(SMALL_DATA)


def small_config(root: Path, **train_overrides) -> schema.Config:
    """The demo preset, shrunk to seconds: small images, few iterations."""
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    return schema.replaced(
        cfg, data={"root": str(root), "synthetic": dict(SMALL_DATA)},
        model={"min_size": 96, "max_size": 96, "channels": 32, "representation_size": 128},
        train={"epochs": 2, "images_per_worker": 4, "base_batch": 4, "warmup_iters": 4,
               "lr_steps": [], "print_every": 5, **train_overrides},
        eval={"batch_size": 4})


def user_data(root: Path, **changes) -> schema.Data:
    """The data section of a COCO-layout tree of the user's at `root` (no generator, no fetch),
    refusing what the defaults refuse; `changes` (exif_orientation=..., ...) over it."""
    demo = params.load_resolved(REPO / "params.yaml", preset="demo").data
    return schema.replaced(demo, **{"name": "mine", "root": str(root), "synthetic": None, "fetch": None,
                                    "exif_orientation": "refuse", "category_mismatch": "refuse", **changes})


@pytest.fixture(scope="session")
def small_dataset(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data") / "synthetic"
    synthetic.generate(root, SMALL_SYNTHETIC)
    return root


def write_coco(root: Path, split: str, images: list[dict], annotations: list[dict],
               categories=({"id": 1, "name": "thing"},)) -> Path:
    """A hand-built COCO annotation file, for the bad-input and evaluation tests."""
    path = root / "annotations" / f"instances_{split}2017.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"images": images, "annotations": annotations,
                                "categories": list(categories)}))
    (root / f"{split}2017").mkdir(parents=True, exist_ok=True)
    return path


# ---- waiting for a state, not for a while ------------------------------------------------------
# A test that starts processes waits for the state it then relies on (a file, a /proc entry, a
# log line), with a deadline generous for a busy 2-core machine, and fails naming what it waited
# for; never a fixed sleep, and never "this took less than N seconds".

# A started command's deadline, which only a hang should reach. Quiet, the slowest command a
# test starts (the shrunk demo workflow of tests/finished_demo) takes about 5 minutes on 2
# cores; beside a full workflow run it went past 10 (a fresh clone's suite of 200e070,
# 2026-12-07, stopped it at the 600 s it then had, in its report job). 30 minutes, with
# pyproject's per-test timeout above it and both inside CI's 90.
HANG_S = 1800


def wait_for(condition, what: str, timeout: float = 180, process: subprocess.Popen | None = None):
    """condition()'s first true value, polled until `timeout` seconds have passed (an
    AssertionError naming `what`); `process` ending first fails at once, with its exit status."""
    deadline = time.monotonic() + timeout
    while True:
        found = condition()
        if found:
            return found
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what}: never came; the process ended first (exit status {process.returncode})")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.02)


def free_ports(count: int) -> list[int]:
    """`count` distinct ports free on 127.0.0.1 now (each socket held until all are chosen, so
    the kernel cannot hand out one twice); bind them soon: another process may take one later."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]


def free_port() -> int:
    return free_ports(1)[0]


def process_state(pid: int) -> str | None:
    """The state letter /proc gives `pid` (R, S, D, T stopped, Z zombie, ...); None when gone."""
    fields = process_stat(pid)
    return fields[0] if fields else None


def process_tree(pid: int) -> list[int]:
    """`pid` and every process descended from it (torchrun's workers, in sessions of their own,
    included), parents before their children."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := process_stat(int(entry.name))):
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    tree, i = [pid], 0
    while i < len(tree):
        tree.extend(parents.get(tree[i], []))
        i += 1
    return tree


def stop_tree(pid: int, timeout: float = 120) -> list[int]:
    """SIGSTOP `pid` and its descendants and wait until each is stopped (state T in /proc) or gone;
    the pids stopped. Children started meanwhile are stopped too (the tree is read again until it
    holds no running process)."""
    stopped: list[int] = []

    def settled() -> bool:
        running = [p for p in process_tree(pid) if process_state(p) not in ("T", "t", "Z", "X", None)]
        for p in running:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGSTOP)
            if p not in stopped:
                stopped.append(p)
        return not running
    wait_for(settled, f"process {pid} and its children to stop (SIGSTOP)", timeout)
    return stopped


def signal_each(pids: list[int], sig: int) -> None:
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, sig)


def stopped_when(pid: int, condition, what: str, timeout: float = 300,
                 process: subprocess.Popen | None = None):
    """Wait until condition() holds while `pid`'s process tree is stopped; return (its value, the
    stopped pids), the tree left stopped. What the condition saw is then what the processes are
    doing when the caller's kill lands, not a state they may have left meanwhile (a checkpoint
    replaced by the next, a stage that ended). The caller SIGKILLs or SIGCONTs the pids."""
    def frozen():
        if not condition():
            return None
        pids = stop_tree(pid)
        found = condition()
        if not found:
            signal_each(pids, signal.SIGCONT)
            return None
        return found, pids
    return wait_for(frozen, what, timeout, process)


def checkpoint_inside_an_epoch(out: Path) -> bool:
    """A checkpoint taken inside an epoch is in run directory `out`."""
    import torch

    try:
        return torch.load(out / "state" / "checkpoint.pt", weights_only=True)["train_state"]["batch"] > 0
    except Exception:  # not there yet, or being renamed into place
        return False


def gone(pids: list[int]) -> bool:
    """Whether each of `pids` has exited (a zombie, not yet reaped, counts as exited)."""
    return all(process_state(p) in ("Z", "X", None) for p in pids)


# ---- two test processes (pytest-xdist: `-n 2` in pyproject.toml) ----------------------------
# One process alone leaves about a third of 2 cores idle (process start-up, SLURM's status
# polls, waits for a checkpoint to kill), so two workers share the machine. A fixture is built
# once per worker that asks for it, so each worker runs whole units:

def unit(nodeid: str) -> str:
    """The tests one worker runs together: a folder under tests/ whole (its tests share a
    session fixture its conftest.py builds: tests/finished_demo/), else one file (its module
    fixtures: a trained run, a SLURM cluster, an HTTP server)."""
    return "/".join(nodeid.split("::", 1)[0].split("/")[:2])


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling by `unit` (its `--dist loadgroup` marks do not reach the test
    ids under pytest 9), taking the units in the workers' order (below)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(nodeid)

    config.option.loadscopereorder = False
    return ByUnit(config, log)


def pytest_collection_modifyitems(config, items):
    """In an xdist worker, the units that hold a slow test first (a worker that starts the
    finished workflow last ends last); a stable sort keeps each unit's own order."""
    if not hasattr(config, "workerinput"):
        return
    slow = {unit(item.nodeid) for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: unit(item.nodeid) not in slow)
