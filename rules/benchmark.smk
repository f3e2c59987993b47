# What the report sets beside the runs: how far one step of each strategy lands from `single`
# (equivalence), and the machine's links at each process count the runs use (commbench, the
# cost model's input).


rule equivalence:
    message:
        purpose("one step of each strategy beside single's -> {output} (log: {log})")
    input:
        manifest=rules.data.output.manifest,
        code=code("equivalence"),
    output:
        EQUIVALENCE,
    params:
        config=stage_params("equivalence"),
        strategies=",".join(sweep.swept(CFG)),  # the set, not the sweep: new seeds rerun nothing
        norms=",".join(sweep.swept_norms(CFG)),  # both: the accuracy ablation's causes, measured
        python=PYTHON,
    threads: cores_or(lambda wildcards: equivalence_job()["cpus_per_task"])
    resources:
        **wired(lambda wildcards: equivalence_job()),
    log:
        f"logs/equivalence/{PRESET}.log",
    benchmark:
        f"logs/benchmarks/equivalence_{PRESET}.tsv"
    shell:
        "exec {params.python} -m pipeline.equivalence --config {params.config:q}"
        " --strategies {params.strategies} --norms {params.norms} --out {output} > {log} 2>&1"


rule commbench:
    message:
        purpose("the links between {wildcards.processes} processes, timed -> {output} (log: {log})")
    input:
        code=code("commbench"),
    output:
        COMMBENCH_FILE,
    params:
        config=stage_params("commbench"),
        python=PYTHON,
    # Timings are the result: the job has the machine (or its allocation) to itself.
    threads: cores_or(lambda wildcards: int(wildcards.processes))
    resources:
        **wired(lambda wildcards: commbench_job(wildcards.processes)),
    log:
        f"logs/commbench/{PRESET}/p{{processes}}.log",
    benchmark:
        f"logs/benchmarks/commbench_{PRESET}_p{{processes}}.tsv"
    # started like a training run: pipeline/launch.py becomes its torchrun (commbench/job.py)
    shell:
        "exec {params.python} -m pipeline.launch --stage commbench --processes {wildcards.processes}"
        " --config {params.config:q} --out {output} --log {log}"
