"""A disturbed measurement is repeated or flagged, never silently used (issue 40, point 5): the
commbench stage's bands and repeats (pipeline/costmodel/bands.py), runs identical by
construction that disagree, and what the report, numbers.tex and the cost model say of both
(pipeline/report/disturbance.py). No torch, no training: fake measurements and run folders."""
from __future__ import annotations

import json
import shutil

import pytest

from pipeline.costmodel import bands
from pipeline.config import schema
from pipeline.report import build_report
from pipeline.report.disturbance import measurement_check
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
    assert ("NOT trusted, disturbed: all_reduce link at 2 processes (latency 0.0 us, no bandwidth resolved (the "
            "fit's time per byte sat at its bound of 0)): "
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


def seeded(entries: dict[str, list[float]], threads: int = 2) -> list[dict]:
    """Runs of entries named STRATEGY-wN-bB[-synthetic] (ps: colocated), one per images/s
    value, seed by seed (run ids ENTRY-sK), as prediction's test runs are put together."""
    split = {"compute": 0.8, "data": 0.0, "optimizer": 0.0, "communication": 0.0}
    runs = []
    for entry, speeds in entries.items():
        strategy, workers, per_worker = entry.split("-")[:3]
        workers, per_worker = int(workers[1:]), int(per_worker[1:])
        for seed, speed in enumerate(speeds):
            found = summary(strategy, workers, per_worker, threads, speed, split)
            found.update(run_id=f"{entry}-s{seed}", entry=entry)
            found["summary"].update(variant="colocated" if strategy == "ps" else "", seed=seed,
                                    data_mode="synthetic" if entry.endswith("synthetic") else "real")
            runs.append(found)
    return runs


# The example (issue 48): single's seeds 1 % apart; ddp, ps, zero and fsdp at one
# process 3-10 % off single, each its own wrapper's cost; one seed of two entries ~30 % below
# its others.
EXAMPLE = {"single-w1-b8": [35.6, 35.8, 35.9], "ddp-w1-b8": [35.0], "ps-w1-b8": [36.8],
           "zero-w1-b8": [34.9], "fsdp-w1-b8": [32.2], "ddp-w2-b4": [42.1, 42.6, 41.8],
           "zero-w2-b4": [41.2, 42.0, 28.3], "ddp-w2-b4-synthetic": [25.9, 42.4, 43.3]}


def test_overheads_are_no_noise_and_a_slow_seed_is_named_beside_its_others():
    check = measurement_check(typed(seeded(EXAMPLE)), {})
    assert not check.noisy
    head = check.lines()[0]
    assert head.startswith("No sign of a noisy machine: each entry's seeds agree within the 10% "
                           "tolerance, once 2 outlier runs are set aside: ")
    assert "zero-w2-b4-s2 (28.3 images/s)" in head and "ddp-w2-b4-synthetic-s0 (25.9 images/s)" in head
    said = " ".join(check.lines())
    assert ("zero-w2-b4-s2 ran at 28.3 images/s against 41.2 and 42.0 for the other seeds of "
            "zero-w2-b4 (ZeRO-1, 2 workers): an outlier, 32% below their median") in said
    assert "ddp-w2-b4-synthetic-s0 ran at 25.9 images/s against 42.4 and 43.3" in said
    assert [e.entry for e in check.entries] == ["single-w1-b8", "ddp-w2-b4", "zero-w2-b4",
                                                "ddp-w2-b4-synthetic"]  # entries of 2+ runs
    assert [len(e.outliers) for e in check.entries] == [0, 0, 1, 1]
    assert "trained again after its job crashed" not in said
    # a run trained again after a crash is judged like its seeds, and said so where it is named
    runs = seeded(EXAMPLE)
    for run in runs:
        if run["run_id"] in ("zero-w2-b4-s2", "ddp-w2-b4-s1"):
            run["summary"]["failed_attempts"] = [{"ended": "killed by SIGABRT", "reason": "malloc(): corrupted"}]
    retried = measurement_check(typed(runs), {})
    assert [len(e.outliers) for e in retried.entries] == [0, 0, 1, 1]  # the same verdicts
    said = " ".join(retried.lines())
    assert ("zero-w2-b4 (ZeRO-1, 2 workers): an outlier, 32% below their median (more than 10% and 3.5 "
            "robust deviations from it). It stays in the entry's means; the entry's spread is read without "
            "it. It was trained again after its job crashed; its speed is that of the attempt that "
            "finished.") in said
    assert said.count("trained again after its job crashed") == 1  # ddp-w2-b4-s1 is no outlier
    # each one-process strategy: its overhead over single, in ms an iteration with its interval
    (group,) = check.identical
    overheads = {o.entry: o.gap for o in group.overheads}
    assert set(overheads) == {"ddp-w1-b8", "ps-w1-b8", "zero-w1-b8", "fsdp-w1-b8"}
    fsdp = overheads["fsdp-w1-b8"]
    assert fsdp.delta == pytest.approx(8000 / 32.2 - 8000 / 35.8)  # medians: ms an iteration
    assert fsdp.delta_low < fsdp.delta < fsdp.delta_high and fsdp.verdict == "beyond the noise"
    assert fsdp.ratio == pytest.approx(35.8 / 32.2)  # its time over single's
    assert "FSDP2, 1 worker (fsdp-w1-b8, 1 run): +25.0 ms an iteration (95% interval" in said
    assert "1.11x single's time, beyond the noise" in said and "each one's own cost, not machine noise" in said
    assert "The machine was noisy" not in check.tex_macro()
    # the overheads alone, however large, raise no flag: single's seeds agree
    alone = {k: v for k, v in EXAMPLE.items() if "w1" in k}
    assert not measurement_check(typed(seeded(alone)), {}).noisy


def test_single_runs_that_disagree_still_mark_the_machine_noisy():
    noisy = dict(EXAMPLE, **{"single-w1-b8": [24.3, 30.0, 34.4]})  # no one of them an outlier
    check = measurement_check(typed(seeded(noisy)), {})
    assert check.noisy and check.entries[0].outliers == ()
    assert check.lines()[0].startswith(
        "The machine was noisy: the seeds of one entry (single-w1-b8), which cost the same, "
        "differ in speed by 42%, more than the 10% tolerance")
    assert "The machine was noisy" in check.tex_macro()
    # two seeds: no outlier can be told from the other, their spread is judged
    two = measurement_check(typed(seeded({"single-w1-b8": [30.0, 35.0]})), {})
    assert two.noisy and two.outliers == []
    # what does not compute single's step is no overhead: 2 workers, a compression hook, a
    # failed run; and with one run an entry no repeats
    others = seeded({"ddp-w2-b4": [50.0], "ddp-w1-b8": [99.0]})
    others[1]["summary"].update(variant="powersgd")
    failed = dict(seeded({"fsdp-w1-b8": [1.0]})[0], status="failed")
    check = measurement_check(typed(seeded({"single-w1-b8": [30.0, 30.3]}) + others + [failed]), {})
    assert check.identical == () and not check.noisy
    assert measurement_check(typed(others), {}).lines()[0].startswith("Machine noise not checked")


def seeded_dirs(root, entries: dict[str, list[float]], ap: float = 0.1) -> list:
    """Run directories of entries STRATEGY-wN-bB, one per images/s value (seed by seed)."""
    dirs = []
    for entry, speeds in entries.items():
        strategy, workers, per_worker = entry.split("-")
        first = make_ok_run(root / "made", strategy, int(workers[1:]), int(per_worker[1:]),
                            [2.0, 1.5, 1.2], ap=ap)
        for seed, speed in enumerate(speeds):
            run = root / f"{entry}-s{seed}"
            shutil.copytree(first, run)
            path = run / "train_summary.json"
            found = json.loads(path.read_text())
            found.update(run_id=run.name, entry=entry, seed=seed, images_per_second=speed)
            path.write_text(json.dumps(found))
            metrics = json.loads((run / "metrics.json").read_text())
            (run / "metrics.json").write_text(json.dumps(dict(metrics, run_id=run.name,
                                                              AP=ap + 0.002 * seed)))
            dirs.append(run)
    return dirs


@pytest.mark.parametrize("noisy", [True, pytest.param(False, marks=pytest.mark.slow)],
                         ids=["noisy", "quiet"])
def test_the_report_opens_with_the_check_and_the_paper_gets_its_macro(tmp_path, noisy):
    """Through build_report: single's two seeds 30 % apart (or 3 %) beside one-process
    strategies, and a disturbed commbench (or a quiet one). The verdict opens the report, then
    the answer in full and the check; the verdict says the machine was noisy, and the disturbed
    commbench follows it in the first section (once each: the check's section says which)."""
    runs = seeded_dirs(tmp_path / "runs", {"single-w1-b8": [20.0, 26.0] if noisy else [20.0, 20.6],
                                           "ddp-w1-b8": [20.4], "zero-w1-b8": [19.0],
                                           "fsdp-w1-b8": [18.0]}, ap=0.12)
    bench = tmp_path / "p2.json"
    bench.write_text(json.dumps(commbench_json(1.536 if noisy else 1.02, disturbed=noisy)))
    cfg = schema.replaced(REPORT_CFG, figure_formats=["png"])
    build_report(runs, cfg, "demo", tmp_path / "summary.csv", tmp_path / "report", commbench=[bench])
    md = (tmp_path / "report" / "report.md").read_text()
    sections = md.split("\n## ")[1:]
    first = sections[2]  # the check, after the verdict and the answer in full
    assert sections[0].startswith("The answer\n") and sections[1].startswith("The answer in full")
    verdict, after = sections[0].split("\n\n")[1:3]
    assert ("The machine was noisy" in verdict) == noisy  # said once, in the verdict's words
    assert ("measured the machine while it was disturbed" in after) == noisy and "The machine was noisy" not in after
    numbers = (tmp_path / "report" / "numbers.tex").read_text()
    macro = next(line for line in numbers.splitlines() if line.startswith("\\newcommand{\\MachineNoise}"))
    assert first.startswith("Measurement check")
    assert "FSDP2, 1 worker (fsdp-w1-b8, 1 run): +" in first  # an overhead, not noise
    if noisy:
        assert ("The machine was noisy: the seeds of one entry (single-w1-b8), which cost the "
                "same, differ in speed by 30%, more than the 10% tolerance") in first
        assert "single-w1-b8's 2 seeds measured single-w1-b8-s0 20.0, single-w1-b8-s1 26.0" in first
        assert ("The commbench stage measured the machine while it was disturbed, and kept these "
                "marked after its repeats: all_reduce link at 2 processes") in first
        assert "shared-compute factor at 2 processes (x1.536): factor x1.536 outside [0.90, 1.20]" in first
        assert "The machine was noisy" in macro and r"30\%" in macro
        assert "shared-compute factor at 2 processes" in macro
        cost = md.split("## Predicted against measured (cost model)", 1)[1].split("\n## ", 1)[0]
        assert "NOT trusted, disturbed: shared-compute factor at 2 processes (x1.536)" in cost
    else:
        assert "No sign of a noisy machine: each entry's seeds agree within the 10% tolerance." in first
        assert "measured while it was disturbed" not in first
        assert "No sign of a noisy machine" in macro and "commbench" not in macro
