"""The run records (pipeline/runtime/records/): train_summary.json and the files beside it as
types, read back as written, older run folders upgraded, a misspelt key refused where it is
read. No training: the files are written here by hand, key for key as the stages write them."""
from __future__ import annotations

import copy
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pipeline.strategies  # noqa: F401  the strategies declare their facts (ps: staleness)
from pipeline.runtime.records.base import STRATEGY_REMEDY, RecordError
from pipeline.runtime.records.commbench import CommbenchRecord
from pipeline.runtime.records.equivalence import EquivalenceRecord
from pipeline.runtime.records.evaluation import Evaluation, Metrics
from pipeline.runtime.records.provenance import Provenance
from pipeline.runtime.records.training import RankReport, RunSummary, upgrade

from .conftest import HANG_S

REPO = Path(__file__).resolve().parents[1]

PROVENANCE = {"params": {"data": {"name": "synthetic"}}, "knobs": {}, "git_revision": "0123abc",
              "packages": {"python": "3.11.9", "torch": "2.14.1"},
              "hardware": {"machine": "x86_64", "cpu_count": 2}, "argv": ["pipeline/launch.py"],
              "run": {"strategy": "ps", "workers": 2, "images_per_worker": 4, "data_mode": "real",
                      "precision": "fp32", "seed": 1, "placement": "dedicated", "servers": 1,
                      "staleness": 1},
              "seed": 1, "workers": 2, "processes": 3, "threads": 1, "device": "cpu",
              "backend": "gloo"}


def rank(number: int, role: str, **facts) -> dict:
    return {"rank": number, "role": role, "checksum": "fa535b528a3900d1", "gradient_bytes": 4097448,
            "bytes_per_iteration": {"sent": 4097448.0, "received": 4097448.0},
            "theory_bytes_per_iteration": {"sent": 4097448, "received": 4097448}, **facts}


# A finished ps run with bounded staleness, every key summary_of, summarise and the strategy's
# summary_facts / rank_facts write (the server's rank reports its staleness).
FINISHED = {
    "run_id": "ps-dedicated-ssp1-w2-b4-s1", "entry": "ps-dedicated-ssp1-w2-b4", "strategy": "ps",
    "variant": "dedicated-ssp1", "workers": 2, "images_per_worker": 4, "data_mode": "real",
    "precision": "fp32", "seed": 1,
    "global_batch": 8, "lr": 0.04, "device": "cpu", "backend": "gloo", "threads": 1,
    "processes": 3, "status": "ok", "reason": "",
    "epochs": 2, "iterations": 62, "train_seconds": 34.8, "evaluation_seconds": 1.7,
    "evaluations": [{"epoch": 1, "step": 31, "train_seconds": 19.2, "AP": 5.2e-05, "AP50": 0.0005,
                     "AP75": 0.0, "seconds": 1.15},
                    {"epoch": 2, "step": 62, "train_seconds": 34.8, "AP": 0.028, "AP50": 0.083,
                     "AP75": 0.0158, "seconds": 0.53}],
    "checkpoints": {"count": 3, "seconds": 0.63, "every": 16},
    "resumed_at_steps": [], "restarts": 0, "channels_last": False, "warmup_iters": 30,
    "skipped_steps": 0, "images_per_second": 15.6,
    "sec_per_iter": {"mean": 0.512, "p50": 0.491, "p95": 0.759},
    "time_split": {"data": 0.009, "compute": 0.47, "communication": 0.03, "optimizer": 0.003},
    "timing_excludes_first_iterations": 5, "communication_share": 0.059,
    "ranks": [rank(0, "server", staleness_histogram={"0": 70, "1": 54}, max_ahead=1),
              rank(1, "worker"), rank(2, "worker")],
    "replicas_identical": True,
    "staleness": {"bound": 1, "histogram": {"0": 70, "1": 54}},
    "epoch_loss": [1.74, 0.889], "final_loss": 0.889,
    "utilisation": {"interval_s": 0.5, "samples": 415, "gpus": "no GPU in use"},
    "run": PROVENANCE["run"],  # the typed Run (pipeline/runtime/run.py) the sweep filled
    "provenance": PROVENANCE,
}
# What sweep.unfinished_summary writes for a skipped run: the run's identity, status, reason and provenance.
SKIPPED = {key: FINISHED[key] for key in ("run_id", "entry", "strategy", "variant", "workers",
                                          "images_per_worker", "data_mode", "precision", "seed",
                                          "run", "provenance")}
