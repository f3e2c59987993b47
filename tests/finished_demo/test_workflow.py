"""The real Snakemake workflow (and DVC) on a tiny configuration in a temporary copy of the
repository: it runs end to end, reruns exactly the stages a change affects, refuses bad params
before any job, lints clean, and the coco2017 preset dry-runs to the expected jobs."""
from __future__ import annotations

import contextlib
import csv
import html as html_module
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

import pipeline.report.paper
from pipeline.report.figures import FIGURES
from pipeline.report.numbers import parse_numbers
from pipeline.report.render import answer_sentence
from pipeline.report.wording import MACRO_COLUMNS
from pipeline.runtime.records.commbench import CommbenchRecord
from pipeline.runtime.distributed import available_cores

from ..conftest import HANG_S, REPO, SMALL_DATA
from ..workflow import PAPER_JOB, SNAKEMAKE, copy_finished, edit_params, jobs, snakemake

pytestmark = pytest.mark.slow
RUNS = 8  # in the shared demo: single, ddp x2 seeds, ps, dp, zero, fsdp, ddp on in-memory data


@pytest.fixture(scope="module")
def workdir(finished_demo, tmp_path_factory) -> Path:
    """This module's copy of the session's finished demo workflow (tests/workflow.py)."""
    return copy_finished(finished_demo.root, tmp_path_factory.mktemp("workflow"))


