"""The training loop on a tiny synthetic set: it learns, it is deterministic, a killed run
resumes to exactly the result of an uninterrupted one, and a diverging run stops clearly."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline import strategies
from pipeline.config import schema, stages
from pipeline.config.params import canonical
from pipeline.runtime.run import Run
from pipeline.strategies.sweep import runs
from pipeline.training import identity
from pipeline.training.identity import fingerprint
from pipeline.training.train import learning_rate, train

from .conftest import HANG_S, REPO, checkpoint_inside_an_epoch, gone, signal_each, small_config, stopped_when, wait_for

TIMING = ("time_data", "time_compute", "time_communication", "time_optimizer", "time_iter", "elapsed")


def records(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in TIMING}
            for line in path.read_text().splitlines()]


def single_run(cfg: schema.Config) -> Run:
    return next(iter(runs(cfg).values()))


def trained(cfg: schema.Config, out, max_steps: int | None = None) -> dict | None:
    """The sweep's first run trained in this process, with what the train stage reads."""
    return train(stages.view(cfg, "train"), single_run(cfg), out, max_steps)


def train_command(cfg: schema.Config, run: Run, out) -> list[str]:
    """The training process's command line, its config as the workflow sends it (knobs in it)."""
    return [sys.executable, "-m", "pipeline.training.train",
            "--config", canonical(stages.view(cfg, "train").model_dump()),
            "--entry", canonical(run.to_json()), "--out", str(out)]


def test_training_lowers_the_loss_and_writes_its_outputs(small_dataset, tmp_path):
    cfg = small_config(small_dataset, epochs=4)
    summary = trained(cfg, tmp_path / "run")
    first, last = summary["epoch_loss"][0], summary["epoch_loss"][-1]
    assert last < 0.8 * first, summary["epoch_loss"]
    # 23 usable images (one has no boxes) in full batches of 4: 5 an epoch, the short one dropped
    assert summary["status"] == "ok" and summary["iterations"] == 4 * 5
    assert summary["warmup_iters"] == cfg.train.warmup_iters == 4  # the value used
    assert summary["images_per_second"] > 0 and summary["sec_per_iter"]["p95"] >= summary["sec_per_iter"]["p50"]
    lines = records(tmp_path / "run" / "iterations.jsonl")
    assert [r["step"] for r in lines] == list(range(1, 21))
    assert set(lines[0]) >= {"epoch", "lr", "images", "loss", "loss_classifier", "loss_box_reg",
                             "loss_objectness", "loss_rpn_box_reg"}
    saved = json.loads((tmp_path / "run" / "train_summary.json").read_text())
    provenance = saved["provenance"]
    assert provenance["seed"] == cfg.train.seed and provenance["workers"] == 1
    assert provenance["processes"] == 1
    assert provenance["threads"] >= 1 and provenance["packages"]["torch"] == torch.__version__.split("+")[0]  # the torch that ran
    assert provenance["params"]["train"]["epochs"] == 4 and provenance["git_revision"]
    assert (tmp_path / "run" / "model_final.pt").stat().st_size > 0
    events = EventAccumulator(str(tmp_path / "run"))  # TensorBoard's view of the same log
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss/total")] == [
        (r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in lines]
    samples = [json.loads(line) for line in (tmp_path / "run" / "utilisation.jsonl").read_text().splitlines()]
    assert samples and saved["utilisation"]["samples"] == len(samples)  # every 0.5 s of training
    assert all(s["rank"] == 0 and s["rss_mb"] > 0 for s in samples)


