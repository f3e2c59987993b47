"""A result never lies about how it was made, with the real Snakemake on a copy of the
session's finished demo workflow (tests/workflow.py; its single w1 and ddp w2 runs, 2 epochs):

* a code change retrains every iteration (a finished run keeps no state to "resume");
* a comment-only change retrains to the same summary as a fresh run, timings aside;
* kill -9 anywhere (inside an epoch, one ddp worker, its torchrun, evaluation, the report),
  then the same command again: no process outlives the kill, no lock or half-written file
  blocks or survives, a training run resumes mid-epoch from its last checkpoint, and every
  score and summary.csv's AP columns equal the uninterrupted run's; a dead worker fails its
  job fast with a message naming it;
* with parallel.max_restarts, torchrun restarts a run whose worker died, to the same result;
* a deleted run directory is noticed: the next run trains, evaluates and reports it again.
"""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import time
from pathlib import Path

import pytest

from pipeline.detection.scoring import METRICS
from pipeline.runtime import files

from ..conftest import HANG_S, checkpoint_inside_an_epoch, signal_each, stopped_when, wait_for
from ..test_dead_worker import process_rank
from ..workflow import PAPER_JOB, SNAKEMAKE, copy_finished, edit_params, jobs, snakemake

pytestmark = pytest.mark.slow
DDP = "ddp-w2-b2-s0"
RUNS = ("single-w1-b4-s0", DDP)
TIMING_KEYS = {"train_seconds", "images_per_second", "sec_per_iter", "time_split",
               "communication_share", "provenance", "evaluation_seconds",
               "utilisation"}  # how many samples fit in the run's seconds
EVALUATION_TIMING = {"seconds", "train_seconds"}  # of each evaluation during training


@pytest.fixture(scope="module")
def workdir(finished_demo, tmp_path_factory) -> Path:
    """A copy of the session's finished demo (tests/workflow.py): Snakemake finds it done."""
    root = copy_finished(finished_demo.root, tmp_path_factory.mktemp("integrity"))
    assert jobs(snakemake(root)) == {}
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
    if "checkpoints" in kept:  # how many, and how often, are results; their seconds are not
        kept["checkpoints"] = {k: v for k, v in kept["checkpoints"].items() if k != "seconds"}
    if "evaluations" in kept:  # AP against seconds: the AP is the result, the seconds are not
        kept["evaluations"] = [{k: v for k, v in e.items() if k not in EVALUATION_TIMING}
                               for e in kept["evaluations"]]
    if "ranks" in kept:  # a process's peak memory is measured, as its seconds are; the state it
        # holds (parameters, gradients, optimizer) is a result
        kept["ranks"] = [{**r, "memory": {"state": r["memory"]["state"]}} if "memory" in r else r
                         for r in kept["ranks"]]
        # and its own split of the iteration's seconds is a timing
        kept["ranks"] = [{k: v for k, v in r.items() if k != "time_split"} for r in kept["ranks"]]
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
    for path in [workdir / "results" / "report" / "demo" / "report.html", workdir / "results" / "summary" / "demo.csv",
                 single / "train_summary.json", single / "model_final.pt", single / "metrics.json",
                 workdir / "data" / "synthetic", workdir / "data" / "synthetic" / "val2017"]:
        expected = (0o777 if path.is_dir() else 0o666) & ~mask
        assert stat.S_IMODE(path.stat().st_mode) == expected, (path, oct(path.stat().st_mode))


# ---- kill -9 anywhere --------------------------------------------------------------------

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


def workers(workdir: Path, module: str) -> dict[int, str]:
    return {pid: cmd for pid, cmd in job_processes(workdir).items()
            if f"-m {module} " in cmd and "pipeline.runtime.elastic" not in cmd}


def mid_epoch_checkpoint(workdir: Path, run: str) -> bool:
    """A checkpoint taken inside an epoch is on disk (checkpoint_every 4, 6 iterations an epoch)."""
    return checkpoint_inside_an_epoch(run_dir(workdir, run))


