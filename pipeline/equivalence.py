"""How far one step of each multi-worker strategy lands from `single` on Faster R-CNN.

    python -m pipeline.equivalence --config '<preset JSON>' --out results/equivalence/demo.json

From the same initial weights and the same global batch (single: 8 images; ddp and ps: 2
workers x 4, the same 8 images), each strategy takes one SGD step; we compare the weights.
On a loss that is a mean over samples the averaged shard gradients equal the merged-batch
gradient exactly (tests/test_strategies.py shows it to 1e-6). Faster R-CNN's loss is not, for
two reasons (WHY), so the step differs from `single` by an amount reported here, relative to the
step itself, while the replicas stay identical to each other.

With the tiny model, each cause is measured with and without it (`causes`, one per norm): ddp's
step is taken again with GroupNorm (no batch statistics), and pipeline/detection/split_probe.py
sets the split beside a resampling of the same 8 images (sampling alone).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import torch

from . import strategies
from .config import cli, schema
from .detection import split_probe
from .detection.model import build_model
from .launch import command
from .runtime import distributed, lifetime
from .runtime.files import write_json
from .runtime.run import NORMS, Run
from .strategies import sweep

WHY = (
    "Two causes make averaged per-worker gradients differ from the gradient of the merged "
    "batch: BatchNorm trained from scratch normalises over each worker's images, not the "
    "whole batch; and Faster R-CNN's RPN and box-head losses sample anchors and proposals "
    "per image batch, normalise by the sample count, and each worker draws its samples with "
    "its own random stream. On a loss that is a plain mean over samples the strategies agree "
    "to float rounding (tested). The replicas of one run stay identical to each other."
)
ABLATED = "groupnorm"  # the tiny model's norm without batch statistics


def start_step(cfg: schema.TrainStage, run: Run, out: Path) -> subprocess.Popen:
    """One SGD step of `run`, started as the workflow starts a training job."""
    argv = command(cfg, run, str(out / sweep.run_id(run))) + ["--max-steps", "1"]
    return subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=functools.partial(lifetime.become_launcher, os.getpid()),
    )


def finished_step(run: Run, started: subprocess.Popen, out: Path) -> dict[str, torch.Tensor]:
    """The weights after the step `started` took, or an error naming the run."""
    name = sweep.run_id(run)
    _, stderr = started.communicate()
    if started.returncode != 0:
        raise RuntimeError(f"{name}: one step failed:\n{stderr[-2000:]}")
    return torch.load(out / name / "model_final.pt", weights_only=True)["model"]


def one_step_each(cfg: schema.TrainStage, runs: dict[str, Run], out: Path) -> dict[str, dict]:
    """The weights after one step of each run. On CPU two run at once: each is mostly process
    start-up, so the second core would idle; on GPUs one at a time, each with the devices."""
    at_once = 1 if distributed.gpu_count() else 2
    names, states = list(runs), {}
    for first in range(0, len(names), at_once):
        batch = names[first : first + at_once]
        started = {name: start_step(cfg, runs[name], out) for name in batch}
        for name in batch:
            states[name] = finished_step(runs[name], started[name], out)
    return states


def with_ablation(runs: list[Run]) -> list[Run]:
    """The check's runs, and the baseline's and ddp's again under GroupNorm where ddp is
    checked with BatchNorm: the step without batch statistics."""
    ablated = [r.replace(norm=ABLATED) for r in runs if r.norm != ABLATED and (r is runs[0] or r.strategy == "ddp")]
    return runs + ablated if len(ablated) == 2 else runs


def flat(state: dict, names: list[str]) -> torch.Tensor:
    return torch.cat([state[n].flatten() for n in names])


def step_distance(state: dict, reference: dict, initial: dict, names: list[str]) -> float:
    """|step - reference's step| / |reference's step| over the weights `names`."""
    return split_probe.distance(
        flat(state, names) - flat(initial, names), flat(reference, names) - flat(initial, names)
    )


def measure(
    stage_cfg: schema.EquivalenceStage, compared: list[str] | None = None, norms: list[str] | None = None
) -> dict:
    """One step of each strategy `compared` (sweep.equivalence_runs) against the baseline; and
    where the sweep trains the tiny model under both `norms` (sweep.swept_norms), each cause
    with and without it (`causes`). Without that question asked, nothing of it runs."""
    cfg = schema.TrainStage.model_validate(
        schema.merged(
            stage_cfg.model_dump(),
            {
                # The same pixels for every strategy (no random flips), and the full learning rate.
                "data": {"horizontal_flip": 0.0},
                "train": {"warmup_iters": 0, "epochs": 1},
                "eval": {"every_epochs": 0, "batch_size": 1},  # one step: nothing to evaluate during training
                # On one node, whatever parallel.nnodes says: the rule's job asks for one node, and a
                # torchrun told to expect a second node would wait for it forever.
                "parallel": {"nnodes": 1},
            },
        )
    )
    listed = sweep.equivalence_runs(cfg, compared)
    ablating = cfg.model.arch == "tiny" and set(norms or ()) == set(NORMS)
    if ablating:
        listed = with_ablation(listed)
    runs = {sweep.run_id(r): r for r in listed}
    skipped = {name: why for name, r in runs.items() if (why := strategies.get(r, cfg.parallel).unavailable())}
    with tempfile.TemporaryDirectory(prefix="equivalence-") as work:
        states = one_step_each(cfg, {name: r for name, r in runs.items() if name not in skipped}, Path(work))
    num_classes = states[next(iter(states))]["roi_heads.box_predictor.cls_score.weight"].shape[0]
    initial = {}
    for norm in {r.norm for r in listed}:
        torch.manual_seed(cfg.train.seed)  # the initial weights, as train.py makes them
        initial[norm] = build_model(
            cfg.model.model_copy(update={"norm": norm, "backbone_weights": None}), num_classes
        ).state_dict()
    # Each run against the baseline's run under its own norm (the first of each norm).
    references: dict[str, Any] = {}
    for name, r in runs.items():
        references.setdefault(r.norm, name)
    reference_id = references[cfg.model.norm]
    reference = states[reference_id]
    names = [n for n, v in reference.items() if v.is_floating_point() and "running" not in n]
    step = max((reference[n] - initial[cfg.model.norm][n]).abs().max().item() for n in names)
    results: dict[str, dict[str, Any]] = {name: {"skipped": why} for name, why in skipped.items()}
    launched = {}
    for name, state in states.items():
        norm = runs[name].norm
        if name == references[norm]:
            continue
        own = [n for n in state if state[n].is_floating_point() and "running" not in n]
        distance = step_distance(state, states[references[norm]], initial[norm], own)
        if runs[name].strategy == "ddp":
            launched[norm] = distance
        if norm != cfg.model.norm:
            continue
        diff = max((state[n] - reference[n]).abs().max().item() for n in names)
        results[name] = {
            "max_abs_difference": diff,
            "relative_to_step": diff / step if step else None,
            "step_distance": distance,
        }
    causes = (
        [dataclasses.replace(split_probe.measure(cfg, norm), launched=launched.get(norm)) for norm in NORMS]
        if ablating
        else []
    )
    return {
        "reference": reference_id,
        "max_abs_step_of_single": step,
        "strategies": results,
        "why": WHY,
        **({"causes": [c.to_json() for c in causes]} if causes else {}),
    }


def main(argv: list[str] | None = None) -> None:
    def body(args):
        report = measure(args.cfg, args.strategies.split(","), args.norms.split(","))
        write_json(args.out, report)
        print(json.dumps(report["strategies"], indent=1))

    def arguments(parser):
        parser.add_argument("--out", required=True)
        parser.add_argument(
            "--strategies", required=True, help="comma-separated: the strategies the sweep runs (sweep.swept)"
        )
        parser.add_argument(
            "--norms", default="batchnorm", help="comma-separated: the norms the sweep trains with (sweep.swept_norms)"
        )

    cli.run_stage(
        "One-step difference of each strategy from single.", body, stage="equivalence", arguments=arguments, argv=argv
    )


if __name__ == "__main__":
    main()
