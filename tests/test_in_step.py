"""The exchange inside a step (pipeline/costmodel/in_step.py): each term that back-to-back
timing misses is recovered from made-up timings, the strategies' models use them, and the
report compares the predicted in-step communication like with like (the wait for the slowest
worker included where the strategy waits). The real 2-process measurement is in
tests/test_commbench.py."""
from __future__ import annotations

import math
import random
import statistics

import pandas as pd
import pytest

from pipeline.costmodel import in_step
from pipeline.costmodel.in_step import InStepTerms
from pipeline.costmodel.network import Link, Network
from pipeline.costmodel.predict import slowest_wait
from pipeline.strategies import lookup

from .test_costmodel import benches, summary, typed

LINK = Link(1e-3, 1e-9)  # back to back: 1 ms + 1 ns a byte


def made_up_compute(repeats: int, ranks: int, sd: float, seed: int = 0) -> list[list[float]]:
    rng = random.Random(seed)
    return [[0.4 + rng.gauss(0.0, sd) for _ in range(ranks)] for _ in range(repeats)]


def test_each_term_is_recovered_from_made_up_timings():
    # the wait: each repeat's mean rank waits max - c; exact on two repeats
    assert in_step.wait_of([[1.0, 1.01], [1.02, 1.0]]) == pytest.approx((0.01 + 0.02) / 4)
    # ... and slowest_wait's formula predicts it from the variance of compute (the check the
    # commbench stage makes on this machine's timings), here where compute is truly normal
    for ranks in (2, 4):
        compute = made_up_compute(4000, ranks, sd=0.02, seed=ranks)
        variance = in_step.variance_of(compute)
        assert variance == pytest.approx(0.02 ** 2, rel=0.06)
        assert in_step.wait_of(compute) == pytest.approx(slowest_wait(ranks, variance / 4, 4), rel=0.05)
        # a slowdown all processes share at once (another job) makes nobody wait: left out
        shared = [[c + 0.1 * (i % 3) for c in row] for i, row in enumerate(compute)]
        assert in_step.variance_of(shared) == pytest.approx(variance)
        assert in_step.wait_of(shared) == pytest.approx(in_step.wait_of(compute))
    # a fixed cost per message: exchange = its wait + the link's back to back + 2 x 0.7 ms
    compute = made_up_compute(15, 2, sd=0.03)
    link_s = 2 * LINK.seconds(4e6)
    exchange = [[max(row) - c + link_s + 2 * 0.7e-3 for c in row] for row in compute]
    assert in_step.fixed_cost_of(exchange, compute, link_s, messages=2) == pytest.approx(0.7e-3)
    # contention: a collective during compute took 3x its back-to-back seconds
    during = [3 * LINK.seconds(4e6) * f for f in (0.9, 1.0, 1.1, 1.0, 1.05)]
    assert in_step.contention_of(during, LINK.seconds(4e6)) == pytest.approx(3.0)
    assert math.isnan(in_step.contention_of([], 1.0)) and math.isnan(in_step.variance_of([[1.0], [2.0]]))


