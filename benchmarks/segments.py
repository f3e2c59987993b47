"""Several training configurations held in ONE process and timed in turns: the GPU check's
measurement protocol (benchmarks/gpu_check.py), through a source tree's own training loop.

    python benchmarks/segments.py --tree DIR --setup SETUP.json

SETUP.json: {"overrides": {section: {key: value}}, "configs": [{"entry": {...}, "settings":
{section: {key: value}}, "out": DIR}, ...]}. The worker loads DIR's params.yaml (coco2017
preset), applies the shared overrides and then each config's own settings, and builds every
config with DIR's own `setup` (its
data, model, strategy runtime, optimizer): nothing of this file's own tree is imported, so it
drives HEAD and an older revision (`--against`, unpacked from `git archive`) alike. Then it
answers one JSON request per stdin line, one JSON reply per line on stdout after `SEGMENT `:

  {"config": i, "warmup": w, "timed": n, "rewarm": r, "replay": true}
                                           w iterations, then n timed ones: seconds, images,
                                           the data wait's share, SM % sampled meanwhile, the
                                           digest of the batches the timed ones consumed
  {"profile": i, "warmup": w, "steps": n, "trace": PATH}  n iterations under torch.profiler
                                           (CPU + CUDA activities, Python frames), exported
  {"quit": true}

A segment is bounded by two device synchronisations (one before, one after its iterations):
nothing inside it waits on the device more than the loop itself does. A failing config (its
setup or an iteration) answers {"error": ...} and the others go on.

With "replay" every segment of a config does the same work (`Replay`), so that its repeats
differ by the machine alone: a detector's step costs what its proposals, NMS and matchers
find in the images, and a model that trains on finds other proposals step by step. The first
segment's warm-up goes through the loader, and its batches are kept (as the loader gave
them: pinned, on the host; the loop copies each to the device as it trains); so are the
trained state (parameters, buffers, optimizer state) and the step at its end. Each segment
then restores that state, re-warms on the kept batches and times the next ones, the same in
every segment. The data wait's share is read from the second half of that warm-up (the
loader at its pace); the timed iterations wait on no loader.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import traceback
import typing
from pathlib import Path

SEGMENT = "SEGMENT "


class Collected:
    """The loop's iteration log, kept in memory: the records of the current segment."""

    def __init__(self):
        self.records: list[dict] = []

    def write(self, line: str) -> None:
        if line.strip():
            self.records.append(json.loads(line))

    def flush(self) -> None:
        pass


