"""The report's sections, kept in one registry as the figures are: adding a section is writing
one decorated function of the report's data.

    @section
    def name(data: ReportData) -> Section | None: ...

SECTIONS holds them in report order, the order they are defined in here: the verdict and its
figure, the answer in full and the measurement check, the results, the cost model's (in sample,
its held-out entries, past this machine), the
equivalence check, the accuracy gap's causes (causes.py), definitions and figures, then every
run and its provenance. A function that returns None leaves its section out (no
equivalence check ran). render.py lays them out as Markdown and HTML.
"""

from __future__ import annotations

from collections.abc import Callable

import pandas as pd

from . import causes, clusters, prediction
from .data import ReportData
from .figures import FIGURES, VERDICT_FIGURE
from .findings import (
    TORCHVISION_BOX_AP,
    bytes_sentences,
    communication_definition,
    data_mode_findings,
    memory_sentences,
    scaling_findings,
    time_to_accuracy_findings,
)
from .holdout import HeldOut
from .load import PROGRESS_DEFINITION, RunDir, required, strategy_label
from .noise import NOISE_RULE
from .render import Section
from .tables import NO_NUMBER, NO_TEXT, formatted

SECTIONS: list[Callable[[ReportData], Section | None]] = []  # in report order


def section(make: Callable[[ReportData], Section | None]):
    """Register `make(data)` as the report's next section."""
    SECTIONS.append(make)
    return make


def report_sections(data: ReportData) -> list[Section]:
    """The report's content once; render_markdown and render_html only lay it out."""
    return [found for make in SECTIONS if (found := make(data)) is not None]


# ---- the answer, and whether the machine can be trusted ----------------------------------------
@section
def answer(data: ReportData) -> Section:
    """The verdict opens the report, in at most five sentences, and under it its figure
    (figures.VERDICT_FIGURE); a disturbed commbench is said right after it (the verdict's last
    sentence says whether the machine was noisy; the check's own section, after the long-form
    answer, says which seeds)."""
    warning = [said] if data.checked is not None and (said := data.checked.disturbed_sentence()) else []
    held = data.held_out  # a model that misses out of sample says so here too
    if held is not None and held.judged and not held.met:
        warning.append(held.sentence())
    entry = FIGURES[VERDICT_FIGURE]
    return Section(
        "The answer",
        [required(data.verdict, "ReportData.verdict").text, *warning],
        figures=[(VERDICT_FIGURE, f"figures/{VERDICT_FIGURE}.{data.figure_ext}", entry.caption)],
    )


@section
def answer_in_full(data: ReportData) -> Section:
    """The long-form answer: every ranking with its intervals and entry ids (answer.answer)."""
    return required(data.answer, "ReportData.answer").section()


@section
def measurement_check(data: ReportData) -> Section:
    return required(data.checked, "ReportData.checked").section()


# ---- the results --------------------------------------------------------------------------------
@section
def table1(data: ReportData) -> Section:
    return Section(
        "Table 1: COCO box AP",
        [
            "AP at IoU .5:.95, .5 and .75 on the validation split. Published values: Table 1 of "
            f"{data.published.get('source', 'the DP-vs-DDP study')}. Our rows say which data they "
            "were measured on; only rows on COCO 2017 can be compared with the study's.",
            "The study's AP of 0.624 (DP) and 0.632 (DDP) are far above torchvision's published "
            f"box AP of {TORCHVISION_BOX_AP} for fasterrcnn_resnet50_fpn on COCO val2017 under "
            "its 26-epoch recipe, so the study cannot have measured the standard COCO box "
            "AP@[.5:.95] at that schedule; the coco2017 preset's own target is torchvision's "
            f"{TORCHVISION_BOX_AP}.",
        ],
        data.shown("table1"),
    )


@section
def table2(data: ReportData) -> Section:
    return Section(
        "Table 2: time per iteration and training progress per epoch",
        [
            "Same layout as Table 1. Published values: Table 2 of the same study "
            '(seconds per iteration and its undefined "training progress per epoch").'
        ],
        data.shown("table2"),
    )


@section
def comparisons(data: ReportData) -> Section:
    if not len(data.compared):
        return Section("Differences beyond the noise?", ["No two entries share a number of workers and a data mode."])
    return Section(
        "Differences beyond the noise?",
        [
            f"Every pair of sweep entries with the same number of workers and data mode, in "
            f"images/s and in AP: the ratio of their means (a/b) and the verdict, pairs beyond "
            f"the noise first. Rule: {NOISE_RULE}. The means, spreads and intervals: "
            "comparisons.csv."
        ],
        data.shown("comparisons"),
    )


def _completed(data: ReportData) -> pd.DataFrame:
    return data.summary[data.summary["status"] == "ok"]


