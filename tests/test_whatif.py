"""The what-if command (pipeline/whatif.py) on a small made-up finished preset: the report's run
directories (tests/test_report.py's builder) and a commbench JSON, in their real formats."""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pipeline import whatif
from pipeline.config import schema
from pipeline.config.params import load_resolved
from pipeline.report.clusters import COLUMNS, gpu_compute, prediction_points
from pipeline.report.load import load_run
from pipeline.report.prediction import prediction_frame
from pipeline.runtime.records.commbench import CommbenchRecord

from .conftest import HANG_S
from .test_report import make_ok_run

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "cluster-8x8.yaml"
H200_BUNDLE = REPO / "benchmarks" / "measured" / "h200-call1-4eaba84.json"  # a GPU check's, as measured
COMMBENCH = {"processes": 2, "backend": "nccl", "primitives": {
    "all_reduce": {"alpha_s": 4e-5, "beta_s_per_byte": 2e-11},
    "send_recv": {"alpha_s": 2e-5, "beta_s_per_byte": 1e-11}}}


def finished_preset(results: Path, preset: str = "demo") -> Path:
    """results/runs/<preset>/ with single on a GPU, ddp and ps of 2 workers, and
    results/commbench/<preset>/p2.json, as the workflow leaves them."""
    root = results / "runs" / preset
    for strategy, workers in (("single", 1), ("ddp", 2), ("ps", 2)):
        run_dir = make_ok_run(root, strategy, workers, 2, [2.0, 1.5], ap=0.2, iters_per_epoch=6)
        summary = json.loads((run_dir / "train_summary.json").read_text())
        summary.update(device="cuda:0", backend="nccl", processes=workers,
                       ranks=[{"gradient_bytes": 4_000_000}] * workers)
        (run_dir / "train_summary.json").write_text(json.dumps(summary))
    (results / "commbench" / preset).mkdir(parents=True)
    (results / "commbench" / preset / "p2.json").write_text(json.dumps(COMMBENCH))
    return root


def run_command(args: list[str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    """The command in a process of its own, which then says whether torch was ever imported."""
    code = ("import sys; from pipeline import whatif; whatif.main(sys.argv[1:]); "
            "print('torch imported:', 'torch' in sys.modules)")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=HANG_S, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})


def report_points(cluster: schema.Cluster, runs_dir: Path, compute=None) -> pd.DataFrame:
    """The report's predicted_scaling_points for `cluster`: report.predict with that cluster,
    its compute preset the made-up one (report/build.py's two calls)."""
    predict = schema.replaced(load_resolved(REPO / "params.yaml").report.predict,
                              compute={"preset": runs_dir.name}, clusters=[cluster.model_dump()])
    runs = [load_run(d) for d in sorted(runs_dir.iterdir())]
    return prediction_points(predict, compute or gpu_compute(predict, runs))


def test_the_csv_is_the_reports_prediction_for_the_same_cluster_without_torch(tmp_path):
    runs_dir = finished_preset(tmp_path / "results")
    out = tmp_path / "whatif.csv"
    result = run_command(["--cluster", str(EXAMPLE), "--from", str(tmp_path / "results"),
                          "--preset", "demo", "--csv", str(out)])
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PREDICTION (cost model, not measured): 8 x 8 GPUs")
    assert result.stdout.rstrip().endswith("torch imported: False")

    found = pd.read_csv(out)
    assert (found["label"] == whatif.LABEL).all()
    cluster = whatif.read_cluster(EXAMPLE, {})
    expected = report_points(cluster, runs_dir)
    assert len(expected) == len(found) > 0
    pd.testing.assert_frame_equal(found[COLUMNS], expected, check_dtype=False, rtol=1e-12)
    assert "(measured: single-w1-b2 of the demo preset on cuda:0)" in result.stdout  # as the report's

    # The band: the report's predicted/measured of the preset's 2 multi-process runs, at least +-20 %
    ratios = prediction_frame([load_run(d) for d in sorted(runs_dir.iterdir())],
                              {2: CommbenchRecord.from_json(COMMBENCH)})["ratio"]
    low, high = min(0.8, ratios.min()), max(1.2, ratios.max())
    rate = found["predicted_images_per_second"]
    assert found["predicted_images_per_second_low"].to_numpy() == pytest.approx((rate / high).to_numpy())
    assert found["predicted_images_per_second_high"].to_numpy() == pytest.approx((rate / low).to_numpy())
    assert f"x{ratios.min():.2f}-{ratios.max():.2f} over 2 multi-process run(s)" in result.stdout
    for gpus, at in found.groupby("gpus"):  # ranked fastest first at every GPU count
        ordered = at.sort_values("predicted_rank")
        assert list(ordered["predicted_rank"]) == list(range(1, len(at) + 1))
        assert ordered["predicted_images_per_second"].is_monotonic_decreasing
    assert "Predicted ranking at 64 GPUs (8 node(s))" in result.stdout


