"""An iteration's seconds split into data wait, compute, communication and optimizer, and its
losses, at no more than one host synchronisation per iteration.

On a GPU the host runs ahead of the device: a clock read around a kernel launch times the
launch, not the work, and a torch.cuda.synchronize() per phase empties the device's queue
(issue 15 measured 4-5 % of throughput lost to two of them per iteration). So the phases are
bounded by CUDA events recorded on the stream, the losses are copied to page-locked memory
without blocking, and an iteration's record is completed one iteration later: by then its
events have fired while the next iteration's work is already queued, so waiting on them (the
one synchronisation) stalls nothing. On a CPU every operation has finished when it returns,
so a mark is a clock reading; the record is still completed one iteration later, so the same
path runs, and is tested, on both.

`train.time_split: false` records no marks at all (data wait and iteration time, which cost
two clock reads, stay): the benchmark compares the two to show what measuring costs.
`train.sync_debug` checks the claim on a GPU (`SyncCheck`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch


@dataclass
class Pending:
    """One iteration whose device work may still be running."""

    record: dict  # what the host knew at its end
    marks: dict  # phase name -> mark ("forward" is absent without data)
    losses: torch.Tensor | None = None  # the loss and its terms, on their way to the host
    loss_names: tuple = ()
    copied: torch.cuda.Event | None = None  # the CUDA event after that copy (None on a CPU)
    communication: float = 0.0  # seconds the strategy reported communicating
    backward_wait: float = 0.0  # seconds backward waited on DDP's last bucket


class IterationClock:
    def __init__(self, device: torch.device, split: bool):
        self.cuda = device.type == "cuda"
        self.split = split
        self.pending: Pending | None = None

    def mark(self):
        """A point on the device's timeline; None when the split is off."""
        if not self.split:
            return None
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1000 if self.cuda else end - start

    def push(self, pending: Pending, losses: dict[str, torch.Tensor] | None) -> dict | None:
        """Queue this iteration (its losses start their copy to the host) and return the
        previous iteration's finished record, or None for the first."""
        if losses:
            pending.loss_names = tuple(losses)
            stacked = torch.stack([value.detach().float() for value in losses.values()])
            if self.cuda:
                host = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
                host.copy_(stacked, non_blocking=True)
                pending.copied = torch.cuda.Event()
                pending.copied.record()
                stacked = host
            pending.losses = stacked
        finished = self.drain()
        self.pending = pending
        return finished

    def drain(self) -> dict | None:
        """Finish the queued iteration (if any): wait for it (the one synchronisation) and
        fill in its losses and phase seconds."""
        pending, self.pending = self.pending, None
        if pending is None:
            return None
        if pending.copied is not None:
            pending.copied.synchronize()
        record = pending.record
        if pending.losses is not None:
            record.update(zip(pending.loss_names, pending.losses.tolist(), strict=False))
        if self.split:
            if self.cuda:
                pending.marks["end"].synchronize()
            marks = pending.marks
            compute = self._seconds(marks["forward"], marks["step"]) if "forward" in marks else 0.0
            step = self._seconds(marks["step"], marks["end"])
            # DDP's all-reduce runs inside backward: the part backward waited for it counts as
            # communication, not compute.
            record.update(
                time_compute=compute - pending.backward_wait,
                time_communication=pending.communication + pending.backward_wait,
                time_optimizer=step - pending.communication,
            )
        return record


class SyncCheck:
    """`train.sync_debug` on a GPU: from the `after`-th iteration on (allocator, cuDNN and
    DDP's bucket rebuild settle first), each iteration runs under
    torch.cuda.set_sync_debug_mode("error"), so that a host-device synchronisation by the
    loop, the strategy or the measuring raises where it happens. The detector's own forward
    is let off (hooks on `model`): torchvision's detection ops read sizes on the host, as they
    must, and those are the same for every strategy. Off (or on a CPU), it does nothing."""

    def __init__(self, model: torch.nn.Module, after: int, enabled: bool):
        self.after, self.enabled, self.active = after, enabled, False
        if enabled:
            model.register_forward_pre_hook(lambda *_: self._mode("default"))
            model.register_forward_hook(lambda *_: self._mode("error"))

    def _mode(self, mode: str) -> None:
        if self.active:
            torch.cuda.set_sync_debug_mode(mode)

    @contextlib.contextmanager
    def iteration(self, step: int):
        self.active = self.enabled and step >= self.after
        self._mode("error")
        try:
            yield
        finally:
            self._mode("default")
            self.active = False
