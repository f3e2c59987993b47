"""The cost model's closed forms (each strategy's own) and the latency/bandwidth fit."""
from __future__ import annotations

import random

import pytest

from pipeline.costmodel import Iteration, Link, fit
from pipeline.strategies import STRATEGIES

M = 100e6  # bytes of gradients
DDP, PS, DP = STRATEGIES["ddp"], STRATEGIES["ps"], STRATEGIES["dp"]


def ddp(n: int, hook: str = "none") -> dict:
    return {"strategy": "ddp", "workers": n, "comm_hook": hook}


def ps(n: int, placement: str, servers: int = 1) -> dict:
    return {"strategy": "ps", "workers": n, "placement": placement, "servers": servers}


@pytest.mark.parametrize("n", [2, 3, 8, 256])
def test_ring_all_reduce_moves_2_n_minus_1_over_n(n):
    assert DDP.link_bytes(ddp(n), M)["worker"] == pytest.approx(2 * (n - 1) / n * M)
    assert DDP.link_bytes(ddp(n, "bf16"), M)["worker"] == pytest.approx((n - 1) / n * M)


def test_parameter_server_closed_forms():
    n = 8
    assert PS.link_bytes(ps(n, "dedicated"), M)["worker"] == M  # 2M a worker: M each way
    assert PS.link_bytes(ps(n, "colocated"), M)["busiest"] == pytest.approx((n - 1) * M)  # 2(N-1)M
    for k in (1, 2, 4, 8):
        assert PS.link_bytes(ps(n, "dedicated", k), M)["busiest"] == pytest.approx(max(M, n * M / k))
    assert DP.link_bytes({"workers": n}, M)["busiest"] == pytest.approx((n - 1) * M)


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
    # DDP: with a long backward only the last bucket shows; with none, all of them
    hidden, exposed = (DDP.communication_seconds(ddp(8), M, link, backward) for backward in (10.0, 0.0))
    assert hidden < exposed and exposed == pytest.approx(4 * hidden)  # 100 MB: 4 buckets of 25 MiB
    assert DDP.communication_seconds(ddp(1), M, link, 0.0) == 0.0
    # One parameter server slows down with every worker; N dedicated shards do not
    one = [PS.communication_seconds(ps(n, "colocated"), M, link, 0.0) for n in (2, 4, 8)]
    assert one[0] < one[1] < one[2]
    sharded = [PS.communication_seconds(ps(n, "dedicated", n), M, link, 0.0) for n in (2, 4, 8)]
    assert sharded[2] == pytest.approx(sharded[0], rel=1e-3)
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
