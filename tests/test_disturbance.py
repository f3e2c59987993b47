"""A disturbed measurement is repeated or flagged, never silently used (issue 40, point 5): the
commbench stage's bands and repeats (pipeline/costmodel/bands.py), runs identical by
construction that disagree, and what the report, numbers.tex and the cost model say of both
(pipeline/report/disturbance.py). No torch, no training: fake measurements and run folders."""
from __future__ import annotations

import json

import pytest

from pipeline.costmodel import bands
from pipeline.report import build_report
from pipeline.report.disturbance import TOLERANCE, identical_runs_check, measurement_check
from pipeline.report.prediction import prediction_frame, section

from .test_costmodel import benches, summary, typed
from .test_report import REPORT_CFG, make_ok_run


def free() -> dict:
    """Links that cost nothing, as a commbench JSON holds them (no check: from before them)."""
    return {name: {"alpha_s": 0.0, "beta_s_per_byte": 0.0, "bandwidth_gbit_s": None, "r2": 1.0,
                   "relative_residuals": [0.0]} for name in ("all_reduce", "send_recv")}


def shared(factor: float, together_spread: float = 0.02) -> dict:
    """shared_compute.measure's dict on 2 processes with the cores to themselves."""
    return {"alone_s": 0.1, "together_s": 0.1 * factor, "factor": factor, "images": 4,
            "repeats": 15, "alone_spread": 0.02, "together_spread": together_spread, "expected": 1.0}


def values(found: dict) -> dict:
    return {"factor": found["factor"], "together_spread": found["together_spread"]}


def test_the_bands_hold_the_quiet_figures_and_not_the_disturbed_ones():
    """Quiet 2-core VM, 2 processes: x0.985-1.040; beside another CPU-bound job: x1.536."""
    for quiet in (0.985, 1.0, 1.040):
        score, reasons = bands.shared_verdict(shared(quiet))
        assert score <= 1 and reasons == []
    score, reasons = bands.shared_verdict(shared(1.536))
    assert score > 1 and reasons == ["factor x1.536 outside [0.90, 1.20]"]
    score, reasons = bands.shared_verdict(shared(1.0, together_spread=0.6))  # an outlier spread
    assert score == pytest.approx(2.0) and reasons == ["together spread 0.60 over its repeats > 0.30"]
    # another job on the machine meanwhile, whatever the timings say (None: not judged)
    assert bands.shared_verdict(dict(shared(1.0), other_load=1.02))[1] == [
        "other processes took 1.02 cores meanwhile > 0.30"]
    assert bands.shared_verdict(dict(shared(1.0), other_load=0.004))[1] == []
    # more processes than cores: 3 on 2 cores share them, 1.5 is what a quiet machine shows
    assert bands.expected_factor("cpu", 3, 1, 2) == 1.5 and bands.expected_factor("cpu", 2, 1, 2) == 1.0
    assert bands.expected_factor("cuda", 8, 1, 2) == 1.0
    assert bands.shared_verdict(dict(shared(1.536), expected=1.5))[1] == []
    assert bands.relative_spread([1.0, 1.0, 1.0, 1.0, 9.0]) == 0.0  # one outlier: the median holds
    assert bands.relative_spread([1.0, 1.0, 1.0, 9.0, 9.0]) == 8.0  # two: it is at risk


