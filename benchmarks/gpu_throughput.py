"""Faster R-CNN R50-FPN training throughput on one GPU: fp32 against AMP, with and without
channels-last.

    python benchmarks/gpu_throughput.py [--images-per-gpu 2] [--iterations 50] [--size 800 1333]

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
import sys
import tempfile
import time
from pathlib import Path

import torch
from torchvision.models import resnet50

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline import params  # noqa: E402
from pipeline.model import build_model  # noqa: E402
from pipeline.precision import Precision  # noqa: E402

CONFIGS = [("fp32", False), ("fp32", True), ("bf16", False), ("bf16", True), ("fp16", False), ("fp16", True)]


def batch(n: int, size: tuple[int, int], generator: torch.Generator, device):
    images, targets = [], []
    height, width = size
    for _ in range(n):
        images.append(torch.rand(3, height, width, generator=generator).to(device))
        k = int(torch.randint(1, 9, (1,), generator=generator))
        xy = torch.rand(k, 2, generator=generator) * torch.tensor([width * 0.7, height * 0.7])
        wh = 16 + torch.rand(k, 2, generator=generator) * torch.tensor([width * 0.3, height * 0.3])
        targets.append({"boxes": torch.cat([xy, xy + wh], 1).to(device),
                        "labels": torch.randint(1, 91, (k,), generator=generator).to(device)})
    return images, targets


def measure(model_cfg: dict, precision: str, channels_last: bool, args) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(0)
    model = build_model(model_cfg, num_classes=91).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.02 / 8,
                                momentum=0.9, weight_decay=1e-4)
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
    return {"images_per_second": args.images_per_gpu / median, "sec_per_iter": median,
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images-per-gpu", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--size", type=int, nargs=2, default=[800, 1333], metavar=("H", "W"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU is visible here (torch.cuda.is_available() is False); "
              "run this on a GPU machine")
        return
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017")["model"]
    with tempfile.TemporaryDirectory() as work:
        backbone = Path(work) / "resnet50-random.pth"  # the recipe's frozen-BN path, no download
        torch.save(resnet50(weights=None).state_dict(), backbone)
        model_cfg = dict(cfg, backbone_weights=str(backbone), min_size=args.size[0], max_size=args.size[1])
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; fasterrcnn_resnet50_fpn, "
              f"{args.size[0]}x{args.size[1]}, {args.images_per_gpu} images per GPU, "
              f"median of {args.iterations} steps after 5 warm-up")
        print(f"{'precision':<10}{'channels-last':<15}{'images/s':>10}{'s/iter':>10}{'peak GiB':>10}")
        for precision, channels_last in CONFIGS:
            if precision == "bf16" and not torch.cuda.is_bf16_supported():
                print(f"{precision:<10}{str(channels_last):<15}  skipped: this GPU has no bf16")
                continue
            result = measure(model_cfg, precision, channels_last, args)
            print(f"{precision:<10}{str(channels_last):<15}{result['images_per_second']:>10.2f}"
                  f"{result['sec_per_iter']:>10.4f}{result['peak_gib']:>10.2f}")
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
