"""The GPU check's measurement protocol: configurations timed in turns (A B C A B C ...), each
in segments of `timed` iterations after its own warm-up, repeated, and reduced to a median
with its 95 % interval (pipeline/measure/stats.py).

Every configuration of one source tree lives in one worker process (benchmarks/segments.py):
one start-up (imports, CUDA context, NCCL) for all of them, instead of one launch per repeat.
Configurations of another tree (`--against REV`) get a worker of their own, and the turns go
across both workers, so the two revisions see the same machine minute by minute.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from pipeline.measure.stats import Repeats, gap  # noqa: E402

SEGMENT = "SEGMENT "


@dataclass(frozen=True)
class Protocol:
    """How much each configuration is timed."""

    warmup: int  # iterations before its first segment
    timed: int  # iterations a segment times
    repeats: int  # segments per configuration, interleaved with the others'
    rewarm: int  # iterations before each later segment (its caches after the others' turns)
    # every segment replays the first warm-up's batches from the state at its end, so that
    # repeats do the same work (benchmarks/segments.py, Replay); False: the loader's next ones
    replay: bool = True


@dataclass
class Config:
    """One configuration to time: a sweep entry, its own settings over the shared overrides
    ({section: {key: value}}), and the tree it runs."""

    name: str
    entry: dict
    settings: dict = field(default_factory=dict)
    tree: Path = REPO
    facts: dict = field(default_factory=dict)  # what its rows say of it besides the figures
    segments: list = field(default_factory=list)  # the worker's replies, in order
    error: str = ""

    @property
    def repeats(self) -> Repeats:
        return Repeats.of(s["images_per_second"] for s in self.segments)

    def row(self, reference: Config | None = None) -> dict:
        """The figures of this configuration so far: the median images/s with its interval,
        how well its repeats agreed, and its gap to `reference` where given."""
        if self.error:
            return {"name": self.name, "status": "failed", "reason": self.error}
        found = self.repeats.summary()
        out = {
            "name": self.name,
            "tree": self.tree.name if self.tree != REPO else "HEAD",
            "status": "ok" if self.segments else "waiting",
            "images_per_second": found["median"],
            "low": found["low"],
            "high": found["high"],
            "repeats": found["repeats"],
            "disagreement": found["disagreement"],
            "agree": found["agree"],
            "segments": [round(s["images_per_second"], 2) for s in self.segments],
            # one digest for every segment: its repeats trained on the same batches
            "batches": sorted({s["batches"] for s in self.segments if s.get("batches")}),
            "sm_percent": median([s.get("sm_percent") for s in self.segments]),
            "data_share": median([s.get("data_share") for s in self.segments]),
            "losses_finite": all(s.get("losses_finite") for s in self.segments),
        }
        if reference is not None and reference is not self and reference.segments and self.segments:
            out.update(reference=reference.name, **gap(self.repeats, reference.repeats).summary())
        return out


def median(values):
    values = sorted(v for v in values if v is not None)
    return values[len(values) // 2] if values else None


class Worker:
    """benchmarks/segments.py over one tree, holding its configurations."""

    def __init__(self, tree: Path, configs: list[Config], overrides: dict, work: Path):
        work.mkdir(parents=True, exist_ok=True)
        setup = work / "setup.json"
        # HEAD's defaults: a knob another tree lacks is left out while it holds its default
        # (today's behaviour, which an older tree has without the knob); any other value is
        # refused by that tree (segments.load_cfg)
        defaults = yaml.safe_load((REPO / "params.yaml").read_text())["defaults"]
        setup.write_text(
            json.dumps(
                {
                    "overrides": overrides,
                    "defaults": defaults,
                    "configs": [
                        {"entry": c.entry, "settings": c.settings, "out": str(work / f"run-{i}")}
                        for i, c in enumerate(configs)
                    ],
                }
            )
        )
        self.configs, self.log = configs, work / "worker.log"
        self.process = subprocess.Popen(
            [sys.executable, str(REPO / "benchmarks" / "segments.py"), "--tree", str(tree), "--setup", str(setup)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=open(self.log, "w"),
            text=True,
        )

    def wait_built(self) -> None:
        """Every configuration built (or refused, with its reason)."""
        for config in self.configs:
            built = self.read()
            if "error" in built:
                config.error = built["error"]

    def read(self) -> dict:
        assert self.process.stdout is not None  # started with stdout=PIPE
        for line in self.process.stdout:
            if line.startswith(SEGMENT):
                return json.loads(line[len(SEGMENT) :])
        lines = [text for text in self.log.read_text().splitlines() if text.strip()]
        errors = [text for text in lines if text.startswith("error:") or "Error" in text]
        raise RuntimeError(f"the worker ({self.log}) exited: {(errors or lines or ['no output'])[-1]}")

    def ask(self, request: dict) -> dict:
        assert self.process.stdin is not None  # started with stdin=PIPE
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.read()

    def close(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None  # started with stdin=PIPE
            try:
                self.process.stdin.write(json.dumps({"quit": True}) + "\n")
                self.process.stdin.close()
                self.process.wait(timeout=60)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()


def interleave(
    configs: list[Config],
    overrides: dict,
    work: Path,
    protocol: Protocol,
    done=lambda config: None,
    profile: dict | None = None,
    turn: list[Config] | None = None,
    closing: tuple = (),
) -> list[Config]:
    """Time `configs` in turns under `protocol`; `done(config)` after each of its segments (the
    bundle rewrites its rows). A turn is `configs` in order, or `turn` (a config may come more
    than once: single bracketing each strategy), and `closing` runs once after the last turn.
    `profile` ({"config": name, "steps": n, "trace": path}) records that configuration's
    iterations under torch.profiler after the timed turns."""
    trees = list(dict.fromkeys(c.tree for c in configs))
    workers = {}
    try:
        for i, tree in enumerate(trees):
            mine = [c for c in configs if c.tree == tree]
            workers[tree] = Worker(tree, mine, overrides, work / f"tree-{i}")
        for worker in workers.values():  # started side by side: one start-up's wait, not two
            worker.wait_built()
        order = [c for _ in range(protocol.repeats) for c in (turn or configs)] + list(closing)
        for config in order:
            if not config.error:
                segment(workers[config.tree], config, protocol, done)
        if profile:
            config = next(c for c in configs if c.name == profile["config"])
            if config.error:
                raise RuntimeError(f"profiling {config.name}: {config.error}")
            worker = workers[config.tree]
            found = worker.ask(
                {
                    "profile": worker.configs.index(config),
                    "warmup": protocol.rewarm if config.segments else protocol.warmup,
                    "steps": profile["steps"],
                    "trace": str(profile["trace"]),
                }
            )
            if "error" in found:
                raise RuntimeError(f"profiling {config.name}: {found['error']}")
    finally:
        for worker in workers.values():
            worker.close()
    return configs


def segment(worker: Worker, config: Config, protocol: Protocol, done) -> None:
    """One timed segment of `config`: after the protocol's warm-up (its first) or re-warm."""
    try:
        found = worker.ask(
            {
                "config": worker.configs.index(config),
                "timed": protocol.timed,
                "warmup": protocol.rewarm if config.segments else protocol.warmup,
                "rewarm": protocol.rewarm,
                "replay": protocol.replay,
            }
        )
    except (RuntimeError, OSError) as err:  # the worker died: its configs end here
        for lost in worker.configs:
            lost.error = lost.error or str(err)
            done(lost)
        return
    if "error" in found:
        config.error = found["error"]
    else:
        config.segments.append(found)
    done(config)
