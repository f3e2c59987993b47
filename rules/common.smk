# Constants and small helpers every rule file uses; included first by the Snakefile, after the
# config is resolved (CFG, RUNS). What a job asks a scheduler for is pipeline/resources.py's,
# tested without Snakemake (tests/test_resources.py); this file only wires it into `resources:`.
import functools
import glob
import os
import shlex
import sys
import time

from snakemake.exceptions import WorkflowError
from snakemake.settings.enums import Quietness
from snakemake_interface_executor_plugins.settings import DeploymentMethod

from pipeline import resources, strategies
from pipeline.config import params as P
from pipeline.config import stages
from pipeline.report import paper, render
from pipeline.runtime import failure

# The interpreter with the locked environment: the one running Snakemake; inside the image
# (--software-deployment-method apptainer) the host's path does not exist, and the image's
# environment is on its PATH.
IN_IMAGE = DeploymentMethod.APPTAINER in workflow.deployment_settings.deployment_method
PYTHON = "python" if IN_IMAGE else sys.executable
PRESET = CFG.preset
DATA = CFG.data
RUN_DIR = f"results/runs/{PRESET}/{{run}}"
MANIFEST = f"data/{DATA.name}.manifest.json"
DATA_LOG = f"logs/data/{DATA.name}.log"  # the data stage's; its error ends the closing summary
# What the report stage makes is per preset, like the runs: one preset's report never
# overwrites another's.
REPORT = f"results/report/{PRESET}"
SUMMARY = f"results/summary/{PRESET}.csv"
EQUIVALENCE = f"results/equivalence/{PRESET}.json"
PAPER = f"results/paper/{PRESET}/paper.pdf"
# The paper needs a LaTeX toolchain; without one the workflow says so and stops at the report.
MISSING_TEX = paper.missing_tools()
if MISSING_TEX:
    print(f"Not building {PAPER}: {', '.join(MISSING_TEX)} not found; {paper.INSTALL}.",
          file=sys.stderr)


# --- the console ---------------------------------------------------------------------------------
# Each job prints its purpose in one line (its rule's `message:`, made by `purpose`), and
# profiles/default leaves out Snakemake's `reason:` lines (quiet: [reason]): a job's list of
# inputs (every source file it runs) and its reasons (every input another job updates) made a
# dry run of the demo some 200 KB. `--verbose` brings both back: the rules print their inputs,
# outputs and reasons as Snakemake lays them out, with Snakemake's own debugging lines.
_OUTPUT = getattr(workflow, "output_settings", None)
VERBOSE = bool(_OUTPUT and _OUTPUT.verbose)
if VERBOSE and _OUTPUT.quiet:
    # the set Snakemake's log formatter reads (the profile's `quiet:` is a default of the
    # command line, which --verbose does not override)
    _OUTPUT.quiet.discard(Quietness.REASON)


def purpose(text):
    """A rule's `message:`: its name, then `text` (formatted by Snakemake with the job's
    wildcards, input, output and log), as "Job 5: train: single-w1-b8-s0 -> ..."; None under
    --verbose, where Snakemake lists the job's files instead."""
    return None if VERBOSE else f"{{rule}}: {text}"


def code(stage):
    """Snakemake tracks a rule's own code, not what it imports: the files each stage executes
    are derived from the imports of the module it runs (pipeline/config/stages.py)."""
    return stages.code_files(stage, fetch=stage == "data" and DATA.fetch is not None)


def run_code(stage):
    """The files one run's `stage` executes: its own strategy's module, not the others', so an
    edit to one strategy reruns only its runs (an input function of the run wildcard)."""
    return lambda wildcards: stages.code_files(
        stage, left_out=strategies.not_run_by(RUNS[wildcards.run].strategy))


def stage_params(stage):
    """The config sections `stage` reads (pipeline/config/stages.py), as one JSON argument."""
    return P.canonical(stages.config_for(CFG, stage))


# How a stage outlives faults (timeouts, restarts, checkpoint interval) reaches it through the
# environment its jobs inherit, not as its params, so changing one reruns nothing
# (pipeline/config/stages.py); a job on a cluster parses this file again and sets it there too.
os.environ[stages.KNOBS_ENV] = stages.knobs_environment(CFG)


# --- what each job asks a scheduler for (pipeline/resources.py) ------------------------------
# The data, report and paper jobs: one process, no GPU.
ONE_PROCESS = resources.one_process_resources(CFG)