def test_same_seed_same_losses_on_cpu(small_dataset, tmp_path):
    cfg = small_config(small_dataset, epochs=1)
    trained(cfg, tmp_path / "a")
    other = small_config(small_dataset, epochs=1, seed=1)
    trained(other, tmp_path / "c")
    assert records(tmp_path / "c" / "iterations.jsonl") != records(tmp_path / "a" / "iterations.jsonl")
    # The same seed again, without the phase split (only the data wait and iteration time
    # timed): the same training, to the bit
    summary = trained(schema.replaced(cfg, train={"time_split": False}), tmp_path / "d")
    assert records(tmp_path / "d" / "iterations.jsonl") == records(tmp_path / "a" / "iterations.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "d" / "iterations.jsonl").read_text().splitlines()]
    assert all(set(TIMING) - set(line) == {"time_compute", "time_communication", "time_optimizer"}
               for line in lines)
    assert set(summary["time_split"]) == {"data"} and summary["communication_share"] is None


def scores(summary: dict) -> list[tuple]:
    """The evaluations during training, without their timings."""
    return [(e["epoch"], e["step"], e["AP"], e["AP50"]) for e in summary["evaluations"]]


@pytest.mark.parametrize("loader_workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_killed_run_resumes_mid_epoch_to_the_uninterrupted_result(small_dataset, tmp_path, loader_workers, caplog):
    cfg = schema.replaced(
        small_config(small_dataset, epochs=2, checkpoint_every=4),  # 6 iterations an epoch: the first lands mid-epoch
        data={"workers": loader_workers},  # augmentations drawn in a loader process, or not
        eval={"every_epochs": 1})  # an evaluation before every epoch's checkpoint
    assert cfg.data.horizontal_flip > 0
    run = single_run(cfg)
    whole = trained(cfg, tmp_path / "whole")
    assert whole["checkpoints"]["count"] == 2 + 2  # every epoch's end, and steps 4 and 8 (mid-epoch)

    out = tmp_path / "killed"
    command = train_command(cfg, run, out)
    process = subprocess.Popen(command, cwd=REPO, stderr=subprocess.DEVNULL)
    # Held still (with its loader worker) once a mid-epoch checkpoint is there, and read while
    # held: the position killed at, not one the run may have moved past before the kill.
    _, held = stopped_when(process.pid,
                           lambda: checkpoint_inside_an_epoch(out) and not (out / "train_summary.json").exists(),
                           "a mid-epoch checkpoint of the unfinished run", process=process)
    saved = torch.load(out / "state" / "checkpoint.pt", weights_only=True)  # plain data and tensors only
    signal_each(held, signal.SIGKILL)
    process.wait()
    wait_for(lambda: gone(held), "the killed run's processes to be gone")
    position = saved["train_state"]
    # checkpoint_every 4: steps 4 and 8 land inside an epoch; whichever the kill came after
    assert position["batch"] > 0 and position["step"] in (4, 8), position
    assert not (out / "train_summary.json").exists()

    # The rerun, here in this process (whose random state the whole run above moved on: the
    # checkpoint's must be what counts)
    with caplog.at_level("INFO"):
        trained(cfg, out)
    at = f"at epoch {position['epoch']}, batch {position['batch']} (step {position['step']})"
    assert "resuming" in caplog.text and at in caplog.text, caplog.text[-2000:]
    assert records(out / "iterations.jsonl") == records(tmp_path / "whole" / "iterations.jsonl")
    resumed = json.loads((out / "train_summary.json").read_text())
    assert scores(resumed) == scores(whole) and [e[0] for e in scores(whole)] == [1, 2]
    assert resumed["resumed_at_steps"] == [position["step"]] and whole["resumed_at_steps"] == []
    assert resumed["restarts"] == 0  # a rerun, not torchrun's restart
    final = [torch.load(d / "model_final.pt", weights_only=True)["model"] for d in (tmp_path / "whole", out)]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])


def test_checkpoint_of_other_settings_is_not_resumed(small_dataset, tmp_path, caplog):
    cfg = small_config(small_dataset, epochs=2)
    trained(cfg, tmp_path / "run", max_steps=7)  # stops in epoch 1 (6 an epoch)
    assert (tmp_path / "run" / "state" / "checkpoint.pt").exists()
    changed = small_config(small_dataset, epochs=2, base_lr=0.01)
    with caplog.at_level("INFO"):
        trained(changed, tmp_path / "run")
    assert "written with other settings or code; starting over" in caplog.text
    assert {r["lr"] for r in records(tmp_path / "run" / "iterations.jsonl")} <= {
        learning_rate(changed.train, 0.01, s, 0) for s in range(12)}
    assert not (tmp_path / "run" / "state").exists()  # a finished run keeps no state


