"""The one training loop, shared by every strategy (pipeline/strategies/).

    python -m pipeline.train --config '<preset JSON>' --entry '<sweep entry JSON>' --out DIR

Writes, in DIR:
  iterations.jsonl    one record per iteration: step, epoch, losses, lr, images, seconds split
                      into data wait, forward+backward, and the strategy's step
  model_final.pt      the trained weights
  train_summary.json  status, throughput, time per iteration, provenance (written last)
and keeps DIR/state/ (checkpoint.pt after every epoch, the live iterations log) so that a
rerun with the same settings resumes from the last finished epoch instead of starting over.
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from . import provenance, strategies
from .dataset import CocoDetection, collate
from .files import atomic_path, save_torch, write_json
from .model import build_model
from .params import canonical, run_id, scaled_lr, variant
from .sampler import ShardedBatchSampler, aspect_ratio_groups
from .strategies.base import gradient_bytes

log = logging.getLogger("train")
LOSS_TERMS = ("loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg")
WARMUP_ITERATIONS_EXCLUDED = 5  # first iterations (allocator, caches) left out of timing stats


class TrainingError(RuntimeError):
    """Training cannot go on; the message says where it stopped and what to change."""


def learning_rate(train: dict, base_lr: float, step: int, epoch: int) -> float:
    """Linear warm-up over the first iterations, then multi-step decay at epoch boundaries."""
    warmup = 1.0
    if step < train["warmup_iters"]:
        alpha = step / train["warmup_iters"]
        warmup = train["warmup_factor"] * (1 - alpha) + alpha
    decays = sum(1 for milestone in train["lr_steps"] if epoch >= milestone)
    return base_lr * warmup * train["lr_gamma"] ** decays


def fingerprint(cfg: dict, run: dict) -> str:
    """What a checkpoint must match to be resumed: everything that shapes the training."""
    relevant = {k: cfg[k] for k in ("data", "model", "train")} | {"run": run}
    return hashlib.sha256(canonical(relevant).encode()).hexdigest()[:16]


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)


class Progress:
    """A progress bar on a terminal, a plain line every `every` iterations otherwise."""

    def __init__(self, total: int, done: int, every: int, enabled: bool):
        self.every, self.enabled = every, enabled
        self.bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="it", dynamic_ncols=True)

    def update(self, record: dict, total: int) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.set_postfix(epoch=record["epoch"], loss=f"{record['loss']:.3f}",
                                 lr=f"{record['lr']:.2g}", refresh=False)
            self.bar.update(1)
        elif record["step"] % self.every == 0 or record["step"] == total:
            log.info("step %d/%d epoch %d loss %.4f lr %.4g %.3fs/it", record["step"], total,
                     record["epoch"], record["loss"], record["lr"], record["time_iter"])

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def load_checkpoint(state_dir: Path, expected: str) -> dict | None:
    path = state_dir / "checkpoint.pt"
    if not path.exists():
        return None
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    if checkpoint.get("fingerprint") != expected:
        log.info("%s was written with other settings; starting over", path)
        return None
    return checkpoint


def truncate_log(path: Path, last_step: int) -> None:
    """Keep the records up to the checkpoint; later ones belong to the interrupted epoch."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines()
            if line.strip() and json.loads(line)["step"] <= last_step]
    with atomic_path(path) as tmp:
        tmp.write_text("".join(line + "\n" for line in kept))


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def restore(state_dir: Path, run_fingerprint: str, model, optimizer, ctx) -> tuple[int, int, float]:
    """Resume from the last epoch's checkpoint if it was made with these settings, else start
    clean. Returns (first epoch to run, steps done, training seconds so far)."""
    if ctx.rank == 0 and load_checkpoint(state_dir, run_fingerprint) is None:
        shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)
    barrier()  # nobody reads the state directory while rank 0 may be clearing it
    checkpoint = load_checkpoint(state_dir, run_fingerprint)
    if checkpoint is None:
        return 0, 0, 0.0
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    if ctx.reports:
        truncate_log(state_dir / "iterations.jsonl", checkpoint["step"])
        log.info("resuming %s after epoch %d (step %d)", state_dir.parent, checkpoint["epoch"],
                 checkpoint["step"])
    return checkpoint["epoch"] + 1, checkpoint["step"], checkpoint["train_seconds"]


def to_device(images, targets, device):
    images = [image.to(device, non_blocking=True) for image in images]
    targets = [{k: (v.to(device) if torch.is_tensor(v) else v) for k, v in t.items()}
               for t in targets]
    return images, targets


