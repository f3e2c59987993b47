"""One offline command that checks every GPU path of the benchmark on this host and records
the figures: a Markdown and a JSON bundle with their provenance, rewritten as each run finishes
(a sitting cut off by its time limit keeps every row it measured).

    python benchmarks/gpu_check.py [--out gpu-check] [--results results] [--quick] [--only ITEM...]

It needs no internet and no dataset: the coco2017 preset's model (R50-FPN, frozen BatchNorm,
3 trainable backbone stages) trains on synthetic COCO-layout images at COCO's sizes (640 px,
resized by the model to 800) through the project's own launcher and training loop. Its backbone
is a random ResNet-50 whose BatchNorm statistics were gathered on the check's own images
(`calibrated_backbone`): with a random backbone's statistics (mean 0, variance 1) frozen, the
detector diverged within a few steps on an H100. Each item runs on its own; a failure is
recorded with its one-line reason (the failing rank's own error) and the next item runs:

  overhead     every registered strategy at one process (nothing to communicate) in bf16,
               beside single at the smallest and largest images per GPU: what wrapping and
               measuring cost an iteration (milliseconds over single, ratio of images/s)
  strategies   every registered strategy at one process per GPU (NCCL), and one run for each
               value of each of its choice options (DDP's comm hooks, the server's placement);
               a run the GPUs do not allow is listed with the reason (dp needs 2 GPUs)
  precision    single in fp32, bf16 and fp16, each with and without channels-last, and the time
               split off; every other strategy's own 16-bit path (FSDP2's MixedPrecisionPolicy
               and sharded loss scaler, ZeRO's, DDP's and the server's autocast) in bf16 and
               fp16 at one process per GPU, listed with its reason where it refuses one
  commbench    the NCCL links timed at the GPU count, and the model's compute alone and with
               every GPU's process at once (pipeline/commbench/)
  throughput   R50-FPN at 2, 8 and 16 images per GPU, fp32 and bf16: images/s, the data wait's
               share of an iteration, SM utilisation and peak GPU memory in use (both NVML)
  sync         every registered strategy at one process, bf16, a few iterations with
               train.sync_debug: a host-device synchronisation by the loop, the strategy or the
               measuring fails the run naming it (skipped on CPU: it sees CUDA's only)
  nvml         the utilisation sampler's GPU samples during the training runs before it

`--quick` is what a short loan of one GPU covers: overhead, throughput (2 and 16 images per
GPU), nvml and sync, 15 timed iterations a run: 20 launches, about 6.5 minutes on one H100 with
torch 2.11 (overhead 211 s, sync 104 s; the throughput table 90 s in a sitting of its own).

The single-GPU run at the recipe's 2 images (fp32) is kept as results/runs/gpu-check/: set
report.predict.compute.preset to gpu-check and the predicted scaling uses its time per image
as the measured compute input. Without a GPU the command says so and runs the same items at
tiny sizes on CPU (gloo, 2 processes; the demo's tiny model in every item but the throughput
table's fp32 rows, which train the real R50-FPN with the check's backbone at 64 px: R50-FPN's
bf16 step is many times its fp32 step on CPUs without native bf16): CI runs that smoke
(tests/test_gpu_check.py), about 4 minutes on 2 cores. The whole check on one H100 is about
12 minutes by estimate (each of ~40 launches ~15 s of start-up plus its steps): `--only`
splits it into calls of a few items each (nvml reads the samples of the training items of its
own call: `--only strategies nvml`).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import one_process_entry, strategy_entries, workers_for  # noqa: E402
from pipeline.config import params  # noqa: E402
from pipeline.data import synthetic  # noqa: E402
from pipeline.launch import command, commbench_command, evaluation_command  # noqa: E402
from pipeline.runtime import distributed, provenance  # noqa: E402
from pipeline.runtime.files import write_json, write_text  # noqa: E402
from pipeline.runtime.record import RunSummary  # noqa: E402
from pipeline.strategies import REGISTERED, sweep  # noqa: E402

PRECISIONS = ("fp32", "bf16", "fp16")
BASELINE = "single-w1-b2-s0"  # the recipe's single run: the predicted scaling's compute input


@dataclass(frozen=True)
class Sizes:
    """How big each item runs: the GPU check, or its CPU smoke."""
    image_size: int          # synthetic images, square
    min_size: int            # what the model resizes them to
    iterations: int          # timed iterations of each strategy and precision run
    batches: tuple           # images per GPU of the throughput table
    table_iterations: int
    tiny_model: bool         # every run uses the demo's tiny model (the CPU smoke)


GPU = Sizes(image_size=640, min_size=800, iterations=20, batches=(2, 8, 16), table_iterations=30,
            tiny_model=False)
# --quick: what a short loan of one GPU can cover (see QUICK_ITEMS), fewer timed iterations
QUICK = Sizes(image_size=640, min_size=800, iterations=15, batches=(2, 16), table_iterations=15,
              tiny_model=False)
CPU_SMOKE = Sizes(image_size=64, min_size=64, iterations=2, batches=(2,), table_iterations=2,
                  tiny_model=True)
WARMUP = 5  # iterations every summary leaves out of its timings
# nvml last: it reads the samples of the training items before it in its call
ITEMS = ("overhead", "strategies", "precision", "commbench", "throughput", "sync", "nvml")
QUICK_ITEMS = ("overhead", "throughput", "nvml", "sync")


def base_config(sizes: Sizes, processes: int, data_root: Path, backbone: Path) -> dict:
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017")
    largest = max(2 * processes * (WARMUP + sizes.iterations),
                  max(sizes.batches) * (WARMUP + sizes.table_iterations))
    cfg["data"].update(name="gpu-check", root=str(data_root), fetch=None, aspect_ratio_groups=0,
                       synthetic={"seed": 2017, "image_size": sizes.image_size,
                                  "train_images": largest, "val_images": 2, "max_objects": 8,
                                  "clutter": 6})
    cfg["model"].update(backbone_weights=str(backbone), min_size=sizes.min_size, max_size=1333)
    # The check's few iterations are a COCO run's first ones, so they warm up as those do:
    # `auto` resolves to 1000 iterations on COCO (an epoch is thousands of batches). At full lr
    # from the first step, 16 images per GPU went non-finite by step 11-13 on an H100 even with
    # the calibrated backbone; the lr does not change what an iteration costs.
    cfg["train"].update(epochs=1, lr_steps=[], checkpoint_every=0, monitor_interval_s=1.0,
                        warmup_iters=1000, print_every=10)
    cfg["eval"]["every_epochs"] = 0
    return cfg


def calibrated_backbone(cfg: dict, images: int = 32, batch: int = 4) -> dict:
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
    with torch.random.fork_rng(devices=[]):  # the same random weights on every sitting
        torch.manual_seed(cfg["data"]["synthetic"]["seed"])
        body = resnet50(weights=None).to(device)
    for module in body.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.momentum = None  # a cumulative average over every batch, not the last few
    transform = GeneralizedRCNNTransform(cfg["model"]["min_size"], cfg["model"]["max_size"],
                                         image_mean=[0.485, 0.456, 0.406],
                                         image_std=[0.229, 0.224, 0.225])  # FasterRCNN's own
    dataset = CocoDetection(cfg["data"]["root"], "train", train=True)
    body.train()
    with torch.no_grad():
        for first in range(0, min(images, len(dataset)), batch):
            pictures = [F.to_dtype(F.to_image(dataset.load_image(i)), torch.float32, scale=True).to(device)
                        for i in range(first, min(first + batch, images, len(dataset)))]
            body(transform(pictures)[0].tensors)
    return {name: value.cpu() for name, value in body.state_dict().items()}


def with_model(cfg: dict, sizes: Sizes, tiny: bool) -> dict:
    """cfg, with the demo's tiny model at the check's size where `tiny` (the CPU smoke)."""
    cfg = json.loads(json.dumps(cfg))
    if tiny:
        demo = params.load_resolved(REPO / "params.yaml", preset="demo")["model"]
        cfg["model"] = dict(demo, min_size=sizes.min_size, max_size=sizes.min_size)
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


def train(cfg: dict, entry: dict, out: Path, steps: int) -> Outcome:
    """`steps` iterations of one run through the launcher, as the workflow's train job starts
    it; its summary, or an exception naming what failed."""
    try:
        run = sweep.fill(entry, cfg, where="gpu check")
    except params.ParamsError as refused:  # the strategy refuses the entry (ps in fp16): why
        return Outcome(f"{entry['strategy']} (refused)", "skipped", str(refused))
    why = REGISTERED_BY_NAME[run.strategy](run, cfg["parallel"]).unavailable()
    if why:
        return Outcome(sweep.run_id(run), "skipped", why)
    shutil.rmtree(out, ignore_errors=True)
    started = time.perf_counter()
    result = subprocess.run(command(cfg, run, str(out)) + ["--max-steps", str(steps)], cwd=REPO,
                            capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RunFailed(f"{sweep.run_id(run)}: {failure_line(result.stderr)}", result.stderr[-3000:])
    summary = RunSummary.read(out / "train_summary.json")
    return Outcome(summary.run_id, summary.status, summary.reason, summary,
                   wall_seconds=time.perf_counter() - started,
                   losses_finite=losses_finite(out / "iterations.jsonl"))


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
        return {"run_id": found.run_id, "status": found.status, "reason": found.reason, **extra,
                **({"log": found.log} if found.log else {})}
    s = found.summary
    mean, split = s.sec_per_iter.mean, s.time_split
    busiest = max(s.ranks, key=lambda r: r.bytes_per_iteration.sent) if s.ranks else None
    return {"run_id": s.run_id, "status": "ok", **extra,
            "images_per_second": s.images_per_second,
            "sec_per_iter": mean,
            "losses_finite": found.losses_finite,
            "model": found.model,
            "data_share": (split.data or 0.0) / mean if split else None,
            # the time split off leaves the data wait only
            "compute_share": split.compute / mean if split and split.compute else None,
            "replicas_identical": s.replicas_identical,
            "bytes_sent_per_iter": busiest.bytes_per_iteration.sent if busiest else None,
            "theory_bytes_sent_per_iter": busiest.theory_bytes_per_iteration.sent if busiest else None,
            # the process that holds the most (fsdp/zero shard it; dp's device 0 gathers)
            "peak_memory_mb": max((r.memory.peak_bytes for r in s.ranks if r.memory),
                                  default=0) / 2**20,
            "owned_state_mb": max((r.memory.state.total for r in s.ranks
                                   if r.memory and r.memory.state), default=0) / 2**20,
            "device": s.device, "backend": s.backend}


class Check:
    """The items, each recorded as done, skipped or failed (with its reason). The bundle is
    rewritten as each run finishes, so a sitting cut off by its time limit still leaves every
    row it measured (its item then reads "running")."""

    def __init__(self, sizes: Sizes, work: Path, results: Path, gpus: int, out: Path, mode: str):
        self.sizes, self.work, self.results, self.gpus = sizes, work, results, gpus
        self.out, self.mode = out, mode
        self.processes = gpus if gpus else 2  # one per GPU; on CPU, 2 gloo processes
        self.started = time.perf_counter()
        self.items: dict[str, dict] = {}
        self.utilisation_dirs: list[Path] = []
        self.lock = threading.Lock()
        import torch
        self.device = torch.cuda.get_device_name(0) if gpus else "CPU"
        self.provenance = provenance.collect({"sizes": sizes.__dict__}, world_size=self.processes)
        backbone = work / "resnet50-calibrated.pth"
        self.cfg = base_config(sizes, self.processes, work / "data", backbone)
        synthetic.generate(self.cfg["data"]["root"], self.cfg["data"]["synthetic"])
        torch.save(calibrated_backbone(self.cfg), backbone)

    def bundle(self) -> dict:
        return {"device": self.device, "gpus": self.gpus, "mode": self.mode,
                "sizes": self.sizes.__dict__, "seconds": time.perf_counter() - self.started,
                "items": self.items, "provenance": self.provenance}

    def save(self) -> None:
        """gpu_check.json and .md as they stand (each written whole, then renamed)."""
        with self.lock:
            bundle = json.loads(json.dumps(self.bundle()))
            write_json(self.out / "gpu_check.json", bundle)
            write_text(self.out / "gpu_check.md", markdown(bundle))

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
            self.items[name].update(status="failed", reason=f"{type(err).__name__}: {err}",
                                    traceback=traceback.format_exc()[-3000:])
            print(f"   failed: {err}", flush=True)
        self.items[name]["seconds"] = round(time.perf_counter() - started, 1)
        if not self.items[name]["runs"]:
            del self.items[name]["runs"]
        self.save()

    def _run(self, entry: dict, name: str, per_gpu: int, iterations: int, tiny: bool,
             **train_overrides) -> Outcome:
        cfg = with_model(self.cfg, self.sizes, tiny)
        cfg["train"].update(train_overrides)
        entry = {"images_per_worker": per_gpu, **entry}
        out = self.work / "runs" / name
        try:
            found = train(cfg, entry, out, WARMUP + iterations)
        except RunFailed as err:
            return Outcome(name, "failed", str(err), log=err.log)
        except Exception as err:
            return Outcome(name, "failed", f"{type(err).__name__}: {err}")
        if (out / "utilisation.jsonl").exists():
            self.utilisation_dirs.append(out)
        return dataclasses.replace(found, model=cfg["model"]["arch"])

    def _each(self, jobs: list, at_once: int = 1) -> list:
        """Run each job (a function of no arguments), `at_once` at a time; their rows in order."""
        with concurrent.futures.ThreadPoolExecutor(at_once) as pool:
            return list(pool.map(lambda job: job(), jobs))

    def overhead(self) -> dict:
        """Every registered strategy at one process (nothing to communicate) in bf16 beside
        single, at the table's smallest and largest images per GPU: what each wrapper and the
        project's instrumentation cost an iteration, as milliseconds over single and a ratio
        of images/s. Where a strategy's default cannot run on one process (ps's dedicated
        server needs a second), its first option value that can is taken."""
        rows = []
        for per_gpu in dict.fromkeys((self.sizes.batches[0], self.sizes.batches[-1])):
            single = None
            for cls in REGISTERED:
                entry = dict(one_process_entry(cls, self.cfg), precision="bf16")
                name = f"overhead-{sweep.run_id(sweep.fill(dict(entry, images_per_worker=per_gpu), self.cfg))}"
                found = row(self._run(entry, name, per_gpu, self.sizes.iterations,
                                      self.sizes.tiny_model), images_per_gpu=per_gpu)
                if cls.name == "single":
                    single = found if found["status"] == "ok" else None
                if single and found["status"] == "ok":
                    found["ms_over_single"] = 1000 * (found["sec_per_iter"] - single["sec_per_iter"])
                    found["ratio_to_single"] = found["images_per_second"] / single["images_per_second"]
                print(f"   {found['run_id']}: {found['status']} "
                      f"x{found.get('ratio_to_single', float('nan')):.3f} of single", flush=True)
                rows.append(self.add("overhead", found))
        return {"runs": rows}

    def strategies(self) -> dict:
        def job(i: int, entry: dict):
            def run():
                found = self._run(entry, f"strategy-{i}", 2, self.sizes.iterations,
                                  self.sizes.tiny_model)
                print(f"   {found.run_id}: {found.status}", flush=True)
                return self.add("strategies", row(found, entry=entry))
            return run
        return {"runs": self._each([job(i, e) for i, e in enumerate(strategy_entries(self.processes))])}

    def precision(self) -> dict:
        """single's grid (each precision with and without channels-last; the time split off),
        then every other strategy's own 16-bit path (FSDP2's MixedPrecisionPolicy and sharded
        loss scaler, ZeRO's sharded step, DDP's and the server's autocast) in bf16 and fp16 at
        the check's process count, skipped with the strategy's reason where it refuses one."""
        single = [({"strategy": "single", "workers": 1, "precision": p}, cl, True)
                  for p in PRECISIONS for cl in (False, True)]
        single.append(({"strategy": "single", "workers": 1, "precision": "fp32"}, False, False))
        others = [({"strategy": cls.name, "workers": workers_for(cls, self.processes),
                    "precision": p}, False, True)
                  for cls in REGISTERED if cls.name != "single" for p in PRECISIONS[1:]]

        def job(i: int, entry: dict, channels_last: bool, time_split: bool):
            def run():
                found = self._run(entry, f"precision-{i}", 2, self.sizes.iterations,
                                  self.sizes.tiny_model, channels_last=channels_last,
                                  time_split=time_split)
                print(f"   {entry['strategy']} {entry['precision']} channels_last={channels_last} "
                      f"time_split={time_split}: {found.status}", flush=True)
                return self.add("precision", row(
                    found, strategy=entry["strategy"], precision=entry["precision"],
                    channels_last=channels_last, time_split=time_split))
            return run
        jobs = [job(i, *setting) for i, setting in enumerate(single + others)]
        # On the GPU one at a time, as timings need; in the CPU smoke single's runs two at once
        # (its timings mean nothing, its paths do). Multi-process runs never overlap: two gloo
        # jobs on one host have been seen to cross their messages.
        return {"runs": self._each(jobs[:len(single)], at_once=1 if self.gpus else 2)
                + self._each(jobs[len(single):])}

    def nvml(self) -> dict:
        """The sampler's GPU samples over this call's training runs (the items before it)."""
        samples = [json.loads(line) for d in self.utilisation_dirs
                   for line in (d / "utilisation.jsonl").read_text().splitlines() if line]
        if not self.gpus:
            return {"skipped": "no GPU visible: the sampler recorded CPU and memory only",
                    "samples": len(samples)}
        gpu_samples = [g for d in self.utilisation_dirs for g in training_gpu_samples(d)]
        if not gpu_samples:
            raise RuntimeError(f"{len(samples)} utilisation samples, none with GPU figures while "
                               "training: name a training item in the same call (--only throughput nvml)")
        return {"samples": len(gpu_samples),
                "sm_percent_median": statistics.median(g["util_percent"] for g in gpu_samples)}

    def commbench(self) -> dict:
        from pipeline.config import stages
        # The CPU smoke times the tiny model (the real R50-FPN trains in `throughput`), once:
        # beside a test suite's other worker every measurement is outside its band.
        cfg = with_model(self.cfg, self.sizes, self.sizes.tiny_model)
        cfg["commbench"].update(max_bytes=2**26 if self.gpus else 2**20, repeats=5 if self.gpus else 2,
                                compute_repeats=15 if self.gpus else 3, retries=2 if self.gpus else 0)
        out = self.work / "commbench.json"
        argv = commbench_command(stages.with_knobs(stages.config_for(cfg, "commbench"),
                                                   stages.knobs_for(cfg, "commbench")),
                                 self.processes, str(out))
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(failure_line(result.stderr))
        return {"links": json.loads(out.read_text())}

    def throughput(self) -> dict:
        """single at each images per GPU, fp32 and bf16. The CPU smoke trains the real R50-FPN
        (with the check's own backbone) in its fp32 rows: the tiny model of every other item
        would not see a backbone that diverges."""
        rows, baseline_failure = [], None
        for per_gpu in self.sizes.batches:
            for precision in ("fp32", "bf16"):
                entry = {"strategy": "single", "workers": 1, "precision": precision}
                name = f"throughput-b{per_gpu}-{precision}"
                tiny = self.sizes.tiny_model and precision != "fp32"
                outcome = self._run(entry, name, per_gpu, self.sizes.table_iterations, tiny)
                found = row(outcome, images_per_gpu=per_gpu, precision=precision)
                found.update(self._gpu_figures(self.work / "runs" / name))
                rows.append(self.add("throughput", found))
                print(f"   {per_gpu} images/GPU {precision}: {found.get('images_per_second')}", flush=True)
                if per_gpu == 2 and precision == "fp32" and outcome.status == "ok":
                    try:  # the table goes on: its rows are measured without the baseline
                        self._keep_baseline(self.work / "runs" / name, tiny)
                    except RuntimeError as err:
                        baseline_failure = err
        if baseline_failure:  # the item fails with the reason, every row kept
            raise baseline_failure
        return {"runs": rows}

    def sync(self) -> dict:
        """Every registered strategy at one process, bf16, a few iterations under
        train.sync_debug: a host-device synchronisation by the loop, the strategy or the
        measuring fails the run, naming it (the detector's own forward is let off)."""
        if not self.gpus:  # the sync debug mode sees CUDA's synchronisations only
            return {"skipped": "no GPU visible: train.sync_debug checks CUDA synchronisations only"}
        rows = []
        for cls in REGISTERED:
            entry = dict(one_process_entry(cls, self.cfg), precision="bf16")
            found = row(self._run(entry, f"sync-{cls.name}", 2, 3, self.sizes.tiny_model, sync_debug=True))
            print(f"   {found['run_id']}: {found['status']} {found.get('reason') or ''}", flush=True)
            rows.append(self.add("sync", found))
        return {"runs": rows}

    def _gpu_figures(self, out: Path) -> dict:
        gpus = training_gpu_samples(out)
        if not gpus:
            return {}
        return {"sm_percent": statistics.median(g["util_percent"] for g in gpus),
                "peak_gpu_memory_mb": max(g["memory_mb"] for g in gpus)}

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
        argv = evaluation_command(cfg, run, str(target))
        result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            raise RuntimeError(f"evaluating {target} failed: {failure_line(result.stderr)}")


def training_gpu_samples(out: Path, start_up: int = 3) -> list[dict]:
    """A run's GPU samples, less the first few: those fall in its start-up (model build, data
    loader), where the GPU idles, and would pull the utilisation down."""
    path = out / "utilisation.jsonl"
    if not path.exists():
        return []
    return [g for line in path.read_text().splitlines() if line
            for g in json.loads(line).get("gpus", [])][start_up:]


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value).replace("|", "/").replace("\n", " ")


def markdown(bundle: dict) -> str:
    lines = [f"# GPU check: {bundle['device']}", "",
             f"{bundle['mode']}; torch {bundle['provenance']['packages'].get('torch')}, "
             f"git {bundle['provenance']['git_revision']}, {bundle['seconds']:.0f} s in all.", ""]
    for name, item in bundle["items"].items():
        lines.append(f"## {name}: {item['status']} ({item.get('seconds', '...')} s)")
        if item["status"] == "failed":
            lines += ["", f"    {item['reason'][-800:]}".replace("\n", "\n    ")]
        runs = item.get("runs", [])
        if runs:
            columns = list(dict.fromkeys(k for run in runs for k in run if k not in ("entry", "log")))
            lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
            lines += ["| " + " | ".join(_cell(row.get(k)) for k in columns) + " |" for row in runs]
            lines.append("")
        for key in ("samples", "sm_percent_median", "skipped"):
            if key in item:
                lines.append(f"- {key}: {item[key]}")
        if "links" in item:
            for op, timings in item["links"].items():
                if isinstance(timings, list) and timings and isinstance(timings[-1], dict):
                    lines.append(f"- {op}: largest message {timings[-1]}")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check", help="directory of gpu_check.md and .json")
    parser.add_argument("--results", default="results", help="where results/runs/gpu-check goes")
    parser.add_argument("--only", nargs="+", choices=ITEMS)
    parser.add_argument("--quick", action="store_true",
                        help=f"a short loan of one GPU: {', '.join(QUICK_ITEMS)} at fewer iterations")
    args = parser.parse_args(argv)
    gpus = distributed.gpu_count()
    sizes = (QUICK if args.quick else GPU) if gpus else CPU_SMOKE
    items = args.only or (QUICK_ITEMS if args.quick else ITEMS)
    mode = (f"{gpus} GPU(s), one process per GPU over NCCL" if gpus else
            "no GPU visible: the CPU smoke (the same items at tiny sizes, 2 gloo processes)")
    mode += "; --quick" if args.quick else ""
    print(f"gpu check: {mode}; writing {args.out} as each run finishes", flush=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        check = Check(sizes, Path(work), Path(args.results), gpus, Path(args.out), mode)
        for name in ITEMS:  # in this order, whatever order --only names them in
            if name in items:
                check.item(name, getattr(check, name))
    failed = [name for name, item in check.items.items() if item["status"] == "failed"]
    failed += [run["run_id"] for item in check.items.values() for run in item.get("runs", [])
               if run["status"] == "failed"]
    print(f"wrote {Path(args.out) / 'gpu_check.md'} and gpu_check.json; "
          + (f"failed: {', '.join(failed)}" if failed else "every item done"), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
