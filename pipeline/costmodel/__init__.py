"""How long communication takes: the shared half of every strategy's cost model.

    network.py    links (latency, bandwidth), flows, and the busiest link of a phase
    bands.py      the bands of a quiet machine's measurements: outside, commbench repeats a
                  measurement, then marks it disturbed

The stage that times this machine's links and fits them is pipeline/commbench/.

Each strategy states its own messages (`Strategy.phases`, pipeline/strategies/); the report
turns them into predictions (pipeline/report/prediction.py, clusters.py).
"""
