"""Held-out sweep entries (pipeline/report/holdout.py): the flag is checked and changes no run;
the cost model is fitted without the held-out runs, then predicts them, in a section of their
own; a model that misses its goal says so in the answer. Made-up finished presets in the real
formats (tests/test_whatif.py's and tests/test_report.py's builders)."""
from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline import whatif
from pipeline.config import schema
from pipeline.config.params import ParamsError, load_resolved
from pipeline.report import holdout
from pipeline.report.answer import answer
from pipeline.report.data import ReportData
from pipeline.report.load import load_run
from pipeline.report.noise import comparisons
from pipeline.report.prediction import prediction_frame
from pipeline.report.sections import answer as answer_section
from pipeline.report.sections import held_out as held_out_section
from pipeline.report.verdict import Verdict
from pipeline.runtime.records.commbench import CommbenchRecord
from pipeline.strategies import sweep

from .test_answer import COMPARED, summary_of
from .test_report import make_ok_run
from .test_whatif import COMMBENCH, EXAMPLE, finished_preset

REPO = Path(__file__).resolve().parents[1]


def demo() -> schema.Config:
    return load_resolved(REPO / "params.yaml", preset="demo")


def test_the_flag_is_checked_and_changes_no_run():
    original = demo()
    before = sweep.runs(original)
    index = next(i for i, e in enumerate(original.sweep) if e["strategy"] == "zero" and e["workers"] == 2)

    def with_held_out(value) -> schema.Config:
        """The demo with its zero-w2 entry's held_out set to `value`."""
        entries = list(original.sweep)
        entries[index] = {**entries[index], "held_out": value}
        return schema.replaced(original, sweep=entries)

    flipped = not original.sweep[index].get("held_out", False)
    cfg = with_held_out(flipped)
    after = sweep.runs(cfg)
    # the same run ids, and each run the same to the byte of what trains it (its JSON is the
    # training job's Snakemake param and its checkpoint's fingerprint)
    assert list(after) == list(before)
    assert all(after[r].to_json() == before[r].to_json() for r in before)
    entry = sweep.entry_id(sweep.fill(cfg.sweep[index], cfg))
    assert (entry in sweep.held_out(cfg)) == cfg.sweep[index]["held_out"] == flipped
    with pytest.raises(ParamsError, match=rf"presets\.demo\.sweep\[{index}\]\.held_out: 'yes' is "
                                          "not of type 'boolean'; write true or false"):
        sweep.runs(with_held_out("yes"))


def test_the_demo_holds_out_entries_off_its_fitted_batch_or_hook():
    """The demo's held-out entries differ from every fitted multi-process entry in images a
    worker or DDP comm hook; among them a batch a worker below and one above every fitted
    multi-process entry's, with 2 seeds each (their median); and single at 1 thread runs at two
    batch sizes, the compute fit's."""
    cfg = demo()
    held = sweep.held_out(cfg)
    assert len(held) >= 2
    filled = [(sweep.fill(e, cfg), e.get("repeats", 1)) for e in cfg.sweep]
    fitted = [run for run, _ in filled if run.workers > 1 and sweep.entry_id(run) not in held]
    held_runs = [(run, repeats) for run, repeats in filled if sweep.entry_id(run) in held]
    for run, _ in held_runs:
        assert run.workers > 1
        assert all(run.images_per_worker != f.images_per_worker
                   or run.options.get("comm_hook") != f.options.get("comm_hook") for f in fitted)
    batches = {f.images_per_worker for f in fitted}
    assert any(run.images_per_worker < min(batches) and repeats >= 2 for run, repeats in held_runs)
    assert any(run.images_per_worker > max(batches) and repeats >= 2 for run, repeats in held_runs)
    one_thread = {run.images_per_worker for run, _ in filled if run.strategy == "single" and run.options.get("threads") == 1}
    assert len(one_thread) >= 2


def with_runs(root: Path, extra: list[tuple[str, int, int, dict]]) -> None:
    """Add runs (strategy, workers, images a worker, summary fields over make_ok_run's)."""
    for strategy, workers, per_worker, fields in extra:
        run_dir = make_ok_run(root, strategy, workers, per_worker, [2.0, 1.5], ap=0.2, iters_per_epoch=6)
        found = json.loads((run_dir / "train_summary.json").read_text())
        found.update(processes=workers, ranks=[{"gradient_bytes": 4_000_000}] * workers, **fields)
        (run_dir / "train_summary.json").write_text(json.dumps(found))


