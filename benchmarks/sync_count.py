"""How often a training step of the detector would make a GPU and its host wait for each other,
counted on any machine (pipeline/measure/syncs.py), per step and by source.

    .venv/bin/python benchmarks/sync_count.py                         # tiny and R50-FPN, 2 and 16 images
    .venv/bin/python benchmarks/sync_count.py --arch tiny --images 2 4 8 --steps 3

Each model is torchvision's Faster R-CNN as the presets build it (the demo's tiny detector;
R50-FPN without pretrained weights at --size pixels, small so that a CPU can run it), trained on
random images with --boxes boxes each, in train mode as the training loop runs it (forward with
targets, the losses' sum backward). The first step is left out (lazy initialisation); the others
are counted one by one, and the median step's counts are printed: the total, by op, and by
source (the first frame outside torch, the line of torchvision or of this project that called
the op). On a GPU the same ops stall the host; the GPU check sets the counts beside its
profile's cudaStreamSynchronize. The counter is a diagnostic, never on during a timed run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from pipeline.config.params import load_resolved  # noqa: E402
from pipeline.detection.model import build_model  # noqa: E402
from pipeline.measure.syncs import SyncCounter, by_op, by_source  # noqa: E402

ARCHS = {"tiny": "tiny", "r50": "fasterrcnn_resnet50_fpn"}


def model_of(arch: str, size: int) -> torch.nn.Module:
    base = load_resolved(REPO / "params.yaml", preset="demo").model
    changes: dict[str, object] = {"arch": ARCHS[arch]}
    if arch == "r50":
        changes.update(backbone_weights=None, min_size=size, max_size=size)
    torch.manual_seed(0)
    return build_model(base.model_copy(update=changes), num_classes=91).train()


def batch(images: int, size: int, boxes: int, seed: int) -> tuple[list, list]:
    generator = torch.Generator().manual_seed(seed)
    pictures = [torch.rand(3, size, size, generator=generator) for _ in range(images)]
    targets = []
    for _ in range(images):
        corners = torch.rand(boxes, 2, generator=generator) * size * 0.6
        sides = torch.rand(boxes, 2, generator=generator) * size * 0.3 + 8
        targets.append(
            {
                "boxes": torch.cat([corners, corners + sides], dim=1),
                "labels": torch.randint(1, 91, (boxes,), generator=generator),
            }
        )
    return pictures, targets


def counted(arch: str, images: int, size: int, boxes: int, steps: int, device: str = "cpu") -> list:
    """Each step's count, `steps` of them after the first."""
    model = model_of(arch, size).to(device)
    counter = SyncCounter()
    for step in range(steps + 1):
        pictures, targets = batch(images, size, boxes, seed=step)
        pictures = [p.to(device) for p in pictures]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        with counter:
            losses = model(pictures, targets)
            sum(losses.values()).backward()
        model.zero_grad(set_to_none=True)
        counter.step()
    return counter.steps[1:]  # the first: lazy initialisation


def summary(arch: str, images: int, size: int, boxes: int, steps: int, device: str = "cpu", top: int = 12) -> dict:
    """The median step's count (the total, by op, the `top` sources) and every step's total."""
    found = counted(arch, images, size, boxes, steps, device)
    totals = [sum(step.values()) for step in found]
    median = found[totals.index(sorted(totals)[len(totals) // 2])]
    return {
        "arch": ARCHS[arch],
        "images": images,
        "size": size,
        "device": device,
        "per_step": statistics.median(totals),
        "steps": totals,
        "by_op": dict(by_op(median).most_common()),
        "by_source": [[kind, where, n] for (kind, where), n in by_source(median).most_common(top)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", nargs="+", default=list(ARCHS), choices=list(ARCHS))
    parser.add_argument("--images", nargs="+", type=int, default=[2, 16])
    parser.add_argument("--size", type=int, default=128, help="R50-FPN's image size (the tiny one's is 128)")
    parser.add_argument("--boxes", type=int, default=3, help="boxes per image")
    parser.add_argument("--steps", type=int, default=2, help="steps counted after the first")
    parser.add_argument("--top", type=int, default=12, help="sources shown")
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}; counts per step, the median of {args.steps} after the first")
    for arch in args.arch:
        for images in args.images:
            found = summary(arch, images, args.size if arch == "r50" else 128, args.boxes, args.steps, top=args.top)
            print(f"\n{arch}, {images} images: {found['per_step']:g} a step (steps: {found['steps']})")
            print("  by op: " + ", ".join(f"{op} {n}" for op, n in found["by_op"].items()))
            for kind, where, n in found["by_source"]:
                print(f"  {n:5d}  {kind:5s}  {where}")


if __name__ == "__main__":
    main()
