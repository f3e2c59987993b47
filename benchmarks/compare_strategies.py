"""Side-by-side throughput and communication of the data-parallel strategies on this machine.

    .venv/bin/python benchmarks/compare_strategies.py [--epochs 2] [--train-images 320]

Trains the demo model (params.yaml's demo preset, shortened) once per strategy and world size,
at the same global batch, the whole sweep --repeats times over, interleaved, in this one
invocation, and prints per run the median over repeats of: images/s, speed-up over `single`
(the median of the per-repeat ratios), the communication share of the iteration, and the bytes
the busiest rank moved per iteration, measured by the strategy versus the theory. Ratios taken
side by side are what to compare: absolute numbers move with the machine's load.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import params, schema, stages
from pipeline.data import synthetic  # noqa: E402
from pipeline.launch import command  # noqa: E402
from pipeline.report.load import busiest_rank_bytes, required, speed  # noqa: E402
from pipeline.runtime.records.training import RunSummary  # noqa: E402
from pipeline.strategies import sweep

GLOBAL_BATCH = 8
SWEEP = [
    {"strategy": "single", "workers": 1, "images_per_worker": 8},
    {"strategy": "ddp", "workers": 1, "images_per_worker": 8},
    {"strategy": "ddp", "workers": 2, "images_per_worker": 4},
    {"strategy": "ddp", "workers": 2, "images_per_worker": 4, "comm_hook": "fp16"},
    {"strategy": "ps", "workers": 1, "images_per_worker": 8, "placement": "colocated"},
    {"strategy": "ps", "workers": 2, "images_per_worker": 4, "placement": "colocated"},
    {"strategy": "ps", "workers": 1, "images_per_worker": 8, "placement": "dedicated"},
    {"strategy": "zero", "workers": 2, "images_per_worker": 4},
    {"strategy": "fsdp", "workers": 2, "images_per_worker": 4},
    {"strategy": "fsdp", "workers": 2, "images_per_worker": 4, "reshard_after_forward": False},
]


def percent(share: float | None) -> str:
    """A communication share; '-' where the strategy times none apart (fsdp: in compute)."""
    return "-" if share is None else f"{100 * share:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train-images", type=int, default=320)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved passes over the sweep")
    args = parser.parse_args()
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    work = Path(tempfile.mkdtemp(prefix="bench-"))
    cfg = schema.replaced(
        cfg,
        data={"synthetic": {"train_images": args.train_images}, "root": str(work / "data")},
        train={"epochs": args.epochs, "lr_steps": []},
    )
    synthetic.generate(cfg.data.root, required(cfg.data.synthetic, "data.synthetic"))
    passes: list[dict[str, RunSummary]] = []  # one {run id: summary} per pass over the sweep
    for repeat in range(args.repeats):
        summaries = {}
        for entry in SWEEP:
            run = sweep.fill(entry, cfg)
            out = work / f"{sweep.run_id(run)}-{repeat}"
            result = subprocess.run(
                command(stages.view(cfg, "train"), run, str(out)), cwd=REPO, capture_output=True, text=True
            )
            if result.returncode != 0:
                print(f"{sweep.run_id(run)} failed:\n{result.stderr[-2000:]}", file=sys.stderr)
                continue
            summaries[sweep.run_id(run)] = RunSummary.read(out / "train_summary.json")
            print(f"pass {repeat + 1}: done {sweep.run_id(run)}", file=sys.stderr)
        passes.append(summaries)
    rows: list[dict[str, Any]] = []
    single = sweep.run_id(sweep.fill(SWEEP[0], cfg))
    for run_id, first in passes[0].items():
        runs = [p[run_id] for p in passes if run_id in p]
        speedups = [speed(p[run_id]) / speed(p[single]) for p in passes if run_id in p and single in p]
        rows.append(
            {
                "first": first,
                "images_per_second": median(speed(r) for r in runs),
                "speedup": median(speedups),
                "communication_share": (
                    None
                    if first.communication_share is None
                    else median(required(r.communication_share, "communication_share") for r in runs)
                ),
                "sec_per_iter_p50": median(required(r.sec_per_iter, "sec_per_iter").p50 for r in runs),
                "replicas_identical": all(r.replicas_identical for r in runs),
            }
        )
    header = (
        f"{'run':<24}{'procs':>6}{'threads':>8}{'img/s':>8}{'speed-up':>9}{'s/it p50':>9}"
        f"{'comm %':>8}{'MB/it measured':>16}{'MB/it theory':>14}{'ratio':>7}{'same':>6}"
    )
    print(
        f"global batch {GLOBAL_BATCH}, {args.epochs} epoch(s) of {args.train_images} images, "
        f"median of {args.repeats} interleaved passes, timings exclude the first iterations"
    )
    print(header)
    for r in rows:
        first = r["first"]
        measured = busiest_rank_bytes(first, "bytes_per_iteration") / 1e6
        theory = busiest_rank_bytes(first, "theory_bytes_per_iteration") / 1e6
        ratio = f"{measured / theory:.3f}" if theory else "-"
        print(
            f"{first.run_id:<24}{first.processes:>6}{first.threads:>8}{r['images_per_second']:>8.1f}"
            f"{r['speedup']:>9.2f}{r['sec_per_iter_p50']:>9.3f}"
            f"{percent(r['communication_share']):>8}{measured:>16.2f}{theory:>14.2f}{ratio:>7}"
            f"{'yes' if r['replicas_identical'] else 'NO':>6}"
        )


if __name__ == "__main__":
    main()
