# The report (tables, figures, the HTML page) from every run, and the paper from the report.
from pipeline.report.build import FILES as REPORT_FILES
from pipeline.report.build import TABLE_CAPTIONS, TABLES
from pipeline.report.figures import FIGURES


rule report:
    message:
        purpose(f"{len(RUNS)} runs -> {{output.html}} (log: {{log}})")
    input:
        equivalence=rules.equivalence.output[0],
        commbench=expand(rules.commbench.output[0], processes=COMMBENCH),
        compute_runs=compute_runs,
        summaries=expand(rules.train.output.summary, run=RUNS),
        metrics=expand(rules.evaluate.output.metrics, run=RUNS),
        code=code("report"),
    output:
        summary=SUMMARY,
        # report(): also in Snakemake's own report (snakemake --report), with the tables and
        # figures, each with its caption (rules/captions/, rendered with the params below)
        html=report(f"{REPORT}/report.html", caption="captions/report.rst", category="Report"),
        files=expand(f"{REPORT}/{{name}}", name=[f for f in REPORT_FILES if f != "report.html"]),
        tables=report(expand(f"{REPORT}/{{name}}.csv", name=TABLES), caption="captions/tables.rst",
                      category="Tables"),
        tables_other=expand(f"{REPORT}/{{name}}.{{ext}}", name=TABLES, ext=["md", "tex"]),
        # paper/paper.tex inputs numbers.tex, figures.tex, the .tex tables and the figures
        figures=report(expand(f"{REPORT}/figures/{{name}}.{{ext}}", name=FIGURES,
                              ext=CFG.report.figure_formats), caption="captions/figures.rst",
                       category="Figures"),
    params:
        report=P.canonical(CFG.report.model_dump()),
        preset=PRESET,
        runs=expand(RUN_DIR, run=RUNS),
        commbench=lambda wildcards, input: " ".join(f"--commbench {f}" for f in input.commbench),
        # the entries the cost model is fitted without, then predicts (`held_out: true`): a
        # param, so toggling one reruns the report and no training
        held_out=" ".join(f"--held-out {entry}" for entry in sweep.held_out(CFG)),
        # the run directories of the summaries compute_runs found (rules/common.smk)
        compute_runs=lambda wildcards, input: " ".join(
            f"--compute-run {os.path.dirname(f)}" for f in input.compute_runs),
        out=lambda wildcards, output: os.path.dirname(output.html),
        python=PYTHON,
        # what the captions of Snakemake's report say of each figure and table
        figure_captions={name: entry.caption for name, entry in FIGURES.items()},
        table_captions=TABLE_CAPTIONS,
    resources:
        **ONE_PROCESS,
    log:
        f"logs/report/{PRESET}.log",
    benchmark:
        f"logs/benchmarks/report_{PRESET}.tsv"
    shell:
        "{params.python} -m pipeline.report --report-config {params.report:q} --preset {params.preset}"
        " --summary {output.summary} --equivalence {input.equivalence} --out-dir {params.out}"
        " {params.commbench} {params.compute_runs} {params.held_out} {params.runs} > {log} 2>&1"


rule paper:
    message:
        purpose("compiled from the report -> {output} (log: {log})")
    input:
        rules.report.output,
        html=rules.report.output.html,
        source="paper/paper.tex",
        bibliography="paper/references.bib",
        code=code("paper"),
    output:
        report(PAPER, caption="captions/paper.rst", category="Paper"),
    params:
        python=PYTHON,
        report=lambda wildcards, input: os.path.dirname(input.html),
    resources:
        **ONE_PROCESS,
    log:
        f"logs/paper/{PRESET}.log",
    benchmark:
        f"logs/benchmarks/paper_{PRESET}.tsv"
    shell:
        "{params.python} -m pipeline.report.paper --source {input.source} --report-dir {params.report}"
        " --out {output} > {log} 2>&1"
