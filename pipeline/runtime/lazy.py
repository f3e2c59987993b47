"""Modules imported at their first use.

The strategy registry is read where nothing trains: parsing the Snakefile, planning a sweep,
building the report. Importing torch there would cost seconds at every `snakemake` call (and a
login node or a GPU host may not have the lock's torch at all), so the modules those paths load
name torch through `lazy.module("torch")`: the real import happens when a training, evaluation or
test process first reads one of its attributes. tests/test_resources.py holds the line (the
Snakefile parsed with -X importtime, and every planning call, load no torch).
"""
from __future__ import annotations

import importlib


class LazyModule:
    """Stands for the module `name`; any attribute read imports it and reads the real one."""

    __slots__ = ("_name",)

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attribute: str):
        return getattr(importlib.import_module(self._name), attribute)

    def __repr__(self) -> str:
        return f"<module {self._name!r}, imported at first use>"


def module(name: str) -> LazyModule:
    return LazyModule(name)
