"""One offline command that checks every GPU path of the benchmark on this host and records
the figures: a Markdown and a JSON bundle with their provenance, rewritten as each timed segment
or run finishes (a sitting cut off by its time limit keeps every row it measured).

    python benchmarks/gpu_check.py [--out gpu-check] [--results results] [--quick]
        [--only ITEM...] [--against REV]

It needs no internet and no dataset: the coco2017 preset's model (R50-FPN, frozen BatchNorm,
3 trainable backbone stages) trains on synthetic COCO-layout images at COCO's sizes (640 px,
resized by the model to 800) through the project's own training loop. Its backbone is a random
ResNet-50 whose BatchNorm statistics were gathered on the check's own images
(`calibrated_backbone`): with a random backbone's statistics (mean 0, variance 1) frozen, the
detector diverged within a few steps on an H100.

The protocol (benchmarks/interleave.py, the timed items): every configuration of an item is
built in ONE worker process (benchmarks/segments.py: the tree's own `setup` and loop step, its
own strategy runtime), and the configurations take turns, A B C A B C: each segment 50 timed
iterations (the first after 20 of warm-up, each after 2 of re-warm), 3 segments each. Every
segment of a configuration does the same work: its first warm-up's batches (through the
loader) and the trained state at its end (weights, optimizer, step, random generators) are
kept, and each segment restores that state and replays those batches (a detector's step costs
what its proposals and matchers find, so new images or a model trained on would make repeats
differ by their work, not the machine). A row is the median images/s of its segments with the
95 % t-interval, whether its segments agreed within 3 % (the bundle lists those that did not),
the digest of the batches its segments consumed (one: the same work), and its gap to its
reference (a strategy to single, HEAD to --against, a knob to the default) with that ratio's
interval (pipeline/measure/stats.py). Its data share is the loader-fed warm-up's second half.
A segment is bounded by two device synchronisations; nothing inside it is added to the step.
Each item runs on its own; a failure is recorded with its one-line reason and the next runs:

  throughput   single at 2, 8 and 16 images per GPU (--quick: 2, 16), fp32 and bf16: images/s,
               the data wait's share, SM utilisation (NVML, during the segments). --against REV
               times AGAINST's settings in REV's tree too (.against/REV, from `git archive`),
               interleaved, same data, backbone file, sizes, batch and precision: HEAD's row
               reads its ratio to REV's. Knobs and profile join its worker where the call has them.
  profile      single, 16 images, bf16: 3 iterations after warm-up under torch.profiler (CPU +
               CUDA, Python frames); the trace kept as profile-trace.json.gz beside the bundle,
               summarised (pipeline/measure/profile.py): busy share, longest idle gaps and the
               host's frames in them, syncs, top kernels. Not a throughput figure (the
               profiler's overhead is in it).
  knobs        the speed knobs (pipeline/training/speed.py) beside their default, interleaved:
               torch.compile of the backbone (16 images, bf16), fused SGD (2 images, bf16;
               not --quick)
  sync         every registered strategy at one process, bf16, a few iterations with
               train.sync_debug, in one process: a host-device synchronisation by the loop, the
               strategy or the measuring fails its row, naming it (skipped on CPU); and the
               detector's step's synchronisations counted per step at each batch size, by op
               and source (benchmarks/sync_count.py; on CPU too)
  commbench    the NCCL links timed at the GPU count, and the model's compute alone and with
               every GPU's process at once (pipeline/commbench/)
  overhead     every registered strategy at one process in bf16 beside single, single
               bracketing each (S A S B S C S D S), at the smallest images per GPU (and the
               largest, but for --quick): each one's ratio to single with its interval,
               single's own repeats the machine's noise
  strategies   every registered strategy at one process per GPU (NCCL), and one run for each
               value of each of its choice options, launched as the workflow launches them
               (AT_ONCE side by side on one GPU: paths, not timings); a run the GPUs do not
               allow is listed with the reason (dp needs 2 GPUs)
  precision    single in fp32, bf16 and fp16, each with and without channels-last, and the time
               split off; every other strategy's own 16-bit path in bf16 and fp16, launched
  nvml         the utilisation sampler's GPU samples during the launched runs before it

A GPU loan is two calls (benchmarks/gpu_sitting.md has them exactly, with what comes back):
`--quick --against f484bdb` (QUICK_ITEMS: throughput, profile, sync, commbench, overhead) and
`--quick --only knobs strategies precision nvml` (SECOND_CALL). Estimated on one H100 from the
H200 sitting's times at 4eaba84 (benchmarks/measured/h200-*; an H100 ~1.2x slower): an R50-FPN
iteration 0.05 s at 2 images, 0.21 s at 16 bf16, 0.23 s at 16 fp32 on the H200; a configuration
176 iterations (20 + 3 x 50 + 3 x 2); seconds on the H100:
  call 1: python and wheels 15; start-up (data, backbone) 40; throughput with --against (6
          configurations: 165; 2 workers side by side, 6 models built: 25; restoring the state
          and the batches' digest a segment: 15) 205; profile 5; sync 20; commbench 15;
          overhead at 2 images (25 segments, 5 models, a worker; 108 on the H200) 130: about
          430 (7.2 min)
  call 2: python and wheels 15; start-up 40; knobs (the default and compile at 16 images
          bf16: 80, compiling ~60, a worker 10) 150; strategies (9 launches, AT_ONCE at a time;
          48 on the H200) 60; precision (12 launches; 68) 80: about 345 (5.8 min)
The whole check (no --quick) adds 8 images, the overhead at 16, fused SGD and the recipe's kept
run.

The recipe's single run at 2 images (fp32; not in --quick) is kept as results/runs/gpu-check/:
set report.predict.compute.preset to gpu-check and the predicted scaling uses its time per
image as the measured compute input. Without a GPU the command says so and runs the same items
at tiny sizes on CPU (gloo, 2 processes; the demo's tiny model; the protocol at 2 warm-up, 3
timed, 2 repeats; the kept recipe run is R50-FPN at 64 px; the precision item launches each
path once, `precision_grid`): CI runs that smoke (tests/test_gpu_check.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import io
import json
import math
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import one_process_entry, strategy_entries, workers_for  # noqa: E402
from benchmarks.interleave import Config, Protocol, interleave  # noqa: E402
from benchmarks.segments import free_port  # noqa: E402
from pipeline.config import params, schema, stages  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.launch import command, commbench_command, evaluation_command  # noqa: E402
from pipeline.measure import profile as profiles  # noqa: E402
from pipeline.runtime import distributed, provenance  # noqa: E402
from pipeline.runtime.files import write_json, write_text  # noqa: E402
from pipeline.runtime.records.training import RunSummary  # noqa: E402
from pipeline.strategies import REGISTERED, sweep  # noqa: E402

PRECISIONS = ("fp32", "bf16", "fp16")
BASELINE = "single-w1-b2-s0"  # the recipe's single run: the predicted scaling's compute input


@dataclass(frozen=True)
class Sizes:
    """How big each item runs: the GPU check, or its CPU smoke."""

    image_size: int  # synthetic images, square
    min_size: int  # what the model resizes them to
    iterations: int  # timed iterations of each strategy and precision run
    batches: tuple  # images per GPU of the throughput table
    table_iterations: int  # iterations of the recipe's baseline run (kept for the report)
    tiny_model: bool  # every run uses the demo's tiny model (the CPU smoke)
    protocol: Protocol  # how the timed items time each configuration (benchmarks/interleave.py)
    profile_steps: int  # iterations the profile item records


# The protocol: >= 20 warm-up and >= 50 timed iterations a segment, >= 3 segments each
# configuration, interleaved; 2 iterations of re-warm before a later segment.
ON_GPU = Protocol(warmup=20, timed=50, repeats=3, rewarm=2)
GPU = Sizes(
    image_size=640,
    min_size=800,
    iterations=20,
    batches=(2, 8, 16),
    table_iterations=15,
    tiny_model=False,
    protocol=ON_GPU,
    profile_steps=3,
)
# --quick: what a short loan of one GPU can cover (see QUICK_ITEMS)
QUICK = Sizes(
    image_size=640,
    min_size=800,
    iterations=15,
    batches=(2, 16),
    table_iterations=15,
    tiny_model=False,
    protocol=ON_GPU,
    profile_steps=3,
)
CPU_SMOKE = Sizes(
    image_size=64,
    min_size=64,
    iterations=2,
    batches=(2,),
    table_iterations=2,
    tiny_model=True,
    protocol=Protocol(warmup=2, timed=3, repeats=2, rewarm=1),
    profile_steps=2,
)
WARMUP = 5  # iterations every summary leaves out of its timings
# In this order, whatever order --only names them in: the quick sitting's first (the regression
# and the profile before anything else), nvml last (it reads the samples of the launched
# training items before it in its call).
ITEMS = ("throughput", "profile", "knobs", "sync", "commbench", "overhead", "strategies", "precision", "nvml")
QUICK_ITEMS = ("throughput", "profile", "sync", "commbench", "overhead")
# The second call of a GPU loan (benchmarks/gpu_sitting.md): `--quick --only` these
SECOND_CALL = ("knobs", "strategies", "precision", "nvml")
# On one GPU, the strategies and precision items start this many one-process runs side by side
# (each its own rendezvous port): they check paths, and their start-up (~15 s each) would
# otherwise take most of a sitting; their rows' timings are not the protocol's figures.
AT_ONCE = 4
TRACE_LIMIT = 15 * 2**20  # a file back from a GPU host is at most 16 MiB
# The speed knobs the knobs item times beside the default (pipeline/training/speed.py), each at
# the table's smallest (0) or largest (-1) images per GPU in bf16: compile where the GPU's work
# is largest; fused SGD where its step (a fixed cost a step) weighs most, and is 4x cheaper.
KNOBS_ON_GPU = (("compile", {"compile": "backbone"}, -1), ("fused", {"optimizer": "fused"}, 0))
KNOBS_ON_CPU = (("fused", {"optimizer": "fused"}, 0), ("channels_last", {"channels_last": True}, 0))
# --quick's second call: compile alone (1.3x at 16 images in bf16 on an H200; fused SGD was
# within the noise there, 1.03x), so that both calls fit a loan
KNOBS_QUICK = KNOBS_ON_GPU[:1]
# The settings HEAD is timed against another revision at (--against): the earlier sitting's
# 76.5 -> 63.9 images/s (16 images, bf16) and 47.2 -> 34.1 (2 images, fp32)
AGAINST = ((16, "bf16"), (2, "fp32"))


def overrides(sizes: Sizes, processes: int, data_root: Path, backbone: Path) -> dict:
    """What the check changes of the coco2017 preset ({section: {key: value}}), the same for
    HEAD and for an --against tree (benchmarks/segments.py applies them to that tree's own)."""
    largest = max(2 * processes * (WARMUP + sizes.iterations), max(sizes.batches) * (WARMUP + sizes.table_iterations))
    # The check's few iterations are a COCO run's first ones, so they warm up as those do:
    # `auto` resolves to 1000 iterations on COCO (an epoch is thousands of batches). At full lr
    # from the first step, 16 images per GPU went non-finite by step 11-13 on an H100 even with
    # the calibrated backbone; the lr does not change what an iteration costs.
    # 4 loader processes a run (not `auto`: a core each): several runs are held or started at
    # once, and 4 decode 16 640-px JPEGs in well under a 16-image step.
    return {
        "data": {
            "name": "gpu-check",
            "root": str(data_root),
            "fetch": None,
            "aspect_ratio_groups": 0,
            "workers": 4,
            "synthetic": {
                "seed": 2017,
                "image_size": sizes.image_size,
                "train_images": largest,
                "val_images": 2,
                "max_objects": 8,
                "clutter": 6,
            },
        },
        "model": {"backbone_weights": str(backbone), "min_size": sizes.min_size, "max_size": 1333},
        "train": {
            "epochs": 1,
            "lr_steps": [],
            "checkpoint_every": 0,
            "monitor_interval_s": 1.0,
            "warmup_iters": 1000,
            "print_every": 10,
        },
        "eval": {"every_epochs": 0},
    }


def base_config(sizes: Sizes, processes: int, data_root: Path, backbone: Path) -> schema.Config:
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017")
    return schema.replaced(cfg, **overrides(sizes, processes, data_root, backbone))


def calibrated_backbone(cfg: schema.Config, images: int = 32, batch: int = 4) -> dict:
    """A random ResNet-50 whose BatchNorm statistics are gathered on the check's own training
    images, as the model sees them (normalised and resized by its transform).

    The recipe freezes BatchNorm at the statistics the backbone comes with. Random weights come
    with mean 0 and variance 1, so each residual stage amplifies its input (a layer4 output of
    std ~40 on noise) and training diverges within a few steps on a GPU (non-finite losses
    at 8-16 images per GPU, fp32 and bf16). Statistics averaged over real images make every
    frozen BatchNorm normalise again: the backbone trains as a pretrained one would, with
    ImageNet weights neither needed nor downloaded."""
    import torch
    from torchvision.models import resnet50
    from torchvision.models.detection.transform import GeneralizedRCNNTransform
    from torchvision.transforms.v2 import functional as F

    from pipeline.data.dataset import CocoDetection

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert cfg.data.synthetic is not None  # the check trains on data it generates
    with torch.random.fork_rng(devices=[]):  # the same random weights on every sitting
        torch.manual_seed(cfg.data.synthetic.seed)
        body = resnet50(weights=None).to(device)
    for module in body.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # a cumulative average over every batch, not the last few
    transform = GeneralizedRCNNTransform(
        cfg.model.min_size, cfg.model.max_size, image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225]
    )  # FasterRCNN's own
    dataset = CocoDetection(cfg.data.root, "train", train=True)
    body.train()
    with torch.no_grad():
        for first in range(0, min(images, len(dataset)), batch):
            pictures = [
                F.to_dtype(F.to_image(dataset.load_image(i)), torch.float32, scale=True).to(device)
                for i in range(first, min(first + batch, images, len(dataset)))
            ]
            body(transform(pictures)[0].tensors)
    return {name: value.cpu() for name, value in body.state_dict().items()}