def test_workflow_runs_end_to_end(finished_demo, workdir):
    result = finished_demo.result
    # commbench: the links at 2 processes, the one process count the multi-process runs use
    assert jobs(result) == {"all": 1, "data": 1, "train": RUNS, "evaluate": RUNS, "equivalence": 1,
                            "commbench": 1, "report": 1, **PAPER_JOB}
    run_dir = workdir / "results" / "runs" / "demo" / "single-w1-b4-s0"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert 0.0 <= metrics["AP"] <= 1.0 and metrics["images"] == SMALL_DATA["val_images"]
    predictions = json.loads((run_dir / "predictions.json").read_text())
    assert all(set(p) == {"image_id", "category_id", "bbox", "score"} for p in predictions)
    summary = {row["run_id"]: row for row in csv.DictReader((workdir / "results" / "summary" / "demo.csv").open())}
    assert set(summary) == {"single-w1-b4-s0", "ddp-w2-b2-s0", "ddp-w2-b2-s1",
                            "ps-colocated-w2-b2-s0", "dp-w2-b2-s0", "ddp-w2-b2-synthetic-s0",
                            "zero-w2-b2-s0", "fsdp-w2-b2-s0"}
    for run in ("single-w1-b4-s0", "ddp-w2-b2-s0", "ps-colocated-w2-b2-s0", "zero-w2-b2-s0", "fsdp-w2-b2-s0"):
        assert summary[run]["status"] == "ok" and summary[run]["replicas_identical"] == "True"
        assert 0 <= float(summary[run]["AP"]) <= 1
    assert float(summary["ddp-w2-b2-s0"]["busiest_rank_bytes_per_iter"]) > 0
    # Memory per process: what the busiest one holds, as theory orders it, and its figure
    held = {run: float(summary[run]["owned_state_mb"]) for run in ("fsdp-w2-b2-s0", "zero-w2-b2-s0", "ddp-w2-b2-s0")}
    assert held["fsdp-w2-b2-s0"] < held["zero-w2-b2-s0"] < held["ddp-w2-b2-s0"]
    for run in held:
        theory = float(summary[run]["theory_state_mb"])
        if run.startswith("zero"):  # partitions of whole tensors: the busiest holds more than 1/N
            assert theory <= held[run] < held["ddp-w2-b2-s0"]
        else:
            assert held[run] == pytest.approx(theory, rel=0.02)
        assert float(summary[run]["peak_memory_mb"]) > held[run]
    assert (workdir / "results" / "report" / "demo" / "figures" / "memory.png").stat().st_size > 0
    ddp_metrics = json.loads((run_dir.parent / "ddp-w2-b2-s0" / "metrics.json").read_text())
    assert ddp_metrics["processes"] == 2  # evaluated on its own 2 ranks, gathered into one COCOeval
    assert ddp_metrics["images"] == SMALL_DATA["val_images"]
    if torch.cuda.device_count() < 2:
        assert summary["dp-w2-b2-s0"]["status"] == "skipped" and "2 GPUs" in summary["dp-w2-b2-s0"]["reason"]
        assert summary["dp-w2-b2-s0"]["AP"] == ""
        assert "dp-w2-b2-s0" in (workdir / "results" / "report" / "demo" / "report.md").read_text()
    report_md = (workdir / "results" / "report" / "demo" / "report.md").read_text()
    assert "Equivalence with single" in report_md and "proposals" in report_md
    # What a cluster user sees: each run's progress in its job's log (step, images/s, time
    # left), and the workflow's last words (runs trained, skipped and why, the report)
    log = (workdir / "logs" / "train" / "demo" / "single-w1-b4-s0.log").read_text()
    assert re.search(r"step (\d+)/\1 epoch \d+ loss [\d.]+ lr \S+ [\d.]+s/it [\d.]+ images/s ETA 0:00:00", log), log[-2000:]
    skipped = 0 if torch.cuda.device_count() >= 2 else 1
    assert f"runs: {RUNS - skipped} of {RUNS} trained" in result.stderr
    if skipped:
        assert "  dp-w2-b2-s0: skipped: DataParallel needs at least 2 GPUs" in result.stderr
    assert "report: results/report/demo/report.html" in result.stderr
    assert f"answer: {answer_sentence(report_md)}" in result.stderr  # the verdict's opening
    if PAPER_JOB:
        assert "paper: results/paper/demo/paper.pdf" in result.stderr
    # The console: each job's purpose in one line, without its inputs or reasons (profiles/default)
    console = result.stdout + result.stderr
    assert re.search(r"^Job \d+: train: single-w1-b4-s0 -> results/runs/demo/single-w1-b4-s0/"
                     r"train_summary\.json \(log: logs/train/demo/single-w1-b4-s0\.log\)$", console, re.M)
    assert not re.search(r"^ +(input|reason): ", console, re.M)
    # Each rank's lines named, the data's warning said once (by rank 0), and COCOeval's own
    # output in the run's cocoeval.log: one line of AP in the logs
    ddp_logs = [(workdir / "logs" / stage / "demo" / "ddp-w2-b2-s0.log").read_text() for stage in ("train", "evaluate")]
    assert "[rank 0] INFO" in ddp_logs[0] and "[rank 1] INFO" in ddp_logs[0]
    assert re.findall(r"\[rank (\d)\] WARNING .*without usable boxes", ddp_logs[0]) == ["0"]
    assert re.search(r"\[rank 0\] INFO AP [\d.]+ AP50 [\d.]+ AP75 [\d.]+ over 8 images", ddp_logs[1])
    assert not any("Average Precision" in text for text in ddp_logs)
    assert (run_dir.parent / "ddp-w2-b2-s0" / "cocoeval.log").read_text().count("Average Precision  (AP)") == 6 * 3
    # Each multi-process run on real data beside the cost model's prediction from single's
    # compute and the links commbench fitted (in-memory runs have no single to start from)
    links = json.loads((workdir / "results" / "commbench" / "demo" / "p2.json").read_text())
    assert set(links["primitives"]) == {"send_recv", "all_reduce", "broadcast"}
    assert links["provenance"]["git_revision"]
    shared = links["shared_compute"]  # the model's step alone and with both processes at once
    assert shared["factor"] == shared["together_s"] / shared["alone_s"] and shared["alone_s"] > 0
    predicted = {row["run_id"]: row for row in csv.DictReader((workdir / "results" / "report" / "demo" / "prediction.csv").open())}
    assert set(predicted) == {"ddp-w2-b2-s0", "ddp-w2-b2-s1", "ps-colocated-w2-b2-s0", "zero-w2-b2-s0",
                              "fsdp-w2-b2-s0"}
    assert all(float(row["predicted_images_per_second"]) > 0 for row in predicted.values())
    # FSDP2 exchanges inside forward and backward: no communication of its own was timed, and
    # neither the summary nor the prediction shows one; DDP's wait for its last bucket is timed
    assert summary["fsdp-w2-b2-s0"]["communication_share"] == predicted["fsdp-w2-b2-s0"]["measured_communication_s"] == ""
    assert float(summary["ddp-w2-b2-s0"]["communication_share"]) > 0
    assert float(predicted["ddp-w2-b2-s0"]["measured_communication_s"]) > 0
    assert "FSDP2 exchange inside the forward and backward passes" in report_md
    # the compute a step beside the other processes, from the other entries' runs (its own
    # entry's never), and then no commbench factor; where there are none, the factor measured,
    # or a quiet machine's where commbench marked it disturbed (the suite runs beside other
    # tests: pipeline/costmodel/bands.py)
    bench = CommbenchRecord.from_json(links)
    used = bench.shared_compute.expected if bench.shared_compute.disturbed else shared["factor"]
    for row in predicted.values():
        beside = row["compute_overhead_s"] != ""
        assert round(float(row["shared_compute_factor"]), 3) == (1.0 if beside else round(used, 3))
        assert ("a step beside its other processes" in row["compute_input"]) == beside
    assert predicted["ddp-w2-b2-s0"]["compute_overhead_s"] != ""  # ps, zero and fsdp ran beside it
    assert "Predicted against measured (cost model)" in report_md and "2 processes, all_reduce over gloo" in report_md
    assert "2 processes, fsdp timed on the model (forward + backward of 4 images" in report_md  # FSDP2's cost
    assert "2 processes, broadcast over gloo: latency" in report_md  # ZeRO-1's bucket a rank
    assert "2 processes computing at once: forward + backward of 4 images" in report_md
    # the exchange inside a step, timed in the same repeats: its terms in the report, and the
    # predicted in-step communication beside every timed one, with their ratio
    assert shared["in_step"]["wait_s"] >= 0 and sum(shared["in_step"]["buckets"]) > 0
    assert "the wait for the slower worker" in report_md and "ms per DDP bucket" in report_md
    timed = [row for row in predicted.values() if row["measured_communication_s"]]
    assert timed and all(float(row["communication_ratio"]) > 0 for row in timed)
    # judged per entry: its seeds' median, a speed outlier among them aside
    entries = {row["entry"] for row in timed if row["speed_outlier"] != "True"}
    assert f"of {len(entries)} multi-process entries with a timed communication" in report_md
    report = workdir / "results" / "report" / "demo"
    # Past this machine: every strategy's predicted curve on every cluster of params, and the
    # figure that draws them beside these real runs; labelled as predictions
    points = pd.read_csv(report / "predicted_scaling_points.csv")
    assert points["gpus"].max() >= 256 and points.groupby("cluster")["model"].nunique().min() >= 4
    assert "Predicted scaling past this machine (cost model)" in report_md
    assert "Predictions, not measurements" in report_md and "assumed: the reproduced study" in report_md
    assert report_md.count(": by the model, the sharded parameter server") == points["cluster"].nunique()
    assert all((report / "figures" / f"predicted_{name}.png").stat().st_size > 0 for name in ("throughput", "efficiency"))
    assert "data:image/png;base64" in (report / "report.html").read_text()
    for name in ("table1", "table2"):
        assert all((report / f"{name}.{ext}").stat().st_size > 0 for ext in ("md", "csv", "tex"))
    assert (workdir / "logs" / "train" / "demo" / "single-w1-b4-s0.log").stat().st_size > 0
    assert (workdir / "logs" / "benchmarks" / "train_demo_single-w1-b4-s0.tsv").exists()


