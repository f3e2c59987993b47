"""Changing one value: `--config set=...` overrides, strict YAML (a key given twice, a syntax
error), and one error per mistake, named where it was made."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from pipeline.config import params, schema, stages

from .conftest import HANG_S, REPO
from .workflow import copy_workflow

PARAMS = REPO / "params.yaml"


@pytest.fixture
def raw() -> dict:
    return params.load(PARAMS)


def test_set_keeps_numbers_numbers_and_reaches_the_stage(raw):
    cfg = params.resolve(dict(raw, set="train.epochs=4; train.lr_steps=[3]; eval.every_epochs=0"))
    assert cfg.train.epochs == 4 and type(cfg.train.epochs) is int
    assert cfg.train.lr_steps == [3] and cfg.eval.every_epochs == 0
    plain = params.resolve(raw)
    assert stages.config_for(cfg, "train")["train"] == {**stages.config_for(plain, "train")["train"],
                                                        "epochs": 4, "lr_steps": [3]}
    # only what was named changed: the rest is the preset's
    assert cfg.model == plain.model and cfg.sweep == plain.sweep


def test_set_reads_values_as_yaml(raw):
    cfg = params.resolve(dict(raw, set="model.backbone_weights=null; train.base_lr=0.02; "
                                        "data.exif_orientation=apply; report.target_ap.demo=0.05"))
    assert cfg.model.backbone_weights is None and cfg.train.base_lr == 0.02
    assert cfg.data.exif_orientation == "apply" and cfg.report.target_ap["demo"] == 0.05


@pytest.mark.parametrize("overrides, expected", [
    ("train.epoch=4", r"--config set: train\.epoch: train has no key 'epoch' \(did you mean 'epochs'\?\)"),
    ("trian.epochs=4", r"--config set: trian\.epochs: \(top level\) has no key 'trian' \(did you mean 'train'\?\)"),
    ("train.epochs=four", r"--config set: train\.epochs: 'four' is not of type 'integer'; write a whole number"),
    ("train.epochs='4'", r"--config set: train\.epochs: '4' is not of type 'integer'; write a whole number, without quotes"),
    ("train.epochs", r"--config set: 'train\.epochs' is not KEY=VALUE"),
    ("train.epochs=9; train.lr_steps=[12]", r"--config set: the result\.train\.lr_steps: \[12\] reach past the last epoch"),
])
def test_a_wrong_override_names_the_command_line(raw, overrides, expected):
    with pytest.raises(params.ParamsError, match=expected) as err:
        params.resolve(dict(raw, set=overrides))
    assert "params.yaml" not in str(err.value)


def test_two_wrong_overrides_give_two_errors(raw):
    with pytest.raises(params.ParamsError) as err:
        params.resolve(dict(raw, set="train.epoch=4; model.chanels=8"))
    lines = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert len(lines) == 2 and "'epoch'" in lines[0] and "'chanels'" in lines[1]


def test_a_key_given_twice_is_refused_with_both_places(tmp_path):
    text = PARAMS.read_text() + "\npresets:\n  mine: {extends: demo}\n"
    path = tmp_path / "params.yaml"
    path.write_text(text)
    second = text.count("\n", 0, text.rindex("\npresets:")) + 2  # 1-based line of the second key
    first = text[:text.index("\npresets:")].count("\n") + 2
    with pytest.raises(params.ParamsError) as err:
        params.load(path)
    assert str(err.value).startswith(f"{path}:{second}:1: the key 'presets' is given a second time")
    assert f"first at line {first}, column 1" in str(err.value)


def test_a_yaml_syntax_error_names_file_line_and_column(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("preset: demo\ndefaults:\n  train: {epochs: 2\n  model: {}\n")
    with pytest.raises(params.ParamsError, match=rf"^{re.escape(str(path))}:\d+:\d+: not valid YAML: "):
        params.load(path)


def test_a_mistake_in_defaults_is_named_once_where_it_was_made(raw):
    raw["defaults"]["train"]["momentum"] = 2  # every preset inherits it
    raw["defaults"]["train"]["lr_gama"] = 0.1
    with pytest.raises(params.ParamsError) as err:
        params.resolve(raw)
    lines = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert len(lines) == 2, lines
    assert any(line.startswith("params.yaml: defaults.train: unknown key 'lr_gama' (did you mean 'lr_gamma'?)")
               for line in lines)
    assert any(line.startswith("params.yaml: defaults.train.momentum: 2 is greater than the maximum of 1")
               for line in lines)


def test_a_key_removed_from_defaults_is_named_once(raw):
    del raw["defaults"]["train"]["momentum"]
    with pytest.raises(params.ParamsError) as err:
        params.resolve(raw)
    (line,) = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert line.startswith("params.yaml: defaults.train: 'momentum' is a required property")


def test_a_presets_own_mistake_is_named_in_it(raw):
    raw["presets"]["demo-quick"]["train"]["epochs"] = 0
    with pytest.raises(params.ParamsError) as err:
        params.resolve(raw)
    (line,) = [line.strip() for line in str(err.value).splitlines()[1:]]
    assert line.startswith("params.yaml: presets.demo-quick.train.epochs: 0 is less than the minimum of 1")


def test_the_typed_config_gives_back_what_it_read(raw):
    """No coercion: a stage's config hashes the same from params.yaml or from its command line."""
    for name in raw["presets"]:
        resolved = params.resolve_presets(raw)[name]
        cfg = params.resolve(dict(raw, preset=name))
        assert cfg.model_dump() == {"preset": name, **resolved, "report": raw["report"]}
        for stage in stages.STAGES:
            as_sent = stages.config_for(cfg, stage)
            view = stages.STAGES[stage].config.model_validate(stages.with_knobs(as_sent, stages.knobs_for(cfg, stage)))
            assert stages.config_for(view, stage) == as_sent


