"""params.yaml: both presets validate; a wrong key or value is reported by name."""
from __future__ import annotations

import copy
import json

import pytest

from pipeline import strategies
from pipeline.config import params, schema
from pipeline.strategies import sweep

from .conftest import REPO


@pytest.fixture
def raw() -> dict:
    return params.load(REPO / "params.yaml")


def test_both_presets_validate(raw):
    for preset in raw["presets"]:
        cfg = params.resolve(dict(raw, preset=preset))
        assert isinstance(cfg, schema.Config) and cfg.preset == preset
        assert set(cfg.model_dump()) == {"preset", "data", "model", "train", "parallel", "eval", "sweep",
                                         "resources", "commbench", "report"}


def test_demo_is_the_default(raw):
    assert raw["preset"] == "demo"
    cfg = params.resolve(raw)
    assert cfg.data.synthetic is not None and cfg.model.arch == "tiny"
    # The model must not silently upsample the small images to 800 px.
    assert cfg.model.min_size == cfg.model.max_size == cfg.data.synthetic.image_size


def test_coco2017_is_the_published_recipe(raw):
    cfg = params.resolve(dict(raw, preset="coco2017"))
    model, train = cfg.model, cfg.train
    assert model.arch == "fasterrcnn_resnet50_fpn" and model.backbone_weights == "imagenet"
    assert train.epochs == 26 and train.lr_steps == [16, 22]
    assert train.images_per_worker == 2 and train.warmup_iters == "auto"  # 1000 on COCO
    assert params.scaled_lr(train, 16) == pytest.approx(0.02)
    assert params.scaled_lr(train, 4) == pytest.approx(0.005)  # 2 GPUs x 2 images
    assert cfg.data.aspect_ratio_groups > 0


def test_unknown_key_is_named_with_a_suggestion(raw):
    raw["presets"]["demo"]["train"]["lr_step"] = [3]
    with pytest.raises(params.ParamsError) as err:
        params.resolve(raw)
    message = str(err.value)
    assert "presets.demo.train" in message and "'lr_step'" in message
    assert "did you mean 'lr_steps'" in message


@pytest.mark.parametrize("path, value, expected", [
    (("train", "base_lr"), -0.1, "presets.demo.train.base_lr"),
    (("train", "epochs"), "ten", "presets.demo.train.epochs"),
    (("model", "arch"), "resnet9000", "presets.demo.model.arch"),
    (("eval", "score_threshold"), 2, "presets.demo.eval.score_threshold"),
])
def test_wrong_value_is_named(raw, path, value, expected):
    raw["presets"]["demo"][path[0]][path[1]] = value
    with pytest.raises(params.ParamsError, match=expected.replace(".", r"\.")):
        params.resolve(raw)


def test_missing_key_is_named(raw):
    del raw["defaults"]["train"]["momentum"]  # no preset sets it: it comes from defaults
    with pytest.raises(params.ParamsError, match="'momentum' is a required property") as err:
        params.resolve(raw)
    # named once, where it belongs (defaults), not once for each preset that inherits it
    assert str(err.value).count("'momentum'") == 1
    assert "params.yaml: defaults.train: 'momentum' is a required property" in str(err.value)


def test_unknown_preset(raw):
    with pytest.raises(params.ParamsError, match="preset: 'coco2014' is not one of"):
        params.resolve(dict(raw, preset="coco2014"))


def test_cross_field_rules(raw):
    bad = copy.deepcopy(raw)
    bad["presets"]["demo"]["train"]["lr_steps"] = [11, 9]
    with pytest.raises(params.ParamsError, match="lr_steps"):
        params.resolve(bad)
    bad = copy.deepcopy(raw)
    bad["presets"]["demo"]["sweep"] = [{"strategy": "single", "workers": 1}] * 2
    with pytest.raises(params.ParamsError, match="duplicate entries"):
        sweep.runs(params.resolve(bad))