def entry_means(summary_csv: Path, column: str) -> dict[str, float]:
    frame = pd.read_csv(summary_csv)
    return frame[frame["status"] == "ok"].groupby("entry")[column].mean().dropna().to_dict()


def test_tensorboard_shows_one_run_per_run_id_with_its_recorded_scalars(workdir):
    """`tensorboard --logdir results/runs/demo`, as its server reads it: each finished run is one
    run, its scalars the iteration log's and its evaluations' (training/scalars.py)."""
    from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
    from tensorboard.util.tensor_util import make_ndarray

    runs = workdir / "results" / "runs" / "demo"
    shown = EventMultiplexer().AddRunsFromDirectory(str(runs))
    shown.Reload()
    finished = {d.parent.name for d in runs.glob("*/train_summary.json")
                if json.loads(d.read_text())["status"] == "ok"}
    assert set(shown.Runs()) == finished and "dp-w2-b2-s0" not in finished  # skipped: no file
    for run in ("single-w1-b4-s0", "ddp-w2-b2-s0"):
        logged = [json.loads(line) for line in (runs / run / "iterations.jsonl").read_text().splitlines()]
        read = shown.Tensors(run, "loss/total")
        assert [e.step for e in read] == [r["step"] for r in logged]
        assert [float(make_ndarray(e.tensor_proto)) for e in read] == pytest.approx(
            [r["loss"] for r in logged], rel=1e-6)
        evaluated = json.loads((runs / run / "train_summary.json").read_text())["evaluations"]
        assert [e.step for e in shown.Tensors(run, "eval/AP")] == [e["step"] for e in evaluated] != []
    assert len(list((runs / "ddp-w2-b2-s0").glob("*tfevents*"))) == 1  # rank 0 alone writes it


def test_compare_puts_the_demo_beside_itself(workdir):
    """`python -m pipeline.compare` on a real results tree: every entry matched to itself,
    ratio 1, and no difference beyond the noise."""
    done = subprocess.run([sys.executable, "-m", "pipeline.compare", "results", "results",
                           "--csv", "compare.csv"], cwd=workdir, capture_output=True, text=True, timeout=HANG_S)
    assert done.returncode == 0, done.stderr
    rows = {(r["entry"], r["metric"]): r for r in csv.DictReader((workdir / "compare.csv").open())}
    assert rows["ddp-w2-b2", "images_per_second"]["verdict"] == "within the noise"  # two seeds
    assert float(rows["ddp-w2-b2", "images_per_second"]["ratio"]) == 1.0
    assert rows["single-w1-b4", "images_per_second"]["verdict"] == "not judged (fewer than 2 runs)"
    assert rows["dp-w2-b2", "images_per_second"]["verdict"] == "no finished run in A and B"
    # the printed table's header states the rule (its words included); no row's verdict is it
    assert all(r["verdict"] != "beyond the noise" for r in rows.values()), rows


def test_the_one_step_check_measures_each_strategy_against_single(workdir):
    """The equivalence stage's Faster R-CNN steps: not zero (per-batch sampling and
    normalisation), but small next to the step itself; the sharded strategies average the same
    per-worker gradients as ddp, so they land as far from single, up to the order of float sums."""
    result = json.loads((workdir / "results" / "equivalence" / "demo.json").read_text())
    assert result["reference"] == "single-w1-b8-s0" and result["max_abs_step_of_single"] > 0
    for name in ("ddp-w2-b4-s0", "ps-colocated-w2-b4-s0", "zero-w2-b4-s0", "fsdp-w2-b4-s0"):
        relative = result["strategies"][name]["relative_to_step"]
        assert 0 < relative < 1, (name, relative)
    ddp = result["strategies"]["ddp-w2-b4-s0"]["max_abs_difference"]
    for name in ("zero-w2-b4-s0", "fsdp-w2-b4-s0"):
        assert result["strategies"][name]["max_abs_difference"] == pytest.approx(ddp, rel=1e-3), name
    assert "per image batch" in result["why"]