SKIPPED.update(status="skipped", reason="3 processes per node but 2 CPU core(s)")


def test_a_finished_runs_summary_reads_back_as_written():
    record = RunSummary.from_json(copy.deepcopy(FINISHED))
    assert record.to_json() == FINISHED
    assert json.dumps(record.to_json(), sort_keys=True) == json.dumps(FINISHED, sort_keys=True)
    # typed all the way down
    assert isinstance(record.evaluations[1], Evaluation) and record.evaluations[1].AP == 0.028
    assert isinstance(record.ranks[0], RankReport) and record.ranks[0].bytes_per_iteration.sent == 4097448.0
    assert record.ranks[0].facts["max_ahead"] == 1
    assert record.facts["staleness"].histogram == {"0": 70, "1": 54}  # a record of ps' own
    assert record.sec_per_iter.p95 == 0.759 and record.checkpoints.count == 3
    assert record.utilisation.samples == 415 and record.time_split.communication == 0.03


def test_strategy_facts_are_written_only_where_reported():
    """A worker reports no staleness and a synchronous run has none: no such key, not null."""
    synchronous = {k: v for k, v in FINISHED.items() if k != "staleness"}
    synchronous["ranks"] = [rank(0, "worker"), rank(1, "worker")]
    record = RunSummary.from_json(synchronous)
    assert record.facts == {} and record.to_json() == synchronous
    assert "max_ahead" not in record.to_json()["ranks"][0]
    # time_split: false keeps only the data wait
    only_data = dict(synchronous, time_split={"data": 0.01}, communication_share=None)
    assert RunSummary.from_json(only_data).to_json() == only_data


def test_a_skipped_runs_summary_reads_back_as_written():
    record = RunSummary.from_json(copy.deepcopy(SKIPPED))
    assert record.status == "skipped" and record.images_per_second is None and record.ranks == []
    assert record.to_json() == SKIPPED


def test_the_launchers_skipped_summary_is_the_record():
    from pipeline.config import stages
    from pipeline.config.params import load_resolved
    from pipeline.strategies.sweep import unfinished_summary
    from pipeline.strategies import sweep

    cfg = load_resolved(REPO / "params.yaml")
    run = next(iter(sweep.runs(cfg).values()))
    written = unfinished_summary(stages.view(cfg, "train"), run, "skipped", "needs 2 GPUs, found 0")
    assert set(written) == set(SKIPPED)
    assert written["status"] == "skipped" and written["run_id"] == sweep.run_id(run)
    assert RunSummary.from_json(json.loads(json.dumps(written))).to_json() == written


@pytest.mark.parametrize("where, change, named", [
    ("top", lambda s: s.update(image_per_second=s.pop("images_per_second")),
     "unknown key 'image_per_second' (did you mean 'images_per_second'?) in RunSummary"),
    ("rank", lambda s: s["ranks"][1].update(bytes_per_iter=s["ranks"][1].pop("bytes_per_iteration")),
     "ranks[1]: unknown key 'bytes_per_iter' (did you mean 'bytes_per_iteration'?) in RankReport"),
    ("evaluation", lambda s: s["evaluations"][0].update(ap50=s["evaluations"][0].pop("AP50")),
     "evaluations[0]: unknown key 'ap50' (did you mean 'AP50'?) in Evaluation"),
    ("nested", lambda s: s["sec_per_iter"].update(p90=0.7),
     "sec_per_iter: unknown key 'p90'"),
])
def test_a_misspelt_key_fails_at_load_naming_the_file_and_the_key(where, change, named):
    raw = copy.deepcopy(FINISHED)
    change(raw)
    with pytest.raises(RecordError, match=re.escape(named)) as err:
        RunSummary.from_json(raw, "results/runs/demo/x/train_summary.json")
    message = str(err.value)
    assert message.startswith("results/runs/demo/x/train_summary.json")
    assert "delete the run directory and rerun its training" in message  # the remedy


