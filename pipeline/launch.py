"""Start one training run the way its strategy says, or record why it cannot run here.

    python -m pipeline.launch --config '<preset JSON>' --entry '<sweep entry JSON>' --out DIR
    python -m pipeline.launch --stage evaluate ...   (a ddp run evaluates on its own processes)

A run this machine cannot do (DataParallel without 2 GPUs, more processes than cores, NCCL
without GPUs, ...) gets a train_summary.json with status "skipped" and the reason, so it shows
in the summary and the report instead of vanishing. Otherwise this process becomes the
strategy's launcher (`python` or `torchrun`) running `-m pipeline.train`: torchrun, not this
module, starts and watches the worker processes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from . import lifetime, provenance, stages, strategies, sweep
from .scoring import not_evaluated
from .files import read_json, write_json, write_text


def skipped_summary(cfg: dict, run: dict, reason: str) -> dict:
    return {**sweep.identity(run), "status": "skipped", "reason": reason,
            "provenance": provenance.collect(stages.config_for(cfg, "train"), run=run)}


def command(cfg: dict, run: dict, out: str, python: str = sys.executable) -> list[str]:
    strategy = strategies.get(run, cfg["parallel"])
    return strategy.launcher(python) + [
        "-m", "pipeline.train", "--config", json.dumps(cfg), "--entry", json.dumps(run), "--out", out]


def evaluation_command(cfg: dict, run: dict, run_dir: str, python: str = sys.executable) -> list[str]:
    """A run is evaluated the way its strategy says (a ddp run on as many processes as it
    trained with); a run that is not scored, by one process that records why."""
    launcher = [python]
    if not_evaluated(read_json(Path(run_dir) / "train_summary.json")) is None:
        launcher = strategies.get(run, cfg["parallel"]).evaluation_launcher(python)
    return launcher + ["-m", "pipeline.evaluate", "--config", json.dumps(cfg), "--run-dir", run_dir]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Launch one training run (see module docstring).")
    parser.add_argument("--config", required=True, help="resolved preset as JSON")
    parser.add_argument("--entry", required=True, help="the sweep entry as JSON")
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--stage", choices=["train", "evaluate"], default="train")
    args = parser.parse_args(argv)
    # Killed with its job: the rule's shell execs us, so our parent is Snakemake (or srun's
    # step daemon); the request survives the exec of torchrun below.
    lifetime.become_launcher()
    cfg, run = json.loads(args.config), json.loads(args.entry)
    if args.stage == "evaluate":
        argv = evaluation_command(cfg, run, args.out)
        os.execv(argv[0], argv)
    reason = strategies.get(run, cfg["parallel"]).unavailable()
    if reason:
        print(f"skipping {sweep.run_id(run)}: {reason}", file=sys.stderr)
        out = Path(args.out)
        write_text(out / "iterations.jsonl", "")
        write_json(out / "train_summary.json", skipped_summary(cfg, run, reason))
        return
    argv = command(cfg, run, args.out)
    if cfg["parallel"]["nnodes"] > 1:
        print(f"node 1 of {cfg['parallel']['nnodes']}: start the same command on every other "
              f"node (under SLURM: srun); rendezvous at {cfg['parallel']['rdzv_endpoint']}",
              file=sys.stderr)
    sys.stdout.flush()
    os.execv(argv[0], argv)


if __name__ == "__main__":
    main()
