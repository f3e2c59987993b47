# The dataset: generated (demo) or fetched and checked (coco2017), with its manifest.


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
