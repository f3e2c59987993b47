"""params.yaml: load (strictly), resolve the presets (each extends `defaults` or another preset),
validate, apply the command line's overrides, and build the typed config (schema.Config).

Everything that runs (the Snakefile, the stage CLIs, the tests) goes through `resolve`, so a
wrong key or value is reported once, before any job starts, naming the file (or the command
line), the key where the mistake was made, and the remedy. The sweep's entries belong to the
strategies and are filled and checked by pipeline/strategies/sweep.py.
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import jsonschema
import pydantic
import yaml

from . import schema
from .schema import merged

OVERRIDE_FORM = "--config set='SECTION.KEY=VALUE; ...' (e.g. set='train.epochs=2; eval.every_epochs=0')"


class ParamsError(ValueError):
    """params.yaml is malformed; the message names the file, the key and what to do."""


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader that refuses a key given twice in one mapping (PyYAML keeps the last
    silently: a second `presets:` would drop every preset of the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            if key in seen:
                first = seen[key]
                raise ParamsError(
                    f"{mark.name}:{mark.line + 1}:{mark.column + 1}: the key '{key}' is given a second "
                    f"time in this mapping (first at line {first.line + 1}, column {first.column + 1}); "
                    f"YAML would keep only the last and silently drop the first's values: merge the "
                    f"two into one '{key}:'"
                )
            seen[key] = mark
        return super().construct_mapping(node, deep)


def parse_yaml(text: str, source: str) -> Any:
    """`text` as YAML, refusing duplicate keys; a syntax error names source:line:column."""
    loader = _StrictLoader(text)
    loader.name = source
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        what = " ".join(part for part in (err.context, err.problem) if part)
        raise ParamsError(
            f"{where}: not valid YAML: {what}; check the indentation and the quotes there (or the line before)"
        ) from None
    except yaml.YAMLError as err:
        raise ParamsError(f"{source}: not valid YAML: {err}") from None
    finally:
        loader.dispose()


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ParamsError(f"{path}: cannot read the parameter file ({err.strerror})") from err
    raw = parse_yaml(text, str(path))
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of parameter groups at the top level")
    return raw


def check_overlay(overlay: dict, path: str | Path, builtin: dict) -> None:
    """A --configfile may add presets, not redefine params.yaml's: Snakemake merges the two
    key by key, so a built-in preset would change silently, and its results would land in its
    folders (results/runs/<name>), mixed with those of the preset as published."""
    presets = overlay.get("presets")
    if not isinstance(presets, dict):
        return
    taken = [name for name in presets if name in builtin.get("presets", {})]
    if taken:
        name = taken[0]
        raise ParamsError(
            f"{path}: presets.{name}: redefines params.yaml's preset {name!r} (its results are in "
            f"results/runs/{name}); give yours a new name that starts from it, e.g. presets: "
            f"{{{name}-mine: {{extends: {name}, ...}}}}, and run it with --config preset={name}-mine"
        )


def _key_path(path) -> str:
    return ".".join(str(p) for p in path) or "(top level)"


# How the schema's types read in a remedy.
TYPE_WORDS = {
    "integer": "a whole number",
    "number": "a number",
    "string": "text",
    "boolean": "true or false",
    "array": "a list",
    "object": "a mapping",
    "null": "null",
}
LIMIT_REMEDIES = {
    "minimum": "set it to {} or more",
    "exclusiveMinimum": "set it above {}",
    "maximum": "set it to {} or less",
    "exclusiveMaximum": "set it below {}",
    "minItems": "give it at least {} item(s)",
    "minLength": "give it at least {} character(s)",
    "const": "set it to {!r}",
}
SCHEMA_HINT = "see the comment beside the key in params.yaml, or pipeline/config/schema.py"


def _kinds(error: jsonschema.ValidationError) -> list[str]:
    """The types a `type` error asked for; for a oneOf/anyOf, those of all its branches."""
    if error.validator in ("oneOf", "anyOf"):
        return [kind for e in error.context if e.validator == "type" for kind in _kinds(e)]
    value = error.validator_value
    return value if isinstance(value, list) else [value]


def _type_remedy(error: jsonschema.ValidationError) -> str:
    remedy = "write " + " or ".join(TYPE_WORDS.get(k, k) for k in _kinds(error))
    if isinstance(error.instance, str):
        try:  # YAML reads a quoted number as text
            float(error.instance)
            remedy += ", without quotes"
        except ValueError:
            pass
    return remedy


def remedy(error: jsonschema.ValidationError) -> str:
    """What to write instead, from the rule the value broke (also used for sweep entries)."""
    rule, value = error.validator, error.validator_value
    if rule == "type":
        return _type_remedy(error)
    if rule == "minItems" and error.absolute_path and error.absolute_path[-1] == "sweep":
        return "list at least one run, e.g. - {strategy: single, workers: 1}"
    if rule in LIMIT_REMEDIES:
        return LIMIT_REMEDIES[rule].format(value)
    if rule == "enum":
        return "use one of those"
    if rule == "uniqueItems":
        return "list each value once"
    return SCHEMA_HINT


def _innermost(error: jsonschema.ValidationError) -> list[jsonschema.ValidationError]:
    """The errors worth reporting: for `oneOf: [null, X]` those of X, not 'is not of type
    null' (each oneOf here allows null or one kind of value)."""
    if error.validator not in ("oneOf", "anyOf"):
        return [error]
    specific = [e for e in error.context if e.validator != "type" or e.path]
    return [inner for e in specific for inner in _innermost(e)] or [error]