def forward_backward(model, optimizer, images, targets, where: str) -> tuple[torch.Tensor, dict]:
    loss_dict = model(images, targets)
    loss = sum(loss_dict.values())
    if not torch.isfinite(loss):
        values = {k: float(v) for k, v in loss_dict.items()}
        raise TrainingError(
            f"non-finite loss {values} at {where}; the last good checkpoint (if any) stays in "
            "the run's state/ directory. Lower train.base_lr or raise train.warmup_iters, and "
            "check the boxes of the data")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    return loss, loss_dict


def train(cfg: dict, run: dict, out_dir: str | Path, max_steps: int | None = None) -> dict:
    """Train one sweep entry; `max_steps` stops early (the equivalence check's single step)."""
    out_dir = Path(out_dir)
    state_dir = out_dir / "state"
    strategy = strategies.get(run["strategy"])
    train_cfg, data_cfg = cfg["train"], cfg["data"]
    ctx = strategy.start(run, cfg["parallel"], train_cfg["threads"])
    per_process = strategy.batch_per_process(run)
    global_batch = per_process * ctx.shards
    base_lr = scaled_lr(train_cfg, global_batch)
    seed = train_cfg["seed"]
    if ctx.device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    seed_everything(seed)  # the same initial weights in every process

    dataset = CocoDetection(data_cfg["root"], "train", train=True,
                            horizontal_flip=data_cfg["horizontal_flip"])
    groups = aspect_ratio_groups(dataset.aspect_ratios(), data_cfg["aspect_ratio_groups"])
    sampler = ShardedBatchSampler(len(dataset), per_process, seed, ctx.shard or 0, ctx.shards,
                                  groups)
    loader_seed = torch.Generator()
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                                         num_workers=data_cfg["workers"], generator=loader_seed)
    model = build_model(cfg["model"], dataset.num_classes).to(ctx.device)
    model = strategy.wrap(model, ctx)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=base_lr,
                                momentum=train_cfg["momentum"], weight_decay=train_cfg["weight_decay"])
    run_fingerprint = fingerprint(cfg, run)
    start_epoch, step, train_seconds = restore(state_dir, run_fingerprint, strategy.unwrap(model),
                                               optimizer, ctx)

    total_steps = train_cfg["epochs"] * len(sampler)
    progress = Progress(total_steps, step, train_cfg["print_every"], ctx.reports)
    log.info("rank %d (%s): %d images, %d per process x %d shards, lr %.4g, %d threads, %s, %s",
             ctx.rank, ctx.role, len(dataset), per_process, ctx.shards, base_lr, ctx.threads,
             ctx.device, ctx.backend)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    live_log = state_dir / "iterations.jsonl"
    moved = {"sent": 0, "received": 0, "iterations": 0}  # this process's traffic, this session
    model.train()
    with open(live_log if ctx.reports else os.devnull, "a") as log_file:
        for epoch in range(start_epoch, train_cfg["epochs"]):
            # Seeds derive from (seed, shard, epoch) so that a resumed epoch replays exactly.
            seed_everything(seed + 1000 * (ctx.shard or 0) + 7919 * epoch)
            loader_seed.manual_seed(seed + epoch)
            sampler.set_epoch(epoch)
            # A dedicated parameter server has no data: its iteration is the strategy's step.
            batches = loader if ctx.shard is not None else itertools.repeat(None, len(sampler))
            epoch_start = tick = time.perf_counter()
            for batch in batches:
                lr = learning_rate(train_cfg, base_lr, step, epoch)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                record = {"step": step + 1, "epoch": epoch, "lr": lr}
                if batch is not None:
                    images, targets = to_device(*batch, ctx.device)
                    record["time_data"] = time.perf_counter() - tick
                    t0 = time.perf_counter()
                    loss, loss_dict = forward_backward(model, optimizer, images, targets,
                                                       f"epoch {epoch}, step {step + 1}")
                    sync()
                    record["time_compute"] = time.perf_counter() - t0
                    record.update(images=len(images) * ctx.shards, loss=loss.item(),
                                  **{k: loss_dict[k].item() for k in LOSS_TERMS})
                t1 = time.perf_counter()
                t_comm = strategy.step(model, optimizer, ctx)
                sync()
                t_step = time.perf_counter() - t1
                traffic = strategy.traffic()
                moved["sent"] += traffic.sent
                moved["received"] += traffic.received
                moved["iterations"] += 1
                step += 1
                now = time.perf_counter()
                # DDP's all-reduce runs inside backward: the part backward waited for it counts
                # as communication, not compute.
                record.update(
                    time_compute=record.get("time_compute", 0.0) - traffic.backward_wait,
                    time_communication=t_comm + traffic.backward_wait,
                    time_optimizer=t_step - t_comm, time_iter=now - tick,
                    elapsed=train_seconds + now - epoch_start,
                    bytes_sent=traffic.sent, bytes_received=traffic.received)
                if ctx.reports:
                    log_file.write(json.dumps(record) + "\n")
                    log_file.flush()
                    progress.update(record, total_steps)
                tick = time.perf_counter()
                if step == max_steps:
                    break
            train_seconds += time.perf_counter() - epoch_start
            if step == max_steps:
                break
            if ctx.rank == 0:  # rank 0 holds the optimizer state in every strategy
                save_torch({"fingerprint": run_fingerprint, "epoch": epoch, "step": step,
                            "train_seconds": train_seconds,
                            "model": strategy.unwrap(model).state_dict(),
                            "optimizer": optimizer.state_dict()}, state_dir / "checkpoint.pt")
    progress.close()
    ranks = rank_report(strategy, model, run, ctx, moved)
    summary = None
    if ctx.reports:
        summary = summarise(live_log, run, ctx, base_lr, global_batch, train_seconds, ranks)
        save_torch({"model": strategy.unwrap(model).state_dict(), "num_classes": dataset.num_classes,
                    "model_cfg": cfg["model"]}, out_dir / "model_final.pt")
        with atomic_path(out_dir / "iterations.jsonl") as tmp:
            shutil.copyfile(live_log, tmp)
        summary["provenance"] = provenance.collect(
            {k: cfg[k] for k in ("data", "model", "train", "parallel")}, run=run, seed=seed,
            world_size=ctx.world_size, threads=ctx.threads, device=str(ctx.device),
            backend=ctx.backend)
        write_json(out_dir / "train_summary.json", summary)
    strategy.finish(ctx)
    return summary


