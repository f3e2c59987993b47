"""The workflow on a real SLURM cluster (tests/slurm_cluster.py: a controller and two slurmd
nodes on this host) through `--profile profiles/slurm`, Snakemake's SLURM executor plugin:
the tiny demo end to end; a preset at parallel.nnodes 2 whose ddp and ps runs span 2 nodes (one
torchrun per node via srun, rendezvous on the first node) and whose single run asks for and runs
on one, all with the losses of the 1-node runs; and a training job killed by
the scheduler after its first checkpoint, retried by Snakemake, resuming to the same iterations
as an uninterrupted run."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import HANG_S, wait_for
from .slurm_cluster import SlurmCluster, Unavailable
from .test_strategies import records
from .workflow import copy_workflow, edit_params, jobs, tiny_params

pytestmark = pytest.mark.slow

TWO_WORKERS = [{"strategy": "ddp", "workers": 2, "images_per_worker": 2},
               {"strategy": "ps", "workers": 2, "images_per_worker": 2}]
SINGLE = "single-w1-b4-s0"
EQUIVALENCE = "results/equivalence/{preset}.json"
MULTI = ["ddp-w2-b2-s0", "ps-colocated-w2-b2-s0"]
# The profile as users run it, with status checks every 2 s instead of every 40 s and more
# (tests/slurm_snakemake.py keeps the plugin from backing off).
STEADY_STATUS_CHECKS = Path(__file__).with_name("slurm_snakemake.py")
FAST_STATUS = ["--slurm-init-seconds-before-status-checks", "1",
               "--seconds-between-status-checks", "2"]


def slurm_params(raw: dict) -> dict:
    """The tiny demo with 3 epochs (a kill after the first checkpoint has two epochs to land
    in), and presets for the same runs over two nodes and for the killed run."""
    tiny_params(raw)
    demo = raw["presets"]["demo"]
    # One thread per process everywhere: by default a process takes cores / processes on its
    # node, 1 on one node and 2 on each of two, and other thread counts round differently.
    demo["train"].update(epochs=3, threads=1)
    demo["sweep"] = [{"strategy": "single", "workers": 1}] + TWO_WORKERS
    # Every shipped preset starts its sweep with `single`: at nnodes 2 it still runs on one node.
    raw["presets"]["twonode"] = {"extends": "demo", "parallel": {"nnodes": 2},
                                 "sweep": demo["sweep"]}
    raw["presets"]["killed"] = {"extends": "demo", "sweep": [{"strategy": "single", "workers": 1}]}
    return raw


@pytest.fixture(scope="module")
def cluster():
    try:
        with SlurmCluster() as running:
            yield running
    except Unavailable as why:
        pytest.skip(f"no SLURM cluster on this host: {why}")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, cluster) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("slurm-workflow"))
    edit_params(root, slurm_params)
    return root


def snakemake_argv(*args: str) -> list[str]:
    # --verbose: the plugin logs each sbatch call at debug level
    return [sys.executable, str(STEADY_STATUS_CHECKS), "--profile", "profiles/slurm", *FAST_STATUS,
            "--verbose", *args]


def snakemake(workdir: Path, cluster: SlurmCluster, *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run(snakemake_argv(*args), cwd=workdir, capture_output=True, text=True,
                            timeout=HANG_S)
    if result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-5000:]}\n"
                             f"{result.stderr[-8000:]}\n{cluster.log()}")
    return result


def summary(workdir: Path, preset: str, run: str) -> dict:
    return json.loads((workdir / "results" / "runs" / preset / run / "train_summary.json").read_text())


def iterations(workdir: Path, preset: str, run: str) -> list[dict]:
    return records(workdir / "results" / "runs" / preset / run / "iterations.jsonl")


def sbatch_calls(result: subprocess.CompletedProcess) -> list[str]:
    return re.findall(r"sbatch call: (sbatch .*)", result.stdout + result.stderr)


def test_demo_runs_end_to_end_on_slurm(workdir, cluster):
    result = snakemake(workdir, cluster)
    stats = jobs(result)
    assert stats["train"] == 3 and stats["evaluate"] == 3 and stats["report"] == 1
    for run in [SINGLE] + MULTI:
        done = summary(workdir, "demo", run)
        assert done["status"] == "ok" and done["replicas_identical"], run
        metrics = json.loads((workdir / "results" / "runs" / "demo" / run / "metrics.json").read_text())
        assert 0 <= metrics["AP"] <= 1
    assert (workdir / "results" / "report" / "demo" / "report.html").is_file()
    # One-node jobs: one task with the run's CPUs and memory.
    calls = [c for c in sbatch_calls(result) if re.search(r"rule_(train|evaluate)_", c)]
    assert len(calls) == 6 and all("--nodes=1" in c and "--ntasks=1" in c for c in calls), calls
    assert any("--cpus-per-task=2" in c and "--mem 4096" in c for c in calls), calls
    # Every submitted job asks for memory; the data rule runs where Snakemake does (the login
    # node: fetching needs the internet).
    assert all(re.search(r"--mem \d+", c) for c in sbatch_calls(result)), sbatch_calls(result)
    assert not [c for c in sbatch_calls(result) if "rule_data" in c]
    assert re.search(r"localrule data:", result.stdout + result.stderr)


def test_two_node_runs_match_one_node_runs(workdir, cluster):
    # Training and the equivalence rule (both start processes); evaluation is on one node.
    targets = [f"results/runs/twonode/{run}/train_summary.json" for run in [SINGLE] + MULTI]
    result = snakemake(workdir, cluster, "--config", "preset=twonode", "--",
                       *targets, EQUIVALENCE.format(preset="twonode"))
    two_node_calls = [c for c in sbatch_calls(result) if "--nodes=2" in c]
    assert len(two_node_calls) == 2, sbatch_calls(result)  # the ddp and the ps training
    assert all("--ntasks=2" in c and "--cpus-per-task=1" in c for c in two_node_calls)
    # single at nnodes 2: one node asked for, and run there (no srun over two nodes)
    (single_call,) = [c for c in sbatch_calls(result) if f"train_wildcards_{SINGLE}" in c
                      or (SINGLE in c and "rule_train" in c)]
    assert "--nodes=1" in single_call, single_call
    single = summary(workdir, "twonode", SINGLE)
    assert single["status"] == "ok" and single["processes"] == 1
    assert [r["loss"] for r in iterations(workdir, "twonode", SINGLE)] == pytest.approx(
        [r["loss"] for r in iterations(workdir, "demo", SINGLE)], rel=1e-5)
    for run in MULTI:
        done = summary(workdir, "twonode", run)
        assert done["status"] == "ok" and done["replicas_identical"] and done["processes"] == 2
        log = (workdir / "logs" / "train" / "twonode" / f"{run}.log").read_text()
        assert "one torchrun on each of 2 nodes (n1, n2); rendezvous at 127.0.0.1:" in log, log[-3000:]
        one, two = iterations(workdir, "demo", run), iterations(workdir, "twonode", run)
        assert [r["step"] for r in one] == [r["step"] for r in two] and len(one) > 0
        for a, b in zip(one, two):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), run
    # The equivalence rule ran on its one node (it would wait forever for a second one).
    assert json.loads((workdir / EQUIVALENCE.format(preset="twonode")).read_text())["strategies"]


def train_job_ids() -> list[str]:
    """SLURM ids of the queued or running training jobs (the plugin's comment names the rule)."""
    out = subprocess.run(["squeue", "-h", "-o", "%i|%k|%T"], capture_output=True, text=True).stdout
    return [line.split("|")[0] for line in out.splitlines()
            if "rule_train" in line and line.endswith("RUNNING")]


def test_a_job_killed_by_the_scheduler_is_retried_and_resumes(workdir, cluster):
    run_dir = workdir / "results" / "runs" / "killed" / SINGLE
    checkpoint = run_dir / "state" / "checkpoint.pt"
    workflow = subprocess.Popen(snakemake_argv(
        "--config", "preset=killed", "--", f"results/runs/killed/{SINGLE}/train_summary.json"), cwd=workdir,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(checkpoint.exists, "the training job's first checkpoint", timeout=HANG_S, process=workflow)
        killed = wait_for(train_job_ids, "the training job RUNNING in squeue", timeout=HANG_S, process=workflow)
        assert len(killed) == 1, killed
        subprocess.run(["scancel", killed[0]], check=True)
        out, err = workflow.communicate(timeout=HANG_S)
    finally:
        if workflow.poll() is None:
            workflow.kill()
    assert workflow.returncode == 0, f"{out[-3000:]}\n{err[-8000:]}"
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", out + err)
    train_submissions = [c for c in sbatch_calls(subprocess.CompletedProcess([], 0, out, err))
                         if "rule_train" in c]
    assert len(train_submissions) == 2 and killed[0] in submitted  # the killed job, and its retry
    log = (workdir / "logs" / "train" / "killed" / f"{SINGLE}.log").read_text()
    assert "resuming" in log, log[-3000:]
    assert not (run_dir / "state").exists()  # a finished run keeps no checkpoint
    resumed, uninterrupted = iterations(workdir, "killed", SINGLE), iterations(workdir, "demo", SINGLE)
    assert [r["step"] for r in resumed] == [r["step"] for r in uninterrupted]
    for a, b in zip(resumed, uninterrupted):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)