@section
def throughput(data: ReportData) -> Section:
    completed = _completed(data)
    speed = pd.DataFrame(
        {
            "run_id": completed["run_id"],
            "images_per_second": completed["images_per_second"],
            "speedup_vs_single": completed["speedup_vs_single"],
            "sec_per_iter_p50": completed["sec_per_iter_p50"],
            "sec_per_iter_p95": completed["sec_per_iter_p95"],
            "communication_share": completed["communication_share"],
            "MB/iter, busiest rank": completed["busiest_rank_bytes_per_iter"] / 1e6,
            "MB/iter by theory": completed["busiest_rank_theory_bytes_per_iter"] / 1e6,
            "replicas_identical": completed["replicas_identical"],
        }
    )
    return Section(
        "Throughput and communication",
        [
            "Speed-up is images/s over `single` at the same global batch (n/a: no `single` run "
            "at that batch). Communication share: the time split's communication over the "
            "iteration (n/a: a strategy that exchanges inside its forward and backward passes "
            "times none apart). " + bytes_sentences() + " Per-rank detail: traffic.csv."
        ],
        formatted(
            speed,
            {
                "images_per_second": 2,
                "speedup_vs_single": 3,
                "sec_per_iter_p50": 4,
                "sec_per_iter_p95": 4,
                "communication_share": 3,
                "MB/iter, busiest rank": 2,
                "MB/iter by theory": 2,
            },
        ),
    )


@section
def memory(data: ReportData) -> Section:
    memory = _completed(data)[["run_id", "workers", "processes", "peak_memory_mb", "owned_state_mb", "theory_state_mb"]]
    return Section(
        "Memory per worker",
        [memory_sentences() + " Per process: ranks[].memory in each train_summary.json; also the memory figure."],
        formatted(memory, {"peak_memory_mb": 1, "owned_state_mb": 1, "theory_state_mb": 1}),
    )


@section
def scaling(data: ReportData) -> Section:
    return Section(
        "Scaling",
        [
            "Images/s against the number of workers per strategy: speed-up over `single` at "
            "the same global batch, and scaling efficiency = speed-up / workers (1.0 is linear "
            "scaling). Also scaling.csv and the throughput and scaling figures."
        ],
        data.shown("scaling"),
        scaling_findings(data.scaling),
    )


@section
def time_to_accuracy(data: ReportData) -> Section:
    return Section(
        "Time to accuracy",
        [
            "Training scores the model on the validation split every eval.every_epochs epochs "
            "(COCO's standard settings); training seconds exclude those evaluations, whose own "
            "time is the last column. A run reaches the target (report.target_ap) at its first "
            "evaluation with AP at or above it."
        ],
        data.shown("time_to_accuracy"),
        time_to_accuracy_findings(data.summary),
    )


@section
def data_modes(data: ReportData) -> Section:
    return Section(
        "Data modes: the loader's share",
        [
            "The same entries on the real loader (decoding, augmentation) and on in-memory "
            "tensors of the same shapes and targets, made once per process (data_mode: "
            "synthetic). Those runs are timed, not scored: their pixels are noise. Loader "
            "share = 1 - real / in-memory images/s; a loader cannot make training faster, so a "
            "negative measurement is shown as 0, with a note."
        ],
        data.shown("data_modes"),
        data_mode_findings(data.data_modes),
    )


# ---- the cost model and the one-step check ------------------------------------------------------
@section
def predicted_against_measured(data: ReportData) -> Section:
    return Section(**prediction.section(data.shown("prediction"), data.prediction, data.links))


@section
def held_out(data: ReportData) -> Section:
    """The held-out entries apart from the fitted ones: the model out of sample (holdout.py)."""
    return Section(**(data.held_out or HeldOut()).section())


@section
def predicted_scaling(data: ReportData) -> Section:
    predict, compute = required(data.predict, "ReportData.predict"), required(data.compute, "ReportData.compute")
    return Section(**clusters.section(data.shown("predicted_scaling"), data.cluster_points, predict, compute))


@section
def equivalence(data: ReportData) -> Section | None:
    """One step of each strategy against `single` on Faster R-CNN (pipeline/equivalence.py)."""
    found = data.equivalence
    if found is None:
        return None
    # No '|' in headers: it would split the Markdown table's columns.
    rows = [
        {
            "run": name,
            "largest weight difference from single after one step": (
                f"{r.max_abs_difference:.3g}" if r.skipped is None else "skipped"
            ),
            "relative to single's step": (
                f"{r.relative_to_step:.3g}" if r.relative_to_step is not None else r.skipped or ""
            ),
        }
        for name, r in found.strategies.items()
    ]
    return Section(
        "Equivalence with single",
        [
            f"From the same weights and the same global batch, one SGD step of each strategy, "
            f"compared with {found.reference} (whose largest weight change was "
            f"{found.max_abs_step_of_single:.3g}). Why they differ: {found.why}"
        ],
        pd.DataFrame(rows),
    )


@section
def accuracy_causes(data: ReportData) -> Section | None:
    """Which cause of single's AP lead over ddp-w2 the ablation's runs support (causes.py)."""
    return causes.section(data.causes, data.equivalence)


