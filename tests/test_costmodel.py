"""The cost model's closed forms (each strategy's own) and the latency/bandwidth fit."""
from __future__ import annotations

import math
import random

import pytest
import torch
from pipeline.costmodel.collectives import Collective, as_flows, flows, on_cluster, ring, tree
from pipeline.costmodel.collectives import ports as collective_ports
from pipeline.costmodel.network import Link, Network, busiest_seconds, fit, link_loads
from pipeline.costmodel.predict import Iteration
from pipeline.report.load import RunDir
from pipeline.runtime.records.commbench import CommbenchRecord
from pipeline.runtime.records.training import RunSummary
from pipeline.strategies import STRATEGIES, Run

M = 100e6  # bytes of gradients
DDP, PS, DP = STRATEGIES["ddp"], STRATEGIES["ps"], STRATEGIES["dp"]


def ddp(n: int, hook: str = "none") -> Run:
    return DDP.filled(workers=n, comm_hook=hook)


def ps(n: int, placement: str, servers: int = 1) -> Run:
    return PS.filled(workers=n, placement=placement, servers=servers)


@pytest.mark.parametrize("n", [2, 3, 8, 256])
def test_ring_all_reduce_moves_2_n_minus_1_over_n(n):
    assert DDP.link_bytes(ddp(n), M)["worker"] == pytest.approx(2 * (n - 1) / n * M)
    assert DDP.link_bytes(ddp(n, "bf16"), M)["worker"] == pytest.approx((n - 1) / n * M)


@pytest.mark.parametrize("n", [2, 3, 8, 256])
def test_sharded_strategies_bytes_and_memory_closed_forms(n):
    zero, fsdp = STRATEGIES["zero"], STRATEGIES["fsdp"]
    # ZeRO-1 on DDP: the all-reduce, then the updated weights' broadcast, (N-1)/N M
    assert zero.link_bytes(zero.filled(workers=n), M)["worker"] == pytest.approx(3 * (n - 1) / n * M)
    # FSDP: all-gather in forward (and in backward when resharding), reduce-scatter
    reshard, keep = (fsdp.filled(workers=n, reshard_after_forward=r) for r in (True, False))
    assert fsdp.link_bytes(reshard, M)["worker"] == pytest.approx(3 * (n - 1) / n * M)
    assert fsdp.link_bytes(keep, M)["worker"] == pytest.approx(2 * (n - 1) / n * M)
    # What the busiest process holds: DDP 3M; ZeRO-1 2M + M/N; FSDP 3M/N
    assert sum(DDP.memory_theory(ddp(n), M).values()) == 3 * M
    assert sum(zero.memory_theory(zero.filled(workers=n), M).values()) == pytest.approx(2 * M + M / n)
    assert sum(fsdp.memory_theory(reshard, M).values()) == pytest.approx(3 * M / n)
    assert sum(PS.memory_theory(ps(n, "colocated", 2), M).values()) == pytest.approx(2.5 * M)


def test_parameter_server_closed_forms():
    n = 8
    assert PS.link_bytes(ps(n, "dedicated"), M)["worker"] == M  # 2M a worker: M each way
    assert PS.link_bytes(ps(n, "colocated"), M)["busiest"] == pytest.approx((n - 1) * M)  # 2(N-1)M
    for k in (1, 2, 4, 8):
        assert PS.link_bytes(ps(n, "dedicated", k), M)["busiest"] == pytest.approx(max(M, n * M / k))
    assert DP.link_bytes(DP.filled(workers=n), M)["busiest"] == pytest.approx((n - 1) * M)


@pytest.mark.parametrize("n", range(2, 33))
def test_without_extra_machines_no_ps_beats_ring_on_its_busiest_link(n):
    ring = DDP.link_bytes(ddp(n), M)["busiest"]
    for k in range(1, n + 1):
        assert PS.link_bytes(ps(n, "colocated", k), M)["busiest"] >= ring * (1 - 1e-12)
    # ... and K = N colocated shards is ring all-reduce's traffic exactly (BytePS's caveat)
    assert PS.link_bytes(ps(n, "colocated", n), M)["busiest"] == pytest.approx(ring)


@pytest.mark.parametrize("n", range(3, 33))
def test_k_at_least_n_dedicated_servers_beat_ring_on_every_worker_link(n):
    ring = DDP.link_bytes(ddp(n), M)["worker"]
    for k in (n, 2 * n):
        moved = PS.link_bytes(ps(n, "dedicated", k), M)
        assert moved["worker"] < ring and moved["busiest"] <= moved["worker"]
    assert PS.link_bytes(ps(2, "dedicated", 2), M)["worker"] == DDP.link_bytes(ddp(2), M)["worker"]  # N = 2: equal


