"""Data-parallel strategies with real torch.distributed process groups (gloo on CPU).

* On a model whose loss is a mean over samples, one step of ddp and of ps (both placements)
  leaves the same weights as `single` on the merged batch.
* ps sends every replica the first worker's BatchNorm buffers, as DDP takes rank 0's.
* dp's scatter splits by sample; dp itself runs where there are GPUs.
* Faster R-CNN under torchrun: identical replicas, bytes as the theory says, uneven shards
  without a hang, and a 2-node job on 127.0.0.1 that matches the 1-node one.
"""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.multiprocessing as mp
from torch import nn

from pipeline import strategies
from pipeline.config import schema, stages
from pipeline.config.params import canonical
from pipeline.data.dataset import CocoDetection
from pipeline.launch import command
from pipeline.strategies.dp import gather_outputs, scatter_by_sample
from pipeline.strategies.sweep import run_id, runs
from pipeline.training.precision import Precision

from .conftest import HANG_S, REPO, free_port, gone, signal_each, small_config, stopped_when, wait_for

PARALLEL = schema.Parallel(backend="gloo", nnodes=1, rdzv_endpoint="127.0.0.1:29400",
                           sync_batchnorm=False, powersgd_rank=2, timeout_s=60, max_restarts=0,
                           crash_retries=0)
GLOBAL_BATCH = 8
# Left to the full suite: the fast tier keeps one case of each code path (README).
SLOW = pytest.mark.slow
TOLERANCE = 1e-6  # float32 sums in another order


def filled(entry: dict) -> strategies.Run:
    """A run made by hand: its strategy's options not given at their defaults."""
    return strategies.lookup(entry["strategy"]).filled(**entry)


def toy_model(batchnorm: bool = False) -> nn.Module:
    torch.manual_seed(0)
    layers = [nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)]
    if batchnorm:
        layers.insert(1, nn.BatchNorm1d(16))
    return nn.Sequential(*layers)


def toy_batch():
    generator = torch.Generator().manual_seed(1)
    return torch.randn(GLOBAL_BATCH, 6, generator=generator), torch.randn(GLOBAL_BATCH, 3, generator=generator)


def one_step(model, runtime, ctx, x, y, steps: int = 1, precision: str = "fp32", slow_shard=None):
    optimizer = runtime.optimizer(list(model.parameters()), lr=0.1, momentum=0.9, weight_decay=1e-4)
    amp = Precision(precision, ctx.device, runtime.grad_scaler)  # the loop's autocast and loss scaling
    for _ in range(steps):
        if ctx.shard is not None and ctx.shard == slow_shard:
            time.sleep(0.05)  # a straggler: the others may run ahead of it, within the bound
        if ctx.shard is not None:
            shard = slice(ctx.shard * len(x) // ctx.shards, (ctx.shard + 1) * len(x) // ctx.shards)
            with amp.autocast():
                loss = nn.functional.mse_loss(model(x[shard]), y[shard])  # a mean over samples
            optimizer.zero_grad()
            amp.backward(loss)
        runtime.step(model, amp.optimizer(optimizer), ctx)
    runtime.consolidate(model, optimizer, ctx)  # as before a checkpoint or the run's report
    return runtime.model_state(model)  # the whole model's, gathered where it is sharded


def _worker(rank, world, port, run, out_dir, batchnorm, steps, precision="fp32", slow_shard=None):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    runtime = strategies.get(filled(run), PARALLEL).runtime()
    ctx = runtime.start(threads=1)
    model = runtime.wrap(toy_model(batchnorm), ctx)
    x, y = toy_batch()
    result = one_step(model, runtime, ctx, x, y, steps, precision, slow_shard)
    torch.save({"state": result, "role": ctx.role, "shard": ctx.shard,
                "facts": runtime.rank_facts(ctx)}, os.path.join(out_dir, f"rank{rank}.pt"))
    runtime.finish(ctx)


def run_processes(run: dict, processes: int, tmp_path, batchnorm=False, steps=1,
                  precision="fp32", slow_shard=None) -> list[dict]:
    mp.spawn(_worker, args=(processes, free_port(), run, str(tmp_path), batchnorm, steps, precision,
                            slow_shard), nprocs=processes, join=True)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(processes)]