def test_a_gpus_compute_given_directly_is_the_reports_assumption(tmp_path, capsys):
    """Flags alone (no file, no finished preset): the report's points with that compute."""
    flags = {"name": "two nodes", "gpus_per_node": 4, "nodes": 2, "intra_gbit_s": 600,
             "intra_latency_us": 3, "inter_gbit_s": 50, "inter_latency_us": 8,
             "spare_cpu_machines_per_node": 0}
    args = [word for key, value in flags.items() for word in (f"--{key.replace('_', '-')}", str(value))]
    out = tmp_path / "given.csv"
    whatif.main([*args, "--gpu-seconds-per-image", "0.25", "--gradient-bytes", "1e8", "--csv", str(out)])
    printed = capsys.readouterr().out
    assert printed.startswith(whatif.LABEL) and "given on the command line" in printed
    assert "the report's +-20% bound, x0.80-1.20 (no multi-process run with a prediction to widen it: " \
           "--from not given)" in printed
    compute = whatif.Compute(0.25, 1e8, "given")
    expected = prediction_points(
        schema.replaced(load_resolved(REPO / "params.yaml").report.predict, clusters=[flags]), compute)
    pd.testing.assert_frame_equal(pd.read_csv(out)[COLUMNS], expected, check_dtype=False, rtol=1e-12)
    # one GPU of ddp communicates nothing: 1 / 0.25 s per image, efficiency 1
    one = pd.read_csv(out).query("gpus == 1 and model.str.startswith('DDP')")
    assert len(one) == 2
    assert one["predicted_images_per_second"].to_numpy() == pytest.approx(4.0)
    assert one["predicted_efficiency"].to_numpy() == pytest.approx(1.0)


def test_flags_over_the_file_and_the_gpu_count_ranked(capsys):
    whatif.main(["--cluster", str(EXAMPLE), "--nodes", "2", "--gpus", "8",
                 "--gpu-seconds-per-image", "0.3", "--gradient-bytes", "1e8"])
    printed = capsys.readouterr().out
    assert "8 GPU(s) per node x 2 node(s)" in printed and "Predicted ranking at 8 GPUs (1 node(s))" in printed
    ranked = printed.split("Predicted ranking")[1].split("Predicted images/s")[0]
    assert "DataParallel (device 0)" in ranked and "Not predicted" not in ranked  # one node: dp runs
    assert printed.split("Predicted images/s at each GPU count:")[1].split("\n")[1].split()[-1] == "16"


@pytest.mark.parametrize("text, said", [
    ("gpus_per_node: 8\nnodes: 8\n", "no intra_gbit_s, intra_latency_us, inter_gbit_s, inter_latency_us, "
     "spare_cpu_machines_per_node; add them to the file (as in examples/cluster-8x8.yaml) or give --intra-gbit-s"),
    ("{}: [", "cluster.yaml:1:6: not valid YAML: "),  # where, as params.yaml's syntax errors
    ("- 8\n- 8\n", "expected a mapping of the cluster's keys (as in examples/cluster-8x8.yaml), found list"),
    (("inter_gbit_s: 25", "inter_gbit_s: -25"),  # the example with one key broken
     "inter_gbit_s: -25 is less than or equal to the minimum of 0; set it above 0"),
    (("gpus_per_node", "gpu_per_node"), "unknown key 'gpu_per_node' (did you mean 'gpus_per_node'?)"),
    (("nodes: 8", "nodes: eight"), "nodes: 'eight' is not of type 'integer'"),
    (("gpu_memory_gib: 80", "gpu_memory_gib: 0"), "gpu_memory_gib: 0 is less than or equal to the minimum of 0"),
])
def test_a_bad_cluster_file_names_the_file_the_key_and_the_remedy(tmp_path, text, said):
    path = tmp_path / "cluster.yaml"
    path.write_text(EXAMPLE.read_text().replace(*text) if isinstance(text, tuple) else text)
    with pytest.raises(SystemExit) as stopped:
        whatif.main(["--cluster", str(path), "--gpu-seconds-per-image", "0.3", "--gradient-bytes", "1e8"])
    assert str(path) in str(stopped.value.code) and said in str(stopped.value.code)