def params_holding_out(tmp_path: Path, entries: list[dict]) -> Path:
    """params.yaml with the demo sweep's entries `entries` added, held out."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["presets"]["demo"]["sweep"] += [{**e, "held_out": True} for e in entries]
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def band(results: Path, params: Path, out: Path) -> pd.DataFrame:
    whatif.main(["--cluster", str(EXAMPLE), "--from", str(results), "--preset", "demo",
                 "--params", str(params), "--csv", str(out)])
    return pd.read_csv(out)[["predicted_images_per_second_low", "predicted_images_per_second_high"]]


def test_a_wild_held_out_run_moves_neither_the_band_nor_the_compute(tmp_path, capsys):
    """What the what-if command and the report take from a finished preset, without its
    held-out entries: a ddp run measured 50x too fast does not widen the band."""
    results = tmp_path / "results"
    finished_preset(results)
    without = band(results, REPO / "params.yaml", tmp_path / "without.csv")
    with_runs(results / "runs" / "demo", [("ddp", 2, 8, {"device": "cuda:0", "backend": "nccl",
                                                         "images_per_second": 800.0})])
    params = params_holding_out(tmp_path, [{"strategy": "ddp", "workers": 2, "images_per_worker": 8}])
    capsys.readouterr()
    pd.testing.assert_frame_equal(band(results, params, tmp_path / "held.csv"), without)
    said = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("Uncertainty band"))
    assert "over 2 multi-process run(s)" in said and "ddp-w2-b8 left out" in said
    # the same runs with nothing held out: the wild run (predicted/measured x0.02) widens the band
    widened = band(results, REPO / "params.yaml", tmp_path / "widened.csv")
    assert (widened["predicted_images_per_second_high"] > without["predicted_images_per_second_high"]).all()


def test_a_held_out_single_is_no_input_to_the_model(tmp_path):
    """single's compute, data wait and optimizer come from the fitted single runs only: the
    held-out one, whose 2 images a step would otherwise be preferred for ddp's 2 a worker,
    changes no prediction."""
    root = tmp_path / "runs" / "demo"
    with_runs(root, [("single", 1, 4, {"threads": 1}), ("ddp", 2, 2, {"threads": 1})])
    links = {2: CommbenchRecord.from_json({**COMMBENCH, "backend": "gloo"})}
    fitted_only = prediction_frame([load_run(d) for d in sorted(root.iterdir())], links)
    with_runs(root, [("single", 1, 2, {"threads": 1, "time_split": {
        "data": 0.05, "compute": 3.5, "communication": 0.0, "optimizer": 0.05}})])
    runs = [load_run(d) for d in sorted(root.iterdir())]
    held = prediction_frame(runs, links, held_out={"single-w1-b2"})
    pd.testing.assert_frame_equal(held, fitted_only)
    assert "per image of 4 a step" in held.iloc[0]["compute_input"]
    assert prediction_frame(runs, links).iloc[0]["ratio"] < held.iloc[0]["ratio"] / 1.5  # it would
    section = holdout.HeldOut.of(held, runs, ["single-w1-b2"]).section()
    assert section["bullets"] == ["single-w1-b2: no prediction, one process: the model predicts runs "
                                  "of more than one (its runs are left out of the model's inputs all "
                                  "the same)"]
    assert "not checked out of sample" in section["text"][1]


def frame(ratios: dict[str, float], fitted: float = 1.3) -> pd.DataFrame:
    """prediction_frame's columns: a fitted ddp run off by `fitted`, and the held-out runs."""
    rows = [("ddp-w2-b4-s0", "ddp-w2-b4", fitted)] + [(f"{e}-s0", e, r) for e, r in ratios.items()]
    return pd.DataFrame([{"run_id": run, "entry": entry, "strategy": entry.split("-")[0],
                          "compute_input": "single at 1 thread(s), measured",
                          "compute_fixed_s": 0.0, "compute_per_image_s": 0.1, "compute_overhead_s": 0.01,
                          "measured_images_per_second": 40.0,
                          "predicted_images_per_second": 40.0 * ratio, "ratio": ratio,
                          "flag": "" if abs(ratio - 1) <= 0.2 else "missed by more than 20%"}
                         for run, entry, ratio in rows])