def with_model(cfg: schema.Config, sizes: Sizes, tiny: bool) -> schema.Config:
    """cfg, with the demo's tiny model at the check's size where `tiny` (the CPU smoke)."""
    if tiny:
        demo = params.load_resolved(REPO / "params.yaml", preset="demo").model
        cfg = schema.replaced(cfg, model=dict(demo.model_dump(), min_size=sizes.min_size, max_size=sizes.min_size))
    return cfg


@dataclass(frozen=True)
class Outcome:
    """One run of the check: its summary (None where it did not train: refused, unavailable on
    this machine, failed), or why not; and what the check measured beside it."""

    run_id: str
    status: str
    reason: str = ""
    summary: RunSummary | None = None
    log: str = ""  # the end of a failed run's output
    wall_seconds: float | None = None
    losses_finite: bool | None = None
    model: str | None = None


def train(cfg: schema.Config, entry: dict, out: Path, steps: int, rdzv_endpoint: str | None = None) -> Outcome:
    """`steps` iterations of one run through the launcher, as the workflow's train job starts
    it; its summary, or an exception naming what failed."""
    try:
        run = sweep.fill(entry, cfg, where="gpu check")
    except params.ParamsError as refused:  # the strategy refuses the entry (ps in fp16): why
        return Outcome(f"{entry['strategy']} (refused)", "skipped", str(refused))
    why = REGISTERED_BY_NAME[run.strategy](run, cfg.parallel).unavailable()
    if why:
        return Outcome(sweep.run_id(run), "skipped", why)
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    argv = command(stages.view(cfg, "train"), run, str(out), rdzv_endpoint=rdzv_endpoint)
    result = subprocess.run(argv + ["--max-steps", str(steps)], cwd=REPO, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RunFailed(f"{sweep.run_id(run)}: {failure_line(result.stderr)}", result.stderr[-3000:])
    summary = RunSummary.read(out / "train_summary.json")
    return Outcome(
        summary.run_id,
        summary.status,
        summary.reason,
        summary,
        wall_seconds=time.perf_counter() - started,
        losses_finite=losses_finite(out / "iterations.jsonl"),
    )


class RunFailed(RuntimeError):
    """A run that exited with an error: its one-line reason, and the end of its log."""

    def __init__(self, reason: str, log: str):
        super().__init__(reason)
        self.log = log


def failure_line(stderr: str) -> str:
    """Why a run failed, in one line: the last `error: ...` line its stages print (the failing
    rank's own error, pipeline/runtime/failure.py), else its last line."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def losses_finite(iterations: Path) -> bool | None:
    """Whether every recorded loss of a run is finite (None: no iteration recorded a loss)."""
    losses = [json.loads(line).get("loss") for line in iterations.read_text().splitlines() if line]
    losses = [loss for loss in losses if loss is not None]
    return all(math.isfinite(loss) for loss in losses) if losses else None


REGISTERED_BY_NAME = {cls.name: cls for cls in REGISTERED}


def row(found: Outcome, **extra) -> dict:
    """The figures of one run that the bundle keeps."""
    if found.status != "ok":
        return {
            "run_id": found.run_id,
            "status": found.status,
            "reason": found.reason,
            **extra,
            **({"log": found.log} if found.log else {}),
        }
    s = found.summary
    assert s is not None and s.sec_per_iter is not None  # it trained (status ok)
    mean, split = s.sec_per_iter.mean, s.time_split
    counted = [r for r in s.ranks if r.bytes_per_iteration and r.theory_bytes_per_iteration]
    busiest = max(counted, key=lambda r: r.bytes_per_iteration.sent if r.bytes_per_iteration else 0.0, default=None)
    return {
        "run_id": s.run_id,
        "status": "ok",
        **extra,
        "images_per_second": s.images_per_second,
        "sec_per_iter": mean,
        "losses_finite": found.losses_finite,
        "model": found.model,
        "data_share": (split.data or 0.0) / mean if split else None,
        # the time split off leaves the data wait only
        "compute_share": split.compute / mean if split and split.compute else None,
        "replicas_identical": s.replicas_identical,
        "bytes_sent_per_iter": busiest.bytes_per_iteration.sent if busiest and busiest.bytes_per_iteration else None,
        "theory_bytes_sent_per_iter": (
            busiest.theory_bytes_per_iteration.sent if busiest and busiest.theory_bytes_per_iteration else None
        ),
        # the process that holds the most (fsdp/zero shard it; dp's device 0 gathers)
        "peak_memory_mb": max((r.memory.peak_bytes for r in s.ranks if r.memory), default=0) / 2**20,
        "owned_state_mb": max((r.memory.state.total for r in s.ranks if r.memory and r.memory.state), default=0)
        / 2**20,
        "device": s.device,
        "backend": s.backend,
    }


class Check:
    """The items, each recorded as done, skipped or failed (with its reason). The bundle is
    rewritten as each run finishes, so a sitting cut off by its time limit still leaves every
    row it measured (its item then reads "running")."""

    def __init__(
        self, sizes: Sizes, work: Path, results: Path, gpus: int, out: Path, mode: str, against: Path | None = None
    ):
        self.sizes, self.work, self.results, self.gpus = sizes, work, results, gpus
        self.against = against  # another revision's tree, timed beside HEAD (--against)
        self.wanted: tuple = ITEMS  # the items of this call (main sets them)
        self.shared: dict = {}  # what the throughput item measured for knobs and profile
        self.profile_knob: str | None = None  # --profile-knob: the profile with one speed knob on
        self.out, self.mode = out, mode
        self.processes = gpus if gpus else 2  # one per GPU; on CPU, 2 gloo processes
        self.started = time.perf_counter()
        self.items: dict[str, dict] = {}
        self.utilisation_dirs: list[Path] = []
        self.lock = threading.Lock()
        import torch

        self.device = torch.cuda.get_device_name(0) if gpus else "CPU"
        self.provenance = provenance.collect({"sizes": dataclasses.asdict(sizes)}, world_size=self.processes)
        backbone = work / "resnet50-calibrated.pth"
        self.settings = overrides(sizes, self.processes, work / "data", backbone)
        self.cfg = base_config(sizes, self.processes, work / "data", backbone)
        assert self.cfg.data.synthetic is not None  # base_config's generated data
        synthetic.generate(self.cfg.data.root, self.cfg.data.synthetic)
        torch.save(calibrated_backbone(self.cfg), backbone)

    def bundle(self) -> dict:
        return {
            "device": self.device,
            "gpus": self.gpus,
            "mode": self.mode,
            "sizes": dataclasses.asdict(self.sizes),
            "seconds": time.perf_counter() - self.started,
            "items": self.items,
            "provenance": self.provenance,
        }

    def save(self) -> None:
        """gpu_check.md and .json as they stand (each written whole, then renamed). The JSON
        last: a sitting killed between the two leaves no row in the JSON that the page lacks."""
        with self.lock:
            bundle = json.loads(json.dumps(self.bundle()))
            write_text(self.out / "gpu_check.md", markdown(bundle))
            write_json(self.out / "gpu_check.json", bundle)

    def add(self, name: str, found: dict) -> dict:
        """One finished run's row, into the bundle at once."""
        with self.lock:
            self.items[name]["runs"].append(found)
        self.save()
        return found

    def item(self, name: str, body) -> None:
        started = time.perf_counter()
        print(f"== {name}", flush=True)
        self.items[name] = {"status": "running", "runs": []}
        self.save()
        try:
            found = body()
            self.items[name].update(status="done", **found)
        except Exception as err:  # each failure is reported, and the check goes on
            self.items[name].update(
                status="failed", reason=f"{type(err).__name__}: {err}", traceback=traceback.format_exc()[-3000:]
            )
            print(f"   failed: {err}", flush=True)
        self.items[name]["seconds"] = round(time.perf_counter() - started, 1)
        if not self.items[name]["runs"]:
            del self.items[name]["runs"]
        self.save()

    def _run(self, entry: dict, name: str, per_gpu: int, iterations: int, tiny: bool, **train_overrides) -> Outcome:
        cfg = schema.replaced(with_model(self.cfg, self.sizes, tiny), train=train_overrides)
        entry = {"images_per_worker": per_gpu, **entry}
        out = self.work / "runs" / name
        try:
            # a port of its own: runs of the GPU's items may start side by side (AT_ONCE)
            found = train(cfg, entry, out, WARMUP + iterations, f"127.0.0.1:{free_port()}")
        except RunFailed as err:
            return Outcome(name, "failed", str(err), log=err.log)
        except Exception as err:
            return Outcome(name, "failed", f"{type(err).__name__}: {err}")
        if (out / "utilisation.jsonl").exists():
            self.utilisation_dirs.append(out)
        return dataclasses.replace(found, model=cfg.model.arch)

    def _each(self, jobs: list, at_once: int = 1) -> list:
        """Run each job (a function of no arguments), `at_once` at a time; their rows in order."""
        with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
            return list(pool.map(lambda job: job(), jobs))

    def overhead(self) -> dict:
        """Every registered strategy at one process (nothing to communicate) in bf16 beside
        single, at the table's smallest images per GPU (and its largest, but for --quick),
        all in one process under the protocol, single bracketing each strategy (S A S B ...
        S): what each wrapper and the project's instrumentation cost an iteration, as a ratio
        of images/s to single with its 95 % interval, single's own repeats the machine's
        noise. Where a strategy's default cannot run on one process (ps's dedicated server
        needs a second), its first option value that can is taken."""
        ends = (self.sizes.batches[0], self.sizes.batches[-1])
        batches = ends[:1] if self.sizes is QUICK else tuple(dict.fromkeys(ends))
        rows: list[dict] = []
        for per_gpu in batches:
            configs, skipped = [], []
            for cls in REGISTERED:
                entry = dict(one_process_entry(cls, self.cfg), precision="bf16", images_per_worker=per_gpu)
                why, run_id = self._unavailable(entry)
                if why:
                    skipped.append({"name": run_id, "status": "skipped", "reason": why, "images_per_gpu": per_gpu})
                else:
                    configs.append(Config(run_id, entry, facts={"images_per_gpu": per_gpu}))
            single, others = configs[0], configs[1:]
            turn = [c for other in others for c in (single, other)] or [single]
            self._protocol(
                f"overhead-b{per_gpu}",
                configs,
                lambda c: single,  # noqa: B023 (used in this iteration)
                rows,
                skipped,
                turn=turn,
                closing=(single,),
            )
        return {"runs": rows}

    def _unavailable(self, entry: dict) -> tuple[str, str]:
        """Why this machine cannot run `entry` ("" if it can), and its run id."""
        try:
            run = sweep.fill(entry, self.cfg, where="gpu check")
        except params.ParamsError as refused:
            return str(refused), f"{entry['strategy']} (refused)"
        return REGISTERED_BY_NAME[run.strategy](run, self.cfg.parallel).unavailable() or "", sweep.run_id(run)

    def _protocol(
        self,
        name: str,
        configs: list,
        reference,
        rows: list,
        skipped: list | tuple = (),
        turn=None,
        closing=(),
        profile=None,
        **extra,
    ) -> list:
        """Time `configs` under the sizes' protocol (benchmarks/interleave.py), their rows in
        `rows` rewritten after every segment; `reference(config)` is what its gap is read
        against (None: no gap)."""
        item = name.split("-")[0]
        first = len(rows)
        rows.extend(skipped)
        at = len(rows)
        rows.extend({"name": c.name, "status": "waiting"} for c in configs)

        def done(_config):
            for i, config in enumerate(configs):
                rows[at + i] = dict(config.row(reference(config)), **extra, **config.facts)
            with self.lock:
                self.items[item]["runs"] = rows
            self.save()

        overrides = self.overrides()
        interleave(
            configs,
            overrides,
            self.work / name,
            self.sizes.protocol,
            done=done,
            turn=turn,
            closing=closing,
            profile=profile,
        )
        done(None)
        return rows[first:]

    def overrides(self, tiny: bool | None = None) -> dict:
        """The check's settings for a worker (segments.py), the tiny model's in the CPU smoke."""
        found = json.loads(json.dumps(self.settings))
        if self.sizes.tiny_model if tiny is None else tiny:
            found["model"] = with_model(self.cfg, self.sizes, True).model.model_dump()
        return found

    def strategies(self) -> dict:
        def job(i: int, entry: dict):
            def run():
                found = self._run(entry, f"strategy-{i}", 2, self.sizes.iterations, self.sizes.tiny_model)
                print(f"   {found.run_id}: {found.status}", flush=True)
                return self.add("strategies", row(found, entry=entry))

            return run

        at_once = AT_ONCE if self.gpus == 1 else 1
        return {
            "runs": self._each([job(i, e) for i, e in enumerate(strategy_entries(self.processes))], at_once=at_once),
            **side_by_side(at_once),
        }

    def precision(self) -> dict:
        """single's grid (each precision with and without channels-last; the time split off),
        then every other strategy's own 16-bit path (FSDP2's MixedPrecisionPolicy and sharded
        loss scaler, ZeRO's sharded step, DDP's and the server's autocast) in bf16 and fp16 at
        the check's process count, skipped with the strategy's reason where it refuses one
        (`precision_grid`; the CPU smoke launches each path once)."""

        def job(i: int, entry: dict, channels_last: bool, time_split: bool):
            def run():
                found = self._run(
                    entry,
                    f"precision-{i}",
                    2,
                    self.sizes.iterations,
                    self.sizes.tiny_model,
                    channels_last=channels_last,
                    time_split=time_split,
                )
                print(
                    f"   {entry['strategy']} {entry['precision']} channels_last={channels_last} "
                    f"time_split={time_split}: {found.status}",
                    flush=True,
                )
                return self.add(
                    "precision",
                    row(
                        found,
                        strategy=entry["strategy"],
                        precision=entry["precision"],
                        channels_last=channels_last,
                        time_split=time_split,
                    ),
                )

            return run

        single, others = precision_grid(
            self.processes,
            whole=bool(self.gpus),
            launches=lambda e: not self._unavailable(dict(e, images_per_worker=2))[0],
        )
        jobs = [job(i, *setting) for i, setting in enumerate(single + others)]
        # In the CPU smoke single's runs two at once, the others one at a time: two gloo jobs
        # on one host have been seen to cross their messages. On one GPU, AT_ONCE (module
        # docstring).
        if self.gpus == 1:
            return {"runs": self._each(jobs, at_once=AT_ONCE), **side_by_side(AT_ONCE)}
        return {
            "runs": self._each(jobs[: len(single)], at_once=1 if self.gpus else 2) + self._each(jobs[len(single) :])
        }

    def nvml(self) -> dict:
        """The sampler's GPU samples over this call's training runs (the items before it)."""
        samples = [
            json.loads(line)
            for d in self.utilisation_dirs
            for line in (d / "utilisation.jsonl").read_text().splitlines()
            if line
        ]
        if not self.gpus:
            return {"skipped": "no GPU visible: the sampler recorded CPU and memory only", "samples": len(samples)}
        gpu_samples = [g for d in self.utilisation_dirs for g in training_gpu_samples(d)]
        if not gpu_samples:
            raise RuntimeError(
                f"{len(samples)} utilisation samples, none with GPU figures while "
                "training: name a training item in the same call (--only throughput nvml)"
            )
        return {
            "samples": len(gpu_samples),
            "sm_percent_median": statistics.median(g["util_percent"] for g in gpu_samples),
        }

    def commbench(self) -> dict:
        # The CPU smoke times the tiny model (the real R50-FPN trains in `throughput`), once:
        # beside a test suite's other worker every measurement is outside its band.
        cfg = schema.replaced(
            with_model(self.cfg, self.sizes, self.sizes.tiny_model),
            commbench={
                "max_bytes": 2**26 if self.gpus else 2**20,
                "repeats": 5 if self.gpus else 2,
                "compute_repeats": 15 if self.gpus else 3,
                "retries": 2 if self.gpus else 0,
            },
        )
        out = self.work / "commbench.json"
        argv = commbench_command(stages.view(cfg, "commbench"), self.processes, str(out))
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(failure_line(result.stderr))
        return {"links": json.loads(out.read_text())}

    def throughput(self) -> dict:
        """single at each images per GPU, fp32 and bf16, all in one process under the protocol:
        images/s (median, 95 % interval, whether its repeats agreed), the data wait's share,
        SM utilisation (NVML, sampled while its segments ran). With --against REV, the same
        settings at AGAINST run in REV's own tree (its own loop and config, the same data,
        backbone file, image sizes, batch and precision) in a second worker, interleaved,
        and each HEAD row reads its ratio to REV's. Where the same call has `knobs` and
        `profile`, their configurations join this one worker (one start-up, and the knobs
        interleaved with their default, the table's largest bf16 row), and the profile is
        recorded there after the timed turns. Then (but for --quick) the recipe's single run
        at 2 images (fp32, R50-FPN with the check's backbone; in the CPU smoke too, a few
        steps at 64 px) is launched as the workflow launches it, and kept for the report
        (results/runs/gpu-check/): the table's last row."""
        configs, against = [], {}
        for per_gpu in self.sizes.batches:
            for precision in ("fp32", "bf16"):
                configs.append(self._single(f"b{per_gpu}-{precision}", per_gpu, precision))
                if self.against and (per_gpu, precision) in self.against_settings():
                    other = self._single(
                        f"b{per_gpu}-{precision}-{self.against.name}", per_gpu, precision, tree=self.against
                    )
                    against[configs[-1].name] = other
                    configs.append(other)
        table = {c.name: c for c in configs}
        knobs, reference = self._knob_configs(table) if "knobs" in self.wanted else ([], {})
        reference.update(against)
        largest = table[f"b{self.sizes.batches[-1]}-bf16"]
        profile = self._profile_request(largest) if "profile" in self.wanted else None
        rows = self._protocol("throughput", configs + knobs, lambda c: reference.get(c.name), [], profile=profile)
        # the knobs item's rows: each knob and its default
        self.shared = {"knobs": {n for k in knobs for n in (k.name, reference[k.name].name)}, "profile": profile}
        if 2 in self.sizes.batches and self.sizes is not QUICK:
            rows.append(self.add("throughput", self._keep_recipe_run()))
        return {"runs": rows}

    def against_settings(self) -> tuple:
        """AGAINST, or the table's smallest batch in bf16 where the table has neither (the CPU
        smoke: the tiny model, whose bf16 step CPUs take in seconds)."""
        found = tuple(s for s in AGAINST if s[0] in self.sizes.batches and not self.sizes.tiny_model)
        return found or ((self.sizes.batches[0], "bf16"),)

    def _single(self, name: str, per_gpu: int, precision: str, tree: Path = REPO, **train) -> Config:
        """single at `per_gpu` images in `precision` (the tiny model in the CPU smoke)."""
        model = "tiny" if self.sizes.tiny_model else self.cfg.model.arch
        return Config(
            name,
            {"strategy": "single", "workers": 1, "images_per_worker": per_gpu, "precision": precision},
            {"train": train} if train else {},
            tree,
            facts={"images_per_gpu": per_gpu, "precision": precision, "model": model, **train},
        )

    def _keep_recipe_run(self) -> dict:
        """The recipe's single run (2 images, fp32, R50-FPN), launched as the workflow launches
        it and kept where report.predict.compute.preset: gpu-check reads it; its row."""
        name = "throughput-b2-fp32"
        entry = {"strategy": "single", "workers": 1, "precision": "fp32"}
        outcome = self._run(entry, name, 2, self.sizes.table_iterations, tiny=False)
        found = dict(row(outcome, images_per_gpu=2, precision="fp32"), name="recipe run (kept)")
        found.update(self._gpu_figures(self.work / "runs" / name))
        if outcome.status == "ok":
            try:
                self._keep_baseline(self.work / "runs" / name, tiny=False)
            except RuntimeError as err:  # the row stays, failed with the reason
                found.update(status="failed", reason=str(err))
        return found

    def _profile_request(self, config: Config) -> dict:
        return {"config": config.name, "steps": self.sizes.profile_steps, "trace": self.out / "profile-trace.json.gz"}

    def profile(self) -> dict:
        """single at the table's largest images per GPU in bf16: after the protocol's warm-up, a
        few iterations recorded by torch.profiler (CPU and CUDA activities, Python frames),
        its trace kept gzipped beside the bundle (Perfetto, TensorBoard) and summarised
        (pipeline/measure/profile.py). Recorded in the throughput item's worker where the
        call has both. The profiler's own overhead is in these iterations: their times are
        not throughput figures."""
        request = None if self.profile_knob else self.shared.get("profile")
        if request is None:
            per_gpu = self.sizes.batches[-1]
            knob = dict((name, train) for name, train, _ in KNOBS_ON_GPU + KNOBS_ON_CPU)
            train = knob.get(self.profile_knob or "", {})
            suffix = f"-{self.profile_knob}" if self.profile_knob else ""
            config = self._single(f"b{per_gpu}-bf16{suffix}", per_gpu, "bf16", **train)
            request = self._profile_request(config)
            interleave(
                [config],
                self.overrides(),
                self.work / "profile",
                dataclasses.replace(self.sizes.protocol, repeats=0),
                profile=request,
            )
        trace = Path(request["trace"])
        summary = profiles.summarise(profiles.read_events(trace))
        kept = "whole"
        if trace.stat().st_size > TRACE_LIMIT:  # what comes back from a GPU host is bounded
            kept = profiles.slim(trace, TRACE_LIMIT)
        return {
            "summary": summary.to_json(),
            "summary_text": summary.markdown(),
            "trace": trace.name,
            "trace_mb": round(trace.stat().st_size / 2**20, 1),
            "trace_kept": kept,
            "note": "profiled iterations carry the profiler's overhead: not throughput figures",
        }

    def _knob_configs(self, table: dict) -> tuple[list, dict]:
        """Each speed knob (KNOBS_ON_GPU, or KNOBS_ON_CPU) beside its default, the bf16 row of
        `table` (name -> Config) at its images per GPU, made where the table lacks it; the
        configurations to time and each one's reference."""
        chosen = (KNOBS_QUICK if self.sizes is QUICK else KNOBS_ON_GPU) if self.gpus else KNOBS_ON_CPU
        configs, reference = [], {}
        for name, train, which in chosen:
            per_gpu = self.sizes.batches[which]
            default = table.get(f"b{per_gpu}-bf16")
            if default is None:
                default = table[f"b{per_gpu}-bf16"] = self._single(f"b{per_gpu}-bf16", per_gpu, "bf16")
                configs.append(default)
            knob = self._single(f"b{per_gpu}-bf16-{name}", per_gpu, "bf16", **train)
            configs.append(knob)
            reference[knob.name] = default
        return configs, reference

    def knobs(self) -> dict:
        """Each speed knob (pipeline/training/speed.py) beside its default, single in bf16,
        under the protocol in one process (the throughput item's, where the call has both):
        torch.compile of the backbone at the largest images per GPU (its compiling falls in
        its first warm-up) and fused SGD at the smallest, on a GPU; channels-last is the
        precision item's there. The CPU smoke leaves compile out (inductor's C++ build takes
        about a minute there; tests/test_speed.py checks its numbers) and times channels-last."""
        measured = self.shared.get("knobs")
        if measured:
            return {
                "runs": [r for r in self.items["throughput"]["runs"] if r["name"] in measured],
                "note": "measured in the throughput item's worker, interleaved with its table",
            }
        configs, reference = self._knob_configs({})
        return {"runs": self._protocol("knobs", configs, lambda c: reference.get(c.name), [])}

    def sync(self) -> dict:
        """Every registered strategy at one process, bf16, a few iterations with
        train.sync_debug, all in one process: a host-device synchronisation by the loop, the
        strategy or the measuring fails its run, naming it (the detector's own forward is
        let off)."""
        if not self.gpus:  # the sync debug mode sees CUDA's synchronisations only
            return {
                "skipped": "no GPU visible: train.sync_debug checks CUDA synchronisations only",
                "counts": self.sync_counts(),  # counted on any machine
            }
        configs, skipped = [], []
        for cls in REGISTERED:
            entry = dict(one_process_entry(cls, self.cfg), precision="bf16", images_per_worker=2)
            why, run_id = self._unavailable(entry)
            if why:
                skipped.append({"name": run_id, "status": "skipped", "reason": why})
            else:
                configs.append(Config(run_id, entry, {"train": {"sync_debug": True}}))
        # checked from its 6th iteration on (train.py SYNC_CHECK_AFTER): 6 + 3 checked
        checked = Protocol(warmup=6, timed=3, repeats=1, rewarm=0, replay=False)
        interleave(configs, self.overrides(), self.work / "sync", checked)
        rows = skipped + [{"name": c.name, "status": "failed" if c.error else "ok", "reason": c.error} for c in configs]
        return {"runs": rows, "counts": self.sync_counts()}

    def sync_counts(self) -> list[dict]:
        """The detector's step's synchronisations counted on the device at each batch size of the
        throughput table (benchmarks/sync_count.py; fp32, eager), to set beside the profile
        item's cudaStreamSynchronize."""
        from benchmarks.sync_count import summary

        arch, device = ("tiny" if self.sizes.tiny_model else "r50"), ("cuda" if self.gpus else "cpu")
        return [summary(arch, images, self.sizes.min_size, 3, 2, device) for images in self.sizes.batches]

    def _gpu_figures(self, out: Path) -> dict:
        gpus = training_gpu_samples(out)
        if not gpus:
            return {}
        return {
            "sm_percent": statistics.median(g["util_percent"] for g in gpus),
            "peak_gpu_memory_mb": max(g["memory_mb"] for g in gpus),
        }

    def _keep_baseline(self, out: Path, tiny: bool) -> None:
        """The recipe's single run, where report.predict.compute.preset: gpu-check finds it."""
        target = self.results / "runs" / "gpu-check" / BASELINE
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(out, target, ignore=shutil.ignore_patterns("state"))
        # Scored as the workflow scores a run (on the 2 synthetic validation images: the AP
        # means nothing), so that the report reads it as a completed run.
        cfg = with_model(self.cfg, self.sizes, tiny)  # the model it trained
        run = sweep.fill({"strategy": "single", "workers": 1, "images_per_worker": 2}, cfg)
        argv = evaluation_command(stages.view(cfg, "evaluate"), run, str(target))
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"evaluating {target} failed: {failure_line(result.stderr)}")


