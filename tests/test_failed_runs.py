"""A failed run says why in one line, wherever it is read: the failing rank's own error, not
torchrun's summary, at the end of the job's log (the launcher's stderr, as the workflow's train
rule writes it), and, for a run that diverged, in its train_summary.json and summary.csv."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

from pipeline.config import schema, stages
from pipeline.config.params import canonical
from pipeline.data.dataset import CocoDetection
from pipeline.data.sampler import ShardedBatchSampler, aspect_ratio_groups
from pipeline.report.load import load_run, summary_frame
from pipeline.runtime import failure
from pipeline.runtime.files import MARKER
from pipeline.runtime.records.training import RunSummary
from pipeline.runtime.run import Run
from pipeline.strategies.sweep import run_id, runs

from .conftest import HANG_S, REPO, small_config
from .test_data_changes import RUN, TARGET, users_tree
from .workflow import copy_workflow, edit_params, snakemake


def launch(cfg: schema.Config, run: Run, out: Path, stage: str = "train") -> tuple[int, list[str]]:
    """The workflow's job: `pipeline.launch` with the stage's view of `cfg`, its output into a
    log; (status, the log's lines)."""
    log = out.parent / f"{out.name}-{stage}.log"
    stage_cfg = stages.view(cfg, stage).model_dump()
    with open(log, "w") as handle:
        status = subprocess.run([sys.executable, "-m", "pipeline.launch", "--stage", stage,
                                 "--config", canonical(stage_cfg), "--entry", canonical(run.to_json()), "--out", str(out)],
                                cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, timeout=HANG_S).returncode
    return status, [line for line in log.read_text().splitlines() if line.strip()]


def ddp_run(cfg: schema.Config) -> tuple[schema.Config, Run]:
    """`cfg` with one ddp run of 2 workers as its sweep, and that run."""
    cfg = schema.replaced(cfg, sweep=[{"strategy": "ddp", "workers": 2, "images_per_worker": 2}])
    return cfg, next(iter(runs(cfg).values()))


def failed_process(tmp_path: Path, rank: int, message: str | None, **kind) -> ProcessFailure:
    """torchrun's record of a failed worker, with the error file `failure.record` wrote in it
    (none for a worker killed without a word)."""
    error_file = tmp_path / f"error-{rank}.json"
    if message is not None:
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv(failure.ERROR_FILE, str(error_file))
            failure.record(failure.Consequence(message) if kind.get("consequence") else message)
    return ProcessFailure(local_rank=rank, pid=1000 + rank, exitcode=kind.get("exitcode", 1),
                          error_file=str(error_file))


def test_the_first_cause_is_a_ranks_own_error_then_a_killed_rank_never_a_lost_peer(tmp_path):
    lost = failed_process(tmp_path, 0, "rank 0 lost the other processes of its run", consequence=True)
    killed = failed_process(tmp_path, 1, None, exitcode=-9)
    own = failed_process(tmp_path, 2, "x.jpg: cannot decode image 7\nTraceback ...")
    assert failure.first_cause({0: lost, 1: killed, 2: own}, 1) == (2, own)
    assert failure.own_message(own) == "x.jpg: cannot decode image 7"  # one line
    assert failure.first_cause({0: lost, 1: killed}, 0) == (1, killed)
    assert failure.own_message(killed) is None
    assert failure.first_cause({0: lost}, 0) == (0, lost)
    # rank 1 killed, then rank 0 stopped by torchrun (SIGTERM): torchrun saw rank 1 first
    stopped = failed_process(tmp_path, 3, None, exitcode=-15)
    assert failure.first_cause({0: stopped, 1: killed}, 1) == (1, killed)


def test_a_loader_workers_error_is_said_as_the_worker_said_it():
    wrapped = RuntimeError("Caught DatasetError in DataLoader worker process 0.\nOriginal Traceback "
                           "(most recent call last):\n  File \"x.py\", line 1, in f\n"
                           "pipeline.data.dataset.DatasetError: a.jpg: cannot decode image 3")
    assert failure.message_of(wrapped) == "a.jpg: cannot decode image 3"
    assert failure.message_of(ValueError("a: b")) == "a: b"


@pytest.mark.slow
def test_a_rank_that_fails_is_named_with_its_own_error(small_dataset, tmp_path):
    """A truncated image in rank 1's first batch: rank 1 fails (in a loader worker), rank 0
    waits in the all-reduce until torchrun stops it or it loses its peer. The log ends with
    rank 1's own error, not torchrun's summary of exit codes."""
    root = tmp_path / "data"
    shutil.copytree(small_dataset, root)
    cfg, run = ddp_run(small_config(root))
    dataset = CocoDetection(root, "train", train=True)
    sampler = ShardedBatchSampler(len(dataset), 2, run.seed, 1, 2,
                                  aspect_ratio_groups(dataset.aspect_ratios(), cfg.data.aspect_ratio_groups))
    sampler.set_epoch(0)
    victim = dataset.image_dir / dataset.images[next(iter(sampler))[0]][0]["file_name"]
    victim.write_bytes(victim.read_bytes()[:len(victim.read_bytes()) // 2])

    status, lines = launch(cfg, run, tmp_path / "run")
    own = rf"rank 1 \(pid \d+ on .+\): {re.escape(str(victim))}: cannot decode image \d+: the file is truncated.*"
    assert re.fullmatch(f"error: {own}", lines[-2]), lines[-8:]
    assert "exited with code" not in lines[-2] and "Caught" not in lines[-2]
    # An error of the run's own is not retried (it would only repeat): the run is recorded as
    # failed with it, and the job ends well, for the workflow to go on with the other runs
    assert status == 0 and lines[-1].startswith(f"error: {run_id(run)} failed after 1 attempt(s): exited with code 1: ")
    summary = RunSummary.read(tmp_path / "run" / "train_summary.json")
    assert summary.status == "failed" and re.fullmatch(f"exited with code 1: {own}", summary.reason), summary.reason
    assert [a.ended for a in summary.failed_attempts] == ["exited with code 1"]


@pytest.mark.slow
def test_a_diverged_run_is_recorded_as_failed_and_its_reason_reaches_summary_csv(small_dataset, tmp_path):
    """Divergence is what the settings do: the run is recorded as failed, its job ends well
    (the workflow goes on to the other runs and the report), and every reader says why."""
    cfg, run = ddp_run(small_config(small_dataset, base_lr=1e6, warmup_iters=0))
    out = tmp_path / "run"
    status, lines = launch(cfg, run, out)
    assert status == 0, lines[-10:]
    said = next(line for line in lines if line.startswith("error: rank"))
    assert re.match(r"error: rank \d \(pid \d+ on .+\): non-finite loss \{", said), said
    assert "Lower train.base_lr" in said and "exited with code" not in said
    assert lines[-1].startswith("The run is recorded as failed in") and str(out) in lines[-1]

    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["status"] == "failed" and summary["run_id"] == "ddp-w2-b2-s0"
    assert re.match(r"rank \d: non-finite loss \{.*\} at epoch 0, step \d+;", summary["reason"])
    assert "\n" not in summary["reason"] and not (out / "model_final.pt").exists()

    assert launch(cfg, run, out, stage="evaluate")[0] == 0  # as the workflow scores it: not
    assert json.loads((out / "metrics.json").read_text())["status"] == "failed"
    row = summary_frame([load_run(out)], "demo").iloc[0]
    assert row["status"] == "failed" and row["reason"] == summary["reason"]


def test_a_stage_error_is_read_from_a_log_written_since_the_workflow_began(tmp_path):
    """failure.stage_error: the block from the log's last "error: " line, only for a log this
    invocation wrote whose output is absent (Snakemake removes a failed job's output)."""
    log, output = tmp_path / "data.log", tmp_path / "data.manifest.json"
    log.write_text("INFO checking\nerror: a.json: 2 of the val split's 4 images cannot be used\n"
                   "  val2017/1.jpg: cannot decode image 1\n")
    written = log.stat().st_mtime
    assert failure.stage_error(log, written, output) == (
        "error: a.json: 2 of the val split's 4 images cannot be used\n"
        "  val2017/1.jpg: cannot decode image 1")
    assert failure.stage_error(log, written + 1, output) is None  # an earlier invocation's log
    assert failure.stage_error(tmp_path / "absent.log", 0, output) is None
    output.write_text("{}")
    assert failure.stage_error(log, written, output) is None  # the stage made its output
    output.unlink()
    log.write_text("Traceback (most recent call last):\nKeyError: 'x'\n")  # not one of ours
    assert failure.stage_error(log, 0, output) == "KeyError: 'x'"


@pytest.mark.slow
def test_a_failed_data_stage_says_why_in_the_workflows_closing_summary(small_dataset, tmp_path):
    """Snakemake's console says of a failed job only to read its log; the workflow's closing
    summary names the runs the data stage kept from training and ends with its own error."""
    workdir = copy_workflow(tmp_path)
    edit_params(workdir, users_tree)
    root = workdir / "data" / "mine"
    shutil.copytree(small_dataset, root, ignore=shutil.ignore_patterns(MARKER))
    val = root / "annotations" / "instances_val2017.json"
    document = json.loads(val.read_text())
    document["categories"].append({"id": 9, "name": "zebra"})
    document["annotations"][0]["category_id"] = 9  # a box of a category training lacks
    val.write_text(json.dumps(document))

    failed = snakemake(workdir, TARGET, check=False)
    assert failed.returncode != 0
    summary = failed.stderr.split("runs: 0 of 1 trained", 1)[-1].splitlines()
    assert summary[1] == f"  not trained, as the data stage failed (logs/data/mine.log): {RUN}"
    assert summary[2].startswith("    error: data/mine/annotations/instances_val2017.json: "
                                 "category id(s) 9 ('zebra', 1 boxes) are used by validation "
                                 "boxes but by no training box"), failed.stderr[-3000:]
    assert "data.category_mismatch: warn" in summary[2]
    assert not (workdir / "data" / "mine.manifest.json").exists()
