"""How long communication takes: the shared half of every strategy's cost model.

    network.py    links (latency, bandwidth), flows, and the busiest link of a phase
    commbench.py  the stage that times this machine's links and fits them (alpha-beta)
    bands.py      the bands of a quiet machine's measurements: outside, commbench repeats a
                  measurement, then marks it disturbed

Each strategy states its own messages (`Strategy.phases`, pipeline/strategies/); the report
turns them into predictions (pipeline/report/prediction.py, clusters.py).
"""
