"""The typed config: one frozen class per section of a preset, and one per stage's view of it.

    Config            a resolved preset (params.yaml's `defaults`, its `extends` chain, its own
                      values) with its name and the `report` section: what the Snakefile holds
    DataStage ...     what one stage reads of it (pipeline/config/stages.py derives each stage's
                      sections, its rerun triggers, from these classes' fields)
    json_schema()     params.yaml's JSON Schema, generated from these classes: what params.py
                      validates the file against, so a wrong value is named with its remedy

Every class forbids unknown keys and coerces nothing (strict): a misspelt key or a quoted
number is an error, and `model_dump()` gives back exactly what was read, so a stage's config
hashes the same whether it came from params.yaml or from its command line. Default values live
in params.yaml's `defaults`, not here: every field is required once a preset is resolved.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

import pydantic
from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

PositiveInt = Annotated[int, Field(ge=1)]
Count = Annotated[int, Field(ge=0)]

# Real numbers keep an integer as written (YAML's `0` stays 0, not 0.0: the config hashes as it
# reads); each states its JSON Schema by hand, as `int | float` would otherwise read as two types.
AnyNumber = Annotated[int | float, WithJsonSchema({"type": "number"})]
PositiveNumber = Annotated[int | float, Field(gt=0), WithJsonSchema({"type": "number", "exclusiveMinimum": 0})]
NonNegativeNumber = Annotated[int | float, Field(ge=0), WithJsonSchema({"type": "number", "minimum": 0})]
Fraction = Annotated[int | float, Field(ge=0, le=1), WithJsonSchema({"type": "number", "minimum": 0, "maximum": 1})]
PositiveFraction = Annotated[
    int | float, Field(gt=0, le=1), WithJsonSchema({"type": "number", "exclusiveMinimum": 0, "maximum": 1})
]
UNIQUE = {"uniqueItems": True}  # a list of distinct values


class Section(BaseModel):
    """A mapping of params.yaml: closed, strict, immutable."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


# --- data ---------------------------------------------------------------------------------


class Synthetic(Section):
    """The embedded dataset's deterministic generator (pipeline/data/synthetic.py)."""

    seed: Count
    image_size: Annotated[int, Field(ge=64, le=1024)]
    train_images: PositiveInt
    val_images: PositiveInt
    max_objects: Annotated[int, Field(ge=1, le=20)]
    clutter: Annotated[int, Field(ge=0, le=50)]


class Archive(Section):
    path: Annotated[str, Field(min_length=1)]
    md5: Annotated[str, Field(pattern="^[0-9a-f]{32}$")] | None
    size: PositiveInt | None


class Archives(Section):
    annotations: Archive
    train2017: Archive
    val2017: Archive


class Fetch(Section):
    """A downloaded dataset (COCO 2017): dvc.yaml's stages fetch and extract it."""

    base_url: Annotated[str, Field(pattern="^(https?|file)://")]
    splits: Annotated[list[Literal["train", "val"]], Field(min_length=1, json_schema_extra=UNIQUE)]
    subset: PositiveInt | None
    retries: PositiveInt
    remote: Annotated[str, Field(min_length=1)] | None
    archives: Archives


class Data(Section):
    name: Annotated[str, Field(pattern="^[A-Za-z0-9_.-]+$")]
    root: Annotated[str, Field(min_length=1)]
    mode: Literal["real", "synthetic"] = Field(description="synthetic: in-memory tensors, no loader")
    synthetic: Synthetic | None
    fetch: Fetch | None
    workers: Count | Literal["auto"] = Field(description="auto: the cores of one training process, less one for it")
    aspect_ratio_groups: Count
    horizontal_flip: Fraction
    exif_orientation: Literal["refuse", "apply", "ignore"]
    category_mismatch: Literal["refuse", "warn"]


# --- model, training, processes -----------------------------------------------------------


