"""What measuring and wrapping cost: images/s of the demo's single run with the per-phase time
split on and off (train.time_split), and of ddp with one process against single at the same
batch, side by side in one run (passes interleaved, medians).

    .venv/bin/python benchmarks/timing_cost.py [--preset demo] [--passes 5] [--epochs 1]

Issue 15's targets: the split costs under 3 %, and so does ddp on one device. On a GPU host the
runs train on the GPU (the preset's model and data as they are).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import train  # noqa: E402
from pipeline.config import params
from pipeline.data import synthetic  # noqa: E402
from pipeline.strategies import sweep

# name -> (sweep entry, train.time_split)
CASES = {"single, split on": ({"strategy": "single", "workers": 1}, True),
         "single, split off": ({"strategy": "single", "workers": 1}, False),
         "ddp w1, split on": ({"strategy": "ddp", "workers": 1}, True)}
RATIOS = [("split off / on (single)", "single, split off", "single, split on"),
          ("ddp w1 / single", "ddp w1, split on", "single, split on")]


def images_per_second(cfg: dict, entry: dict, split: bool, out: Path) -> float:
    cfg = json.loads(json.dumps(cfg))
    cfg["train"]["time_split"] = split
    return train(cfg, sweep.fill(entry, cfg), out)["images_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    cfg = params.load_resolved(REPO / "params.yaml", preset=args.preset)
    work = Path(tempfile.mkdtemp(prefix="timing-cost-"))
    if cfg["data"]["synthetic"] is not None:
        cfg["data"]["root"] = str(work / "data")
        synthetic.generate(cfg["data"]["root"], cfg["data"]["synthetic"])
    cfg["train"].update(epochs=args.epochs, lr_steps=[], monitor_interval_s=0, checkpoint_every=0)
    cfg["eval"]["every_epochs"] = 0
    print(f"{args.preset}, {args.epochs} epoch(s), {args.passes} interleaved passes; "
          f"{os.cpu_count()} cores; work in {work}", flush=True)
    speed = {name: [] for name in CASES}
    for p in range(args.passes):
        for name, (entry, split) in CASES.items():
            speed[name].append(images_per_second(cfg, entry, split, work / f"{p}-{name.replace(' ', '')}"))
        print(f"   pass {p + 1}: " + ", ".join(f"{n} {v[-1]:.1f}" for n, v in speed.items()), flush=True)
    for name, values in speed.items():
        print(f"{name:<20} {statistics.median(values):7.1f} images/s (median; min {min(values):.1f}, max {max(values):.1f})")
    for label, a, b in RATIOS:
        ratio = statistics.median(speed[a]) / statistics.median(speed[b])
        per_pass = [x / y for x, y in zip(speed[a], speed[b])]
        print(f"{label:<24} x{ratio:.3f}  (per pass: {', '.join(f'{r:.3f}' for r in per_pass)})")


if __name__ == "__main__":
    main()
