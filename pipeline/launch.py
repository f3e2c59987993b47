"""Start one training run the way its strategy says, or record why it cannot run here; start
the commbench stage's processes the same way.

    python -m pipeline.launch --config '<preset JSON>' --entry '<sweep entry JSON>' --out DIR
    python -m pipeline.launch --stage evaluate ...   (a ddp run evaluates on its own processes)
    python -m pipeline.launch --stage commbench --processes N --config '<stage JSON>' --out FILE

A run this machine cannot do (DataParallel without 2 GPUs, more processes than cores, NCCL
without GPUs, ...) gets a train_summary.json with status "skipped" and the reason, so it shows
in the summary and the report instead of vanishing. Otherwise this process becomes the
strategy's launcher (`python` or `torchrun`) running `-m pipeline.training.train`: torchrun, not this
module, starts and watches the worker processes.

Inside a SLURM allocation a run over several nodes (parallel.nnodes > 1) starts one torchrun
per node itself: `srun` on the allocation's nodes, rendezvous on its first node
(pipeline/runtime/slurm.py). Outside SLURM the launcher starts torchrun on this node only, as before.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
from pathlib import Path

from . import strategies
from .commbench import job as commbench_job
from .config import cli, schema, stages
from .detection.scoring import not_evaluated, record_not_evaluated
from .runtime import attempts, failure, lifetime, run_lock, slurm
from .runtime.files import OutputError, write_json, write_text
from .runtime.run import Run
from .strategies import sweep

RunStage = schema.TrainStage | schema.EvaluateStage  # a run's stages: what they launch with


def run_config(cfg: RunStage, run: Run) -> str:
    """The stage's config as `run` trains and is evaluated with, as JSON: its entry's `norm` in
    model.norm (the run's checkpoints and provenance name the normalisation its model has)."""
    if cfg.model.norm != run.norm:
        cfg = schema.replaced(cfg, model={"norm": run.norm})
    return json.dumps(cfg.model_dump())


def command(
    cfg: schema.TrainStage, run: Run, out: str, python: str = sys.executable, rdzv_endpoint: str | None = None
) -> list[str]:
    """The training command; `rdzv_endpoint` replaces parallel.rdzv_endpoint for torchrun only
    (the run's config, and so its checkpoint's identity, stays the same)."""
    parallel = (
        cfg.parallel if rdzv_endpoint is None else cfg.parallel.model_copy(update={"rdzv_endpoint": rdzv_endpoint})
    )
    strategy = strategies.get(run, parallel)
    return strategy.launcher(python) + [
        "-m",
        "pipeline.training.train",
        "--config",
        run_config(cfg, run),
        "--entry",
        json.dumps(run.to_json()),
        "--out",
        out,
    ]


def evaluation_command(cfg: schema.EvaluateStage, run: Run, run_dir: str, python: str = sys.executable) -> list[str]:
    """A run is evaluated the way its strategy says (a ddp run on as many processes as it
    trained with)."""
    launcher = strategies.get(run, cfg.parallel).evaluation_launcher(python)
    return launcher + ["-m", "pipeline.detection.evaluate", "--config", run_config(cfg, run), "--run-dir", run_dir]


def commbench_command(cfg: schema.CommbenchStage, processes: int, out: str, python: str = sys.executable) -> list[str]:
    """The commbench stage at `processes` processes on this node (pipeline/commbench/job.py)."""
    return commbench_job.launcher(python, processes, cfg.parallel) + [
        "-m",
        commbench_job.MODULE,
        "--config",
        json.dumps(cfg.model_dump()),
        "--out",
        out,
    ]


def multi_node_command(cfg: schema.TrainStage, run: Run, out: str) -> list[str]:
    """The training command for this node; for a run over several nodes, inside a SLURM
    allocation: srun starting one torchrun on each node, meeting on the first node.

    The nodes are the strategy's (a single or DataParallel run spans one whatever
    parallel.nnodes says), the same count pipeline/resources.py asks the scheduler for."""
    nnodes = strategies.get(run, cfg.parallel).nodes()
    alloc = slurm.allocation() if nnodes > 1 else None
    if alloc is None:
        if nnodes > 1:
            print(
                f"node 1 of {nnodes}: start the same command on every other node; rendezvous "
                f"at {cfg.parallel.rdzv_endpoint}",
                file=sys.stderr,
            )
        return command(cfg, run, out)
    # This process becomes srun; each node's torchrun is started by SLURM's step daemon, and
    # its workers must follow that torchrun, their parent, not this process.
    os.environ.pop(lifetime.LAUNCHER_PID, None)
    endpoint = slurm.rdzv_endpoint(alloc, cfg.parallel.rdzv_endpoint)
    print(
        f"SLURM job {alloc.job_id}: one torchrun on each of {nnodes} nodes "
        f"({', '.join(alloc.hosts)}); rendezvous at {endpoint}",
        file=sys.stderr,
    )
    return slurm.srun(alloc, nnodes) + command(cfg, run, out, rdzv_endpoint=endpoint)


def train_in_attempts(cfg: schema.TrainStage, run: Run, argv: list[str], out: Path, log: Path | None) -> None:
    """Train, running the command again after a crash (pipeline/runtime/attempts.py); a run
    that fails for good is recorded as failed, with its reason and attempts, and the job ends
    well: the workflow trains the other runs and builds the report (rules/common.smk names the
    failed run last, and fails the command). A stop asked of the job ends it as it is."""
    returncode, failed, stopped = attempts.run(argv, log, cfg.parallel.crash_retries, lambda path: log_to(str(path)))
    if stopped is not None:  # asked to stop (Ctrl-C, a scheduler's cancel): ends as it is, unrecorded
        raise SystemExit(128 + stopped)
    if returncode == 0:
        return
    if (out / "train_summary.json").exists():  # the run recorded its own failure (it diverged)
        return
    if log is not None and log.exists():  # kept as a failed attempt's: Snakemake deletes a job's log before a rerun
        kept = attempts.kept_log(log, len(failed))
        shutil.copyfile(log, kept)
        failed[-1] = dataclasses.replace(failed[-1], log=str(kept))
    summary = sweep.unfinished_summary(cfg, run, "failed", failed[-1].said())
    summary["failed_attempts"] = [attempt.to_json() for attempt in failed]
    # recorded as a diverged run's is (its iteration log as of the last checkpoint, the summary last)
    failure.write_outcome({"out": str(out), "iterations": str(out / "state" / "iterations.jsonl"), "summary": summary})
    print(
        f"error: {sweep.run_id(run)} failed after {len(failed)} attempt(s): {failed[-1].said()}; recorded in "
        f"{out / 'train_summary.json'}: the workflow goes on without it, and names it at its end",
        file=sys.stderr,
    )


def log_to(path: str) -> None:
    """This process's (and what it execs into) stdout and stderr, from here on, into `path`,
    truncated: opened only by the job that holds the run, where a shell's `> log` would empty
    the log of the job that does."""
    sys.stdout.flush()
    sys.stderr.flush()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def start_commbench(args) -> None:
    """Become the commbench job's launcher. No run directory to lock: the stage writes one
    file, atomically, and Snakemake locks it. The log opens first, so that where the knobs
    came from (stages.parsed_config says it) is in it."""
    if args.processes is None:
        raise SystemExit("error: --stage commbench needs --processes")
    if args.log:
        log_to(args.log)
    argv = commbench_command(stages.parsed_config(args, args.stage), args.processes, args.out)
    os.execv(argv[0], argv)


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        stages.add_config_arguments(parser)
        parser.add_argument("--entry", help="the sweep entry as JSON (train, evaluate)")
        parser.add_argument("--processes", type=int, help="how many processes to time (commbench)")
        parser.add_argument("--out", required=True, help="run directory (commbench: its JSON file)")
        parser.add_argument("--stage", choices=["train", "evaluate", "commbench"], default="train")
        parser.add_argument(
            "--log",
            help="the job's log: stdout and stderr go there once the run "
            "is locked (a refused job leaves the running one's log as it is; "
            "commbench locks none)",
        )

    def body(args):
        # Killed with its job: the rule's shell execs us, so our parent is Snakemake (or srun's
        # step daemon); the request survives the exec of torchrun below.
        lifetime.become_launcher()
        if args.stage == "commbench":
            start_commbench(args)
        if args.entry is None:
            raise SystemExit(f"error: --stage {args.stage} needs --entry")
        cfg, run = stages.parsed_config(args, args.stage), Run.from_json(json.loads(args.entry), "--entry")
        # One job per run directory at a time; held by what we exec into, until the job ends.
        run_lock.hold(args.out, args.stage)
        if args.log:
            log_to(args.log)
        if args.stage == "evaluate":
            # A run that is not scored (skipped, or trained on in-memory noise) is recorded
            # here: no torch, no evaluation processes to start for it.
            why_not = not_evaluated(args.out)
            if why_not:
                record_not_evaluated(args.out, why_not)
                return
            argv = evaluation_command(cfg, run, args.out)
            os.execv(argv[0], argv)
        reason = strategies.get(run, cfg.parallel).unavailable()
        if reason:
            print(f"skipping {sweep.run_id(run)}: {reason}", file=sys.stderr)
            out = Path(args.out)
            write_text(out / "iterations.jsonl", "")
            write_json(out / "train_summary.json", sweep.unfinished_summary(cfg, run, "skipped", reason))
            return
        argv = multi_node_command(cfg, run, args.out)
        if argv[0] != sys.executable:  # srun, over several nodes: SLURM's own retries (profiles/slurm)
            sys.stdout.flush()
            os.execv(argv[0], argv)
        train_in_attempts(cfg, run, argv, Path(args.out), Path(args.log) if args.log else None)

    cli.run_stage(
        "Launch one training run, or the commbench stage (see module docstring).",
        body,
        arguments=arguments,
        errors=(run_lock.RunBusyError, OutputError),
        follows_parent=False,
        argv=argv,
    )


if __name__ == "__main__":
    main()
