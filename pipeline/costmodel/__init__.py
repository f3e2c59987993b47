"""The cost model, in one place and without torch: how long a strategy's iteration takes on a
network, from compute measured elsewhere.

    network.py    links (latency, bandwidth) and their fit, flows, the network that places a
                  job's processes and times a phase by its busiest link (one host's, as a
                  commbench JSON measured it, or a cluster's)
    collectives.py  all-reduce, all-gather and reduce-scatter: on one host the ring of flows
                  measured there, on a cluster NCCL's ring or tree in closed form, its choice named
    in_step.py    the exchange inside a step: the wait for the slower worker, contention with
                  compute, the fixed costs per bucket and per message, fitted from commbench's
                  timings of a step's exchanges
    predict.py    a predicted iteration of one strategy (passed in: its spec), the wait for
                  the slowest worker, a predicted point on a cluster, where a strategy saturates
    clusters.py   the hypothetical clusters of report.predict or a user's cluster file (checked),
                  and one GPU's compute (a fixed cost per step plus a cost per image, fitted)
    plan.py       a preset's recipe on a cluster: hours, GPU-hours, cost, memory that fits
    ranking.py    the uncertainty band of a predicted images/s (the model's predicted/measured
                  on a finished preset) and the ranking of strategies it tells apart
    bands.py      the bands of a quiet machine's measurements: outside, commbench repeats a
                  measurement, then marks it disturbed

Each strategy states its own messages (`Strategy.phases`, pipeline/strategies/). The stage that
times this machine's links is pipeline/commbench/; the report makes frames, tables and
sentences of the predictions (pipeline/report/prediction.py, clusters.py); the what-if command
(pipeline/whatif.py) asks it about a user's own cluster.
"""
