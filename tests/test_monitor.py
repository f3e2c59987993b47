"""The utilisation sampler: real psutil readings of this process, NVML where a GPU exists."""
from __future__ import annotations

import time

import pytest
import torch

from pipeline.training.monitor import Monitor


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(i * i for i in range(1000))


def test_samples_cpu_and_memory_of_this_process():
    monitor = Monitor(rank=3, interval=0.05, gpus=[]).start()
    busy(0.6)
    samples = monitor.stop()
    assert len(samples) >= 5
    assert all(s["rank"] == 3 and s["rss_mb"] > 10 and s["gpus"] == [] for s in samples)
    assert max(s["cpu_percent"] for s in samples) > 20  # the busy loop shows
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    assert monitor.gpu_reason == "no GPU in use"
    assert len(monitor.stop()) == len(samples)  # stopping twice is harmless


def test_interval_zero_samples_nothing():
    monitor = Monitor(rank=0, interval=0, gpus=[]).start()
    busy(0.1)
    assert monitor.stop() == []


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reason given without a GPU")
def test_gpus_asked_for_without_nvml_say_why():
    monitor = Monitor(rank=0, interval=0.05, gpus=[0])
    assert monitor.nvml is None and "NVML unavailable" in monitor.gpu_reason
    assert monitor.sample()["gpus"] == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NVML sampling needs a GPU; none is visible")
def test_samples_gpu_utilisation_and_memory():
    monitor = Monitor(rank=0, interval=0.05, gpus=[0]).start()
    x = torch.randn(4096, 4096, device="cuda")
    end = time.perf_counter() + 1.0
    while time.perf_counter() < end:
        x = (x @ x).tanh()
    torch.cuda.synchronize()
    samples = monitor.stop()
    assert monitor.gpu_reason == ""
    assert max(s["gpus"][0]["util_percent"] for s in samples) > 0
    assert max(s["gpus"][0]["memory_mb"] for s in samples) > 64