def test_a_term_the_timings_do_not_resolve_is_floored_and_said():
    """No term the cost model adds or multiplies is ever nan, infinite or negative: an exchange
    faster than its link's back-to-back seconds (noise) gives no fixed cost, not a negative
    one; a contention with nothing timed during compute is taken as none (x1); each says why."""
    from .test_costmodel import BUSY_SECONDS, BUSY_SIZES
    from pipeline.costmodel.network import fit

    compute = made_up_compute(15, 2, sd=0.03)
    exchange = [[max(row) - c for c in row] for row in compute]  # no link time at all
    measured = {"wait_s": in_step.wait_of(compute), "variance_s2": in_step.variance_of(compute),
                "alone_variance_s2": 0.0, "contention": in_step.contention_of([], 1.0),
                "bucket_s": in_step.fixed_cost_of(exchange, compute, 2e-3), "message_s": math.inf}
    assert measured["bucket_s"] < 0 and math.isnan(measured["contention"])
    kept, why = in_step.resolved(measured)
    assert (kept["bucket_s"], kept["contention"], kept["message_s"]) == (0.0, 1.0, 0.0)
    assert kept["wait_s"] == measured["wait_s"] and set(why) == {"bucket_s", "contention", "message_s"}
    assert why["contention"] == "not resolved (no timings to fit it from): taken as 1"
    assert why["bucket_s"].startswith("not resolved (it came out -0.002") and why["bucket_s"].endswith("taken as 0")
    # the busy machine's all-reduce fit (issue 64) gives a positive time: the contention is finite
    link_s = fit(BUSY_SIZES, BUSY_SECONDS).link.seconds(4e6)
    assert 0 < in_step.contention_of([3e-3, 4e-3], link_s) < math.inf


TERMS = InStepTerms(processes=2, images=4, wait_s=0.01, variance_s2=0.003, alone_variance_s2=0.001,
                    contention=3.0, bucket_s=2e-3, message_s=0.5e-3, buckets=[3e6, 1e6],
                    hook_s_per_byte={"none": 1e-10, "fp16": 5e-10, "bf16": 6e-10})


def test_ddp_pays_each_bucket_its_fixed_cost_and_the_overlapped_ones_contention():
    ddp = lookup("ddp")
    network = Network(intra=LINK, all_reduce=LINK, in_step=TERMS)
    plain, fp16 = ddp.filled(workers=2), ddp.filled(workers=2, comm_hook="fp16")
    # a long backward hides the first bucket, even 3x slower: the last one, and its fixed cost
    assert ddp.communication_seconds(plain, 4e6, network, 10.0) == pytest.approx(LINK.seconds(1e6) + 2e-3)
    # fp16 halves the bytes and adds its cast and copy back: (5 - 1) x 0.1 ns a byte of the bucket
    assert ddp.communication_seconds(fp16, 4e6, network, 10.0) == pytest.approx(
        LINK.seconds(0.5e6) + 2e-3 + 4e-10 * 1e6)
    # no backward to hide behind: the first bucket, 3x its back to back, is exposed too
    assert ddp.communication_seconds(plain, 4e6, network, 0.0) == pytest.approx(
        LINK.seconds(1e6) + 2e-3 + 3 * LINK.seconds(3e6) + 2e-3)
    # another model's gradients: its buckets unseen, the back-to-back model as before
    assert ddp.communication_seconds(plain, 8e6, network, 10.0) == pytest.approx(LINK.seconds(8e6))
    # a parameter server's messages each pay the fixed cost per message
    ps = lookup("ps")
    run = ps.filled(workers=2, placement="colocated", servers=1)
    assert ps.communication_seconds(run, 4e6, network, 0.0) - ps.communication_seconds(
        run, 4e6, Network(intra=LINK, all_reduce=LINK), 0.0) == pytest.approx(2 * 0.5e-3)