def test_checkpoint_identity_covers_parallel_and_code(small_dataset):
    cfg = small_config(small_dataset)
    run = single_run(cfg)
    other_parallel = schema.replaced(cfg, parallel={"powersgd_rank": cfg.parallel.powersgd_rank + 1})
    assert fingerprint(other_parallel, run) != fingerprint(cfg, run)
    code = stages.code_files("train")
    assert "pipeline/training/train.py" in code and "pipeline/strategies/ddp.py" in code
    assert "pipeline/config/params.py" in code and "pipeline/detection/evaluate.py" not in code
    # One run's code: its own strategy's module and what it builds on, not the others'.
    single, zero = (stages.code_files("train", left_out=strategies.not_run_by(name))
                    for name in ("single", "zero"))
    assert "pipeline/strategies/single.py" in single and "pipeline/training/train.py" in single
    assert not {"pipeline/strategies/ddp.py", "pipeline/strategies/torchrun.py"} & set(single)
    assert {"pipeline/strategies/zero.py", "pipeline/strategies/ddp.py"} <= set(zero)
    assert "pipeline/strategies/fsdp.py" not in zero
    assert (stages.code_digest("train", strategies.not_run_by("single"))
            != stages.code_digest("train", strategies.not_run_by("zero")))


def test_diverging_loss_stops_with_a_clear_error_and_records_the_run_as_failed(small_dataset, tmp_path):
    # checkpoint_every 1: a loss is checked before the weights after it are saved
    cfg = small_config(small_dataset, epochs=2, base_lr=1e6, warmup_iters=0, checkpoint_every=1)
    out = tmp_path / "run"
    result = subprocess.run(train_command(cfg, single_run(cfg), out), cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    # the run's own result at these settings: recorded, and the job ends well (the sweep goes on)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "error: non-finite loss" in result.stderr and "Lower train.base_lr" in result.stderr
    assert f"The run is recorded as failed in {out / 'train_summary.json'}" in result.stderr
    summary = json.loads((out / "train_summary.json").read_text())
    assert summary["status"] == "failed" and summary["reason"].startswith("non-finite loss {")
    assert not (out / "model_final.pt").exists()
    checkpoint = out / "state" / "checkpoint.pt"
    if checkpoint.exists():
        weights = torch.load(checkpoint, weights_only=True)["model"]
        assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


def test_learning_rate_schedule():
    train_cfg = schema.replaced(small_config(Path("data")).train, warmup_iters=10, warmup_factor=0.001,
                                lr_steps=[2, 3], lr_gamma=0.1)
    assert learning_rate(train_cfg, 1.0, 0, 0) == pytest.approx(0.001)
    assert learning_rate(train_cfg, 1.0, 5, 0) == pytest.approx(0.001 * 0.5 + 0.5)
    assert learning_rate(train_cfg, 1.0, 10, 1) == pytest.approx(1.0)
    assert learning_rate(train_cfg, 1.0, 99, 2) == pytest.approx(0.1)
    assert learning_rate(train_cfg, 1.0, 99, 3) == pytest.approx(0.01)


def test_evaluations_during_training_are_kept_out_of_its_time(small_dataset, tmp_path):
    cfg = schema.replaced(small_config(small_dataset, epochs=3), eval={"every_epochs": 2})
    summary = trained(cfg, tmp_path / "run")
    assert [(e["epoch"], e["step"]) for e in summary["evaluations"]] == [(2, 10)]
    assert all(0 <= e["AP"] <= e["AP50"] <= 1 for e in summary["evaluations"])
    assert summary["evaluation_seconds"] >= summary["evaluations"][0]["seconds"] > 0
    # Training seconds are the sum of the epochs' iterations: the evaluation is not in them.
    last = json.loads((tmp_path / "run" / "iterations.jsonl").read_text().splitlines()[-1])
    assert summary["train_seconds"] == pytest.approx(last["elapsed"], abs=0.05)
    assert summary["evaluations"][0]["train_seconds"] < summary["train_seconds"]
    off = schema.replaced(cfg, eval={"every_epochs": 0})
    assert trained(off, tmp_path / "off")["evaluations"] == []


def test_synthetic_data_mode_trains_without_the_loader(small_dataset, tmp_path):
    cfg = schema.replaced(small_config(small_dataset, epochs=2), eval={"every_epochs": 1},
                          sweep=[{"strategy": "single", "workers": 1, "data_mode": "synthetic"}])
    run = single_run(cfg)
    assert run.data_mode == "synthetic"
    summary = trained(cfg, tmp_path / "run")
    assert summary["run_id"].endswith("-synthetic-s0") and summary["data_mode"] == "synthetic"
    assert summary["iterations"] == 2 * 5  # the same iterations as on the real data
    assert summary["evaluations"] == []  # noise pixels: nothing to score
    lines = records(tmp_path / "run" / "iterations.jsonl")
    assert lines[-1]["loss"] < lines[0]["loss"]  # it learns the pool it is given


def test_fp16_overflow_is_a_skipped_step_not_an_error():
    """fp16's loss scaler: an overflowed step leaves the weights as they were, lowers the scale
    and is counted; the next step goes on."""
    from pipeline.training.precision import Precision

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    amp = Precision("fp16", torch.device("cpu"))
    amp.scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # overflows at once
    before = [p.detach().clone() for p in model.parameters()]
    for _ in range(2):
        with amp.autocast():
            loss = model(torch.randn(8, 4)).pow(2).mean()
        optimizer.zero_grad()
        amp.backward(loss)
        amp.optimizer(optimizer).step()
    assert amp.skipped_steps >= 1 and amp.scaler.get_scale() < 2.0 ** 127
    if amp.skipped_steps == 2:
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_precision_names_the_run_and_fp16_is_refused_for_ps(small_dataset):
    from pipeline.config.params import ParamsError
    from pipeline.strategies.sweep import fill, run_id

    cfg = small_config(small_dataset)
    assert run_id(fill({"strategy": "ddp", "workers": 2, "precision": "bf16"}, cfg)) == "ddp-w2-b4-amp-bf16-s0"
    assert run_id(fill({"strategy": "single", "workers": 1}, cfg)) == "single-w1-b4-s0"  # fp32: as before
    with pytest.raises(ParamsError, match="use precision: bf16"):
        fill({"strategy": "ps", "workers": 2, "precision": "fp16"}, cfg)


def test_loader_workers_auto_follow_the_cores_per_process(monkeypatch):
    from pipeline.runtime import distributed
    from pipeline.training.train import loader_workers

    data = small_config(Path("data")).data
    auto, none = (schema.replaced(data, workers=workers) for workers in ("auto", 0))
    monkeypatch.setattr(distributed, "available_cores", lambda: 16)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert loader_workers(auto) == 3  # 4 cores per process, one of them trains
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "16")
    assert loader_workers(auto) == 1
    assert loader_workers(none) == 0