def single_result(steps=1, precision="fp32"):
    runtime = strategies.get(strategies.Single.filled(workers=1), PARALLEL).runtime()
    ctx = runtime.start(threads=1)
    x, y = toy_batch()
    return one_step(toy_model(), runtime, ctx, x, y, steps, precision)


@pytest.mark.parametrize("run, processes", [
    ({"strategy": "ddp", "workers": 2, "comm_hook": "none"}, 2),
    pytest.param({"strategy": "ddp", "workers": 4, "comm_hook": "none"}, 4, marks=SLOW),
    ({"strategy": "ps", "workers": 2, "placement": "colocated"}, 2),
    pytest.param({"strategy": "ps", "workers": 2, "placement": "dedicated"}, 3, marks=SLOW),
    pytest.param({"strategy": "ps", "workers": 2, "placement": "colocated", "servers": 2}, 2,
                 marks=SLOW),
    pytest.param({"strategy": "ps", "workers": 2, "placement": "dedicated", "servers": 2}, 4,
                 marks=SLOW),
    # zero at 2 processes stays in the fast tier through test_sharded_strategies_count_their_
    # bytes_against_theory (replicas identical, bytes as theory says): the fast tier's budget
    pytest.param({"strategy": "zero", "workers": 2}, 2, marks=SLOW),
    # fsdp at 2 processes stays in the fast tier through the mixed-precision step (against
    # single) and the torchrun bytes test (identical replicas): the fast tier's budget
    pytest.param({"strategy": "fsdp", "workers": 2, "reshard_after_forward": True}, 2, marks=SLOW),
    pytest.param({"strategy": "fsdp", "workers": 2, "reshard_after_forward": False}, 2, marks=SLOW),
], ids=["ddp-w2", "ddp-w4", "ps-colocated-w2", "ps-dedicated-w2", "ps-colocated-k2-w2",
        "ps-dedicated-k2-w2", "zero-w2", "fsdp-w2", "fsdp-keep-w2"])
def test_one_step_equals_single_on_the_merged_batch(run, processes, tmp_path):
    reference = single_result(steps=2)
    results = run_processes(run, processes, tmp_path, steps=2)
    assert results[0]["state"]  # rank 0 holds the whole model (fsdp: gathered on rank 0 only)
    for result in (r for r in results if r["state"]):
        for name, value in reference.items():
            assert torch.allclose(result["state"][name], value, atol=TOLERANCE, rtol=0), (result["role"], name)
    moved = (reference["0.weight"] - toy_model().state_dict()["0.weight"]).abs().max()
    assert moved > 100 * TOLERANCE  # the step really changed the weights


@pytest.mark.parametrize("run", [pytest.param({"strategy": "zero", "workers": 1}, marks=SLOW),
                                 {"strategy": "fsdp", "workers": 1, "reshard_after_forward": True}],
                         ids=["zero", "fsdp"])
def test_sharded_strategies_at_one_worker_step_bit_identically_to_single(run, tmp_path):
    """One rank holds every partition and every shard: nothing is rounded differently."""
    reference = single_result(steps=2)
    (result,) = run_processes(run, 1, tmp_path, steps=2)
    assert all(torch.equal(result["state"][name], value) for name, value in reference.items())


# Under autocast the forward runs in 16 bits on each worker's shard, and the shards' rounding
# differs from the merged batch's; the weights stay fp32. Measured: at most 2.7e-4 apart after
# two steps (bf16, 8 mantissa bits) and 3.4e-5 (fp16, 11); held to these bounds. FSDP gathers
# 16-bit weights (MixedPrecisionPolicy) where autocast casts fp32 ones: the same rounding.
AMP_TOLERANCE = {"bf16": 1e-3, "fp16": 2e-4}


