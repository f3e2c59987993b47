"""Data-parallel Faster R-CNN benchmark: data -> train (one job per sweep entry) -> evaluate -> report.

    snakemake --cores all                              # the demo preset (embedded data, CPU)
    snakemake --cores all --config preset=coco2017     # the published recipe

Every value a rule depends on is passed as its `params`, and the pipeline/ modules it imports
are declared as its inputs, so Snakemake reruns exactly the stages a change affects.
"""
import os
import re
from pathlib import Path
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from pipeline import params as P

min_version("9.0")


configfile: "params.yaml"


try:
    CFG = P.resolve(config)
except P.ParamsError as error:
    raise WorkflowError(str(error))

PYTHON = sys.executable  # the interpreter running Snakemake has the locked environment
PRESET = CFG["preset"]
DATA = CFG["data"]
RUNS = P.runs(CFG)
RUN_DIR = f"results/runs/{PRESET}/{{run}}"
MANIFEST = f"data/{DATA['name']}.manifest.json"
REPORT = "results/report"

# Snakemake tracks a rule's own code, not what it imports: each stage lists its modules.
COMMON = ["pipeline/files.py", "pipeline/provenance.py"]
CODE = {
    "data": COMMON
    + ["pipeline/prepare.py", "pipeline/synthetic.py", "pipeline/dataset.py"]
    + (["pipeline/coco_fetch.py", "dvc.yaml"] if DATA["fetch"] else []),
    "train": COMMON
    + ["pipeline/launch.py", "pipeline/train.py", "pipeline/model.py", "pipeline/dataset.py"]
    + ["pipeline/sampler.py"]
    + sorted(str(p) for p in Path("pipeline/strategies").glob("*.py")),
    "evaluate": COMMON
    + ["pipeline/launch.py", "pipeline/evaluate.py", "pipeline/model.py", "pipeline/dataset.py"]
    + ["pipeline/strategies/base.py", "pipeline/strategies/ddp.py"],
    "report": COMMON + ["pipeline/report.py"],
}


# Every rule runs in the locked environment: the image built from the Dockerfile. Snakemake uses
# it with --software-deployment-method apptainer (push the image and set BENCH_IMAGE to it);
# plain runs use the environment Snakemake itself runs in.
container: os.environ.get("BENCH_IMAGE", "docker://frcnn-dp-bench:latest")


wildcard_constraints:
    run="|".join(re.escape(run) for run in RUNS),


rule all:
    input:
        "results/summary.csv",
        f"{REPORT}/report.html",


rule data:
    input:
        code=CODE["data"],
    output:
        manifest=MANIFEST,
    params:
        data=P.canonical(DATA),
        python=PYTHON,
    log:
        f"logs/data/{DATA['name']}.log",
    benchmark:
        f"logs/benchmarks/data_{DATA['name']}.tsv"
    shell:
        "{params.python} -m pipeline.prepare --config {params.data:q} --manifest {output.manifest}"
        " > {log} 2>&1"


rule train:
    input:
        manifest=MANIFEST,
        code=CODE["train"],
    output:
        # Written last; model_final.pt beside it exists only for runs that were not skipped.
        summary=f"{RUN_DIR}/train_summary.json",
        iterations=f"{RUN_DIR}/iterations.jsonl",
    params:
        config=P.canonical({k: CFG[k] for k in ("data", "model", "train", "parallel")}),
        run=lambda wildcards: P.canonical(RUNS[wildcards.run]),
        python=PYTHON,
        out=lambda wildcards, output: os.path.dirname(output.summary),
    threads: workflow.cores
    log:
        f"logs/train/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/train_{PRESET}_{{run}}.tsv"
    shell:
        "{params.python} -m pipeline.launch --config {params.config:q} --entry {params.run:q}"
        " --out {params.out} > {log} 2>&1"


rule evaluate:
    input:
        manifest=MANIFEST,
        summary=rules.train.output.summary,
        code=CODE["evaluate"],
    output:
        metrics=f"{RUN_DIR}/metrics.json",
        predictions=f"{RUN_DIR}/predictions.json",
    params:
        config=P.canonical({k: CFG[k] for k in ("data", "model", "parallel", "eval")}),
        run=lambda wildcards: P.canonical(RUNS[wildcards.run]),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        python=PYTHON,
    threads: workflow.cores
    log:
        f"logs/evaluate/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/evaluate_{PRESET}_{{run}}.tsv"
    shell:
        "{params.python} -m pipeline.launch --stage evaluate --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} > {log} 2>&1"


rule equivalence:
    input:
        manifest=MANIFEST,
        code=CODE["train"] + ["pipeline/equivalence.py"],
    output:
        "results/equivalence.json",
    params:
        config=P.canonical({k: CFG[k] for k in ("data", "model", "train", "parallel")}),
        python=PYTHON,
    threads: workflow.cores
    log:
        "logs/equivalence.log",
    benchmark:
        "logs/benchmarks/equivalence.tsv"
    shell:
        "{params.python} -m pipeline.equivalence --config {params.config:q} --out {output} > {log} 2>&1"


rule report:
    input:
        equivalence=rules.equivalence.output[0],
        summaries=expand(rules.train.output.summary, run=RUNS),
        metrics=expand(rules.evaluate.output.metrics, run=RUNS),
        code=CODE["report"],
    output:
        summary="results/summary.csv",
        html=f"{REPORT}/report.html",
        markdown=f"{REPORT}/report.md",
        tables=expand(f"{REPORT}/table{{n}}.{{ext}}", n=[1, 2], ext=["md", "csv", "tex"]),
    params:
        report=P.canonical(CFG["report"]),
        preset=PRESET,
        runs=expand(RUN_DIR, run=RUNS),
        out=lambda wildcards, output: os.path.dirname(output.html),
        python=PYTHON,
    log:
        "logs/report.log",
    benchmark:
        "logs/benchmarks/report.tsv"
    shell:
        "{params.python} -m pipeline.report --report-config {params.report:q} --preset {params.preset}"
        " --summary {output.summary} --equivalence {input.equivalence} --out-dir {params.out}"
        " {params.runs} > {log} 2>&1"