def test_communication_seconds():
    link = Link.from_bandwidth(gbit_per_s=100, latency_us=5)
    assert link.beta == pytest.approx(8e-11) and link.seconds(0) == 0.0
    links = Network(intra=link)
    # DDP: with a long backward only the last bucket shows; with none, all of them
    hidden, exposed = (DDP.communication_seconds(ddp(8), M, links, backward) for backward in (10.0, 0.0))
    assert hidden < exposed and exposed == pytest.approx(4 * hidden)  # 100 MB: 4 buckets of 25 MiB
    assert DDP.communication_seconds(ddp(1), M, links, 0.0) == 0.0
    # One parameter server slows down with every worker; N dedicated shards do not
    one = [PS.communication_seconds(ps(n, "colocated"), M, links, 0.0) for n in (2, 4, 8)]
    assert one[0] < one[1] < one[2]
    sharded = [PS.communication_seconds(ps(n, "dedicated", n), M, links, 0.0) for n in (2, 4, 8)]
    assert sharded[2] == pytest.approx(sharded[0], rel=1e-2)  # only N messages' latency grows
    # Where all-reduce itself was measured, DDP takes its time per bucket from that fit
    measured = Network(intra=link, all_reduce=Link(alpha=1e-3, beta=1e-9))
    assert DDP.communication_seconds(ddp(2), M, measured, 0.0) == pytest.approx(4 * (1e-3 + 1e-9 * M / 4))
    it = Iteration(compute=0.5, data=0.1, optimizer=0.05, communication=0.35, images=16)
    assert it.seconds == pytest.approx(1.0) and it.images_per_second == pytest.approx(16)


def test_the_fit_recovers_latency_and_bandwidth_within_5_percent():
    truth = Link(alpha=40e-6, beta=1 / 2.5e9)
    rng = random.Random(0)
    sizes = [4096 * 2 ** i for i in range(15)]  # 4 KiB .. 64 MiB
    timings = [truth.seconds(s) * rng.uniform(0.98, 1.02) for s in sizes]
    found = fit(sizes, timings)
    assert found.link.alpha == pytest.approx(truth.alpha, rel=0.05)
    assert found.link.beta == pytest.approx(truth.beta, rel=0.05)
    assert found.worst_relative_residual < 0.05 and found.r2 > 0.99
    with pytest.raises(ValueError, match="2 or more message sizes"):
        fit([4096, 4096], [1e-5, 1e-5])


# Seven timings from a busy machine (issue 64): the larger messages were no slower
BUSY_SIZES = [4096 * 2**i for i in range(7)]  # 4 KiB .. 256 KiB
BUSY_SECONDS = [2.0e-3, 1.9e-3, 2.1e-3, 1.8e-3, 1.7e-3, 1.75e-3, 1.6e-3]


def test_a_busy_machines_fit_is_non_negative_and_says_what_it_did_not_resolve():
    """An unconstrained fit of these timings gave beta = -1.36e-09 s/byte, and 64 MiB took
    -0.089 s; the bounded fit keeps the slope at 0, says so, and every time it predicts is > 0."""
    from pipeline.costmodel.network import NO_BANDWIDTH, NO_LATENCY

    found = fit(BUSY_SIZES, BUSY_SECONDS)
    assert found.link.beta == 0 and 1.6e-3 < found.link.alpha < 2.1e-3
    assert found.untrusted == NO_BANDWIDTH
    assert found.link.seconds(64 * 2**20) == pytest.approx(found.link.alpha)
    # a link whose smallest messages are no slower than their bytes: latency at its bound
    assert fit([1e6, 2e6, 4e6], [0.5e-3, 2e-3, 4e-3]).untrusted == NO_LATENCY
    rng = random.Random(1)
    for _ in range(300):  # any disturbance: both terms non-negative and finite, every time > 0
        timings = [rng.uniform(1e-5, 1e-2) for _ in BUSY_SIZES]
        link = fit(BUSY_SIZES, timings).link
        assert link.alpha >= 0 and link.beta >= 0 and math.isfinite(link.alpha + link.beta)
        assert all(0 < link.seconds(n) < math.inf for n in (1, 2**20, 2**30))
    for bad in ([1e-3, 0.0], [1e-3, math.nan], [1e-3, -1e-3]):
        with pytest.raises(ValueError, match="positive, finite sizes and seconds"):
            fit([4096, 8192], bad)


def test_the_report_words_an_unresolved_fit():
    from pipeline.report.prediction import link_rows

    found = fit(BUSY_SIZES, BUSY_SECONDS)
    primitive = {"alpha_s": found.link.alpha, "beta_s_per_byte": found.link.beta, "bandwidth_gbit_s": None,
                 "r2": found.r2, "relative_residuals": found.residuals, "untrusted": found.untrusted}
    [row] = link_rows(benches({2: {"processes": 2, "backend": "gloo", "primitives": {"all_reduce": primitive}}}))
    assert "no bandwidth resolved" in row and row.endswith(f"not trusted: {found.untrusted}")


def test_shards_are_whole_tensors_balanced_by_bytes():
    from pipeline.strategies.ps import balanced_shards

    # 10 -> 0, 7 -> 1, 5 -> 1 (7 < 10), 3 -> 0 (10 < 12), 1 -> 1 (12 < 13); ties take the lower
    assert balanced_shards([10, 7, 5, 3, 1], 2) == [0, 1, 1, 0, 1]
    assert balanced_shards([5, 5], 2) == [0, 1] and balanced_shards([5, 3, 2], 2) == [0, 1, 1]
    assert balanced_shards([4, 4, 4], 1) == [0, 0, 0]
    sizes = [random.Random(1).randint(1, 10**6) for _ in range(60)]
    owner = balanced_shards(sizes, 4)
    loads = [sum(s for s, o in zip(sizes, owner) if o == k) for k in range(4)]
    assert max(loads) - min(loads) <= max(sizes)  # within one tensor of each other