def test_the_config_is_read_by_attribute_only():
    """No `cfg["..."]` read and no `cfg: dict` parameter left in pipeline/."""
    pattern = re.compile(r"""\bcfg\[["']|\bcfg: dict\b|_cfg\[["']|\bcfg\.get\(""")
    found = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "pipeline").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found


def test_schema_is_strict():
    with pytest.raises(Exception):
        schema.Train.model_validate({"epochs": "2"})


@pytest.mark.slow
def test_the_command_line_takes_preset_and_set_only(tmp_path):
    """Through Snakemake: `set=` plans with the changed value; any other --config key is refused
    naming the forms it takes; a key given twice in params.yaml is refused naming its line."""
    workdir = copy_workflow(tmp_path)
    snakemake = [sys.executable, "-m", "snakemake", "--cores", "1", "-n"]
    planned = subprocess.run(snakemake + ["--config", "set=train.epochs=2; train.lr_steps=[1]"],
                             cwd=workdir, capture_output=True, text=True, timeout=HANG_S)
    assert planned.returncode == 0, planned.stderr[-3000:]
    refused = subprocess.run(snakemake + ["--config", "presets={demo: {train: {epochs: 2}}}"],
                             cwd=workdir, capture_output=True, text=True, timeout=HANG_S)
    assert refused.returncode != 0
    assert "--config presets=...: the command line sets preset=NAME and set=" in refused.stdout + refused.stderr
    # an overlay that redefines a built-in preset is refused (case configfile-redefines-a-preset)
    (workdir / "mine.yaml").write_text("presets:\n  demo:\n    train: {epochs: 2}\n")
    redefined = subprocess.run(snakemake + ["--configfile", "mine.yaml"], cwd=workdir, capture_output=True,
                               text=True, timeout=HANG_S)
    assert redefined.returncode != 0 and not (workdir / "results").exists()
    message = next(line for line in (redefined.stdout + redefined.stderr).splitlines() if "redefines" in line)
    from .test_bad_inputs import check_readme_row
    check_readme_row("configfile-redefines-a-preset", message)
    text = (workdir / "params.yaml").read_text()
    (workdir / "params.yaml").write_text(text + "\npreset: demo\n")
    twice = subprocess.run(snakemake, cwd=workdir, capture_output=True, text=True, timeout=HANG_S)
    assert twice.returncode != 0
    assert re.search(r"params\.yaml:\d+:1: the key 'preset' is given a second time", twice.stdout + twice.stderr)


def test_an_overlay_adds_presets_and_never_redefines_a_built_in_one(raw):
    """A --configfile merges into params.yaml key by key: a preset of the same name would change
    params.yaml's silently, its results landing in the built-in preset's folders."""
    params.check_overlay({"presets": {"demo-mine": {"extends": "demo"}}}, "mine.yaml", raw)  # a new name: fine
    params.check_overlay({"report": {"figure_formats": ["png"]}}, "mine.yaml", raw)
    with pytest.raises(params.ParamsError) as err:
        params.check_overlay({"presets": {"demo": {"train": {"epochs": 2}}}}, "mine.yaml", raw)
    assert str(err.value) == (
        "mine.yaml: presets.demo: redefines params.yaml's preset 'demo' (its results are in results/runs/demo); "
        "give yours a new name that starts from it, e.g. presets: {demo-mine: {extends: demo, ...}}, and run it "
        "with --config preset=demo-mine")
    # the remedy works: the new name resolves, and demo stays as params.yaml has it
    merged = dict(raw, presets=dict(raw["presets"], **{"demo-mine": {"extends": "demo", "train": {"epochs": 9}}}))
    assert params.resolve(dict(merged, preset="demo-mine")).train.epochs == 9
    assert params.resolve(dict(merged, preset="demo")) == params.resolve(dict(raw, preset="demo"))


def test_a_whole_number_written_as_a_float_is_named(raw):
    """JSON Schema calls 6.0 an integer; the typed config does not: named, not a traceback."""
    raw["presets"]["demo"]["train"]["epochs"] = 6.0
    with pytest.raises(params.ParamsError, match=r"^params\.yaml: presets\.demo\.train\.epochs: .*got 6\.0"):
        params.resolve(raw)
