"""The benchmark pipeline: a layer per folder, bottom to top (tests/test_layers.py), and the
stages that stand on all of them.

    runtime/       process plumbing: files, process groups, failures, provenance, the run record
    config/        params.yaml, what each stage reads of it, the stages' command lines
    costmodel/     how long communication takes, and the bands of a quiet machine
    strategies/    the data-parallel strategies, one module each, and the sweep
    data/          the images and their boxes, to the batches a process trains on
    detection/     the detector and how it is scored
    training/      the one training loop and what it keeps
    report/        tables, figures, report and paper from the recorded runs
    launch.py      one training run started the way its strategy says, or why it cannot run here
    commbench.py   the commbench stage: this machine's links and shared compute, measured
    equivalence.py how far one step of each multi-worker strategy lands from `single`
    resources.py   what each workflow job asks a scheduler for
"""
