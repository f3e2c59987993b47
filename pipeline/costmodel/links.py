"""The machine's communication, measured: point-to-point send/recv, all-reduce and broadcast
timed over message sizes from 4 KiB up (64 MiB by default), and latency alpha and seconds per
byte beta fitted per primitive (pipeline/costmodel/network.py), with the fit's residuals. The
cost model takes its links from here instead of assuming a network; the commbench stage
(pipeline/commbench.py) runs `measure`.

send_recv is a ping-pong between ranks 0 and 1, half its round trip; all_reduce and broadcast
(from rank 0) are every rank's, the slowest rank's time after a barrier. Each takes the median
of the repeats, after untimed warm-ups (the first use of a connection or a buffer is slower).
"""
from __future__ import annotations

import logging
import statistics
import time

import torch
import torch.distributed as dist

from .network import fit

log = logging.getLogger("commbench")


def sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of two from min_bytes to max_bytes (float32 elements: multiples of 4)."""
    found, size = [], max(4, min_bytes)
    while size <= max_bytes:
        found.append(size)
        size *= 2
    return found


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def seconds_of(call, device: torch.device) -> float:
    """Wall seconds of `call()`, the device's queued work included."""
    _sync(device)
    start = time.perf_counter()
    call()
    _sync(device)
    return time.perf_counter() - start


def ping_pong(tensor: torch.Tensor, rank: int) -> None:
    """0 -> 1 -> 0; the other ranks wait."""
    if rank == 0:
        dist.send(tensor, 1)
        dist.recv(tensor, 1)
    elif rank == 1:
        dist.recv(tensor, 0)
        dist.send(tensor, 0)


def time_send_recv(tensor: torch.Tensor, rank: int) -> float:
    """Half a round trip 0 -> 1 -> 0."""
    return seconds_of(lambda: ping_pong(tensor, rank), tensor.device) / 2


def time_all_reduce(tensor: torch.Tensor, rank: int) -> float:
    return seconds_of(lambda: dist.all_reduce(tensor), tensor.device)


def time_broadcast(tensor: torch.Tensor, rank: int) -> float:
    """Rank 0's tensor to every rank: how ZeroRedundancyOptimizer sends each updated parameter."""
    return seconds_of(lambda: dist.broadcast(tensor, src=0), tensor.device)


PRIMITIVES = {"send_recv": time_send_recv, "all_reduce": time_all_reduce, "broadcast": time_broadcast}


def slowest_median(call, repeats: int, warmups: int) -> float:
    """The median over `repeats` of the seconds `call()` returns, each time the slowest rank's
    after a barrier, following `warmups` untimed calls."""
    for _ in range(warmups):
        call()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        seconds = torch.tensor([call()], dtype=torch.float64)
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        samples.append(float(seconds))
    return statistics.median(samples)


def measure(device: torch.device, rank: int, processes: int, message_sizes: list[int],
            repeats: int) -> dict[str, dict]:
    """Per primitive: the median seconds at each size (the slowest rank's), and the fit."""
    results = {}
    for name, timed in PRIMITIVES.items():
        if name == "send_recv" and processes < 2:
            continue
        medians = []
        for _ in range(5):  # the primitive's first calls set up connections and buffers
            timed(torch.zeros(message_sizes[0] // 4, device=device), rank)
        for size in message_sizes:
            tensor = torch.zeros(size // 4, device=device)
            medians.append(slowest_median(lambda: timed(tensor, rank), repeats, warmups=1))
        results[name] = fitted(name, processes, rank, message_sizes, medians)
    return results


def fitted(name: str, processes: int, rank: int, message_sizes: list[int], medians: list[float]) -> dict:
    """One primitive's timings and their latency/bandwidth fit, as the JSON keeps them."""
    found = fit(message_sizes, medians)
    result = {"bytes": message_sizes, "seconds": medians, "alpha_s": found.link.alpha,
              "beta_s_per_byte": found.link.beta,
              "bandwidth_gbit_s": 8 / found.link.beta / 1e9 if found.link.beta > 0 else None,
              "relative_residuals": found.residuals, "r2": found.r2}
    if rank == 0:
        log.info("%s over %d processes: alpha %.1f us, %.2f Gbit/s (r2 %.4f)", name, processes,
                 found.link.alpha * 1e6, result["bandwidth_gbit_s"] or 0, found.r2)
    return result