def precision_grid(processes: int, whole: bool, launches=lambda entry: True) -> tuple[list, list]:
    """The precision item's runs, (entry, channels_last, time_split) each: single's and the
    other strategies'. `whole` (on a GPU): single in every precision with and without
    channels-last, and fp32 with the time split off; every other strategy in bf16 and fp16.
    Otherwise (the CPU smoke, where each launch costs 15-45 s of a CI budget) each path once:
    single in each precision (channels-last in bf16, the time split off in fp16); each
    other strategy in one 16-bit precision, the two taken in turns through the registry, and
    in the other one too where it does not launch (`launches(entry)` False: refused, or not on
    this machine; a row with the reason, at no cost). tests/test_strategies.py checks each
    strategy's 16-bit steps against single's numbers."""
    if whole:
        single = [
            ({"strategy": "single", "workers": 1, "precision": p}, cl, True) for p in PRECISIONS for cl in (False, True)
        ]
        single.append(({"strategy": "single", "workers": 1, "precision": "fp32"}, False, False))
    else:  # each precision once: channels-last in bf16, the time split off in fp16
        single = [({"strategy": "single", "workers": 1, "precision": p}, p == "bf16", p != "fp16") for p in PRECISIONS]
    others = []
    for i, cls in enumerate(c for c in REGISTERED if c.name != "single"):
        for p in PRECISIONS[1:]:
            entry = {"strategy": cls.name, "workers": workers_for(cls, processes), "precision": p}
            if whole or p == PRECISIONS[1 + i % 2] or not launches(entry):
                others.append((entry, False, True))
    return single, others