def test_tables_and_macros_are_the_summary_of_the_recorded_runs(workdir):
    """Tables 1 and 2 and numbers.tex say what results/summary.csv says (means over seeds),
    and the runs recorded what the report reads: evaluations during training, seeds, modes."""
    report, summary_csv = workdir / "results" / "report" / "demo", workdir / "results" / "summary" / "demo.csv"
    ap = entry_means(summary_csv, "AP")
    assert set(ap) == {"single-w1-b4", "ddp-w2-b2", "ps-colocated-w2-b2", "zero-w2-b2",
                       "fsdp-w2-b2"}  # synthetic: unscored
    table1 = pd.read_csv(report / "table1.csv").set_index("Method")
    ours = {method.split(":")[0]: row for method, row in table1.iterrows() if ":" in method}
    assert set(ours) == set(ap)
    for entry, mean in ap.items():
        assert ours[entry]["AP"] == pytest.approx(round(mean, 3), abs=1e-9)
    assert ours["ddp-w2-b2"]["n"] == 2 and ours["ps-colocated-w2-b2"]["n"] == 1
    table2 = pd.read_csv(report / "table2.csv").set_index("Method")
    for entry, mean in entry_means(summary_csv, "sec_per_iter_mean").items():
        if entry in ap:
            row = next(r for m, r in table2.iterrows() if m.startswith(entry + ":"))
            assert row["Time per iteration (s)"] == pytest.approx(round(mean, 4), abs=1e-9)
    macros = parse_numbers((report / "numbers.tex").read_text())
    for column, places in MACRO_COLUMNS.items():
        for entry, mean in entry_means(summary_csv, column).items():
            assert macros[(entry, column)] == f"{mean:.{places}f}", (entry, column)
    assert macros[("ddp-w2-b2", "n")] == "2"
    # Evaluations during training (every epoch here), none on in-memory data.
    runs = workdir / "results" / "runs" / "demo"
    real = json.loads((runs / "ddp-w2-b2-s1" / "train_summary.json").read_text())
    assert [e["epoch"] for e in real["evaluations"]] == [1, 2] and real["seed"] == 1
    memory = json.loads((runs / "ddp-w2-b2-synthetic-s0" / "train_summary.json").read_text())
    assert memory["evaluations"] == [] and memory["data_mode"] == "synthetic"
    metrics = json.loads((runs / "ddp-w2-b2-synthetic-s0" / "metrics.json").read_text())
    assert metrics["status"] == "not evaluated" and "synthetic" in metrics["reason"]
    modes = pd.read_csv(report / "data_modes.csv")
    assert modes["strategy"].tolist() == ["DDP"] and modes["real n"].tolist() == [2]
    compared = pd.read_csv(report / "comparisons.csv")
    two = ["ddp-w2-b2", "ps-colocated-w2-b2", "zero-w2-b2", "fsdp-w2-b2"]  # every pair at 2 workers
    assert {frozenset(pair) for pair in zip(compared["a"], compared["b"])} == {
        frozenset((a, b)) for i, a in enumerate(two) for b in two[i + 1:]}


def test_every_figure_is_in_the_html_and_the_paper(workdir):
    report = workdir / "results" / "report" / "demo"
    html = (report / "report.html").read_text()
    figures_tex = (report / "figures.tex").read_text()
    for name, entry in FIGURES.items():
        assert all((report / "figures" / f"{name}.{ext}").stat().st_size > 0 for ext in ("png", "pdf"))
        assert f"alt='{entry.caption}'" in html.replace("&#x27;", "'")
        assert f"\\reportdir/figures/{name}.pdf" in figures_tex
    # Everything paper.tex inputs is written by the report stage.
    paper = (workdir / "paper" / "paper.tex").read_text()
    inputs = set(re.findall(r"\\reportdir/([\w./]+)", paper))
    assert {"numbers.tex", "figures.tex", "table1.tex", "table2.tex"} <= inputs
    assert all((report / name).is_file() for name in inputs), inputs


@pytest.mark.skipif(not PAPER_JOB or not shutil.which("pdftoppm"),
                    reason="needs a LaTeX toolchain and poppler-utils (apt/paper.txt, apt/tests.txt; "
                           ".ci/run installs them)")
def test_the_paper_is_compiled_from_the_report(workdir, tmp_path):
    pdf = workdir / "results" / "paper" / "demo" / "paper.pdf"
    info = subprocess.run(["pdfinfo", str(pdf)], capture_output=True, text=True, check=True).stdout
    pages = int(re.search(r"^Pages:\s+(\d+)", info, re.M).group(1))
    subprocess.run(["pdftoppm", "-r", "30", "-png", str(pdf), str(tmp_path / "page")], check=True)
    rendered = sorted(tmp_path.glob("page-*.png"))
    assert len(rendered) == pages and 5 <= pages <= 20
    from PIL import Image

    assert all(Image.open(page).convert("L").getextrema()[0] < 200 for page in rendered)  # ink
    text = subprocess.run(["pdftotext", str(pdf), "-"], capture_output=True, text=True,
                          check=True).stdout
    assert len(re.findall(r"^Figure \d+:", text, re.M)) == len(FIGURES)
    # Every table's caption, the comparisons' among them (one may share its line with text
    # beside a float)
    assert set(re.findall(r"Table \d+:", text)) == {f"Table {n}:" for n in range(1, 7)}
    assert "??" not in text and "TODO" not in text  # every reference and citation resolved
    macros = parse_numbers((workdir / "results" / "report" / "demo" / "numbers.tex").read_text())
    assert macros[("ddp-w2-b2", "images_per_second")] in text  # a generated number, typeset
    assert "within the noise" in text or "beyond the noise" in text or "not judged" in text
    # Read at print size: no text of the paper, its tables' and figures' included, under 7 pt
    sizes = pdf_text_sizes(pdf)
    smallest = {family: min(size for _, size, f, _ in sizes if f == family)
                for family in {f for _, _, f, _ in sizes}}
    assert any("DejaVu" in f for f in smallest) and any("LMRoman" in f for f in smallest)
    assert min(smallest.values()) >= 7 - 0.2, sorted(smallest.items(), key=lambda kv: kv[1])[:5]