def _describe(error: jsonschema.ValidationError, source: str, where: str) -> str:
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        hints = []
        for key in extra:
            close = difflib.get_close_matches(key, allowed, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return f"{source}: {where}: unknown key {', '.join(hints)}; allowed keys: {', '.join(allowed)}"
    if error.validator == "required":
        return f"{source}: {where}: {error.message}; add it (see the demo preset for an example)"
    if error.validator in ("oneOf", "anyOf"):
        if all(e.validator == "type" and not e.path for e in error.context):  # wrong type
            return (
                f"{source}: {where}: {error.instance!r} is not of type "
                f"{' or '.join(map(repr, _kinds(error)))}; {_type_remedy(error)}"
            )
        return f"{source}: {where}: {error.instance!r} is not valid here: {error.message}; {SCHEMA_HINT}"
    return f"{source}: {where}: {error.message}; {remedy(error)}"


def _offending_key(error: jsonschema.ValidationError) -> tuple:
    """Where the mistake sits: the value's path, or for a key too many or too few, that key's."""
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties":
        extra = sorted(set(error.instance) - set(error.schema.get("properties", {})))
        return path + tuple(extra[:1])
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [key for key in error.validator_value if key not in error.instance]
        return path + tuple(missing[:1])
    return path


def schema_errors(document, schema: dict, source: str, locate=None) -> list[str]:
    """Each way `document` breaks `schema`, said as params.yaml's errors are (the file, the
    key, the remedy), each once: `locate(path)` names where the value at `path` was written
    (a preset's value inherited from `defaults` is named there, once, not in every preset)."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(
        (inner for e in validator.iter_errors(document) for inner in _innermost(e)),
        key=lambda e: list(map(str, e.absolute_path)),
    )
    messages: list[str] = []
    for error in errors:
        path = tuple(error.absolute_path)
        if locate is not None:
            offending = _offending_key(error)
            # a key too many or too few: found where it is written (or belongs), named by its mapping
            where = _key_path(locate(offending)[:-1] if len(offending) > len(path) else locate(path))
        else:
            where = _key_path(path)
        message = _describe(error, source, where)
        if message not in messages:
            messages.append(message)
    return messages


def resolve_presets(raw: dict, source: str = "params.yaml") -> dict[str, dict]:
    """Every preset in full: `defaults`, then each `extends` ancestor, then its own values."""
    presets, defaults = raw.get("presets"), raw.get("defaults") or {}
    if not isinstance(presets, dict) or not presets:
        raise ParamsError(f"{source}: presets: expected a mapping of named presets")
    resolved: dict[str, dict] = {}

    def resolve_one(name: str, chain: tuple[str, ...]) -> dict:
        if name in resolved:
            return resolved[name]
        if name in chain:
            raise ParamsError(
                f"{source}: presets.{name}.extends: a cycle "
                f"({' -> '.join(chain + (name,))}); one preset must extend defaults"
            )
        own = presets[name]
        if not isinstance(own, dict):
            raise ParamsError(f"{source}: presets.{name}: expected a mapping of parameter groups")
        parent = own.get("extends")
        if parent is not None and parent not in presets:
            raise ParamsError(
                f"{source}: presets.{name}.extends: '{parent}' is not one of the presets ({', '.join(presets)})"
            )
        base = resolve_one(parent, chain + (name,)) if parent else defaults
        body = {k: v for k, v in own.items() if k != "extends"}
        resolved[name] = merged(base, body)
        return resolved[name]

    for name in presets:
        resolve_one(name, ())
    return resolved


def _sets(body: Any, path: tuple) -> bool:
    """Whether the mapping `body` writes a value at `path`."""
    for part in path:
        if isinstance(body, dict) and part in body:
            body = body[part]
        elif isinstance(body, list) and isinstance(part, int) and part < len(body):
            body = body[part]
        else:
            return False
    return True


def _locator(raw: dict):
    """path in the resolved document -> path where params.yaml writes it: a preset's own value,
    else the nearest preset it extends that sets it, else `defaults` (where a key every preset
    lacks belongs)."""
    presets = raw.get("presets") or {}

    def locate(path: tuple) -> tuple:
        if len(path) < 2 or path[0] != "presets" or path[1] not in presets:
            return path
        name, rest = path[1], path[2:]
        while name is not None:
            if _sets(presets[name], rest):
                return ("presets", name) + rest
            name = presets[name].get("extends")
        return ("defaults",) + rest

    return locate


def validate(raw: dict, source: str = "params.yaml") -> dict[str, dict]:
    """Check the file and return its presets, each resolved in full."""
    extra = sorted(set(raw) - {"preset", "defaults", "presets", "report"})
    if extra:
        raise ParamsError(
            f"{source}: unknown top-level key(s) {', '.join(extra)}; allowed: preset, defaults, presets, report"
        )
    presets = resolve_presets(raw, source)
    document = {k: v for k, v in raw.items() if k != "defaults"} | {"presets": presets}
    errors = schema_errors(document, schema.json_schema(), source, _locator(raw))
    if errors:
        raise ParamsError("invalid parameters:\n  " + "\n  ".join(errors))
    if raw["preset"] not in presets:
        raise ParamsError(
            f"{source}: preset: '{raw['preset']}' is not one of the presets "
            f"({', '.join(presets)}); use --config preset=NAME with one of them"
        )
    for name, preset in presets.items():
        _check_consistency(_typed(schema.Preset, preset, f"{source}: presets.{name}"), f"{source}: presets.{name}")
    return presets


def _typed(model: type[schema.S], document: dict, where: str) -> schema.S:
    """`document` as the typed `model`; what the schema lets through and the class refuses
    (e.g. 2.0 where a whole number belongs: JSON Schema calls it an integer) is named too."""
    try:
        return model.model_validate(document)
    except pydantic.ValidationError as err:
        raise ParamsError(
            f"{where}.{schema.first_error(err)}; write the value as the comment "
            "beside its key in params.yaml says (e.g. 2, not 2.0)"
        ) from None


def _check_consistency(preset: schema.Preset, where: str) -> None:
    """Rules the schema cannot express."""
    data, model, train = preset.data, preset.model, preset.train
    if data.synthetic is not None and data.fetch is not None:
        raise ParamsError(f"{where}.data: synthetic and fetch are alternatives; set one to null")
    if data.name == "synthetic" and data.synthetic is None:
        raise ParamsError(
            f"{where}.data.synthetic: the synthetic dataset needs its generator "
            "settings (seed, image_size, ...); see the demo preset"
        )
    if model.arch == "tiny":
        for key in ("anchor_sizes", "channels", "representation_size"):
            if getattr(model, key) is None:
                raise ParamsError(f"{where}.model.{key}: required for arch 'tiny'")
        if model.backbone_weights is not None:
            raise ParamsError(f"{where}.model.backbone_weights: arch 'tiny' has no pretrained backbone; set it to null")
    if model.max_size < model.min_size:
        raise ParamsError(f"{where}.model.max_size ({model.max_size}) is smaller than min_size ({model.min_size})")
    steps = train.lr_steps
    if steps != sorted(steps) or len(set(steps)) != len(steps):
        raise ParamsError(
            f"{where}.train.lr_steps: {steps} must be strictly increasing epochs; "
            f"list each once, in order: {sorted(set(steps))}"
        )
    # Epochs count from 0 and a step N lowers the lr from epoch N on, so a step at or past
    # `epochs` never fires: usually a preset that shortened epochs and kept its parent's steps.
    late = [step for step in steps if step >= train.epochs]
    if late:
        raise ParamsError(
            f"{where}.train.lr_steps: {late} reach past the last epoch (epochs: "
            f"{train.epochs}) and would never lower the lr; keep every step "
            f"below {train.epochs} (lr_steps: [] for no decay) or raise epochs"
        )


def parse_overrides(text: str) -> dict[str, Any]:
    """`--config set='train.epochs=2; model.channels=32'` -> {"train.epochs": 2, ...}, each value
    read as YAML (2 is a number, [4, 5] a list, null nothing, 'x' text)."""
    overrides: dict[str, Any] = {}
    for item in (part.strip() for part in str(text).split(";")):
        if not item:
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ParamsError(f"--config set: '{item}' is not KEY=VALUE; write {OVERRIDE_FORM}")
        overrides[key] = parse_yaml(value.strip(), f"--config set ({key})")
    return overrides


def _overridden(config: dict, overrides: dict[str, Any]) -> dict:
    """`config` with each dotted key replaced, every key checked to exist (one error each)."""
    errors = []
    for key in overrides:
        node, parts = config, key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict) or part not in node:
                known = sorted(node) if isinstance(node, dict) else []
                close = difflib.get_close_matches(part, known, n=1)
                where = ".".join(parts[:depth]) or "(top level)"
                errors.append(
                    f"--config set: {key}: {where} has no key '{part}'"
                    + (f" (did you mean '{close[0]}'?)" if close else "")
                    + (
                        f"; its keys: {', '.join(known)}"
                        if known
                        else f"; {'.'.join(parts[:depth])} is a value, not a mapping"
                    )
                )
                break
            node = node[part]
    if errors:
        raise ParamsError("invalid overrides:\n  " + "\n  ".join(errors))
    return merged(config, schema.nested(overrides))


def resolve(raw: dict, source: str = "params.yaml") -> schema.Config:
    """Validate and return the chosen preset as the typed config: data, model, train, parallel,
    eval, sweep, resources, commbench, report, and `preset` (its name). A `set` key (the
    command line's `--config set=...`) overrides single values of it, checked in turn."""
    raw = dict(raw)
    overrides = parse_overrides(raw.pop("set", None) or "")
    presets = validate(raw, source)
    config = {"preset": raw["preset"], **presets[raw["preset"]], "report": raw["report"]}
    if overrides:
        config = _overridden(config, overrides)
        errors = schema_errors(config, schema.json_schema(schema.Config), "--config set")
        if errors:
            raise ParamsError("invalid overrides:\n  " + "\n  ".join(errors))
        _check_consistency(
            _typed(schema.Preset, {k: v for k, v in config.items() if k not in ("preset", "report")}, "--config set"),
            "--config set: the result",
        )
    return _typed(schema.Config, config, source)


def load_resolved(
    path: str | Path = "params.yaml", preset: str | None = None, overrides: str | None = None
) -> schema.Config:
    raw = load(path)
    if preset is not None:
        raw["preset"] = preset
    if overrides:
        raw["set"] = overrides
    return resolve(raw, str(path))


COMMAND_LINE_KEYS = {"preset": "preset=NAME", "set": "set='SECTION.KEY=VALUE; ...'"}


def check_command_line(entries: dict[str, Any]) -> None:
    """The workflow's `--config` entries: only `preset` and `set` (Snakemake reads every other
    value as text, so a number would arrive as a string)."""
    extra = sorted(set(entries) - set(COMMAND_LINE_KEYS))
    if extra:
        raise ParamsError(
            f"--config {extra[0]}=...: the command line sets "
            f"{' and '.join(COMMAND_LINE_KEYS.values())} only; change a value with "
            f"{OVERRIDE_FORM}, or write the presets you want into a file and pass "
            f"--configfile FILE (docs/presets.md)"
        )


def scaled_lr(train: schema.Train, global_batch: int) -> float:
    """Linear scaling rule (Goyal et al. 2017): lr grows with the total batch."""
    return train.base_lr * global_batch / train.base_batch


def canonical(obj: Any) -> str:
    """Stable JSON text, used as Snakemake params (so a change reruns the stage) and as CLI input."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
