"""What a checkpoint costs: seconds per save, and their share of the training time.

    .venv/bin/python benchmarks/checkpoint_cost.py [--epochs 2]

1. Measured: the demo preset's `single` run trained --epochs epochs with train.checkpoint_every
   at the demo's value, and again with 0 (checkpoints at epoch ends only), side by side in this
   one invocation; from each run summary: the saves, their seconds, seconds per save, and their
   share of the training seconds (checkpoints are timed apart from training), and images/s.
2. coco2017's model (fasterrcnn_resnet50_fpn, 91 classes, SGD momentum): a checkpoint of its
   weights and optimizer written 3 times on this machine's disk; with the published time per
   iteration (ddp, 0.6622 s) and that preset's checkpoint_every, the share of training time it
   would take. That share is a prediction (published seconds, this disk), labelled as one.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import params, schema, stages
from pipeline.data import synthetic  # noqa: E402
from pipeline.detection.model import build_model  # noqa: E402
from pipeline.report.load import required, speed  # noqa: E402
from pipeline.runtime.files import save_torch  # noqa: E402
from pipeline.runtime.records.training import RunSummary  # noqa: E402
from pipeline.strategies import sweep
from pipeline.training.train import train  # noqa: E402


def train_seconds(summary: RunSummary) -> float:
    return required(summary.train_seconds, "train_seconds")


def demo_runs(epochs: int, work: Path) -> None:
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    cfg = schema.replaced(cfg, data={"root": str(work / "data")}, train={"epochs": epochs, "lr_steps": []})
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    every = cfg.train.checkpoint_every
    run = sweep.fill({"strategy": "single", "workers": 1}, cfg)
    print(f"measured: demo preset, single, {epochs} epoch(s), this machine")
    for interval in (every, 0):
        timed = schema.replaced(cfg, train={"checkpoint_every": interval})
        out = work / f"every-{interval}"
        train(stages.view(timed, "train"), run, out)
        summary = RunSummary.read(out / "train_summary.json")  # typed (train returns its JSON)
        checkpoints = required(summary.checkpoints, "checkpoints")
        saves, seconds = checkpoints.count, checkpoints.seconds
        print(
            f"  checkpoint_every {interval:>3}: {saves:3d} saves, {seconds:.3f} s, "
            f"{seconds / saves * 1000:.1f} ms per save, {100 * seconds / train_seconds(summary):.2f} % "
            f"of {train_seconds(summary):.1f} s training; {speed(summary):.1f} images/s"
        )


def coco_model(work: Path) -> None:
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017")
    model = build_model(cfg.model.model_copy(update={"backbone_weights": None}), num_classes=91)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for parameter in model.parameters():  # one step, so the momentum buffers exist
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    times = []
    for _ in range(3):
        start = time.perf_counter()
        save_torch(state, work / "coco-checkpoint.pt")
        times.append(time.perf_counter() - start)
    size = (work / "coco-checkpoint.pt").stat().st_size / 2**20
    per_save = statistics.median(times)
    every = cfg.train.checkpoint_every
    sec_per_iter = cfg.report.published.ddp.sec_per_iter
    print(
        f"measured: coco2017 model checkpoint, {size:.0f} MiB, {per_save:.2f} s per save "
        f"(median of 3) on this machine's disk"
    )
    print(
        f"prediction: at checkpoint_every {every} and the published {sec_per_iter} s per "
        f"iteration, {100 * per_save / (every * sec_per_iter):.2f} % of training time"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="checkpoint-bench-") as work:
        demo_runs(args.epochs, Path(work))
        coco_model(Path(work))


if __name__ == "__main__":
    main()