def pdf_text_sizes(pdf: Path) -> list[tuple[int, float, str, str]]:
    """(page, size in points, font family, text) of every piece of text in the PDF, as poppler
    reads it (pdftohtml -xml), calibrated on the body text: the most common size of the
    paper's roman font is its 11 pt (the class option)."""
    xml = subprocess.run(["pdftohtml", "-xml", "-i", "-stdout", "-zoom", "3", str(pdf)],
                         capture_output=True, text=True, check=True).stdout
    found, fonts = [], {}
    for number, body in re.findall(r'<page number="(\d+)"(.*?)</page>', xml, re.S):
        fonts.update({i: (float(size), family) for i, size, family in
                      re.findall(r'<fontspec id="(\d+)" size="([\d.]+)" family="([^"]+)"', body)})
        found += [(int(number), *fonts[font], html_module.unescape(re.sub(r"<[^>]+>", "", t)))
                  for font, t in re.findall(r'<text [^>]*font="(\d+)"[^>]*>(.*?)</text>', body)
                  if re.sub(r"<[^>]+>", "", t).strip()]
    roman = [size for _, size, family, _ in found if family.split("+")[-1] == "LMRoman10"]
    scale = 11 / max(set(roman), key=roman.count)
    return [(page, size * scale, family.split("+")[-1], text) for page, size, family, text in found]


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="needs headless Chromium (apt/tests.txt; .ci/run installs it)")
def test_the_html_report_reads_well_in_a_browser(workdir, tmp_path):
    """Opened as users open it, at 1400 px: no table scrolls sideways and nothing runs off the
    right edge, the answer comes first, then a contents list that links to every section;
    every figure loads; no `nan`, no raw Markdown."""
    probe = ("<script>window.addEventListener('load', () => { const images = [...document.images];"
             " const wide = [...document.querySelectorAll('div.table, table')].filter(t =>"
             " t.scrollWidth > t.clientWidth || t.getBoundingClientRect().right > window.innerWidth)"
             ".map(t => (t.closest('section') || document.body).id + ' ' + t.scrollWidth + '>' + t.clientWidth);"
             " const tables = [...document.querySelectorAll('table')].map(t => t.scrollWidth);"
             " document.body.setAttribute('data-probe', JSON.stringify({width:"
             " document.documentElement.scrollWidth, viewport: window.innerWidth, images:"
             " images.length, loaded: images.filter(i => i.complete && i.naturalWidth > 0).length,"
             " wide: wide, widest: Math.max(...tables), tables: tables.length,"
             " headings: [...document.querySelectorAll('h1, h2')].map(h => h.tagName + ' ' + h.textContent),"
             " sections: [...document.querySelectorAll('section')].map(s => s.id),"
             " links: [...document.querySelectorAll('nav a')].map(a => a.getAttribute('href')),"
             " navAfter: document.querySelector('nav')?.previousElementSibling?.id,"
             " text: document.body.innerText})); });</script></body>")
    page = tmp_path / "report.html"
    page.write_text((workdir / "results" / "report" / "demo" / "report.html").read_text()
                    .replace("</body>", probe))
    chromium = ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                "--window-size=1400,900"]
    dom = subprocess.run(chromium + ["--virtual-time-budget=5000", "--dump-dom", page.as_uri()],
                         capture_output=True, text=True, timeout=HANG_S).stdout
    found = json.loads(html_module.unescape(re.search(r'data-probe="([^"]*)"', dom).group(1)))
    assert found["viewport"] == 1400 and found["width"] <= found["viewport"], found["width"]
    assert found["tables"] >= 10 and found["wide"] == [], found["wide"]  # no table scrolls
    assert found["images"] == found["loaded"] == len(FIGURES)
    assert found["headings"][:2] == ["H1 Data-parallel Faster R-CNN benchmark: report",
                                     "H2 The answer"], found["headings"][:3]
    assert found["navAfter"] == found["sections"][0]  # the contents right after the answer
    assert found["links"] == ["#" + s for s in found["sections"][1:]]
    assert found["sections"][-2:] == ["runs", "provenance"]  # the run list at the end
    assert not re.search(r"\bnan\b", found["text"], re.I) and "`" not in found["text"]
    shot = tmp_path / "report.png"
    subprocess.run(chromium + [f"--screenshot={shot}", page.as_uri()], capture_output=True,
                   timeout=HANG_S)
    assert shot.stat().st_size > 10_000