def test_what_the_command_cannot_use_is_refused_naming_the_remedy(tmp_path):
    def refused(*args: str) -> str:
        with pytest.raises(SystemExit) as stopped:
            whatif.main(["--cluster", str(EXAMPLE), *args])
        return str(stopped.value.code)

    assert ("give --from RESULTS (a finished preset), or --gpu-seconds-per-image, --gpu-points or --gpu-bundle "
            "with --gradient-bytes") in refused()
    assert "give one of --gpu-seconds-per-image and --gpu-points" in refused(
        "--gpu-seconds-per-image", "1", "--gpu-points", "2:1,4:2", "--gradient-bytes", "1")
    assert "give --gpu-bundle and --gradient-bytes together" in refused("--gpu-bundle", str(H200_BUNDLE))
    assert "no throughput row of precision fp64; it has bf16, fp32" in refused(
        "--gpu-bundle", str(H200_BUNDLE), "--precision", "fp64", "--gradient-bytes", "1")
    assert "not a GPU check's JSON with throughput rows" in refused(
        "--gpu-bundle", str(EXAMPLE), "--gradient-bytes", "1")
    assert "together" in refused("--gradient-bytes", "1e8")
    assert f"{tmp_path / 'runs' / 'demo'}: no finished run" in refused("--from", str(tmp_path), "--preset", "demo")
    assert "--gpus 3: the model predicts" in refused("--gpus", "3", "--gpu-seconds-per-image", "1",
                                                     "--gradient-bytes", "1")
    mine = tmp_path / "mine.csv"
    mine.write_text("a user's own table\n")
    said = refused("--gpu-seconds-per-image", "1", "--gradient-bytes", "1", "--csv", str(mine))
    assert "not a CSV this command wrote, so it was left untouched" in said
    assert mine.read_text() == "a user's own table\n"


def test_its_own_csv_is_replaced_and_help_says_what_it_takes(tmp_path, capsys):
    out = tmp_path / "again.csv"
    args = ["--cluster", str(EXAMPLE), "--gpu-seconds-per-image", "0.3", "--gradient-bytes", "1e8"]
    whatif.main([*args, "--csv", str(out)])
    first = pd.read_csv(out)
    whatif.main([*args, "--images-per-gpu", "16", "--csv", str(out)])  # its own file: replaced
    again = pd.read_csv(out)
    assert math.isclose(again.query("gpus == 1")["predicted_images_per_second"].iloc[0], 1 / 0.3)
    # 8 times the images a step over the same exchange: closer to linear scaling
    assert (again["predicted_efficiency"] >= first["predicted_efficiency"]).all()
    assert (again["predicted_efficiency"] > first["predicted_efficiency"]).any()
    with pytest.raises(SystemExit) as stopped:
        whatif.main(["--help"])
    assert stopped.value.code == 0
    shown = capsys.readouterr().out
    assert "predictions, not measurements" in shown
    assert all(flag in shown for flag in ("--cluster", "--from", "--gpu-seconds-per-image", "--csv"))


def test_an_accuracy_ablations_runs_are_no_input(tmp_path):
    """The GroupNorm ablation's single run (another model; its id sorts before the baseline's,
    as single-w1-b8-groupnorm-s0 does in the demo) is neither the compute nor in the band: the
    report leaves it out of its model the same way (report/causes.py split_by_norm)."""
    root = finished_preset(tmp_path / "results")
    ablation = root / "single-w1-b2-a-groupnorm"  # sorts before single-w1-b2
    shutil.copytree(root / "single-w1-b2", ablation)
    summary = json.loads((ablation / "train_summary.json").read_text())
    summary["run"] = {**(summary.get("run") or {"strategy": "single", "workers": 1}), "norm": "groupnorm"}
    summary["run_id"] = summary["entry"] = ablation.name
    (ablation / "train_summary.json").write_text(json.dumps(summary))
    runs, _ = whatif.finished_runs(tmp_path / "results", "demo")
    assert sorted(run.run_id for run in runs) == ["ddp-w2-b2", "ps-w2-b2", "single-w1-b2"]
    result = run_command(["--cluster", str(EXAMPLE), "--from", str(tmp_path / "results"), "--preset", "demo"])
    assert result.returncode == 0, result.stderr
    assert "(measured: single-w1-b2 of the demo preset on cuda:0)" in result.stdout


