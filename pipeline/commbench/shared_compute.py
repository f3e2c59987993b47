"""How much slower the detector computes when every process of a job computes at once: the
cost model's compute input is `single`'s, measured with the host to itself, while the processes
of a multi-process run share what their devices do not (on a CPU: the cores' caches, memory
bandwidth and, where the cores are hyperthreads, the cores themselves; on GPUs: the host that
feeds them). Measured here, with the run's own model, instead of assumed to be 1.

Rank 0 times a forward + backward alone while the other ranks wait at a barrier, then every rank
times the same at once; the factor is the mean rank's median together over rank 0's median
alone. The commbench stage (__main__.py) runs it beside the links and keeps it in its
JSON, and times with `together` what a strategy that asks for it (`Strategy.calibrate`: FSDP2)
adds to the same step when it wraps the model. Each timing keeps the spread of its repeats, and
the stage measures again what falls outside its band (pipeline/costmodel/bands.py).
"""

from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

from ..config import schema
from ..costmodel import bands
from ..detection.model import build_model
from . import in_step
from .links import (
    reduced,  # over the ranks, on the collective's device
    seconds_of,  # the one timer of everything commbench times
    with_other_load,  # ... and what else loaded the machine meanwhile
)

NUM_CLASSES = 2  # the box predictor's last layer, negligible beside the rest of the model
WARMUPS = 3


class Step:
    """A callable training forward + backward of `model` on one batch; `model` is what
    in_step.py sizes its buckets and messages by."""

    def __init__(self, model: torch.nn.Module, batch: list[torch.Tensor], targets: list[dict]):
        self.model, self.batch, self.targets = model, batch, targets

    def __call__(self) -> None:
        self.model.zero_grad(set_to_none=True)
        sum(self.model(self.batch, self.targets).values()).backward()


def step_of(model_cfg: schema.Model, images: int, device: torch.device, wrap=None) -> Step:
    """One training forward + backward of the run's detector (built without downloaded weights)
    on `images` square images of the model's min_size, one box each, as a callable; the model
    wrapped by `wrap(model)` where given (a strategy's)."""
    torch.manual_seed(0)
    model = build_model(model_cfg.model_copy(update={"backbone_weights": None}), num_classes=NUM_CLASSES)
    model.to(device).train()
    if wrap is not None:
        model = wrap(model)
    side = model_cfg.min_size
    batch = [torch.rand(3, side, side, device=device) for _ in range(images)]
    box = torch.tensor([[side * 0.2, side * 0.2, side * 0.6, side * 0.7]], device=device)
    targets = [{"boxes": box, "labels": torch.ones(1, dtype=torch.int64, device=device)} for _ in range(images)]
    return Step(model, batch, targets)


def measure(
    model_cfg: schema.Model,
    images: int,
    repeats: int,
    device: torch.device,
    rank: int,
    processes: int,
    expected: float = 1.0,
    primitives: dict | None = None,
) -> dict:
    """{alone_s, together_s, factor, images, repeats, alone_spread, together_spread, expected}:
    the medians (seconds per step), their ratio, the relative spreads of their repeats
    (bands.relative_spread; together's, the largest rank's) and the factor a quiet machine
    shows (bands.expected_factor), the same on every rank. With the links' fits
    (`primitives`), each repeat together also exchanges as a step does, and `in_step` holds
    the terms fitted from it (in_step.py)."""
    step = step_of(model_cfg, images, device)
    exchanges = (
        in_step.Exchanges(in_step.ddp_buckets(step.model), rank, processes, device)
        if primitives and processes > 1
        else None
    )
    for _ in range(WARMUPS):
        step()
    alone = []
    for _ in range(repeats):
        dist.barrier()
        if rank == 0:
            alone.append(seconds_of(step, device))
        dist.barrier()
    alone_s, alone_spread = reduced(  # rank 0's, on every rank
        [statistics.median(alone) if rank == 0 else 0.0, bands.relative_spread(alone) if rank == 0 else 0.0], device
    )
    together_s, together_spread = together_timed(step, repeats, device, processes, warmups=0, around=exchanges)
    in_step_terms = {"in_step": exchanges.fitted(primitives, alone, images)} if exchanges and primitives else {}
    return {
        "alone_s": alone_s,
        "together_s": together_s,
        "factor": together_s / alone_s,
        "images": images,
        "repeats": repeats,
        "alone_spread": alone_spread,
        "together_spread": together_spread,
        "expected": expected,
        **in_step_terms,
    }


def together(step, repeats: int, device: torch.device, processes: int, warmups: int = WARMUPS) -> float:
    """The mean rank's median seconds of `step()` with every process running it at once
    (after `warmups` untimed calls: the first allocate, and FSDP2's its buffers), the same on
    every rank."""
    return together_timed(step, repeats, device, processes, warmups)[0]


def together_timed(
    step,
    repeats: int,
    device: torch.device,
    processes: int,
    warmups: int = WARMUPS,
    around: in_step.Exchanges | None = None,
) -> tuple[float, float]:
    """`together`'s seconds, and the largest rank's relative spread of its repeats; `around`
    exchanges during and after each repeat as a step does (untimed here)."""
    for _ in range(warmups):
        step()
    samples = []
    for i in range(repeats):
        dist.barrier()
        if around:
            around.before(i)
        samples.append(seconds_of(step, device))
        if around:
            around.after(i, samples[-1])
    (mean,) = reduced([statistics.median(samples) / processes], device)
    (spread,) = reduced([bands.relative_spread(samples)], device, op=dist.ReduceOp.MAX)
    return mean, spread


def calibrations(
    strategies,
    model_cfg: schema.Model,
    images: int,
    repeats: int,
    device: torch.device,
    processes: int,
    retries: int,
    shared: dict | None = None,
    speak: bool = True,
    rank: int = 0,
) -> dict:
    """{images, repeats, strategies: name -> its timings, checks: name -> its check} for each
    strategy whose `calibrate` times itself on the model (pipeline/strategies/base.py), the same
    on every rank. Each is timed again, up to `retries` times, while outside its band
    (bands.calibration_verdict, against `shared`: measure's dict, where measured)."""
    found, checks = {}, {}
    alone_s, expected = (shared or {}).get("alone_s", 0.0), (shared or {}).get("expected", 1.0)
    for strategy in strategies:
        spreads: list[float] = []

        def timed(wrap, spreads=spreads) -> float:
            seconds, spread = together_timed(step_of(model_cfg, images, device, wrap), repeats, device, processes)
            spreads.append(spread)
            return seconds

        def once(strategy=strategy, spreads=spreads) -> dict:
            spreads.clear()
            return {"timings": strategy.calibrate(timed), "spread": max(spreads, default=0.0)}

        first = with_other_load(once, device, rank)
        if first["timings"] is None:
            continue  # nothing to time: its links say it all
        pending = [first]
        result, checks[strategy.name] = bands.checked(
            f"{strategy.name} timed on the model over {processes} processes",
            lambda: pending.pop() if pending else with_other_load(once, device, rank),  # noqa: B023 (called here)
            lambda r: bands.calibration_verdict(r, alone_s, expected),
            lambda r: {**r["timings"], "spread": r["spread"], "other_load": r["other_load"]},
            retries,
            speak=speak,
        )
        found[strategy.name] = result["timings"]
    return {"images": images, "repeats": repeats, "strategies": found, "checks": checks}