class Model(Section):
    arch: Literal["tiny", "fasterrcnn_resnet50_fpn"]
    backbone_weights: Annotated[str, Field(min_length=1)] | None
    norm: Literal["batchnorm", "groupnorm"]
    trainable_backbone_layers: Annotated[int, Field(ge=0, le=5)]
    min_size: PositiveInt
    max_size: PositiveInt
    anchor_sizes: Annotated[list[PositiveInt], Field(min_length=1)] | None
    channels: PositiveInt | None
    representation_size: PositiveInt | None


class Train(Section):
    seed: Count
    epochs: PositiveInt
    images_per_worker: PositiveInt
    base_lr: PositiveNumber
    base_batch: PositiveInt
    momentum: Fraction
    weight_decay: NonNegativeNumber
    warmup_iters: Count | Literal["auto"] = Field(description="auto: min(1000, iterations of the first epoch - 1)")
    warmup_factor: PositiveFraction
    lr_steps: list[PositiveInt]
    lr_gamma: PositiveFraction
    threads: Count
    print_every: PositiveInt
    monitor_interval_s: NonNegativeNumber
    checkpoint_every: Count = Field(description="0: at epoch ends only")
    precision: Literal["fp32", "bf16", "fp16"]
    channels_last: bool
    compile: Literal[False, "backbone"]
    optimizer: Literal["default", "foreach", "fused"]
    time_split: bool
    sync_debug: bool


class Parallel(Section):
    backend: Literal["auto", "gloo", "nccl"] = Field(description="auto: nccl with GPUs, gloo on CPU")
    nnodes: PositiveInt
    rdzv_endpoint: Annotated[str, Field(pattern=r"^[^:\s]+:[0-9]+$")]
    sync_batchnorm: bool
    powersgd_rank: PositiveInt
    timeout_s: PositiveNumber
    max_restarts: Count
    # With a default, unlike the other keys: a job's --knobs JSON from before it existed still reads
    crash_retries: Count = Field(1, description="a training job that crashed (a signal, a rank lost) is run again")


class EvalSchedule(Section):
    """What training reads of `eval`: how often it evaluates as it goes, in batches of how many
    (the final evaluation's other settings retrain nothing)."""

    every_epochs: Count = Field(description="0: no evaluation during training")
    batch_size: PositiveInt


class Eval(EvalSchedule):
    score_threshold: Fraction
    max_detections: PositiveInt
    backend: Literal["pycocotools", "faster-coco-eval"]


class Commbench(Section):
    """The machine's links and shared compute, timed for the cost model."""

    min_bytes: Annotated[int, Field(ge=4)]
    max_bytes: Annotated[int, Field(ge=8)]
    repeats: PositiveInt
    compute_images: PositiveInt
    compute_repeats: PositiveInt
    retries: Count


class Resources(Section):
    """What a job asks a scheduler for; no stage reads it, so changing it reruns nothing."""

    memory_mb_per_process: PositiveInt
    cpus_per_process: PositiveInt
    runtime_minutes: PositiveInt
    partition: str | None = Field(description="SLURM partition; null: the default")
    account: str | None = Field(description="SLURM account; null: none")


# --- report -------------------------------------------------------------------------------


class Cluster(Section):
    """A cluster the cost model predicts (report.predict.clusters, or `python -m pipeline.whatif`)."""

    name: Annotated[str, Field(min_length=1)]
    gpus_per_node: PositiveInt
    nodes: PositiveInt
    intra_gbit_s: PositiveNumber
    intra_latency_us: NonNegativeNumber
    inter_gbit_s: PositiveNumber
    inter_latency_us: NonNegativeNumber
    spare_cpu_machines_per_node: Count
    gpu_memory_gib: PositiveNumber | None = Field(
        default=None, description="each GPU's memory, GiB: the what-if names the strategies that do not fit"
    )


class Compute(Section):
    preset: str = Field(description="whose measured single-GPU run is the compute input")
    assumed_seconds_per_image: PositiveNumber
    assumed_source: Annotated[str, Field(min_length=1)]
    gradient_bytes: PositiveInt


class Predict(Section):
    images_per_gpu: PositiveInt
    ddp_comm_hook: Literal["fp16", "bf16"]
    compute: Compute
    clusters: Annotated[list[Cluster], Field(min_length=1)]