def unfinished_mid_epoch(workdir: Path, run: str) -> bool:
    """A mid-epoch checkpoint, and the run not finished (its summary not yet written)."""
    return mid_epoch_checkpoint(workdir, run) and not (run_dir(workdir, run) / "train_summary.json").exists()


def results(workdir: Path) -> dict:
    """What must not depend on a kill: every run's scores and summary.csv's AP columns."""
    scores = {run: {k: v for k, v in json.loads((run_dir(workdir, run) / "metrics.json").read_text()).items()
                    if k in METRICS}
              for run in RUNS}
    with open(workdir / "results" / "summary" / "demo.csv") as handle:
        rows = {row["run_id"]: {k: row[k] for k in ("AP", "AP50", "AP75")} for row in csv.DictReader(handle)}
    return {"metrics": scores, "summary.csv": rows}


def leftovers(workdir: Path) -> list[str]:
    """Half-written files (our temporaries) anywhere in the outputs."""
    return [str(p) for root in ("results", "data") for p in (workdir / root).rglob("*.tmp")]


def start(workdir: Path, target: str) -> subprocess.Popen:
    return subprocess.Popen(SNAKEMAKE + ["--cores", "2", "--forcerun", target], cwd=workdir,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # its own process group, as under a shell


# Where to kill: which forced target, what to wait for, what gets SIGKILL.
KILL_POINTS = {
    "single, inside an epoch": ("single-w1-b4-s0/train_summary.json", "mid-epoch checkpoint", "group"),
    "ddp, one worker": (f"{DDP}/train_summary.json", "mid-epoch checkpoint", "rank 1"),
    "ddp, its torchrun": (f"{DDP}/train_summary.json", "mid-epoch checkpoint", "torchrun"),
    "ddp, during evaluation": (f"{DDP}/metrics.json", "pipeline.detection.evaluate", "group"),
    "during the report": ("summary/demo.csv", "pipeline.report", "group"),
}


@pytest.fixture(scope="module")
def uninterrupted(workdir) -> dict:
    return results(workdir)


def kill(workdir: Path, point: str) -> float:
    """Start the point's forced target, wait for its moment, SIGKILL its victim; the seconds
    Snakemake took to stop after the kill."""
    target, wait, victim = KILL_POINTS[point]
    run = target.split("/")[0]
    snake = start(workdir, f"results/{target}" if run == "summary" else f"results/runs/demo/{target}")
    # The job held still (SIGSTOP, every process of it) at its moment, which is checked again
    # while it is held: the kill lands there, not after the stage or the run has ended.
    if wait == "mid-epoch checkpoint":
        _, held = stopped_when(snake.pid, lambda: unfinished_mid_epoch(workdir, run),
                               "a mid-epoch checkpoint of the unfinished run", timeout=HANG_S, process=snake)
    else:
        _, held = stopped_when(snake.pid, lambda: workers(workdir, wait), f"{wait} at work",
                               timeout=HANG_S, process=snake)
    try:
        if victim == "group":
            os.killpg(snake.pid, signal.SIGKILL)
        elif victim == "rank 1":
            os.kill(next(pid for pid in workers(workdir, "pipeline.training.train") if process_rank(pid) == 1),
                    signal.SIGKILL)
        else:
            os.kill(next(pid for pid, cmd in job_processes(workdir).items() if "-m pipeline.runtime.elastic" in cmd),
                    signal.SIGKILL)
    finally:
        signal_each(held, signal.SIGCONT)  # the others go on, to notice the death as they would
    killed = time.monotonic()
    snake.wait(timeout=HANG_S)  # a dead worker or torchrun: the job runs the attempt again; else Snakemake stops
    failed_after = time.monotonic() - killed
    # SIGKILLed processes leave at once, but a process torn down on a busy 2-core runner
    # (a gigabyte of a torch process's memory unmapped) can take seconds: a generous deadline,
    # and the survivors named where one outlives it.
    try:
        wait_for(lambda: not job_processes(workdir), "every process of the job to be gone", timeout=60)
    except AssertionError:
        raise AssertionError(f"{point}: processes outlived the kill by 60 s: {survivors(workdir)}") from None
    return failed_after


def survivors(workdir: Path) -> list[str]:
    """Each process still working in the test's directory: pid, state, parent and command."""
    found = []
    for pid, cmdline in job_processes(workdir).items():
        try:
            status = dict(line.split(":\t", 1) for line in
                          Path(f"/proc/{pid}/status").read_text().splitlines() if ":\t" in line)
        except OSError:
            status = {}
        found.append(f"{pid} [{status.get('State', '?')}, parent {status.get('PPid', '?')}] {cmdline[:200]}")
    return found


@pytest.mark.parametrize("point", KILL_POINTS)
def test_kill_9_anywhere_and_the_same_command_finishes_the_same_results(workdir, uninterrupted, point):
    target, wait, victim = KILL_POINTS[point]
    run = target.split("/")[0]
    failed_after = kill(workdir, point)
    # A dead worker or torchrun is a crash: the job runs the attempt again from the checkpoint
    # and finishes by itself (pipeline/runtime/attempts.py); a killed job (its whole group)
    # leaves the checkpoint for the rerun below
    retried = victim in ("rank 1", "torchrun")
    if wait == "mid-epoch checkpoint" and not retried:  # the kill landed inside the run (kill() held it there)
        assert (run_dir(workdir, run) / "state" / "checkpoint.pt").exists(), f"{point}: no checkpoint to resume"
    if retried:
        done = summary(workdir, run)
        assert done["status"] == "ok" and len(done["failed_attempts"]) == 1, done.get("failed_attempts")
        assert done["resumed_at_steps"] and done["resumed_at_steps"][0] > 0, f"{point}: not resumed"
    if victim == "rank 1":  # torchrun names the dead rank; the job ran the attempt again (attempts.py)
        kept = max((workdir / "logs" / "train" / "demo").glob(f"{DDP}.attempt*.log"), key=os.path.getmtime)
        log = kept.read_text()  # the failed attempt's log, kept beside the job's
        assert "error: rank 1 (pid" in log and "was killed by SIGKILL" in log, log[-2000:]
        assert train_log(workdir, DDP).startswith("attempt 1 a rank was killed or lost: rank 1 (pid ")
        assert summary(workdir, DDP)["failed_attempts"][0]["log"].endswith(kept.name)
        # How fast is measured, not asserted (no timing assertions): the log above shows
        # torchrun saw the death itself, rather than a collective timing out much later.
        print(f"{point}: Snakemake ended {failed_after:.1f} s after the worker's death, the retry included")

    rerun = snakemake(workdir)  # the README's command again: no --unlock, nothing forced
    assert not job_processes(workdir) and not leftovers(workdir), leftovers(workdir)
    assert results(workdir) == uninterrupted
    if "evaluation" not in point and "report" not in point:
        log = train_log(workdir, run)
        assert re.search(r"resuming \S+ at epoch \d, batch [1-9]\d* \(step \d+\)", log), log[-2000:]
        resumed = summary(workdir, run)
        assert resumed["resumed_at_steps"] and resumed["resumed_at_steps"][0] > 0
        assert [step for step, _ in losses(workdir, run)] == list(range(1, resumed["iterations"] + 1))
        for rank in resumed["ranks"]:  # every iteration's bytes, across the interruption
            for direction in ("sent", "received"):
                assert rank["bytes_per_iteration"][direction] == pytest.approx(
                    rank["theory_bytes_per_iteration"][direction], rel=1e-9), rank
    # a retried crash finished the whole workflow by itself; a killed job's rerun made the rest
    assert jobs(rerun) == {} if retried else jobs(rerun).get("report") == 1, jobs(rerun)


def test_a_dead_worker_is_restarted_by_torchrun_to_the_same_result(workdir, uninterrupted):
    """parallel.max_restarts: 1 (a knob: it retrains nothing). One worker is killed after a
    checkpoint; torchrun restarts the run, which resumes and finishes by itself."""
    edit_params(workdir, lambda raw: raw["defaults"]["parallel"].update(max_restarts=1))
    benchmark = workdir / "logs" / "benchmarks" / f"train_demo_{DDP}.tsv"
    uninterrupted_seconds = float(benchmark.read_text().splitlines()[1].split("\t")[0])
    snake = start(workdir, f"results/runs/demo/{DDP}/train_summary.json")
    _, held = stopped_when(snake.pid, lambda: unfinished_mid_epoch(workdir, DDP),
                           "a mid-epoch checkpoint of the unfinished run", timeout=HANG_S, process=snake)
    try:
        os.kill(next(pid for pid in workers(workdir, "pipeline.training.train") if process_rank(pid) == 1),
                signal.SIGKILL)
    finally:
        signal_each(held, signal.SIGCONT)
    assert snake.wait(timeout=HANG_S) == 0  # no rerun needed
    restarted = summary(workdir, DDP)
    assert restarted["restarts"] == 1 and restarted["resumed_at_steps"][0] > 0
    assert results(workdir) == uninterrupted
    seconds = float(benchmark.read_text().splitlines()[1].split("\t")[0])
    print(f"elastic restart: the training job took {seconds:.1f} s, uninterrupted "
          f"{uninterrupted_seconds:.1f} s (+{seconds - uninterrupted_seconds:.1f} s)")
    edit_params(workdir, lambda raw: raw["defaults"]["parallel"].update(max_restarts=0))
    assert jobs(snakemake(workdir)) == {}  # the knob changed back: still nothing to rerun


def test_a_deleted_run_is_trained_and_reported_again(workdir):
    shutil.rmtree(run_dir(workdir, "single-w1-b4-s0"))
    result = snakemake(workdir)
    assert jobs(result) == {"all": 1, "train": 1, "evaluate": 1, "report": 1, **PAPER_JOB}
    assert summary(workdir, "single-w1-b4-s0")["status"] == "ok"
    assert "single-w1-b4-s0" in (workdir / "results" / "summary" / "demo.csv").read_text()


# ---- code changes: last, as every other run of the shared workflow is out of date after them --

def trained(runs) -> list[str]:
    """The targets that retrain just `runs` (a code change puts every run out of date)."""
    return [f"results/runs/demo/{run}/train_summary.json" for run in runs]


def test_comment_only_edit_retrains_to_the_fresh_result(finished_demo, workdir):
    # The runs as first trained (here, the kills and restarts above have resumed them).
    fresh = {run: summary(finished_demo.root, run) for run in RUNS}
    # The loop every strategy runs: both runs retrain (an edit to ddp.py alone retrains ddp's).
    edit(workdir, "training/train.py", '"""The one training loop', '# an edit that changes nothing\n"""The one training loop')
    assert jobs(snakemake(workdir, *trained(RUNS)))["train"] == 2
    for run, before in fresh.items():
        assert "resuming" not in train_log(workdir, run)
        assert without_timings(summary(workdir, run)) == without_timings(before)


def test_code_change_retrains_every_iteration(workdir):
    before = losses(workdir, DDP)
    # A real change to the gradient sync: plain all-reduce becomes fp16-compressed.
    edit(workdir, "strategies/ddp.py", '"none": "allreduce_hook"', '"none": "fp16_compress_hook"')
    assert jobs(snakemake(workdir, *trained([DDP])))["train"] == 1
    after = losses(workdir, DDP)
    assert "resuming" not in train_log(workdir, DDP)
    assert [step for step, _ in after] == [step for step, _ in before] == list(range(1, len(before) + 1))
    assert [loss for _, loss in after] != [loss for _, loss in before]
    assert summary(workdir, DDP)["ranks"][0]["bytes_per_iteration"]["sent"] > 0