def test_the_sections_numbers_from_made_up_ratios():
    ratios = {"ddp-fp16-w2-b4": 1.12, "zero-w2-b2": 0.90}
    found = holdout.HeldOut.of(frame(ratios), [], list(ratios))
    logs = [math.log(1.12), math.log(0.90)]
    assert found.bias == pytest.approx(sum(logs) / 2)
    assert found.mean_abs_log == pytest.approx((abs(logs[0]) + abs(logs[1])) / 2)  # 0.109 > 0.08
    table = found.table()
    assert list(table["run_id"]) == ["ddp-fp16-w2-b4-s0", "zero-w2-b2-s0"]  # not the fitted run
    assert list(table["predicted / measured"]) == pytest.approx([1.12, 0.90])
    assert list(table["log(predicted / measured)"]) == pytest.approx(logs)
    assert list(table["within 15%"]) == ["yes", "yes"]
    assert not found.met
    assert found.sentence() == (
        "Out of sample the cost model misses its goal: fitted without them, it predicts its 2 "
        "held-out runs at predicted/measured x0.90-1.12, each entry within 15% of its seeds' "
        "median, with a mean bias of +0.004 (optimistic) and a mean |log(predicted/measured)| of "
        "0.109 (goal: at most 0.08).")
    assert list(holdout.fitted(frame(ratios), ratios)["run_id"]) == ["ddp-w2-b4-s0"]

    close = holdout.HeldOut.of(frame({"ddp-fp16-w2-b4": 1.02, "zero-w2-b2": 0.97}), [], list(ratios))
    assert close.met and close.sentence().startswith("Out of sample the cost model meets its goal")
    assert "x0.97-1.02, each entry within 15% of its seeds' median, with a mean bias of -0.005" in close.sentence()

    far = holdout.HeldOut.of(frame({"ddp-fp16-w2-b4": 1.25}), [], ["ddp-fp16-w2-b4"])
    assert list(far.table()["within 15%"]) == ["no"]
    assert ("its 1 held-out run at predicted/measured x1.25, ddp-fp16-w2-b4 (x1.25 of its seeds' median) "
            "outside 15%") in far.sentence()

    same = holdout.HeldOut.of(frame({"ddp-fp16-w2-b4": 1.161, "zero-w2-b2": 1.158}), [], list(ratios))
    assert "its 2 held-out runs at predicted/measured x1.16 each, ddp-fp16" in same.sentence()  # not x1.16-1.16

    none = holdout.HeldOut.of(frame({}), [], [])
    assert none.sentence() == "" and "No sweep entry was held out" in none.section()["text"][0]


def test_each_entry_is_judged_against_the_median_of_its_seeds():
    """Seeds of one entry cost the same: one slow seed (predicted x1.30 of it) does not fail an
    entry whose median it is not; the mean |log| still counts every run. On a noisy machine the
    goal is not judged, the figures still shown."""
    seeds = frame({"zero-w2-b2": 1.02})
    slow = seeds.iloc[[-1]].assign(run_id="zero-w2-b2-s1", measured_images_per_second=40.0 / 1.3,
                                    ratio=1.3)
    fast = seeds.iloc[[-1]].assign(run_id="zero-w2-b2-s2", measured_images_per_second=40.0 / 0.98,
                                   ratio=0.98)
    three = pd.concat([seeds, slow, fast], ignore_index=True)
    found = holdout.HeldOut.of(three, [], ["zero-w2-b2"])
    entry = found.by_entry.iloc[0]
    assert (entry["entry"], entry["runs"]) == ("zero-w2-b2", 3)
    assert entry["ratio"] == pytest.approx(40.8 / 40.0)  # over the median seed's measured
    assert found.outside.empty and list(found.table()["within 15%"]) == ["yes", "no", "yes"]
    assert found.mean_abs_log == pytest.approx((math.log(1.02) + math.log(1.3) + abs(math.log(0.98))) / 3)
    assert not found.met  # 0.101 > 0.08 over the runs
    noisy = holdout.HeldOut.of(frame({"zero-w2-b2": 1.01}), [], ["zero-w2-b2"], noise="the machine was noisy (x)")
    assert not noisy.met
    assert noisy.sentence().startswith("Whether the cost model meets its goal out of sample cannot be "
                                       "judged: the machine was noisy (x). Fitted without them, it predicts")


def test_a_miss_is_said_in_the_answer():
    missed = holdout.HeldOut.of(frame({"zero-w2-b2": 1.25}), [], ["zero-w2-b2"])
    summary = summary_of({"single-w1-b8": [20.0, 20.5], "zero-w2-b2": [30.0]},
                         {"single-w1-b8": [0.09, 0.09], "zero-w2-b2": [0.07]})
    found = answer(summary, comparisons(summary, COMPARED), out_of_sample=missed.sentence())
    assert missed.sentence() in found.conclusion
    assert missed.sentence() in found.section().text
    data = ReportData(verdict=Verdict(("The verdict.",)), held_out=missed, answer=found)
    assert answer_section(data).text == ["The verdict.", missed.sentence()]  # right after it
    met = holdout.HeldOut.of(frame({"zero-w2-b2": 1.01}), [], ["zero-w2-b2"])
    assert answer_section(ReportData(verdict=Verdict(("The verdict.",)), held_out=met)).text == ["The verdict."]
    shown = held_out_section(data)
    assert shown.title.startswith("Held-out entries") and "(predictions)" in shown.title
    assert list(shown.table.iloc[:, 0]) == ["zero-w2-b2-s0"]
