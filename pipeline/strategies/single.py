"""`single`: one process, one device, no synchronisation. The baseline every strategy is
compared with; its update is the reference the others must reproduce."""
from __future__ import annotations

from .base import Strategy


class Single(Strategy):
    name = "single"
    label = "single process"
    max_workers = 1
