"""The real Snakemake workflow (and DVC) on a tiny configuration in a temporary copy of the
repository: it runs end to end, reruns exactly the stages a change affects, refuses bad params
before any job, lints clean, and the coco2017 preset dry-runs to the expected jobs."""
from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from .conftest import REPO, SMALL_DATA

pytestmark = pytest.mark.slow
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
COPIED = ["Snakefile", "params.yaml", "dvc.yaml", "pipeline", ".dvc", ".dvcignore", ".gitignore"]


def tiny_params(raw: dict) -> dict:
    demo = raw["presets"]["demo"]
    demo["data"].update(synthetic=dict(SMALL_DATA))
    demo["model"].update(min_size=96, max_size=96, channels=32, representation_size=128)
    demo["train"].update(epochs=2, images_per_worker=4, base_batch=4, warmup_iters=4, lr_steps=[])
    demo["eval"].update(batch_size=4)
    # Every strategy through the workflow; dp is skipped (with its reason) on a CPU machine.
    demo["sweep"] = [{"strategy": "single", "workers": 1},
                     {"strategy": "ddp", "workers": 2, "images_per_worker": 2},
                     {"strategy": "ps", "workers": 2, "images_per_worker": 2},
                     {"strategy": "dp", "workers": 2, "images_per_worker": 2}]
    return raw


RUNS = 4


def edit_params(workdir: Path, change) -> None:
    path = workdir / "params.yaml"
    raw = yaml.safe_load(path.read_text())
    change(raw)
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def copy_workflow(root: Path) -> Path:
    """The files the workflow needs, copied into `root` (a test may edit them there)."""
    for name in COPIED:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, root / name, ignore=shutil.ignore_patterns("__pycache__", "tmp"))
        else:
            shutil.copy2(source, root / name)
    return root


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A copy of the repository's workflow with the demo preset shrunk to seconds."""
    root = copy_workflow(tmp_path_factory.mktemp("workflow"))
    edit_params(root, tiny_params)
    return root


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(SNAKEMAKE + ["--cores", "2", *args], cwd=workdir, capture_output=True,
                            text=True, timeout=600)
    if check and result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
    return result


