# One training and one evaluation job per run of the sweep (RUNS), each asking for what its
# strategy needs (pipeline/resources.py).


rule train:
    input:
        manifest=rules.data.output.manifest,
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
    threads: cores_or(lambda wildcards: run_job(wildcards.run, "train")["cpus_per_task"])
    resources:
        **wired(lambda wildcards: run_job(wildcards.run, "train")),
    log:
        f"logs/train/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/train_{PRESET}_{{run}}.tsv"
    shell:
        "exec {params.python} -m pipeline.launch --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} > {log} 2>&1"


rule evaluate:
    input:
        manifest=rules.data.output.manifest,
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
    threads: cores_or(lambda wildcards: run_job(wildcards.run, "evaluate")["cpus_per_task"])
    resources:
        **wired(lambda wildcards: run_job(wildcards.run, "evaluate")),
    log:
        f"logs/evaluate/{PRESET}/{{run}}.log",
    benchmark:
        f"logs/benchmarks/evaluate_{PRESET}_{{run}}.tsv"
    shell:
        "exec {params.python} -m pipeline.launch --stage evaluate --config {params.config:q}"
        " --entry {params.run:q} --out {params.out} > {log} 2>&1"
