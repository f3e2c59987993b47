"""Faster R-CNN R50-FPN training throughput on one GPU: fp32 against AMP, with and without
channels-last, the model alone and through the project's training loop.

    python benchmarks/gpu_throughput.py [--images-per-gpu 2] [--iterations 50] [--size 800 1333]
        [--pipeline-batches 2 8 16] [--pipeline-iterations 30] [--skip model|pipeline]

Part 2 (issue 15's table) trains the `single` run of the coco2017 preset through
pipeline/training/train.py, the loader included (data.workers: auto, pinned memory), on synthetic
640 px images that the model resizes to 800x800, for each batch in --pipeline-batches and fp32 /
bf16: images/s, the data wait's share of an iteration, and the GPU's SM utilisation sampled by
NVML every second (pipeline/training/monitor.py), the first 5 iterations left out as everywhere.

The coco2017 preset's model and compute (frozen BatchNorm, 3 trainable backbone stages, its
backbone weights random and read from a local file, so nothing is downloaded), on synthetic
COCO-like batches (random pixels at --size, 1-8 random boxes over 91 classes) made on the GPU,
`--images-per-gpu` images per step, 5 warm-up steps, then --iterations timed steps. Prints,
per configuration, images/s, s/iter and peak GPU memory. Anchors: Detectron2 trains R50-FPN at
about 9.6 images/s per V100 in fp32; NVIDIA's Mask R-CNN reaches about 24 images/s per A100
with AMP. Without a CUDA GPU it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torchvision.models import resnet50

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import train  # noqa: E402
from pipeline.config import params, schema
from pipeline.data import synthetic  # noqa: E402
from pipeline.detection.model import build_model  # noqa: E402
from pipeline.report.load import required  # noqa: E402
from pipeline.strategies import sweep
from pipeline.training.precision import Precision  # noqa: E402

CONFIGS = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True), ("fp16", False), ("fp16", True)]


def batch(n: int, size: tuple[int, int], generator: torch.Generator, device):
    images, targets = [], []
    height, width = size
    for _ in range(n):
        images.append(torch.rand(3, height, width, generator=generator).to(device))
        k = int(torch.randint(1, 9, (1,), generator=generator))
        xy = torch.rand(k, 2, generator=generator) * torch.tensor([width * 0.7, height * 0.7])
        wh = 16 + torch.rand(k, 2, generator=generator) * torch.tensor([width * 0.3, height * 0.3])
        targets.append(
            {
                "boxes": torch.cat([xy, xy + wh], 1).to(device),
                "labels": torch.randint(1, 91, (k,), generator=generator).to(device),
            }
        )
    return images, targets


def measure(model_cfg: schema.Model, precision: str, channels_last: bool, args) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = build_model(model_cfg, num_classes=91).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.02 / 8, momentum=0.9, weight_decay=1e-4
    )
    amp = Precision(precision, device)
    generator = torch.Generator().manual_seed(0)
    batches = [batch(args.images_per_gpu, tuple(args.size), generator, device) for _ in range(4)]
    torch.cuda.reset_peak_memory_stats()
    times = []
    for step in range(5 + args.iterations):
        images, targets = batches[step % len(batches)]
        torch.cuda.synchronize()
        start = time.perf_counter()
        with amp.autocast():
            loss = sum(model(images, targets).values())
        optimizer.zero_grad(set_to_none=True)
        amp.backward(loss)
        amp.optimizer(optimizer).step()
        torch.cuda.synchronize()
        if step >= 5:
            times.append(time.perf_counter() - start)
    times.sort()
    median = times[len(times) // 2]
    return {
        "images_per_second": args.images_per_gpu / median,
        "sec_per_iter": median,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
    }


def pipeline_run(cfg: schema.Config, batch: int, precision: str, iterations: int, work: Path) -> dict:
    """One epoch of `iterations` steps of the coco2017 recipe's single run, through the
    training loop; images/s, data wait share and SM utilisation from its own records."""
    cfg = schema.replaced(
        cfg,
        train={"epochs": 1, "lr_steps": [], "checkpoint_every": 0, "monitor_interval_s": 1.0, "warmup_iters": 0},
        eval={"every_epochs": 0},
    )
    run = sweep.fill({"strategy": "single", "workers": 1, "images_per_worker": batch, "precision": precision}, cfg)
    out = work / f"{precision}-b{batch}"
    summary = train(cfg, run, out)
    samples = [json.loads(line) for line in (out / "utilisation.jsonl").read_text().splitlines()]
    utilisation = [g["util_percent"] for sample in samples[3:] for g in sample.get("gpus", [])]
    return {
        "images_per_second": summary.images_per_second,
        "data_share": required(required(summary.time_split, "time_split").data, "time_split.data")
        / required(summary.sec_per_iter, "sec_per_iter").mean,
        "sm_percent": statistics.median(utilisation) if utilisation else float("nan"),
    }


def pipeline_table(args, backbone: Path, work: Path) -> None:
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017")
    largest = max(args.pipeline_batches) * (5 + args.pipeline_iterations)
    settings = {
        "seed": 2017,
        "image_size": 640,
        "train_images": largest,
        "val_images": 1,
        "max_objects": 8,
        "clutter": 6,
    }
    size = args.pipeline_size
    cfg = schema.replaced(
        cfg,
        data={
            "name": "synthetic-640",
            "root": str(work / "data"),
            "synthetic": settings,
            "fetch": None,
            "aspect_ratio_groups": 0,
        },
        model={"backbone_weights": str(backbone), "min_size": size, "max_size": 1333},
    )
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    print(
        f"\n2. the training loop: coco2017's single run on {largest} synthetic 640 px images "
        f"(resized to {size}x{size}), {os.cpu_count()} cores"
    )
    print(f"{'images/GPU':<12}{'precision':<11}{'images/s':>10}{'data wait':>11}{'SM util':>9}")
    for batch in args.pipeline_batches:
        images = batch * (5 + args.pipeline_iterations)
        cfg = schema.replaced(cfg, data={"synthetic": {"train_images": images}})
        for precision in ("fp32", "bf16"):
            found = pipeline_run(cfg, batch, precision, args.pipeline_iterations, work)
            print(
                f"{batch:<12}{precision:<11}{found['images_per_second']:>10.1f}"
                f"{100 * found['data_share']:>10.1f}%{found['sm_percent']:>8.0f}%",
                flush=True,
            )


def model_table(args, backbone: Path) -> None:
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017").model
    model_cfg = schema.replaced(cfg, backbone_weights=str(backbone), min_size=args.size[0], max_size=args.size[1])
    print(
        f"1. the model alone: {torch.cuda.get_device_name()}, torch {torch.__version__}; "
        f"fasterrcnn_resnet50_fpn, {args.size[0]}x{args.size[1]}, {args.images_per_gpu} images per "
        f"GPU, median of {args.iterations} steps after 5 warm-up"
    )
    print(f"{'precision':<10}{'channels-last':<15}{'images/s':>10}{'s/iter':>10}{'peak GiB':>10}")
    for precision, channels_last in CONFIGS:
        if precision == "bf16" and not torch.cuda.is_bf16_supported():
            print(f"{precision:<10}{str(channels_last):<15}  skipped: this GPU has no bf16")
            continue
        result = measure(model_cfg, precision, channels_last, args)
        print(
            f"{precision:<10}{str(channels_last):<15}{result['images_per_second']:>10.2f}"
            f"{result['sec_per_iter']:>10.4f}{result['peak_gib']:>10.2f}"
        )
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images-per-gpu", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--size", type=int, nargs=2, default=[800, 1333], metavar=("H", "W"))
    parser.add_argument("--pipeline-batches", type=int, nargs="+", default=[2, 8, 16])
    parser.add_argument("--pipeline-iterations", type=int, default=30)
    parser.add_argument("--pipeline-size", type=int, default=800, help="pixels the model resizes to")
    parser.add_argument("--skip", choices=["model", "pipeline"])
    parser.add_argument(
        "--cpu-smoke",
        action="store_true",
        help="without a GPU, run part 2 anyway (small --pipeline-size): checks the path",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu_smoke:
        print("skipped: no CUDA GPU is visible here (torch.cuda.is_available() is False); run this on a GPU machine")
        return
    with tempfile.TemporaryDirectory() as work:
        backbone = Path(work) / "resnet50-random.pth"  # the recipe's frozen-BN path, no download
        torch.save(resnet50(weights=None).state_dict(), backbone)
        if args.skip != "model" and torch.cuda.is_available():
            model_table(args, backbone)
        if args.skip != "pipeline":
            pipeline_table(args, backbone, Path(work))


if __name__ == "__main__":
    main()