def test_an_old_run_folders_summary_upgrades_and_loads():
    """As the first versions wrote it: world_size (in the summary, its provenance and run), no
    run_id, entry nor seed, no typed run, no sampler, no checkpoints, evaluations nor precision;
    a ps run from before shards and SSP."""
    from pipeline.strategies import recorded

    old = copy.deepcopy(FINISHED)
    for key in ("run_id", "entry", "seed", "run", "utilisation", "checkpoints", "evaluations",
                "evaluation_seconds", "restarts", "resumed_at_steps", "precision", "data_mode",
                "skipped_steps", "channels_last", "warmup_iters", "timing_excludes_first_iterations",
                "staleness"):
        del old[key]
    old["world_size"] = old.pop("workers")
    old["provenance"]["world_size"] = old["provenance"].pop("workers")
    run = old["provenance"]["run"]
    run["world_size"] = run.pop("workers")
    del run["servers"], run["staleness"]
    old["ranks"] = [rank(0, "server+worker"), rank(1, "worker")]
    record = RunSummary.from_json(old, folder="ps-colocated-w2-b4")
    assert record.workers == 2 and record.provenance.workers == 2
    assert record.run_id == record.entry == "ps-colocated-w2-b4"
    assert record.seed == 1  # from the provenance
    assert record.provenance.run["workers"] == 2 and "world_size" not in record.provenance.run
    # its typed run is the provenance's; the options it predates ran as their defaults do now
    assert record.run.workers == 2 and record.run.option("placement") == "dedicated"
    ps = recorded(record.run)
    assert ps.option("servers") == 1 and ps.option("staleness") == 0 and ps.seed == 1
    assert record.utilisation is None and record.checkpoints is None and record.evaluations == []
    assert record.data_mode == "real" and record.precision == "fp32"
    assert record.timing_excludes_first_iterations is None and record.restarts is None
    assert "world_size" in old  # upgrade works on a copy
    assert upgrade(upgrade(old, "x"), "x") == upgrade(old, "x")  # an upgraded summary stays so


def test_an_old_summary_with_both_names_is_refused():
    both = dict(copy.deepcopy(FINISHED), world_size=2)
    with pytest.raises(RecordError, match="both 'world_size' and 'workers'"):
        RunSummary.from_json(both, "train_summary.json")


def test_an_old_skipped_summary_loads():
    """An early launcher's skipped run: no entry, variant, seed nor provenance."""
    record = RunSummary.from_json({"run_id": "dp-w2-b4", "strategy": "dp", "world_size": 2,
                                   "images_per_worker": 4, "status": "skipped",
                                   "reason": "needs 2 GPUs, found 0"})
    assert record.workers == 2 and record.entry == "dp-w2-b4" and record.provenance == Provenance()
    assert record.status == "skipped" and record.seed is None and record.variant is None
    assert record.run.strategy == "dp" and record.run.workers == 2  # from its identity


def test_a_strategys_facts_are_declared_fields():
    """A runtime's summary_facts and rank_facts become fields of the record; an undeclared one is an
    error at the end of training, saying where to declare it."""
    from pipeline import strategies
    from pipeline.config.params import load_resolved

    parallel = load_resolved(REPO / "params.yaml").parallel
    ps = strategies.get(strategies.ParameterServer.filled(
        workers=2, images_per_worker=4, placement="dedicated", staleness=1), parallel).runtime()
    facts = ps.summary_facts([rank(0, "server", staleness_histogram={0: 3, 2: 1}), rank(1, "worker")])
    fields = RunSummary.fields_of(facts, "ps.summary_facts", STRATEGY_REMEDY)
    staleness = fields["facts"]["staleness"]
    assert staleness.bound == 1 and staleness.histogram == {"0": 3, "2": 1}
    with pytest.raises(RecordError, match=re.escape("ps.rank_facts: unknown key 'stale_histogram'")):
        RankReport.fields_of({"stale_histogram": {}}, "ps.rank_facts", STRATEGY_REMEDY)