@pytest.mark.parametrize("run, processes, precision", [
    pytest.param({"strategy": "ddp", "workers": 2, "comm_hook": "none"}, 2, "bf16", marks=SLOW),
    pytest.param({"strategy": "ps", "workers": 2, "placement": "colocated"}, 2, "bf16", marks=SLOW),
    pytest.param({"strategy": "ddp", "workers": 2, "comm_hook": "none"}, 2, "fp16", marks=SLOW),
    ({"strategy": "fsdp", "workers": 2, "precision": "bf16"}, 2, "bf16"),
    pytest.param({"strategy": "fsdp", "workers": 2, "precision": "fp16"}, 2, "fp16", marks=SLOW),
], ids=["ddp-w2-bf16", "ps-colocated-w2-bf16", "ddp-w2-fp16", "fsdp-w2-bf16", "fsdp-w2-fp16"])
def test_mixed_precision_steps_equal_single_within_the_stated_tolerance(run, processes, precision, tmp_path):
    reference = single_result(steps=2, precision=precision)
    results = run_processes(run, processes, tmp_path, steps=2, precision=precision)
    worst = max((result["state"][name] - value).abs().max().item()  # fsdp: rank 0 holds it
                for result in results if result["state"] for name, value in reference.items())
    print(f"{run['strategy']} {precision}: largest difference from single {worst:.2e}")
    assert worst <= AMP_TOLERANCE[precision]
    fp32 = single_result(steps=2)
    assert any(not torch.equal(fp32[name], reference[name]) for name in fp32)  # autocast was on


@SLOW
def test_ps_replicas_take_the_first_workers_batchnorm_buffers(tmp_path):
    results = run_processes({"strategy": "ps", "workers": 2, "placement": "dedicated"}, 3,
                            tmp_path, batchnorm=True)
    worker0 = next(r for r in results if r["shard"] == 0)
    worker1 = next(r for r in results if r["shard"] == 1)
    # What the first worker's own forward pass measured: the running mean of its shard.
    model = toy_model(batchnorm=True)
    x, _ = toy_batch()
    model(x[:GLOBAL_BATCH // 2])
    expected = model.state_dict()["1.running_mean"]
    for result in results:
        assert torch.allclose(result["state"]["1.running_mean"], expected, atol=1e-6), result["role"]
    assert torch.equal(worker0["state"]["1.running_var"], worker1["state"]["1.running_var"])


def test_dp_scatter_splits_samples_not_tensors():
    images = [torch.full((3, 10 + i, 12), float(i)) for i in range(5)]
    targets = [{"boxes": torch.tensor([[0.0, 0.0, 1.0 + i, 1.0]]), "labels": torch.tensor([i])} for i in range(5)]
    chunks = scatter_by_sample((images, targets), [torch.device("cpu")] * 2)
    assert [len(c[0]) for c in chunks] == [2, 3] or [len(c[0]) for c in chunks] == [3, 2]
    rejoined = [img for c in chunks for img in c[0]]
    assert all(torch.equal(a, b) for a, b in zip(rejoined, images))  # whole images, in order
    assert [t["labels"].item() for c in chunks for t in c[1]] == list(range(5))
    assert len(scatter_by_sample((images[:1],), [torch.device("cpu")] * 2)) == 1  # fewer samples
    losses = gather_outputs([{"loss": torch.tensor(1.0)}, {"loss": torch.tensor(3.0)}], "cpu")
    assert losses["loss"].item() == 2.0
    detections = gather_outputs([[{"boxes": 1}], [{"boxes": 2}, {"boxes": 3}]], "cpu")
    assert [d["boxes"] for d in detections] == [1, 2, 3]


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"DataParallel needs 2 GPUs; this machine has {torch.cuda.device_count()}")
def test_dp_trains_faster_rcnn_on_gpus(small_dataset, tmp_path):
    from pipeline.training.train import train

    cfg = small_config(small_dataset, epochs=1)
    run = strategies.DataParallel.filled(workers=2, images_per_worker=2)
    summary = train(stages.view(cfg, "train"), run, tmp_path / "dp")
    assert summary["status"] == "ok" and summary["global_batch"] == 4
    assert summary["epoch_loss"][0] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the reasons given on CPU-only machines")
def test_unavailable_runs_say_why(monkeypatch):
    monkeypatch.setattr("pipeline.runtime.distributed.available_cores", lambda: 4)

    def why(run, parallel=PARALLEL):
        return strategies.get(filled(dict(run, images_per_worker=2)), parallel).unavailable()

    assert "DataParallel needs at least 2 GPUs" in why({"strategy": "dp", "workers": 2})
    assert "5 processes per node but 4 CPU core(s)" in why(
        {"strategy": "ps", "workers": 4, "placement": "dedicated"})
    assert why({"strategy": "ddp", "workers": 3, "comm_hook": "none"}) is None
    assert "NCCL needs GPUs" in why({"strategy": "ddp", "workers": 2, "comm_hook": "none"},
                                    schema.replaced(PARALLEL, backend="nccl"))
    assert "do not split evenly over 2 nodes" in why(
        {"strategy": "ddp", "workers": 3, "comm_hook": "none"}, schema.replaced(PARALLEL, nnodes=2))


# ---- Faster R-CNN under the real launcher (torchrun) -------------------------------------

def launched(cfg: schema.Config, run, out, rdzv_endpoint: str | None = None) -> list[str]:
    """The training command the launcher execs for `run`, with what the train stage reads; on
    one node, torchrun's rendezvous on a port free now (not one picked when the module began,
    which another process may have taken since: the run's config keeps its own)."""
    if rdzv_endpoint is None and cfg.parallel.nnodes == 1:
        rdzv_endpoint = f"127.0.0.1:{free_port()}"
    return command(stages.view(cfg, "train"), run, str(out), rdzv_endpoint=rdzv_endpoint)


def torchrun_train(cfg: schema.Config, run, out, extra_env=None, launcher=None):
    argv = launcher or launched(cfg, run, out)
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=HANG_S,
                            env={**os.environ, **(extra_env or {})})
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads((out / "train_summary.json").read_text())


