"""Why a run failed, in one line, carried from the process that failed to whoever reads it.

A torchrun worker is started with TORCHELASTIC_ERROR_FILE set. A stage that ends with an error
(pipeline/config/cli.py) writes its one-line message there, in torch.distributed.elastic's
error-file format (what `@record` writes), with the time of the failure to the microsecond and,
where the failure is the run's outcome rather than an interruption (its training diverged),
the record that says so. torchrun reads every failed rank's file into the ChildFailedError it
raises, and the launcher (pipeline/runtime/elastic.py) names the first cause: the rank whose
own error came first; else a rank that ended without a word (killed); never a peer that only
lost it (a `Consequence`). The outcome is written by one process, the one that launched the
run (`write_outcome`): several ranks that diverge at once would race for the same files.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import traceback
import typing
from pathlib import Path

from .files import atomic_path, write_json

ERROR_FILE = "TORCHELASTIC_ERROR_FILE"  # set by torchrun in each worker's environment


class Consequence(str):
    """A message that describes another process's failure (a peer lost), not a cause."""


def under_torchrun() -> bool:
    return bool(os.environ.get(ERROR_FILE))


def message_of(err: BaseException) -> str:
    """An error's message; for one a DataLoader worker raised, the worker's own message (torch
    re-raises it as "Caught X in DataLoader worker process N." and the worker's traceback,
    whose last line is "module.X: message")."""
    text = str(err)
    if text.startswith("Caught ") and "DataLoader worker process" in text.split("\n", 1)[0]:
        last = text.strip().splitlines()[-1]
        name, separator, rest = last.partition(": ")
        if separator and " " not in name:
            return rest
    return text


def one_line(message: str) -> str:
    """The message's first line (a traceback or a child's log after it stays in the log)."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    return lines[0] if lines else ""


def write_outcome(outcome: dict) -> str:
    """Record a run that failed as its outcome: `outcome["summary"]` as its train_summary.json
    (written last), what its iteration log held until then as iterations.jsonl; the message
    that says so, for the end of the log."""
    out = Path(outcome["out"])
    with atomic_path(out / "iterations.jsonl") as tmp:
        if os.path.exists(outcome["iterations"]):
            shutil.copyfile(outcome["iterations"], tmp)
        else:
            tmp.write_text("")
    write_json(out / "train_summary.json", outcome["summary"])
    return (
        f"The run is recorded as failed in {out / 'train_summary.json'}, with its reason: the "
        "report lists it and the workflow goes on. A changed setting reruns it; to rerun it "
        "unchanged, delete that file."
    )


def describe(err: BaseException) -> str:
    """An unexpected exception in one line: its type, message and where it was raised."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    return f"{type(err).__name__}: {one_line(message_of(err)) or 'no message'}{where}"


def record(message: str, outcome: dict | None = None) -> None:
    """This worker's reason, for torchrun to read (nothing outside torchrun); `outcome`: the
    record of a run whose failure is its result (`write_outcome`)."""
    path = os.environ.get(ERROR_FILE)
    if not path:
        return
    now = time.time()
    data = {
        "message": one_line(message),
        "timestamp": int(now),
        "time": now,
        "consequence": isinstance(message, Consequence),
    }
    if outcome:
        data["outcome"] = outcome
    try:
        with open(path, "w") as handle:
            json.dump(data, handle)
    except OSError:  # the reason still ends this process's log
        pass


def first_cause(failures: dict, torchruns_first: int) -> tuple[int, typing.Any]:
    """(rank, failure) to name, of torchrun's {rank: ProcessFailure}: the earliest that wrote
    a reason of its own; else one that ended without a word (killed), torchrun's own first
    (`torchruns_first`: the rank it saw fail first, not one it then stopped) before the
    others; else the earliest that lost a peer."""

    def order(rank: int):
        data = _ours(failures[rank])
        if data is None:
            return (1, 0.0 if rank == torchruns_first else 1.0, rank)
        return (2 if data.get("consequence") else 0, data["time"], rank)

    rank = min(failures, key=order)
    return rank, failures[rank]


def _ours(failed) -> dict | None:
    """What `record` wrote for a failed worker, None where it wrote nothing."""
    data = failed.error_file_data
    return data if isinstance(data, dict) and "time" in data and isinstance(data.get("message"), str) else None


def own_message(failed) -> str | None:
    """The reason a failed worker wrote, None where it wrote none (killed, or stopped by torchrun)."""
    data = _ours(failed)
    return data["message"] if data else None


def is_consequence(failed) -> bool:
    """Whether a failed worker's reason only says it lost another process (a `Consequence`)."""
    return bool((_ours(failed) or {}).get("consequence"))


def outcome_of(failed) -> dict | None:
    """The record of the run a failed worker left for its launcher to write, if any."""
    return (_ours(failed) or {}).get("outcome")


ERROR_LINES = 25  # of a failed stage's error, said in the workflow's closing summary


def stage_error(log: str | Path, since: float, output: str | Path) -> str | None:
    """The error a stage's log ends with, where that stage failed after `since`: its log written
    since, and its output absent (Snakemake removes a failed job's). From its "error: ..."
    line (cli.run_stage's one line, then what it lists) to the end, else the log's last line
    (a traceback's); None where it did not fail."""
    log, output = Path(log), Path(output)
    try:
        written = log.stat().st_mtime
        lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return None
    if written < since or not lines or output.exists():
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("error: ")]
    error = lines[starts[-1] :] if starts else lines[-1:]
    if len(error) > ERROR_LINES:
        error = error[:ERROR_LINES] + [f"... ({len(error) - ERROR_LINES} more lines in {log})"]
    return "\n".join(error)
