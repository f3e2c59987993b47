"""What each job asks a scheduler for (pipeline/resources.py), on the real presets of params.yaml
and on copies edited to two nodes or to NCCL; and the workflow that wires it in (the Snakefile,
rules/*.smk) lints clean and plans its jobs."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pipeline import launch, resources
from pipeline.config import params, schema, stages
from pipeline.runtime import distributed
from pipeline.strategies import STRATEGIES, Run, sweep

from .conftest import HANG_S, REPO
from .workflow import copy_workflow, jobs

SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


def preset(name: str, **parallel) -> schema.Config:
    """The resolved preset, its parallel section edited (backend gloo unless told: `auto`
    would depend on this machine's GPUs)."""
    cfg = params.load_resolved(REPO / "params.yaml", preset=name)
    return schema.replaced(cfg, parallel={"backend": "gloo", **parallel})


@pytest.fixture
def machine(monkeypatch):
    """This machine, as strategies see it: no GPU, `cores` CPU cores."""
    def set_cores(cores: int) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
        monkeypatch.setattr(distributed, "available_cores", lambda: cores)
    return set_cores


def dedicated_servers(run: Run) -> int:
    """The processes a run starts besides its workers: a dedicated parameter server's."""
    return run.option("servers") if run.options.get("placement") == "dedicated" else 0


def first_run(cfg: schema.Config, strategy: str, workers: int) -> Run:
    runs = [r for r in sweep.runs(cfg).values() if r.strategy == strategy and r.workers == workers
            and r.options.get("placement", "colocated") == "colocated"]
    assert runs, f"the {cfg.preset} sweep has no {strategy} run of {workers} workers"
    return runs[0]


@pytest.mark.parametrize("name", ["demo", "coco2017"])
def test_a_two_worker_ddp_run_asks_for_one_node_and_two_processes(name):
    cfg = preset(name)
    per = cfg.resources
    job = resources.run_resources(cfg, first_run(cfg, "ddp", 2))
    assert job == {"runtime": per.runtime_minutes, "slurm_partition": per.partition,
                   "slurm_account": per.account, "nodes": 1, "processes": 2, "tasks": 1,
                   "cpus_per_task": 2 * per.cpus_per_process,
                   "mem_mb": 2 * per.memory_mb_per_process, "gpu": 0, "tasks_per_gpu": None,
                   "mpi": None}


def test_the_published_recipe_asks_for_what_its_resources_section_says():
    job = resources.run_resources(preset("coco2017"), first_run(preset("coco2017"), "ddp", 2))
    assert (job["cpus_per_task"], job["mem_mb"]) == (12, 32768)


def test_a_single_run_is_one_process():
    cfg = preset("demo")
    job = resources.run_resources(cfg, first_run(cfg, "single", 1))
    assert (job["nodes"], job["processes"], job["tasks"], job["gpu"]) == (1, 1, 1, 0)


@pytest.mark.parametrize("name", sorted(params.load(REPO / "params.yaml")["presets"]))
def test_at_two_nodes_every_run_starts_on_the_nodes_its_job_asks_for(name, monkeypatch, capsys):
    """parallel.nnodes: 2 in any shipped preset: a one-node strategy (single, dp) asks for one
    node and its launcher starts it there, with no srun over two nodes and no "node 1 of 2";
    a torchrun strategy asks for two and its launcher says it spans two."""
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_JOBID", raising=False)
    cfg = preset(name, nnodes=2)
    for run_id, run in sweep.runs(cfg).items():
        nodes = resources.run_resources(cfg, run)["nodes"]
        argv = launch.multi_node_command(stages.view(cfg, "train"), run, "out")
        said = capsys.readouterr().err
        assert ("node 1 of 2" in said) == (nodes == 2), (run_id, said)
        assert ("--nnodes=2" in argv) == (nodes == 2), (run_id, argv)
        if run.strategy in ("single", "dp"):
            assert nodes == 1 and argv[1:3] == ["-m", "pipeline.training.train"], (run_id, argv)


def test_the_data_report_and_paper_jobs_ask_for_one_process_memory():
    cfg = preset("coco2017")
    job = resources.one_process_resources(cfg)
    assert (job["nodes"], job["tasks"], job["gpu"]) == (1, 1, 0)
    assert job["mem_mb"] == cfg.resources.memory_mb_per_process > 0


def test_over_two_nodes_one_task_per_node_and_the_job_starts_its_own_srun():
    cfg = preset("demo", nnodes=2)
    job = resources.run_resources(cfg, first_run(cfg, "ddp", 2))
    assert (job["nodes"], job["processes"], job["tasks"], job["mpi"]) == (2, 1, 2, "srun")
    assert job["cpus_per_task"] == cfg.resources.cpus_per_process  # per node
    assert job["mem_mb"] == cfg.resources.memory_mb_per_process  # per node, like --mem


def test_an_nccl_run_asks_for_its_gpus_and_not_tasks_per_gpu():
    cfg = preset("demo", backend="nccl")
    job = resources.run_resources(cfg, first_run(cfg, "ddp", 2))
    assert (job["gpu"], job["tasks_per_gpu"], job["tasks"]) == (2, 0, 1)
    two_nodes = resources.run_resources(preset("demo", backend="nccl", nnodes=2), first_run(cfg, "ddp", 2))
    assert (two_nodes["gpu"], two_nodes["tasks"], two_nodes["mpi"]) == (2, 2, "srun")  # all nodes' GPUs


def test_dataparallel_is_one_process_with_its_workers_gpus():
    cfg = preset("demo")
    job = resources.run_resources(cfg, first_run(cfg, "dp", 2))
    assert (job["processes"], job["gpu"], job["tasks_per_gpu"]) == (1, 2, 0)


@pytest.mark.parametrize("parallel", [{}, {"nnodes": 2}, {"backend": "nccl", "nnodes": 2}])
def test_evaluation_runs_on_one_node(parallel):
    cfg = preset("demo", **parallel)
    for run in sweep.runs(cfg).values():
        job = resources.run_resources(cfg, run, "evaluate")
        assert (job["nodes"], job["tasks"], job["mpi"]) == (1, 1, None), run
        # a strategy that evaluates on its workers (ddp, ps, zero) uses one process per worker,
        # the others one process
        on_workers = getattr(STRATEGIES[run.strategy], "evaluates_on_workers", False)
        expected = run.workers if on_workers else 1
        assert job["processes"] == expected, run
        assert job["gpu"] <= job["processes"] or run.strategy == "dp"


@pytest.mark.parametrize("cores", [2, 8])
def test_commbench_times_each_one_node_process_count_this_machine_can_start(machine, cores):
    machine(cores)
    cfg = preset("demo")
    runs = sweep.runs(cfg)
    # From the sweep's entries: ddp and ps start a process per worker (and per dedicated server);
    # single and dp are one process, which has no links to time.
    counts = {r.workers + dedicated_servers(r) for r in runs.values() if r.strategy in ("ddp", "ps")}
    expected = sorted(n for n in counts if 1 < n <= cores)
    assert resources.commbench_processes(cfg, runs) == expected
    assert expected  # the demo sweep has 2-process runs, so commbench has something to time


def test_commbench_skips_runs_over_several_nodes(machine):
    machine(8)
    cfg = preset("demo", nnodes=2)
    assert resources.commbench_processes(cfg, sweep.runs(cfg)) == []


def test_a_commbench_job_is_its_processes_on_one_node_with_a_gpu_each_under_nccl():
    job = resources.commbench_resources(preset("demo", nnodes=2), 3)
    assert (job["nodes"], job["processes"], job["tasks"], job["mpi"], job["gpu"]) == (1, 3, 1, None, 0)
    nccl = resources.commbench_resources(preset("demo", backend="nccl"), 2)
    assert (nccl["gpu"], nccl["tasks_per_gpu"]) == (2, 0)
    # the launcher starts it where its job asks: one torchrun on this node, no restarts
    argv = launch.commbench_command(stages.view(preset("demo", nnodes=2), "commbench"), 3, "out.json",
                                    python="python")
    assert argv[:7] == ["python", "-m", "pipeline.runtime.elastic", "--nproc-per-node=3",
                        "--nnodes=1", "--max-restarts=0", "--standalone"]
    assert argv[7:9] == ["-m", "pipeline.commbench"] and argv[-2:] == ["--out", "out.json"]


@pytest.mark.parametrize("name", ["demo", "coco2017"])
@pytest.mark.parametrize("parallel", [{}, {"nnodes": 2}, {"backend": "nccl"}])
def test_the_equivalence_job_fits_its_largest_entry_on_one_node(name, parallel):
    cfg = preset(name, **parallel)
    entries = sweep.equivalence_runs(cfg)
    assert len(entries) > 1
    job = resources.equivalence_resources(cfg)
    # every entry runs in this job, one after another, on one node whatever parallel.nnodes says
    assert (job["nodes"], job["tasks"], job["mpi"]) == (1, 1, None)
    largest = max(e.workers + dedicated_servers(e) for e in entries)
    assert job["processes"] == largest
    assert job["cpus_per_task"] == largest * cfg.resources.cpus_per_process
    nccl = parallel.get("backend") == "nccl"
    assert (job["gpu"], job["tasks_per_gpu"]) == ((largest, 0) if nccl else (0, None))


def test_scheduler_settings_reach_every_job():
    cfg = schema.replaced(preset("demo"), resources={"partition": "gpu", "account": "bench",
                                                     "runtime_minutes": 30})
    expected = {"runtime": 30, "slurm_partition": "gpu", "slurm_account": "bench"}
    assert resources.scheduler(cfg) == expected
    for job in (resources.run_resources(cfg, first_run(cfg, "ddp", 2)),
                resources.equivalence_resources(cfg), resources.commbench_resources(cfg, 2)):
        assert expected.items() <= job.items()
    assert set(resources.resource_names(cfg)) == set(resources.commbench_resources(cfg, 2))


def test_planning_the_workflow_imports_no_torch():
    """What the Snakefile loads and calls while it plans (the rule files' imports, every job's
    resources for every preset) needs neither torch nor Snakemake: parsing stays fast, and the
    logic is testable alone (torch is imported inside the functions that run a process)."""
    code = ("import sys\n"
            "from pipeline import resources\n"
            "from pipeline.config import params, stages\n"
            "from pipeline.report import build, figures, paper\n"
            "from pipeline.runtime import stale_locks\n"
            "from pipeline.strategies import sweep, torchrun\n"
            "for name in params.load(%r)['presets']:\n"
            "    cfg = params.load_resolved(%r, preset=name)\n"
            "    runs = sweep.runs(cfg)\n"
            "    [resources.run_resources(cfg, run, stage) for run in runs.values()\n"
            "     for stage in ('train', 'evaluate')]\n"
            "    resources.equivalence_resources(cfg)\n"
            "    [stages.code_files(stage) for stage in stages.STAGES]\n"
            "print(sorted({'snakemake', 'torch', 'torchvision', 'pipeline.equivalence'}"
            " & set(sys.modules)))\n") % ((str(REPO / "params.yaml"),) * 2)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_S, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("visible, expected", [
    (None, 4), ("", 0), ("0,2", 2), ("3,1,0,2", 4), ("1,7,2", 1), ("-1,0", 0),
    ("GPU-8a1c,MIG-3f2e", 2), ("0,1,0", 0)])
def test_visible_gpus_are_counted_as_cuda_counts_them(visible, expected):
    assert distributed.visible_gpus(4, visible) == expected


def test_the_torch_free_gpu_count_agrees_with_torch():
    """Counted by NVML before torch is loaded, by torch after: the same number (0 on a
    machine without a driver, the visible GPUs on a GPU host)."""
    code = ("from pipeline.runtime import distributed\n"
            "before = distributed.gpu_count()\n"
            "import torch\n"
            "print(before, torch.cuda.device_count())\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_S, cwd=REPO)
    assert done.returncode == 0, done.stderr
    before, after = done.stdout.split()
    assert before == after


# --- the workflow that wires it in ---------------------------------------------------------

def test_lint_is_clean_and_parsing_imports_no_torch():
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "--lint"],
                          cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0 and "Lints for" not in done.stdout + done.stderr, done.stdout
    assert not re.search(r"\|\s+torch$", done.stderr, re.MULTILINE), "parsing imported torch"


def test_the_workflow_plans_every_rule_and_the_other_presets_compute_runs(tmp_path):
    """A dry run in a copy of the workflow: every rule has its jobs, and the report reads the
    single-w1 runs report.predict's preset left there (looked for when the DAG is built); with
    --verbose, as Snakemake lists them: each job's inputs and its reason."""
    root = copy_workflow(tmp_path)
    cfg = params.load_resolved(root / "params.yaml", preset="demo")
    other = cfg.report.predict.compute.preset
    assert other != "demo"
    for run in ("single-w1-b2-s0", "single-w1-b2-s1", "ddp-w2-b2-s0"):
        (root / "results" / "runs" / other / run).mkdir(parents=True)
        (root / "results" / "runs" / other / run / "train_summary.json").write_text("{}")
    # --verbose: each job's inputs and reasons, which the default profile leaves out
    done = subprocess.run([SNAKEMAKE, "--cores", "1", "--dry-run", "--printshellcmds", "--verbose"],
                          cwd=root, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stdout + done.stderr
    planned = jobs(done)
    runs = len(sweep.runs(cfg))
    assert {planned[rule] for rule in ("train", "evaluate")} == {runs}
    assert {rule for rule in planned} >= {"all", "data", "equivalence", "commbench", "report"}
    report = done.stdout.split("rule report:", 1)[1].split("\n\n", 1)[0]
    assert "\n    reason: Missing output files: " in report
    compute = [f"results/runs/{other}/single-w1-b2-s{seed}" for seed in (0, 1)]
    for run in compute:
        assert f"{run}/train_summary.json" in report.split("Shell command", 1)[0]  # an input
        assert f"--compute-run {run} " in report
    assert f"--compute-run results/runs/{other}/ddp" not in report
    # the entries the cost model is fitted without, then predicts (pipeline/report/holdout.py)
    held = sweep.held_out(cfg)
    assert held and " ".join(f"--held-out {entry}" for entry in held) in report
