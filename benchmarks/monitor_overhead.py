"""The utilisation sampler's cost: images/s of the same training with sampling on and off.

    .venv/bin/python benchmarks/monitor_overhead.py [--repeats 5] [--train-images 160]

Trains the demo model (params.yaml's demo preset, one epoch, `single` and `ddp` w2) with
train.monitor_interval_s at its default and at 0 (off), alternating on and off --repeats
times in this one invocation, and prints the median images/s of each and their ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import train  # noqa: E402
from pipeline.config import params, schema
from pipeline.data import synthetic  # noqa: E402
from pipeline.report.load import required, speed  # noqa: E402
from pipeline.runtime.run import Run  # noqa: E402
from pipeline.strategies import sweep

ENTRIES = [{"strategy": "single", "workers": 1}, {"strategy": "ddp", "workers": 2, "images_per_worker": 4}]


def images_per_second(cfg: schema.Config, run: Run, out: Path) -> float:
    return speed(train(cfg, run, out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--train-images", type=int, default=160)
    args = parser.parse_args()
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    work = Path(tempfile.mkdtemp(prefix="monitor-bench-"))
    cfg = schema.replaced(
        cfg,
        data={"root": str(work / "data"), "synthetic": {"train_images": args.train_images}},
        train={"epochs": 1, "lr_steps": []},
    )
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    interval = cfg.train.monitor_interval_s
    print(
        f"demo model, 1 epoch of {args.train_images} images, sampling every {interval} s vs off, "
        f"{args.repeats} alternating passes; median images/s"
    )
    for entry in ENTRIES:
        run = sweep.fill(entry, cfg)
        speeds: dict[str, list[float]] = {"on": [], "off": []}
        for repeat in range(args.repeats):
            for mode, seconds in (("on", interval), ("off", 0)):
                sampled = schema.replaced(cfg, train={"monitor_interval_s": seconds})
                out = work / f"{sweep.run_id(run)}-{mode}-{repeat}"
                speeds[mode].append(images_per_second(sampled, run, out))
        on, off = median(speeds["on"]), median(speeds["off"])
        print(
            f"{sweep.run_id(run):<14} on {on:7.2f}  off {off:7.2f}  on/off {on / off:.4f}  "
            f"(overhead {100 * (1 - on / off):+.2f} %)"
        )


if __name__ == "__main__":
    main()
