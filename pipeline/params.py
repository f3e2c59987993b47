"""params.yaml: load, validate against the schema, resolve the chosen preset.

Everything that runs (the Snakefile, the stage CLIs, the tests) goes through `resolve`, so a
wrong key or value is reported once, before any job starts, naming the key and the remedy.
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
        return f"{source}: {where}: {error.instance!r} is not valid here: {error.message}"
    return f"{source}: {where}: {error.message}"


def validate(raw: dict, source: str = "params.yaml") -> None:
    schema = yaml.safe_load(SCHEMA_PATH.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(raw), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ParamsError("invalid parameters:\n  " + "\n  ".join(_describe(e, source) for e in errors))
    if raw["preset"] not in raw["presets"]:
        raise ParamsError(f"{source}: preset: '{raw['preset']}' is not one of the presets "
                          f"({', '.join(raw['presets'])}); use --config preset=NAME with one of them")
    for name, preset in raw["presets"].items():
        _check_consistency(preset, f"{source}: presets.{name}")


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
        raise ParamsError(f"{where}.train.lr_steps: {steps} must be strictly increasing epochs")
    for entry in preset["sweep"]:
        if "comm_hook" in entry and entry["strategy"] != "ddp":
            raise ParamsError(f"{where}.sweep: comm_hook is a ddp option, not {entry['strategy']}'s")
        if "placement" in entry and entry["strategy"] != "ps":
            raise ParamsError(f"{where}.sweep: placement is a ps option, not {entry['strategy']}'s")
        if entry["strategy"] == "single" and entry["world_size"] != 1:
            raise ParamsError(f"{where}.sweep: single runs one worker; world_size must be 1, "
                              f"not {entry['world_size']} (use ddp, ps or dp for more)")
    ids = [run_id(run) for run in _filled(preset["sweep"], train)]
    duplicates = sorted({r for r in ids if ids.count(r) > 1})
    if duplicates:
        raise ParamsError(f"{where}.sweep: duplicate entries {duplicates}; each combination once")


def resolve(raw: dict, source: str = "params.yaml") -> dict:
    """Validate and return the chosen preset as one flat config: data, model, train, eval,
    sweep, report, plus `preset` (its name)."""
    validate(raw, source)
    chosen = raw["presets"][raw["preset"]]
    return {"preset": raw["preset"], **chosen, "report": raw["report"]}


def load_resolved(path: str | Path = "params.yaml", preset: str | None = None) -> dict:
    raw = load(path)
    if preset is not None:
        raw["preset"] = preset
    return resolve(raw, str(path))


def variant(run: dict) -> str:
    """What distinguishes runs of one strategy: a ps run's placement, a ddp run's
    communication hook (none: plain all-reduce); '' for the others."""
    chosen = {"ddp": run.get("comm_hook", "none"), "ps": run.get("placement")}.get(run["strategy"])
    return "" if chosen in (None, "none") else chosen


def run_id(run: dict) -> str:
    """Stable name of one filled sweep entry, used in paths: single-w1-b8, ddp-fp16-w2-b4,
    ps-dedicated-w2-b4 (a ps run always names its placement; ddp names a hook if it has one)."""
    name = run["strategy"] + (f"-{variant(run)}" if variant(run) else "")
    return f"{name}-w{run['world_size']}-b{run['images_per_worker']}"


STRATEGY_DEFAULTS = {"ddp": {"comm_hook": "none"}, "ps": {"placement": "colocated"}}


def _filled(sweep: list[dict], train: dict) -> list[dict]:
    return [{"images_per_worker": train["images_per_worker"],
             **STRATEGY_DEFAULTS.get(entry["strategy"], {}), **entry} for entry in sweep]


def runs(cfg: dict) -> dict[str, dict]:
    """run id -> the sweep entry, with images_per_worker filled in from train."""
    return {run_id(run): run for run in _filled(cfg["sweep"], cfg["train"])}


def scaled_lr(train: dict, global_batch: int) -> float:
    """Linear scaling rule (Goyal et al. 2017): lr grows with the total batch."""
    return train["base_lr"] * global_batch / train["base_batch"]


def canonical(obj: Any) -> str:
    """Stable JSON text, used as Snakemake params (so a change reruns the stage) and as CLI input."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
