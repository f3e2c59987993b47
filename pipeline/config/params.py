"""params.yaml: load, resolve the presets (each extends `defaults` or another preset), validate.

Everything that runs (the Snakefile, the stage CLIs, the tests) goes through `resolve`, so a
wrong key or value is reported once, before any job starts, naming the key and the remedy.
The sweep's entries belong to the strategies and are filled and checked by pipeline/strategies/sweep.py.
"""
from __future__ import annotations

import difflib
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

SCHEMA_PATH = Path(__file__).with_name("params.schema.yaml")


class ParamsError(ValueError):
    """params.yaml is malformed; the message names the file, the key and what to do."""


def load(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ParamsError(f"{path}: cannot read the parameter file ({err.strerror})") from err
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from err
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of parameter groups at the top level")
    return raw


def _key_path(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top level)"


# How the schema's types read in a remedy.
TYPE_WORDS = {"integer": "a whole number", "number": "a number", "string": "text",
              "boolean": "true or false", "array": "a list", "object": "a mapping", "null": "null"}
LIMIT_REMEDIES = {"minimum": "set it to {} or more", "exclusiveMinimum": "set it above {}",
                  "maximum": "set it to {} or less", "exclusiveMaximum": "set it below {}",
                  "minItems": "give it at least {} item(s)",
                  "minLength": "give it at least {} character(s)", "const": "set it to {!r}"}
SCHEMA_HINT = "see the comment beside the key in params.yaml, or pipeline/config/params.schema.yaml"


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


def _describe(error: jsonschema.ValidationError, source: str) -> str:
    where = _key_path(error)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(allowed))
        hints = []
        for key in extra:
            close = difflib.get_close_matches(key, allowed, n=1)
            hints.append(f"'{key}'" + (f" (did you mean '{close[0]}'?)" if close else ""))
        return (f"{source}: {where}: unknown key {', '.join(hints)}; "
                f"allowed keys: {', '.join(allowed)}")
    if error.validator == "required":
        return f"{source}: {where}: {error.message}; add it (see the demo preset for an example)"
    if error.validator in ("oneOf", "anyOf"):
        if all(e.validator == "type" and not e.path for e in error.context):  # wrong type
            return (f"{source}: {where}: {error.instance!r} is not of type "
                    f"{' or '.join(map(repr, _kinds(error)))}; {_type_remedy(error)}")
        return (f"{source}: {where}: {error.instance!r} is not valid here: {error.message}; "
                f"{SCHEMA_HINT}")
    return f"{source}: {where}: {error.message}; {remedy(error)}"


def schema_errors(document, schema: dict, source: str) -> list[str]:
    """Each way `document` breaks `schema`, said as params.yaml's errors are (the file, the
    key, the remedy): for files checked against a part of this schema (a what-if cluster)."""
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted((inner for e in validator.iter_errors(document) for inner in _innermost(e)),
                    key=lambda e: list(map(str, e.absolute_path)))
    return [_describe(e, source) for e in errors]


def merged(base: dict, override: dict) -> dict:
    """`override` on top of `base`: mappings merge key by key; lists and values replace."""
    out = dict(base)
    for key, value in override.items():
        both_mappings = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both_mappings else value
    return out


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
            raise ParamsError(f"{source}: presets.{name}.extends: a cycle "
                              f"({' -> '.join(chain + (name,))}); one preset must extend defaults")
        own = presets[name]
        if not isinstance(own, dict):
            raise ParamsError(f"{source}: presets.{name}: expected a mapping of parameter groups")
        parent = own.get("extends")
        if parent is not None and parent not in presets:
            raise ParamsError(f"{source}: presets.{name}.extends: '{parent}' is not one of the "
                              f"presets ({', '.join(presets)})")
        base = resolve_one(parent, chain + (name,)) if parent else defaults
        body = {k: v for k, v in own.items() if k != "extends"}
        resolved[name] = merged(base, body)
        return resolved[name]

    for name in presets:
        resolve_one(name, ())
    return resolved