def test_snakemakes_own_report_holds_the_reports_figures_and_tables(workdir, tmp_path):
    """`snakemake --report` (Snakemake's self-contained HTML) carries what the report rule marks
    for it: the HTML report, its tables and figures, the paper."""
    out = tmp_path / "snakemake-report.zip"
    snakemake(workdir, "--report", str(out))
    names = zipfile.ZipFile(out).namelist()
    for name in ["report.html", "table1.csv", "ap.png"] + (["paper.pdf"] if PAPER_JOB else []):
        assert any(n.endswith("/" + name) for n in names), (name, names[:50])
    # each output's caption (rules/captions/), rendered with the figures' own captions
    page = zipfile.ZipFile(out).read("snakemake-report/report.html").decode()
    assert "Mean seconds per iteration split into data wait" in page  # the figures' caption
    assert "the verdict and its figure first" in page  # report.html's


def test_no_change_runs_nothing(workdir):
    assert jobs(snakemake(workdir)) == {}


SINGLE = Path("results/runs/demo/single-w1-b4-s0")


def test_evaluation_value_reruns_evaluation_and_report(finished_demo, tmp_path):
    """Every run's evaluation and the report are planned again, no training; one run is
    scored again for real, in a copy (scoring all of them would show no more)."""
    copy = copy_finished(finished_demo.root, tmp_path)
    before = json.loads((copy / SINGLE / "metrics.json").read_text())
    edit_params(copy, lambda raw: raw["presets"]["demo"]["eval"].update(score_threshold=0.05))
    assert jobs(snakemake(copy, "--dry-run")) == {"all": 1, "evaluate": RUNS, "report": 1, **PAPER_JOB}
    assert jobs(snakemake(copy, str(SINGLE / "metrics.json"))) == {"evaluate": 1}
    predictions = json.loads((copy / SINGLE / "predictions.json").read_text())
    after = json.loads((copy / SINGLE / "metrics.json").read_text())
    assert all(p["score"] >= 0.05 for p in predictions)  # the new threshold, applied
    assert after["detections"] == len(predictions) <= before["detections"]


def test_holding_an_entry_out_reruns_only_the_report(finished_demo, tmp_path):
    """`held_out` is in no run (pipeline/report/holdout.py): marking an entry plans the report
    again, with the cost model fitted without it, and retrains nothing."""
    copy = copy_finished(finished_demo.root, tmp_path)

    def hold_out_zero(raw):
        (entry,) = [e for e in raw["presets"]["demo"]["sweep"] if e["strategy"] == "zero"]
        entry["held_out"] = True

    edit_params(copy, hold_out_zero)
    assert jobs(snakemake(copy, "--dry-run")) == {"all": 1, "report": 1, **PAPER_JOB}


def test_training_value_reruns_training_onwards(finished_demo, tmp_path):
    """Every run's training and all after it are planned again; one run retrains for real, in
    a copy of the finished workflow (retraining all six would cost minutes and show no more)."""
    copy = copy_finished(finished_demo.root, tmp_path)
    edit_params(copy, lambda raw: raw["presets"]["demo"]["train"].update(base_lr=0.03))
    assert jobs(snakemake(copy, "--dry-run")) == {"all": 1, "train": RUNS, "evaluate": RUNS,
                                                  "equivalence": 1, "report": 1, **PAPER_JOB}
    assert jobs(snakemake(copy, str(SINGLE / "metrics.json"))) == {"train": 1, "evaluate": 1}
    retrained = json.loads((copy / SINGLE / "train_summary.json").read_text())
    assert retrained["lr"] == pytest.approx(0.03)  # base_lr x global batch 4 / base batch 4
    assert "train" not in jobs(snakemake(copy, str(SINGLE / "metrics.json"), "--dry-run"))


def test_report_value_reruns_report_only(workdir):
    edit_params(workdir, lambda raw: raw["report"].update(dpi=100))
    assert jobs(snakemake(workdir)) == {"all": 1, "report": 1, **PAPER_JOB}


@contextlib.contextmanager
def edited(path: Path, old: str, new: str):
    """`path` with `old` replaced by `new` while the block runs; then as it was, its time too,
    so that the planned reruns can be checked without running them."""
    text, stat = path.read_text(), path.stat()
    assert old in text
    path.write_text(text.replace(old, new))
    try:
        yield
    finally:
        path.write_text(text)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_code_change_reruns_the_stages_using_the_module(workdir):
    """Each stage's code inputs follow its imports (the runs themselves rerun for real in the
    params tests above; here the plan is checked, and the edits are undone)."""
    evaluate = workdir / "pipeline" / "detection" / "evaluate.py"
    ps = workdir / "pipeline" / "strategies" / "ps.py"
    with edited(evaluate, '"""COCO bbox evaluation', '"""COCO box evaluation'):
        assert jobs(snakemake(workdir, "--dry-run")) == {"all": 1, "evaluate": RUNS, "report": 1,
                                                         **PAPER_JOB}
    # a strategy: its own runs only (the ps run; the registry imports every strategy, but a
    # run executes its own), the equivalence check and commbench (which run them all)
    with edited(ps, "from __future__", "# an edit\nfrom __future__"):
        assert jobs(snakemake(workdir, "--dry-run")) == {
            "all": 1, "train": 1, "evaluate": 1, "equivalence": 1, "commbench": 1,
            "report": 1, **PAPER_JOB}
    # ddp: its runs (two seeds, and on in-memory data) and zero's, which builds on it
    with edited(workdir / "pipeline" / "strategies" / "ddp.py", "from __future__",
                "# an edit\nfrom __future__"):
        planned = snakemake(workdir, "--dry-run")
        assert jobs(planned)["train"] == 4
        # each job's one line (the default profile): "train: <run> -> <its summary>"
        retrained = re.findall(r"train: [\w-]+ -> results/runs/demo/([\w-]+)/train_summary",
                               planned.stdout + planned.stderr)
        assert sorted(retrained) == ["ddp-w2-b2-s0", "ddp-w2-b2-s1", "ddp-w2-b2-synthetic-s0",
                                     "zero-w2-b2-s0"]
    assert jobs(snakemake(workdir, "--dry-run")) == {}


