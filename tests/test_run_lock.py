"""One process trains or evaluates a run at a time: a second one, started while the first holds
the run directory's lock, is refused with the first one's pid and changes nothing there; the
lock goes with the job (across its exec of torchrun or python), killed or not
(pipeline/runtime/run_lock.py)."""
from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline.config import schema, stages
from pipeline.config.params import canonical
from pipeline.runtime import run_lock
from pipeline.runtime.files import write_json
from pipeline.runtime.run import Run
from pipeline.runtime.stale_locks import process_stat
from pipeline.strategies.sweep import runs, unfinished_summary

from .conftest import HANG_S, REPO, process_tree, small_config, wait_for

# A job's launcher in miniature: take the lock, then sleep as itself or exec'd into `sleep`.
HOLD = """
import os, sys, time
from pipeline.runtime import run_lock
run_lock.hold(sys.argv[1], sys.argv[2])
if sys.argv[3] == "exec":
    os.execv(sys.argv[4], [sys.argv[4], "600"])
if sys.argv[3] == "child":  # a loader worker, say: it holds the descriptor until released
    import subprocess
    subprocess.Popen(["sh", "-c", 'while [ ! -e "$0" ]; do sleep 0.05; done', sys.argv[4]], close_fds=False)
time.sleep(600)
"""
TRY = """
import sys
from pipeline.runtime import run_lock
try:
    run_lock.hold(sys.argv[1], "train")
except run_lock.RunBusyError as err:
    sys.exit(str(err))
print("held")
"""
DOING = {"train": "training", "evaluate": "evaluating"}


def refusal(out: Path, pid: int, doing: str = "training") -> str:
    return (f"another process (pid {pid}) is {doing} this run ({out}): wait for it to end, or "
            f"stop it (kill {pid}), then rerun")


@pytest.fixture
def holder():
    """Start a process that holds a run's lock (exec'd into sleep with then="exec"); killed after."""
    started, releases = [], []

    def start(run_dir: Path, stage: str = "train", then: str = "sleep", release: Path | None = None) -> subprocess.Popen:
        arg = str(release) if then == "child" else shutil.which("sleep")
        releases.extend([release] if release else [])
        proc = subprocess.Popen([sys.executable, "-c", HOLD, str(run_dir), stage, then, arg], cwd=REPO)
        started.append(proc)
        wait_for(lambda: proc.poll() is not None or run_lock.holder(run_dir).get("pid") == proc.pid,
                 "the lock")
        assert proc.poll() is None, "the holder ended"
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()
    for release in releases:  # a holder's child ends too, whatever the test did (a failed one included)
        release.touch()


def try_hold(run_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", TRY, str(run_dir)], cwd=REPO,
                          capture_output=True, text=True, timeout=HANG_S)


def lock_holders(run_dir: Path, pids) -> list[int]:
    """Those of `pids` that have the run's lock file open (a descriptor in /proc/<pid>/fd)."""
    lock = str((run_dir / run_lock.LOCK_NAME).resolve())

    def has_open(pid: int) -> bool:
        try:
            return any(os.readlink(fd) == lock for fd in Path(f"/proc/{pid}/fd").iterdir())
        except OSError:  # gone meanwhile
            return False

    return [pid for pid in pids if has_open(pid)]


def snapshot(folder: Path) -> dict:
    """Every entry's content and identity, and the folder's own (a new file would change it)."""
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_ino)
            for p in folder.iterdir()} | {".": folder.stat().st_mtime_ns}


@pytest.mark.parametrize("then", ["sleep", pytest.param("exec", marks=pytest.mark.slow)])
def test_a_second_process_is_refused_until_the_first_is_killed(tmp_path, holder, then):
    out = tmp_path / "results" / "runs" / "demo" / "single-w1-b4-s0"  # made by the lock
    first = holder(out, then=then)
    if then == "exec":  # the descriptor survived the exec: the lock is sleep's now
        wait_for(lambda: Path(f"/proc/{first.pid}/comm").read_text().strip() == "sleep", "the exec")
    before = snapshot(out)
    refused = try_hold(out)
    assert refused.returncode == 1 and refused.stderr.strip() == refusal(out, first.pid)
    assert snapshot(out) == before  # not the lock file's content either
    first.send_signal(signal.SIGKILL)
    first.wait()
    taken = try_hold(out)  # the kernel released it: no stale lock
    assert taken.returncode == 0 and taken.stdout.strip() == "held", taken.stderr


