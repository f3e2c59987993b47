"""The iteration clock (pipeline/training/timing.py): each record is finished one iteration later, with
its losses and its phase seconds, on a CPU (clock readings) and on a GPU (CUDA events)."""
from __future__ import annotations

import time

import pytest
import torch

from pipeline.training.timing import IterationClock, Pending

DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="CUDA events need a GPU; CPU marks are tested beside"))]


def iteration(clock: IterationClock, step: int, device: str, compute_s: float, step_s: float):
    """An iteration whose compute takes compute_s and whose strategy step takes step_s, of
    which a third is reported as communication."""
    marks = {"forward": clock.mark()}
    x = torch.ones(256, 256, device=device)
    if device == "cuda":
        torch.cuda._sleep(int(compute_s * 2e9))  # ~2 GHz cycles: the device busy, the host not
    else:
        time.sleep(compute_s)
    loss = (x @ x).mean() * step
    marks["step"] = clock.mark()
    time.sleep(step_s)
    marks["end"] = clock.mark()
    losses = {"loss": loss, "loss_classifier": loss / 2}
    return Pending({"step": step}, marks, communication=step_s / 3), losses


@pytest.mark.parametrize("device", DEVICES)
def test_each_record_is_finished_one_iteration_later(device):
    clock = IterationClock(torch.device(device), split=True)
    finished = []
    for step in (1, 2, 3):
        finished.append(clock.push(*iteration(clock, step, device, 0.03, 0.015)))
    assert finished[0] is None  # nothing to finish after the first iteration
    assert [r["step"] for r in finished[1:]] == [1, 2]
    last = clock.drain()
    assert last["step"] == 3 and clock.drain() is None
    for record in finished[1:] + [last]:
        assert record["loss"] == pytest.approx(256.0 * record["step"])
        assert record["loss_classifier"] == pytest.approx(128.0 * record["step"])
        assert record["time_compute"] >= 0.02  # the device's time, not the host's launch
        assert record["time_communication"] == pytest.approx(0.005)
        assert record["time_optimizer"] >= 0.005  # one-sided: a busy machine only lengthens a sleep


def test_no_split_no_marks_but_the_losses():
    clock = IterationClock(torch.device("cpu"), split=False)
    assert clock.mark() is None
    clock.push(*iteration(clock, 1, "cpu", 0, 0))
    record = clock.drain()
    assert record["loss"] == pytest.approx(256.0) and not any(k.startswith("time_") for k in record)


def test_a_server_iteration_has_no_compute():
    clock = IterationClock(torch.device("cpu"), split=True)
    marks = {"step": clock.mark()}
    time.sleep(0.01)
    marks["end"] = clock.mark()
    clock.push(Pending({"step": 1}, marks, communication=0.004), None)
    record = clock.drain()
    assert record["time_compute"] == 0.0 and record["time_optimizer"] >= 0.006 and "loss" not in record
