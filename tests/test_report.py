"""The report stage on fake but realistic run directories (no training, a few seconds)."""
from __future__ import annotations

import dataclasses
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline.config import schema
from pipeline.config.params import load_resolved
from pipeline.report import SUMMARY_COLUMNS, build_report, progress_per_epoch
from pipeline.report.figures import FIGURES as REGISTERED_FIGURES
from pipeline.report.data import ReportData
from pipeline.report.figures import figure
from pipeline.report.load import load_run, summary_frame
from pipeline.report.sections import SECTIONS, Section, provenance_table, section
from pipeline.runtime.records.base import RecordError
from pipeline.runtime.records.training import (RunSummary, SecondsPerIteration, TimeSplit,
                                               Utilisation)

from .conftest import HANG_S

REPO = Path(__file__).resolve().parents[1]
SLOW = pytest.mark.slow  # another case of a path the fast tier takes (README, Quick start)

REPORT_CFG = schema.Report.model_validate({
    "published": {
        "source": load_resolved(REPO / "params.yaml").report.published.source,
        "dp": {"AP": 0.624, "AP50": 0.758, "AP75": 0.630, "sec_per_iter": 0.6646,
               "progress_per_epoch": 0.035},
        "ddp": {"AP": 0.632, "AP50": 0.744, "AP75": 0.634, "sec_per_iter": 0.6622,
                "progress_per_epoch": 0.032},
    },
    "figure_formats": ["png", "pdf"],
    "dpi": 50,  # the schema's least: small figures keep the test fast; the layout code is the same
    "target_ap": {},  # no time to accuracy (report_data below sets one)
    "predict": load_resolved(REPO / "params.yaml").report.predict.model_dump(),
})
FIGURES = list(REGISTERED_FIGURES)  # before any test adds one
PAPER_FIGURES = ["loss_vs_time", "loss_vs_epoch", "ap", "time_split"]  # paper/paper.tex includes them
METRIC_KEYS = ["AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm",
               "ARl"]


def provenance(workers: int) -> dict:
    return {"git_revision": "0123abc", "seed": 0, "threads": 2, "workers": workers,
            "processes": workers,
            "device": "cpu", "backend": "gloo", "packages": {"python": "3.11.9", "torch": "2.14.1"},
            "hardware": {"machine": "x86_64", "cpu_count": 2, "hostname": "secret-node"},
            "params": {"data": {"name": "synthetic"}}, "argv": []}