def records(path):
    skip = ("time_", "elapsed")
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(skip)}
            for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def trained(detection_cfg, tmp_path_factory):
    """`trained(entry)`: the run directory of `entry` trained on detection_cfg through the
    launcher, once per module; the tests that read the same run share it (the suite's budget)."""
    out, done = tmp_path_factory.mktemp("trained"), {}

    def train(entry: dict):
        key = json.dumps(entry, sort_keys=True)
        if key not in done:
            cfg = schema.replaced(detection_cfg, sweep=[entry])
            run_dir = out / str(len(done))
            torchrun_train(cfg, next(iter(runs(cfg).values())), run_dir)
            done[key] = run_dir  # a failed run is not shared: the next test trains it again
        return done[key]
    return train


def summary_of(run_dir):
    return json.loads((run_dir / "train_summary.json").read_text())


@pytest.fixture(scope="module")
def detection_cfg(small_dataset):
    cfg = small_config(small_dataset, epochs=1, images_per_worker=5)  # 24 images: uneven shards
    return schema.replaced(cfg, parallel={**PARALLEL.model_dump(), "rdzv_endpoint": f"127.0.0.1:{free_port()}"})


@pytest.mark.parametrize("entry", [
    {"strategy": "ddp", "workers": 2},
    pytest.param({"strategy": "ps", "workers": 2, "placement": "colocated"}, marks=SLOW),
    pytest.param({"strategy": "ps", "workers": 1, "placement": "dedicated"}, marks=SLOW),
    pytest.param({"strategy": "ps", "workers": 2, "placement": "dedicated", "servers": 2}, marks=SLOW),
], ids=["ddp", "ps-colocated", "ps-dedicated", "ps-dedicated-k2"])
# Every comm hook's bytes against theory, through the launcher: the GPU check's CPU smoke
# (tests/test_gpu_check.py).
def test_faster_rcnn_replicas_identical_and_bytes_match_theory(detection_cfg, trained, entry):
    cfg = detection_cfg
    summary = summary_of(trained(entry))
    assert summary["status"] == "ok" and summary["replicas_identical"]
    workers = summary["processes"] - (entry.get("servers", 1) if entry.get("placement") == "dedicated" else 0)
    images = len(CocoDetection(cfg.data.root, "train", train=True))
    assert images % (workers * 5)  # shards end in a short batch (dropped): the uneven case
    assert summary["iterations"] == math.ceil(images / workers) // 5
    assert summary["global_batch"] == 5 * workers
    for rank in summary["ranks"]:
        for direction in ("sent", "received"):
            measured = rank["bytes_per_iteration"][direction]
            theory = rank["theory_bytes_per_iteration"][direction]
            assert measured == pytest.approx(theory, rel=1e-9), (rank, direction)
            assert measured > 0
    # Every process keeps its own time split (a wait shows on one side only): the first
    # worker's is the summary's, from the same iterations of the log it writes; every worker
    # timed its compute.
    splits = [rank["time_split"] for rank in summary["ranks"]]
    first_worker = next(i for i, rank in enumerate(summary["ranks"]) if rank["role"] != "server")
    assert splits[first_worker] == pytest.approx(summary["time_split"], rel=1e-9)
    assert all(split["compute"] > 0 for rank, split in zip(summary["ranks"], splits, strict=True)
               if rank["role"] != "server"), splits


