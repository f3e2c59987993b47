"""What synchronising costs inside a training step, beside what commbench times alone: the
preset's detector in 2 processes (gloo on a CPU), medians of interleaved passes, side by side.

    .venv/bin/torchrun --nproc-per-node 2 --standalone benchmarks/sync_overheads.py [--preset demo]

Forward + backward of one batch (random images at the model's size, 3 random boxes each):
plain, plain then one all-reduce of the flattened gradients, and DDP (its default buckets);
then the optimizer's step alone (gradients set, a barrier) and right after a DDP forward +
backward, for SGD and for the zero strategy's own ZeroRedundancyOptimizer (one bucket a rank).
The cost model (report's "Predicted against measured") charges DDP one all-reduce of M and
ZeRO-1 N broadcasts after it, from commbench's hot-loop fits; the ratios show how far the
training step is from that on this machine. A diagnosis for the next model, not a target.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from pipeline.commbench.links import seconds_of  # noqa: E402
from pipeline.config import params  # noqa: E402
from pipeline.detection.model import build_model  # noqa: E402
from pipeline.runtime import distributed, lifetime  # noqa: E402
from pipeline.strategies import STRATEGIES  # noqa: E402


def batch(generator: torch.Generator, images: int, size: int):
    boxes = []
    for _ in range(images):
        corner = torch.rand(3, 2, generator=generator) * size * 0.6
        side = size * 0.15 + torch.rand(3, 2, generator=generator) * size * 0.15
        boxes.append(
            {"boxes": torch.cat([corner, corner + side], 1), "labels": torch.randint(1, 3, (3,), generator=generator)}
        )
    return [torch.rand(3, size, size, generator=generator) for _ in range(images)], boxes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="demo")
    parser.add_argument("--images", type=int, default=4, help="images per process and step")
    parser.add_argument("--repeats", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    cfg = params.load_resolved(REPO / "params.yaml", preset=args.preset)
    torch.manual_seed(0)
    model = build_model(cfg.model, num_classes=3).train()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    trained = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(rank)
    size = cfg.model.min_size

    def forward_backward(net) -> None:
        images, targets = batch(generator, args.images, size)
        sum(net(images, targets).values()).backward()

    def flat_all_reduce() -> None:
        dist.all_reduce(torch.cat([p.grad.flatten() for p in trained]))

    def both(net) -> None:
        forward_backward(net)
        flat_all_reduce()

    def after_barrier(call) -> float:
        dist.barrier()
        return timed(call)

    def step_alone(optimizer) -> float:
        for p in trained:
            p.grad = torch.zeros_like(p)
        return after_barrier(optimizer.step)

    def step_after_ddp(optimizer) -> float:
        forward_backward(ddp)
        return timed(optimizer.step)

    def timed(call) -> float:
        return seconds_of(call, torch.device("cpu"))

    sgd = torch.optim.SGD(trained, lr=1e-4, momentum=0.9)
    # the optimizer zero's runs build (pipeline/strategies/zero.py), not a copy of its settings
    zero_spec = STRATEGIES["zero"](STRATEGIES["zero"].filled(workers=2), cfg.parallel)
    zero = zero_spec.runtime().optimizer(trained, lr=1e-4, momentum=0.9)
    cases = {
        "fwd+bwd, plain": lambda: after_barrier(lambda: forward_backward(model)),
        "fwd+bwd, plain + flat all-reduce": lambda: after_barrier(lambda: both(model)),
        "fwd+bwd, DDP": lambda: after_barrier(lambda: forward_backward(ddp)),
        "SGD step alone": lambda: step_alone(sgd),
        "SGD step after DDP fwd+bwd": lambda: step_after_ddp(sgd),
        "ZeRO step alone": lambda: step_alone(zero),
        "ZeRO step after DDP fwd+bwd": lambda: step_after_ddp(zero),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for repeat in range(args.repeats + 3):  # interleaved passes; the first 3 warm up
        for name, case in cases.items():
            seconds = case()
            for p in trained:
                p.grad = None
            if repeat >= 3:
                samples[name].append(seconds)
    ms = {name: statistics.median(values) * 1e3 for name, values in samples.items()}
    if rank == 0:
        for name, value in ms.items():
            print(f"{name:36s} {value:8.1f} ms")
        ratio = ms["fwd+bwd, DDP"] / ms["fwd+bwd, plain + flat all-reduce"]
        print(f"DDP / (plain + flat all-reduce)      x{ratio:.3f}")
        print(f"ZeRO step after fwd+bwd / alone      x{ms['ZeRO step after DDP fwd+bwd'] / ms['ZeRO step alone']:.3f}")
        print(f"SGD step after fwd+bwd / alone       x{ms['SGD step after DDP fwd+bwd'] / ms['SGD step alone']:.3f}")
        print(
            f"(2 processes, gloo, 1 thread each, preset {args.preset}, {args.images} images per process, "
            f"median of {args.repeats}, torch {torch.__version__})"
        )
    distributed.destroy_process_group()  # keeps the group: DDP's reducer still holds it


if __name__ == "__main__":
    main()
    lifetime.exit_finished()  # not through the teardown (pipeline/runtime/lifetime.py)