class PublishedValues(Section):
    AP: Fraction
    AP50: Fraction
    AP75: Fraction
    sec_per_iter: PositiveNumber
    progress_per_epoch: AnyNumber


class Published(Section):
    source: str
    dp: PublishedValues
    ddp: PublishedValues


class Report(Section):
    published: Published
    figure_formats: Annotated[list[Literal["png", "pdf", "svg"]], Field(min_length=1, json_schema_extra=UNIQUE)]
    dpi: Annotated[int, Field(ge=50, le=600)]
    target_ap: dict[str, PositiveFraction] = Field(
        description="preset name -> the AP@[.5:.95] whose first reaching the time-to-accuracy table reports"
    )
    predict: Predict


# --- a preset, the file, the stages ---------------------------------------------------------


class Preset(Section):
    """One entry of params.yaml's `presets`, resolved."""

    data: Data
    model: Model
    train: Train
    parallel: Parallel
    eval: Eval
    # Each entry is closed by pipeline/strategies/sweep.py: strategy, workers, images_per_worker
    # and the options the chosen strategy declares (pipeline/strategies/); repeats, held_out.
    sweep: Annotated[list[dict[str, Any]], Field(min_length=1)]
    resources: Resources
    commbench: Commbench


class Config(Preset):
    """The preset the workflow runs: its name, its sections, and the file's `report`."""

    preset: str
    report: Report


class ParamsFile(Section):
    """params.yaml with every preset resolved (`defaults` and `extends` merged in)."""

    preset: str = Field(description="name of the entry under presets to run")
    presets: dict[str, Preset] = Field(json_schema_extra={"minProperties": 1})
    report: Report


class DataStage(Section):
    data: Data


class TrainStage(Section):
    data: Data
    model: Model
    train: Train
    parallel: Parallel
    eval: EvalSchedule


class EvaluateStage(Section):
    data: Data
    model: Model
    parallel: Parallel
    eval: Eval


class EquivalenceStage(Section):
    data: Data
    model: Model
    train: Train
    parallel: Parallel


class CommbenchStage(Section):
    parallel: Parallel
    commbench: Commbench
    model: Model


class ReportStage(Section):
    report: Report


class PaperStage(Section):
    pass


def first_error(err: pydantic.ValidationError) -> str:
    """A pydantic error in one line: where (dotted keys) and what."""
    first = err.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(top level)"
    more = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    got = repr(first.get("input"))
    got = got if len(got) <= 80 else got[:77] + "..."  # an extra key's message holds the whole mapping
    return f"{where}: {first['msg']} (got {got}){more}"


def _without_titles(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_titles(v) for k, v in node.items() if k != "title" or not isinstance(v, str)}
    if isinstance(node, list):
        return [_without_titles(v) for v in node]
    return node


def json_schema(model: type[BaseModel] = ParamsFile) -> dict:
    """`model`'s JSON Schema (draft 2020-12): params.yaml's, by default."""
    schema = _without_titles(model.model_json_schema())
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


S = TypeVar("S", bound=BaseModel)


def merged(base: dict, override: dict) -> dict:
    """`override` on top of `base`: mappings merge key by key; lists and values replace."""
    out = dict(base)
    for key, value in override.items():
        both_mappings = isinstance(value, dict) and isinstance(base.get(key), dict)
        out[key] = merged(base[key], value) if both_mappings else value
    return out


def nested(dotted: dict[str, Any]) -> dict:
    """{"model.norm": "groupnorm"} -> {"model": {"norm": "groupnorm"}}."""
    out: dict = {}
    for name, value in dotted.items():
        *parents, key = name.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[key] = value
    return out


def replaced(config: S, **changes: Any) -> S:
    """`config` with the given values changed, checked again: `replaced(cfg, model={"norm": "groupnorm"})`
    changes one key of a section (a mapping merges into the section; a value replaces it)."""
    return type(config).model_validate(merged(config.model_dump(), changes))
