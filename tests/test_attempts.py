"""A training job's attempts (pipeline/runtime/attempts.py): a rank made to abort (the test-only
switch BENCH_TEST_ABORT) is retried once from the checkpoint, its log kept beside the new one,
and the run says so; one that aborts every time is recorded as failed with the abort's own line
as its reason, and the job ends well for the workflow to go on. Through the real launcher,
torchrun and gloo. The workflow's side (keep going, the last lines, the exit status):
tests/finished_demo/test_workflow.py."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import schema, stages
from pipeline.config.params import canonical
from pipeline.runtime import attempts, elastic
from pipeline.runtime.records.training import RunSummary
from pipeline.strategies.sweep import runs

from .conftest import HANG_S, REPO, small_config

REPORT = """\
2026-12-07 03:42:33,001 [rank 1] INFO step 2/12 epoch 0 loss 1.9
malloc(): unaligned fastbin chunk detected
2026-12-07 03:42:33,002 [rank 0] INFO rank 0 (worker): 23 images, 2 per process x 2 shards, 1 threads, cpu, gloo
error: rank 0 lost the other processes of its run (Connection reset by peer; gloo); every rank is still alive
============================================================
pipeline.training.train FAILED
------------------------------------------------------------
  traceback : rank 0 lost the other processes of its run (gloo Connection reset by peer)
============================================================
"""


def test_the_reason_is_the_last_line_that_says_why_a_process_died():
    """glibc's abort message, not torchrun's report nor a peer that only lost the aborted rank;
    elastic.py's line, where there is one, names the rank and already carries it."""
    assert attempts.fatal_line(REPORT) == "malloc(): unaligned fastbin chunk detected"
    named = (REPORT + "error: rank 1 (pid 7 on vm) was killed by SIGABRT first: malloc(): unaligned fastbin "
             f"chunk detected. {elastic.REMEDY}.\n")
    assert attempts.last_fatal_line(named) == ("rank 1 (pid 7 on vm) was killed by SIGABRT first: malloc(): "
                                               "unaligned fastbin chunk detected")
    assert elastic.REMEDY.startswith(attempts.RERUN_REMEDY_START)
    traceback = "Traceback (most recent call last):\n  File \"x.py\", line 1\nValueError: bad box\n"
    assert attempts.last_fatal_line(traceback) == "ValueError: bad box"
    assert attempts.last_fatal_line("nothing said\n") == "nothing said"


def test_a_failed_attempts_log_is_kept_beside_the_new_one(tmp_path):
    log = tmp_path / "run.log"
    assert attempts.kept_log(log, 1) == tmp_path / "run.attempt1.log"
    (tmp_path / "run.attempt1.log").write_text("kept")
    assert attempts.kept_log(log, 1) == tmp_path / "run.attempt2.log"  # never over another's


def train(tmp_path: Path, small_dataset: Path, strategy: str, abort: str) -> tuple[subprocess.CompletedProcess, Path]:
    """The workflow's train job (pipeline.launch, its log in job.log) of one run of `strategy`
    on 2 workers (single: 1), checkpointing every 2 iterations, with BENCH_TEST_ABORT=`abort`."""
    cfg = small_config(small_dataset)
    cfg = schema.replaced(cfg, sweep=[{"strategy": strategy, "workers": 1 if strategy == "single" else 2,
                                       "images_per_worker": 2}])
    cfg = schema.replaced(cfg, train=cfg.train.model_copy(update={"checkpoint_every": 2}))
    run = next(iter(runs(cfg).values()))
    out = tmp_path / "run"
    job = subprocess.run([sys.executable, "-m", "pipeline.launch", "--config", canonical(stages.view(cfg, "train").model_dump()),
                          "--entry", canonical(run.to_json()), "--out", str(out), "--log", str(tmp_path / "job.log")],
                         cwd=REPO, env=dict(os.environ, **{attempts.TEST_ABORT_ENV: abort}), capture_output=True,
                         text=True, timeout=HANG_S)
    return job, out


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("single", marks=pytest.mark.slow)])
def test_a_rank_that_aborts_once_is_retried_from_its_checkpoint(tmp_path, small_dataset, strategy):
    rank = 0 if strategy == "single" else 1
    job, out = train(tmp_path, small_dataset, strategy, f"{rank}:3:once")
    assert job.returncode == 0, job.stderr[-3000:]
    summary = RunSummary.read(out / "train_summary.json")
    assert summary.status == "ok" and len(summary.failed_attempts) == 1, summary.failed_attempts
    [failed] = summary.failed_attempts
    assert failed.ended == ("killed by SIGABRT" if strategy == "single" else "a rank was killed or lost")
    assert f"malloc(): test abort ({attempts.TEST_ABORT_ENV}={rank}:3:once) at step 3" in failed.reason
    if strategy != "single":
        assert failed.reason.startswith("rank 1 (pid ") and "killed by SIGABRT first" in failed.reason
    # the failed attempt's log kept beside the job's, the new attempt's in the job's own
    kept = tmp_path / "job.attempt1.log"
    assert failed.log == str(kept) and "malloc(): test abort" in kept.read_text()
    new = (tmp_path / "job.log").read_text()  # opens with why it retries, then the new attempt's lines
    assert new.startswith(f"attempt 1 {failed.said()} (its log: {kept}); retrying (1 of 1)") and new.count("malloc()") == 1
    # resumed from the checkpoint at step 2, and timed from there (its own warm-up excluded)
    assert summary.resumed_at_steps == [2] and summary.timed_from_step == 2
    assert summary.iterations == len((out / "iterations.jsonl").read_text().splitlines())


@pytest.mark.slow
def test_a_rank_that_aborts_every_time_is_recorded_as_failed(tmp_path, small_dataset):
    job, out = train(tmp_path, small_dataset, "ddp", "1:3:always")
    assert job.returncode == 0, job.stderr[-3000:]  # the workflow goes on: the failure is recorded
    summary = RunSummary.read(out / "train_summary.json")
    assert summary.status == "failed" and len(summary.failed_attempts) == 2
    assert summary.reason == summary.failed_attempts[-1].said()
    assert "was killed by SIGABRT first: malloc(): test abort" in summary.reason
    # each attempt's log kept beside the job's (Snakemake deletes a job's own log before a rerun)
    kept = [tmp_path / "job.attempt1.log", tmp_path / "job.attempt2.log"]
    assert [a.log for a in summary.failed_attempts] == [str(path) for path in kept]
    assert all("malloc(): test abort" in path.read_text() for path in kept)
    assert (out / "iterations.jsonl").exists()
    last = (tmp_path / "job.log").read_text().strip().splitlines()[-1]
    assert last.startswith("error: ddp-w2-b2-s0 failed after 2 attempt(s): a rank was killed or lost: rank 1")