def test_the_in_step_prediction_is_compared_like_with_like():
    """What a run measures as communication holds the wait for the slower worker in a strategy
    that waits: the predicted in-step communication is the exchange the run times, plus the
    predicted wait; zero's broadcast counts as optimizer; a stale parameter server waits for
    nobody. The report shows each term and counts the runs within 1.5x."""
    from pipeline.report.prediction import communication_within, prediction_frame, section

    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)
    single["summary"]["timing_excludes_first_iterations"] = 0
    single["iterations"] = pd.DataFrame({"time_compute": [0.6, 1.0] * 10})
    ddp_run = summary("ddp", 2, 4, 1, 9.5, dict(split, communication=0.03), comm_hook="none")
    zero_run = summary("zero", 2, 4, 1, 9.5, dict(split, communication=0.2))
    stale = dict(summary("ps", 2, 4, 1, 9.5, dict(split, communication=0.01), placement="dedicated",
                         servers=1, staleness=1), run_id="ps-ssp")
    for run in (ddp_run, zero_run, stale):
        run["summary"]["ranks"] = [{"gradient_bytes": 4e6}]
    primitives = {name: {"alpha_s": LINK.alpha, "beta_s_per_byte": LINK.beta, "r2": 1.0,
                         "relative_residuals": [0.0], "bandwidth_gbit_s": 8.0}
                  for name in ("all_reduce", "send_recv", "broadcast")}
    terms = {**{k: getattr(TERMS, k) for k in ("processes", "images", "wait_s", "variance_s2",
                                               "alone_variance_s2", "contention", "bucket_s",
                                               "message_s", "buckets", "hook_s_per_byte")},
             "bucket_bytes": 1e6, "formula_wait_s": 0.012}
    shared = {"alone_s": 0.4, "together_s": 0.4, "factor": 1.0, "images": 4, "in_step": terms}
    commbench = benches({2: {"processes": 2, "backend": "gloo", "primitives": primitives,
                             "shared_compute": shared}})
    frame = prediction_frame(typed([single, ddp_run, zero_run, stale]), commbench).set_index("run_id")
    # the variance across the processes computing at once, commbench's, not single's alone
    # over its iterations (0.042 s² for 8 images, which would make the wait 2.6x)
    wait = slowest_wait(2, 0.003 / 4, 4)
    assert wait < slowest_wait(2, statistics.variance([0.6, 1.0] * 10) / 8, 4) / 2
    exchange = LINK.seconds(1e6) + 2e-3  # the last bucket after backward, its fixed cost
    ddp_row, zero_row = frame.loc["ddp-w2"], frame.loc["zero-w2"]
    assert ddp_row["predicted_communication_s"] == pytest.approx(exchange)
    assert ddp_row["predicted_in_step_communication_s"] == pytest.approx(exchange + wait)
    assert ddp_row["communication_ratio"] == pytest.approx((exchange + wait) / 0.03)
    assert zero_row["predicted_in_step_communication_s"] == pytest.approx(exchange + wait)
    assert zero_row["predicted_communication_s"] > exchange  # its broadcast, in the iteration
    ssp = frame.loc["ps-ssp"]
    assert ssp["predicted_in_step_communication_s"] == pytest.approx(ssp["predicted_communication_s"])
    within = sum(1 / 1.5 <= r <= 1.5 for r in frame["communication_ratio"])
    assert communication_within(frame.reset_index()) == (within, 3)  # one run an entry here
    text = " ".join(section(frame, frame.reset_index(), commbench)["text"])
    assert "the wait for the slower worker 10.0 ms measured" in text and "x3.00" in text
    assert "2.00 ms per DDP bucket" in text and "0.50 ms per point-to-point message" in text
    assert f"{within} of 3 multi-process entries with a timed communication" in text


def test_the_bound_is_judged_per_entry_over_its_seeds_and_its_workers():
    """A run's measured communication is the mean of its workers' own (the predicted wait is
    the mean worker's); an entry's, the median over its seeds, a seed whose speed is an
    outlier among them aside (the noise rule: it did not cost what its seeds cost)."""
    from pipeline.report.prediction import communication_by_entry, communication_within, prediction_frame

    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)
    seeds = []
    for seed, (speed, first, second) in enumerate([(9.5, 0.03, 0.01), (9.6, 0.012, 0.016), (5.0, 0.2, 0.2)]):
        run = summary("ddp", 2, 4, 1, speed, dict(split, communication=first), comm_hook="none")
        run["run_id"] = f"ddp-w2-s{seed}"
        run["summary"]["ranks"] = [
            {"rank": rank, "role": "worker", "gradient_bytes": 4e6,
             "time_split": dict(split, communication=value)}
            for rank, value in enumerate((first, second))]
        seeds.append(run)
    commbench = benches({2: {"processes": 2, "backend": "gloo", "primitives": {
        "all_reduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
        "send_recv": {"alpha_s": 1e-4, "beta_s_per_byte": 5e-10}}}})
    frame = prediction_frame(typed([single, *seeds]), commbench)
    by_run = frame.set_index("run_id")
    # each run: its workers' mean, not the first worker's own
    assert list(by_run["measured_communication_s"]) == pytest.approx([0.02, 0.014, 0.2])
    assert list(by_run["speed_outlier"]) == [False, False, True]  # 5.0 against 9.5 and 9.6
    (entry,) = communication_by_entry(frame).itertuples()
    assert entry.runs == 2 and entry.measured_communication_s == pytest.approx(0.017)
    predicted = by_run["predicted_in_step_communication_s"].iloc[0]
    assert entry.communication_ratio == pytest.approx(predicted / 0.017)
    assert communication_within(frame) == (int(1 / 1.5 <= predicted / 0.017 <= 1.5), 1)


