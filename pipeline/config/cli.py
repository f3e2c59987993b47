"""What every stage's command line shares: its arguments, its config and knobs, logging, dying
with its job, and errors that end in one line naming the remedy instead of a traceback.

    def main(argv=None):
        cli.run_stage("Train one sweep entry.", body, arguments=add_arguments, stage="train",
                      errors=(TrainingError, ...), argv=argv)

`body(args)` does the stage's work; with `stage`, `args.cfg` is that stage's config with its
knobs (pipeline/config/stages.py). An exception of `errors` ends the process with
"error: <message>"; `explain(err, args)` may turn any other exception into such a message
(or return None to let it raise). Under torchrun, the failing process also leaves that line
for the launcher to name it (pipeline/runtime/failure.py). An error with an `outcome` (a
diverged training: the run's result) is recorded as the run's failed summary by the process
that launched the run, which then ends with status 0, so that the workflow goes on: this
process where it is its own launcher, else torchrun's (pipeline/runtime/elastic.py).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from ..runtime import failure, lifetime, logs
from . import stages


def run_stage(
    description: str,
    body: Callable[[argparse.Namespace], object],
    *,
    arguments: Callable[[argparse.ArgumentParser], object] | None = None,  # what it returns is not used
    stage: str | None = None,
    errors: tuple[type[BaseException], ...] = (),
    explain: Callable[[BaseException, argparse.Namespace], str | None] | None = None,
    follows_parent: bool = True,
    prog: str | None = None,
    argv: list[str] | None = None,
) -> object:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if stage is not None:
        stages.add_config_arguments(parser)
    if arguments is not None:
        arguments(parser)
    args = parser.parse_args(argv)
    if follows_parent:  # the rule's shell execs us (or torchrun started us): go with it
        lifetime.die_with_parent()
    logs.configure()  # under torchrun, each line with its rank
    try:
        if stage is not None:
            args.cfg = stages.parsed_config(args, stage)
        return body(args)
    except errors as err:
        message, outcome = failure.message_of(err), getattr(err, "outcome", None)
        failure.record(message, outcome)
        if outcome and not failure.under_torchrun():
            print(f"error: {message}\n{failure.write_outcome(outcome)}", file=sys.stderr)
            return None
        raise SystemExit(f"error: {message}") from None
    except SystemExit as err:  # a stage's own "error: ..." exit
        if isinstance(err.code, str):
            failure.record(err.code.removeprefix("error: "))
        raise
    except Exception as err:
        explained = explain(err, args) if explain is not None else None
        if explained is None:
            failure.record(failure.describe(err))
            raise
        failure.record(explained)
        raise SystemExit(f"error: {explained}") from err
