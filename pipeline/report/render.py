"""The report's content, once (report_sections), laid out as Markdown and as self-contained HTML.

A section is a dict with a title and any of: text (paragraphs), table (a frame), bullets, and
figures ((name, path, caption) triples, taken from the figure registry).
"""
from __future__ import annotations

import base64
import html
from pathlib import Path

import pandas as pd

from .figures import FIGURES
from .findings import (bytes_sentences, communication_definition, data_mode_findings,
                       memory_sentences, scaling_findings, time_to_accuracy_findings)
from .load import PROGRESS_DEFINITION, _read_input
from .noise import NOISE_RULE
from .tables import markdown_table

TITLE = "Data-parallel Faster R-CNN benchmark: report"
# torchvision's published box AP@[.5:.95] of fasterrcnn_resnet50_fpn (COCO_V1 weights) on COCO
# val2017, trained with its reference recipe (26 epochs): the model card's "box_map": 37.0.
TORCHVISION_BOX_AP = 0.370
# A wide table (the runs, the provenance) scrolls inside its own box instead of pushing the
# page wider than the window; long cells (a skipped run's reason) wrap.
CSS = ("body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1em;color:#222}"
       "table{border-collapse:collapse;margin:1em 0;display:block;max-width:100%;overflow-x:auto}"
       "th,td{border-bottom:1px solid #ccc;padding:.25em .6em;text-align:left;min-width:4em}"
       "td{overflow-wrap:anywhere}img{max-width:100%}figcaption{font-size:.9em}")


PROVENANCE_PACKAGES = ("python", "torch", "torchvision", "pycocotools", "numpy")


def _cpu(hardware: dict) -> str:
    if not hardware:
        return ""
    return f"{hardware.get('processor') or hardware.get('machine', '?')} x{hardware.get('cpu_count', '?')}"


def provenance_table(runs: list[dict]) -> pd.DataFrame:
    """One row per run: where its numbers came from (the host name is left out)."""
    rows = []
    for run in runs:
        p = run["summary"].provenance  # a dict: what runtime/provenance.py collected
        hardware, packages = p.get("hardware") or {}, p.get("packages") or {}
        rows.append({
            "run_id": run["run_id"], "git": p.get("git_revision", "none recorded"),
            "seed": p.get("seed", ""), "workers": p.get("workers") or "",
            "processes": p.get("processes", ""), "threads": p.get("threads", ""),
            "device": p.get("device", ""), "backend": p.get("backend", ""),
            "cpu": _cpu(hardware),
            "gpus": ", ".join(hardware.get("gpus") or []) or ("none" if hardware else ""),
            "cuda": hardware.get("cuda", ""), "driver": hardware.get("driver") or "",
            **{name: packages.get(name, "") for name in PROVENANCE_PACKAGES}})
    return pd.DataFrame(rows).astype(str)


