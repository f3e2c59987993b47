"""A run's scalars for TensorBoard (issue 50, point 4): the event file written from a made-up
iteration log, read back with TensorBoard's own EventAccumulator (no training, no torch)."""
from __future__ import annotations

import logging
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.runtime.records.evaluation import Evaluation
from pipeline.training import scalars

LOSS_TERMS = ("loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg")


def iteration(step: int, epoch: int, loss: float) -> dict:
    """One record as the loop writes it (pipeline/training/train.py `iterate`, timing.py)."""
    return {"step": step, "epoch": epoch, "lr": 0.04 * step / 10, "time_data": 0.01 * step,
            "images": 8, "bytes_sent": 0, "bytes_received": 0, "time_iter": 0.2 + 0.01 * step,
            "elapsed": 0.3 * step, "loss": loss, **{k: loss / 4 + i for i, k in enumerate(LOSS_TERMS)},
            "time_compute": 0.15, "time_communication": 0.02 * step, "time_optimizer": 0.03}


def made_up_run() -> tuple[list[dict], list[Evaluation]]:
    """Six iterations over two epochs; a resume after step 4 logged steps 3 and 4 again."""
    records = [iteration(s, (s - 1) // 3, 2.0 - 0.1 * s) for s in range(1, 5)]
    records += [iteration(3, 1, 9.0), iteration(4, 1, 8.0), iteration(5, 1, 1.5), iteration(6, 1, 1.4)]
    evaluations = [Evaluation(epoch=1, step=3, train_seconds=0.9, AP=0.01, AP50=0.03, AP75=0.0, seconds=1.0),
                   Evaluation(epoch=2, step=6, train_seconds=1.8, AP=0.02, AP50=0.05, AP75=0.01, seconds=1.0)]
    return records, evaluations


def read_back(run_dir) -> EventAccumulator:
    found = EventAccumulator(str(run_dir))
    found.Reload()
    return found


def test_the_event_file_holds_each_iterations_scalars_at_its_step(tmp_path):
    records, evaluations = made_up_run()
    path = scalars.write_events(tmp_path, records, evaluations, now=1000.0)
    assert path == tmp_path / scalars.EVENTS_FILE
    events = read_back(tmp_path)
    assert set(events.Tags()["scalars"]) == {
        "loss/total", "loss/classifier", "loss/box_reg", "loss/objectness", "loss/rpn_box_reg", "lr",
        "images_per_second", "time/iteration", "time/data", "time/compute", "time/communication",
        "time/optimizer", "eval/AP", "eval/AP50", "eval/AP75"}
    last = {r["step"]: r for r in records}  # the record logged after the resume counts
    for tag, value in {"loss/total": lambda r: r["loss"], "lr": lambda r: r["lr"],
                       "loss/box_reg": lambda r: r["loss_box_reg"],
                       "images_per_second": lambda r: r["images"] / r["time_iter"],
                       "time/communication": lambda r: r["time_communication"]}.items():
        read = events.Scalars(tag)
        assert [e.step for e in read] == [1, 2, 3, 4, 5, 6], tag
        assert [e.value for e in read] == pytest.approx([value(last[e.step]) for e in read], rel=1e-6), tag
    assert [e.step for e in events.Scalars("eval/AP")] == [3, 6]
    assert [e.value for e in events.Scalars("eval/AP")] == pytest.approx([0.01, 0.02])
    # wall times: the run's training clock, ending when the file was written
    assert [e.wall_time for e in events.Scalars("lr")] == pytest.approx([1000.0 - 1.8 + 0.3 * s for s in range(1, 7)])


def test_a_rerun_replaces_the_file_and_a_record_without_split_or_images_gives_what_it_has(tmp_path):
    records, evaluations = made_up_run()
    scalars.write_events(tmp_path, records, evaluations)
    # the same run trained again, with train.time_split: false, as a dedicated server would log
    again = [{k: v for k, v in r.items() if k not in ("time_compute", "time_communication",
                                                      "time_optimizer", "images")} for r in records[:2]]
    scalars.write_events(tmp_path, again, [])
    assert [p.name for p in tmp_path.iterdir()] == [scalars.EVENTS_FILE]
    events = read_back(tmp_path)
    assert [e.step for e in events.Scalars("loss/total")] == [1, 2]
    assert {"images_per_second", "time/compute", "eval/AP"}.isdisjoint(events.Tags()["scalars"])
    assert "time/data" in events.Tags()["scalars"]


def test_without_tensorboard_one_line_says_so_and_nothing_is_written(tmp_path, monkeypatch, caplog):
    for name in [n for n in sys.modules if n == "tensorboard" or n.startswith("tensorboard.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    records, evaluations = made_up_run()
    with caplog.at_level(logging.INFO, logger=scalars.__name__):
        assert scalars.write_events(tmp_path, records, evaluations) is None
    assert list(tmp_path.iterdir()) == []
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "no TensorBoard event file for this run: tensorboard is not installed"]
