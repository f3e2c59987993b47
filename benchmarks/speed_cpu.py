"""The demo's speed on this CPU before and after issue 11's options, side by side in one run.

    .venv/bin/python benchmarks/speed_cpu.py [--passes 3] [--seeds 3] [--images 5000]

1. Throughput: the demo preset's single and ddp-w2 runs, one epoch each, passes interleaved
   (before, fp32, bf16, bf16 + channels-last, before, ...), median images/s and the data
   wait's share of an iteration. "before" is the fp32 path as it was: torchvision's own
   single-threaded roi_align backward (FRCNN_BENCH_ROI_ALIGN=torchvision).
2. Accuracy: the demo's single run trained in full for --seeds seeds in fp32 and in bf16,
   AP and AP50 mean ± sd (the speed-up only counts at an AP50 at most 0.01 lower).
3. Evaluation: pycocotools against faster-coco-eval, seconds and the largest difference of the
   twelve numbers, on the accuracy runs' predictions and on --images synthetic COCO images
   with 20 detections each (val2017 is 5,000 images).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import evaluate, train  # noqa: E402
from pipeline.config import params, schema
from pipeline.data import synthetic  # noqa: E402
from pipeline.detection.scoring import BACKENDS, METRICS, coco_metrics  # noqa: E402
from pipeline.report.load import required  # noqa: E402
from pipeline.runtime.records.training import RunSummary  # noqa: E402
from pipeline.strategies import sweep

CONFIGS = {
    "before": ("fp32", False, "torchvision"),
    "fp32": ("fp32", False, ""),
    "bf16": ("bf16", False, ""),
    "bf16+channels-last": ("bf16", True, ""),
}
ENTRIES = [{"strategy": "single", "workers": 1}, {"strategy": "ddp", "workers": 2, "images_per_worker": 4}]


def train_run(cfg: schema.Config, entry: dict, config: str, out: Path) -> RunSummary:
    precision, channels_last, roi_align = CONFIGS[config]
    cfg = schema.replaced(cfg, train={"channels_last": channels_last})
    run = sweep.fill(dict(entry, precision=precision), cfg)
    return train(cfg, run, out, env={"FRCNN_BENCH_ROI_ALIGN": roi_align})


def throughput(cfg: schema.Config, work: Path, passes: int) -> None:
    cfg = schema.replaced(cfg, train={"epochs": 1, "lr_steps": []})
    print(
        f"1. throughput: demo, 1 epoch of {required(cfg.data.synthetic, 'data.synthetic').train_images} images, "
        f"{passes} interleaved passes, median"
    )
    for entry in ENTRIES:
        speed: dict[str, list[float]] = {c: [] for c in CONFIGS}
        wait: dict[str, list[float]] = {c: [] for c in CONFIGS}
        for p in range(passes):
            for config in CONFIGS:
                summary = train_run(cfg, entry, config, work / f"speed-{entry['strategy']}-{config}-{p}")
                split, per_iteration = (
                    required(summary.time_split, "time_split"),
                    required(summary.sec_per_iter, "sec_per_iter"),
                )
                speed[config].append(required(summary.images_per_second, "images_per_second"))
                wait[config].append(required(split.data, "time_split.data") / per_iteration.mean)
        before = statistics.median(speed["before"])
        for config in CONFIGS:
            value = statistics.median(speed[config])
            print(
                f"   {entry['strategy']:<6} {config:<19} {value:6.1f} images/s  x{value / before:.2f}"
                f"  data wait {100 * statistics.median(wait[config]):.1f} % of an iteration"
            )


def accuracy(cfg: schema.Config, work: Path, seeds: int) -> list[Path]:
    print(f"2. accuracy: demo single, full recipe, seeds 0..{seeds - 1}")
    runs = []
    for config in ("fp32", "bf16"):
        scores = []
        for seed in range(seeds):
            seeded = schema.replaced(cfg, train={"seed": seed})
            out = work / f"accuracy-{config}-{seed}"
            train_run(seeded, ENTRIES[0], config, out)
            scores.append(evaluate(seeded, sweep.fill(ENTRIES[0], seeded), out))
            runs.append(out)
        for name in ("AP", "AP50"):
            values = [getattr(s, name) for s in scores]
            spread = statistics.stdev(values) if len(values) > 1 else 0
            print(
                f"   {config:<5} {name:<5} {statistics.mean(values):.4f} ± {spread:.4f}"
                f"  ({', '.join(f'{v:.3f}' for v in values)})"
            )
    return runs


def synthetic_ground_truth(path: Path, images: int, seed: int = 0) -> tuple[dict, list[dict]]:
    """COCO-like ground truth (1-8 objects per image over 80 categories) and 20 detections per
    image, jittered from the objects or false."""
    rng = random.Random(seed)
    doc = {"images": [], "annotations": [], "categories": [{"id": c, "name": str(c)} for c in range(1, 81)]}
    found = []
    for i in range(1, images + 1):
        doc["images"].append({"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480})
        for _ in range(rng.randint(1, 8)):
            w, h = rng.uniform(8, 300), rng.uniform(8, 300)
            x, y = rng.uniform(0, 640 - w), rng.uniform(0, 480 - h)
            doc["annotations"].append(
                {
                    "id": len(doc["annotations"]) + 1,
                    "image_id": i,
                    "category_id": rng.randint(1, 80),
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
            found.append(
                {
                    "image_id": i,
                    "category_id": doc["annotations"][-1]["category_id"],
                    "bbox": [x + rng.gauss(0, 0.1 * w), y + rng.gauss(0, 0.1 * h), w, h],
                    "score": rng.random(),
                }
            )
        while sum(1 for d in found if d["image_id"] == i) < 20:
            found.append(
                {
                    "image_id": i,
                    "category_id": rng.randint(1, 80),
                    "score": rng.random() * 0.5,
                    "bbox": [rng.uniform(0, 500), rng.uniform(0, 400), rng.uniform(8, 140), rng.uniform(8, 80)],
                }
            )
    path.write_text(json.dumps(doc))
    return doc, found


def evaluation(cfg: schema.Config, runs: list[Path], work: Path, images: int) -> None:
    print("3. evaluation: pycocotools vs faster-coco-eval")
    gt = Path(cfg.data.root) / "annotations" / "instances_val2017.json"
    cases = [
        (f"demo predictions ({run.name})", gt, json.loads((run / "predictions.json").read_text())) for run in runs[:1]
    ]
    big = work / "instances_synthetic.json"
    _, found = synthetic_ground_truth(big, images)
    cases.append((f"{images} synthetic images, 20 detections each", big, found))
    for name, truth, detections in cases:
        seconds, numbers = {}, {}
        for backend in BACKENDS:
            start = time.perf_counter()
            numbers[backend] = coco_metrics(truth, detections, backend=backend)
            seconds[backend] = time.perf_counter() - start
        worst = max(abs(numbers["pycocotools"][m] - numbers["faster-coco-eval"][m]) for m in METRICS)
        print(
            f"   {name}: pycocotools {seconds['pycocotools']:.2f} s, faster-coco-eval "
            f"{seconds['faster-coco-eval']:.2f} s (x{seconds['pycocotools'] / seconds['faster-coco-eval']:.1f}); "
            f"largest difference of the twelve numbers {worst:.1e}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--skip", nargs="*", default=[], choices=["throughput", "accuracy"])
    args = parser.parse_args()
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    work = Path(tempfile.mkdtemp(prefix="speed-cpu-"))
    cfg = schema.replaced(cfg, data={"root": str(work / "data")}, train={"monitor_interval_s": 0})
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    print(f"machine: {os.cpu_count()} cores; work in {work}")
    if "throughput" not in args.skip:
        throughput(cfg, work, args.passes)
    runs = accuracy(cfg, work, args.seeds) if "accuracy" not in args.skip else []
    evaluation(cfg, runs, work, args.images)


if __name__ == "__main__":
    main()