def jobs(result: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table Snakemake prints before running (or dry-running) jobs."""
    text = result.stdout + result.stderr
    if "Nothing to be done" in text:
        return {}
    table = text.split("Job stats:", 1)[1].split("total", 1)[0]
    return {name: int(count) for name, count in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def test_workflow_runs_end_to_end(workdir):
    result = snakemake(workdir)
    assert jobs(result) == {"all": 1, "data": 1, "train": RUNS, "evaluate": RUNS, "equivalence": 1,
                            "report": 1}
    run_dir = workdir / "results" / "runs" / "demo" / "single-w1-b4"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["AP"] <= 1.0 and metrics["images"] == SMALL_DATA["val_images"]
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert all(set(p) == {"image_id", "category_id", "bbox", "score"} for p in predictions)
    summary = {row["run_id"]: row for row in csv.DictReader((workdir / "results" / "summary.csv").open())}
    assert set(summary) == {"single-w1-b4", "ddp-w2-b2", "ps-colocated-w2-b2", "dp-w2-b2"}
    for run in ("single-w1-b4", "ddp-w2-b2", "ps-colocated-w2-b2"):
        assert summary[run]["status"] == "ok" and summary[run]["replicas_identical"] == "True"
        assert 0 <= float(summary[run]["AP"]) <= 1
    assert float(summary["ddp-w2-b2"]["busiest_rank_bytes_per_iter"]) > 0
    ddp_metrics = json.loads((run_dir.parent / "ddp-w2-b2" / "metrics.json").read_text())
    assert ddp_metrics["processes"] == 2  # evaluated on its own 2 ranks, gathered into one COCOeval
    assert ddp_metrics["images"] == SMALL_DATA["val_images"]
    if torch.cuda.device_count() < 2:
        assert summary["dp-w2-b2"]["status"] == "skipped" and "2 GPUs" in summary["dp-w2-b2"]["reason"]
        assert summary["dp-w2-b2"]["AP"] == ""
        assert "dp-w2-b2" in (workdir / "results" / "report" / "report.md").read_text()
    report_md = (workdir / "results" / "report" / "report.md").read_text()
    assert "Equivalence with single" in report_md and "proposals" in report_md
    report = workdir / "results" / "report"
    assert "data:image/png;base64" in (report / "report.html").read_text()
    for name in ("table1", "table2"):
        assert all((report / f"{name}.{ext}").stat().st_size > 0 for ext in ("md", "csv", "tex"))
    # The paper inputs exactly what the report writes.
    paper = (REPO / "paper" / "paper.tex").read_text()
    referenced = set(re.findall(r"\.\./(results/report/[\w./]+\.(?:tex|pdf))", paper))
    assert len(referenced) >= 6
    assert all((workdir / path).is_file() for path in referenced), referenced
    assert (workdir / "logs" / "train" / "demo" / "single-w1-b4.log").stat().st_size > 0
    assert (workdir / "logs" / "benchmarks" / "train_demo_single-w1-b4.tsv").exists()


def test_no_change_runs_nothing(workdir):
    assert jobs(snakemake(workdir)) == {}


def test_evaluation_value_reruns_evaluation_and_report(workdir):
    edit_params(workdir, lambda raw: raw["presets"]["demo"]["eval"].update(score_threshold=0.05))
    assert jobs(snakemake(workdir)) == {"all": 1, "evaluate": RUNS, "report": 1}


def test_training_value_reruns_training_onwards(workdir):
    edit_params(workdir, lambda raw: raw["presets"]["demo"]["train"].update(base_lr=0.03))
    assert jobs(snakemake(workdir)) == {"all": 1, "train": RUNS, "evaluate": RUNS, "equivalence": 1,
                                        "report": 1}


def test_report_value_reruns_report_only(workdir):
    edit_params(workdir, lambda raw: raw["report"].update(dpi=100))
    assert jobs(snakemake(workdir)) == {"all": 1, "report": 1}


def test_code_change_reruns_the_stages_using_the_module(workdir):
    with (workdir / "pipeline" / "evaluate.py").open("a") as handle:
        handle.write("\n# an edit\n")
    assert jobs(snakemake(workdir, "--dry-run")) == {"all": 1, "evaluate": RUNS, "report": 1}
    with (workdir / "pipeline" / "strategies" / "ps.py").open("a") as handle:
        handle.write("\n# an edit\n")
    assert jobs(snakemake(workdir, "--dry-run")) == {"all": 1, "train": RUNS, "evaluate": RUNS,
                                                     "equivalence": 1, "report": 1}


def test_editing_a_module_every_stage_imports_reruns_them_all(workdir):
    """params.py is imported by every stage (the scaling rule sets every run's learning rate):
    no list names it; the imports do."""
    summary = workdir / "results" / "runs" / "demo" / "single-w1-b4" / "train_summary.json"
    before = summary.stat().st_mtime_ns
    path = workdir / "pipeline" / "params.py"
    path.write_text(path.read_text().replace(
        'return train["base_lr"] * global_batch / train["base_batch"]',
        'return train["base_lr"] * (global_batch / train["base_batch"])'))
    assert jobs(snakemake(workdir)) == {"all": 1, "data": 1, "train": RUNS, "evaluate": RUNS,
                                        "equivalence": 1, "report": 1}
    assert summary.stat().st_mtime_ns > before


def test_editing_a_figure_reruns_the_report_only(workdir):
    figure = workdir / "results" / "report" / "figures" / "ap.png"
    before = figure.stat().st_mtime_ns
    path = workdir / "pipeline" / "report" / "figures.py"
    path.write_text(path.read_text().replace('ax.set(xlabel="COCO box AP", ylabel="")',
                                             'ax.set(xlabel="COCO box AP (bbox)", ylabel="")'))
    assert jobs(snakemake(workdir)) == {"all": 1, "report": 1}
    assert figure.stat().st_mtime_ns > before


def test_bad_params_stop_before_any_job(workdir):
    before = sorted(p for p in (workdir / "results").rglob("*"))
    original = (workdir / "params.yaml").read_text()
    try:
        edit_params(workdir, lambda raw: raw["presets"]["demo"]["train"].update(epoch=3))
        result = snakemake(workdir, check=False)
    finally:
        (workdir / "params.yaml").write_text(original)
    assert result.returncode != 0
    assert "presets.demo.train: unknown key 'epoch' (did you mean 'epochs'?)" in result.stderr
    assert "Job stats" not in result.stdout + result.stderr
    assert sorted(p for p in (workdir / "results").rglob("*")) == before


def test_lint_is_clean():
    result = subprocess.run(SNAKEMAKE + ["--lint"], cwd=REPO, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "Lints for" not in result.stdout + result.stderr


def test_coco2017_dry_run(tmp_path):
    """The published recipe plans the same stages; no data or weights are needed to plan."""
    result = subprocess.run(SNAKEMAKE + ["--cores", "2", "--dry-run", "--config", "preset=coco2017"],
                            cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert jobs(result) == {"all": 1, "data": 1, "train": 10, "evaluate": 10, "equivalence": 1,
                            "report": 1}
    text = result.stdout + result.stderr
    runs = ["single-w1-b2"] + [f"{s}-w{n}-b2" for s in ("dp", "ddp", "ps-colocated") for n in (2, 4, 8)]
    for run in runs:
        assert f"results/runs/coco2017/{run}/train_summary.json" in text
    assert "data/coco2017.manifest.json" in text
    # Each run's job asks for what the run needs (a cluster profile maps these).
    ddp = text.split("results/runs/coco2017/ddp-w2-b2/train_summary.json", 1)[1].split("resources:", 1)[1]
    assert "processes=2" in ddp.splitlines()[0] and "mem_mb=32768" in ddp.splitlines()[0]
    dp = text.split("results/runs/coco2017/dp-w2-b2/train_summary.json", 1)[1].split("resources:", 1)[1]
    assert "gpu=2" in dp.splitlines()[0]


def test_dvc_stage_generates_the_embedded_dataset(workdir):
    """dvc.yaml's stage produces the same dataset as the workflow, and DVC tracks it."""
    # As after `source .venv/bin/activate`: dvc.yaml's commands call `python` from PATH.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def run(*command):
        result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=300,
                                env=env)
        assert result.returncode == 0, f"{command}: {result.stdout}\n{result.stderr}"
        return result.stdout
    dvc = str(Path(sys.executable).with_name("dvc"))
    run("git", "init", "-q")
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "copy")
    shutil.rmtree(workdir / "data", ignore_errors=True)  # whatever the workflow made: DVC makes it
    run(dvc, "repro", "synthetic")
    lock = yaml.safe_load((workdir / "dvc.lock").read_text())
    assert lock["stages"]["synthetic"]["params"]["params.yaml"]["presets.demo.data"]["synthetic"] == SMALL_DATA
    assert "Data and pipelines are up to date" in run(dvc, "status", "synthetic")
    assert "val" in run(dvc, "metrics", "show")