# ---- the sharded strategies beside ddp, on Faster R-CNN ------------------------------------

@pytest.fixture(scope="module")
def sharded_runs(trained) -> dict[str, dict]:
    """ddp, zero and fsdp at 2 workers, each trained once through the launcher."""
    return {strategy: summary_of(trained({"strategy": strategy, "workers": 2}))
            for strategy in ("ddp", "zero", "fsdp")}


def test_sharded_strategies_count_their_bytes_against_theory(sharded_runs):
    ddp, zero, fsdp = (sharded_runs[s] for s in ("ddp", "zero", "fsdp"))
    assert all(s["status"] == "ok" and s["replicas_identical"] for s in (zero, fsdp))
    m = fsdp["ranks"][0]["gradient_bytes"]
    assert m == ddp["ranks"][0]["gradient_bytes"] == zero["ranks"][0]["gradient_bytes"]
    # FSDP: each unit all-gathered in forward, again in backward, its gradients reduce-scattered
    for rank in fsdp["ranks"]:
        assert rank["bytes_per_iteration"] == rank["theory_bytes_per_iteration"]
        assert rank["theory_bytes_per_iteration"]["sent"] == pytest.approx(3 * (2 - 1) / 2 * m)
    # ZeRO-1: DDP's all-reduce, then each rank broadcasts its partition of whole tensors (its
    # share is uneven, so over the ranks): 3(N-1)/N M each way per rank on average
    for direction in ("sent", "received"):
        measured = sum(r["bytes_per_iteration"][direction] for r in zero["ranks"])
        theory = sum(r["theory_bytes_per_iteration"][direction] for r in zero["ranks"])
        assert measured == pytest.approx(theory, rel=1e-9) and theory == pytest.approx(2 * 1.5 * m)
        assert all(r["bytes_per_iteration"][direction] > m for r in zero["ranks"])  # beyond ddp's M


@SLOW
def test_fsdp_in_bf16_gathers_16_bit_weights_beside_fp32_batchnorm(detection_cfg, sharded_runs, tmp_path):
    """MixedPrecisionPolicy on the detector: its BatchNorm layers gathered in fp32 beside the
    16-bit units, the gradients reduce-scattered in fp32."""
    cfg = schema.replaced(detection_cfg, sweep=[{"strategy": "fsdp", "workers": 2, "precision": "bf16"}])
    summary = torchrun_train(cfg, next(iter(runs(cfg).values())), tmp_path / "run")
    assert summary["status"] == "ok" and summary["replicas_identical"]
    assert summary["precision"] == "bf16"
    m = summary["ranks"][0]["gradient_bytes"]
    fp32 = sharded_runs["fsdp"]["ranks"][0]["bytes_per_iteration"]["sent"]
    for rank in summary["ranks"]:
        theory = rank["theory_bytes_per_iteration"]["sent"]
        assert theory == pytest.approx((2 * m / 2 + m) / 2)  # two 16-bit gathers, an fp32 reduce
        # measured: BatchNorm's weights go at 32 bits, a sliver above theory's 16
        assert theory < rank["bytes_per_iteration"]["sent"] < 1.01 * theory
        assert rank["bytes_per_iteration"]["sent"] < 0.7 * fp32
        assert rank["memory"]["state"] == sharded_runs["fsdp"]["ranks"][rank["rank"]]["memory"]["state"]