class Utilisation:
    """SM utilisation sampled every half second by NVML (a thread; nothing on the device)."""

    def __init__(self):
        self.samples: list[tuple[float, float]] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0] or 0)
            self.handle, self.nvml = pynvml.nvmlDeviceGetHandleByIndex(index), pynvml
        except Exception:  # no NVML (a CPU machine): no samples
            self.handle = None
            return
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            rates = self.nvml.nvmlDeviceGetUtilizationRates(self.handle)
            self.samples.append((time.perf_counter(), float(rates.gpu)))
            time.sleep(0.5)

    def between(self, start: float, end: float) -> float | None:
        found = sorted(u for t, u in self.samples if start <= t <= end)
        return found[len(found) // 2] if found else None


class Driver:
    """One config, built by the tree's own setup and stepped by its own loop functions: HEAD's
    `iterate`, or an older tree's `timed_iteration` + `log_record` (f484bdb)."""

    def __init__(self, loop, cfg, entry: dict, out: Path):
        import torch

        from pipeline.strategies import sweep

        self.loop, self.torch = loop, torch
        run = sweep.fill(entry, cfg)
        self.job = loop.setup(train_config(cfg), run, out)
        self.job.model.train()
        self._persistent_loader()
        self.log_file = Collected()
        # The loop's objects are the tree's own (HEAD's or another revision's), so not typed here.
        self.batches: typing.Any = None
        self.replay: typing.Any = None  # the kept batches and state ("replay" requests): replay.Replay
        self.loader_share: float | None = None  # the data wait's share of the loader-fed warm-up
        self.stopwatch: typing.Any = None
        self.per_step = self.job.global_batch
        if hasattr(loop, "iterate"):
            self.progress = loop.Progress(1, 0, 10**9, False, 1)
            self.log = loop.IterationLog(self.log_file, self.progress, self.job.precision, 10**9)
        else:
            self.progress = loop.Progress(1, 0, 10**9, False)

    def _persistent_loader(self) -> None:
        """The loop's loader with its worker processes kept across epochs (the one thing the
        harness changes, in every tree alike): an epoch ending inside a timed segment then
        costs a refill of the prefetch queue, not a fork of every worker."""
        old = self.job.loader
        if old.num_workers > 0:
            self.job.loader = type(old)(
                old.dataset,
                batch_sampler=old.batch_sampler,
                collate_fn=old.collate_fn,
                num_workers=old.num_workers,
                generator=old.generator,
                pin_memory=old.pin_memory,
                persistent_workers=True,
            )

    def _record(self, record) -> None:
        if hasattr(self.loop, "iterate"):
            self.log.write(record)
        else:
            self.loop.log_record(self.job, record, self.log_file, self.progress)

    def _batch(self):
        """The next batch: the replay's, else the loader's, a new epoch begun where the last
        one ended."""
        if self.replay is not None and self.replay.playing:
            return self.replay.next()
        batch = self._loaded()
        if self.replay is not None:
            self.replay.keep(batch)
        return batch

    def _loaded(self):
        job = self.job
        if self.batches is None:
            self.loop.begin_epoch(job)
            self.batches = iter(job.loader)
        try:
            return next(self.batches)
        except StopIteration:
            job.state.epoch, job.state.batch = job.state.epoch + 1, 0
            self.batches = None
            return self._loaded()

    def _step(self) -> None:
        job, loop = self.job, self.loop
        batch = self._batch()
        if hasattr(loop, "iterate"):
            loop.iterate(job, batch, self.stopwatch, self.log)
        else:
            pending, losses = loop.timed_iteration(job, batch, job.state.epoch, self.stopwatch)
            job.state.batch += 1
            now = time.perf_counter()
            pending.record.update(time_iter=self.stopwatch.lap_seconds(now), elapsed=self.stopwatch.elapsed(now))
            self._record(job.clock.push(pending, losses))
        self.stopwatch.lap()

    def _settle(self) -> None:
        """The queued iteration finished and recorded, the device idle."""
        self._record(self.job.clock.drain())
        if self.job.ctx.device.type == "cuda":
            self.torch.cuda.synchronize()

    def steps(self, count: int) -> None:
        from pipeline.training.state import Stopwatch

        self.stopwatch = Stopwatch(self.job.state)
        for _ in range(count):
            self._step()

    def _fresh_epoch_if_short(self, needed: int) -> None:
        """A new epoch now where this one has fewer than `needed` batches left: the loader's
        restart (its worker processes forked again) then falls outside the timed iterations."""
        job = self.job
        if self.batches is not None and len(job.sampler) - job.state.batch < needed:
            self._settle()
            job.state.epoch, job.state.batch = job.state.epoch + 1, 0
            self.batches = None

    def _replayed(self, warmup: int, rewarm: int) -> float | None:
        """Ready to replay: on the first call, `warmup` iterations from the loader, their
        batches and the state at their end kept (their data wait's share returned); on every
        call, that state restored and `rewarm` iterations on the kept batches."""
        share = None
        if self.replay is None:
            from replay import Replay  # benchmarks/replay.py, beside this script: HEAD's, for any tree

            self._fresh_epoch_if_short(warmup)
            self.replay = Replay(self.job)
            self.steps(warmup)
            self._settle()
            share = data_share(self.log_file.records[len(self.log_file.records) // 2 :])
            self.replay.freeze()
        self.replay.restore()
        self.steps(rewarm)
        self._settle()
        return share

    def segment(self, warmup: int, timed: int, utilisation: Utilisation, rewarm: int = 0, replay: bool = False) -> dict:
        if replay:
            share = self._replayed(warmup, rewarm)
            self.loader_share = share if share is not None else self.loader_share
            self.replay.consumed.clear()
        else:
            self._fresh_epoch_if_short(warmup + timed)
            self.steps(warmup)
            self._settle()
        self.log_file.records.clear()
        start = time.perf_counter()
        self.steps(timed)
        self._settle()
        end = time.perf_counter()
        records = self.log_file.records
        return {
            "seconds": end - start,
            "iterations": timed,
            "images": timed * self.per_step,
            "images_per_second": timed * self.per_step / (end - start),
            "data_share": self.loader_share if replay else data_share(records),
            "sm_percent": utilisation.between(start, end),
            "losses_finite": all(r.get("loss") == r.get("loss") for r in records),
            "losses": [r.get("loss") for r in records],
            "batches": self.replay.digest() if replay else None,
        }

    def profile(self, warmup: int, steps: int, trace: str) -> dict:
        from torch.profiler import ProfilerActivity, profile

        torch = self.torch
        if self.replay is not None:  # the timed segments' batches and state, re-warmed
            self._replayed(0, warmup)
        else:
            self._fresh_epoch_if_short(warmup + steps)
            self.steps(warmup)
            self._settle()
        activities = [ProfilerActivity.CPU]
        if self.job.ctx.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        from pipeline.training.state import Stopwatch

        self.stopwatch = Stopwatch(self.job.state)
        with profile(activities=activities, with_stack=True) as prof:
            for step in range(steps):  # the summariser's window: these annotations
                with torch.profiler.record_function(f"ProfilerStep#{step}"):
                    self._step()
            self._settle()
        Path(trace).parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(trace)  # a .gz name is written gzipped
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
        return {"trace": trace, "steps": steps}


def data_share(records: list[dict]) -> float | None:
    """The share of these iterations' time spent waiting on the loader."""
    data = sum(r.get("time_data") or 0.0 for r in records)
    iteration = sum(r.get("time_iter") or 0.0 for r in records)
    return data / iteration if iteration else None


def load_cfg(tree: Path, *overrides: dict, defaults: dict | None = None):
    """The tree's coco2017 preset with `overrides` ({section: {key: value}}) applied in order:
    its typed config (schema.Config), or for a tree from before it, its resolved dict.
    A key the tree does not know is left out while it holds its value in `defaults` (HEAD's
    params defaults: a knob at its default is the behaviour an older tree has without it), and
    refused otherwise (the same settings on every tree, or none)."""
    from pipeline.config import params

    cfg: typing.Any = params.load_resolved(tree / "params.yaml", preset="coco2017")  # the tree's: dict or typed
    typed = not isinstance(cfg, dict)
    for override in overrides:
        for section, values in override.items():
            known = set(getattr(cfg, section).model_dump() if typed else cfg[section])
            neutral = (defaults or {}).get(section) or {}
            unknown = sorted(k for k in set(values) - known if k not in neutral or values[k] != neutral[k])
            if unknown:
                raise KeyError(f"{tree}: {section} has no {', '.join(unknown)} in this tree")
            kept = {k: v for k, v in values.items() if k in known}
            if typed:
                from pipeline.config import schema

                cfg = schema.replaced(cfg, **{section: kept})
            else:
                cfg[section].update(kept)
    return cfg


def train_config(cfg):
    """What the tree's `setup` takes: its train stage's view of the typed config, or a tree's
    from before the typed config, the resolved dict itself."""
    if isinstance(cfg, dict):
        return cfg
    from pipeline.config import stages

    return stages.view(cfg, "train")


def reply(found: dict) -> None:
    sys.stdout.write(SEGMENT + json.dumps(found) + "\n")
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", required=True, help="the source tree whose loop trains")
    parser.add_argument("--setup", required=True, help="the configs, as JSON (module docstring)")
    args = parser.parse_args(argv)
    tree = Path(args.tree).resolve()
    sys.path.insert(0, str(tree))
    os.chdir(tree)  # the tree's own relative paths (its params' schema, its code digests)
    for key, value in {
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
    }.items():
        os.environ.setdefault(key, value)
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    import logging

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    from pipeline.training import train as loop

    setup = json.loads(Path(args.setup).read_text())
    drivers: list = []
    for config in setup["configs"]:
        try:
            cfg = load_cfg(tree, setup["overrides"], config.get("settings", {}), defaults=setup.get("defaults"))
            drivers.append(Driver(loop, cfg, config["entry"], Path(config["out"])))
            reply({"built": len(drivers) - 1})
        except Exception as err:
            drivers.append(f"{type(err).__name__}: {err}")
            reply({"built": len(drivers) - 1, "error": drivers[-1], "traceback": traceback.format_exc()[-2000:]})
    utilisation = Utilisation()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("quit"):
            break
        index = request.get("config", request.get("profile"))
        driver = drivers[index]
        if isinstance(driver, str):
            reply({"error": driver})
            continue
        try:
            if "profile" in request:
                reply(driver.profile(request["warmup"], request["steps"], request["trace"]))
            else:
                reply(
                    driver.segment(
                        request["warmup"],
                        request["timed"],
                        utilisation,
                        request.get("rewarm", 0),
                        request.get("replay", False),
                    )
                )
        except Exception as err:  # this config stops here; the others go on
            drivers[index] = f"{type(err).__name__}: {err}".splitlines()[0][:500]
            reply({"error": drivers[index], "traceback": traceback.format_exc()[-2000:]})
    return 0


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # process groups, loader workers and NVML threads: nothing left to wait on
