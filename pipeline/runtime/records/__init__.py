"""The run records, typed: what a stage writes for another to read (train_summary.json and the
files beside it, commbench's and the equivalence check's files), as dataclasses read back as they
were written; the standard library only, no torch. One module per stage that writes them, beside
the machinery and the provenance that several of them carry:

    base.py         the machinery: Record (to_json, from_json, read), OpenRecord (a key it does
                    not declare kept as written), RecordError, declare_facts (a strategy's facts)
    provenance.py   Provenance, with its Hardware: where any stage's result came from
    training.py     RunSummary (train_summary.json): its RankReport per process and the parts
                    they hold; upgrade(), the one place that knows how older run folders differ
    evaluation.py   Evaluation (one during training), Metrics (RUN_DIR/metrics.json)
    commbench.py    CommbenchRecord (a commbench file): LinkFit per primitive, SharedCompute
                    with its InStep, Calibrations, each measurement's Check
    equivalence.py  EquivalenceRecord (the one-step check): a StepCheck per strategy, the
                    SplitDistance of each cause

Training builds a RunSummary (pipeline/training/summary.py), the launcher a skipped one
(pipeline/launch.py), and the report reads one (pipeline/report/load.py). They live on the
ground floor (runtime) because every layer that writes or reads a run, from training to the
report and the launcher, imports them; they import nothing of the pipeline but run.py.
"""
