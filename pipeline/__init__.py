"""The benchmark pipeline: a layer per folder, bottom to top (tests/test_layers.py), and the
stages that stand on all of them.

    runtime/       process plumbing: files, process groups, failures, provenance, the run record
    config/        params.yaml, what each stage reads of it, the stages' command lines
    costmodel/     the cost model (no torch): links, a strategy's predicted iteration, clusters,
                   and the bands of a quiet machine
    strategies/    the data-parallel strategies, one module each, and the sweep
    data/          the images and their boxes, to the batches a process trains on
    detection/     the detector and how it is scored
    training/      the one training loop and what it keeps
    measure/       measuring on a GPU: repeats and gaps (no torch), a profile's summary
    commbench/     the commbench stage: this machine's links and shared compute, measured
    report/        tables, figures, report and paper from the recorded runs
    launch.py      one training run (or the commbench stage) started the way its strategy (its
                   job) says, or why it cannot run here
    equivalence.py how far one step of each multi-worker strategy lands from `single`
    resources.py   what each workflow job asks a scheduler for
    whatif.py      the cost model asked about your own cluster: predicted images/s, efficiency
                   and memory per GPU of each strategy, ranked with their band (no torch)
    compare.py     two presets, or two revisions' results trees, side by side entry by entry,
                   with the noise rule's verdict (no torch)
"""
