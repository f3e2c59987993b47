"""Utilisation over time: a background thread in each training process samples, every
`interval` seconds, the process's CPU utilisation and resident memory (psutil) and, where GPUs
exist, each visible GPU's utilisation and memory (NVML). DataParallel's extra load on GPU 0
shows up here, and so does a data loader that keeps the CPU busy while the GPU waits.

A sample is one dict: t (seconds since the sampler started), rank, cpu_percent (of one core;
above 100 with several threads), rss_mb, and gpus: [{index, util_percent, memory_mb}].
"""

from __future__ import annotations

import resource
import threading
import time
import typing

import psutil
import torch


def _nvml():
    """The NVML module, initialised, or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
        return pynvml, ""
    except pynvml.NVMLError as err:  # no driver: a CPU machine
        return None, f"NVML unavailable ({err})"


class Monitor:
    """Start with `start()`; `stop()` ends sampling and returns the samples."""

    def __init__(self, rank: int, interval: float, gpus: list[int]):
        self.rank, self.interval, self.gpus = rank, interval, gpus
        self.samples: list[dict] = []
        self.nvml: typing.Any
        self.gpu_reason: str | None
        self.nvml, self.gpu_reason = _nvml() if gpus else (None, "no GPU in use")
        self._process = psutil.Process()
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="utilisation", daemon=True)
        self._start = time.perf_counter()

    def start(self) -> Monitor:
        if self.interval > 0:
            self._process.cpu_percent(None)  # the first reading only sets the reference
            self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stopped.wait(self.interval):
            self.samples.append(self.sample())

    def sample(self) -> dict:
        memory = self._process.memory_info().rss / 2**20
        record = {
            "t": round(time.perf_counter() - self._start, 3),
            "rank": self.rank,
            "cpu_percent": self._process.cpu_percent(None),
            "rss_mb": round(memory, 1),
            "gpus": [],
        }
        for index in self.gpus if self.nvml else ():
            handle = self.nvml.nvmlDeviceGetHandleByIndex(index)
            record["gpus"].append(
                {
                    "index": index,
                    "util_percent": self.nvml.nvmlDeviceGetUtilizationRates(handle).gpu,
                    "memory_mb": round(self.nvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20, 1),
                }
            )
        return record

    def stop(self) -> list[dict]:
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()
        return self.samples


def peak_memory(gpus: list[int]) -> dict:
    """This process's peak memory, as pipeline/runtime/records/training.py's Memory holds it: on GPUs the
    most its tensors held at once on the busiest of them (for DataParallel, device 0), and what
    the caching allocator reserved; on a CPU its peak resident set (tensors, code, the allocator's
    slack: what the operating system had to give it)."""
    if gpus:
        allocated = [torch.cuda.max_memory_allocated(g) for g in gpus]
        return {
            "peak_bytes": max(allocated),
            "per_gpu_bytes": allocated,
            "reserved_bytes": max(torch.cuda.max_memory_reserved(g) for g in gpus),
            "measure": "torch.cuda.max_memory_allocated",
        }
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"peak_bytes": kib * 1024, "measure": "peak resident set (getrusage ru_maxrss)"}