def test_compute_is_a_fixed_cost_per_step_plus_a_cost_per_image():
    """Fitted from two or more batch sizes (non-negative, relative error), the step of a batch
    size not given is the line's, not single's per-image time times the images."""
    fitted = whatif.Compute.of_points({2: 0.03, 8: 0.06, 16: 0.1}, 1e8, "three")
    assert fitted.fixed_seconds == pytest.approx(0.02, rel=1e-6)
    assert fitted.seconds_per_image == pytest.approx(0.005, rel=1e-6)
    assert fitted.extrapolated(32) and fitted.extrapolated(1) and not fitted.extrapolated(4)
    # a larger batch no slower a step than a smaller one cannot make the cost per image negative
    flat = whatif.Compute.of_points({2: 0.05, 16: 0.04}, 1e8, "noisy")
    assert flat.seconds_per_image == 0 and flat.fixed_seconds > 0
    one = whatif.Compute.of_points({4: 0.2}, 1e8, "one")
    assert (one.fixed_seconds, one.seconds_per_image) == (0.0, 0.05)


def test_a_gpu_bundles_steps_are_the_compute_and_a_small_batch_is_not_predicted_too_fast(capsys):
    """The H200 bundle: single at 2 images fp32 42.1 images/s (47.5 ms a step), at 16 images 71.2
    (225 ms). Taken as one per-image time at 16 images, the 2-image step would be 28 ms, 1.7x too
    fast; the fitted terms give back both measured steps."""
    whatif.main(["--cluster", str(EXAMPLE), "--gpu-bundle", str(H200_BUNDLE), "--gradient-bytes", "166131544",
                 "--images-per-gpu", "2", "--gpus", "1"])
    printed = capsys.readouterr().out
    assert "fitted step 2: 47.5 ms, 16: 224.7 ms" in printed and "NVIDIA H200, fp32" in printed
    assert "extrapolated" not in printed
    ranked = printed.split("Predicted ranking")[1]
    single_rate = float(ranked.split("DDP (ring all-reduce)")[1].split()[0])
    assert single_rate == pytest.approx(2 / 0.04746, rel=0.01)  # one GPU: the measured 42.1 images/s
    whatif.main(["--cluster", str(EXAMPLE), "--gpu-points", "2:0.0475,16:0.225", "--gradient-bytes", "1e8",
                 "--images-per-gpu", "32"])
    assert "32 image(s) per GPU lies outside the batch sizes the compute was fitted at (2, 16)" in (
        capsys.readouterr().out)


def test_the_recipe_in_hours_gpu_hours_cost_and_the_memory_that_fits(tmp_path, capsys):
    """The demo's recipe (6 epochs of 256 images) at every GPU count: hours are its images over
    the predicted images/s, the band's ends over the band's; GPU-hours times the GPUs; the cost
    at --price; memory per GPU the state alone without measured activations (said as a lower
    bound), and the strategies whose state exceeds a 0.2 GiB GPU named."""
    out = tmp_path / "plan.csv"
    whatif.main(["--cluster", str(EXAMPLE), "--gpu-points", "2:0.05,16:0.3", "--gradient-bytes", "1e8",
                 "--preset", "demo", "--price", "2.5", "--gpu-memory-gib", "0.2", "--csv", str(out)])
    printed = capsys.readouterr().out
    found = pd.read_csv(out)
    total = 6 * 256
    assert (found[["recipe_epochs", "recipe_images"]] == [6, 256]).all().all()
    rate = found["predicted_images_per_second"]
    assert found["predicted_hours"].to_numpy() == pytest.approx((total / rate / 3600).to_numpy())
    assert found["predicted_hours_low"].to_numpy() == pytest.approx(
        (total / found["predicted_images_per_second_high"] / 3600).to_numpy())
    assert found["predicted_gpu_hours_high"].to_numpy() == pytest.approx(
        (found["predicted_hours_high"] * found["gpus"]).to_numpy())
    assert found["predicted_cost"].to_numpy() == pytest.approx((found["predicted_gpu_hours"] * 2.5).to_numpy())
    assert found["predicted_memory_mib_per_gpu"].to_numpy() == pytest.approx(
        found["predicted_state_mb_per_gpu"].to_numpy())
    big = found["predicted_memory_mib_per_gpu"] > 0.2 * 1024
    assert big.any() and (~big).any()  # DDP's whole state does not fit; FSDP's shard at 64 GPUs does
    assert (found.loc[big, "fits_in_gpu_memory"] == "no (state only)").all()
    assert (found.loc[~big, "fits_in_gpu_memory"] == "yes (state only)").all()
    at_64 = found[found["gpus"] == 64]
    misfits = sorted(set(at_64.loc[at_64["fits_in_gpu_memory"].str.startswith("no"), "model"]))
    assert f"against 0.2 GiB per GPU: does not fit for {', '.join(misfits)}." in printed
    assert "DDP (ring all-reduce)" in misfits and "FSDP (ZeRO-3, reshard)" not in misfits
    assert "its activations were not measured" in printed and "a lower bound" in printed
    assert "The recipe: 6 epoch(s) of 256 training images (demo: data.synthetic.train_images)" in printed
    assert "cost the GPU-hours at 2.5 per GPU-hour" in printed and "cost (band)" in printed
    assert "at 64 GPUs an epoch is 2 steps of a global batch of 128 images" in printed  # 256 / (64 x 2)