def test_memory_is_measured_per_process_and_ordered_as_theory_says(sharded_runs):
    m = sharded_runs["ddp"]["ranks"][0]["gradient_bytes"]
    held = {name: [r["memory"]["state"] for r in summary["ranks"]]
            for name, summary in sharded_runs.items()}
    for summary in sharded_runs.values():
        for rank in summary["ranks"]:
            assert rank["memory"]["measure"] == "peak resident set (getrusage ru_maxrss)"
            assert rank["memory"]["peak_bytes"] > 50 * 2**20  # a process with torch loaded
    # DDP: every rank holds the whole weights, gradients and momentum
    assert held["ddp"] == [{"parameters": m, "gradients": m, "optimizer": m}] * 2
    # ZeRO-1: the whole weights and gradients, the momentum split between the ranks
    assert all(h["parameters"] == h["gradients"] == m for h in held["zero"])
    assert sum(h["optimizer"] for h in held["zero"]) == m and all(h["optimizer"] < m for h in held["zero"])
    # FSDP: half of everything on each rank (each tensor's dim 0 padded to an even size)
    assert all(m / 2 <= h[part] <= 1.01 * m / 2 for h in held["fsdp"] for part in h)
    busiest = {name: max(sum(h.values()) for h in hs) for name, hs in held.items()}
    assert busiest["fsdp"] < busiest["zero"] < busiest["ddp"]


@SLOW
def test_sharded_strategies_at_one_worker_train_faster_rcnn_as_single(detection_cfg, tmp_path):
    """Through the launcher, a whole epoch: bit for bit the weights `single` ends with."""
    finals = {}
    for entry in ({"strategy": "single", "workers": 1}, {"strategy": "zero", "workers": 1},
                  {"strategy": "fsdp", "workers": 1}):
        cfg = schema.replaced(detection_cfg, sweep=[dict(entry, images_per_worker=8)],
                              eval={"every_epochs": 0})
        torchrun_train(cfg, next(iter(runs(cfg).values())), tmp_path / entry["strategy"])
        finals[entry["strategy"]] = torch.load(tmp_path / entry["strategy"] / "model_final.pt",
                                               weights_only=True)["model"]
    for strategy in ("zero", "fsdp"):
        assert finals[strategy].keys() == finals["single"].keys()
        assert all(torch.equal(finals[strategy][k], v) for k, v in finals["single"].items()), strategy