def parameter_checksum(model) -> str:
    """Of the parameters only: DDP ranks' BatchNorm buffers differ until the next forward pass
    copies rank 0's over them."""
    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def rank_report(strategy, model, run: dict, ctx, moved: dict) -> list[dict]:
    """Every process's role, checksum of its weights, and bytes per iteration, measured and by
    theory; gathered from all ranks (the replicas must be identical)."""
    grad_bytes = gradient_bytes(strategy.unwrap(model))
    per_iteration = max(moved["iterations"], 1)
    mine = {"rank": ctx.rank, "role": ctx.role, "checksum": parameter_checksum(strategy.unwrap(model)),
            "gradient_bytes": grad_bytes,
            "bytes_per_iteration": {"sent": moved["sent"] / per_iteration,
                                    "received": moved["received"] / per_iteration},
            "theory_bytes_per_iteration": strategy.theory_bytes(run, ctx, grad_bytes)}
    if not dist.is_initialized():
        return [mine]
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def summarise(log_path: Path, run: dict, ctx, base_lr: float, global_batch: int,
              train_seconds: float, ranks: list[dict]) -> dict:
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    steady = records[WARMUP_ITERATIONS_EXCLUDED:] or records
    times = np.array([r["time_iter"] for r in steady])
    split = {k: float(np.mean([r[f"time_{k}"] for r in steady]))
             for k in ("data", "compute", "communication", "optimizer")}
    epochs = sorted({r["epoch"] for r in records})
    epoch_loss = [float(np.mean([r["loss"] for r in records if r["epoch"] == e])) for e in epochs]
    return {
        "run_id": run_id(run), "strategy": run["strategy"], "world_size": run["world_size"],
        "images_per_worker": run["images_per_worker"], "global_batch": global_batch,
        "variant": variant(run),
        "lr": base_lr, "device": str(ctx.device), "backend": ctx.backend, "threads": ctx.threads,
        "processes": ctx.world_size, "status": "ok", "reason": "",
        "epochs": len(epochs), "iterations": len(records), "train_seconds": train_seconds,
        "images_per_second": float(sum(r["images"] for r in steady) / times.sum()),
        "sec_per_iter": {"mean": float(times.mean()), "p50": float(np.percentile(times, 50)),
                         "p95": float(np.percentile(times, 95))},
        "time_split": split, "timing_excludes_first_iterations": WARMUP_ITERATIONS_EXCLUDED,
        "communication_share": split["communication"] / float(times.mean()),
        "ranks": ranks, "replicas_identical": len({r["checksum"] for r in ranks}) == 1,
        "epoch_loss": epoch_loss,
        "final_loss": epoch_loss[-1] if epoch_loss else math.nan,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train one sweep entry (see module docstring).")
    parser.add_argument("--config", required=True, help="resolved preset as JSON (data, model, train)")
    parser.add_argument("--entry", required=True,
                        help="the sweep entry as JSON (not --run: torchrun takes that for its --run-path)")
    parser.add_argument("--out", required=True, help="run directory")
    parser.add_argument("--max-steps", type=int, help="stop after this many iterations")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        train(json.loads(args.config), json.loads(args.entry), args.out, args.max_steps)
    except TrainingError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
