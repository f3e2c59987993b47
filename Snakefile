"""Data-parallel Faster R-CNN benchmark: data -> train (one job per run) -> evaluate -> report -> paper,
with commbench (the machine's links, one job per process count) feeding the report's cost model.

    snakemake --cores all                              # the demo preset (embedded data, CPU)
    snakemake --cores all --config preset=coco2017     # the published recipe
    snakemake --profile profiles/slurm                 # every job submitted to SLURM (README)

Every value a rule depends on is passed as its `params` (the config sections pipeline/config/stages.py
lists for its stage), and the source files its module executes, derived from its imports, are
declared as its inputs, so Snakemake reruns exactly the stages a change affects.
"""
import functools
import glob
import os
import re
import shutil
import sys

from snakemake.exceptions import WorkflowError
from snakemake_interface_executor_plugins.settings import DeploymentMethod
from snakemake.utils import min_version

from pipeline.config import params as P
from pipeline.config import stages
from pipeline.report import paper
from pipeline.runtime import stale_locks
from pipeline import strategies
from pipeline.strategies import sweep
from pipeline.report.build import FILES as REPORT_FILES
from pipeline.report.build import TABLES
from pipeline.report.figures import FIGURES
from pipeline.strategies.torchrun import torchrun

min_version("9.0")


configfile: "params.yaml"


# A Snakemake killed with SIGKILL leaves its locks; the next run clears them once it is sure
# their owner is gone (pipeline/runtime/stale_locks.py), so rerunning the same command just works.
# profiles/default turns on --rerun-incomplete for the same reason.
RELEASED = stale_locks.release_stale()
if RELEASED:
    print(RELEASED, file=sys.stderr)


onstart:
    stale_locks.record_owner(getattr(workflow.persistence, "_lockfile", {}).values())


try:
    CFG = P.resolve(config)
    RUNS = sweep.runs(CFG)
except P.ParamsError as error:
    raise WorkflowError(str(error))

# The interpreter with the locked environment: the one running Snakemake; inside the image
# (--software-deployment-method apptainer) the host's path does not exist, and the image's
# environment is on its PATH.
IN_IMAGE = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
PYTHON = "python" if IN_IMAGE else sys.executable
PRESET = CFG["preset"]
DATA = CFG["data"]
RUN_DIR = f"results/runs/{PRESET}/{{run}}"
MANIFEST = f"data/{DATA['name']}.manifest.json"
REPORT = "results/report"
PAPER = "results/paper/paper.pdf"
# The paper needs a LaTeX toolchain; without one the workflow says so and stops at the report.
MISSING_TEX = paper.missing_tools()
if MISSING_TEX:
    print(f"Not building {PAPER}: {', '.join(MISSING_TEX)} not found; {paper.INSTALL}.",
          file=sys.stderr)


def code(stage):
    """Snakemake tracks a rule's own code, not what it imports: the files each stage executes
    are derived from the imports of the module it runs (pipeline/config/stages.py)."""
    return stages.code_files(stage, fetch=stage == "data" and DATA["fetch"] is not None)


def stage_params(stage):
    return P.canonical(stages.config_for(CFG, stage))


# How a stage outlives faults (timeouts, restarts, checkpoint interval) reaches it through the
# environment its jobs inherit, not as its params, so changing one reruns nothing
# (pipeline/config/stages.py); a job on a cluster parses this file again and sets it there too.
os.environ[stages.KNOBS_ENV] = stages.knobs_environment(CFG)


RESOURCES = CFG["resources"]
# What every job asks SLURM for besides its processes (snakemake-executor-plugin-slurm's names;
# profiles/slurm). None leaves a resource unset: the cluster's default partition, no account.
SCHEDULER = {"runtime": RESOURCES["runtime_minutes"], "slurm_partition": RESOURCES["partition"],
             "slurm_account": RESOURCES["account"]}


def job_resources(nodes, per_node, gpus_per_node):
    """A job of `per_node` processes on each of `nodes` nodes, in the executor plugin's terms."""
    return {
        **SCHEDULER,
        "nodes": nodes,
        "processes": per_node,
        # One task per node: the job's script runs once, and the launcher starts one torchrun
        # per node itself (srun inside the allocation), which starts the node's processes.
        "tasks": nodes,
        "cpus_per_task": per_node * RESOURCES["cpus_per_process"],
        "mem_mb": per_node * RESOURCES["memory_mb_per_process"],  # per node, like sbatch --mem
        # Snakemake's standard resource: the job's GPUs (sbatch --gpus counts all its nodes).
        "gpu": nodes * gpus_per_node,
        # The plugin reads `tasks` of a GPU job as tasks per GPU; 0 turns that off.
        "tasks_per_gpu": 0 if gpus_per_node else None,
        # A job over several nodes starts its own srun: with an `mpi` resource the plugin's job
        # step runs the command once in the batch script, not inside a one-node `srun -n1` step.
        "mpi": "srun" if nodes > 1 else None,
    }


