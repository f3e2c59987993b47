"""Data-parallel Faster R-CNN benchmark: data -> train (one job per run) -> evaluate -> report -> paper,
with commbench (the machine's links, one job per process count) feeding the report's cost model.

    snakemake --cores all                              # the demo preset (embedded data, CPU)
    snakemake --cores all --config preset=coco2017     # the published recipe
    snakemake --profile profiles/slurm                 # every job submitted to SLURM (README)

Every value a rule depends on is passed as its `params` (the config sections pipeline/config/stages.py
lists for its stage), and the source files its module executes, derived from its imports, are
declared as its inputs, so Snakemake reruns exactly the stages a change affects.

This file resolves the config and names the targets; the rules are in rules/*.smk (common.smk:
the constants and helpers the others use), and what each job asks a scheduler for is
pipeline/resources.py's.
"""
import os
import re
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from pipeline.config import params as P
from pipeline.runtime import stale_locks
from pipeline.strategies import sweep

min_version("9.0")


# params.yaml and each --configfile overlay, read strictly before Snakemake reads them: a YAML
# mistake or a key given twice is named with its file, line and column; and the command line's
# --config takes only preset=NAME and set='KEY=VALUE; ...' (pipeline/config/params.py).
OVERLAYS = [os.path.relpath(path) for path in workflow.config_settings.configfiles]
try:
    _BUILTIN = P.load("params.yaml")
    for _path in OVERLAYS:  # each may add presets, never redefine params.yaml's
        P.check_overlay(P.load(_path), _path, _BUILTIN)
    P.check_command_line(workflow.config_settings.config)
except P.ParamsError as error:
    raise WorkflowError(str(error))


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
    SOURCE = " + ".join(["params.yaml", *OVERLAYS])
    CFG = P.resolve(config, SOURCE)
    RUNS = sweep.runs(CFG, SOURCE)
except P.ParamsError as error:
    raise WorkflowError(str(error))


# Every rule runs in the locked environment: the image built from the Dockerfile. Snakemake uses
# it with --software-deployment-method apptainer (push the image and set BENCH_IMAGE to it);
# plain runs use the environment Snakemake itself runs in.
container: os.environ.get("BENCH_IMAGE", "docker://frcnn-dp-bench:latest")


wildcard_constraints:
    run="|".join(re.escape(run) for run in RUNS),
    processes=r"\d+",


# In this order: a rule file refers to the outputs of the rules before it (rules.<name>.output).
include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/train.smk"
include: "rules/benchmark.smk"
include: "rules/report.smk"


# The last lines of a run (on a cluster, where each job's progress is in its log under
# logs/train/): runs trained, skipped or failed with their reasons, where the report and the
# paper are, and the answer's first sentence.
onsuccess:
    if last_words(succeeded=True):  # a run failed for good: said last, and in the exit status
        sys.exit(1)


onerror:
    last_words(succeeded=False)


rule all:
    message:
        purpose(f"every result of preset {PRESET} (each run's and the report's)")
    input:
        rules.report.output.summary,
        rules.report.output.html,
        [] if MISSING_TEX else rules.paper.output,
        # Each run's own results too: a deleted run directory (or a run killed after its
        # old outputs were removed) is noticed and made again; with only the report asked
        # for, Snakemake sees the report up to date and does nothing.
        expand(rules.train.output, run=RUNS),
        expand(rules.evaluate.output, run=RUNS),
    # The target of a plain `snakemake`, though defined after the rules it names.
    default_target: True