def test_a_measurement_outside_its_band_is_repeated_then_marked_disturbed():
    attempts = iter([shared(1.536), shared(1.49), shared(1.52)])
    found, check = bands.checked("shared compute", lambda: next(attempts), bands.shared_verdict, values,
                                 retries=2)
    assert len(check["attempts"]) == 1 + 2
    assert [a["factor"] for a in check["attempts"]] == [1.536, 1.49, 1.52]
    assert check["kept"] == 1 and found["factor"] == 1.49  # the least disturbed attempt
    assert check["disturbed"] == ("factor x1.490 outside [0.90, 1.20] (the least disturbed of 3 "
                                  "attempts, all outside the band)")
    # a passing disturbance: measured again, then trusted
    attempts = iter([shared(1.536), shared(1.02), shared(9.0)])
    found, check = bands.checked("shared compute", lambda: next(attempts), bands.shared_verdict, values,
                                 retries=2)
    assert found["factor"] == 1.02 and check["kept"] == 1 and check["disturbed"] is None
    assert len(check["attempts"]) == 2  # the third never measured
    # quiet at once: measured once
    found, check = bands.checked("shared compute", lambda: shared(1.0), bands.shared_verdict, values,
                                 retries=2)
    assert check == {"attempts": [{"factor": 1.0, "together_spread": 0.02, "score": 0.9}],
                     "kept": 0, "disturbed": None}
    # a link: its timings' median spread over the sizes, and the other processes' load; its
    # fit's residual is kept, not judged (a quiet machine's missed a size by up to 0.89)
    link = {"relative_residuals": [0.02, -0.9, 0.01], "relative_spread": [0.6, 0.7, 0.05],
            "other_load": 0.01}
    assert bands.link_verdict(link)[1] == ["timing spread 0.60 over its repeats > 0.50"]
    assert bands.link_verdict(dict(link, relative_spread=[0.3] * 3))[1] == []
    assert bands.link_verdict(dict(link, relative_spread=[0.3] * 3, other_load=0.9))[1] == [
        "other processes took 0.90 cores meanwhile > 0.30"]
    # a calibration's plain step, every process at once, is shared compute's step again
    found = {"timings": {"plain_s": 0.1536, "reshard_s": 0.3}, "spread": 0.05, "other_load": None}
    assert bands.calibration_verdict(found, 0.1, 1.0)[1] == [
        "plain step together over alone x1.536 outside [0.90, 1.20]"]


def commbench_json(factor: float, disturbed: bool) -> dict:
    """A commbench JSON as the stage writes it: its all_reduce link and shared compute marked
    disturbed or not."""
    def check(value: dict, reason: str | None) -> dict:
        return {"attempts": [value] * (3 if reason else 1), "kept": 0, "disturbed": reason}
    link = {"alpha_s": 1e-4, "beta_s_per_byte": 1e-9, "bandwidth_gbit_s": 8.0, "r2": 0.99,
            "relative_residuals": [0.01, -0.02], "relative_spread": [0.03, 0.04]}
    spread = ("fit residual 0.90 > 0.50 (the least disturbed of 3 attempts, all outside the band)"
              if disturbed else None)
    factor_reason = (f"factor x{factor:.3f} outside [0.90, 1.20] (the least disturbed of 3 "
                     "attempts, all outside the band)" if disturbed else None)
    return {"backend": "gloo", "processes": 2, "repeats": 5,
            "primitives": {"send_recv": dict(link, check=check({}, None)),
                           "all_reduce": dict(link, check=check({}, spread)),
                           "broadcast": dict(link, check=check({}, None))},
            "shared_compute": dict(shared(factor), check=check({"factor": factor}, factor_reason)),
            "calibrations": {"images": 4, "repeats": 15,
                             "strategies": {"fsdp": {"plain_s": 0.1, "reshard_s": 0.15, "keep_s": 0.14}},
                             "checks": {"fsdp": check({}, None)}},
            "bands": bands.BANDS_TEXT, "disturbed": [f"shared compute: {factor_reason}"] if disturbed else []}