@functools.cache
def run_resources(run, stage="train"):
    """What one run's training (or evaluation) job asks a scheduler for: its nodes, processes
    per node, their CPUs and memory, GPUs where it uses them. Evaluation runs on one node."""
    strategy = strategies.get(RUNS[run], CFG["parallel"])
    if stage == "evaluate":
        processes = strategy.evaluation_processes()
        return job_resources(1, processes, min(strategy.gpus(), processes))
    return job_resources(strategy.nodes(), strategy.processes_per_node(), strategy.gpus())


def resources_of(stage):
    """The resources of a run's `stage` job, one function of the run each."""
    return {name: (lambda wildcards, name=name: run_resources(wildcards.run, stage)[name])
            for name in job_resources(1, 1, 0)}


def equivalence_resources():
    """One step of each of pipeline/equivalence.py's entries, on one node: at most 2 processes."""
    ddp = strategies.get({"strategy": "ddp", "workers": 2, "images_per_worker": 4},
                         dict(CFG["parallel"], nnodes=1))
    return job_resources(1, ddp.processes(), ddp.gpus())


def link_job(processes):
    """The commbench job at `processes` processes: on one node, as a ddp run of that many
    workers would be (its processes, their GPUs where NCCL is the backend)."""
    return strategies.get({"strategy": "ddp", "workers": processes, "images_per_worker": 1,
                           "comm_hook": "none"}, dict(CFG["parallel"], nnodes=1))


# The process counts whose links the cost model needs: every multi-process run on one node
# that this machine can run (a run over several nodes crosses links commbench does not time).
COMMBENCH = sorted({s.processes() for s in (strategies.get(r, CFG["parallel"]) for r in RUNS.values())
                    if s.processes() > 1 and s.nodes() == 1 and s.unavailable() is None})
COMMBENCH_FILE = f"results/commbench/{PRESET}/p{{processes}}.json"


def cores_or(cpus):
    """A job that times itself has the machine to itself: locally all of --cores. On a cluster
    (no --cores; each job is its own allocation) the CPUs it asks for, `cpus` of its wildcards."""
    try:
        cores = workflow.cores
    except WorkflowError:
        return cpus
    return lambda wildcards: cores


# Every rule runs in the locked environment: the image built from the Dockerfile. Snakemake uses
# it with --software-deployment-method apptainer (push the image and set BENCH_IMAGE to it);
# plain runs use the environment Snakemake itself runs in.
container: os.environ.get("BENCH_IMAGE", "docker://frcnn-dp-bench:latest")


wildcard_constraints:
    run="|".join(re.escape(run) for run in RUNS),
    processes=r"\d+",


rule all:
    input:
        "results/summary.csv",
        f"{REPORT}/report.html",
        [] if MISSING_TEX else PAPER,
        # Each run's own results too: a deleted run directory (or a run killed after its
        # old outputs were removed) is noticed and made again; with only the report asked
        # for, Snakemake sees the report up to date and does nothing.
        expand(f"{RUN_DIR}/{{name}}", run=RUNS,
               name=["train_summary.json", "iterations.jsonl", "metrics.json", "predictions.json"]),


rule data:
    input:
        code=code("data") + (["dvc.yaml"] if DATA["fetch"] else []),
    output:
        manifest=MANIFEST,
    params:
        data=P.canonical(DATA),
        python=PYTHON,
    resources:
        **SCHEDULER,
    log:
        f"logs/data/{DATA['name']}.log",
    benchmark:
        f"logs/benchmarks/data_{DATA['name']}.tsv"
    shell:
        "{params.python} -m pipeline.data.prepare --config {params.data:q} --manifest {output.manifest}"
        " > {log} 2>&1"


rule train:
    input:
        manifest=MANIFEST,
        code=code("train"),
    output:
        # Written last; model_final.pt beside it exists only for runs that were not skipped.
        summary=f"{RUN_DIR}/train_summary.json",
        iterations=f"{RUN_DIR}/iterations.jsonl",
    params:
        config=stage_params("train"),
        run=lambda wildcards: P.canonical(RUNS[wildcards.run]),
        python=PYTHON,
        out=lambda wildcards, output: os.path.dirname(output.summary),
    # Timings are the result: a training run has the machine (or its allocation) to itself.
    threads: cores_or(resources_of("train")["cpus_per_task"])
    resources:
        **resources_of("train"),
    log:
        f"logs/train/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/train_{PRESET}_{{run}}.tsv"
    shell:
        "exec {params.python} -m pipeline.launch --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} > {log} 2>&1"