@functools.cache
def run_job(run, stage):
    """The resources of run `run`'s `stage` (train or evaluate) job."""
    return resources.run_resources(CFG, RUNS[run], stage)


@functools.cache
def equivalence_job():
    """Evaluated when the DAG first needs it, not at parse time (it loads the detection model's
    module: pipeline/resources.py)."""
    return resources.equivalence_resources(CFG)


@functools.cache
def commbench_job(processes):
    """The resources of the commbench job at `processes` processes."""
    return resources.commbench_resources(CFG, int(processes))


def wired(job):
    """A rule's `resources:`, one function of the wildcards each (Snakemake evaluates each
    resource on its own): `job(wildcards)`'s value of that name."""
    return {name: (lambda wildcards, name=name: job(wildcards)[name])
            for name in resources.resource_names(CFG)}


def cores_or(cpus):
    """A job that times itself has the machine to itself: locally all of --cores. On a cluster
    (no --cores; each job is its own allocation) the CPUs it asks for, `cpus` of its wildcards."""
    try:
        cores = workflow.cores
    except WorkflowError:
        return cpus
    return lambda wildcards: cores


# The process counts commbench times the links of (pipeline/resources.py: commbench_processes).
COMMBENCH = resources.commbench_processes(CFG, RUNS)
COMMBENCH_FILE = f"results/commbench/{PRESET}/p{{processes}}.json"


# The predicted scaling's compute input: the single-GPU runs of report.predict's preset where
# they exist (results of another preset's workflow; this preset's own runs are inputs anyway).
# Looked for when the DAG is built (the report rule's input function), not when this file is
# parsed, and never made by this workflow: what is there is used.
PREDICT_PRESET = CFG.report.predict.compute.preset


def compute_runs(wildcards):
    """The train_summary.json of each of report.predict's preset's single-w1-* runs."""
    if PREDICT_PRESET == PRESET:
        return []
    return sorted(glob.glob(f"results/runs/{PREDICT_PRESET}/single-w1-*/train_summary.json"))


# When this invocation began: a data stage's log written since is this invocation's.
STARTED = time.time()


def last_words(succeeded):
    """What the workflow says when it ends (onsuccess, onerror in the Snakefile): with the
    data stage's own error where it failed, as Snakemake's console says only to read its log;
    after a success, where the paper is and the answer's first sentence, read from the report
    where it is newer than every run's results (a report of other runs is not quoted); last,
    each run whose training failed, its reason, log and the command that retries it. True
    where a run failed: the workflow's exit status then says so."""
    error = failure.stage_error(DATA_LOG, STARTED, MANIFEST)
    said, failed = sweep.outcome(
        {run: RUN_DIR.format(run=run) for run in RUNS}, f"{REPORT}/report.html",
        (DATA_LOG, error) if error else None,
        retry=shlex.join(this_command()),
    )
    lines = [said]
    if succeeded and os.path.exists(PAPER):
        lines.append(f"paper: {PAPER}")
    elif succeeded and MISSING_TEX:
        lines.append(f"paper: not built ({', '.join(MISSING_TEX)} not found)")
    report_md = f"{REPORT}/report.md"
    if succeeded and os.path.exists(report_md) and os.path.getmtime(report_md) >= newest_result():
        sentence = render.answer_sentence(open(report_md).read())
        lines += [f"answer: {sentence}"] if sentence else []
    print("\n".join(lines + failed), file=sys.stderr)
    return bool(failed)


def this_command():
    """The command that runs this workflow, as its user typed it (near enough to paste)."""
    if sys.argv[0].endswith("__main__.py"):  # python -m snakemake
        return [os.path.relpath(sys.executable), "-m", "snakemake", *sys.argv[1:]]
    program = os.path.relpath(sys.argv[0]) if os.path.isabs(sys.argv[0]) else sys.argv[0]
    return [program if not program.startswith("..") else sys.argv[0], *sys.argv[1:]]


def newest_result():
    """When the newest train_summary.json or metrics.json of the sweep's runs was written."""
    found = [f"{RUN_DIR.format(run=run)}/{name}" for run in RUNS
             for name in ("train_summary.json", "metrics.json")]
    return max((os.path.getmtime(path) for path in found if os.path.exists(path)), default=0.0)
