# The dataset: generated (demo) or fetched and checked (coco2017), with its manifest.
from pipeline.data import tree
from pipeline.runtime import files

# On the machine Snakemake runs on (a cluster's login node), never submitted: fetching needs
# the internet, which compute nodes often lack.
localrules:
    data,


# Data that changed since its manifest (images added or removed, annotations edited, a split
# gone) is checked again, and everything trained on it retrained: the tree is compared with the
# manifest's record of it (pipeline/data/tree.py) each time the workflow plans, and the outcome is
# the data rule's `tree` param, which Snakemake reruns the rule on when it differs from the one
# the manifest was made with. Nothing is written while planning (`-n` included).
DATA_PLAN = tree.plan(DATA.root, MANIFEST)
if DATA_PLAN.changes and workflow.is_main_process:
    # A tree the pipeline made is not replaced while it differs from what it wrote (the data
    # stage refuses it, naming the files, pipeline/runtime/files.py): say so here, as it will.
    _edits = files.made_by_pipeline(DATA.root) and files.edits(DATA.root)
    _then = (f"the data stage refuses it, untouched, as it was made by this pipeline and is not as "
             f"written ({_edits}): {files.EDITED_REMEDY}" if _edits else
             "the data stage checks it again, and every run trained on it trains again")
    print(f"{DATA.root} changed since {MANIFEST} ({'; '.join(DATA_PLAN.changes)}): {_then}",
          file=sys.stderr)


rule data:
    message:
        purpose(f"the {DATA.name} data, prepared and checked -> {{output.manifest}} (log: {{log}})")
    input:
        code=code("data") + (["dvc.yaml"] if DATA.fetch else []),
    output:
        manifest=MANIFEST,
    params:
        data=P.canonical(DATA.model_dump()),
        tree=DATA_PLAN.state,
        python=PYTHON,
    resources:
        **ONE_PROCESS,
    log:
        DATA_LOG,
    benchmark:
        f"logs/benchmarks/data_{DATA.name}.tsv"
    shell:
        "{params.python} -m pipeline.data.prepare --config {params.data:q} --manifest {output.manifest}"
        " --tree-state={params.tree:q}"
        " > {log} 2>&1"