def report_sections(runs, summary, shown, published, preset, figure_ext, compared, scaling,
                    data_modes) -> list[dict]:
    """The report's content once; render_markdown and render_html only lay it out. `shown`:
    the tables as written (build.py), by name."""
    run_cols = ["run_id", "strategy", "variant", "data_mode", "seed", "workers", "processes",
                "images_per_worker", "global_batch", "device", "backend", "threads", "restarts", "status",
                "reason"]
    speed_cols = ["run_id", "images_per_second", "speedup_vs_single", "sec_per_iter_p50",
                  "sec_per_iter_p95", "communication_share", "busiest_rank_bytes_per_iter",
                  "busiest_rank_theory_bytes_per_iter", "replicas_identical"]
    completed = summary[summary["status"] == "ok"]
    ok = int((summary["status"] == "ok").sum())
    # Each run records how many warm-up iterations its timing statistics leave out.
    warmup = sorted({str(run["summary"].timing_excludes_first_iterations) for run in runs
                     if run["summary"].timing_excludes_first_iterations is not None}
                    ) or ["an unrecorded number of"]
    return [
        {"title": "What was run", "text": [
            f"Preset {preset}: {len(runs)} training runs of {summary['entry'].nunique()} sweep "
            f"entries (an entry's repeats differ only in their seed), {ok} completed. Skipped "
            "and failed runs are listed with their reason and left out of the tables and "
            "figures. Tables give the mean over an entry's seeds ± their standard deviation, "
            "and n, the number of runs."],
         "table": summary[run_cols].astype(object).fillna("").astype(str)},
        {"title": "Table 1: COCO box AP", "text": [
            "AP at IoU .5:.95, .5 and .75 on the validation split. Published values: "
            f"{published.get('source', 'the DP-vs-DDP study')}. Our rows say which data they "
            "were measured on; only rows on COCO 2017 can be compared with the study's.",
            "The study's AP of 0.624 (DP) and 0.632 (DDP) are far above torchvision's published "
            f"box AP of {TORCHVISION_BOX_AP} for fasterrcnn_resnet50_fpn on COCO val2017 under "
            "its 26-epoch recipe, so the study cannot have measured the standard COCO box "
            "AP@[.5:.95] at that schedule; the coco2017 preset's own target is torchvision's "
            f"{TORCHVISION_BOX_AP}."], "table": shown["table1"]},
        {"title": "Table 2: time per iteration and training progress per epoch",
         "text": ["Same layout as Table 1."], "table": shown["table2"]},
        {"title": "Differences beyond the noise?", "text": [
            f"Every pair of sweep entries with the same number of workers and data mode, in "
            f"images/s and in AP. Rule: {NOISE_RULE}. Also comparisons.csv."],
         "bullets": list(compared["statement"]) or ["No two entries share a number of workers."]},
        {"title": "Throughput and communication", "text": [
            "Speed-up is images/s over `single` at the same global batch. " + bytes_sentences()
            + " Per-rank detail: traffic.csv."],
         "table": completed[speed_cols].astype(object).map(
             lambda v: f"{v:.4g}" if isinstance(v, float) else str(v))},
        {"title": "Memory per worker", "text": [
            memory_sentences() + " Per process: ranks[].memory in each train_summary.json; "
            "also the memory figure."],
         "table": completed[["run_id", "workers", "processes", "peak_memory_mb", "owned_state_mb",
                             "theory_state_mb"]].astype(object).map(
             lambda v: f"{v:.4g}" if isinstance(v, float) else str(v))},
        {"title": "Scaling", "text": [
            "Images/s against the number of workers per strategy: speed-up over `single` at "
            "the same global batch, and scaling efficiency = speed-up / workers (1.0 is linear "
            "scaling). Also scaling.csv and the throughput and scaling figures."],
         "table": shown["scaling"], "bullets": scaling_findings(scaling)},
        {"title": "Time to accuracy", "text": [
            "Training scores the model on the validation split every eval.every_epochs epochs "
            "(COCO's standard settings); training seconds exclude those evaluations, whose own "
            "time is the last column. A run reaches the target (report.target_ap) at its first "
            "evaluation with AP at or above it."],
         "table": shown["time_to_accuracy"], "bullets": time_to_accuracy_findings(summary)},
        {"title": "Data modes: the loader's share", "text": [
            "The same entries on the real loader (decoding, augmentation) and on in-memory "
            "tensors of the same shapes and targets, made once per process (data_mode: "
            "synthetic). Those runs are timed, not scored: their pixels are noise. Loader "
            "share = 1 - real / in-memory images/s."],
         "table": shown["data_modes"], "bullets": data_mode_findings(data_modes)},
        {"title": "Definitions", "bullets": [
            f"time per iteration = mean wall-clock seconds per training iteration, excluding the "
            f"first {' or '.join(warmup)} (warm-up) iterations of the run", PROGRESS_DEFINITION,
            "time split: data = waiting for the next batch; compute = forward and backward; "
            f"{communication_definition()}; optimizer = the weight update",
            "AP, AP50, AP75 = COCO box average precision (pycocotools); a size-range AP of -1 "
            "(no objects of that size) is left empty in summary.csv"]},
        {"title": "Figures", "figures": [(name, f"figures/{name}.{figure_ext}", entry.caption)
                                         for name, entry in FIGURES.items()]},
        {"title": "Provenance", "text": [
            "Per run: the code revision, seed, workers, processes, threads, device, backend, "
            "hardware and package versions it was made with; its train_summary.json holds the "
            "full record, its parameters included. A skipped run records its machine too."],
         "table": provenance_table(runs)},
    ]


def equivalence_section(path) -> dict:
    """One step of each strategy against `single` on Faster R-CNN (pipeline/equivalence.py)."""
    found = _read_input(Path(path))
    # No '|' in headers: it would split the Markdown table's columns.
    rows = [{"run": name, "largest weight difference from single after one step": (
                f"{r['max_abs_difference']:.3g}" if "skipped" not in r else "skipped"),
             "relative to single's step": (
                f"{r['relative_to_step']:.3g}" if r.get("relative_to_step") is not None else
                r.get("skipped", ""))}
            for name, r in found["strategies"].items()]
    return {"title": "Equivalence with single", "text": [
        f"From the same weights and the same global batch, one SGD step of each strategy, "
        f"compared with {found['reference']} (whose largest weight change was "
        f"{found['max_abs_step_of_single']:.3g}). Why they differ: {found['why']}"],
        "table": pd.DataFrame(rows)}


def render_markdown(sections: list[dict]) -> str:
    out = [f"# {TITLE}\n"]
    for section in sections:
        out.append(f"## {section['title']}\n")
        out += [text + "\n" for text in section.get("text", [])]
        if section.get("table") is not None:
            out.append(markdown_table(section["table"]))
        if section.get("bullets"):
            out.append("".join(f"- {b}\n" for b in section["bullets"]))
        out += [f"![{caption}]({path})\n" for _, path, caption in section.get("figures", [])]
    return "\n".join(out)


def render_html(sections: list[dict], pngs: dict[str, bytes]) -> str:
    """The whole report in one file: figures are embedded, nothing is fetched from elsewhere."""
    esc = html.escape
    out = ["<!DOCTYPE html>", "<html><head><meta charset='utf-8'>", f"<title>{TITLE}</title>",
           f"<style>{CSS}</style></head><body>", f"<h1>{TITLE}</h1>"]
    for section in sections:
        out.append(f"<h2>{esc(section['title'])}</h2>")
        out += [f"<p>{esc(text)}</p>" for text in section.get("text", [])]
        if section.get("table") is not None:
            out.append(section["table"].to_html(index=False, escape=True, border=0))
        if section.get("bullets"):
            out.append("<ul>" + "".join(f"<li>{esc(b)}</li>" for b in section["bullets"]) + "</ul>")
        for name, _, caption in section.get("figures", []):
            data = base64.b64encode(pngs[name]).decode("ascii")
            out.append(f"<figure><img alt='{esc(caption)}' src='data:image/png;base64,{data}'>"
                       f"<figcaption>{esc(caption)}</figcaption></figure>")
    return "\n".join(out + ["</body></html>"]) + "\n"
