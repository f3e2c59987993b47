"""torchrun, saying which process died and what to do about it.

    python -m pipeline.runtime.elastic <torchrun's arguments>

This is torchrun itself: torch.distributed.run's own argument parser and elastic agent, run in
this process (it watches the workers, restarts them parallel.max_restarts times, tears the
others down when one dies). It adds one thing: when the job fails for good, torchrun raises
ChildFailedError with every failed rank's exit code or signal, and this turns that into one
message naming the rank, how it ended and the remedy, after torchrun's own report.
"""
from __future__ import annotations

import socket
import sys

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.run import parse_args, run

REMEDY = ("The run's last checkpoint is kept: rerun the same command to resume from it (a rank "
          "killed for memory needs fewer images per worker), or set parallel.max_restarts to "
          "have torchrun restart the run by itself")


def how_it_ended(failure) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"exited with code {failure.exitcode}"


def message(err: ChildFailedError, max_restarts: int) -> str:
    first_rank, first = err.get_first_failure()
    others = sorted(rank for rank in err.failures if rank != first_rank)
    text = (f"error: rank {first_rank} (pid {first.pid} on {socket.gethostname()}) {how_it_ended(first)}"
            f" first; torchrun then stopped the run")
    if others:
        text += f" (and rank(s) {', '.join(map(str, others))})"
    if max_restarts:
        text += f" after {max_restarts} restart(s)"
    return f"{text}. {REMEDY}."


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        run(args)
    except ChildFailedError as err:
        print(err.format_msg(), file=sys.stderr)
        raise SystemExit(message(err, args.max_restarts)) from None


if __name__ == "__main__":
    main()