@SLOW
@pytest.mark.parametrize("strategy", ["zero", "fsdp"])
def test_sharded_strategies_resume_after_kill_to_the_uninterrupted_result(detection_cfg, strategy, tmp_path):
    """kill -9 of the whole job after its first checkpoint (mid-epoch); the rerun resumes from
    the consolidated (zero) or gathered (fsdp) state to the weights of a run never stopped."""
    cfg = schema.replaced(detection_cfg, train={"epochs": 2, "checkpoint_every": 1},
                          sweep=[{"strategy": strategy, "workers": 2}])
    run = next(iter(runs(cfg).values()))
    whole = torchrun_train(cfg, run, tmp_path / "whole")
    killed = tmp_path / "killed"
    process = subprocess.Popen(launched(cfg, run, killed), cwd=REPO, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    checkpoint = killed / "state" / "checkpoint.pt"
    # torchrun and its workers held still once a checkpoint of the unfinished run is there, and
    # it is read while they are: the state the kill lands on, not one the run has moved past
    _, held = stopped_when(process.pid, lambda: checkpoint.exists() and not (killed / "train_summary.json").exists(),
                           "a checkpoint of the unfinished run", process=process)
    saved = torch.load(checkpoint, weights_only=True)["train_state"]
    signal_each(held, signal.SIGKILL)
    process.wait()
    wait_for(lambda: gone(held), "the killed run's processes to be gone")  # before its rerun
    assert saved["step"] < whole["iterations"] and not (killed / "train_summary.json").exists()
    resumed = torchrun_train(cfg, run, killed)
    assert resumed["resumed_at_steps"] == [saved["step"]] and resumed["replicas_identical"], (
        resumed["resumed_at_steps"], saved, resumed["replicas_identical"])
    final = [torch.load(d / "model_final.pt", weights_only=True)["model"] for d in (tmp_path / "whole", killed)]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert records(killed / "iterations.jsonl") == records(tmp_path / "whole" / "iterations.jsonl")


@SLOW
def test_two_nodes_on_localhost_match_one_node(detection_cfg, trained, tmp_path):
    cfg = schema.replaced(detection_cfg, sweep=[{"strategy": "ddp", "workers": 2}])
    run = next(iter(runs(cfg).values()))
    one_node = trained({"strategy": "ddp", "workers": 2})  # the same run on one node

    two = schema.replaced(cfg, parallel={"nnodes": 2, "rdzv_endpoint": f"127.0.0.1:{free_port()}"})
    argv = launched(two, run, tmp_path / "two-nodes")
    assert "--nnodes=2" in argv and f"--rdzv-endpoint={two.parallel.rdzv_endpoint}" in argv
    nodes = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [node.communicate(timeout=HANG_S) for node in nodes]
    assert all(node.returncode == 0 for node in nodes), [o[1][-2000:] for o in outputs]
    one = records(one_node / "iterations.jsonl")
    two_nodes = records(tmp_path / "two-nodes" / "iterations.jsonl")
    assert [r["step"] for r in one] == [r["step"] for r in two_nodes]
    for a, b in zip(one, two_nodes):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5)


def test_launch_records_a_skipped_run(detection_cfg, tmp_path):
    cfg = stages.view(detection_cfg, "train")  # what the workflow sends the launcher
    run = {"strategy": "dp", "workers": 2, "images_per_worker": 2, "data_mode": "real", "seed": 0}
    result = subprocess.run([sys.executable, "-m", "pipeline.launch", "--config", canonical(cfg.model_dump()),
                             "--entry", canonical(run), "--out", str(tmp_path / "dp")],
                            cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stderr
    summary = json.loads((tmp_path / "dp" / "train_summary.json").read_text())
    if torch.cuda.device_count() < 2:
        assert summary["status"] == "skipped" and "needs at least 2 GPUs" in summary["reason"]
        assert summary["provenance"]["packages"]["torch"] == torch.__version__.split("+")[0]
        assert (tmp_path / "dp" / "iterations.jsonl").read_text() == ""


@SLOW
def test_powersgd_sends_less_and_keeps_replicas_identical(detection_cfg, tmp_path):
    cfg = schema.replaced(detection_cfg, sweep=[{"strategy": "ddp", "workers": 2, "comm_hook": "powersgd"}],
                          train={"epochs": 2})  # PowerSGD compresses from the third iteration on: 2 of 4
    run = next(iter(runs(cfg).values()))
    summary = torchrun_train(cfg, run, tmp_path / "run")
    assert summary["replicas_identical"] and summary["iterations"] == 4
    rank = summary["ranks"][0]
    plain = rank["gradient_bytes"]  # 2(N-1)/N = 1 for N = 2: uncompressed, one M each way
    assert rank["bytes_per_iteration"]["sent"] < 0.75 * plain


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2,
                    reason=f"SyncBatchNorm over NCCL needs 2 GPUs; this machine has {torch.cuda.device_count()}")
def test_ddp_sync_batchnorm_on_gpus(detection_cfg, tmp_path):
    cfg = schema.replaced(detection_cfg, parallel={"backend": "nccl", "sync_batchnorm": True},
                          sweep=[{"strategy": "ddp", "workers": 2}])
    run = next(iter(runs(cfg).values()))
    summary = torchrun_train(cfg, run, tmp_path / "run")
    assert summary["status"] == "ok" and summary["replicas_identical"] and summary["backend"] == "nccl"


