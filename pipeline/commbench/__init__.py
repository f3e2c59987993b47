"""The commbench stage: how this machine's links and shared compute measure, for the cost model
(pipeline/costmodel/), one job per process count the sweep runs.

    __main__.py        the stage: times, checks against bands, writes the JSON
    links.py           send/recv, all-reduce and broadcast timed over message sizes, and fitted
    shared_compute.py  the model's step timed alone and with every process at once, and as a
                       strategy that asks for it wraps it (`Strategy.calibrate`)
    in_step.py         what a strategy exchanges, during and after each of those steps
                       together: the terms inside a step (costmodel/in_step.py fits them)
    job.py             the job's processes, GPUs and launcher, without torch (resources, launch)

Started through pipeline/launch.py (`--stage commbench`) as a training run is.
"""