def summary(strategy: str, workers: int, per_worker: int, threads: int, images_per_second: float,
            split: dict, **run) -> dict:
    return {"run_id": f"{strategy}-w{workers}", "entry": f"{strategy}-w{workers}", "status": "ok",
            "summary": {"strategy": strategy, "workers": workers, "processes": workers,
                        "images_per_worker": per_worker, "global_batch": per_worker * workers,
                        "threads": threads, "device": "cpu", "data_mode": "real",
                        "images_per_second": images_per_second, "time_split": split,
                        "ranks": [{"gradient_bytes": 10e6}],
                        "provenance": {"run": {"strategy": strategy, "workers": workers, **run}}}}


def typed(runs: list[dict]) -> list[RunDir]:
    """summary()'s runs (changed by a test) as the report reads run directories."""
    return [RunDir(RunSummary.from_json({"run_id": r["run_id"], "entry": r["entry"], **r["summary"]}),
                   r["status"], iterations=r.get("iterations")) for r in runs]


def benches(commbench: dict[int, dict]) -> dict[int, CommbenchRecord]:
    """Commbench JSON objects (process count -> object) as the report reads their files."""
    return {n: CommbenchRecord.from_json(found) for n, found in commbench.items()}


def test_every_multi_process_run_is_predicted_and_a_miss_is_flagged():
    from pipeline.report.prediction import prediction_frame

    single = summary("single", 1, 8, 2, 10.0, {"compute": 0.8, "data": 0.02, "optimizer": 0.01,
                                               "communication": 0.0})
    near = summary("ddp", 2, 4, 1, 9.5, {"compute": 0.7, "data": 0.02, "optimizer": 0.02,
                                          "communication": 0.01}, comm_hook="none")
    far = dict(near, run_id="ddp-far", summary=dict(near["summary"], images_per_second=20.0))
    commbench = {2: {"processes": 2, "backend": "gloo", "primitives": {
        "all_reduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
        "send_recv": {"alpha_s": 1e-4, "beta_s_per_byte": 5e-10}}}}
    frame = prediction_frame(typed([single, near, far]), benches(commbench))
    assert list(frame["run_id"]) == ["ddp-w2", "ddp-far"]  # single is the input, not predicted
    # single: 0.1 s compute and 0.0025 s data per image at 2 threads; ddp's processes have 1:
    # 4 images x 0.1 x 2 (scaled by threads) = 0.8 s compute, 0.02 optimizer (scaled), 4 x
    # 0.0025 = 0.01 data wait (not scaled: the loader's), one 10 MB all-reduce bucket
    communication = 1e-3 + 1e-9 * 10e6
    seconds = 0.8 + 0.01 + 0.02 + communication
    row = frame.iloc[0]
    assert row["predicted_communication_s"] == pytest.approx(communication)
    assert row["predicted_images_per_second"] == pytest.approx(8 / seconds)
    assert row["ratio"] == pytest.approx(8 / seconds / 9.5) and row["flag"] == ""
    assert frame.iloc[1]["flag"] == "missed by more than 20%"
    unmeasured = prediction_frame(typed([single, near]), {})
    assert unmeasured.iloc[0]["flag"] == "no commbench for this process count"


def test_a_strategy_exchanging_inside_its_passes_shows_no_measured_communication():
    """FSDP2 gathers and reduce-scatters inside forward and backward: the loop's split holds
    that in compute, so its 0 s of communication is not shown as a measurement beside the
    prediction, and the report's definition says so; DDP's timed wait is shown."""
    from pipeline.report.findings import communication_definition
    from pipeline.report.prediction import prediction_frame
    from pipeline.strategies import REGISTERED

    steps = {"compute": 0.8, "data": 0.02, "optimizer": 0.01, "communication": 0.0}
    single = summary("single", 1, 8, 2, 10.0, steps)
    ddp_run = summary("ddp", 2, 4, 1, 9.5, dict(steps, communication=0.01), comm_hook="none")
    fsdp_run = summary("fsdp", 2, 4, 1, 8.0, steps, reshard_after_forward=True)
    commbench = {2: {"processes": 2, "backend": "gloo", "primitives": {
        "all_reduce": {"alpha_s": 1e-3, "beta_s_per_byte": 1e-9},
        "send_recv": {"alpha_s": 1e-4, "beta_s_per_byte": 5e-10}}}}
    frame = prediction_frame(typed([single, ddp_run, fsdp_run]), benches(commbench)).set_index("run_id")
    assert frame.loc["ddp-w2", "measured_communication_s"] == pytest.approx(0.01)
    assert math.isnan(frame.loc["fsdp-w2", "measured_communication_s"])
    assert frame.loc["fsdp-w2", "predicted_communication_s"] > 0  # the model still states it

    definition = communication_definition()
    inside = [cls.label for cls in REGISTERED if cls.communication_timed is None]
    assert set(inside) == {STRATEGIES["fsdp"].label, DP.label}
    assert f"{' and '.join(inside)} exchange inside the forward and backward passes" in definition
    assert all(f"{cls.label}: {cls.communication_timed}" in definition
               for cls in REGISTERED if cls.communication_timed)


