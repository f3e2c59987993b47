"""The one training loop, shared by every strategy (pipeline/strategies/).

    python -m pipeline.train --config '<preset JSON>' --run '<sweep entry JSON>' --out DIR

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
import json
import logging
import math
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import torch

from . import provenance, strategies
from .dataset import CocoDetection, collate
from .files import atomic_path, save_torch, write_json
from .model import build_model
from .params import canonical, run_id, scaled_lr
from .sampler import ShardedBatchSampler, aspect_ratio_groups

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


def train(cfg: dict, run: dict, out_dir: str | Path) -> dict:
    out_dir = Path(out_dir)
    state_dir = out_dir / "state"
    strategy = strategies.get(run["strategy"])
    train_cfg, data_cfg = cfg["train"], cfg["data"]
    ctx = strategy.start(run, train_cfg["threads"])
    global_batch = run["images_per_worker"] * ctx.world_size
    base_lr = scaled_lr(train_cfg, global_batch)
    seed = train_cfg["seed"]
    if ctx.device.type == "cpu":
        torch.use_deterministic_algorithms(True)
    seed_everything(seed)

    dataset = CocoDetection(data_cfg["root"], "train", train=True,
                            horizontal_flip=data_cfg["horizontal_flip"])
    groups = aspect_ratio_groups(dataset.aspect_ratios(), data_cfg["aspect_ratio_groups"])
    sampler = ShardedBatchSampler(len(dataset), run["images_per_worker"], seed, ctx.rank,
                                  ctx.world_size, groups)
    loader_seed = torch.Generator()
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate,
                                         num_workers=data_cfg["workers"], generator=loader_seed,
                                         persistent_workers=False)
    model = build_model(cfg["model"], dataset.num_classes).to(ctx.device)
    model = strategy.wrap(model, ctx)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=base_lr,
                                momentum=train_cfg["momentum"], weight_decay=train_cfg["weight_decay"])

    run_fingerprint = fingerprint(cfg, run)
    live_log = state_dir / "iterations.jsonl"
    checkpoint = load_checkpoint(state_dir, run_fingerprint)
    start_epoch, step, train_seconds = 0, 0, 0.0
    if checkpoint is not None:
        strategy.unwrap(model).load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch, step = checkpoint["epoch"] + 1, checkpoint["step"]
        train_seconds = checkpoint["train_seconds"]
        truncate_log(live_log, step)
        log.info("resuming %s after epoch %d (step %d)", out_dir, checkpoint["epoch"], step)
    else:
        shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True, exist_ok=True)

    total_steps = train_cfg["epochs"] * len(sampler)
    progress = Progress(total_steps, step, train_cfg["print_every"], ctx.is_main)
    log.info("run %s: %d images, %d per worker x %d workers, lr %.4g, %d threads, device %s",
             run, len(dataset), run["images_per_worker"], ctx.world_size, base_lr, ctx.threads,
             ctx.device)
    sync = torch.cuda.synchronize if ctx.device.type == "cuda" else (lambda: None)
    model.train()
    with live_log.open("a") as log_file:
        for epoch in range(start_epoch, train_cfg["epochs"]):
            # Seeds derive from (seed, rank, epoch) so that a resumed epoch replays exactly.
            seed_everything(seed + 1000 * ctx.rank + 7919 * epoch)
            loader_seed.manual_seed(seed + epoch)
            sampler.set_epoch(epoch)
            epoch_start = time.perf_counter()
            tick = time.perf_counter()
            for images, targets in loader:
                images = [image.to(ctx.device, non_blocking=True) for image in images]
                targets = [{k: (v.to(ctx.device) if torch.is_tensor(v) else v) for k, v in t.items()}
                           for t in targets]
                lr = learning_rate(train_cfg, base_lr, step, epoch)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                t_data = time.perf_counter() - tick

                t0 = time.perf_counter()
                loss_dict = model(images, targets)
                loss = sum(loss_dict.values())
                if not torch.isfinite(loss):
                    values = {k: float(v) for k, v in loss_dict.items()}
                    raise TrainingError(
                        f"non-finite loss {values} at epoch {epoch}, step {step + 1}; the last "
                        f"good checkpoint is {state_dir / 'checkpoint.pt'} (if any). Lower "
                        "train.base_lr or raise train.warmup_iters, and check the boxes of the data")
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                sync()
                t_compute = time.perf_counter() - t0

                t1 = time.perf_counter()
                t_comm = strategy.step(model, optimizer)
                sync()
                t_step = time.perf_counter() - t1

                step += 1
                now = time.perf_counter()
                record = {"step": step, "epoch": epoch, "lr": lr, "images": len(images) * ctx.world_size,
                          "loss": loss.item(), **{k: loss_dict[k].item() for k in LOSS_TERMS},
                          "time_data": t_data, "time_compute": t_compute,
                          "time_communication": t_comm, "time_optimizer": t_step - t_comm,
                          "time_iter": now - tick,
                          "elapsed": train_seconds + now - epoch_start}
                log_file.write(json.dumps(record) + "\n")
                log_file.flush()
                progress.update(record, total_steps)
                tick = time.perf_counter()
            train_seconds += time.perf_counter() - epoch_start
            if ctx.is_main:
                save_torch({"fingerprint": run_fingerprint, "epoch": epoch, "step": step,
                            "train_seconds": train_seconds,
                            "model": strategy.unwrap(model).state_dict(),
                            "optimizer": optimizer.state_dict()}, state_dir / "checkpoint.pt")
    progress.close()
    summary = summarise(live_log, run, ctx, base_lr, global_batch, train_seconds)
    if ctx.is_main:
        save_torch({"model": strategy.unwrap(model).state_dict(), "num_classes": dataset.num_classes,
                    "model_cfg": cfg["model"]}, out_dir / "model_final.pt")
        with atomic_path(out_dir / "iterations.jsonl") as tmp:
            shutil.copyfile(live_log, tmp)
        summary["provenance"] = provenance.collect(
            {k: cfg[k] for k in ("data", "model", "train")}, seed=seed, world_size=ctx.world_size,
            threads=ctx.threads, device=str(ctx.device), backend=ctx.backend)
        write_json(out_dir / "train_summary.json", summary)
    strategy.finish(ctx)
    return summary


def summarise(log_path: Path, run: dict, ctx, base_lr: float, global_batch: int,
              train_seconds: float) -> dict:
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    steady = records[WARMUP_ITERATIONS_EXCLUDED:] or records
    times = np.array([r["time_iter"] for r in steady])
    split = {k: float(np.mean([r[f"time_{k}"] for r in steady]))
             for k in ("data", "compute", "communication", "optimizer")}
    epochs = sorted({r["epoch"] for r in records})
    epoch_loss = [float(np.mean([r["loss"] for r in records if r["epoch"] == e])) for e in epochs]
    return {
        "run_id": run_id(run),
        "strategy": run["strategy"], "world_size": run["world_size"],
        "images_per_worker": run["images_per_worker"], "global_batch": global_batch,
        "lr": base_lr, "device": str(ctx.device), "backend": ctx.backend, "threads": ctx.threads,
        "status": "ok", "reason": "",
        "epochs": len(epochs), "iterations": len(records), "train_seconds": train_seconds,
        "images_per_second": float(sum(r["images"] for r in steady) / times.sum()),
        "sec_per_iter": {"mean": float(times.mean()), "p50": float(np.percentile(times, 50)),
                         "p95": float(np.percentile(times, 95))},
        "time_split": split, "timing_excludes_first_iterations": WARMUP_ITERATIONS_EXCLUDED,
        "epoch_loss": epoch_loss,
        "final_loss": epoch_loss[-1] if epoch_loss else math.nan,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Train one sweep entry (see module docstring).")
    parser.add_argument("--config", required=True, help="resolved preset as JSON (data, model, train)")
    parser.add_argument("--run", required=True, help="sweep entry as JSON")
    parser.add_argument("--out", required=True, help="run directory")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        train(json.loads(args.config), json.loads(args.run), args.out)
    except TrainingError as err:
        raise SystemExit(f"error: {err}") from None


if __name__ == "__main__":
    main()
