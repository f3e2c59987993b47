"""How well the GPU check's repeats of one configuration agree, with its segments replaying the
same batches from the same state (the protocol now) and without (each segment the loader's
next batches, the model trained on: the protocol before): the same configurations, timed in
turns, in one worker each way (benchmarks/interleave.py).

    python benchmarks/repeat_agreement.py [--model tiny|r50] [--size 64] [--timed 8]
        [--repeats 3] [--warmup 3]

It prints, per configuration and way, each segment's images/s, how far apart they are
(max/min - 1; the issue's bar is 3 %), how many distinct batch sequences the segments consumed,
and whether their losses were the same. On a shared CPU the machine's own noise is in both
ways alike; the replayed way removes the work's.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks import gpu_check  # noqa: E402
from benchmarks.interleave import Config, Protocol, interleave  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.report.load import required  # noqa: E402


def settings(work: Path, model: str, size: int) -> dict:
    """The check's settings at `size` px: the demo's tiny model, or R50-FPN with the check's
    calibrated backbone."""
    import torch

    sizes = gpu_check.Sizes(
        image_size=size,
        min_size=size,
        iterations=2,
        batches=(2,),
        table_iterations=2,
        tiny_model=model == "tiny",
        protocol=gpu_check.CPU_SMOKE.protocol,
        profile_steps=1,
    )
    backbone = work / "backbone.pth"
    found = gpu_check.overrides(sizes, 1, work / "data", backbone)
    cfg = gpu_check.base_config(sizes, 1, work / "data", backbone)
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    if model == "tiny":
        found["model"] = gpu_check.with_model(cfg, sizes, tiny=True).model.model_dump()
    else:
        torch.save(gpu_check.calibrated_backbone(cfg, images=8), backbone)
    return found


def configs() -> list[Config]:
    return [
        Config(f"b2-{p}", {"strategy": "single", "workers": 1, "images_per_worker": 2, "precision": p})
        for p in ("fp32", "bf16")
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("tiny", "r50"), default="tiny")
    parser.add_argument("--size", type=int, default=64, help="image size, px")
    parser.add_argument("--timed", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="repeat-agreement-") as work:
        overrides = settings(Path(work), args.model, args.size)
        print(
            f"{args.model} model at {args.size} px, 2 images, {args.repeats} segments of "
            f"{args.timed} timed iterations each, in turns"
        )
        print(f"{'way':<9} {'config':<8} {'apart':>7}  {'batches':>7}  {'losses':<9} segments (images/s)")
        for replay in (False, True):
            protocol = Protocol(warmup=args.warmup, timed=args.timed, repeats=args.repeats, rewarm=1, replay=replay)
            for config in interleave(configs(), overrides, Path(work) / f"replay-{replay}", protocol):
                if config.error:
                    print(f"{config.name}: {config.error}")
                    continue
                row = config.row()
                losses = [s["losses"] for s in config.segments]
                same = "same" if all(loss == losses[0] for loss in losses) else "differ"
                batches = len({s["batches"] for s in config.segments}) if replay else "n/a"
                print(
                    f"{'replayed' if replay else 'before':<9} {config.name:<8} "
                    f"{100 * row['disagreement']:>6.1f}%  {batches:>7}  {same:<9} "
                    + " ".join(f"{v:.2f}" for v in row["segments"])
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
