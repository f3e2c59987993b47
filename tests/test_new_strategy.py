"""Adding a strategy touches its own module and the registry, nothing else: a test-only
gradient all-gather strategy (tests/strategies/allgather.py), with an option and a fact of its
own, is dropped into a copy of the repository and runs through the real workflow: training,
evaluation and the report."""
from __future__ import annotations

import csv
import json
import shutil
import subprocess

import pytest

from .conftest import REPO
from .workflow import PAPER_JOB, copy_workflow, edit_params, jobs, snakemake, tiny_params

pytestmark = pytest.mark.slow
REGISTRY = REPO / "pipeline" / "strategies" / "__init__.py"


def git(workdir, *args) -> str:
    result = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
                            cwd=workdir, capture_output=True, text=True, check=True)
    return result.stdout


def test_a_new_strategy_is_its_module_and_a_registry_entry(tmp_path):
    copy_workflow(tmp_path)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "-A")
    git(tmp_path, "commit", "-qm", "the project as it is")

    # The whole change: the module, and one import and one entry in the registry.
    shutil.copy2(REPO / "tests" / "strategies" / "allgather.py",
                 tmp_path / "pipeline" / "strategies" / "allgather.py")
    registry = tmp_path / "pipeline" / "strategies" / "__init__.py"
    text = registry.read_text()
    text = text.replace("from .base import", "from .allgather import AllGather\nfrom .base import", 1)
    text = text.replace("REGISTERED: tuple[type[Strategy], ...] = (",
                        "REGISTERED: tuple[type[Strategy], ...] = (AllGather, ", 1)
    registry.write_text(text)
    git(tmp_path, "add", "-A")
    changed = git(tmp_path, "diff", "--cached", "--numstat").split("\n")
    module_lines = len((REPO / "tests" / "strategies" / "allgather.py").read_text().splitlines())
    assert sorted(line for line in changed if line) == [
        "2\t1\tpipeline/strategies/__init__.py", f"{module_lines}\t0\tpipeline/strategies/allgather.py"]

    def sweep(raw):
        tiny_params(raw)
        raw["presets"]["demo"]["train"]["epochs"] = 1  # the wiring, not the learning, is tested
        raw["presets"]["demo"]["sweep"] = [{"strategy": "single", "workers": 1},
                                           {"strategy": "allgather", "workers": 2,
                                            "images_per_worker": 2, "chunks": 2}]
    edit_params(tmp_path, sweep)
    result = snakemake(tmp_path)
    assert jobs(result) == {"all": 1, "data": 1, "train": 2, "evaluate": 2, "equivalence": 1,
                            "commbench": 1, "report": 1, **PAPER_JOB}
    rows = {row["run_id"]: row for row in csv.DictReader((tmp_path / "results" / "summary" / "demo.csv").open())}
    new = rows["allgather-c2-w2-b2-s0"]  # its option names its variant
    assert new["status"] == "ok" and new["replicas_identical"] == "True" and new["processes"] == "2"
    assert 0 <= float(new["AP"]) <= 1
    assert float(new["busiest_rank_bytes_per_iter"]) == pytest.approx(
        float(new["busiest_rank_theory_bytes_per_iter"]), rel=1e-6)
    report = (tmp_path / "results" / "report" / "demo" / "report.md").read_text()
    assert "allgather-c2-w2-b2: gradient all-gather, 2 workers" in report  # its sweep entry's row
    # First-class from its own module: its bytes sentences in the report and the paper, its
    # place in the one-step equivalence check, its measured run predicted by its own phases,
    # and its predicted-scaling curve
    assert "(N-1)M each way per rank for a gradient all-gather" in report
    assert "counts the bytes of the tensors it gathers" in report
    numbers = (tmp_path / "results" / "report" / "demo" / "numbers.tex").read_text()
    assert "counts the bytes of the tensors it gathers" in numbers
    equivalence = json.loads((tmp_path / "results" / "equivalence" / "demo.json").read_text())
    assert "allgather-w2-b4-s0" in equivalence["strategies"]
    predicted = {row["run_id"]: row for row in
                 csv.DictReader((tmp_path / "results" / "report" / "demo" / "prediction.csv").open())}
    assert float(predicted["allgather-c2-w2-b2-s0"]["predicted_images_per_second"]) > 0
    curves = {row["model"] for row in
              csv.DictReader((tmp_path / "results" / "report" / "demo" / "predicted_scaling_points.csv").open())}
    assert "gradient all-gather" in curves
    run_dir = tmp_path / "results" / "runs" / "demo" / "allgather-c2-w2-b2-s0"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["images"] > 0 and metrics["processes"] == 1  # it did not ask to evaluate on its workers
    # its own fact, in every rank's report: two all-gathers an iteration, one per chunk
    summary = json.loads((run_dir / "train_summary.json").read_text())
    assert [rank["all_gathers"] for rank in summary["ranks"]] == [2 * summary["iterations"]] * 2