def side_by_side(at_once: int) -> dict:
    """The note of an item whose launches shared one GPU: their timings disturbed each other,
    so they show that each path runs, and are not figures to compare (the overhead item is)."""
    if at_once == 1:
        return {}
    return {
        "note": f"launched {at_once} at a time on one GPU: each row shows that its path "
        "runs; its images/s were disturbed by the others and are not timings "
        "(the overhead item times each strategy under the protocol)"
    }


def training_gpu_samples(out: Path, start_up: int = 3) -> list[dict]:
    """A run's GPU samples, less the first few: those fall in its start-up (model build, data
    loader), where the GPU idles, and would pull the utilisation down."""
    path = out / "utilisation.jsonl"
    if not path.exists():
        return []
    return [g for line in path.read_text().splitlines() if line for g in json.loads(line).get("gpus", [])][start_up:]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value).replace("|", "/").replace("\n", " ")


def markdown(bundle: dict) -> str:
    lines = [
        f"# GPU check: {bundle['device']}",
        "",
        f"{bundle['mode']}; torch {bundle['provenance']['packages'].get('torch')}, "
        f"git {bundle['provenance']['git_revision']}, {bundle['seconds']:.0f} s in all.",
        "",
    ]
    for name, item in bundle["items"].items():
        lines.append(f"## {name}: {item['status']} ({item.get('seconds', '...')} s)")
        if item["status"] == "failed":
            lines += ["", f"    {item['reason'][-800:]}".replace("\n", "\n    ")]
        runs = item.get("runs", [])
        if runs:
            columns = list(dict.fromkeys(k for run in runs for k in run if k not in ("entry", "log", "traceback")))
            lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(_cell(row.get(k)) for k in columns) + " |" for row in runs]
            lines.append("")
        apart = [f"{r['name']} ({100 * r['disagreement']:.1f} %)" for r in runs if r.get("agree") is False]
        if apart:
            lines.append("- repeats that disagreed by more than 3 % (the machine was noisy): " + ", ".join(apart))
        if "summary_text" in item:
            lines += [item["summary_text"], f"- trace: {item['trace']} ({item['trace_mb']} MiB); {item['note']}"]
        if "note" in item and "summary_text" not in item:
            lines.append(f"- note: {item['note']}")
        for key in ("samples", "sm_percent_median", "skipped"):
            if key in item:
                lines.append(f"- {key}: {item[key]}")
        if "links" in item:
            lines += _links_lines(item["links"])
        for count in item.get("counts", []):
            lines.append(
                f"- synchronisations counted, {count['arch']} at {count['images']} images on {count['device']}: "
                f"{count['per_step']:g} a step; by op "
                + ", ".join(f"{op} {n}" for op, n in count["by_op"].items())
                + "; most from "
                + "; ".join(f"{where} ({n})" for _, where, n in count["by_source"][:5])
            )
        lines.append("")
    return "\n".join(lines)


