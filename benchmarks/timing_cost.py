"""What measuring and wrapping cost an iteration: each registered strategy at one process
(nothing to communicate) beside single, and single with the time split on and off, measured
side by side in one process, iteration by iteration.

    .venv/bin/python benchmarks/timing_cost.py [--steps 200] [--size 32] [--images 1]

Fixed per-iteration costs (a wrapper's hooks and buffer broadcast, the byte counting, the time
split's marks, the iteration log) hide behind a slow step: on 2 CPU cores R50-FPN's step is
seconds, while on an H100 a step of 2 images is ~40 ms and 17 ms more was 30 % (issue 38). So
this trains the demo's tiny model on --images in-memory images of --size px a step at one
thread, and takes the milliseconds from iterations, not from runs: run-to-run noise on a
2-core VM was +-20 % for the same run (40-63 ms an iteration), far above the costs sought.
Every case is set up by the loop's own `setup` in this one process (a world of one process
over gloo for the multi-process strategies), then the cases take turns, one iteration each,
through the loop's own `iterate`, in a rotating order: drift hits them alike. It prints each
case's median milliseconds an iteration, the overhead over single (time split on, as every
run measures), and two copies of that single run whose difference is the resolution. The
utilisation sampler is a thread of the process (it would slow every case alike):
benchmarks/monitor_overhead.py times it on against off. On a GPU host the cases train on the
GPU (benchmarks/gpu_check.py's `overhead` item times R50-FPN through the launcher there).
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import one_process_entry  # noqa: E402
from pipeline import strategies  # noqa: E402
from pipeline.config import params, schema, stages  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.report.load import required  # noqa: E402
from pipeline.strategies import REGISTERED, sweep  # noqa: E402

WARMUP = 10  # iterations of each case left out: allocator, autograd and DDP's bucket rebuild
BASELINE = "single"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cases(cfg: schema.Config) -> dict[str, tuple[dict, bool]]:
    """name -> (sweep entry, train.time_split): single each way (twice as measured: the
    resolution), and every other registered strategy at one process."""
    single = {"strategy": "single", "workers": 1}
    found = {
        BASELINE: (single, True),
        f"{BASELINE} (a second copy)": (single, True),
        "single, time split off": (single, False),
    }
    for cls in REGISTERED:
        if cls.name != "single":
            entry = one_process_entry(cls, cfg)
            found[sweep.run_id(sweep.fill(entry, cfg)).rsplit("-s", 1)[0]] = (entry, True)
    return found


class Case:
    """One run, set up by the loop and advanced one iteration at a time."""

    def __init__(self, cfg: schema.Config, entry: dict, split: bool, out: Path):
        from pipeline.training import train  # torch, once the environment names the process

        self.train = train
        cfg = schema.replaced(cfg, train={"time_split": split})
        run = sweep.fill(dict(entry, data_mode="synthetic"), cfg)
        self.skipped = strategies.get(run, cfg.parallel).unavailable()
        if self.skipped:
            return
        self.job = train.setup(stages.view(cfg, "train"), run, out)
        self.job.model.train()
        train.begin_epoch(self.job)
        self.batches = self._batches()
        self.stopwatch = train.Stopwatch(self.job.state)
        progress = train.Progress(1, 0, 1, enabled=False, images_per_step=1)
        # The record is written as a reporting process writes it, to nowhere.
        self.log = train.IterationLog(open(os.devnull, "w"), progress, self.job.precision, 1)
        self.ms: list[float] = []

    def _batches(self):
        while True:  # epoch after epoch: in-memory data, nothing to reshuffle
            yield from self.job.loader

    def step(self) -> None:
        self.stopwatch.lap()
        self.train.iterate(self.job, next(self.batches), self.stopwatch, self.log)
        self.ms.append(1000 * self.stopwatch.lap_seconds())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200, help="timed iterations of each case")
    parser.add_argument("--size", type=int, default=32, help="image side, px")
    parser.add_argument("--images", type=int, default=1, help="images a step")
    args = parser.parse_args()
    os.environ.update(
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    work = Path(tempfile.mkdtemp(prefix="timing-cost-"))
    cfg = schema.replaced(
        cfg,
        data={
            "root": str(work / "data"),
            "workers": 0,
            "aspect_ratio_groups": 0,
            "synthetic": {"image_size": args.size, "train_images": 64, "val_images": 2},
        },
        model={"min_size": args.size, "max_size": args.size},
        train={
            "epochs": 1,
            "lr_steps": [],
            "checkpoint_every": 0,
            "threads": 1,
            "warmup_iters": 0,
            "images_per_worker": args.images,
            "monitor_interval_s": 0,
        },
    )
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    print(
        f"demo's tiny model, {args.images} in-memory image(s) of {args.size} px a step, 1 thread; "
        f"{WARMUP} + {args.steps} iterations of each case, taking turns in one process; "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
        flush=True,
    )
    plan = {name: Case(cfg, entry, split, work / name.replace(" ", "_")) for name, (entry, split) in cases(cfg).items()}
    running = [case for case in plan.values() if not case.skipped]
    for i in range(WARMUP + args.steps):
        shift = i % len(running)  # each case takes each place in the turn as often
        for case in running[shift:] + running[:shift]:
            case.step()
    median = {name: statistics.median(case.ms[WARMUP:]) for name, case in plan.items() if not case.skipped}
    single = median[BASELINE]
    print(f"\n{'case':<30} {'ms/iteration':>12} {'over single':>12} {'x images/s':>11}")
    for name, case in plan.items():
        if case.skipped:
            print(f"{name:<30} skipped: {case.skipped}")
            continue
        print(f"{name:<30} {median[name]:12.2f} {median[name] - single:+12.2f} {single / median[name]:11.3f}")
    resolution = abs(median[f"{BASELINE} (a second copy)"] - single)
    off = median["single, time split off"]
    print(f"\nresolution: the two copies of single differ by {resolution:.2f} ms ({resolution / single:.1%})")
    print(
        f"the time split costs {single - off:+.2f} ms an iteration ({(single - off) / off:+.1%} of the step without it)"
    )


if __name__ == "__main__":
    main()