def test_warmup_auto_is_the_reference_trainers():
    from pipeline.training.job import warmup_iterations

    train_cfg = small_config(Path("data")).train
    auto, seven = (schema.replaced(train_cfg, warmup_iters=value) for value in ("auto", 7))
    assert warmup_iterations(auto, 31) == 30      # the demo: 31 steps an epoch
    assert warmup_iterations(auto, 7329) == 1000  # COCO at 16 images a step
    assert warmup_iterations(seven, 31) == 7


def test_checkpoints_no_run_will_resume_are_named_before_anything_runs(small_dataset, tmp_path):
    """The workflow names, while it plans, each checkpoint that this sweep will not resume: a
    run that left the sweep (kept) and one whose settings changed (replaced); a checkpoint of
    the run as it is now goes unmentioned."""
    cfg = small_config(small_dataset)
    run_id, run = next(iter(runs(cfg).items()))

    def checkpoint(name: str, fingerprint_: str | None) -> Path:
        state = tmp_path / name / "state"
        state.mkdir(parents=True)
        (state / "checkpoint.pt").write_bytes(b"")
        if fingerprint_:
            (state / "checkpoint.json").write_text(json.dumps({"fingerprint": fingerprint_}))
        return state / "checkpoint.pt"

    current = checkpoint(run_id, fingerprint(cfg, run))
    assert identity.superseded(cfg, {run_id: run}, tmp_path) == []
    gone = checkpoint("ddp-w8-b8-s0", "0123")
    lines = identity.superseded(cfg, {run_id: run}, tmp_path)
    assert lines == [f"{gone}: an unfinished run that is not in this sweep; it is kept (delete "
                     f"{gone.parent.parent} when you no longer need it)"]
    changed = schema.replaced(cfg, parallel={"powersgd_rank": cfg.parallel.powersgd_rank + 1})
    lines = identity.superseded(changed, {run_id: run}, tmp_path)
    assert f"{current}: written with other settings, code or data than the run has now" in lines[1]