def test_compute_slows_by_what_commbench_measured_with_every_process_at_once():
    """single had the host to itself; the run's processes share it: its compute is single's
    times commbench's shared-compute factor, and the report says what was measured."""
    from pipeline.report.prediction import link_rows, prediction_frame

    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)  # 0.1 s an image, at the run's 1 thread
    run = summary("ddp", 2, 4, 1, 15.0, split, comm_hook="none")
    free = {"all_reduce": {"alpha_s": 0.0, "beta_s_per_byte": 0.0},
            "send_recv": {"alpha_s": 0.0, "beta_s_per_byte": 0.0}}
    alone = prediction_frame(typed([single, run]), benches({2: {"processes": 2, "primitives": free}})).iloc[0]
    assert alone["shared_compute_factor"] == 1.0  # not measured: not assumed either
    assert alone["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.1))
    shared = {"alone_s": 0.4, "together_s": 0.5, "factor": 1.25, "images": 4, "repeats": 15}
    commbench = {2: {"processes": 2, "backend": "gloo", "primitives": free, "shared_compute": shared}}
    row = prediction_frame(typed([single, run]), benches(commbench)).iloc[0]
    assert row["shared_compute_factor"] == 1.25
    assert row["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.1 * 1.25))
    assert row["ratio"] == pytest.approx(8 / 0.5 / 15.0) and row["flag"] == ""
    assert ("2 processes computing at once: forward + backward of 4 images 400.0 ms alone, "
            "500.0 ms together (x1.250)") in link_rows(benches({2: dict(commbench[2], primitives={})}))


def test_the_compute_input_is_single_at_the_threads_of_the_runs_processes():
    from pipeline.report.prediction import prediction_frame

    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    two_threads = summary("single", 1, 8, 2, 10.0, split)
    one_thread = summary("single", 1, 8, 1, 8.0, dict(split, compute=1.2))  # 0.15 s an image
    run = summary("ddp", 2, 4, 1, 9.5, dict(split, compute=0.6), comm_hook="none")
    commbench = {2: {"processes": 2, "backend": "gloo", "primitives": {
        "all_reduce": {"alpha_s": 0.0, "beta_s_per_byte": 0.0},
        "send_recv": {"alpha_s": 0.0, "beta_s_per_byte": 0.0}}}}
    measured = prediction_frame(typed([two_threads, one_thread, run]), benches(commbench)).iloc[0]
    assert measured["compute_input"] == "single at 1 thread(s), measured, per image of 8 a step"
    assert measured["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.15))
    assert (measured["compute_fixed_s"], measured["compute_per_image_s"]) == (0.0, pytest.approx(0.15))
    # single at two batch sizes: a step is a fixed cost plus a cost per image, fitted, taken at
    # the worker's 4 images (0.64 s: 0.16 s an image, not 8's 0.15)
    four = summary("single", 1, 4, 1, 8.0, dict(split, compute=0.64))
    matched = prediction_frame(typed([two_threads, one_thread, four, run]), benches(commbench)).iloc[0]
    assert matched["compute_input"] == ("single at 1 thread(s), measured, fitted at 4/8 images a step: "
                                        "80.00 ms a step + 140.00 ms per image")
    assert (matched["compute_fixed_s"], matched["compute_per_image_s"]) == (pytest.approx(0.08), pytest.approx(0.14))
    assert matched["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.16))
    # a worker's 2 images lie below the fitted sizes: said, and the fixed cost kept (0.36 s a step)
    small = summary("ddp", 2, 2, 1, 9.5, dict(split, compute=0.3), comm_hook="none")
    below = prediction_frame(typed([one_thread, four, small]), benches(commbench)).iloc[0]
    assert below["compute_input"].endswith("140.00 ms per image, extrapolated to 2")
    assert below["predicted_images_per_second"] == pytest.approx(4 / 0.36)
    only_four = prediction_frame(typed([four, run]), benches(commbench)).iloc[0]
    assert only_four["compute_input"] == "single at 1 thread(s), measured, 4 images a step"
    # the model's work does not depend on the data mode: an in-memory run takes the same compute
    in_memory = dict(run, run_id="ddp-mem", summary=dict(run["summary"], data_mode="synthetic"))
    memory_single = dict(two_threads, summary=dict(two_threads["summary"], data_mode="synthetic"))
    both = prediction_frame(typed([one_thread, memory_single, in_memory]), benches(commbench)).iloc[0]
    assert both["compute_input"] == "single at 1 thread(s), measured, per image of 8 a step"
    assert both["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.15))
    assert prediction_frame(typed([one_thread, in_memory]), benches(commbench)).empty  # no in-memory data wait
    scaled = prediction_frame(typed([two_threads, run]), benches(commbench)).iloc[0]  # no 1-thread single
    assert scaled["compute_input"] == "single at 2 thread(s), scaled x2 (assumption), per image of 8 a step"
    assert scaled["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.1 * 2))


def test_a_synchronous_step_waits_for_its_slowest_worker():
    """The expected maximum of N normal compute times (the order statistic), its spread from
    single's timed iterations; a parameter server with bounded staleness does not wait."""
    import pandas as pd
    from pipeline.costmodel.predict import slowest_wait
    from pipeline.report.prediction import prediction_frame

    assert [round(slowest_wait(n, 1.0, 1), 4) for n in (2, 3, 4, 8)] == [0.5642, 0.8463, 1.0294, 1.4236]
    assert slowest_wait(2, 0.25, 4) == pytest.approx(1.0 * 0.5642, rel=1e-3)  # sd of 4 images: 1
    assert slowest_wait(1, 1.0, 1) == 0.0 and slowest_wait(4, math.nan, 1) == 0.0  # none measured
    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)
    single["summary"]["timing_excludes_first_iterations"] = 5  # the 9 s warm-ups are left out
    single["iterations"] = pd.DataFrame({"time_compute": [9.0] * 5 + [0.6, 1.0] * 10})
    as_single = dict(split, compute=0.4)  # single's 4 images: no overhead beside the other process
    run = summary("ddp", 2, 4, 1, 9.5, as_single, comm_hook="none")
    stale = dict(summary("ps", 2, 4, 1, 9.5, as_single, placement="dedicated", servers=1, staleness=1),
                 run_id="ps-ssp")
    free = {2: {"processes": 2, "backend": "gloo", "primitives": {  # links that cost nothing
        "all_reduce": {"alpha_s": 0.0, "beta_s_per_byte": 0.0},
        "send_recv": {"alpha_s": 0.0, "beta_s_per_byte": 0.0}}}}
    frame = prediction_frame(typed([single, run, stale]), benches(free)).set_index("run_id")
    # per image: 1/8 of the iteration's variance; a worker's 4 images: half of it
    worker_sd = math.sqrt(pd.Series([0.6, 1.0] * 10).var() / 8 * 4)
    assert frame.loc["ddp-w2", "predicted_images_per_second"] == pytest.approx(
        8 / (4 * 0.1 + 0.5642 * worker_sd), rel=1e-4)
    assert frame.loc["ps-ssp", "predicted_images_per_second"] == pytest.approx(8 / (4 * 0.1))


def test_fsdp_costs_what_commbench_timed_fsdp2_add_on_the_model():
    """Timed: the sharded step's seconds over the plain one's, by reshard setting; untimed, at 16
    bits (timed in fp32) or at one worker: the rings of its phases, or nothing."""
    from pipeline.strategies import lookup

    fsdp = lookup("fsdp")
    rings = Network(intra=Link(1e-4, 1e-9))
    timed = Network(intra=Link(1e-4, 1e-9), calibrations={
        "fsdp": {"plain_s": 0.100, "reshard_s": 0.148, "keep_s": 0.131}})
    run = fsdp.filled(workers=2, reshard_after_forward=True)
    assert fsdp.communication_seconds(run, M, timed, 0.0) == pytest.approx(0.048)
    kept = run.replace(reshard_after_forward=False)
    assert fsdp.communication_seconds(kept, M, timed, 0.0) == pytest.approx(0.031)
    ring = fsdp.communication_seconds(run, M, rings, 0.0)  # untimed: 3 rings of M/2 each way
    assert ring == pytest.approx(3 * (1e-4 + 1e-9 * M / 2))
    assert fsdp.communication_seconds(run.replace(precision="bf16"), M, timed, 0.0) == pytest.approx(
        fsdp.communication_seconds(run.replace(precision="bf16"), M, rings, 0.0))
    assert fsdp.communication_seconds(run.replace(workers=1), M, timed, 0.0) == 0.0
    assert lookup("ddp").calibrate(lambda wrap: 1 / 0) is None  # the others ask for no timing


def test_zero_costs_a_broadcast_per_rank_where_commbench_timed_broadcast():
    """ZeroRedundancyOptimizer with its parameters in one bucket a rank broadcasts N buckets of
    M/N: N alpha + beta M after the overlapped all-reduce; the ring all-gather without a
    broadcast fit."""
    from pipeline.strategies import lookup

    zero, ddp = lookup("zero"), lookup("ddp")
    rings = Network(intra=Link(1e-4, 1e-9), all_reduce=Link(3e-4, 6e-10))
    timed = Network(intra=Link(1e-4, 1e-9), all_reduce=Link(3e-4, 6e-10), broadcast=Link(5e-4, 5e-10))
    for n in (2, 4):
        overlapped = ddp.communication_seconds(ddp.filled(workers=n), M, timed, 0.0)  # nothing to hide behind
        assert zero.communication_seconds(zero.filled(workers=n), M, timed, 0.0) == pytest.approx(
            overlapped + n * 5e-4 + 5e-10 * M)
    ring = (zero.communication_seconds(zero.filled(workers=2), M, rings, 0.0)
            - ddp.communication_seconds(ddp.filled(workers=2), M, rings, 0.0))
    assert ring == pytest.approx(1e-4 + 1e-9 * M / 2)  # untimed: each rank's half, one message
    assert zero.communication_seconds(zero.filled(workers=1), M, timed, 0.0) == 0.0


def test_a_single_run_with_pinned_threads_is_not_the_baseline():
    from pipeline.config import params
    from pipeline.report.load import is_baseline
    from pipeline.strategies import sweep

    cfg = params.load_resolved("params.yaml")
    pinned = sweep.fill({"strategy": "single", "workers": 1, "threads": 1}, cfg)
    assert sweep.run_id(pinned) == "single-t1-w1-b8-s0" and sweep.variant(pinned) == "t1"
    plain = sweep.fill({"strategy": "single", "workers": 1}, cfg)
    assert sweep.run_id(plain) == "single-w1-b8-s0"
    assert is_baseline("single", "") and is_baseline("single", float("nan"))
    assert not is_baseline("single", "t1") and not is_baseline("ddp", "")
    before = torch.get_num_threads()
    try:
        assert STRATEGIES["single"](pinned, cfg.parallel).runtime().start(0).threads == 1
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)  # the rest of the session keeps its threads


def cluster_network(gpus: int, per_node: int, spare: int = 0) -> Network:
    nodes = -(-gpus // per_node)
    return Network(intra=Link.from_bandwidth(2400, 2), inter=Link.from_bandwidth(100, 5),
                   gpus_per_node=per_node, nodes=nodes, server_machines=spare * nodes)


def flows_of(strategy, run: dict) -> list:
    return [flow for phase in strategy.phases(run, M) for flow in as_flows(phase)]


def test_a_ring_crosses_each_nodes_network_once_each_way():
    n = 32
    network = cluster_network(n, 8)
    loads = network.loads(flows_of(DDP, ddp(n)))
    networks = {link: v for link, v in loads.items() if link[0] == "network"}
    assert sorted(node for _, node in networks) == [0, 1, 2, 3]
    assert all(v == pytest.approx(2 * (n - 1) / n * M) for v in networks.values())
    # NCCL's ring in closed form: the same bytes over every node's network and GPU's link
    closed = link_loads(DDP.phase_ports(ddp(n), M, network))
    assert closed == {("network", "every node"): pytest.approx(2 * (n - 1) / n * M),
                      ("link", "every GPU"): pytest.approx(2 * (n - 1) / n * M)}


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("n", [2, 5, 8])
def test_within_one_node_nccls_ring_is_the_hosts_ring_of_flows(kind, n):
    """Inside a node the closed form takes what the ring's flows took: 2(N-1) (or N-1) steps
    of the GPU's link latency and steps/N of the buffer at its bandwidth; the tree never wins."""
    network = cluster_network(8, 8)
    collective = Collective(kind, n, M)
    assert on_cluster(collective, network).algorithm == "ring"
    assert busiest_seconds(collective_ports(collective, network)) == pytest.approx(network.seconds(flows(collective)))


def test_across_nodes_nccls_latency_grows_with_nodes_and_log_nodes_not_gpus():
    """The issue's 1,000 nodes of 8 GPUs, 30 us between nodes: a flat ring paid 2(N-1) inter-node
    latencies a bucket (0.48 s); NCCL's ring pays 2(n-1) of them and its tree 2 log2(n), and a
    small all-reduce takes the tree, a large one on a few nodes the ring."""
    network = Network(intra=Link.from_bandwidth(200, 10), inter=Link.from_bandwidth(25, 30), gpus_per_node=8,
                      nodes=1000)
    small, large = Collective("all_reduce", 8000, 4096), Collective("all_reduce", 16, 1e9)
    assert on_cluster(small, network).algorithm == "tree"
    assert on_cluster(large, network).algorithm == "ring"
    latency = ring(Collective("all_reduce", 8000, 0.0), network).seconds
    assert latency == pytest.approx(2 * 7000 * 10e-6 + 2 * 999 * 30e-6)
    assert tree(Collective("all_reduce", 8000, 0.0), network).seconds == pytest.approx(2 * (7 * 10e-6 + 9 * 30e-6))
    # linear or better: ten times the nodes, at most ten times the time
    bucket = [on_cluster(Collective("all_reduce", 8 * nodes, 25 * 2**20), network).seconds for nodes in (100, 1000)]
    assert bucket[1] <= 10 * bucket[0]


def test_strategies_name_the_algorithm_nccl_would_choose():
    network = Network(intra=Link.from_bandwidth(200, 10), inter=Link.from_bandwidth(25, 30), gpus_per_node=8,
                      nodes=1000)
    assert DDP.algorithms(ddp(8000), 4096, network) == "all_reduce: tree"
    assert STRATEGIES["fsdp"].algorithms(STRATEGIES["fsdp"].filled(workers=16), M, network) == (
        "all_gather: ring, reduce_scatter: ring")
    assert PS.algorithms(ps(16, "dedicated", 2), M, network) == "point-to-point"
    assert STRATEGIES["single"].algorithms(STRATEGIES["single"].filled(workers=1), M, network) == "none"
    assert DDP.algorithms(ddp(4), M, Network(intra=Link.from_bandwidth(80, 40))) == "all_reduce: ring"


def test_a_parameter_servers_workers_share_their_nodes_network():
    n, per_node = 32, 8
    network = cluster_network(n, per_node, spare=1)  # 4 spare CPU machines: K = 4
    loads = network.loads(flows_of(PS, ps(n, "dedicated", 4)))
    assert loads[("network", 0)] == pytest.approx(per_node * M)  # 8 workers x M each way
    assert loads[("network", ("server machine", 0))] == pytest.approx(n * M / 4)
    # all on one host, the same job moves only M per worker link: the closed form
    assert PS.link_bytes(ps(n, "dedicated", 4), M)["worker"] == pytest.approx(M)
    # one GPU per machine: the worker's network carries M, fewer than ring's 2(N-1)/N M
    single_gpu = cluster_network(n, 1, spare=1).loads(flows_of(PS, ps(n, "dedicated", n)))
    assert single_gpu[("network", 0)] == pytest.approx(M) and M < 2 * (n - 1) / n * M
    # and a phase takes as long as its busiest link: N gradients of M into the one server
    grads = PS.phases(ps(n, "dedicated", 1), M)[0]
    assert cluster_network(n, 1, spare=1).seconds(grads) == pytest.approx(n * (5e-6 + M * 8 / 100e9))



PS_LAYOUTS = [  # workers, servers, GPUs per node (None: one host), spare CPU machines per node
    (2, 1, None, 0), (5, 3, None, 0), (2, 2, 1, 0), (7, 3, 2, 0), (16, 5, 4, 0), (16, 4, 4, 1), (24, 6, 8, 0),
    (9, 9, 4, 2), (33, 4, 8, 1),
]


@pytest.mark.parametrize(
    "placement, workers, servers, per_node, spare",
    [("dedicated", *layout) for layout in PS_LAYOUTS]
    # colocated servers live on workers: K <= N, and no spare machine serves
    + [("colocated", *layout) for layout in PS_LAYOUTS if layout[1] <= layout[0] and not layout[3]],
)
def test_a_parameter_servers_counted_ports_are_its_flows(placement, workers, servers, per_node, spare):
    """PS's closed form (linear in N + K) puts on every port what its N x K flows do: on one
    host, on nodes with its servers beside the workers, and on spare CPU machines."""
    network = (
        Network(intra=Link.from_bandwidth(80, 40))
        if per_node is None
        else Network(intra=Link.from_bandwidth(2400, 2), inter=Link.from_bandwidth(100, 5), gpus_per_node=per_node,
                     nodes=-(-workers // per_node), server_machines=spare * -(-workers // per_node))
    )
    run = ps(workers, placement, servers)
    counted = PS.phase_ports(run, M, network)
    listed = [network.ports(phase) for phase in PS.phases(run, M)]
    assert [set(ports) for ports in counted] == [set(ports) for ports in listed]
    for count, flows in zip(counted, listed, strict=True):
        for port, load in flows.items():
            assert count[port] == pytest.approx(load, rel=1e-12), port
    assert PS.communication_seconds(run, M, network, 0.0) == pytest.approx(sum(map(network.seconds, PS.phases(run, M))))

def test_data_parallel_stays_in_one_machine():
    assert math.isnan(DP.communication_seconds(DP.filled(workers=16), M, cluster_network(16, 8), 0.0))
    assert DP.communication_seconds(DP.filled(workers=8), M, cluster_network(8, 8), 0.0) == pytest.approx(
        2 * 7 * (2e-6 + M * 8 / 2400e9))


def test_predicted_scaling_uses_a_measured_gpu_run_and_finds_device_0s_limit():
    from pipeline.config.params import load_resolved
    from pipeline.costmodel.clusters import Cluster, Compute
    from pipeline.costmodel.predict import predict_point, saturation
    from pipeline.report.clusters import findings, gpu_compute, prediction_points

    predict = load_resolved("params.yaml").report.predict
    assumed = gpu_compute(predict, typed([]))
    assert assumed.source.startswith("assumed: ") and assumed.gradient_bytes == predict.compute.gradient_bytes
    gpu_run = summary("single", 1, 2, 8, 10.0, {"compute": 0.1, "data": 0.02, "optimizer": 0.08,
                                                "communication": 0.0})
    gpu_run["summary"]["device"] = "cuda:0"
    measured = gpu_compute(predict, typed([gpu_run]))
    assert measured.seconds_per_image == pytest.approx(0.1) and measured.gradient_bytes == 10e6
    assert measured.source.startswith("measured: single-w1")
    # its iterations' spread: the slowest of N GPUs is waited for (none without a spread)
    import pandas as pd
    spread = gpu_compute(predict, typed([dict(gpu_run, iterations=pd.DataFrame({"time_compute": [0.1, 0.3] * 10}))]))
    assert spread.variance_per_image == pytest.approx(pd.Series([0.1, 0.3] * 10).var() / 2)
    cluster = Cluster.of(predict.clusters[0])
    ddp_at_8 = [predict_point(DDP, DDP.filled(workers=8), compute, 2,
                              cluster.network(8))["predicted_efficiency"] for compute in (measured, spread)]
    assert ddp_at_8[1] < ddp_at_8[0]
    points = prediction_points(predict, assumed)
    assert points["gpus"].max() >= 256 and set(points["cluster"]) == {c.name for c in predict.clusters}
    one_gpu = points[points["gpus"] == 1]
    ddp_one = one_gpu[one_gpu["model"] == "DDP (ring all-reduce)"]["predicted_efficiency"]
    assert (ddp_one == 1.0).all()  # nothing to communicate
    assert not (points[points["model"].str.startswith("DataParallel")]["nodes"] > 1).any()
    sentences = findings(points, predict, assumed)
    assert len(sentences) == 2 * len(predict.clusters) and all("by the model" in s or "needs 2 GPUs" in s
                                                                 for s in sentences)
    # device 0 saturates where 2(N-1) M beta reaches the compute of one iteration
    slow = Cluster("slow", 8, 32, Link.from_bandwidth(8, 0), Link.from_bandwidth(8, 0), 0)
    compute = Compute(seconds_per_image=0.5, gradient_bytes=1e8, source="test")
    # 2 (N-1) x 0.1 s against 1 s of compute (2 images): 50 % efficiency at N = 6, so 8 is the first power of 2
    assert saturation(DP, slow, compute, per_gpu=2) == 8


def test_rates_equal_but_for_rounding_keep_the_registrys_order():
    """DataParallel's and one colocated server's rates are the same messages summed in another
    order: a last-digit difference must not reorder them (the closed-form PS of issue 58 did)."""
    from pipeline.costmodel.ranking import Band, ranking

    band = Band.of([], 0.2, "no runs")
    for noise in (1e-13, -1e-13):
        rates = {"dp": 131.824313, "ps": 131.824313 * (1 + noise), "ddp": 533.3}
        assert [r.label for r in ranking(rates, band)] == ["ddp", "dp", "ps"]
    assert [r.label for r in ranking({"ps": 1.0, "dp": 1.0 + 1e-6}, band)] == ["dp", "ps"]  # a real difference


def test_a_clusters_prediction_lists_no_flow_that_grows_with_its_gpus(monkeypatch):
    """On a cluster every collective is a closed form and the parameter server's traffic is
    counted per port: nothing lists N (ring) or N x K (servers) flows, which put 1,000 nodes of
    8 GPUs past 2.6 GB and 80 s (benchmarks/whatif_scaling.py)."""
    from pipeline.config.params import load_resolved
    from pipeline.costmodel import collectives
    from pipeline.costmodel.clusters import Compute
    from pipeline.report.clusters import prediction_points

    def listed(*_):
        raise AssertionError("a flow listed per process on a cluster")

    monkeypatch.setattr(collectives, "flows", listed)
    monkeypatch.setattr(PS, "phases", classmethod(listed))
    spec = {"name": "wide", "gpus_per_node": 8, "nodes": 300, "intra_gbit_s": 200, "intra_latency_us": 10,
            "inter_gbit_s": 25, "inter_latency_us": 30, "spare_cpu_machines_per_node": 1}
    predict = load_resolved("params.yaml").report.predict
    predict = predict.model_copy(update={"clusters": [type(predict.clusters[0]).model_validate(spec)]})
    points = prediction_points(predict, Compute(0.0141, 166131544, "given"))
    widest = points[points["gpus"] == 2400].set_index("model")
    assert widest.loc[DDP.RING, "collectives"] == "all_reduce: tree"
    assert widest.loc[PS.SHARDED, "predicted_images_per_second"] > 0


# Published all-reduce bus bandwidths at 16 GiB (GB/s), measured with torch.distributed over NCCL
# (stas00/ml-engineering, network/README.md "Inter-node speed depends on intra-node speed" and
# network/benchmarks/README.md; its H200 figures agree with nccl-tests within 2 % there): AWS
# P6-B200 and H200 nodes of 8 GPUs, 400 GB/s of EFA per node (16 x 200 Gb/s); NVLink 5 900 GB/s,
# NVLink 4 450 GB/s per GPU each way.
PUBLISHED_BUSBW = [  # (NVLink GB/s per GPU, nodes, measured busbw GB/s)
    (900, 1, 838.97), (900, 4, 376.71), (450, 1, 482.05), (450, 4, 369.06)]


@pytest.mark.parametrize("nvlink, nodes, measured", PUBLISHED_BUSBW)
def test_nccls_ring_in_closed_form_is_within_10_percent_of_published_bus_bandwidth(nvlink, nodes, measured):
    """A large all-reduce's bus bandwidth (its bytes x 2(N-1)/N over its time, as nccl-tests
    reports it) from the closed form on the cluster's datasheet links (latency is nothing at this
    size: 3 and 10 us stand in), against the measured one:
    the slower of NVLink and the node's network. The H200 node measures above its NVLink spec
    (NVLink SHARP), the B200 nodes below."""
    network = Network(intra=Link.from_bandwidth(nvlink * 8, 3), inter=Link.from_bandwidth(3200, 10), gpus_per_node=8,
                      nodes=nodes)
    gpus, size = 8 * nodes, 16 * 2**30
    timed = on_cluster(Collective("all_reduce", gpus, size), network)
    busbw = size * 2 * (gpus - 1) / gpus / timed.seconds / 1e9
    assert timed.algorithm == "ring"
    assert busbw == pytest.approx(measured, rel=0.10)


def test_a_runs_compute_beside_its_other_processes_is_taken_from_the_other_entries():
    """single had the host to itself; a 2-process run's compute a step is single's fitted step
    plus what the runs of the other entries of as many processes computed over theirs (their
    median; those of its strategy first), never its own entry's: commbench's factor then does
    not apply. One entry alone keeps commbench's factor."""
    from pipeline.report.prediction import prediction_frame

    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)  # 0.1 s an image at 1 thread
    ddp4 = summary("ddp", 2, 4, 1, 15.0, dict(split, compute=0.43), comm_hook="none")  # +30 ms a step
    zero4 = dict(summary("zero", 2, 4, 1, 15.0, dict(split, compute=0.45)), run_id="zero-w2", entry="zero-w2")
    ddp2 = dict(summary("ddp", 2, 2, 1, 15.0, dict(split, compute=0.25), comm_hook="none"),
                run_id="ddp-w2-b2", entry="ddp-w2-b2")
    free = {"all_reduce": {"alpha_s": 0.0, "beta_s_per_byte": 0.0},
            "send_recv": {"alpha_s": 0.0, "beta_s_per_byte": 0.0}}
    shared = {"alone_s": 0.4, "together_s": 0.5, "factor": 1.25, "images": 4, "repeats": 15}
    commbench = benches({2: {"processes": 2, "backend": "gloo", "primitives": free, "shared_compute": shared}})
    frame = prediction_frame(typed([single, ddp4, zero4, ddp2]), commbench).set_index("run_id")
    # ddp at 2 images: ddp-w2's +30 ms (its strategy's), not zero's +50 ms nor commbench's x1.25
    row = frame.loc["ddp-w2-b2"]
    assert row["compute_overhead_s"] == pytest.approx(0.03) and row["shared_compute_factor"] == 1.0
    assert row["predicted_images_per_second"] == pytest.approx(4 / (2 * 0.1 + 0.03))
    assert "+30.0 ms a step beside its other processes (the median of 1 runs of ddp's other entries)" in row["compute_input"]
    # ddp-w2 itself: from ddp-w2-b2's own +50 ms (its strategy's other entry)
    assert frame.loc["ddp-w2", "compute_overhead_s"] == pytest.approx(0.05)
    alone = prediction_frame(typed([single, ddp4]), commbench).iloc[0]  # no other entry: commbench's
    assert math.isnan(alone["compute_overhead_s"]) and alone["shared_compute_factor"] == 1.25
