"""torchrun, saying which process failed first, why, and what to do about it.

    python -m pipeline.runtime.elastic <torchrun's arguments>

This is torchrun itself: torch.distributed.run's own argument parser and elastic agent, run in
this process (it watches the workers, restarts them parallel.max_restarts times, tears the
others down when one dies). It adds one thing: when the job fails for good, torchrun raises
ChildFailedError with every failed rank's exit code or signal and the reason each wrote
(pipeline/runtime/failure.py), and this ends with one line naming the rank that failed first
and its own error (or, for a rank killed without a word, how it ended, the last line of the
job's log that says why, glibc's abort message say, and the remedy), after torchrun's own
report. Where that rank's failure is the run's result (its training diverged), this records the
run as failed and exits 0, as a single-process run does: the workflow goes on. Where that rank
was killed or lost, it exits attempts.RETRYABLE_EXIT: the job runs the attempt again once
(pipeline/runtime/attempts.py).
"""

from __future__ import annotations

import socket
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

from . import attempts, failure

REMEDY = (  # attempts.RERUN_REMEDY_START: its first words
    "The run's last checkpoint is kept: rerun the same command to resume from it (a rank "
    "killed for memory needs fewer images per worker), or set parallel.max_restarts to "
    "have torchrun restart the run by itself"
)


def how_it_ended(failed) -> str:
    if failed.exitcode < 0:
        return f"was killed by {failed.signal_name()}"
    return f"exited with code {failed.exitcode}"


def message(err: ChildFailedError, max_restarts: int, log_text: str = "") -> str:
    """One line: the rank that failed first and why: its own message, else how it ended and
    the last line of the job's log (`log_text`) that says why a process died (glibc's abort
    message, a fatal signal; a rank's C-level death writes nothing else)."""
    first_rank, first = failure.first_cause(err.failures, err.get_first_failure()[0])
    others = sorted(rank for rank in err.failures if rank != first_rank)
    where = f"rank {first_rank} (pid {first.pid} on {socket.gethostname()})"
    restarts = f" after {max_restarts} restart(s)" if max_restarts else ""
    stopped = f"; rank(s) {', '.join(map(str, others))} failed as well" if others else ""
    own = failure.own_message(first)
    if own:  # the rank's own reason carries its remedy
        return f"error: {where}{restarts}: {own}{stopped}"
    said = attempts.fatal_line(log_text)
    if said:
        return f"error: {where} {how_it_ended(first)} first{restarts}: {said}{stopped}. {REMEDY}."
    return (
        f"error: {where} {how_it_ended(first)} first{restarts}, without a reason of its own "
        f"(killed, or out of memory){stopped}. {REMEDY}."
    )


def crashed(err: ChildFailedError) -> bool:
    """Whether the rank that failed first was killed or lost (no reason of its own, or only a
    lost peer's): a crash that running again may not meet (attempts.RETRYABLE_EXIT)."""
    _, first = failure.first_cause(err.failures, err.get_first_failure()[0])
    return failure.own_message(first) is None or failure.is_consequence(first)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as err:
        print(err.format_msg(), file=sys.stderr)
        sys.stderr.flush()
        line = message(err, args.max_restarts, attempts.own_log())
        outcome = failure.outcome_of(failure.first_cause(err.failures, err.get_first_failure()[0])[1])
        if outcome:  # the run's result, not an interruption: recorded, and the job ends well
            print(f"{line}\n{failure.write_outcome(outcome)}", file=sys.stderr)
            return
        print(line, file=sys.stderr, flush=True)
        raise SystemExit(attempts.RETRYABLE_EXIT if crashed(err) else 1) from None


if __name__ == "__main__":
    main()
