"""The GPU check (benchmarks/gpu_check.py) as CI runs it: with no GPU visible it says so and
runs every item at tiny sizes on CPU, through the real launcher, gloo process groups and
training loop, and writes its Markdown and JSON bundle with the provenance."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import torch
from torchvision.models import resnet50
from torchvision.models.detection.transform import GeneralizedRCNNTransform
from torchvision.ops import FrozenBatchNorm2d
from torchvision.transforms.v2 import functional as F

from benchmarks import gpu_check
from pipeline.data import synthetic
from pipeline.data.dataset import CocoDetection

from pipeline.report.load import load_run
from pipeline.report.prediction import single_inputs
from pipeline.runtime import distributed
from pipeline.strategies import REGISTERED

from .conftest import HANG_S, REPO, signal_each, stopped_when

NO_GPU = pytest.mark.skipif(distributed.gpu_count() > 0,
                            reason="a GPU is visible: this is the CPU smoke; run the check itself there")


def layer4_std(state: dict, images: torch.Tensor) -> float:
    """The spread of a frozen-BatchNorm ResNet-50's last stage on `images`, as the recipe's
    detector builds its backbone from `state`."""
    body = resnet50(weights=None, norm_layer=FrozenBatchNorm2d)
    body.load_state_dict(state)
    with torch.no_grad():
        x = body.maxpool(body.relu(body.bn1(body.conv1(images))))
        return body.layer4(body.layer3(body.layer2(body.layer1(x)))).std().item()


def test_the_checks_backbone_keeps_its_activations_in_scale(tmp_path):
    """The cause of the GPU check's non-finite losses on an H100, at a size CPUs afford: a random
    ResNet-50's frozen statistics (mean 0, variance 1) let each stage amplify its input, so its
    last stage comes out many times wider than one whose statistics came from the images."""
    cfg = gpu_check.base_config(gpu_check.CPU_SMOKE, 1, tmp_path / "data", tmp_path / "b.pth")
    synthetic.generate(cfg.data.root, cfg.data.synthetic)
    calibrated = gpu_check.calibrated_backbone(cfg, images=8)
    transform = GeneralizedRCNNTransform(64, 1333, [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    dataset = CocoDetection(cfg.data.root, "train", train=True)
    held_out = [F.to_dtype(dataset[i][0], torch.float32, scale=True) for i in range(8, 12)]
    images = transform(held_out)[0].tensors  # images the statistics were not gathered on
    # the same weights with a random backbone's statistics, as torchvision initialises them
    uncalibrated = {name: (torch.zeros_like(value) if name.endswith("running_mean") else
                           torch.ones_like(value) if name.endswith("running_var") else value)
                    for name, value in calibrated.items()}
    ours, random_statistics = layer4_std(calibrated, images), layer4_std(uncalibrated, images)
    print(f"layer4 std: {ours:.2f} calibrated, {random_statistics:.2f} with mean 0, variance 1")
    assert 0.3 < ours < 4, ours
    assert random_statistics > 3 * ours, (random_statistics, ours)


@pytest.mark.slow
@NO_GPU
def test_a_quick_sitting_cut_off_keeps_the_rows_it_measured(tmp_path):
    """--quick rewrites its bundle after every timed segment: killed mid-item (as a GPU loan's
    time limit kills it), the bundle reads, with every row measured so far and the item still
    running."""
    bundle = tmp_path / "bundle" / "gpu_check.json"
    check = subprocess.Popen([sys.executable, "benchmarks/gpu_check.py", "--quick", "--out",
                              str(bundle.parent), "--results", str(tmp_path / "results")],
                             cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             start_new_session=True, env=dict(os.environ, TMPDIR=str(tmp_path)))

    def measured() -> list:
        runs = json.loads(bundle.read_text())["items"]["throughput"].get("runs", [])
        return [r for r in runs if r["status"] == "ok"]

    def mid_item() -> bool:  # the bundle is written whole, then renamed: never read half-written
        return bundle.exists() and "throughput" in json.loads(bundle.read_text())["items"] and bool(measured())
    held = []
    try:
        # held still (SIGSTOP, with its workers) once a row is measured, and checked again while
        # held: the kill lands mid-item, not after the item has ended meanwhile
        _, held = stopped_when(check.pid, mid_item, "a measured throughput row", timeout=HANG_S, process=check)
    finally:
        os.killpg(check.pid, signal.SIGKILL)
        signal_each(held, signal.SIGKILL)  # torchrun's workers, in sessions of their own
        output = check.communicate()[0]
    found = json.loads(bundle.read_text())
    throughput = found["items"]["throughput"]
    assert throughput["status"] == "running", output[-2000:]
    first = measured()[0]
    assert first["name"] == "b2-fp32" and first["repeats"] >= 1 and first["losses_finite"]
    assert "sync" not in found["items"]  # the items after it never started
    text = (bundle.parent / "gpu_check.md").read_text()
    assert "## throughput: running" in text and "b2-fp32" in text


def cpu_smoke(tmp_path, *options: str) -> dict:
    """The check's CPU smoke of every item: its bundle's items, after the checks every item
    passes (each done, the provenance, finite losses wherever it trained)."""
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py", "--out", str(tmp_path / "bundle"),
                             "--results", str(tmp_path / "results"), *options],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "no GPU visible: the CPU smoke" in result.stdout
    bundle = json.loads((tmp_path / "bundle" / "gpu_check.json").read_text())
    found = bundle["items"]
    assert sorted(found) == sorted(gpu_check.ITEMS)
    assert [found[name]["status"] for name in gpu_check.ITEMS] == ["done"] * len(gpu_check.ITEMS)
    assert bundle["provenance"]["git_revision"] and bundle["provenance"]["packages"]["torch"]
    # every row that trained has finite losses (the check's backbone does not diverge)
    trained = [run for item in found.values() for run in item.get("runs", []) if run["status"] == "ok"]
    assert trained and all(run["losses_finite"] for run in trained)
    return found


@pytest.mark.slow
@NO_GPU
def test_without_a_gpu_the_check_runs_every_item_at_tiny_sizes(tmp_path):
    """Every item in one sitting (one start-up), with --against f484bdb: that revision's own
    tree (carried in .against/, else archived from this clone's history) trains beside HEAD's,
    interleaved."""
    items = cpu_smoke(tmp_path, "--against", "f484bdb")
    check_strategies(items["strategies"])
    check_precision(items["precision"], items["strategies"])
    check_knobs(items["knobs"])
    assert "no GPU visible" in items["nvml"]["skipped"]
    check_overhead(items["overhead"])
    assert items["commbench"]["links"]
    check_throughput(items["throughput"], tmp_path)
    assert "CUDA synchronisations only" in items["sync"]["skipped"]  # tests/test_sync_free.py on a GPU
    counts = items["sync"]["counts"]  # counted on any machine: one per batch size of the throughput table
    assert [c["images"] for c in counts] == list(gpu_check.CPU_SMOKE.batches)
    assert all(c["per_step"] > 0 and c["by_source"] for c in counts)
    # the profile: a real trace beside the bundle, summarised (the CPU's ops as the device)
    profile = items["profile"]
    assert (tmp_path / "bundle" / profile["trace"]).stat().st_size > 0
    assert profile["summary"]["steps"] == gpu_check.CPU_SMOKE.profile_steps
    assert 0 < profile["summary"]["busy_share"] <= 1 and profile["summary"]["gaps"]

    text = (tmp_path / "bundle" / "gpu_check.md").read_text()
    assert text.startswith("# GPU check: CPU") and "## throughput: done" in text
    assert "host-device syncs" in text and "not throughput figures" in text
    assert "- synchronisations counted, tiny at" in text


def check_strategies(item: dict) -> None:
    runs = {run["run_id"]: run for run in item["runs"]}
    # every registered strategy is tried: run, or skipped with the reason the machine gives
    assert {run["entry"]["strategy"] for run in runs.values()} == {cls.name for cls in REGISTERED}
    assert runs["dp-w2-b2-s0"]["status"] == "skipped" and "GPUs" in runs["dp-w2-b2-s0"]["reason"]
    for run_id in ("single-w1-b2-s0", "ddp-w2-b2-s0", "ddp-fp16-w2-b2-s0", "ddp-bf16-w2-b2-s0",
                   "ddp-powersgd-w2-b2-s0", "ps-colocated-w2-b2-s0"):
        run = runs[run_id]
        assert run["status"] == "ok" and run["images_per_second"] > 0, run
        assert run["backend"] == ("none" if run_id.startswith("single") else "gloo")
        if "powersgd" not in run_id and not run_id.startswith("single"):  # low rank: its own sums
            assert run["bytes_sent_per_iter"] == pytest.approx(run["theory_bytes_sent_per_iter"], rel=1e-6)

    # the sharded strategies: fsdp both ways, each rank holding half of what ddp's holds
    for run_id in ("zero-w2-b2-s0", "fsdp-w2-b2-s0", "fsdp-keep-w2-b2-s0"):
        assert runs[run_id]["status"] == "ok" and runs[run_id]["replicas_identical"], runs[run_id]
    assert runs["fsdp-w2-b2-s0"]["owned_state_mb"] < runs["zero-w2-b2-s0"]["owned_state_mb"] < (
        runs["ddp-w2-b2-s0"]["owned_state_mb"])
    assert all(run["peak_memory_mb"] > 0 for run in runs.values() if run["status"] == "ok")
    plain = runs["ddp-w2-b2-s0"]["bytes_sent_per_iter"]
    assert runs["ddp-fp16-w2-b2-s0"]["bytes_sent_per_iter"] == pytest.approx(plain / 2, rel=1e-6)
    assert runs["ddp-bf16-w2-b2-s0"]["bytes_sent_per_iter"] == pytest.approx(plain / 2, rel=1e-6)


def check_precision(item: dict, strategies: dict) -> None:
    """The CPU smoke's grid (gpu_check.precision_grid): each path launched once."""
    precision = [r for r in item["runs"] if r["strategy"] == "single"]
    assert [(r["precision"], r["channels_last"], r["time_split"]) for r in precision] == [
        ("fp32", False, True), ("bf16", True, True), ("fp16", False, False)]
    assert all(r["status"] == "ok" for r in precision), precision
    assert all(r["compute_share"] > 0 for r in precision[:-1])
    assert precision[-1]["compute_share"] is None  # the time split off: the data wait only
    # every other strategy's own 16-bit path, on the detector through the launcher and loop:
    # each launched in one of bf16 and fp16, and each of the two launched by some strategy
    sixteen = {(r["strategy"], r["precision"]): r for r in item["runs"] if r["strategy"] != "single"}
    assert {s for s, _ in sixteen} == {cls.name for cls in REGISTERED if cls.name != "single"}
    launched = {key: r for key, r in sixteen.items() if r["status"] == "ok"}
    assert {p for _, p in launched} == {"bf16", "fp16"}
    assert {s for s, _ in launched} == {"ddp", "ps", "zero", "fsdp"}, sorted(sixteen)
    assert all(r["replicas_identical"] for r in launched.values()), launched
    # FSDP2's MixedPrecisionPolicy gathers 16-bit weights: fewer bytes than its fp32 run
    fsdp32 = next(r for r in strategies["runs"] if r["run_id"] == "fsdp-w2-b2-s0")
    assert sixteen[("fsdp", "bf16")]["bytes_sent_per_iter"] < fsdp32["bytes_sent_per_iter"]
    assert sixteen[("ps", "fp16")]["status"] == "skipped" and "bf16" in sixteen[("ps", "fp16")]["reason"]
    assert sixteen[("dp", "bf16")]["status"] == "skipped" and "GPUs" in sixteen[("dp", "bf16")]["reason"]


def check_knobs(item: dict) -> None:
    """Each speed knob beside the default, interleaved (compile is tests/test_speed.py's on CPU)."""
    knobs = {run["name"]: run for run in item["runs"]}
    assert list(knobs) == ["b2-bf16", "b2-bf16-fused", "b2-bf16-channels_last"], list(knobs)
    assert all(run["status"] == "ok" and run["losses_finite"] for run in knobs.values()), knobs
    assert knobs["b2-bf16-fused"]["reference"] == "b2-bf16" and knobs["b2-bf16-fused"]["optimizer"] == "fused"


def check_overhead(item: dict) -> None:
    """Each strategy at one process beside single, in one process: single brackets each one."""
    protocol = gpu_check.CPU_SMOKE.protocol
    overhead = {run["name"]: run for run in item["runs"]}
    assert {name.split("-")[0] for name in overhead} == {cls.name for cls in REGISTERED}
    single = overhead["single-w1-b2-amp-bf16-s0"]
    timed = [run for run in overhead.values() if run["status"] == "ok"]
    others = [run for run in timed if run is not single]
    assert len(others) >= 4 and all(run["repeats"] == protocol.repeats for run in others)
    # S A S B ... S: single's segments are one more than the others' together, per repeat
    assert single["repeats"] == protocol.repeats * len(others) + 1
    for run in timed:  # every repeat replayed the same batches (benchmarks/segments.py, Replay)
        assert len(run["batches"]) == 1, run
    for run in others:  # the interval comes from the repeats: it holds their median
        assert run["reference"] == single["name"] and run["ratio"] > 0
        assert run["low"] <= run["images_per_second"] <= run["high"], run
        # the median lies among its segments, at the rows' rounding (3 significant figures:
        # a relative 0.5 %; the segments are kept to 2 decimals)
        rounding, segments = 1 + 5e-3, run["segments"]
        assert min(segments) / rounding <= run["images_per_second"] <= max(segments) * rounding
    assert overhead["ps-colocated-w1-b2-amp-bf16-s0"]["status"] == "ok"  # one process: colocated
    assert overhead["dp-w1-b2-amp-bf16-s0"]["status"] == "skipped"


def check_throughput(item: dict, tmp_path) -> None:
    protocol = gpu_check.CPU_SMOKE.protocol
    table = {run["name"]: run for run in item["runs"]}
    # the knobs joined the throughput item's worker (one sitting has both), then the recipe run
    assert list(table) == ["b2-fp32", "b2-bf16", "b2-bf16-f484bdb", "b2-bf16-fused",
                           "b2-bf16-channels_last", "recipe run (kept)"]
    assert all(0 <= table[n]["data_share"] < 1 and table[n]["repeats"] == protocol.repeats
               for n in ("b2-fp32", "b2-bf16", "b2-bf16-f484bdb")), table
    # f484bdb's tree trained the same setting, each repeat on the same replayed batches (its
    # own loader's: their digest differs from HEAD's); HEAD's row reads its ratio to it
    assert table["b2-bf16-f484bdb"]["tree"] == "f484bdb" and table["b2-bf16"]["tree"] == "HEAD"
    assert table["b2-bf16"]["reference"] == "b2-bf16-f484bdb" and table["b2-bf16"]["ratio"] > 0
    assert all(len(table[n]["batches"]) == 1 for n in ("b2-fp32", "b2-bf16", "b2-bf16-f484bdb"))
    # the real R50-FPN with the check's own backbone, a few steps at 64 px: finite
    recipe = table["recipe run (kept)"]
    assert recipe["model"] == "fasterrcnn_resnet50_fpn" and recipe["losses_finite"], recipe
    # the recipe's single run, kept where report.predict.compute.preset: gpu-check reads it
    kept = tmp_path / "results" / "runs" / "gpu-check" / "single-w1-b2-s0" / "train_summary.json"
    assert json.loads(kept.read_text())["images_per_second"] > 0
    (baseline,) = single_inputs([load_run(kept.parent)])  # as the report reads a compute run
    assert baseline["baseline"] and baseline["compute"] > 0


def test_the_precision_grid_on_a_gpu_launches_every_strategy_in_both_16_bit_precisions():
    """On a GPU the precision item launches the whole grid; the CPU smoke (above) each path once."""
    single, others = gpu_check.precision_grid(1, whole=True)
    assert [(e["precision"], cl, split) for e, cl, split in single] == [
        ("fp32", False, True), ("fp32", True, True), ("bf16", False, True), ("bf16", True, True),
        ("fp16", False, True), ("fp16", True, True), ("fp32", False, False)]
    assert {(e["strategy"], e["precision"]) for e, _, _ in others} == {
        (cls.name, p) for cls in REGISTERED if cls.name != "single" for p in ("bf16", "fp16")}
    # the CPU smoke's: a strategy's other precision only where that one would not launch
    _, smoke = gpu_check.precision_grid(2, whole=False, launches=lambda e: e["strategy"] != "ps")
    by = {}
    for entry, _, _ in smoke:
        by.setdefault(entry["strategy"], []).append(entry["precision"])
    assert by["ps"] == ["bf16", "fp16"] and all(len(p) == 1 for s, p in by.items() if s != "ps")
    assert {p[0] for p in by.values()} == {"bf16", "fp16"}


def test_the_two_calls_of_a_sitting_run_every_item_and_fit_a_device_command():
    """benchmarks/gpu_sitting.md's two commands: call 1 --quick (QUICK_ITEMS), call 2 --quick
    --only SECOND_CALL; together every item; each within the device tool's 2000 characters."""
    assert sorted(gpu_check.QUICK_ITEMS + gpu_check.SECOND_CALL) == sorted(gpu_check.ITEMS)
    text = (REPO / "benchmarks" / "gpu_sitting.md").read_text()
    commands = [block.split("\n", 2)[2].strip() for block in text.split("```")[1::2]]
    assert len(commands) == 2 and all(len(c) <= 2000 for c in commands), [len(c) for c in commands]
    first, second = commands
    assert "gpu_check.py --quick --against f484bdb" in first and "--only" not in first
    assert f"gpu_check.py --quick --only {' '.join(gpu_check.SECOND_CALL)} " in second


def test_against_reads_a_carried_tree_else_archives_the_revision(tmp_path):
    """--against REV: .against/REV where it was carried (a GPU host has no history), else
    `git archive REV` of this clone, unpacked; an unknown revision is refused with the remedy."""
    tree = gpu_check.against_tree("6985bbf", tmp_path)
    carried = REPO / ".against" / "6985bbf"
    assert tree == carried if carried.exists() else tree == tmp_path / "against" / "6985bbf"
    assert (tree / "pipeline" / "training" / "train.py").is_file()
    assert (tree / "params.yaml").read_text() == subprocess.run(
        ["git", "-C", str(REPO), "show", "6985bbf:params.yaml"], capture_output=True, text=True).stdout
    with pytest.raises(SystemExit, match="no-such-rev.*git archive no-such-rev"):
        gpu_check.against_tree("no-such-rev", tmp_path)
