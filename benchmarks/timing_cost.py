"""What measuring and wrapping cost an iteration: each registered strategy at one process
(nothing to communicate) beside single, and single with the project's instrumentation on and
off, side by side in one run (passes interleaved, medians).

    .venv/bin/python benchmarks/timing_cost.py [--passes 5] [--steps 40] [--size 32] [--images 1]

Fixed per-iteration costs (a wrapper's hooks and buffer broadcast, the byte counting, the time
split's marks, the utilisation sampler, the iteration log) hide behind a slow step: on 2 CPU
cores R50-FPN's step is seconds, so milliseconds of overhead vanish, while on an H100 a step
of 2 images is ~40 ms and 17 ms more was 30 % (issue 38). So this trains the demo's tiny
model on --images images of --size px a step at one thread, through the real launcher and
loop, and reads each iteration's own time from its log: the median after the warm-up, per run,
then the median over passes. It prints milliseconds an iteration and the overhead over single
(the same instrumentation), and single's instrumentation on against off. On a GPU host the
runs train on the GPU (benchmarks/gpu_check.py's `overhead` item times the detector there).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import one_process_entry, train  # noqa: E402
from pipeline.config import params  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.strategies import REGISTERED, sweep  # noqa: E402

WARMUP = 5  # iterations left out: allocator, autograd and DDP's bucket rebuild settle
# single's instrumentation: (train.time_split, train.monitor_interval_s)
INSTRUMENTATION = {"off": (False, 0.0), "time split": (True, 0.0), "time split + sampler": (True, 0.5)}
DEFAULT = "time split + sampler"  # what every workflow run measures with


def cases(cfg: dict) -> dict[str, tuple[dict, str]]:
    """name -> (sweep entry, instrumentation): single each way, every strategy at one process."""
    found = {f"single, {way}": ({"strategy": "single", "workers": 1}, way) for way in INSTRUMENTATION}
    for cls in REGISTERED:
        if cls.name != "single":
            entry = one_process_entry(cls, cfg)
            found[sweep.run_id(sweep.fill(entry, cfg)).rsplit("-s", 1)[0]] = (entry, DEFAULT)
    return found


def ms_per_iteration(cfg: dict, entry: dict, way: str, out: Path) -> float | str:
    """The median time of one iteration after the warm-up, in ms; or why the run did not run."""
    cfg = json.loads(json.dumps(cfg))
    cfg["train"]["time_split"], cfg["train"]["monitor_interval_s"] = INSTRUMENTATION[way]
    summary = train(cfg, sweep.fill(entry, cfg), out)
    if summary["status"] != "ok":
        return summary["reason"]
    times = [json.loads(line)["time_iter"] for line in (out / "iterations.jsonl").read_text().splitlines()]
    return 1000 * statistics.median(times[WARMUP:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="iterations a run (after 5 of warm-up)")
    parser.add_argument("--size", type=int, default=32, help="image side, px")
    parser.add_argument("--images", type=int, default=1, help="images a step")
    args = parser.parse_args()
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    work = Path(tempfile.mkdtemp(prefix="timing-cost-"))
    steps = WARMUP + args.steps
    cfg["data"].update(root=str(work / "data"), workers=0, aspect_ratio_groups=0)
    cfg["data"]["synthetic"].update(image_size=args.size, train_images=steps * args.images, val_images=2)
    synthetic.generate(cfg["data"]["root"], cfg["data"]["synthetic"])
    cfg["model"].update(min_size=args.size, max_size=args.size)
    cfg["train"].update(epochs=1, lr_steps=[], checkpoint_every=0, threads=1, warmup_iters=0,
                        images_per_worker=args.images)
    cfg["eval"]["every_epochs"] = 0
    print(f"demo's tiny model, {args.images} image(s) of {args.size} px a step, 1 thread, "
          f"{args.steps} timed iterations a run, {args.passes} interleaved passes; "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores; work in {work}",
          flush=True)
    plan = cases(cfg)
    ms: dict[str, list] = {name: [] for name in plan}
    for p in range(args.passes):
        for name, (entry, way) in plan.items():
            ms[name].append(ms_per_iteration(cfg, entry, way, work / f"{p}-{name.replace(' ', '')}"))
        print(f"   pass {p + 1}: " + ", ".join(
            f"{n} {v[-1]:.2f}" if isinstance(v[-1], float) else f"{n} skipped" for n, v in ms.items()),
            flush=True)
    median = {name: statistics.median(v) for name, v in ms.items() if isinstance(v[0], float)}
    single = median[f"single, {DEFAULT}"]
    print(f"\n{'run':<34} {'ms/iteration':>12} {'over single':>12} {'x images/s':>11}")
    for name, values in ms.items():
        if name not in median:
            print(f"{name:<34} skipped: {values[0]}")
            continue
        over = median[name] - single
        print(f"{name:<34} {median[name]:12.2f} {over:+12.2f} {single / median[name]:11.3f}")
    off = median["single, off"]
    print(f"\nsingle's instrumentation, on against off: "
          + ", ".join(f"{way} {median[f'single, {way}'] - off:+.2f} ms "
                      f"({(median[f'single, {way}'] - off) / off:+.1%})" for way in INSTRUMENTATION if way != "off"))


if __name__ == "__main__":
    main()
