"""A result never lies about how it was made, with the real Snakemake on a tiny workflow
(single w1 and ddp w2, 2 epochs):

* a code change retrains every iteration (a finished run keeps no state to "resume");
* a comment-only change retrains to the same summary as a fresh run, timings aside;
* a ddp run killed in its second epoch resumes, and its bytes per iteration equal theory;
* however the job is killed, no training or evaluation process outlives it;
* a deleted run directory is noticed: the next run trains, evaluates and reports it again.
"""
from __future__ import annotations

import json
import os
import signal
import stat
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from pipeline import files

from .test_workflow import (PAPER_JOB, SNAKEMAKE, copy_workflow, edit_params, jobs, snakemake,
                            tiny_params)

pytestmark = pytest.mark.slow
DDP = "ddp-w2-b2-s0"
TIMING_KEYS = {"train_seconds", "images_per_second", "sec_per_iter", "time_split",
               "communication_share", "provenance", "evaluation_seconds",
               "utilisation"}  # how many samples fit in the run's seconds
EVALUATION_TIMING = {"seconds", "train_seconds"}  # of each evaluation during training


def two_runs(raw: dict) -> None:
    tiny_params(raw)
    raw["presets"]["demo"]["sweep"] = [{"strategy": "single", "workers": 1},
                                       {"strategy": "ddp", "workers": 2, "images_per_worker": 2}]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("integrity"))
    edit_params(root, two_runs)
    snakemake(root)
    return root


def run_dir(workdir: Path, run: str) -> Path:
    return workdir / "results" / "runs" / "demo" / run


def summary(workdir: Path, run: str) -> dict:
    return json.loads((run_dir(workdir, run) / "train_summary.json").read_text())


def losses(workdir: Path, run: str) -> list[tuple[int, float]]:
    lines = (run_dir(workdir, run) / "iterations.jsonl").read_text().splitlines()
    return [(r["step"], r["loss"]) for r in map(json.loads, lines)]


def train_log(workdir: Path, run: str) -> str:
    return (workdir / "logs" / "train" / "demo" / f"{run}.log").read_text()


def without_timings(record: dict) -> dict:
    kept = {k: v for k, v in record.items() if k not in TIMING_KEYS}
    if "evaluations" in kept:  # AP against seconds: the AP is the result, the seconds are not
        kept["evaluations"] = [{k: v for k, v in e.items() if k not in EVALUATION_TIMING}
                               for e in kept["evaluations"]]
    return kept


def edit(workdir: Path, module: str, old: str, new: str) -> None:
    path = workdir / "pipeline" / module
    text = path.read_text()
    assert old in text, (module, old)
    path.write_text(text.replace(old, new, 1))


def test_finished_runs_keep_no_state(workdir):
    for run in ("single-w1-b4-s0", DDP):
        assert not (run_dir(workdir, run) / "state").exists()


def test_outputs_follow_the_umask(workdir):
    """Files 0666 & ~umask, directories 0777 & ~umask, as open() and mkdir() make them."""
    mask = files.umask()
    single = run_dir(workdir, "single-w1-b4-s0")
    for path in [workdir / "results" / "report" / "report.html", workdir / "results" / "summary.csv",
                 single / "train_summary.json", single / "model_final.pt", single / "metrics.json",
                 workdir / "data" / "synthetic", workdir / "data" / "synthetic" / "val2017"]:
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == expected, (path, oct(path.stat().st_mode))


def test_comment_only_edit_retrains_to_the_fresh_result(workdir):
    fresh = {run: summary(workdir, run) for run in ("single-w1-b4-s0", DDP)}
    edit(workdir, "strategies/ddp.py", '"""`ddp`:', '# an edit that changes nothing\n"""`ddp`:')
    assert jobs(snakemake(workdir))["train"] == 2
    for run, before in fresh.items():
        assert "resuming" not in train_log(workdir, run)
        assert without_timings(summary(workdir, run)) == without_timings(before)


def test_code_change_retrains_every_iteration(workdir):
    before = losses(workdir, DDP)
    # A real change to the gradient sync: plain all-reduce becomes fp16-compressed.
    edit(workdir, "strategies/ddp.py", '"none": default_hooks.allreduce_hook',
         '"none": default_hooks.fp16_compress_hook')
    assert jobs(snakemake(workdir))["train"] == 2
    after = losses(workdir, DDP)
    assert "resuming" not in train_log(workdir, DDP)
    assert [step for step, _ in after] == [step for step, _ in before] == list(range(1, len(before) + 1))
    assert [loss for _, loss in after] != [loss for _, loss in before]
    assert summary(workdir, DDP)["ranks"][0]["bytes_per_iteration"]["sent"] > 0