def test_editing_a_module_every_stage_imports_reruns_them_all(workdir):
    """config/params.py is imported by every stage (the scaling rule sets every run's learning rate;
    commbench reads params.yaml's knobs when run by hand): no list names it; the imports do."""
    with edited(workdir / "pipeline" / "config" / "params.py",
                'return train.base_lr * global_batch / train.base_batch',
                'return train.base_lr * (global_batch / train.base_batch)'):
        assert jobs(snakemake(workdir, "--dry-run")) == {
            "all": 1, "data": 1, "train": RUNS, "evaluate": RUNS, "equivalence": 1,
            "commbench": 1, "report": 1, **PAPER_JOB}
    assert jobs(snakemake(workdir, "--dry-run")) == {}


def test_editing_a_figure_reruns_the_report_only(workdir):
    figure = workdir / "results" / "report" / "demo" / "figures" / "ap.png"
    before = figure.stat().st_mtime_ns
    path = workdir / "pipeline" / "report" / "figures.py"
    text = path.read_text()
    assert 'panel.set_xlabel(f"COCO box AP: {label}")' in text
    path.write_text(text.replace('panel.set_xlabel(f"COCO box AP: {label}")',
                                 'panel.set_xlabel(f"COCO box AP (bbox): {label}")'))
    assert jobs(snakemake(workdir)) == {"all": 1, "report": 1, **PAPER_JOB}
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