def validate(raw: dict, source: str = "params.yaml") -> dict[str, dict]:
    """Check the file and return its presets, each resolved in full."""
    extra = sorted(set(raw) - {"preset", "defaults", "presets", "report"})
    if extra:
        raise ParamsError(f"{source}: unknown top-level key(s) {', '.join(extra)}; allowed: "
                          "preset, defaults, presets, report")
    presets = resolve_presets(raw, source)
    document = {k: v for k, v in raw.items() if k != "defaults"} | {"presets": presets}
    errors = schema_errors(document, yaml.safe_load(SCHEMA_PATH.read_text()), source)
    if errors:
        raise ParamsError("invalid parameters:\n  " + "\n  ".join(errors))
    if raw["preset"] not in presets:
        raise ParamsError(f"{source}: preset: '{raw['preset']}' is not one of the presets "
                          f"({', '.join(presets)}); use --config preset=NAME with one of them")
    for name, preset in presets.items():
        _check_consistency(preset, f"{source}: presets.{name}")
    return presets


def _check_consistency(preset: dict, where: str) -> None:
    """Rules the schema cannot express."""
    data, model, train = preset["data"], preset["model"], preset["train"]
    if data["synthetic"] is not None and data["fetch"] is not None:
        raise ParamsError(f"{where}.data: synthetic and fetch are alternatives; set one to null")
    if data["name"] == "synthetic" and data["synthetic"] is None:
        raise ParamsError(f"{where}.data.synthetic: the synthetic dataset needs its generator "
                          "settings (seed, image_size, ...); see the demo preset")
    if model["arch"] == "tiny":
        for key in ("anchor_sizes", "channels", "representation_size"):
            if model[key] is None:
                raise ParamsError(f"{where}.model.{key}: required for arch 'tiny'")
        if model["backbone_weights"] is not None:
            raise ParamsError(f"{where}.model.backbone_weights: arch 'tiny' has no pretrained "
                              "backbone; set it to null")
    if model["max_size"] < model["min_size"]:
        raise ParamsError(f"{where}.model.max_size ({model['max_size']}) is smaller than "
                          f"min_size ({model['min_size']})")
    steps = train["lr_steps"]
    if steps != sorted(steps) or len(set(steps)) != len(steps):
        raise ParamsError(f"{where}.train.lr_steps: {steps} must be strictly increasing epochs; "
                          f"list each once, in order: {sorted(set(steps))}")
    # Epochs count from 0 and a step N lowers the lr from epoch N on, so a step at or past
    # `epochs` never fires: usually a preset that shortened epochs and kept its parent's steps.
    late = [step for step in steps if step >= train["epochs"]]
    if late:
        raise ParamsError(f"{where}.train.lr_steps: {late} reach past the last epoch (epochs: "
                          f"{train['epochs']}) and would never lower the lr; keep every step "
                          f"below {train['epochs']} (lr_steps: [] for no decay) or raise epochs")


def resolve(raw: dict, source: str = "params.yaml") -> dict:
    """Validate and return the chosen preset as one flat config: data, model, train, parallel,
    eval, sweep, report, plus `preset` (its name)."""
    presets = validate(raw, source)
    return {"preset": raw["preset"], **presets[raw["preset"]], "report": raw["report"]}


def load_resolved(path: str | Path = "params.yaml", preset: str | None = None) -> dict:
    raw = load(path)
    if preset is not None:
        raw["preset"] = preset
    return resolve(raw, str(path))


def scaled_lr(train: dict, global_batch: int) -> float:
    """Linear scaling rule (Goyal et al. 2017): lr grows with the total batch."""
    return train["base_lr"] * global_batch / train["base_batch"]


def canonical(obj: Any) -> str:
    """Stable JSON text, used as Snakemake params (so a change reruns the stage) and as CLI input."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