def test_a_bundles_peak_memory_is_the_activations_and_coco_is_the_reference_recipe(capsys):
    """The H100 bundle's rows carry peak memory: past the state (471 MiB) 1224 MiB at 2 images
    and 9550 at 16, the activations added to each strategy's state. coco2017's recipe: 26
    epochs of train2017's 117,266 annotated images."""
    bundle = REPO / "benchmarks" / "measured" / "h100-throughput-mended.json"
    whatif.main(["--cluster", str(EXAMPLE), "--gpu-bundle", str(bundle), "--gradient-bytes", "166131544",
                 "--preset", "coco2017", "--gpus", "64"])
    printed = capsys.readouterr().out
    assert "activations at 2 image(s), 1224 MiB" in printed and "against 80 GiB per GPU: every strategy fits." in printed
    assert "The recipe: 26 epoch(s) of 117,266 training images (coco2017: COCO 2017 train2017" in printed
    assert "cost (band)" not in printed  # no price given
    with pytest.raises(SystemExit) as stopped:
        whatif.main(["--cluster", str(EXAMPLE), "--gpu-points", "2:0.05", "--gradient-bytes", "1e8",
                     "--preset", "not-mine"])
    assert "--preset not-mine: not a preset of" in str(stopped.value.code)
    assert "give --epochs and --train-images" in str(stopped.value.code)
    whatif.main(["--cluster", str(EXAMPLE), "--gpu-points", "2:0.05", "--gradient-bytes", "1e8",
                 "--preset", "not-mine", "--epochs", "2", "--train-images", "1000"])
    assert "The recipe: 2 epoch(s) of 1,000 training images (given on the command line)" in capsys.readouterr().out


def test_a_presets_single_runs_at_two_batch_sizes_are_fitted(tmp_path, capsys):
    """--from a preset whose single ran on its GPU at 2 and 4 images a step: one GPU's compute is
    a fixed cost plus a cost per image through both (step = (compute + data) x images +
    optimizer), as the report's predicted scaling takes it."""
    root = finished_preset(tmp_path / "results")
    run_dir = make_ok_run(root, "single", 1, 4, [2.0, 1.5], ap=0.2, iters_per_epoch=6)
    summary = json.loads((run_dir / "train_summary.json").read_text())
    summary.update(device="cuda:0", backend="nccl", processes=1, ranks=[{"gradient_bytes": 4_000_000}])
    (run_dir / "train_summary.json").write_text(json.dumps(summary))
    runs = [load_run(d) for d in sorted(root.iterdir())]
    predict = schema.replaced(load_resolved(REPO / "params.yaml").report.predict, compute={"preset": "demo"})
    compute = gpu_compute(predict, runs)
    assert compute.fitted_images == (2, 4) and "single-w1-b2, single-w1-b4" in compute.source
    steps = {}
    for run in runs:
        s = run.summary
        if s.strategy == "single":
            split = s.time_split
            steps[s.images_per_worker] = split.compute + split.data + split.optimizer
    for images, seconds in steps.items():
        assert compute.step_seconds(images) == pytest.approx(seconds, rel=1e-6)
    whatif.main(["--cluster", str(EXAMPLE), "--from", str(tmp_path / "results"), "--preset", "demo"])
    assert "fitted at 2 batch size(s)" in capsys.readouterr().out
