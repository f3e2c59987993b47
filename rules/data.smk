# The dataset: generated (demo) or fetched and checked (coco2017), with its manifest.
from pipeline.data import tree
from pipeline.runtime import files

# On the machine Snakemake runs on (a cluster's login node), never submitted: fetching needs
# the internet, which compute nodes often lack.
localrules:
    data,


# Data that changed since its manifest (images added or removed, annotations edited, a split
# gone) is checked again, and everything trained on it retrained: the tree is compared with the
# manifest's record of it (pipeline/data/tree.py) each time the workflow plans, and a difference
# is written to DATA_CHANGED, an input of the data rule, which so becomes newer than its output.
DATA_CHANGED = f"data/{DATA['name']}.changed.json"
_changed = workflow.is_main_process and tree.stale_manifest(DATA["root"], MANIFEST)
if _changed:
    files.write_json(DATA_CHANGED, {"root": DATA["root"], "changes": _changed[1],
                                    "files": _changed[0]})
    print(f"{DATA['root']} changed since {MANIFEST} ({'; '.join(_changed[1])}): the data stage "
          "checks it again, and every run trained on it trains again", file=sys.stderr)


rule data:
    input:
        code=code("data") + (["dvc.yaml"] if DATA["fetch"] else []),
        changed=[DATA_CHANGED] if os.path.exists(DATA_CHANGED) else [],
    output:
        manifest=MANIFEST,
    params:
        data=P.canonical(DATA),
        python=PYTHON,
    resources:
        **ONE_PROCESS,
    log:
        DATA_LOG,
    benchmark:
        f"logs/benchmarks/data_{DATA['name']}.tsv"
    shell:
        "{params.python} -m pipeline.data.prepare --config {params.data:q} --manifest {output.manifest}"
        " > {log} 2>&1"
