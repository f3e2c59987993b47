"""A training job's attempts: one that crashed is retried from its checkpoint; one that failed
for good is recorded, so that the workflow goes on without it.

The launcher (pipeline/launch.py) runs the training command (torchrun, or python for a
one-process run) as its child instead of exec'ing it, and waits. An attempt that ended by a
signal (SIGABRT from glibc's heap check, SIGSEGV, an OOM kill) or that torchrun ended because a
rank was killed or lost (`RETRYABLE_EXIT`, pipeline/runtime/elastic.py) is a crash: the job
starts the command again, up to parallel.crash_retries times, and the run resumes from its last
checkpoint. The failed attempt's log is kept beside the new one (`<log>.attempt<N>.log`), and
the attempts reach the training process (`RETRIES_ENV`) for its record: the run's summary says
it was retried and why, and its speed is measured from the attempt that finished.

A run that fails for good (its retries spent, or an error that a retry would repeat: a Python
exception) is recorded as failed, with the reason its log ends with (`last_fatal_line`: glibc's
abort message, a Python exception, an NCCL or gloo error), and the job ends well: the evaluation
records it as not evaluated, the report lists it, and the workflow's last lines name it, its
log and the command that retries it, and end with a failing exit status (rules/common.smk).

A stop asked of the job (SIGTERM, SIGINT: Snakemake stopping, a scheduler's cancel) is passed on
to the attempt and ends the job; it is never retried. The attempt dies with the launcher
(lifetime.become_launcher), so a SIGKILLed job leaves nothing running.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from . import lifetime
from .records.training import FailedAttempt as Attempt

STOPS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # a stop asked of the job: passed on, never retried
RETRYABLE_EXIT = 75  # EX_TEMPFAIL: torchrun ended because a rank was killed or lost (elastic.py)
RETRIES_ENV = "BENCH_RETRIED_AFTER"  # the failed attempts before this one, as JSON (Attempt list)
# Lines that say why a process died, as glibc, CPython, C++ and the collectives' libraries
# write them (the last one in a log is its reason): heap checks, fatal signals, exceptions.
FATAL = re.compile(
    r"(malloc\(\)|free\(\)|double free|corrupted |munmap_chunk|realloc\(\)|\*\*\* .* \*\*\*"
    r"|Fatal Python error|Segmentation fault|terminate called|Error: |Exception: |^error: |Aborted"
    r"|NCCL (WARN|error)|Connection (reset|closed))"
)
LOGGED = re.compile(r"\] (DEBUG|INFO|WARNING) ")  # a stage's own progress lines (logs.py): never a reason
RERUN_REMEDY_START = "The run's last checkpoint is kept"  # elastic.REMEDY's first words
OWN_LINES = ("error: rank ", "retrying ", "attempt ")  # what this module and elastic.py say


def how_it_ended(returncode: int) -> str:
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    if returncode == RETRYABLE_EXIT:
        return "a rank was killed or lost"
    return f"exited with code {returncode}"


def last_fatal_line(text: str) -> str:
    """Why the log `text` says its process died: elastic.py's line that names the failed rank
    (with that rank's reason), else the last line that says why a process died (FATAL), else
    its last line. A rank's lines as torchrun's tee prefixes them keep their text."""
    lines = _lines(text)
    ranks = [line for line in lines if re.match(r"error: rank \d+ \(pid \d+ on ", line)]
    if ranks:  # without its remedy (a rerun): the job retries, or records the run as failed
        return ranks[-1].removeprefix("error: ").split(f". {RERUN_REMEDY_START}")[0]
    return fatal_line(text) or (lines[-1] if lines else "")


def fatal_line(text: str) -> str:
    """The last line of `text` that says why a process died (FATAL), or "": of what was written
    before torchrun's report of the failure (which repeats the ranks' reasons), not our own
    lines, nor a rank's that only lost another (distributed.py: its peer's death, not a cause)."""
    lines = _lines(text)
    reports = [i for i, line in enumerate(lines) if line.endswith(" FAILED") and i and set(lines[i - 1]) == {"="}]
    before = lines[: reports[-1] - 1] if reports else lines
    found = [
        line
        for line in before
        if FATAL.search(line)
        and not LOGGED.search(line)
        and not line.startswith(OWN_LINES)
        and "lost the other processes" not in line
    ]
    return found[-1] if found else ""


def _lines(text: str) -> list[str]:
    """The non-blank lines of a log, a rank's tee prefix ("[default1]:") taken off."""
    lines = [re.sub(r"^\[\w+\]:", "", line).strip() for line in text.splitlines()]
    return [line for line in lines if line]


