"""The training loader alone, stage by stage, and its images/s with float32 or uint8 images.

    .venv/bin/python benchmarks/loader_alone.py [--root DIR] [--images 32] [--size 640]
        [--workers 0 1 2] [--batch 4] [--passes 2] [--repeats 3] [--threads 1]

On an H100, R50-FPN at 16 images per GPU waited for data 23 % of each iteration. This times
what the loader does per image, side by side in one run: decoding (PIL, as the dataset does,
and torchvision.io on the CPU), the conversion to float32 (the loader's former v2.ToDtype) or
none (uint8, the model's input made on the device by `to_model_input`), the horizontal flip,
collation, pinning and, with CUDA, the host-to-device copy; then the project's CocoDetection
through a DataLoader with its `collate`, followed by train.py's `to_device` (inside a training
step's data wait), at each --workers count, float32 in the loader ("before") and uint8
("after"). Without --root it generates a synthetic COCO-layout set at COCO's size (640 px, as
benchmarks/gpu_check.py does) in a temporary directory; with --root it reads that set's train
split. The main process runs --threads intra-op threads (1, as each DataLoader worker does):
with 2 on a 2-core machine whose other core is busy, every parallel op waited out a scheduler
quantum (8 ms for a 1.2 MB flip, 0.2 ms at 1 thread). Defaults take about 12 s on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import PIL  # noqa: E402
import torch  # noqa: E402
import torchvision  # noqa: E402
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from pipeline.config import schema  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.data.dataset import MIRROR, CocoDetection, collate  # noqa: E402
from pipeline.training.train import to_device  # noqa: E402

FLOAT = v2.ToDtype(torch.float32, scale=True)  # what the loader did before the change
CUDA = torch.cuda.is_available()


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if CUDA else "no CUDA"
    return (
        f"{platform.platform()}; {cpu}; {os.cpu_count()} CPUs ({len(os.sched_getaffinity(0))} "
        f"usable); torch {torch.__version__}, torchvision {torchvision.__version__}, "
        f"Pillow {PIL.__version__}; {gpu}"
    )


def dataset_root(args, work: Path) -> Path:
    if args.root:
        return Path(args.root)
    root = work / "data"
    synthetic.generate(
        root,
        schema.Synthetic(
            seed=2017, image_size=args.size, train_images=args.images, val_images=1, max_objects=8, clutter=6
        ),
    )
    return root


def per_image_ms(stages: dict, items: list, repeats: int) -> dict:
    """Median over `repeats` interleaved passes of each stage's mean ms per item: each pass runs
    every stage once over all items, so slow drifts of the machine hit all stages alike."""
    passes: dict[str, list[float]] = {name: [] for name in stages}
    for _ in range(repeats):
        for name, stage in stages.items():
            start = time.perf_counter()
            for item in items:
                stage(item)
            if CUDA:
                torch.cuda.synchronize()
            passes[name].append((time.perf_counter() - start) * 1e3 / len(items))
    return {name: statistics.median(times) for name, times in passes.items()}


def pinned(x: torch.Tensor) -> torch.Tensor:
    return x.pin_memory() if CUDA else torch.empty_like(x).copy_(x)  # pinning is a copy too


def stage_table(dataset: CocoDetection, args) -> None:
    indices = list(range(len(dataset)))
    paths = [str(dataset.image_dir / img["file_name"]) for img, _ in dataset.images]
    decoded = [dataset.load_image(i) for i in indices]
    uint8 = [v2.functional.to_image(image) for image in decoded]
    floats = [FLOAT(image) for image in uint8]
    boxes = [dataset.target(i)["boxes"] for i in indices]
    pairs = {"uint8": list(zip(uint8, boxes, strict=False)), "float32": list(zip(floats, boxes, strict=False))}
    batches = {
        kind: [
            [(image, {"boxes": b}) for image, b in pairs[kind][i : i + args.batch]]
            for i in range(0, len(indices), args.batch)
        ]
        for kind in pairs
    }
    pin = "pin_memory" + ("" if CUDA else " (no CUDA: a plain copy)")
    stages = {
        "decode: PIL open + convert (dataset.load_image)": dataset.load_image,
        "decode: torchvision.io.decode_jpeg (CPU)": lambda i: decode_jpeg(read_file(paths[i]), mode=ImageReadMode.RGB),
        "decode: torchvision.io.decode_image (CPU)": lambda i: decode_image(
            read_file(paths[i]), mode=ImageReadMode.RGB
        ),
        "PIL image -> uint8 tensor (v2.ToImage)": lambda i: v2.functional.to_image(decoded[i]),
        "uint8 -> float32 (v2.ToDtype scale)": lambda i: FLOAT(uint8[i]),
        "flip, image + boxes: float32": lambda i: MIRROR(*pairs["float32"][i]),
        "flip, image + boxes: uint8": lambda i: MIRROR(*pairs["uint8"][i]),
        f"{pin}: float32": lambda i: pinned(floats[i]),
        f"{pin}: uint8": lambda i: pinned(uint8[i]),
    }
    if CUDA:  # from pinned memory, as the training loop copies; uint8 then scaled on the GPU
        cuda = torch.device("cuda")
        pinned_f, pinned_u = [x.pin_memory() for x in floats], [x.pin_memory() for x in uint8]
        stages["host-to-device + scale: float32"] = lambda i: to_device([pinned_f[i]], [], cuda)
        stages["host-to-device + scale: uint8"] = lambda i: to_device([pinned_u[i]], [], cuda)
    times = per_image_ms(stages, indices, args.repeats)
    for kind in ("float32", "uint8"):  # per image, from batches of --batch
        batch_ms = per_image_ms({kind: collate}, batches[kind], args.repeats)[kind]
        times[f"collate (batches of {args.batch}): {kind}"] = batch_ms / args.batch
    decode_pil = times["decode: PIL open + convert (dataset.load_image)"]
    print(
        f"\n1. per image, ms (median of {args.repeats} interleaved passes over {len(indices)} "
        f"images; x: decode against PIL's, float32 against uint8)"
    )
    print(f"{'stage':<58}{'ms':>9}{'x':>8}")
    for name, ms in times.items():
        if name.startswith("decode"):
            ratio = f"{ms / decode_pil:>8.2f}"
        elif name.endswith("float32") and name[: -len("float32")] + "uint8" in times:
            ratio = f"{ms / times[name[: -len('float32')] + 'uint8']:>8.2f}"
        else:
            ratio = ""
        print(f"{name:<58}{ms:>9.4f}{ratio}")
    same = all(
        torch.equal(decode_image(read_file(path), mode=ImageReadMode.RGB), image)
        for path, image in zip(paths, uint8, strict=False)
    )
    print(
        f"torchvision.io's pixels equal PIL's on every image: {same}; bytes per image: "
        f"{floats[0].nbytes / 1e6:.2f} MB float32, {uint8[0].nbytes / 1e6:.2f} MB uint8"
    )


def images_per_second(dataset: CocoDetection, workers: int, args) -> float:
    """Images/s that DataLoader + collate + to_device deliver, after one warm-up pass (worker
    start-up is paid once per run, not per epoch's worth of these few images)."""
    device = torch.device("cuda" if CUDA else "cpu")
    loader = torch.utils.data.DataLoader(
        dataset,
        batch_size=args.batch,
        shuffle=False,
        collate_fn=collate,
        num_workers=workers,
        pin_memory=CUDA,
        persistent_workers=workers > 0,
    )
    for passes in (1, args.passes):
        start = time.perf_counter()
        images = 0
        for _ in range(passes):
            for batch in loader:
                moved, _ = to_device(batch[0], batch[1], device)
                images += len(moved)
        if CUDA:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    return images / seconds


def loader_table(dataset: CocoDetection, args) -> None:
    uint8_transforms = dataset.transforms
    float_transforms = v2.Compose([uint8_transforms, FLOAT])  # the loader before the change
    print(
        f"\n2. CocoDetection (flip 0.5) -> DataLoader (batch {args.batch}, collate"
        f"{', pinned' if CUDA else ''}) -> to_device, images/s over {args.passes} passes of "
        f"{len(dataset)} images after a warm-up pass"
    )
    print(f"{'workers':<10}{'float32 (before)':>18}{'uint8 (after)':>16}{'after/before':>14}")
    for workers in args.workers:
        rates = {}
        for kind, transforms in (("float32", float_transforms), ("uint8", uint8_transforms)):
            dataset.transforms = transforms
            rates[kind] = images_per_second(dataset, workers, args)
        dataset.transforms = uint8_transforms
        print(
            f"{workers:<10}{rates['float32']:>18.1f}{rates['uint8']:>16.1f}{rates['uint8'] / rates['float32']:>14.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--root",
        help="an existing COCO-layout set (its train split); default: "
        "a synthetic one, generated in a temporary directory",
    )
    parser.add_argument("--images", type=int, default=32, help="training images generated, or read from --root's first")
    parser.add_argument("--size", type=int, default=640, help="synthetic image side, px")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--batch", type=int, default=4, help="images per batch")
    parser.add_argument("--passes", type=int, default=2, help="timed passes over the images")
    parser.add_argument("--repeats", type=int, default=3, help="passes of the stage table")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, main process")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    print(f"machine: {machine()}; main process at {torch.get_num_threads()} torch thread(s)")
    with tempfile.TemporaryDirectory(prefix="loader-alone-") as work:
        root = dataset_root(args, Path(work))
        dataset = CocoDetection(root, "train", train=True, horizontal_flip=0.5)
        dataset.images = dataset.images[: args.images]  # a real set's first few (all in memory)
        print(f"data: {root} ({len(dataset)} training images)")
        stage_table(dataset, args)
        loader_table(dataset, args)
    print(f"\n{time.perf_counter() - start:.1f} s in all")


if __name__ == "__main__":
    main()