def test_the_cost_model_does_not_use_a_disturbed_shared_compute_factor_and_says_what_it_trusted():
    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    single = summary("single", 1, 8, 1, 10.0, split)  # 0.1 s an image at the run's 1 thread
    run = summary("ddp", 2, 4, 1, 19.0, split, comm_hook="none")
    disturbed = {2: dict(commbench_json(1.536, disturbed=True), primitives=free())}
    disturbed[2]["primitives"]["all_reduce"]["check"] = {"disturbed": "fit residual 0.90 > 0.50"}
    row = prediction_frame(typed([single, run]), benches(disturbed)).iloc[0]
    assert row["shared_compute_factor"] == 1.0  # a quiet machine's, not the disturbed x1.536
    assert row["predicted_images_per_second"] == pytest.approx(8 / (4 * 0.1))
    assert row["compute_input"].endswith("; shared-compute factor x1 assumed (commbench's x1.536 disturbed)")
    text = " ".join(section(None, prediction_frame(typed([single, run]), benches(disturbed)), benches(disturbed))["text"])
    assert "NOT trusted, disturbed: shared-compute factor at 2 processes (x1.536): factor x1.536 outside" in text
    assert "not used: the factor of a quiet machine" in text
    assert ("NOT trusted, disturbed: all_reduce link at 2 processes (latency 0.0 us, nan Gbit/s): "
            "fit residual 0.90 > 0.50; used as measured") in text
    assert "Inputs trusted (inside the bands of a quiet machine" in text and "send_recv link at 2 processes" in text
    assert "1 of 1 multi-process runs are within 20% of the model. Not all of the model's inputs were trusted" in text
    # the same values, trusted: used, and no caveat
    quiet = {2: dict(commbench_json(1.04, disturbed=False), primitives=free())}
    for primitive in quiet[2]["primitives"].values():
        primitive["check"] = {"disturbed": None}
    row = prediction_frame(typed([single, run]), benches(quiet)).iloc[0]
    assert row["shared_compute_factor"] == 1.04 and "assumed" not in row["compute_input"]
    text = " ".join(section(None, prediction_frame(typed([single, run]), benches(quiet)), benches(quiet))["text"])
    assert "NOT trusted" not in text and "read this count with care" not in text
    # a JSON from before the checks: used as measured, and said to be unchecked
    old = {2: {"processes": 2, "backend": "gloo", "primitives": free(), "shared_compute": shared(1.25)}}
    assert prediction_frame(typed([single, run]), benches(old)).iloc[0]["shared_compute_factor"] == 1.25
    assert "Unchecked (a commbench JSON from before its checks" in " ".join(
        section(None, prediction_frame(typed([single, run]), benches(old)), benches(old))["text"])


def identical(speeds: dict[str, float], **settings) -> list[dict]:
    """Runs of one worker, 8 images a step, as prediction's test runs are put together."""
    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    runs = []
    for run_id, speed in speeds.items():
        strategy = run_id.split("-")[0]
        found = summary(strategy, 1, 8, 2, speed, split, **settings)
        found["run_id"] = run_id
        found["summary"].update(variant="colocated" if strategy == "ps" else "")
        runs.append(found)
    return runs


def test_identical_runs_that_disagree_mark_the_machine_noisy_and_agreeing_ones_do_not():
    noisy = identical({"single-s0": 24.3, "single-s1": 30.0, "ddp-w1": 34.4, "ps-w1": 28.0,
                       "zero-w1": 29.0, "fsdp-w1": 27.5})
    (group,) = identical_runs_check(typed(noisy))
    assert group.speeds[0] == ("single-s0", 24.3) and group.speeds[-1] == ("ddp-w1", 34.4)
    assert group.spread == pytest.approx(34.4 / 24.3 - 1) and group.noisy
    check = measurement_check(typed(noisy), {})
    assert check.noisy and check.lines()[0].startswith(
        "The machine was noisy: runs identical by construction differ in speed by up to 42%, "
        "more than the 10% tolerance")
    assert "ddp-w1 34.4" in check.lines()[1] and "the machine was noisy" in check.lines()[1]
    quiet = identical({"single-s0": 30.0, "single-s1": 30.9, "ddp-w1": 29.8, "fsdp-w1": 28.4})
    check = measurement_check(typed(quiet), {})
    assert not check.noisy and check.identical[0].spread <= TOLERANCE
    assert check.lines()[0].startswith("No sign of a noisy machine")
    assert "No sign of a noisy machine" in check.tex_macro()
    # what does not compute single's step is no part of it: 2 workers, a compression hook,
    # another batch or precision, a failed run
    others = identical({"ddp-w2": 50.0}) + identical({"ddp-powersgd-w1": 99.0}, comm_hook="powersgd")
    others[0]["summary"].update(workers=2, processes=2)
    others[1]["summary"].update(variant="powersgd")
    bf16 = identical({"zero-bf16": 60.0})[0]
    bf16["summary"]["precision"] = "bf16"
    failed = dict(identical({"fsdp-failed": 1.0})[0], status="failed")
    assert tuple(identical_runs_check(typed(quiet + others + [bf16, failed]))) == check.identical
    assert measurement_check(typed(others), {}).lines()[0].startswith("Machine noise not checked")