def make_ok_run(root: Path, strategy: str, workers: int, per_worker: int,
                epoch_loss: list[float], ap: float, iters_per_epoch: int = 12) -> Path:
    """A finished run whose epoch-mean losses are exactly `epoch_loss` (the noise cancels)."""
    run_id = f"{strategy}-w{workers}-b{per_worker}"
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    records, elapsed, step = [], 0.0, 0
    for epoch, mean_loss in enumerate(epoch_loss):
        for i in range(iters_per_epoch):
            elapsed += 0.5
            loss = mean_loss + (0.05 if i % 2 else -0.05)
            records.append({
                "step": step, "epoch": epoch, "lr": 0.01, "images": per_worker * workers,
                "loss": loss, "loss_classifier": loss / 4, "loss_box_reg": loss / 4,
                "loss_objectness": loss / 4, "loss_rpn_box_reg": loss / 4, "time_data": 0.05,
                "time_compute": 0.35, "time_communication": 0.05 * (workers - 1),
                "time_optimizer": 0.05, "time_iter": 0.5, "elapsed": elapsed})
            step += 1
    (run_dir / "iterations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "utilisation.jsonl").write_text("")  # sampled, nothing recorded
    summary = RunSummary(
        run_id=run_id, entry=run_id, strategy=strategy, variant="", workers=workers,
        images_per_worker=per_worker, seed=0, global_batch=per_worker * workers, lr=0.04,
        device="cpu", backend="gloo", threads=2, status="ok", reason="",
        epochs=len(epoch_loss), iterations=len(records), train_seconds=elapsed,
        images_per_second=per_worker * workers / 0.5,
        sec_per_iter=SecondsPerIteration(mean=0.5, p50=0.5, p95=0.52),
        time_split=TimeSplit(data=0.05, compute=0.35, communication=0.05 * (workers - 1),
                             optimizer=0.05),
        epoch_loss=epoch_loss, final_loss=epoch_loss[-1],
        utilisation=Utilisation(interval_s=0.5, samples=0, gpus="no GPU in use"),
        provenance=provenance(workers))
    (run_dir / "train_summary.json").write_text(json.dumps(summary.to_json()))
    metrics = {"run_id": run_id, "AP": ap, "AP50": ap + 0.2, "AP75": ap - 0.05, "APs": -1,
               "APm": ap, "APl": ap + 0.1, **{k: 0.3 for k in METRIC_KEYS[6:]}, "images": 160,
               "detections": 1600, "inference_seconds": 3.0, "provenance": {}}
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def make_skipped_run(root: Path, run_id: str, reason: str) -> Path:
    """A skipped run as an early version wrote it: no entry, seed nor provenance."""
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    strategy, workers, batch = run_id.split("-")
    (run_dir / "train_summary.json").write_text(json.dumps({
        "run_id": run_id, "strategy": strategy, "workers": int(workers[1:]),
        "images_per_worker": int(batch[1:]), "status": "skipped", "reason": reason}))
    (run_dir / "metrics.json").write_text(json.dumps({
        "run_id": run_id, "status": "skipped", "reason": reason,
        **{k: None for k in METRIC_KEYS}}))
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs") / "demo"
    return [make_ok_run(root, "single", 1, 8, [2.0, 1.5, 1.2], ap=0.1234),
            make_ok_run(root, "ddp", 2, 4, [2.1, 1.7, 1.3], ap=0.2346),
            make_skipped_run(root, "dp-w2-b2", "needs 2 GPUs, found 0")]


@pytest.fixture(scope="module")
def report(runs, tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    summary = build_report(runs, REPORT_CFG, "demo", out / "summary.csv", out / "report")
    return out, summary


def test_progress_per_epoch_definition():
    assert progress_per_epoch([2.0, 1.5, 1.2]) == pytest.approx(0.4)
    assert math.isnan(progress_per_epoch([1.0]))
    assert math.isnan(progress_per_epoch([]))


def test_summary_csv_keeps_every_run(report):
    out, _ = report
    csv = pd.read_csv(out / "summary.csv", keep_default_na=True)
    assert list(csv.columns) == SUMMARY_COLUMNS
    assert len(csv) == 3
    skipped = csv.set_index("run_id").loc["dp-w2-b2"]
    assert skipped["status"] == "skipped"
    assert skipped["reason"] == "needs 2 GPUs, found 0"
    assert pd.isna(skipped["AP"]) and pd.isna(skipped["sec_per_iter_mean"])
    single = csv.set_index("run_id").loc["single-w1-b8"]
    assert single["progress_per_epoch"] == pytest.approx((2.0 - 1.2) / 2)
    assert single["AP"] == pytest.approx(0.1234)
    assert pd.isna(single["APs"])  # COCO's -1: no small objects
    assert csv.set_index("run_id").loc["ddp-w2-b4", "workers"] == 2
    # the raw file writes empty fields, not "nan", for the skipped run
    raw = (out / "summary.csv").read_text().splitlines()
    assert "nan" not in raw[3].lower()


def test_tables_show_published_and_reproduced(report):
    out, _ = report
    table1 = (out / "report" / "table1.md").read_text()
    for value in ("0.624", "0.632", "0.758", "0.744", "0.630", "0.634", "0.123", "0.235"):
        assert value in table1
    assert "published (2 GPUs, COCO 2017)" in table1
    assert table1.index("DataParallel (DP)") < table1.index("DistributedDataParallel (DDP)")  # study's order
    assert "single-w1-b8" in table1 and "ddp-w2-b4" in table1
    assert "dp-w2-b2" not in table1  # skipped runs have no numbers to show
    table2 = (out / "report" / "table2.md").read_text()
    assert "0.6646" in table2 and "0.6622" in table2 and "0.5000" in table2
    assert "0.4000" in table2  # progress of single-w1-b8
    for name in ("table1", "table2"):
        tex = (out / "report" / f"{name}.tex").read_text()
        assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
        rows = [line for line in tex.splitlines() if line.endswith(r"\\")]
        assert len(rows) == 1 + 2 + 2  # header, 2 published rows, 2 runs
        csv = pd.read_csv(out / "report" / f"{name}.csv")
        assert len(csv) == 4
    assert pd.read_csv(out / "report" / "table1.csv")["AP"].tolist()[2] == pytest.approx(0.123)


def test_figures_in_every_format(report):
    out, _ = report
    assert set(PAPER_FIGURES) <= set(FIGURES)
    for name in FIGURES:
        for fmt in ("png", "pdf"):
            path = out / "report" / "figures" / f"{name}.{fmt}"
            assert path.stat().st_size > 1000, path
    assert not list((out / "report").rglob("*.tmp"))  # atomic writes leave no temp files


def test_reports(report):
    out, _ = report
    md = (out / "report" / "report.md").read_text()
    assert "needs 2 GPUs, found 0" in md
    assert "(epoch_loss" in md or "mean decrease of the epoch-mean total training loss" in md
    assert "figures/loss_vs_time.png" in md
    assert "0123abc" in md and "secret-node" not in md
    # the runs at the end: what varies per run in the table, the rest said once
    runs_section = md.split("\n## Runs\n", 1)[1]
    assert "| ddp-w2-b4 | DDP | 0 | 2 | 4 | 8 | 2 | cpu | gloo | ok | - |" in runs_section
    assert "| dp-w2-b2 | DataParallel | n/a | 2 | 2 | n/a | n/a | - | - | skipped | needs 2 GPUs, found 0 |" in runs_section
    assert "| ddp-w2-b4 | 0123abc | x86_64 x2 | none | 3.11.9 | 2.14.1 |" in runs_section
    page = (out / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(FIGURES)
    assert not re.search(r"(src|href)=['\"]?https?:", page)
    assert "<table" in page and "0.624" in page


@SLOW
def test_all_runs_skipped_still_builds(tmp_path):
    run = make_skipped_run(tmp_path / "runs", "ddp-w2-b4", "needs 2 GPUs, found 0")
    summary = build_report([run], REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "r")
    assert summary["status"].tolist() == ["skipped"]
    for name in FIGURES:
        assert (tmp_path / "r" / "figures" / f"{name}.png").stat().st_size > 0
    assert "0.624" in (tmp_path / "r" / "table1.md").read_text()
    assert "data:image/png;base64," in (tmp_path / "r" / "report.html").read_text()


@SLOW
def test_single_run_with_one_epoch(tmp_path):
    run = make_ok_run(tmp_path / "runs", "single", 1, 8, [1.7], ap=0.05)
    summary = build_report([run], REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "r")
    assert math.isnan(summary.loc[0, "progress_per_epoch"])
    assert "n/a" in (tmp_path / "r" / "table2.md").read_text()


def test_malformed_metrics_names_the_file(tmp_path):
    run = make_ok_run(tmp_path / "runs", "single", 1, 8, [2.0, 1.0], ap=0.1)
    (run / "metrics.json").write_text('{"AP": 0.1,')
    with pytest.raises(ValueError, match=re.escape(str(run / "metrics.json"))):
        build_report([run], REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "r")
    assert not (tmp_path / "summary.csv").exists()


def test_missing_iterations_names_the_file(tmp_path):
    run = make_ok_run(tmp_path / "runs", "single", 1, 8, [2.0, 1.0], ap=0.1)
    (run / "iterations.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="iterations.jsonl: file not found"):
        build_report([run], REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "r")


@pytest.mark.slow
def test_cli(runs, tmp_path):
    cmd = [sys.executable, "-m", "pipeline.report", "--report-config", REPORT_CFG.model_dump_json(),
           "--preset", "demo", "--summary", str(tmp_path / "summary.csv"),
           "--out-dir", str(tmp_path / "report"), *map(str, runs)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(tmp_path / "summary.csv")) == 3
    assert (tmp_path / "report" / "report.html").exists()
    broken = subprocess.run(cmd[:-3] + [str(tmp_path / "nowhere")], capture_output=True,
                            text=True, timeout=HANG_S)
    assert broken.returncode != 0
    assert "nowhere/train_summary.json: file not found" in broken.stderr


@SLOW
def test_equivalence_section_and_markdown_tables_stay_well_formed(runs, tmp_path):
    equivalence = tmp_path / "equivalence.json"
    equivalence.write_text(json.dumps({
        "reference": "single-w1-b8", "max_abs_step_of_single": 0.03,
        "strategies": {"ddp-w2-b4": {"max_abs_difference": 0.0006, "relative_to_step": 0.02},
                       "ps-colocated-w2-b4": {"skipped": "2 processes per node but 1 CPU core(s)"}},
        "why": "per image batch sampling"}))
    build_report(runs, REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "report", equivalence)
    text = (tmp_path / "report" / "report.md").read_text()
    section = text.split("## Equivalence with single", 1)[1].split("\n## ", 1)[0]
    assert "0.0006" in section and "per image batch sampling" in section and "1 CPU core(s)" in section
    for block in re.findall(r"((?:^\|.*\|\n)+)", text, re.M):  # every table: one column count
        counts = {line.count("|") for line in block.splitlines()}
        assert len(counts) == 1, block


def test_run_directories_from_before_the_rename_still_load(tmp_path):
    """An old run folder: world_size for workers, no sampler (neither the summary's utilisation
    nor the file), the seed in the provenance only, no entry. It reads as the new one does."""
    run = make_ok_run(tmp_path / "runs", "ddp", 2, 4, [2.0, 1.0], ap=0.1)
    new = summary_frame([load_run(run)], "demo")
    path = run / "train_summary.json"
    old = json.loads(path.read_text())
    old["world_size"] = old.pop("workers")
    old["provenance"]["world_size"] = old["provenance"].pop("workers")
    for key in ("utilisation", "seed", "entry"):
        del old[key]
    (run / "utilisation.jsonl").unlink()
    path.write_text(json.dumps(old))
    loaded = load_run(run)
    assert loaded.utilisation == [] and loaded.summary.utilisation is None
    frame = summary_frame([loaded], "demo")
    assert frame.loc[0, "workers"] == 2 and frame.loc[0, "seed"] == 0
    pd.testing.assert_frame_equal(frame, new)
    assert provenance_table([loaded]).loc[0, "workers"] == "2"


def test_a_misspelt_summary_key_fails_at_load_naming_it(tmp_path):
    run = make_ok_run(tmp_path / "runs", "ddp", 2, 4, [2.0, 1.0], ap=0.1)
    path = run / "train_summary.json"
    raw = json.loads(path.read_text())
    raw["images_per_sec"] = raw.pop("images_per_second")
    path.write_text(json.dumps(raw))
    with pytest.raises(RecordError, match=re.escape(f"{path}: unknown key 'images_per_sec' (did "
                                                    "you mean 'images_per_second'?)")):
        load_run(run)


def test_summary_columns_are_declared_once_and_name_record_fields():
    from pipeline.report import load

    assert load.SUMMARY_COLUMNS == [c.name for c in load.COLUMNS]
    assert load.INTEGER_COLUMNS == ["seed", "workers", "processes", "images_per_worker",
                                    "global_batch", "threads", "iterations_to_target",
                                    "checkpoints", "restarts"]
    with pytest.raises(AttributeError, match="RunSummary has no field image_per_second"):
        load._field("image_per_second")  # a column of a misspelt field fails at import


def test_a_sampled_run_without_its_utilisation_file_names_it(tmp_path):
    run = make_ok_run(tmp_path / "runs", "ddp", 2, 4, [2.0, 1.0], ap=0.1)
    (run / "utilisation.jsonl").unlink()
    with pytest.raises(FileNotFoundError, match="utilisation.jsonl: file not found"):
        load_run(run)


def test_loading_and_the_figure_registry_import_no_plotting():
    """Benchmarks import load, the Snakefile imports figures: neither may pay for plotting."""
    code = ("import sys, pipeline.report.load, pipeline.report.figures; "
            "print(sorted({'matplotlib', 'seaborn', 'torch'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_S, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.fixture
def extra_figure():
    """A figure added the way a contributor adds one: one decorated function, nothing else."""
    @figure("runs_per_strategy", "Completed runs per strategy")
    def draw_runs_per_strategy(ax, data: ReportData) -> None:
        strategies = sorted({run.summary.strategy for run in data.ok})
        ax.bar(strategies, [sum(run.summary.strategy == s for run in data.ok)
                            for s in strategies])

    yield "runs_per_strategy"
    del REGISTERED_FIGURES["runs_per_strategy"]  # the other tests see the real registry


@pytest.fixture
def extra_section():
    """A section added the way a contributor adds one: one decorated function, nothing else."""
    @section
    def completed_runs(data: ReportData) -> Section:
        return Section("Completed runs", [f"{len(data.ok)} of {len(data.runs)} runs completed."])

    yield "Completed runs"
    SECTIONS.remove(completed_runs)  # the other tests see the real registry


@pytest.mark.slow  # a whole report built again; the fast tests build the report from the same registries
def test_a_new_section_is_one_function(runs, tmp_path, extra_section):
    build_report(runs, REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "report")
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.endswith(f"## {extra_section}\n\n2 of 3 runs completed.\n")  # the last registered
    assert f"- [{extra_section}](#completed-runs)" in md  # in the contents list
    assert f"<section id='completed-runs'><h2>{extra_section}</h2>" in (
        tmp_path / "report" / "report.html").read_text()


@pytest.mark.slow  # a whole report built again, every figure drawn
def test_a_new_figure_is_one_function(runs, tmp_path, extra_figure):
    build_report(runs, REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "report")
    out = tmp_path / "report"
    for fmt in REPORT_CFG.figure_formats:
        assert (out / "figures" / f"{extra_figure}.{fmt}").stat().st_size > 1000
    md = (out / "report.md").read_text()
    assert f"![Completed runs per strategy](figures/{extra_figure}.png)" in md
    page = (out / "report.html").read_text()
    assert "<figcaption>Completed runs per strategy</figcaption>" in page
    assert page.count("data:image/png;base64,") == len(FIGURES) + 1


def test_scaling_table_and_figure(report):
    out, summary = report
    scaling = pd.read_csv(out / "report" / "scaling.csv").set_index("strategy")
    # completed runs only, by strategy, each named by its class's one display name
    assert list(scaling.index) == ["DDP", "single process"]
    # both runs do 8 images in 0.5 s: no speed-up from 2 workers, so 50 % efficiency
    assert scaling.loc["DDP", "speedup_vs_single"] == pytest.approx(1.0)
    assert scaling.loc["DDP", "efficiency"] == pytest.approx(0.5)
    assert scaling.loc["single process", "efficiency"] == pytest.approx(1.0)
    md = (out / "report" / "report.md").read_text()
    section = md.split("## Scaling", 1)[1].split("\n## ", 1)[0]
    assert "| DDP | 2 | 8 | 1 | 16.00 | 1.000 | 0.500 |" in section  # n = 1 run
    assert (out / "report" / "figures" / "scaling.png").stat().st_size > 1000
    assert "derived from the size of each bucket" in md  # DDP's bytes are labelled as derived


def test_scaling_frame_names_variants_and_drops_skipped():
    from pipeline.report.load import scaling_frame

    summary = pd.DataFrame({
        "run_id": ["ps-dedicated-w2-b4-s0", "ps-dedicated-w1-b8-s0", "dp-w2-b4-s0"],
        "entry": ["ps-dedicated-w2-b4", "ps-dedicated-w1-b8", "dp-w2-b4"],
        "data_mode": ["real"] * 3,
        "status": ["ok", "ok", "skipped"], "strategy": ["ps", "ps", "dp"],
        "variant": ["dedicated", "dedicated", ""], "workers": [2, 1, 2],
        "global_batch": [8, 8, 8], "images_per_second": [30.0, 20.0, float("nan")],
        "images_per_worker": [4, 8, 4]})
    with_single = pd.concat([summary, pd.DataFrame({
        "run_id": ["single-w1-b4-s0"], "entry": ["single-w1-b4"], "data_mode": ["real"],
        "status": ["ok"], "strategy": ["single"], "variant": [""], "workers": [1],
        "global_batch": [4], "images_per_second": [20.0], "images_per_worker": [4]})])
    frame = scaling_frame(with_single).set_index("strategy")
    ps = frame.loc["parameter server (dedicated)"]
    assert ps["workers"].tolist() == [1, 2]
    # single does 4 images an iteration. ps w1 (8 images, 8 per worker) has no single to
    # compare with; ps w2 (8 images, 4 per worker) is compared with it as weak scaling.
    assert ps["baseline"].tolist() == ["no single run", "same images per worker"]
    assert ps["speedup_vs_single"].tolist()[1] == pytest.approx(1.5)
    assert ps["efficiency"].tolist()[1] == pytest.approx(0.75)
    assert frame.loc["single process", "baseline"] == "same global batch"


def test_rows_say_which_data_they_come_from(report):
    from pipeline.report.tables import source_label

    out, _ = report
    table1 = (out / "report" / "table1.md").read_text()
    assert "this benchmark, synthetic data, not COCO (demo)" in table1
    assert "reproduced" not in table1
    assert source_label("coco2017", "coco2017") == "this benchmark, COCO 2017 (coco2017)"
    md = (out / "report" / "report.md").read_text()
    assert "torchvision's published box AP of 0.37" in md and "cannot have measured" in md


@SLOW
def test_utilisation_figure_draws_recorded_samples(tmp_path):
    run = make_ok_run(tmp_path / "runs", "ddp", 2, 4, [2.0, 1.0], ap=0.1)
    samples = [{"t": 0.5 * i, "rank": rank, "cpu_percent": 90.0 + rank, "rss_mb": 500.0,
                "gpus": [{"index": rank, "util_percent": 70.0, "memory_mb": 900.0}]}
               for i in range(1, 6) for rank in (0, 1)]
    (run / "utilisation.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    assert load_run(run).utilisation == samples
    build_report([run], REPORT_CFG, "demo", tmp_path / "summary.csv", tmp_path / "r")
    assert (tmp_path / "r" / "figures" / "utilisation.png").stat().st_size > 1000


def test_predicted_scaling_draws_the_measured_runs_beside_the_predictions(report):
    from pipeline.report.clusters import gpu_compute, prediction_points
    from pipeline.report.figures import FIGURES as DRAWN
    from pipeline.report.figures import _pyplot
    from pipeline.report.load import scaling_frame

    out, summary = report
    predict = REPORT_CFG.predict
    points = prediction_points(predict, gpu_compute(predict, []))
    written = pd.read_csv(out / "report" / "predicted_scaling_points.csv")
    assert len(written) == len(points) and (written["predicted_efficiency"] <= 1.0 + 1e-9).all()
    table = pd.read_csv(out / "report" / "predicted_scaling.csv")
    assert "256 GPUs (predicted images/s)" in table.columns  # never in the measured tables
    assert not any("predicted" in c for c in pd.read_csv(out / "report" / "scaling.csv").columns)
    plt = _pyplot()
    for name, measured in (("predicted_throughput", "images_per_second"), ("predicted_efficiency", "efficiency")):
        fig, ax = plt.subplots()
        DRAWN[name].draw(ax, ReportData(summary=summary, scaling=scaling_frame(summary),
                                        cluster_points=points))
        crosses = [c for c in ax.collections if c.get_label().startswith("measured")]
        assert len(crosses) == 1 and sorted(map(tuple, crosses[0].get_offsets().tolist())) == sorted(
            zip([1.0, 2.0], scaling_frame(summary).set_index("workers").loc[[1, 2], measured]))
        assert len(ax.get_lines()) >= points["model"].nunique()  # a line per model and cluster
        assert DRAWN[name].caption.startswith("PREDICTION")
        plt.close(fig)


# ---- What a reader sees: numbers to their precision, the noise table, the page, the figures ----


def test_numbers_are_shown_to_their_columns_precision_and_empty_cells_as_na():
    from pipeline.report.tables import formatted, latex_table, markdown_table

    table = pd.DataFrame({
        "run_id": ["a-w1", "b-w2", "c-w2"], "images_per_second": [12.3456, float("nan"), 7.0],
        "images_per_second sd": [0.41, float("nan"), float("nan")],
        "memory": [475.30615997314453, 12.5, float("nan")],      # declared nowhere
        "share": [0.01234, 0.2, 0.0],                            # declared nowhere, small
        "workers": pd.array([1, 2, None], dtype="Int64"), "reason": ["", None, "needs 2 GPUs"],
        "identical": [True, False, None]})
    shown = formatted(table, {"images_per_second": 2})
    assert list(shown.columns) == ["run", "images/s", "memory", "share", "workers", "reason",
                                   "identical"]  # headers in words, the sd merged into its column
    assert shown["images/s"].tolist() == ["12.35 ± 0.41", "n/a", "7.00"]
    assert shown["memory"].tolist() == ["475", "12", "n/a"]  # three digits of its largest value
    assert shown["share"].tolist() == ["0.012", "0.200", "0.000"]  # 3 digits of 0.2
    assert shown["workers"].tolist() == ["1", "2", "n/a"]
    assert shown["reason"].tolist() == ["-", "-", "needs 2 GPUs"]
    assert shown["identical"].tolist() == ["yes", "no", "-"]
    for text in (markdown_table(shown), latex_table(shown)):
        assert "nan" not in text.lower() and "475.3" not in text and "None" not in text
    assert "|---|---:|---:|---:|---:|---|---|" in markdown_table(shown)  # numbers right-aligned


def test_a_negative_loader_share_is_shown_as_zero_with_what_was_measured(tmp_path):
    from pipeline.report.tables import DATA_MODE_DECIMALS, data_mode_table, write_table

    def rows(mode, speeds):
        return [{"run_id": f"ddp-{mode}-s{i}", "entry": f"ddp-w2-b4-{mode}", "status": "ok",
                 "strategy": "ddp", "variant": "", "workers": 2, "global_batch": 8,
                 "images_per_worker": 4, "data_mode": mode, "images_per_second": v,
                 "time_data": 0.01} for i, v in enumerate(speeds)]

    faster_real = pd.DataFrame(rows("real", [10.0, 10.4]) + rows("synthetic", [9.6, 10.1]))
    table = data_mode_table(faster_real)
    assert table.loc[0, "loader share"] == 0.0  # never below 0: a loader costs time or nothing
    note = table.loc[0, "loader share note"]
    assert "measured -0.036" in note and "within the noise" in note and "shown as 0" in note
    shown = write_table(table, DATA_MODE_DECIMALS, 0, tmp_path, "data_modes")
    assert shown.loc[0, "loader share"] == "0.000 [1]"
    assert shown.attrs["notes"] == ["[1] DDP, 2 worker(s): " + note.split(": ", 1)[1]]
    for ext in ("md", "tex"):
        assert "measured -0.036" in (tmp_path / f"data_modes.{ext}").read_text()
    slower_real = pd.DataFrame(rows("real", [8.0, 8.2]) + rows("synthetic", [10.0, 10.2]))
    table = data_mode_table(slower_real)
    assert table.loc[0, "loader share"] == pytest.approx(1 - 8.1 / 10.1)
    assert table.loc[0, "loader share note"] == ""


def seeded_summary() -> pd.DataFrame:
    """Entries at 2 workers: ddp clearly faster than ps, zero within ddp's noise, fsdp once."""
    speeds = {"ddp-w2-b4": [20.0, 20.2, 19.9], "ps-w2-b4": [15.0, 15.1, 14.8],
              "zero-w2-b4": [20.1, 19.8, 20.3], "fsdp-w2-b4": [19.0]}
    return pd.DataFrame([{"run_id": f"{entry}-s{i}", "entry": entry, "status": "ok",
                          "workers": 2, "data_mode": "real", "images_per_second": v,
                          "AP": 0.2 + 0.001 * i} for entry, vs in speeds.items()
                         for i, v in enumerate(vs)])


def test_the_noise_comparisons_are_one_table_with_the_pairs_beyond_the_noise_first(tmp_path):
    from pipeline.report.noise import comparisons
    from pipeline.report.tables import comparison_pairs, write_table

    compared = comparisons(seeded_summary(), {"images_per_second": 2, "AP": 3})
    pairs, beyond = comparison_pairs(compared, {"images_per_second": "images/s", "AP": "AP"})
    assert len(pairs) == 6 and len(compared) == 12  # one row per pair, both metrics in it
    assert beyond == 2
    assert {frozenset(p) for p in zip(pairs["a"][:2], pairs["b"][:2])} == {
        frozenset({"ddp-w2-b4", "ps-w2-b4"}), frozenset({"ps-w2-b4", "zero-w2-b4"})}
    assert set(pairs["images/s verdict"][:2]) == {"beyond"}
    assert pairs["images/s verdict"].tolist()[2:].count("within") == 1  # ddp vs zero
    assert set(pairs["images/s verdict"][3:]) == {"not judged"}  # fsdp ran once
    shown = write_table(pairs, {"images/s a/b": 3, "AP a/b": 3}, 0, tmp_path, "comparisons",
                        csv=compared, long=("Pairs.", "tab:comparisons"), rules_before={beyond})
    assert shown.loc[0, "images/s a/b"] in ("1.341", "0.746")
    tex = (tmp_path / "comparisons.tex").read_text()
    assert r"\begin{longtable}" in tex and r"\label{tab:comparisons}" in tex
    body = tex.split(r"\endfoot", 1)[1].splitlines()
    assert body[3] == r"\midrule"  # between the pairs beyond the noise and the others
    assert pd.read_csv(tmp_path / "comparisons.csv").shape == compared.shape  # every number kept


def test_the_html_report_opens_with_the_answer_and_links_every_section(report):
    out, _ = report
    page = (out / "report" / "report.html").read_text()
    headings = re.findall(r"<h([12])>(.*?)</h\1>", page)
    assert headings[0][0] == "1" and headings[1] == ("2", "The answer")
    body = page.split("<body>", 1)[1]
    assert body.index("The answer") < body.index("<nav") < body.index("Table 1: COCO box AP")
    anchors = re.findall(r"<section id='([^']+)'><h2>", page)
    links = re.findall(r"<li><a href='#([^']+)'>", page)
    assert links == anchors[1:] and len(set(anchors)) == len(anchors)
    assert anchors[-2:] == ["runs", "provenance"]  # the run list at the end
    text = re.sub(r"<[^>]+>", " ", re.sub(r"<(style|script)>.*?</\1>|src='[^']*'", " ", page,
                                             flags=re.S))
    assert not re.search(r"\bnan\b", text, re.I) and "`" not in text  # no raw Markdown
    assert "<code>single</code>" in page
    assert "<div class='table'><table>" in page and "<td class='num'>16.00</td>" in page
    md = (out / "report" / "report.md").read_text()
    assert "- [Table 1: COCO box AP](#table-1-coco-box-ap)" in md
    assert not re.search(r"\bnan\b", md, re.I) and not re.search(r"\d\.\d{7,}", md)


def report_data(run_dirs) -> ReportData:
    """What build_report hands the figures and sections, from run directories."""
    from pipeline.report import build

    return build.report_data([load_run(d) for d in run_dirs], schema.replaced(REPORT_CFG, target_ap={"demo": 0.2}),
                             "demo")


@pytest.fixture(scope="module")
def crowded(tmp_path_factory) -> ReportData:
    """Five strategies with 2 workers at one speed-up: where labels beside points collided."""
    root = tmp_path_factory.mktemp("crowded")
    dirs = [make_ok_run(root, "single", 1, 8, [2.0, 1.5, 1.2], ap=0.12)]
    dirs += [make_ok_run(root, s, 2, 4, [2.1, 1.7, 1.3], ap=0.2) for s in ("ddp", "ps", "zero", "fsdp")]
    for run in dirs:  # a CPU line per rank: a long legend, below the plot
        (run / "utilisation.jsonl").write_text("".join(
            json.dumps({"t": 0.5 * i, "rank": rank, "cpu_percent": 90.0 + rank, "rss_mb": 500.0,
                        "gpus": []}) + "\n" for i in range(1, 4) for rank in (0, 1)))
    return report_data(dirs)


def _overlap(a, b) -> bool:
    return a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1


def test_every_figure_prints_at_the_text_width_with_legends_outside_the_data(crowded):
    from matplotlib.text import Text

    from pipeline.report.figures import MAX_HEIGHT_IN, MIN_PT, WIDTH_IN, _pyplot, drawn

    plt = _pyplot()
    for name, entry in REGISTERED_FIGURES.items():
        fig = drawn(entry, crowded)
        try:
            renderer = fig.canvas.get_renderer()
            width, height = fig.get_size_inches()
            assert width == WIDTH_IN and height <= MAX_HEIGHT_IN, (name, width, height)
            legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
            boxes = [ax.get_window_extent(renderer) for ax in fig.axes if ax.get_visible()]
            for legend in legends:
                assert not any(_overlap(legend.get_window_extent(renderer), box) for box in boxes), name
                box = legend.get_window_extent(renderer)  # all of it on the figure
                assert fig.bbox.x0 <= box.x0 and box.x1 <= fig.bbox.x1 + 1, name
                assert fig.bbox.y0 <= box.y0 and box.y1 <= fig.bbox.y1 + 1, name
            texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]
            assert min(t.get_fontsize() for t in texts) >= MIN_PT, name
            # mathtext (10$^{2}$) sets its super- and subscripts at 70 %, under MIN_PT
            assert not [t.get_text() for t in texts if "$" in t.get_text()], name
            for ax in fig.axes:  # but a "nothing to draw" message
                assert ax.get_xlabel() or not ax.axison, (name, "an axis without a label")
            if name == "scaling":  # nothing collides: every text apart from every other
                extents = [t.get_window_extent(renderer) for t in texts]
                assert not [(texts[i].get_text(), texts[j].get_text())
                            for i in range(len(extents)) for j in range(i + 1, len(extents))
                            if _overlap(extents[i], extents[j])]
                labels = [t.get_text() for t in fig.legends[0].get_texts()]
                assert "DDP: 50% at 2" in labels and "linear" in labels
        finally:
            plt.close(fig)


def test_published_and_our_ap_are_on_axes_that_say_whose(crowded):
    from pipeline.report.figures import _pyplot, drawn

    fig = drawn(REGISTERED_FIGURES["ap"], crowded)
    labels = [ax.get_xlabel() for ax in fig.axes]
    _pyplot().close(fig)
    assert labels == ["COCO box AP: published (2 GPUs, COCO 2017)",
                      "COCO box AP: this benchmark, synthetic data, not COCO (demo)"]


def test_the_prediction_legend_names_the_band_within_20_percent(crowded):
    from pipeline.report.figures import _pyplot, drawn

    frame = pd.DataFrame({"run_id": ["ddp-w2-b4"], "entry": ["ddp-w2-b4"], "strategy": ["ddp"],
                          "measured_images_per_second": [16.0], "predicted_images_per_second": [15.0],
                          "flag": [""]})
    data = dataclasses.replace(crowded, prediction=frame)
    fig = drawn(REGISTERED_FIGURES["prediction"], data)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    _pyplot().close(fig)
    assert "within ±20% of the measurement" in labels and "prediction = measurement" in labels


def test_figure_files_are_the_text_width(report):
    from PIL import Image

    from pipeline.report.figures import WIDTH_IN

    out, _ = report
    for name in FIGURES:  # memory.png was 2603 px wide, its plot in a third of it
        assert Image.open(out / "report" / "figures" / f"{name}.png").size[0] == round(
            WIDTH_IN * REPORT_CFG.dpi), name


def test_the_report_and_numbers_tex_open_with_the_answer(report):
    """The answer (answer.answer) from the fake runs: a section of the report before the
    results, and numbers.tex's macros for the paper; the skipped run named once, with its reason."""
    out, _ = report
    md = (out / "report" / "report.md").read_text()
    answer = md.split("## The answer in full", 1)[1].split("\n## ", 1)[0]
    assert md.index("## The answer") < md.index("## The answer in full") < md.index("## Table 1")
    assert "3 training runs of 3 sweep entries" in answer and "2 completed, 1 skipped" in answer
    assert answer.count("dp-w2-b2") == 1 and "needs 2 GPUs, found 0" in answer
    tex = (out / "report" / "numbers.tex").read_text()
    for macro in ("AnswerVerdict", "AnswerAbstract", "AnswerThroughput", "AnswerAccuracy", "AnswerConclusion",
                  "NotRun", "WorkflowTime", "SkippedCount"):
        assert f"\\newcommand{{\\{macro}}}" in tex, macro


def test_a_link_fitted_without_a_positive_time_per_byte_has_no_bandwidth():
    """A disturbed machine can fit zero or negative seconds per byte: said, not printed as nan."""
    from pipeline.report.wording import bandwidth_text
    assert bandwidth_text(3.05) == "3.0 Gbit/s"
    for none in (None, float("nan"), float("inf"), 0.0, -1.0):
        assert bandwidth_text(none).startswith("no bandwidth resolved")
