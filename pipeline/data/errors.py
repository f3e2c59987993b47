"""What the data modules raise for a dataset that cannot be used, and the remedy they share."""

from __future__ import annotations

from pathlib import Path


class DatasetError(ValueError):
    """The dataset on disk is unusable; the message names the file and the remedy."""


def remedy(own: str, root: str | Path) -> str:
    """What to do: `own` for a user's own tree, then for a tree the data stage made."""
    return (
        f"{own}; for a dataset the data stage fetched or generated, delete {root} and rerun "
        "the data stage to fetch or generate it again"
    )
