# One training and one evaluation job per run of the sweep (RUNS), each asking for what its
# strategy needs (pipeline/resources.py).
from pipeline.training import identity

# Checkpoints no run of this sweep will resume (a run that left the sweep, or whose settings,
# code or data changed) are named before anything runs: kept, or replaced when the run restarts.
if workflow.is_main_process:
    for _line in identity.superseded(CFG, RUNS, os.path.dirname(RUN_DIR), tree.recorded(MANIFEST)):
        print(_line, file=sys.stderr)


rule train:
    message:
        purpose("{wildcards.run} -> {output.summary} (log: {log})")
    input:
        manifest=rules.data.output.manifest,
        code=run_code("train"),
    output:
        # Written last; model_final.pt beside it exists only for runs that were not skipped.
        summary=f"{RUN_DIR}/train_summary.json",
        iterations=f"{RUN_DIR}/iterations.jsonl",
    params:
        config=stage_params("train"),
        run=lambda wildcards: P.canonical(RUNS[wildcards.run].to_json()),
        python=PYTHON,
        out=lambda wildcards, output: os.path.dirname(output.summary),
    # Timings are the result: a training run has the machine (or its allocation) to itself.
    threads: cores_or(lambda wildcards: run_job(wildcards.run, "train")["cpus_per_task"])
    resources:
        **wired(lambda wildcards: run_job(wildcards.run, "train")),
    log:
        f"logs/train/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/train_{PRESET}_{{run}}.tsv"
    # --log, not `> {log}`: the launcher opens the log once it holds the run's lock, so a second
    # job refused on the same run (another Snakemake) does not empty the running job's log.
    shell:
        "exec {params.python} -m pipeline.launch --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} --log {log}"


rule evaluate:
    message:
        purpose("{wildcards.run} on the validation split -> {output.metrics} (log: {log})")
    input:
        manifest=rules.data.output.manifest,
        summary=rules.train.output.summary,
        code=run_code("evaluate"),
    output:
        metrics=f"{RUN_DIR}/metrics.json",
        predictions=f"{RUN_DIR}/predictions.json",
    params:
        config=stage_params("evaluate"),
        run=lambda wildcards: P.canonical(RUNS[wildcards.run].to_json()),
        out=lambda wildcards, output: os.path.dirname(output.metrics),
        python=PYTHON,
    threads: cores_or(lambda wildcards: run_job(wildcards.run, "evaluate")["cpus_per_task"])
    resources:
        **wired(lambda wildcards: run_job(wildcards.run, "evaluate")),
    log:
        f"logs/evaluate/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/evaluate_{PRESET}_{{run}}.tsv"
    shell:
        "exec {params.python} -m pipeline.launch --stage evaluate --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} --log {log}"