# ---- how to read it ----------------------------------------------------------------------------
@section
def definitions(data: ReportData) -> Section:
    # Each run records how many warm-up iterations its timing statistics leave out.
    warmup = sorted(
        {
            str(run.summary.timing_excludes_first_iterations)
            for run in data.runs
            if run.summary.timing_excludes_first_iterations is not None
        }
    ) or ["an unrecorded number of"]
    return Section(
        "Definitions",
        bullets=[
            f"time per iteration = mean wall-clock seconds per training iteration, excluding the "
            f"first {' or '.join(warmup)} (warm-up) iterations of the run",
            PROGRESS_DEFINITION,
            "time split: data = waiting for the next batch; compute = forward and backward; "
            f"{communication_definition()}; optimizer = the weight update",
            "AP, AP50, AP75 = COCO box average precision (pycocotools); a size-range AP of -1 "
            "(no objects of that size) is left empty in summary.csv",
        ],
    )


@section
def figures(data: ReportData) -> Section:
    return Section(
        "Figures",
        figures=[
            (name, f"figures/{name}.{data.figure_ext}", entry.caption)
            for name, entry in FIGURES.items()
            if name != VERDICT_FIGURE
        ],
    )  # under the verdict


# ---- the appendices: every run, and where its numbers came from --------------------------------
PROVENANCE_PACKAGES = ("python", "torch", "torchvision", "pycocotools", "numpy")


def constant_columns(frame: pd.DataFrame, keep=()) -> tuple[pd.DataFrame, list[str]]:
    """The frame without the columns that hold one value in every row (but `keep`), and those
    columns as 'name value', said once above the table instead of in every row."""
    constant = [c for c in frame.columns if c not in keep and len(frame) > 1 and frame[c].astype(str).nunique() == 1]
    said = [f"{c} {frame[c].iloc[0]}" for c in constant if str(frame[c].iloc[0]) not in (NO_NUMBER, NO_TEXT)]
    return frame.drop(columns=constant), said


@section
def runs(data: ReportData) -> Section:
    """Every run: its strategy, shape, status and reason; columns one value for every run are
    said once, above the table."""
    summary = data.summary
    frame = pd.DataFrame(
        {
            "run_id": summary["run_id"],
            "strategy": [
                strategy_label(s, v, m)
                for s, v, m in zip(
                    summary["strategy"], summary["variant"], summary["data_mode"].fillna("real"), strict=False
                )
            ],
            **{
                c: summary[c]
                for c in (
                    "seed",
                    "workers",
                    "processes",
                    "images_per_worker",
                    "global_batch",
                    "threads",
                    "restarts",
                    "device",
                    "backend",
                    "status",
                    "reason",
                )
            },
        }
    )
    shown, common = constant_columns(formatted(frame, {}), keep=("run", "status", "reason"))
    retried = summary[summary["retried_after"].fillna("") != ""]
    return Section(
        "Runs",
        [
            "Every training run, skipped and failed ones with their reason"
            + (f"; all of them: {'; '.join(common)}." if common else ".")
        ]
        + [
            f"{run} was trained after its job crashed ({why}); it resumed from its last checkpoint, and its "
            "speed is measured from the attempt that finished."
            for run, why in zip(retried["run_id"], retried["retried_after"], strict=True)
        ],
        shown,
    )


def _shown(value) -> str:
    """A recorded value as the provenance table shows it; empty where it was not recorded."""
    return "" if value is None else str(value)


def provenance_table(runs: list[RunDir]) -> pd.DataFrame:
    """One row per run: where its numbers came from (the host name is left out)."""
    rows = []
    for run in runs:
        p, hw = run.summary.provenance, run.summary.provenance.hardware
        rows.append(
            {
                "run_id": run.run_id,
                "git": p.git_revision or "none recorded",
                "seed": _shown(p.seed),
                "workers": p.workers or "",
                "processes": _shown(p.processes),
                "threads": _shown(p.threads),
                "device": _shown(p.device),
                "backend": _shown(p.backend),
                "cpu": f"{hw.model} x{hw.cores}" if hw else "",
                "gpus": (", ".join(hw.gpus or []) or "none") if hw else "",
                "cuda": _shown(hw.cuda) if hw else "",
                "driver": (hw.driver or "") if hw else "",
                **{name: p.package(name) or "" for name in PROVENANCE_PACKAGES},
            }
        )
    return pd.DataFrame(rows).astype(str)


@section
def provenance(data: ReportData) -> Section:
    """The code revision, hardware and packages of each run; the columns the run list shows
    are left out, and those one value for every run said once."""
    origin = provenance_table(data.runs).drop(columns=["seed", "workers", "processes", "threads", "device", "backend"])
    recorded, same = constant_columns(formatted(origin, {}), keep=("run",))
    return Section(
        "Provenance",
        [
            "Per run: the code revision, hardware and package versions it was made with"
            + (f"; every run: {'; '.join(same)}" if same else "")
            + ". Its train_summary.json "
            "holds the full record, its parameters included. A skipped run records its machine "
            "too; the host name is left out."
        ],
        recorded if recorded.shape[1] > 1 else None,
    )