def test_malformed_yaml_names_the_file(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("preset: demo\npresets: [unclosed\n")
    with pytest.raises(params.ParamsError, match=str(path)):
        params.load(path)


def test_runs_fill_images_per_worker(raw):
    cfg = schema.replaced(params.resolve(raw), sweep=[
        {"strategy": "single", "workers": 1}, {"strategy": "single", "workers": 1, "images_per_worker": 2}])
    runs = sweep.runs(cfg)
    per_worker = cfg.train.images_per_worker
    assert list(runs) == [f"single-w1-b{per_worker}-s0", "single-w1-b2-s0"]
    assert runs["single-w1-b2-s0"].images_per_worker == 2


def test_schema_is_closed_everywhere():
    """Every object in the schema rejects unknown keys (else a typo is silently ignored)."""
    generated = schema.json_schema()  # what params.yaml is validated against

    def objects(node):
        if isinstance(node, dict):
            if node.get("type") == "object" and "properties" in node:
                yield node
            for value in node.values():
                yield from objects(value)
        elif isinstance(node, list):
            for value in node:
                yield from objects(value)

    found = list(objects(generated))
    assert len(found) > 8
    assert all(node.get("additionalProperties") is False for node in found)


def test_strategy_options_belong_to_their_strategy(raw):
    demo = raw["presets"]["demo"]
    for entry, message in [({"strategy": "single", "workers": 2}, "single runs at most 1 worker"),
                           ({"strategy": "ps", "workers": 2, "comm_hook": "fp16"}, "comm_hook is a ddp option"),
                           ({"strategy": "ddp", "workers": 2, "placement": "dedicated"}, "placement is a ps option"),
                           ({"strategy": "ps", "workers": 2, "servers": 3},
                            r"colocated servers live on workers: 3 servers need at least as many workers, not 2 \(or use placement: dedicated\)"),
                           ({"strategy": "ps", "workers": 2, "servers": 0}, "servers: 0 is less than the minimum of 1")]:
        bad = copy.deepcopy(raw)
        bad["presets"]["demo"]["sweep"] = [entry]
        with pytest.raises(params.ParamsError, match=message):
            sweep.runs(params.resolve(bad))
    demo["sweep"] = [{"strategy": "ddp", "workers": 2}, {"strategy": "ddp", "workers": 2, "comm_hook": "powersgd"},
                     {"strategy": "ps", "workers": 2}, {"strategy": "ps", "workers": 1, "placement": "dedicated"},
                     {"strategy": "dp", "workers": 2, "images_per_worker": 2},
                     {"strategy": "ps", "workers": 2, "placement": "dedicated", "servers": 2}]
    per_worker = demo["train"]["images_per_worker"]
    assert list(sweep.runs(params.resolve(raw))) == [
        f"ddp-w2-b{per_worker}-s0", f"ddp-powersgd-w2-b{per_worker}-s0",
        f"ps-colocated-w2-b{per_worker}-s0", f"ps-dedicated-w1-b{per_worker}-s0", "dp-w2-b2-s0",
        f"ps-dedicated-k2-w2-b{per_worker}-s0"]  # one server: named as before shards existed


def test_resolved_presets_are_what_they_were_before_presets_could_extend(raw):
    """The presets now say only what differs from `defaults`; resolved, they are unchanged
    (tests/data holds them as they were written out in full, with `workers` for world_size),
    but for what changed on purpose since, each named here."""
    before = json.loads((REPO / "tests" / "data" / "presets_before_extends.json").read_text())
    resolved = params.validate(raw)
    added = {"data": ["mode",  # data modes
                      "exif_orientation",  # images a viewer shows turned: refused, or read as said
                      "category_mismatch"],  # val categories training lacks: refused, or warned
             "eval": ["every_epochs"],  # time-to-accuracy
             # checkpoints mid-epoch, a bound on waiting for a dead peer, elastic restarts
             "train": ["checkpoint_every", "precision", "channels_last",  # and mixed precision,
                       "warmup_iters",  # the reference's warm-up (auto) replaced 50 and 1000
                       "time_split",  # the per-phase timing can be switched off
                       "sync_debug",  # a GPU run can check it synchronises nothing
                       "compile", "optimizer"],  # speed knobs (pipeline/training/speed.py)
             "parallel": ["timeout_s", "max_restarts", "crash_retries"]}  # and a crashed job's retry
    added["eval"].append("backend")  # COCOeval's implementation
    added["model"] = ["norm"]  # the tiny model's BatchNorm or GroupNorm (the accuracy ablation)

    def without(preset: dict, *sections: str) -> dict:
        # `resources` came later (scheduler requests only; no stage reads it), and so did
        # `commbench` (the cost model's link timings); the sweeps gained repeats and data modes.
        kept = {k: copy.deepcopy(v) for k, v in preset.items()
                if k not in ("resources", "sweep", "commbench") + sections}
        for section, keys in added.items():
            for key in keys:
                kept.get(section, {}).pop(key, None)
        return kept

    # coco2017's loader processes follow the cores per training process now (data.workers: auto)
    assert before["coco2017"]["data"].pop("workers") == 4
    assert resolved["coco2017"]["data"].pop("workers") == "auto"
    # and it scores one image at a time, as the reference trainer does (no padding to a batch)
    assert before["coco2017"]["eval"].pop("batch_size") == 4
    assert resolved["coco2017"]["eval"].pop("batch_size") == 1
    assert without(resolved["coco2017"]) == without(before["coco2017"])
    assert resolved["coco2017"]["data"]["mode"] == "real"
    # The demo's recipe as it was lives on as demo-parity (issue 15's accuracy check runs on
    # it); its data has its own name and directory, so the two never share a dataset.
    parity, old_demo = without(resolved["demo-parity"]), without(before["demo"])
    for name in ("name", "root"):
        parity["data"].pop(name), old_demo["data"].pop(name)
    assert parity == old_demo
    assert resolved["demo"]["train"]["epochs"] < old_demo["train"]["epochs"]


def test_a_preset_extends_another_with_only_what_differs(raw):
    raw["presets"]["quick"] = {"extends": "demo", "train": {"epochs": 1, "lr_steps": []},
                               "sweep": [{"strategy": "single", "workers": 1}]}
    presets = params.validate(raw)
    expected = copy.deepcopy(presets["demo"])
    expected["train"].update(epochs=1, lr_steps=[])
    expected["sweep"] = [{"strategy": "single", "workers": 1}]
    assert presets["quick"] == expected
    raw["presets"]["demo"]["extends"] = "quick"
    with pytest.raises(params.ParamsError, match="presets.demo.extends: a cycle"):
        params.validate(raw)
    raw["presets"]["demo"]["extends"] = "coco2014"
    with pytest.raises(params.ParamsError, match="'coco2014' is not one of the presets"):
        params.validate(raw)


def test_world_size_is_the_deprecated_name_of_workers(raw):
    cfg = params.resolve(raw)
    with pytest.warns(FutureWarning, match=r"'world_size' is deprecated; write 'workers: 2'"):
        old = sweep.runs(schema.replaced(cfg, sweep=[{"strategy": "ddp", "world_size": 2}]))
    assert old == sweep.runs(schema.replaced(cfg, sweep=[{"strategy": "ddp", "workers": 2}]))
    with pytest.raises(params.ParamsError, match="both world_size and workers"):
        sweep.runs(schema.replaced(cfg, sweep=[{"strategy": "ddp", "workers": 2, "world_size": 2}]))


def test_sweep_entries_are_closed_by_their_strategy(raw):
    cfg = params.resolve(raw)

    def runs_of(*entries):
        return sweep.runs(schema.replaced(cfg, sweep=list(entries)))

    with pytest.raises(params.ParamsError, match=r"sweep\[0\]: unknown key 'worker' \(did you mean 'workers'\?\)"):
        runs_of({"strategy": "ddp", "worker": 2})
    with pytest.raises(params.ParamsError, match=r"sweep\[0\].comm_hook: 'fp8' is not one of"):
        runs_of({"strategy": "ddp", "workers": 2, "comm_hook": "fp8"})
    with pytest.raises(params.ParamsError, match="unknown strategy 'horovod'"):
        runs_of({"strategy": "horovod", "workers": 2})
    for strategy in strategies.STRATEGIES.values():  # every option is in a closed schema
        assert sweep._entry_schema(strategy)["additionalProperties"] is False


def test_the_demo_sweep_measures_noise_scaling_and_the_loader():
    """What the default report needs from its sweep: 3+ seeds of every multi-worker run (but
    the held-out entries: the cost model's out-of-sample check, one seed each), two worker
    counts per multi-process strategy, and single and ddp-w2 in both data modes."""
    cfg = params.load_resolved(REPO / "params.yaml", preset="demo")
    all_runs = list(sweep.runs(cfg).values())
    seeds: dict[str, set] = {}
    for run in all_runs:
        seeds.setdefault(sweep.entry_id(run), set()).add(run.seed)
    for run in all_runs:
        if run.workers > 1 and sweep.entry_id(run) not in sweep.held_out(cfg):
            assert len(seeds[sweep.entry_id(run)]) >= 3, sweep.entry_id(run)
    for strategy in ("ddp", "ps"):
        assert {r.workers for r in all_runs if r.strategy == strategy} >= {1, 2}
    modes = {(r.strategy, r.workers, r.data_mode) for r in all_runs}
    assert {("single", 1, "real"), ("single", 1, "synthetic"), ("ddp", 2, "real"),
            ("ddp", 2, "synthetic")} <= modes
    assert cfg.eval.every_epochs >= 1 and cfg.preset in cfg.report.target_ap


def test_demo_quick_runs_each_strategy_once_on_the_demos_data():
    """The quick variant (issue 50): the demo's data and model, one run of every registered
    strategy at the demo's global batch, one seed, fewer epochs, and a target AP of its own."""
    demo = params.load_resolved(REPO / "params.yaml", preset="demo")
    quick = params.load_resolved(REPO / "params.yaml", preset="demo-quick")
    runs = list(sweep.runs(quick).values())
    assert sorted(run.strategy for run in runs) == sorted(strategies.STRATEGIES)
    assert {run.seed for run in runs} == {quick.train.seed}
    assert {run.workers * run.images_per_worker for run in runs} == {demo.train.images_per_worker}
    assert quick.data == demo.data and quick.model == demo.model
    assert quick.train.epochs < demo.train.epochs and quick.eval.every_epochs >= 1
    targets = quick.report.target_ap
    assert "demo-quick" in targets and targets["demo-quick"] != targets["demo"]


def test_more_repeats_add_runs_without_changing_the_others(raw):
    cfg = params.resolve(raw)

    def runs_of(*entries):
        return sweep.runs(schema.replaced(cfg, sweep=list(entries)))

    two = runs_of({"strategy": "ddp", "workers": 2, "repeats": 2})
    three = runs_of({"strategy": "ddp", "workers": 2, "repeats": 3})
    per_worker = cfg.train.images_per_worker
    assert list(three) == [f"ddp-w2-b{per_worker}-s{seed}" for seed in (0, 1, 2)]
    assert all(three[run_id] == run for run_id, run in two.items())  # same params: no rerun
    assert [run.seed for run in three.values()] == [0, 1, 2] and "repeats" not in three[list(three)[0]].to_json()
    with pytest.raises(params.ParamsError, match="sintetic"):
        runs_of({"strategy": "ddp", "workers": 2, "data_mode": "sintetic"})


def test_a_run_is_typed_once_and_crosses_the_launch_boundary_as_its_entry(raw):
    """The filled entry's JSON, as the launcher and the training read it back; a misspelt
    option fails where it is asked for, naming it, as it fails at fill time in the sweep."""
    from pipeline.runtime.run import Run, RunError
    from pipeline.strategies import FSDP

    cfg = schema.replaced(params.resolve(raw), sweep=[{"strategy": "fsdp", "workers": 2, "precision": "bf16"}])
    run = next(iter(sweep.runs(cfg).values()))
    assert run.option("reshard_after_forward") is True  # its declared default, filled once
    assert Run.from_json(json.loads(json.dumps(run.to_json()))) == run
    assert run.to_json()["reshard_after_forward"] is True and "repeats" not in run.to_json()
    with pytest.raises(RunError, match="no option 'reshard'.*reshard_after_forward"):
        run.option("reshard")
    with pytest.raises(ValueError, match="fsdp: no option 'comm_hook'"):
        FSDP.filled(workers=2, comm_hook="fp16")
    assert FSDP.filled(workers=2).precision == "fp32"  # a run made by hand: the Run's defaults
