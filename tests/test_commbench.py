"""The communication benchmark on this machine: two real gloo processes under torchrun time
send/recv, all-reduce and broadcast over message sizes and fit latency and bandwidth per
primitive; time the detector's compute alone and both at once, and FSDP2's on it."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from pipeline.commbench import in_step, shared_compute
from pipeline.commbench.links import sizes
from pipeline.config import schema
from pipeline.config.params import load_resolved
from pipeline.costmodel import bands
from pipeline.costmodel import in_step as in_step_fit
from pipeline.costmodel.network import measured_network
from pipeline.runtime.records.commbench import CommbenchRecord

from .conftest import HANG_S, REPO
from .test_strategies import PARALLEL


def commbench_config(backend: str, **settings) -> schema.CommbenchStage:
    """What the commbench stage reads: PARALLEL over `backend`, the demo's tiny model at 64 px,
    and the commbench `settings`."""
    model = load_resolved(REPO / "params.yaml", preset="demo").model
    return schema.CommbenchStage(parallel=schema.replaced(PARALLEL, backend=backend, timeout_s=60),
                                 commbench=schema.Commbench(**settings),
                                 model=schema.replaced(model, min_size=64, max_size=64))


def commbench(cfg: schema.CommbenchStage, processes: int, out) -> dict:
    """The stage started as the workflow's rule starts it (the launcher becomes the job's
    torchrun); its JSON."""
    argv = [sys.executable, "-m", "pipeline.launch", "--stage", "commbench", "--processes",
            str(processes), "--config", json.dumps(cfg.model_dump()), "--out", str(out)]
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_two_gloo_processes_fit_latency_and_bandwidth(tmp_path):
    out = tmp_path / "commbench.json"
    # No assertion here is on how fast anything is (that is a benchmark's job, and a busy
    # machine inverts timings): sizes up to 256 KiB and one image a step are enough to fit and
    # check the record (the fast tier's budget).
    cfg = commbench_config("gloo", min_bytes=4096, max_bytes=2**18, repeats=3,
                           compute_images=1, compute_repeats=3, retries=1)
    found = commbench(cfg, 2, out)
    assert found["backend"] == "gloo" and found["processes"] == 2
    assert set(found["primitives"]) == {"send_recv", "all_reduce", "broadcast"}
    for name, primitive in found["primitives"].items():
        assert primitive["bytes"] == sizes(4096, 2**18) == [4096 * 2**i for i in range(7)]
        seconds = primitive["seconds"]
        assert all(s > 0 and math.isfinite(s) for s in seconds), (name, seconds)
        # A busy machine can fit a slope at or below zero over sizes this small; the record then
        # says so with no bandwidth (the report words it), never a negative or infinite one.
        beta, bandwidth = primitive["beta_s_per_byte"], primitive["bandwidth_gbit_s"]
        assert math.isfinite(beta), (name, primitive)
        assert (bandwidth is None) == (beta <= 0), (name, primitive)
        assert bandwidth is None or math.isclose(bandwidth, 8 / beta / 1e9), (name, primitive)
        assert len(primitive["relative_residuals"]) == len(seconds)
    # the detector's forward + backward, rank 0 alone and both processes at once
    shared = found["shared_compute"]
    assert shared["images"] == 1 and shared["repeats"] == 3 and shared["alone_s"] > 0
    assert shared["factor"] == shared["together_s"] / shared["alone_s"] > 0, shared
    assert found["provenance"]["git_revision"] and found["provenance"]["backend"] == "gloo"
    # Every measurement carries its check against the band of a quiet machine (bands.py): its
    # attempts (more than one where the first was outside), the kept one, and the reason where
    # all stayed outside; the JSON lists those. A busy CI machine may mark some: not asserted.
    checks = [primitive["check"] for primitive in found["primitives"].values()]
    checks += [shared["check"], found["calibrations"]["checks"]["fsdp"]]
    for check in checks:
        assert 1 <= len(check["attempts"]) <= 1 + cfg.commbench.retries and 0 <= check["kept"] < len(check["attempts"])
        assert (check["disturbed"] is None) == (check["attempts"][check["kept"]]["score"] <= 1), check
        assert all(a["score"] > 1 for a in check["attempts"][:-1]), check  # repeated only when outside
    assert len(found["disturbed"]) == sum(check["disturbed"] is not None for check in checks)
    assert found["bands"] == bands.BANDS_TEXT and shared["expected"] >= 1.0
    assert all(len(p["relative_spread"]) == len(p["seconds"]) for p in found["primitives"].values())
    assert shared["alone_spread"] >= 0 and shared["together_spread"] >= 0
    # the exchange inside a step: every repeat together also exchanged as a step does, in
    # turn DDP's last bucket after compute, a server's messages after it, DDP's first bucket
    # during it; the terms fitted from those timings, named (costmodel/in_step.py)
    terms = shared["in_step"]
    timings = terms["timings"]
    assert terms["processes"] == 2 and terms["images"] == 1
    assert len(timings["compute_s"]) == 3 and all(len(row) == 2 for row in timings["compute_s"])
    assert timings["patterns"] == ["after_all_reduce", "after_send_recv", "during"]  # one repeat of each
    model = shared_compute.step_of(cfg.model, 1, torch.device("cpu")).model
    assert terms["buckets"] == in_step.ddp_buckets(model) and sum(terms["buckets"]) == sum(
        p.numel() * 4 for p in model.parameters() if p.requires_grad)
    assert terms["wait_s"] == pytest.approx(in_step_fit.wait_of(timings["compute_s"]))
    assert terms["wait_s"] >= 0 and terms["variance_s2"] >= 0 and terms["formula_wait_s"] >= 0
    assert terms["contention"] > 0 and len(timings["during_s"]) == 2  # one during repeat x 2 ranks
    assert all(math.isfinite(terms[key]) for key in ("bucket_s", "message_s"))
    assert set(terms["hook_s_per_byte"]) == {"none", "fp16", "bf16"}
    assert all(v > 0 for v in terms["hook_s_per_byte"].values())
    record = CommbenchRecord.from_json(found)  # typed, as the report reads it
    assert measured_network(record).in_step.buckets == terms["buckets"]
    # FSDP2 on the same detector, as fsdp's wrap shards it, resharding or not, beside the plain
    # step; no other strategy asks to be timed (what each costs: docs/measurements.md)
    calibrations = found["calibrations"]
    assert calibrations["images"] == 1 and calibrations["repeats"] == 3
    fsdp = calibrations["strategies"]["fsdp"]
    assert set(calibrations["strategies"]) == {"fsdp"} and set(fsdp) == {"plain_s", "reshard_s", "keep_s"}
    assert all(seconds > 0 and math.isfinite(seconds) for seconds in fsdp.values()), fsdp


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="NCCL needs a GPU; none is visible")
def test_over_nccl_every_reduction_is_on_the_gpu(tmp_path):
    """NCCL reduces only tensors on a GPU: the first GPU sitting failed here with "No backend
    type associated with device type cpu" while commbench reduced its timings as CPU tensors
    (links.reduced now puts them on the job's device)."""
    cfg = commbench_config("nccl", min_bytes=4096, max_bytes=2**20, repeats=3,
                           compute_images=1, compute_repeats=3, retries=0)
    found = commbench(cfg, 1, tmp_path / "commbench.json")
    assert found["backend"] == "nccl" and found["processes"] == 1