def test_coco2017_dry_run(tmp_path):
    """The published recipe plans the same stages; no data or weights are needed to plan."""
    # --verbose: each job's resources are listed (the default profile prints one line a job)
    result = subprocess.run(SNAKEMAKE + ["--cores", "2", "--dry-run", "--verbose", "--config", "preset=coco2017"],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    # The links of each process count the sweep's runs use (2, 4, 8), where this machine can
    # start that many: the others' runs are skipped, so nothing predicts them
    room = torch.cuda.device_count() or available_cores()
    links = {"commbench": n for n in [sum(1 for p in (2, 4, 8) if p <= room)] if n}
    assert jobs(result) == {"all": 1, "data": 1, "train": 22, "evaluate": 22, "equivalence": 1,
                            **links, "report": 1, **PAPER_JOB}
    text = result.stdout + result.stderr
    # Three seeds of each 2-GPU entry (the study's setting), one of the larger ones.
    runs = ["single-w1-b2-s0"] + [f"{s}-w{n}-b2-s{seed}" for s in ("dp", "ddp", "ps-colocated")
                                  for n, seeds in ((2, 3), (4, 1), (8, 1)) for seed in range(seeds)]
    runs += [f"{s}-w{n}-b2-s0" for s in ("zero", "fsdp") for n in (2, 4, 8)]
    for run in runs:
        assert f"results/runs/coco2017/{run}/train_summary.json" in text
    assert "data/coco2017.manifest.json" in text
    # Each run's job asks for what the run needs (a cluster profile maps these).
    def resources(run: str) -> str:
        """The resources line of `run`'s training job (the job block whose output is its summary)."""
        (block,) = [b for b in re.split(r"\n(?=(?:local)?rule )", text)
                    if f"output: results/runs/coco2017/{run}/train_summary.json" in b]
        return block.split("resources:", 1)[1].splitlines()[0]
    assert "processes=2" in resources("ddp-w2-b2-s0") and "mem_mb=32768" in resources("ddp-w2-b2-s0")
    assert "gpu=2" in resources("dp-w2-b2-s0")


def test_dvc_stage_generates_the_embedded_dataset(workdir):
    """dvc.yaml's stage produces the same dataset as the workflow, and DVC tracks it."""
    # As after `source .venv/bin/activate`: dvc.yaml's commands call `python` from PATH.
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")

    def run(*command):
        result = subprocess.run(command, cwd=workdir, capture_output=True, text=True, timeout=HANG_S,
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


def test_without_latex_the_workflow_says_so_and_still_plans_the_report(tmp_path, monkeypatch):
    """No latexmk on PATH: the paper is left out with the reason and the remedy, the rest runs."""
    hidden = set(pipeline.report.paper.TOOLS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory) or Path(directory) == Path(sys.executable).parent:
            continue
        for tool in os.listdir(directory):
            if tool not in hidden and not (bin_dir / tool).exists():
                (bin_dir / tool).symlink_to(Path(directory) / tool)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{bin_dir}"}
    result = subprocess.run(SNAKEMAKE + ["--cores", "2", "--dry-run"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    planned = jobs(result)
    assert "paper" not in planned and planned["report"] == 1
    assert "Not building results/paper/demo/paper.pdf: latexmk, pdflatex, bibtex not found" in result.stderr
    assert "apt-get install latexmk" in result.stderr
    # The stage itself, asked for the paper anyway, says the same and writes nothing.
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SystemExit, match="latexmk, pdflatex, bibtex not found.*report.html"):
        pipeline.report.paper.build(REPO / "paper" / "paper.tex", tmp_path / "report",
                                    tmp_path / "paper.pdf")
    assert not (tmp_path / "paper.pdf").exists()


def test_a_crashed_run_is_retried_and_one_that_always_crashes_never_stops_the_rest(finished_demo, tmp_path):
    """A rank made to abort once (the test-only switch BENCH_TEST_ABORT, here at step 5, after
    the checkpoint at 4) is retried from its checkpoint: the workflow finishes, the record and
    the report say so. A rank made to abort every time: the other runs stay trained, the report
    and the paper are built without it, the command fails, and its last lines name the run, its
    reason (the abort's own line), its logs and the command that retries it, which works."""
    from pipeline.runtime.attempts import TEST_ABORT_ENV
    from pipeline.runtime.records.training import RunSummary

    copy = copy_finished(finished_demo.root, tmp_path)
    runs_dir, logs = copy / "results" / "runs" / "demo", copy / "logs" / "train" / "demo"

    def forced(run: str, abort: str | None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k != TEST_ABORT_ENV} | ({TEST_ABORT_ENV: abort} if abort else {})
        return subprocess.run(SNAKEMAKE + ["--cores", "2", "--forcerun", f"results/runs/demo/{run}/train_summary.json"],
                              cwd=copy, env=env, capture_output=True, text=True, timeout=HANG_S)

    once = forced("zero-w2-b2-s0", "1:5:once")
    assert once.returncode == 0, once.stderr[-4000:]
    zero = RunSummary.read(runs_dir / "zero-w2-b2-s0" / "train_summary.json")
    assert zero.status == "ok" and [a.ended for a in zero.failed_attempts or []] == ["a rank was killed or lost"]
    assert zero.resumed_at_steps == [4] and zero.timed_from_step == 4
    assert "malloc(): test abort" in (logs / "zero-w2-b2-s0.attempt1.log").read_text()
    report = (copy / "results" / "report" / "demo" / "report.md").read_text()
    assert "zero-w2-b2-s0 was trained after its job crashed (a rank was killed or lost: rank 1" in report
    assert "  retried after a crash:" in once.stderr and "  zero-w2-b2-s0: trained after 1 failed attempt(s)" in once.stderr

    always = forced("fsdp-w2-b2-s0", "1:5:always")
    assert always.returncode == 1, always.stderr[-4000:]
    fsdp = RunSummary.read(runs_dir / "fsdp-w2-b2-s0" / "train_summary.json")
    assert fsdp.status == "failed" and len(fsdp.failed_attempts or []) == 2
    statuses = {run.name: RunSummary.read(run / "train_summary.json").status for run in runs_dir.iterdir()}
    assert statuses.pop("fsdp-w2-b2-s0") == "failed" and set(statuses.values()) <= {"ok", "skipped"}
    summary = pd.read_csv(copy / "results" / "summary" / "demo.csv").set_index("run_id")
    assert summary.loc["fsdp-w2-b2-s0", "status"] == "failed"
    assert os.path.getmtime(copy / "results" / "report" / "demo" / "report.md") > os.path.getmtime(
        runs_dir / "fsdp-w2-b2-s0" / "train_summary.json")
    last = always.stderr.strip().splitlines()[-4:]
    retry = f"--forcerun results/runs/demo/fsdp-w2-b2-s0/train_summary.json"
    assert last[0] == "failed: 1 run(s), each with its reason, its log and the command that retries it:", last
    assert last[1].startswith("  fsdp-w2-b2-s0: a rank was killed or lost: rank 1 (pid ") and (
        "was killed by SIGABRT first: malloc(): test abort" in last[1]), last
    assert last[2] == ("    log: logs/train/demo/fsdp-w2-b2-s0.attempt2.log (earlier attempts: "
                       "logs/train/demo/fsdp-w2-b2-s0.attempt1.log)"), last
    assert last[3].startswith("    retry it: ") and last[3].endswith(retry), last
    # the retry, as said, without the switch: the run trains, the workflow ends well
    command = last[3].removeprefix("    retry it: ").split()
    assert command[command.index("--forcerun") + 1] == retry.split()[1]
    retried = forced("fsdp-w2-b2-s0", None)
    assert retried.returncode == 0, retried.stderr[-4000:]
    assert RunSummary.read(runs_dir / "fsdp-w2-b2-s0" / "train_summary.json").status == "ok"
    # the failed attempts' logs outlive the rerun (Snakemake deletes the job's own log before it)
    assert all("malloc(): test abort" in (logs / f"fsdp-w2-b2-s0.attempt{n}.log").read_text() for n in (1, 2))
