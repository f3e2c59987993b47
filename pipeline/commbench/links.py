"""The machine's communication, measured: point-to-point send/recv, all-reduce and broadcast
timed over message sizes from 4 KiB up (64 MiB by default), and latency alpha and seconds per
byte beta fitted per primitive (pipeline/costmodel/network.py), with the fit's residuals. The
cost model takes its links from here instead of assuming a network; the commbench stage
(__main__.py) runs `measure`.

send_recv is a ping-pong between ranks 0 and 1, half its round trip; all_reduce and broadcast
(from rank 0) are every rank's, the slowest rank's time after a barrier. Each takes the median
of the repeats, after untimed warm-ups (the first use of a connection or a buffer is slower),
and keeps their spread and the CPU other processes took meanwhile (`with_other_load`); a
primitive outside its band (pipeline/costmodel/bands.py) is timed again, and marked disturbed
if it stays outside.
"""

from __future__ import annotations

import functools
import logging
import os
import statistics
import time

import torch
import torch.distributed as dist

from ..costmodel import bands
from ..costmodel.network import fit
from ..runtime.distributed import available_cores

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


def reduced(values: list[float], device: torch.device, op=dist.ReduceOp.SUM) -> list[float]:
    """`values` reduced over every rank, in float64 on the job's `device`: NCCL reduces only
    tensors on a GPU (a CPU tensor fails with "No backend type associated with device type
    cpu"), gloo those on the CPU."""
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


def busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy (every process, the hypervisor's steal
    included), from /proc/stat; None where that does not describe exactly the cores this
    process may use (not Linux; a container shown its host's CPUs)."""
    try:
        with open("/proc/stat") as stat:
            lines = stat.read().splitlines()
    except OSError:
        return None
    if sum(line.startswith("cpu") and line[3:4].isdigit() for line in lines) != available_cores():
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = map(int, lines[0].split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def with_other_load(measure, device: torch.device, rank: int):
    """measure()'s dict with `other_load`: the CPU that processes other than the job's ranks
    took while it ran, in cores (their CPU seconds over the wall seconds), the same on every
    rank: another job on the machine shows here whatever the timings' own noise. None on GPUs
    (their timings hardly feel the host's load) or where busy_seconds cannot tell. The job's
    torchrun agent counts as another process (under 2 % of the cores, docs/measurements.md)."""
    if device.type == "cuda":
        return {**measure(), "other_load": None}
    dist.barrier()
    wall, own, busy = time.perf_counter(), time.process_time(), busy_seconds() if rank == 0 else 0.0
    result = measure()
    dist.barrier()
    after = busy_seconds() if rank == 0 else 0.0
    known = busy is not None and after is not None
    # every rank's own CPU; rank 0's reading of the machine
    own_cpu, machine, unknown = reduced(
        [
            time.process_time() - own,
            (after - busy) if busy is not None and after is not None else 0.0,
            0.0 if known else 1.0,
        ],
        device,
    )
    seconds = time.perf_counter() - wall
    other = (machine - own_cpu) / seconds if not unknown and seconds > 0 else None
    return {**result, "other_load": None if other is None else max(0.0, other)}


def slowest_samples(call, repeats: int, warmups: int, device: torch.device) -> list[float]:
    """The seconds `call()` returns, `repeats` times, each time the slowest rank's after a
    barrier (the same on every rank), following `warmups` untimed calls."""
    for _ in range(warmups):
        call()
    samples = []
    for _ in range(repeats):
        dist.barrier()
        samples += reduced([call()], device, op=dist.ReduceOp.MAX)
    return samples


def measure(
    device: torch.device, rank: int, processes: int, message_sizes: list[int], repeats: int, retries: int
) -> dict[str, dict]:
    """Per primitive: the median seconds at each size (the slowest rank's), their spread, the
    fit, and its check (bands.checked: timed again, up to `retries` times, while outside its
    band)."""
    results = {}
    for name, timed in PRIMITIVES.items():
        if name == "send_recv" and processes < 2:
            continue
        for _ in range(5):  # the primitive's first calls set up connections and buffers
            timed(torch.zeros(message_sizes[0] // 4, device=device), rank)

        def once(name=name, timed=timed) -> dict:
            medians, spreads = [], []
            for size in message_sizes:
                tensor = torch.zeros(size // 4, device=device)
                samples = slowest_samples(
                    lambda: timed(tensor, rank),  # noqa: B023 (called here)
                    repeats,
                    warmups=1,
                    device=device,
                )
                medians.append(statistics.median(samples))
                spreads.append(bands.relative_spread(samples))
            return fitted(name, processes, rank, message_sizes, medians, spreads)

        found, check = bands.checked(
            f"{name} over {processes} processes",
            functools.partial(with_other_load, once, device, rank),
            bands.link_verdict,
            lambda p: {
                "alpha_s": p["alpha_s"],
                "beta_s_per_byte": p["beta_s_per_byte"],
                "worst_residual": max(map(abs, p["relative_residuals"])),
                "median_spread": statistics.median(p["relative_spread"]),
                "other_load": p["other_load"],
            },
            retries,
            speak=rank == 0,
        )
        results[name] = {**found, "check": check}
    return results


def fitted(
    name: str,
    processes: int,
    rank: int,
    message_sizes: list[int],
    medians: list[float],
    spreads: list[float] | None = None,
) -> dict:
    """One primitive's timings (and their spreads: bands.relative_spread of each size's
    repeats) and their latency/bandwidth fit, as the JSON keeps them."""
    found = fit(message_sizes, medians)
    result = {
        "bytes": message_sizes,
        "seconds": medians,
        "alpha_s": found.link.alpha,
        "beta_s_per_byte": found.link.beta,
        "bandwidth_gbit_s": 8 / found.link.beta / 1e9 if found.link.beta > 0 else None,
        "relative_residuals": found.residuals,
        "r2": found.r2,
        **({"untrusted": found.untrusted} if found.untrusted else {}),
        "relative_spread": spreads if spreads is not None else [0.0] * len(medians),
    }
    if rank == 0:
        log.info(
            "%s over %d processes: alpha %.1f us, %.2f Gbit/s (r2 %.4f)",
            name,
            processes,
            found.link.alpha * 1e6,
            result["bandwidth_gbit_s"] or 0,
            found.r2,
        )
    return result