LOG_TAIL = 64 * 1024  # bytes of a job's log read for the last line that says why


def own_log() -> str:
    """The end of this process's stderr where it is a file (the job's log: the ranks write
    there too), "" where it is not."""
    try:
        path = os.readlink("/proc/self/fd/2")
        with open(path, "rb") as handle:
            handle.seek(max(0, os.path.getsize(path) - LOG_TAIL))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def retried_before() -> list[Attempt]:
    """The attempts that failed before this one (RETRIES_ENV), for the run's record."""
    return [Attempt.from_json(found, RETRIES_ENV) for found in json.loads(os.environ.get(RETRIES_ENV) or "[]")]


def kept_log(log: Path, number: int) -> Path:
    """Where a failed attempt's log is kept: beside the job's, never over another's."""
    kept = log.with_name(f"{log.stem}.attempt{number}{log.suffix}")
    while kept.exists():
        number += 1
        kept = log.with_name(f"{log.stem}.attempt{number}{log.suffix}")
    return kept


class Outcome(NamedTuple):
    returncode: int  # the last attempt's exit status (-N: killed by signal N)
    failed: list[Attempt]  # the attempts that failed, in order
    stopped: int | None  # the stop signal the job was asked to end with, if one came


def run(argv: list[str], log: Path | None, retries: int, reopen_log: Callable[[Path], None]) -> Outcome:
    """Run `argv` until an attempt ends well, fails with an error of its own, has crashed
    `retries` + 1 times, or the job is asked to stop. `log`: the job's log, where stdout and
    stderr go (`reopen_log` opens a fresh one after a crash, the failed one kept)."""
    stop: list[int] = []
    child: subprocess.Popen | None = None

    def pass_on(signum, _frame) -> None:
        stop.append(signum)
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    for signum in STOPS:
        signal.signal(signum, pass_on)
    failed: list[Attempt] = []
    me = os.getpid()
    while True:
        os.environ[RETRIES_ENV] = json.dumps([a.to_json() for a in failed])
        sys.stdout.flush()
        sys.stderr.flush()
        # The attempt follows this process, and its workers follow it (the environment it
        # execs with is the one become_launcher sets in the child: no env= here)
        child = subprocess.Popen(argv, preexec_fn=lambda: lifetime.become_launcher(me))
        returncode = child.wait()
        if returncode == 0 or stop:
            return Outcome(returncode, failed, stop[0] if stop else None)
        text = own_log()  # the attempt's log: stdout and stderr went there
        attempt = Attempt(how_it_ended(returncode), last_fatal_line(text), str(log) if log else None)
        crashed = returncode < 0 or returncode == RETRYABLE_EXIT
        if not crashed or len(failed) >= retries:
            return Outcome(returncode, failed + [attempt], None)
        if log is not None:
            kept = kept_log(log, len(failed) + 1)
            log.rename(kept)
            attempt = Attempt(attempt.ended, attempt.reason, str(kept))
            reopen_log(log)
        failed.append(attempt)
        print(
            f"attempt {len(failed)} {attempt.said()} (its log: {attempt.log}); retrying "
            f"({len(failed)} of {retries}) from the run's last checkpoint",
            file=sys.stderr,
            flush=True,
        )


# A test-only switch (tests/test_attempts.py): "RANK:STEP:once" makes that rank abort (SIGABRT,
# after a glibc-like line) once it has done STEP iterations, on the first attempt only;
# "RANK:STEP:always" on every attempt. Unset in every run of the workflow.
TEST_ABORT_ENV = "BENCH_TEST_ABORT"


def abort_if_asked(rank: int, step: int, state_dir: Path) -> None:
    asked = os.environ.get(TEST_ABORT_ENV)
    if not asked:
        return
    at_rank, at_step, how = asked.split(":")
    marker = state_dir / "aborted-for-a-test"
    if (int(at_rank), int(at_step)) != (rank, step) or (how == "once" and marker.exists()):
        return
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    os.write(2, f"malloc(): test abort ({TEST_ABORT_ENV}={asked}) at step {step}\n".encode())
    os.abort()