def test_a_live_holder_is_refused_at_once_and_a_killed_jobs_children_are_waited_for(tmp_path, holder):
    """The lock's patience is for a job just killed whose children still hold the descriptor (the
    holder the file names is gone); a holder that runs is refused without it. Every step waits
    for the state it tests (the child started and holding the descriptor, the second process
    waiting on the lock), never for time: a busy machine starts processes late."""
    out, release = tmp_path / "run", tmp_path / "release-the-child"
    first = holder(out, then="child", release=release)
    wait_for(lambda: lock_holders(out, process_tree(first.pid)[1:]), "the holder's child to hold the lock's descriptor")
    child = process_tree(first.pid)[1]  # the shell (its `sleep`s, below it, hold it too)
    assert run_lock.holder_runs(out)  # refused at once: it will not end within the patience
    reused = tmp_path / "reused"  # a lock file naming its pid with another start: a reused pid
    reused.mkdir()
    named = run_lock.holder(out)
    (reused / run_lock.LOCK_NAME).write_text(json.dumps(dict(named, start="1")))
    assert named["start"] != "1" and not run_lock.holder_runs(reused)
    first.send_signal(signal.SIGKILL)
    wait_for(lambda: process_stat(first.pid)[0] == "Z", "the kill")
    assert not run_lock.holder_runs(out)  # a zombie holds no descriptor: its children may
    first.wait()
    assert not run_lock.holder_runs(out)
    with open(out / run_lock.LOCK_NAME) as lock:  # the child still holds it ...
        with pytest.raises(BlockingIOError):
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    second = subprocess.Popen([sys.executable, "-c", TRY, str(out)], cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:  # ... and is waited for: released only once the second process has opened the lock
        wait_for(lambda: second.poll() is not None or lock_holders(out, [second.pid]), "the second process to open the lock")
        assert second.poll() is None, second.communicate()
        release.touch()
        stdout, stderr = second.communicate(timeout=HANG_S)
    finally:
        release.touch()
        second.kill()
    assert second.returncode == 0 and stdout.strip() == "held", stderr
    wait_for(lambda: process_stat(child) is None or process_stat(child)[0] == "Z", "the child to end")


def launch(cfg: schema.Config, run: Run, out: Path, stage: str, *args: str) -> subprocess.Popen:
    """The workflow's job for `stage`, with the stage's view of `cfg`."""
    return subprocess.Popen([sys.executable, "-m", "pipeline.launch", "--stage", stage,
                             "--config", canonical(stages.view(cfg, stage).model_dump()), "--entry", canonical(run.to_json()), "--out", str(out),
                             *args],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def tiny_run(tmp_path: Path) -> tuple[schema.Config, Run]:
    cfg = small_config(tmp_path / "data")
    return cfg, next(iter(runs(cfg).values()))


@pytest.mark.parametrize("stage", ["train", pytest.param("evaluate", marks=pytest.mark.slow)])
def test_a_second_launch_is_refused_in_one_line_and_touches_nothing(tmp_path, holder, stage):
    cfg, run = tiny_run(tmp_path)
    out = tmp_path / "run"
    first = holder(out, stage)
    before = snapshot(out)
    # The running job's log (the rule's log: the launcher opens it only once it holds the run)
    log = tmp_path / "job.log"
    log.write_text("the running job's progress\n")
    second = launch(cfg, run, out, stage, "--log", str(log))
    _, stderr = second.communicate(timeout=HANG_S)
    assert second.returncode == 1
    assert stderr.strip().splitlines() == [f"error: {refusal(out, first.pid, DOING[stage])}"]
    assert snapshot(out) == before
    assert log.read_text() == "the running job's progress\n"


def test_a_launch_holds_the_lock_for_its_job_and_leaves_it_free(tmp_path):
    """A job that ends (here the evaluation of a skipped run, recorded without torch) frees the
    run; its lock file is no output, and names the job that held it last."""
    cfg, run = tiny_run(tmp_path)
    out = tmp_path / "run"
    write_json(out / "train_summary.json", unfinished_summary(stages.view(cfg, "train"), run, "skipped", "no GPU here"))
    job = launch(cfg, run, out, "evaluate")
    _, stderr = job.communicate(timeout=HANG_S)
    assert job.returncode == 0, stderr
    assert sorted(p.name for p in out.iterdir()) == [
        run_lock.LOCK_NAME, "metrics.json", "predictions.json", "train_summary.json"]
    found = run_lock.holder(out)
    assert (found["pid"], found["doing"]) == (job.pid, "evaluating")
    assert try_hold(out).stdout.strip() == "held"