def test_the_wait_follows_the_fitted_runs_jitter_not_their_drift():
    """The variance the wait is predicted from: one process's compute from one iteration to
    the next in the fitted runs of as many processes (half the variance of successive
    differences, per image). A slow drift every process shares makes nobody wait and is left
    out; a held-out entry's runs and fsdp's (its compute holds its gathers) are no input."""
    from pipeline.report.prediction import prediction_frame, process_jitter

    def alternating(step: float) -> list[float]:
        return [0.4 + (step if i % 2 else -step) for i in range(200)]

    def jitter(compute: list[float]) -> float:  # per image of a 4-image step
        return statistics.variance([b - a for a, b in zip(compute, compute[1:])]) / 2 / 4

    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)
    rng = random.Random(0)
    drifting = [c + 0.001 * i for i, c in enumerate(alternating(0.02))]  # a slow drift of 0.2 s
    computes = {"ddp": alternating(0.01), "zero": drifting, "fsdp": [0.4 + rng.gauss(0, 0.1) for _ in range(200)]}
    runs = {}
    for name, compute in computes.items():
        run = summary(name, 2, 4, 1, 9.5, dict(split, communication=0.01))
        run["summary"]["timing_excludes_first_iterations"] = 0
        run["summary"]["ranks"] = [{"gradient_bytes": 4e6}]
        run["iterations"] = pd.DataFrame({"time_compute": compute})
        runs[name] = run
    # the drift moves each successive difference by 1 ms, where it moves the variance 9x
    assert jitter(drifting) == pytest.approx(jitter(alternating(0.02)), rel=0.01)
    assert statistics.variance(drifting) > 9 * statistics.variance(alternating(0.02))
    pooled = statistics.fmean([jitter(computes["ddp"]), jitter(drifting)])  # fsdp's left out
    assert process_jitter(typed([single, *runs.values()])) == {2: pytest.approx(pooled)}
    commbench = benches({2: {"processes": 2, "backend": "gloo", "primitives": {
        "all_reduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
        "send_recv": {"alpha_s": 1e-4, "beta_s_per_byte": 5e-10}}}})

    def in_step(held_out=(), timed=True) -> dict[str, float]:
        fitted = [dict(runs[name], iterations=runs[name]["iterations"] if timed else None) for name in ("ddp", "zero")]
        frame = prediction_frame(typed([single, *fitted]), commbench, held_out=held_out)
        return dict(zip(frame["run_id"], frame["predicted_in_step_communication_s"]))

    exchange = in_step(timed=False)  # no iterations timed, no variance: no wait
    assert in_step()["ddp-w2"] - exchange["ddp-w2"] == pytest.approx(slowest_wait(2, pooled, 4))
    # zero held out: the model is fitted on ddp's run alone, and predicts zero's wait from it
    assert in_step({"zero-w2"})["zero-w2"] - exchange["zero-w2"] == pytest.approx(
        slowest_wait(2, jitter(computes["ddp"]), 4))
