"""Repeat each 2-process strategy's training of the demo preset, to find a crash that comes one
run in many (issue 57: rank 1 of fsdp-w2-b4-s0 aborted with glibc's "malloc(): unaligned fastbin
chunk detected").

    .venv/bin/python benchmarks/crash_hunt.py --repeats 10 [--hog-every 2] [--epochs 1]
        [--strategies fsdp fsdp-noreshard zero ddp ps] [--evidence results/crash_hunt]

Each repeat is the workflow's own train job (pipeline.launch, the demo's entry, its own run
directory and log) with parallel.crash_retries 0, so a crash surfaces instead of being retried,
and with glibc's heap checks on (MALLOC_CHECK_=3, with glibc's libc_malloc_debug preloaded: abort at the first
inconsistency, where it happens; MALLOC_PERTURB_: freed memory filled, so a use after free shows), Python's faulthandler
(the Python stack of every thread on a fatal signal) and core files allowed (RLIMIT_CORE; the
core lands in the repository, the jobs' directory, where the kernel's core_pattern is a plain
name, and is moved to the evidence). Every
`--hog-every`-th repeat runs beside a process that keeps a core busy (`yes`). A crashed run's log
and folder are kept under --evidence; the others are removed. Prints a line per run as it ends
(its seconds), one per crash (the strategy, the repeat, how it ended and the log's last fatal
line) and a table of crashes per strategy. Give a name twice in --strategies to run it twice
as often.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.config import params, schema, stages  # noqa: E402
from pipeline.config.params import canonical  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.runtime import lifetime  # noqa: E402
from pipeline.runtime.records.training import RunSummary  # noqa: E402
from pipeline.strategies.sweep import runs  # noqa: E402

ENTRIES = {  # the demo's 2-worker entries (params.yaml), by a name for each code path
    "fsdp": {"strategy": "fsdp", "workers": 2, "images_per_worker": 4},
    "fsdp-noreshard": {"strategy": "fsdp", "workers": 2, "images_per_worker": 4, "reshard_after_forward": False},
    "zero": {"strategy": "zero", "workers": 2, "images_per_worker": 4},
    "ddp": {"strategy": "ddp", "workers": 2, "images_per_worker": 4},
    "ps": {"strategy": "ps", "workers": 2, "images_per_worker": 4},
}
CHECKS = {"MALLOC_CHECK_": "3", "MALLOC_PERTURB_": "165", "PYTHONFAULTHANDLER": "1"}
# glibc 2.34 on reads MALLOC_CHECK_ only with its debug library preloaded
DEBUG_MALLOC = Path("/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0")
if DEBUG_MALLOC.exists():
    CHECKS["LD_PRELOAD"] = str(DEBUG_MALLOC)


def allow_cores() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--strategies", nargs="+", default=list(ENTRIES), choices=list(ENTRIES))
    parser.add_argument("--hog-every", type=int, default=2, help="every k-th repeat beside a busy core (0: none)")
    parser.add_argument("--epochs", type=int, default=3, help="the demo's epochs (3 in issue 57's run)")
    parser.add_argument("--no-checks", action="store_true", help="without glibc's heap checks")
    parser.add_argument("--evidence", type=Path, default=REPO / "results" / "crash_hunt")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="crash-hunt-"))
    base = params.load_resolved(REPO / "params.yaml", preset="demo")
    data = work / "data"
    assert base.data.synthetic is not None, "the demo's data is generated"
    synthetic.generate(data, base.data.synthetic)
    env = dict(os.environ, PYTHONPATH=str(REPO), **({} if args.no_checks else CHECKS))
    crashes: dict[str, list[str]] = collections.defaultdict(list)
    done: collections.Counter = collections.Counter()
    for repeat in range(args.repeats):
        for name in args.strategies:
            cfg = schema.replaced(base, sweep=[ENTRIES[name]], data=base.data.model_copy(update={"root": str(data)}))
            cfg = schema.replaced(
                cfg,
                train=cfg.train.model_copy(update={"epochs": args.epochs, "lr_steps": []}),
                parallel=cfg.parallel.model_copy(update={"crash_retries": 0}),
            )
            run = next(iter(runs(cfg).values()))
            out, log = work / f"{name}-{repeat}", work / f"{name}-{repeat}.log"
            hog = (
                subprocess.Popen(["yes"], stdout=subprocess.DEVNULL, preexec_fn=lifetime.die_with_parent)
                if args.hog_every and repeat % args.hog_every == 1
                else None
            )
            began = time.monotonic()
            try:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "pipeline.launch",
                        "--config",
                        canonical(stages.view(cfg, "train").model_dump()),
                        "--entry",
                        canonical(run.to_json()),
                        "--out",
                        str(out),
                        "--log",
                        str(log),
                    ],
                    cwd=REPO,
                    env=env,
                    preexec_fn=allow_cores,
                    check=False,
                    timeout=3600,
                )
            finally:
                if hog:
                    hog.kill()
                    hog.wait()
            done[name] += 1
            cores = [c for c in REPO.glob("core*") if c.is_file() and c.name.split(".")[0] == "core"]
            summary = RunSummary.read(out / "train_summary.json") if (out / "train_summary.json").exists() else None
            failed = summary is None or summary.status != "ok"
            if failed:
                why = summary.reason if summary else f"no summary (see {log})"
                kept = args.evidence / f"{name}-{repeat}"
                kept.mkdir(parents=True, exist_ok=True)
                shutil.copytree(out, kept / "run", dirs_exist_ok=True)
                shutil.copy(log, kept / "job.log")
                for core in cores:  # gdb -batch -ex "thread apply all bt" <python> <core>
                    shutil.move(core, kept / core.name)
                crashes[name].append(f"{name} repeat {repeat}{' (beside yes)' if hog else ''}: {why} [{kept}]")
                print(crashes[name][-1], flush=True)
            print(
                f"[{sum(done.values())}/{args.repeats * len(args.strategies)}] {name} repeat {repeat}"
                f"{' beside yes' if hog else ''}: {'crashed' if failed else 'ok'}"
                f" in {time.monotonic() - began:.0f} s",
                flush=True,
            )
            shutil.rmtree(out, ignore_errors=True)
            log.unlink(missing_ok=True)
    print(
        f"{'strategy':16s} {'runs':>5s} {'crashes':>8s}   (MALLOC_CHECK_ {'off' if args.no_checks else 'on'}, "
        f"every {args.hog_every or 'no'}-th beside yes, {args.epochs} epochs)"
    )
    for name in args.strategies:
        print(f"{name:16s} {done[name]:5d} {len(crashes[name]):8d}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