rule evaluate:
    input:
        manifest=MANIFEST,
        summary=rules.train.output.summary,
        code=code("evaluate"),
    output:
        metrics=f"{RUN_DIR}/metrics.json",
        predictions=f"{RUN_DIR}/predictions.json",
    params:
        config=stage_params("evaluate"),
        run=lambda wildcards: P.canonical(RUNS[wildcards.run]),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        python=PYTHON,
    threads: cores_or(resources_of("evaluate")["cpus_per_task"])
    resources:
        **resources_of("evaluate"),
    log:
        f"logs/evaluate/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/evaluate_{PRESET}_{{run}}.tsv"
    shell:
        "exec {params.python} -m pipeline.launch --stage evaluate --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} > {log} 2>&1"


rule equivalence:
    input:
        manifest=MANIFEST,
        code=code("equivalence"),
    output:
        "results/equivalence.json",
    params:
        config=stage_params("equivalence"),
        python=PYTHON,
    threads: cores_or(lambda wildcards: equivalence_resources()["cpus_per_task"])
    resources:
        **equivalence_resources(),
    log:
        "logs/equivalence.log",
    benchmark:
        "logs/benchmarks/equivalence.tsv"
    shell:
        "exec {params.python} -m pipeline.equivalence --config {params.config:q}"
        " --out {output} > {log} 2>&1"


rule commbench:
    input:
        code=code("commbench"),
    output:
        COMMBENCH_FILE,
    params:
        config=stage_params("commbench"),
        # restarts are a knob (they rerun nothing) and a benchmark this short needs none
        launcher=lambda wildcards: " ".join(torchrun(PYTHON, int(wildcards.processes),
                                                      dict(CFG["parallel"], nnodes=1, max_restarts=0), "")),
    # Timings are the result: the job has the machine (or its allocation) to itself.
    threads: cores_or(lambda wildcards: link_job(int(wildcards.processes)).processes())
    resources:
        **{name: (lambda wildcards, name=name: job_resources(
            1, int(wildcards.processes), link_job(int(wildcards.processes)).gpus())[name])
           for name in job_resources(1, 1, 0)},
    log:
        f"logs/commbench/{PRESET}/p{{processes}}.log",
    benchmark:
        f"logs/benchmarks/commbench_{PRESET}_p{{processes}}.tsv"
    shell:
        "exec {params.launcher} -m pipeline.costmodel.commbench --config {params.config:q} --out {output}"
        " > {log} 2>&1"


# The predicted scaling's compute input: the single-GPU runs of report.predict's preset where
# they exist (results of another preset's workflow); this preset's own runs are inputs anyway.
PREDICT_PRESET = CFG["report"]["predict"]["compute"]["preset"]
COMPUTE_RUNS = [] if PREDICT_PRESET == PRESET else sorted(
    os.path.dirname(path) for path in glob.glob(f"results/runs/{PREDICT_PRESET}/single-w1-*/train_summary.json"))


rule report:
    input:
        equivalence=rules.equivalence.output[0],
        commbench=expand(COMMBENCH_FILE, processes=COMMBENCH),
        compute_runs=[f"{d}/train_summary.json" for d in COMPUTE_RUNS],
        summaries=expand(rules.train.output.summary, run=RUNS),
        metrics=expand(rules.evaluate.output.metrics, run=RUNS),
        code=code("report"),
    output:
        summary="results/summary.csv",
        html=f"{REPORT}/report.html",
        files=expand(f"{REPORT}/{{name}}", name=[f for f in REPORT_FILES if f != "report.html"]),
        tables=expand(f"{REPORT}/{{name}}.{{ext}}", name=TABLES, ext=["md", "csv", "tex"]),
        # paper/paper.tex inputs numbers.tex, figures.tex, the .tex tables and the figures
        figures=expand(f"{REPORT}/figures/{{name}}.{{ext}}", name=FIGURES,
                       ext=CFG["report"]["figure_formats"]),
    params:
        report=P.canonical(CFG["report"]),
        preset=PRESET,
        runs=expand(RUN_DIR, run=RUNS),
        commbench=lambda wildcards, input: " ".join(f"--commbench {f}" for f in input.commbench),
        compute_runs=" ".join(f"--compute-run {d}" for d in COMPUTE_RUNS),
        out=lambda wildcards, output: os.path.dirname(output.html),
        python=PYTHON,
    resources:
        **SCHEDULER,
    log:
        "logs/report.log",
    benchmark:
        "logs/benchmarks/report.tsv"
    shell:
        "{params.python} -m pipeline.report --report-config {params.report:q} --preset {params.preset}"
        " --summary {output.summary} --equivalence {input.equivalence} --out-dir {params.out}"
        " {params.commbench} {params.compute_runs} {params.runs} > {log} 2>&1"


rule paper:
    input:
        rules.report.output,
        source="paper/paper.tex",
        bibliography="paper/references.bib",
        code=code("paper"),
    output:
        PAPER,
    params:
        python=PYTHON,
    resources:
        **SCHEDULER,
    log:
        "logs/paper.log",
    benchmark:
        "logs/benchmarks/paper.tsv"
    shell:
        "{params.python} -m pipeline.report.paper --source {input.source} --out {output} > {log} 2>&1"