# ---- killing a job ----------------------------------------------------------------------

def job_processes(workdir: Path) -> dict[int, str]:
    """pid -> command line of every process working in, or naming, the test's directory."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            cwd = os.readlink(entry / "cwd")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if str(workdir) in cmdline or cwd.startswith(str(workdir)):
            found[int(entry.name)] = cmdline
    return found


def wait_for(condition, what: str, timeout: float = 180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def start_forced(workdir: Path, target: str) -> subprocess.Popen:
    return subprocess.Popen(SNAKEMAKE + ["--cores", "2", "--forcerun", target], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group, as under a shell


def kill_and_count_survivors(workdir: Path, snake: subprocess.Popen, victim: str) -> float:
    """SIGKILL the victim; return the seconds until no process of the job is left (<= 10)."""
    processes = job_processes(workdir)
    launcher = [pid for pid, cmd in processes.items() if "torch.distributed.run" in cmd]
    if victim == "group":
        os.killpg(snake.pid, signal.SIGKILL)
    elif victim == "snakemake":
        os.kill(snake.pid, signal.SIGKILL)
    else:
        os.kill(launcher[0], signal.SIGKILL)
    killed = time.monotonic()
    snake.wait(timeout=30) if victim != "launcher" else None
    while job_processes(workdir) and time.monotonic() - killed < 10:
        time.sleep(0.05)
    left = job_processes(workdir)
    assert not left, f"alive 10 s after killing the {victim}: {left}"
    snake.wait(timeout=30)
    unlocked = subprocess.run(SNAKEMAKE + ["--cores", "2", "--unlock"], cwd=workdir,
                              capture_output=True, text=True, timeout=120)
    assert unlocked.returncode == 0, unlocked.stderr  # a SIGKILLed Snakemake leaves its lock
    return time.monotonic() - killed


@pytest.mark.parametrize("phase, victim", [("train", "snakemake"), ("evaluate", "group"),
                                           ("evaluate", "launcher")])
def test_no_process_outlives_its_killed_job(workdir, phase, victim):
    module = {"train": "pipeline.train", "evaluate": "pipeline.evaluate"}[phase]
    output = {"train": "train_summary.json", "evaluate": "metrics.json"}[phase]
    snake = start_forced(workdir, str(Path("results/runs/demo") / DDP / output))
    # Both ranks of the ddp run are at work (evaluation: each predicts its share).
    wait_for(lambda: sum(module in cmd and "torch.distributed.run" not in cmd
                         for cmd in job_processes(workdir).values()) >= 2,
             f"two {module} workers")
    time.sleep(1.0)
    seconds = kill_and_count_survivors(workdir, snake, victim)
    print(f"{phase}, SIGKILL to the {victim}: last process gone after {seconds:.2f} s")
    snakemake(workdir)  # and the workflow completes again afterwards


def test_ddp_killed_in_its_second_epoch_resumes_with_its_bytes(workdir):
    snake = start_forced(workdir, str(Path("results/runs/demo") / DDP / "train_summary.json"))
    checkpoint = run_dir(workdir, DDP) / "state" / "checkpoint.pt"
    wait_for(checkpoint.exists, "the first epoch's checkpoint")
    kill_and_count_survivors(workdir, snake, "group")
    assert not (run_dir(workdir, DDP) / "train_summary.json").exists()
    result = snakemake(workdir)  # the same command as before the kill: nothing forced
    assert jobs(result) == {"all": 1, "train": 1, "evaluate": 1, "report": 1, **PAPER_JOB}
    assert "resuming" in train_log(workdir, DDP)
    resumed = summary(workdir, DDP)
    assert [step for step, _ in losses(workdir, DDP)] == list(range(1, resumed["iterations"] + 1))
    for rank in resumed["ranks"]:
        for direction in ("sent", "received"):
            assert rank["bytes_per_iteration"][direction] == pytest.approx(
                rank["theory_bytes_per_iteration"][direction], rel=1e-9), rank


def test_a_deleted_run_is_trained_and_reported_again(workdir):
    shutil.rmtree(run_dir(workdir, "single-w1-b4-s0"))
    result = snakemake(workdir)
    assert jobs(result) == {"all": 1, "train": 1, "evaluate": 1, "report": 1, **PAPER_JOB}
    assert summary(workdir, "single-w1-b4-s0")["status"] == "ok"
    assert "single-w1-b4-s0" in (workdir / "results" / "summary.csv").read_text()