def test_what_a_job_asks_for_per_node():
    two_nodes = schema.replaced(PARALLEL, nnodes=2)
    single = strategies.get(strategies.Single.filled(workers=1, images_per_worker=8), two_nodes)
    assert (single.nodes(), single.processes_per_node()) == (1, 1)  # never spread over nodes
    ps = strategies.get(strategies.ParameterServer.filled(workers=3, images_per_worker=2,
                                                          placement="dedicated"), two_nodes)
    assert (ps.nodes(), ps.processes(), ps.processes_per_node()) == (2, 4, 2)


@SLOW
def test_sharded_ps_resumes_to_the_uninterrupted_result(detection_cfg, tmp_path):
    """Two shards, each server holding its own parameters' momentum: a checkpoint gathers
    them all, and a run stopped after it and rerun ends with the weights of one that was not."""
    cfg = schema.replaced(detection_cfg, train={"epochs": 2, "checkpoint_every": 1},
                          sweep=[{"strategy": "ps", "workers": 2, "placement": "colocated", "servers": 2}])
    run = next(iter(runs(cfg).values()))
    assert run.option("servers") == 2 and run_id(run) == "ps-colocated-k2-w2-b5-s0"
    whole = torchrun_train(cfg, run, tmp_path / "whole")
    interrupted = tmp_path / "interrupted"
    subprocess.run(launched(cfg, run, interrupted) + ["--max-steps", "3"], cwd=REPO,
                   capture_output=True, text=True, timeout=HANG_S, check=True)
    assert (interrupted / "state" / "checkpoint.pt").exists()
    resumed = torchrun_train(cfg, run, interrupted)
    assert resumed["resumed_at_steps"] == [2] and resumed["replicas_identical"]  # the last checkpoint before step 3
    final = [torch.load(d / "model_final.pt", weights_only=True)["model"] for d in (tmp_path / "whole", interrupted)]
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])
    assert records(interrupted / "iterations.jsonl") == records(tmp_path / "whole" / "iterations.jsonl")
    assert whole["iterations"] == resumed["iterations"] == 4


@SLOW
def test_bounded_staleness_lets_a_worker_run_ahead_within_the_bound(tmp_path):
    """S = 1, 2 workers, the second a straggler: the first runs one update ahead of it (no
    more); the server counts how stale each gradient was; the replicas end identical."""
    run = {"strategy": "ps", "workers": 2, "placement": "dedicated", "staleness": 1}
    results = run_processes(run, 3, tmp_path, steps=6, slow_shard=1)
    server = next(r for r in results if r["role"] == "server")
    facts = server["facts"]
    assert facts["max_ahead"] == 1  # a worker was ahead of the slowest, and never by more than S
    histogram = facts["staleness_histogram"]
    assert sum(histogram.values()) == 2 * 6  # every gradient of both workers, once
    assert any(k >= 1 for k, n in histogram.items() if n)  # some were computed on stale weights
    reference = results[0]["state"]
    for result in results:
        assert all(torch.equal(result["state"][k], reference[k]) for k in reference), result["role"]
    assert not torch.equal(reference["0.weight"], toy_model().state_dict()["0.weight"])
    runtime = strategies.get(filled(dict(run, images_per_worker=4)), PARALLEL).runtime()
    summary = runtime.summary_facts([{"staleness_histogram": histogram}])
    assert summary["staleness"]["bound"] == 1 and sum(summary["staleness"]["histogram"].values()) == 12


@SLOW
def test_bounded_staleness_trains_faster_rcnn_and_reports_what_it_observed(detection_cfg, tmp_path):
    cfg = schema.replaced(detection_cfg, sweep=[{"strategy": "ps", "workers": 2, "placement": "dedicated", "staleness": 1}])
    run = next(iter(runs(cfg).values()))
    assert run_id(run) == "ps-dedicated-ssp1-w2-b5-s0"
    summary = torchrun_train(cfg, run, tmp_path / "run")
    assert summary["status"] == "ok" and summary["replicas_identical"]  # gathered at the end
    staleness = summary["staleness"]
    assert staleness["bound"] == 1
    assert sum(staleness["histogram"].values()) == 2 * summary["iterations"]  # every gradient
    assert max(int(k) for k in staleness["histogram"]) <= 3  # the other worker: 2S + 1 updates at most
