"""How a stage's processes log: under torchrun every line and warning names its rank, and what
every rank says alike of the data it read is said by rank 0 only.

All the processes of a run write into one log (the job's, or the terminal), so two ranks' lines
could not be told apart, and each rank repeated the dataset's warnings (every rank reads the
same annotation files).
"""

from __future__ import annotations

import logging
import os

FORMAT = "%(asctime)s %(levelname)s %(message)s"
# What a rank says of the files it read: each rank reads the same ones, so rank 0 says it for
# all (an error is still said by every rank that meets it).
SAME_ON_EVERY_RANK = "pipeline.data"


def rank_and_world() -> tuple[int, int]:
    """This process's rank and the number of processes, as torchrun sets them; (0, 1) else."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def line_format(rank: int, world: int) -> str:
    """The log line's format: with `[rank N]` where the process is one of several."""
    return FORMAT if world == 1 else FORMAT.replace("%(levelname)s", f"[rank {rank}] %(levelname)s")


class SaidByRankZero(logging.Filter):
    """Leaves out, on ranks other than 0, the data's lines below ERROR (rank 0 says them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not (
            record.name == SAME_ON_EVERY_RANK or record.name.startswith(SAME_ON_EVERY_RANK + ".")
        )


def configure() -> None:
    """The process's logging at INFO, to stderr; Python's warnings through it (so they carry
    the rank too; each still shown once per place it is raised, Python's default)."""
    rank, world = rank_and_world()
    logging.basicConfig(level=logging.INFO, format=line_format(rank, world))
    logging.captureWarnings(True)
    if rank != 0:
        for handler in logging.getLogger().handlers:
            handler.addFilter(SaidByRankZero())