def test_evaluations_during_training_are_records(tmp_path):
    from pipeline.training.summary import evaluations

    lines = [dict(FINISHED["evaluations"][0]), dict(FINISHED["evaluations"][1]),
             dict(FINISHED["evaluations"][1], AP=0.03)]  # epoch 2 scored again after a resume
    (tmp_path / "evaluations.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    found = evaluations(tmp_path)
    assert [e.epoch for e in found] == [1, 2] and found[1].AP == 0.03
    (tmp_path / "evaluations.jsonl").write_text(json.dumps(dict(lines[0], ap=0.1)) + "\n")
    with pytest.raises(RecordError, match=r"evaluations.jsonl: line 1: unknown key 'ap'"):
        evaluations(tmp_path)


def test_nan_and_missing_values_survive():
    one_epoch = dict(copy.deepcopy(FINISHED), epoch_loss=[], final_loss=math.nan)
    again = RunSummary.from_json(json.loads(json.dumps(RunSummary.from_json(one_epoch).to_json())))
    assert math.isnan(again.final_loss) and again.epoch_loss == []


def test_the_records_import_no_torch():
    code = ("import sys, pipeline.runtime.records.training, pipeline.runtime.records.commbench, "
            "pipeline.runtime.records.equivalence; "
            "print(sorted({'torch', 'numpy', 'pandas'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=HANG_S, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---- the records beside the summary ---------------------------------------------------------
CHECKED = {"attempts": [{"score": 0.5}], "kept": 0, "disturbed": None}  # costmodel/bands.checked
COMMBENCH = {"backend": "gloo", "processes": 2, "repeats": 5, "bands": "...", "disturbed": [],
             "primitives": {"send_recv": {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9, "r2": 0.99,
                                          "bandwidth_gbit_s": 8.0, "relative_residuals": [0.1],
                                          "bytes": [4096], "seconds": [1e-4],
                                          "check": CHECKED}},
             "shared_compute": {"factor": 1.6, "expected": 1.0, "images": 4, "alone_s": 0.1,
                                "together_s": 0.16,
                                "check": dict(CHECKED, disturbed="factor x1.600 outside")},
             "calibrations": {"images": 4, "strategies": {"fsdp": {"keep_s": 0.2}},
                              "checks": {"fsdp": CHECKED}},
             "provenance": PROVENANCE}


def test_another_stages_records_read_back_as_written_their_other_keys_kept(tmp_path):
    """Provenance and commbench's files are OpenRecords: a key no field declares (bytes,
    seconds, repeats, a newer stage's) is kept, not refused, and written back as it was."""
    path = tmp_path / "p2.json"
    path.write_text(json.dumps(dict(COMMBENCH, newer={"key": 1})))
    bench = CommbenchRecord.read(path)
    assert bench.primitives["send_recv"].alpha_s == 1e-4 and bench.shared_compute.disturbed
    assert bench.calibrations.checks["fsdp"].disturbed is None
    assert bench.primitives["send_recv"].other == {"bytes": [4096], "seconds": [1e-4]}
    assert bench.to_json() == dict(COMMBENCH, newer={"key": 1})
    provenance = Provenance.from_json(dict(PROVENANCE, stage_fact=3))
    assert provenance.hardware.model == "x86_64" and provenance.hardware.cores == "2"
    assert provenance.dataset == "synthetic" and provenance.package("torch") == "2.14.1"
    assert provenance.to_json() == dict(PROVENANCE, stage_fact=3)


def test_a_commbench_file_from_before_its_checks_reads():
    old = {"processes": 2, "primitives": {"send_recv": {"alpha_s": 0.0, "beta_s_per_byte": 0.0,
                                                        "worst_residual": 0.1}},
           "shared_compute": {"factor": 1.25, "timings": [0.1]}}
    bench = CommbenchRecord.from_json(old)
    assert bench.primitives["send_recv"].check is None and bench.shared_compute.expected == 1.0
    assert not bench.shared_compute.disturbed and bench.calibrations is None


def test_metrics_and_the_equivalence_check_are_records(tmp_path):
    path = tmp_path / "metrics.json"
    path.write_text(json.dumps({"run_id": "ddp-w2-b4-s0", "AP": 0.2, "APs": -1,
                                "inference_seconds": 3.0, "provenance": PROVENANCE}))
    metrics = Metrics.read(path)
    assert metrics.scored and metrics.AP == 0.2 and metrics.AP50 is None
    assert metrics.provenance.git_revision == "0123abc"
    skipped = Metrics.from_json({"run_id": "dp-w2-b2", "status": "skipped", "reason": "no GPU"})
    assert not skipped.scored and skipped.reason == "no GPU"
    path.write_text(json.dumps({"run_id": "x", "Ap": 0.2}))
    with pytest.raises(RecordError, match=re.escape(f"{path}: unknown key 'Ap' (did you mean 'AP'?)")):
        Metrics.read(path)
    steps = EquivalenceRecord.from_json({
        "reference": "single-w1-b8-s0", "max_abs_step_of_single": 0.06, "why": "sampling",
        "strategies": {"ddp-w2-b4-s0": {"max_abs_difference": 0.001, "relative_to_step": 0.02},
                       "dp-w2-b4-s0": {"skipped": "needs 2 GPUs, found 0"}}})
    assert steps.relative_steps == {"ddp-w2-b4-s0": 0.02}
    assert steps.strategies["dp-w2-b4-s0"].skipped == "needs 2 GPUs, found 0"