@pytest.mark.parametrize("noisy", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["noisy", "quiet"])
def test_the_report_opens_with_the_check_and_the_paper_gets_its_macro(tmp_path, noisy):
    """Through build_report: runs identical by construction 30 % apart (or 3 %), and a
    disturbed commbench (or a quiet one). The answer opens the report, the check follows it;
    a warning is also the answer's first line."""
    root = tmp_path / "runs"
    runs = [make_ok_run(root, strategy, 1, 8, [2.0, 1.5, 1.2], ap=0.12)
            for strategy in ("single", "ddp", "zero", "fsdp")]
    for run, speed in zip(runs, (20.0, 26.0, 24.0, 22.0) if noisy else (20.0, 20.6, 20.2, 20.4)):
        path = run / "train_summary.json"
        path.write_text(json.dumps(dict(json.loads(path.read_text()), images_per_second=speed)))
    bench = tmp_path / "p2.json"
    bench.write_text(json.dumps(commbench_json(1.536 if noisy else 1.02, disturbed=noisy)))
    cfg = dict(REPORT_CFG, figure_formats=["png"])
    build_report(runs, cfg, "demo", tmp_path / "summary.csv", tmp_path / "report", commbench=[bench])
    md = (tmp_path / "report" / "report.md").read_text()
    sections = md.split("\n## ")[1:]
    first = sections[1]  # the check, right after the answer
    assert sections[0].startswith("The answer")
    assert ("The machine was noisy" in sections[0].split("\n\n")[1]) == noisy  # its first line
    numbers = (tmp_path / "report" / "numbers.tex").read_text()
    macro = next(line for line in numbers.splitlines() if line.startswith("\\newcommand{\\MachineNoise}"))
    if noisy:
        assert first.startswith("Measurement check")
        assert ("The machine was noisy: runs identical by construction differ in speed by up to "
                "30%, more than the 10% tolerance") in first
        assert "single-w1-b8 20.0, fsdp-w1-b8 22.0, zero-w1-b8 24.0, ddp-w1-b8 26.0" in first
        assert ("The commbench stage measured the machine while it was disturbed, and kept these "
                "marked after its repeats: all_reduce link at 2 processes") in first
        assert "shared-compute factor at 2 processes (x1.536): factor x1.536 outside [0.90, 1.20]" in first
        assert "The machine was noisy" in macro and r"30\%" in macro
        assert "shared-compute factor at 2 processes" in macro
        cost = md.split("## Predicted against measured (cost model)", 1)[1].split("\n## ", 1)[0]
        assert "NOT trusted, disturbed: shared-compute factor at 2 processes (x1.536)" in cost
    else:
        assert first.startswith("Measurement check")
        assert "No sign of a noisy machine: runs identical by construction agree within the 10% tolerance" in first
        assert "measured while it was disturbed" not in first
        assert "No sign of a noisy machine" in macro and "commbench" not in macro