def _links_lines(links: dict) -> list[str]:
    """commbench's fitted link per primitive (pipeline/commbench/links.py): latency, bandwidth,
    the fit's r2 and the largest message's time."""
    lines = [f"- backend {links.get('backend')}; disturbed: {links.get('disturbed') or 'none'}"]
    for op, fit in (links.get("primitives") or {}).items():
        bandwidth = fit.get("bandwidth_gbit_s")
        largest = (
            f"{fit['bytes'][-1] / 2**20:.0f} MiB in {1e6 * fit['seconds'][-1]:.1f} us"
            if fit.get("bytes") and fit.get("seconds")
            else "-"
        )
        lines.append(
            f"- {op}: alpha {1e6 * fit['alpha_s']:.1f} us, bandwidth "
            + (f"{bandwidth:.3g} Gbit/s" if bandwidth else "not resolved (no slope)")
            + f", r2 {fit.get('r2', float('nan')):.2f}, largest message {largest}"
        )
    return lines


def against_tree(rev: str, work: Path) -> Path:
    """The source tree of revision `rev`: .against/REV where it was carried (a GPU host has no
    git history), else `git archive REV` of this clone unpacked under `work`."""
    carried = REPO / ".against" / rev
    if (carried / "pipeline" / "training" / "train.py").is_file():
        return carried
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", rev], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(
            f"--against {rev}: neither {carried} nor the revision in this clone's "
            f"history ({archive.stderr.decode().strip()}); unpack `git archive {rev}` "
            f"into {carried}"
        )
    target = work / "against" / rev  # named as the carried tree: rows are named by it
    target.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(target, filter="data")
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check", help="directory of gpu_check.md and .json")
    parser.add_argument("--results", default="results", help="where results/runs/gpu-check goes")
    parser.add_argument("--only", nargs="+", choices=ITEMS)
    parser.add_argument(
        "--quick", action="store_true", help=f"a short loan of one GPU: {', '.join(QUICK_ITEMS)} at fewer iterations"
    )
    parser.add_argument(
        "--against",
        metavar="REV",
        help="time the throughput item's AGAINST settings in this git revision's "
        "tree too, interleaved with HEAD's: .against/REV (a `git archive` "
        "unpacked), else an archive of REV from this clone's history",
    )
    parser.add_argument(
        "--profile-knob",
        choices=sorted({k[0] for k in KNOBS_ON_GPU + KNOBS_ON_CPU}),
        help="profile with this speed knob on (its own worker), to set its "
        "profile beside the default's of an earlier call",
    )
    args = parser.parse_args(argv)
    gpus = distributed.gpu_count()
    sizes = (QUICK if args.quick else GPU) if gpus else CPU_SMOKE
    items = args.only or (QUICK_ITEMS if args.quick else ITEMS)
    mode = (
        f"{gpus} GPU(s), one process per GPU over NCCL"
        if gpus
        else "no GPU visible: the CPU smoke (the same items at tiny sizes, 2 gloo processes)"
    )
    mode += "; --quick" if args.quick else ""
    mode += f"; against {args.against}" if args.against else ""
    print(f"gpu check: {mode}; writing {args.out} as each run finishes", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        against = against_tree(args.against, Path(work)) if args.against else None
        check = Check(sizes, Path(work), Path(args.results), gpus, Path(args.out), mode, against)
        check.wanted = tuple(items)
        check.profile_knob = args.profile_knob
        for name in ITEMS:  # in this order, whatever order --only names them in
            if name in items:
                check.item(name, getattr(check, name))
    failed = [name for name, item in check.items.items() if item["status"] == "failed"]
    failed += [
        run.get("run_id") or run.get("name")
        for item in check.items.values()
        for run in item.get("runs", [])
        if run["status"] == "failed"
    ]
    print(
        f"wrote {Path(args.out) / 'gpu_check.md'} and gpu_check.json; "
        + (f"failed: {', '.join(failed)}" if failed else "every item done"),
        flush=True,
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
