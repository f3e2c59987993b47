"""Measuring on a GPU, apart from training itself: what the GPU check (benchmarks/gpu_check.py)
and the report's noise checks read their figures with.

    stats.py      repeats of one configuration (median, 95 % interval, agreement) and a
                  configuration's gap to its reference; no torch, no pandas
    profile.py    a torch.profiler trace summarised: the device's busy share, the longest
                  host gaps and what the host ran in them, host-device syncs, the top kernels
    syncs.py      the ops of a step that make a GPU and its host wait for each other (data-
                  dependent shapes, reads to the host), counted on any machine, by source
"""
