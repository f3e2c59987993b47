"""The record machinery: a dataclass to and from its JSON object, and what a record that cannot
be read says. `to_json()` gives the file's JSON object, the keys it always had; `from_json(raw)`
reads it back and refuses a key no field declares, so a misspelt key fails when the file is read
instead of becoming an empty column. `Record.read(path)` reads any record from its file.

A new fact is one field of its record (with its default: None, "not recorded") plus the line
that computes it. A strategy's own facts (Runtime.summary_facts, rank_facts) are declared by its
module (`declare_facts`), which no record names: they are kept in the record's `facts`, written
as keys of their own beside its fields, and only when the strategy reports them. Records other
stages write for other readers too (the provenance, commbench's) are OpenRecords: a key no field
declares is kept as written rather than refused.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Union

from ..run import Run

OPTIONAL = {"optional": True}  # written only when set: a strategy's own facts, a stage's own


class RecordError(ValueError):
    """A run record that cannot be read: the message names the file, the key and the remedy."""


def _inside(where: str, key: str) -> str:
    """Where `key` is, inside `where`: FILE: key, then FILE: key.inner, FILE: ranks[1].role."""
    return f"{where}.{key}" if ": " in where else f"{where}: {key}"


def _decode(hint, value, where: str):
    """A JSON value as the type `hint` says: records from their objects, lists item by item."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode(inner[0], value, where) if len(inner) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        if not isinstance(value, list):
            raise RecordError(f"{where}: expected a list, found {type(value).__name__}; {REMEDY}")
        return [_decode(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        _, item = typing.get_args(hint)
        if not isinstance(value, dict):
            raise RecordError(f"{where}: expected an object, found {type(value).__name__}; {REMEDY}")
        return {k: _decode(item, v, _inside(where, k)) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, (Record, Run)):
        return hint.from_json(value, where)
    return value


def _encode(value):
    if isinstance(value, (Record, Run)):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


REMEDY = (
    "correct it, or delete the run directory and rerun its training (its fields are "
    "declared in pipeline/runtime/records/)"
)
# A strategy's facts (Runtime.summary_facts, rank_facts) are declared keys, not free ones
STRATEGY_REMEDY = (
    "a strategy's facts are declared by its module: records.base.declare_facts("
    "RunSummary (summary_facts) or RankReport (rank_facts), name=type)"
)
FACTS = {"facts": True}  # the field that holds a strategy's declared facts, written flat
_DECLARED: dict[type, dict[str, typing.Any]] = {}  # record -> fact name -> its type


def declare_facts(record: type[Record], **hints) -> None:
    """Facts a strategy's module reports in `record` (RunSummary or RankReport), by name and
    type (a Record type is read back as one). Declared once at its import: a summary is read
    where the registry (pipeline/strategies) has been imported, as the report and the tests do."""
    clash = set(hints) & set(record.field_names())
    if clash:
        raise ValueError(f"{record.__name__} already has a field {sorted(clash)[0]!r}")
    _DECLARED.setdefault(record, {}).update(hints)


class Record:
    """to_json / from_json for a dataclass whose fields are JSON values or other records."""

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(typing.cast(typing.Any, cls))]  # each subclass is a dataclass

    def to_json(self) -> dict:
        out = {}
        for f in dataclasses.fields(typing.cast(typing.Any, self)):
            value = getattr(self, f.name)
            if f.metadata.get("facts"):
                out.update({k: _encode(v) for k, v in value.items()})
            elif not (f.metadata.get("optional") and value is None):
                out[f.name] = _encode(value)
        return out

    @classmethod
    def read(cls, path, **how):
        """This record from the JSON file at `path` (errors name the file)."""
        return cls.from_json(json.loads(Path(path).read_text()), str(path), **how)

    @classmethod
    def fields_of(cls, raw: dict, where: str, remedy: str = REMEDY) -> dict:
        """The fields a JSON object of this record holds, decoded (records from their objects);
        a key no field declares is an error naming it, `where` it is and the `remedy`."""
        if not isinstance(raw, dict):
            raise RecordError(
                f"{where}: expected a JSON object for {cls.__name__}, found {type(raw).__name__}; {remedy}"
            )
        facts = _DECLARED.get(cls, {})
        known = {name.lower(): name for name in [*cls.field_names(), *facts]}
        if issubclass(cls, OpenRecord):  # another stage's record: its other keys kept as written
            other = {k: v for k, v in raw.items() if k not in known.values()}
            raw = {**{k: v for k, v in raw.items() if k in known.values()}, **({"other": other} if other else {})}
        for key in raw:
            if key not in known.values():
                close = difflib.get_close_matches(key.lower(), list(known), n=1)
                hint = f" (did you mean '{known[close[0]]}'?)" if close else ""
                raise RecordError(f"{where}: unknown key '{key}'{hint} in {cls.__name__}; {remedy}")
        hints = {**typing.get_type_hints(cls), **facts}
        decoded = {k: _decode(hints[k], v, _inside(where, k)) for k, v in raw.items()}
        reported = {k: decoded.pop(k) for k in list(decoded) if k in facts}
        return {**decoded, "facts": reported} if reported else decoded

    @classmethod
    def from_json(cls, raw: dict, where: str = ""):
        """This record from its JSON object; a missing key takes its field's default."""
        where = where or cls.__name__
        try:
            return cls(**cls.fields_of(raw, where))
        except TypeError as err:  # a field without a default is missing
            raise RecordError(f"{where}: {cls.__name__} incomplete ({err}); {REMEDY}") from None


@dataclass(frozen=True)
class OpenRecord(Record):
    """A record another stage writes for more readers than the report (the provenance, the
    commbench stage's fits): the keys read here are fields; any other is kept in `other` and
    written back as it was, so a file with a key of an older or newer version is still read."""

    other: dict = field(default_factory=dict, kw_only=True)

    def to_json(self) -> dict:
        whole = super().to_json()
        other = whole.pop("other")
        return {**whole, **other}
