"""The report's content, once (report_sections), laid out as Markdown and as self-contained HTML.

A section is a dict with a title and any of: text (paragraphs), table (a frame, as a reader
sees it: tables._formatted), bullets, and figures ((name, path, caption) triples, taken from
the figure registry). The report opens with its first section (build.py puts the answer
there), then a contents list that links to every section and says how to read the tables; the
run list and the provenance close it.
Texts may mark code as Markdown does (`single`): Markdown keeps it, the HTML makes it <code>.
"""
from __future__ import annotations

import base64
import html
import re
from pathlib import Path

import pandas as pd

from .figures import FIGURES
from .findings import (bytes_sentences, communication_definition, data_mode_findings,
                       memory_sentences, scaling_findings, time_to_accuracy_findings)
from ..runtime.record import EquivalenceRecord
from .load import PROGRESS_DEFINITION, RunDir, strategy_label
from .noise import NOISE_RULE
from .tables import (NO_NUMBER, NO_TEXT, _formatted, markdown_table, numeric_columns,
                     wrapping_columns)

TITLE = "Data-parallel Faster R-CNN benchmark: report"
# torchvision's published box AP@[.5:.95] of fasterrcnn_resnet50_fpn (COCO_V1 weights) on COCO
# val2017, trained with its reference recipe (26 epochs): the model card's "box_map": 37.0.
TORCHVISION_BOX_AP = 0.370
# Read at 1400 px and up: the page is as wide as the window allows up to 1320 px, paragraphs
# keep a readable measure, and every table fits without scrolling (tests/finished_demo: a
# browser checks it): prose cells wrap at their spaces, ids and numbers never break, numbers
# are right-aligned. The box around a table scrolls only where a window is narrower still.
CSS = ("body{font-family:system-ui,sans-serif;max-width:1320px;margin:1.5em auto;padding:0 1.5em;"
       "color:#222;line-height:1.45}p,li,figcaption{max-width:62em}"
       "nav.contents{background:#f5f5f5;padding:.5em 1em;margin:1em 0}nav.contents ol{margin:.3em 0}"
       "nav.contents p{margin:0}nav.contents p:first-child{font-weight:bold}"
       "div.table{overflow-x:auto;margin:1em 0}table{border-collapse:collapse;font-size:.87em}"
       "th,td{border-bottom:1px solid #ccc;padding:.25em .5em;text-align:left;vertical-align:top}"
       "th{vertical-align:bottom}th.num,td.num{text-align:right}td.num{white-space:nowrap;"
       "font-variant-numeric:tabular-nums}td.key,span.id{white-space:nowrap}p.note{font-size:.87em}"
       "code{font-size:.95em;background:#f3f3f3;padding:0 .2em}"
       "img{max-width:100%}figure{margin:1.5em 0}figcaption{font-size:.9em}")


PROVENANCE_PACKAGES = ("python", "torch", "torchvision", "pycocotools", "numpy")


def _shown(value) -> str:
    """A recorded value as the provenance table shows it; empty where it was not recorded."""
    return "" if value is None else str(value)


def provenance_table(runs: list[RunDir]) -> pd.DataFrame:
    """One row per run: where its numbers came from (the host name is left out)."""
    rows = []
    for run in runs:
        p, hw = run.summary.provenance, run.summary.provenance.hardware
        rows.append({
            "run_id": run.run_id, "git": p.git_revision or "none recorded",
            "seed": _shown(p.seed), "workers": p.workers or "",
            "processes": _shown(p.processes), "threads": _shown(p.threads),
            "device": _shown(p.device), "backend": _shown(p.backend),
            "cpu": f"{hw.model} x{hw.cores}" if hw else "",
            "gpus": (", ".join(hw.gpus or []) or "none") if hw else "",
            "cuda": _shown(hw.cuda) if hw else "", "driver": (hw.driver or "") if hw else "",
            **{name: p.package(name) or "" for name in PROVENANCE_PACKAGES}})
    return pd.DataFrame(rows).astype(str)


def constant_columns(frame: pd.DataFrame, keep=()) -> tuple[pd.DataFrame, list[str]]:
    """The frame without the columns that hold one value in every row (but `keep`), and those
    columns as 'name value', said once above the table instead of in every row."""
    constant = [c for c in frame.columns if c not in keep and len(frame) > 1
                and frame[c].astype(str).nunique() == 1]
    said = [f"{c} {frame[c].iloc[0]}" for c in constant
            if str(frame[c].iloc[0]) not in (NO_NUMBER, NO_TEXT)]
    return frame.drop(columns=constant), said


def run_sections(runs: list[RunDir], summary: pd.DataFrame) -> list[dict]:
    """The appendices: every run (its strategy, shape, status and reason), and where its
    numbers came from; columns one value for every run are said once, above the table."""
    frame = pd.DataFrame({
        "run_id": summary["run_id"],
        "strategy": [strategy_label(s, v, m) for s, v, m in
                     zip(summary["strategy"], summary["variant"], summary["data_mode"].fillna("real"))],
        **{c: summary[c] for c in ("seed", "workers", "processes", "images_per_worker",
                                   "global_batch", "threads", "restarts", "device", "backend",
                                   "status", "reason")}})
    shown = _formatted(frame, {})
    shown, common = constant_columns(shown, keep=("run", "status", "reason"))
    origin = provenance_table(runs).drop(
        columns=["seed", "workers", "processes", "threads", "device", "backend"])
    recorded, same = constant_columns(_formatted(origin, {}), keep=("run",))
    return [
        {"title": "Runs", "text": [
            "Every training run, skipped and failed ones with their reason"
            + (f"; all of them: {'; '.join(common)}." if common else ".")],
         "table": shown},
        {"title": "Provenance", "text": [
            "Per run: the code revision, hardware and package versions it was made with"
            + (f"; every run: {'; '.join(same)}" if same else "") + ". Its train_summary.json "
            "holds the full record, its parameters included. A skipped run records its machine "
            "too; the host name is left out."],
         "table": recorded if recorded.shape[1] > 1 else None},
    ]


def report_sections(runs, summary, shown, published, preset, figure_ext, compared, scaling,
                    data_modes) -> list[dict]:
    """The report's content once; render_markdown and render_html only lay it out. `shown`:
    the tables as written (build.py), by name."""
    completed = summary[summary["status"] == "ok"]
    speed = pd.DataFrame({
        "run_id": completed["run_id"], "images_per_second": completed["images_per_second"],
        "speedup_vs_single": completed["speedup_vs_single"],
        "sec_per_iter_p50": completed["sec_per_iter_p50"],
        "sec_per_iter_p95": completed["sec_per_iter_p95"],
        "communication_share": completed["communication_share"],
        "MB/iter, busiest rank": completed["busiest_rank_bytes_per_iter"] / 1e6,
        "MB/iter by theory": completed["busiest_rank_theory_bytes_per_iter"] / 1e6,
        "replicas_identical": completed["replicas_identical"]})
    memory = completed[["run_id", "workers", "processes", "peak_memory_mb", "owned_state_mb",
                        "theory_state_mb"]]
    # Each run records how many warm-up iterations its timing statistics leave out.
    warmup = sorted({str(run.summary.timing_excludes_first_iterations) for run in runs
                     if run.summary.timing_excludes_first_iterations is not None}
                    ) or ["an unrecorded number of"]
    return [
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
            f"images/s and in AP: the ratio of their means (a/b) and the verdict, pairs beyond "
            f"the noise first. Rule: {NOISE_RULE}. The means, spreads and intervals: "
            "comparisons.csv."] if len(compared) else ["No two entries share a number of "
                                                      "workers and a data mode."],
         "table": shown["comparisons"] if len(compared) else None},
        {"title": "Throughput and communication", "text": [
            "Speed-up is images/s over `single` at the same global batch (n/a: no `single` run "
            "at that batch). Communication share: the time split's communication over the "
            "iteration (n/a: a strategy that exchanges inside its forward and backward passes "
            "times none apart). " + bytes_sentences() + " Per-rank detail: traffic.csv."],
         "table": _formatted(speed, {"images_per_second": 2, "speedup_vs_single": 3,
                                     "sec_per_iter_p50": 4, "sec_per_iter_p95": 4,
                                     "communication_share": 3, "MB/iter, busiest rank": 2,
                                     "MB/iter by theory": 2})},
        {"title": "Memory per worker", "text": [
            memory_sentences() + " Per process: ranks[].memory in each train_summary.json; "
            "also the memory figure."],
         "table": _formatted(memory, {"peak_memory_mb": 1, "owned_state_mb": 1,
                                      "theory_state_mb": 1})},
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
            "share = 1 - real / in-memory images/s; a loader cannot make training faster, so a "
            "negative measurement is shown as 0, with a note."],
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
        *run_sections(runs, summary),
    ]


def equivalence_section(found: EquivalenceRecord) -> dict:
    """One step of each strategy against `single` on Faster R-CNN (pipeline/equivalence.py)."""
    # No '|' in headers: it would split the Markdown table's columns.
    rows = [{"run": name, "largest weight difference from single after one step": (
                f"{r.max_abs_difference:.3g}" if r.skipped is None else "skipped"),
             "relative to single's step": (
                f"{r.relative_to_step:.3g}" if r.relative_to_step is not None else r.skipped or "")}
            for name, r in found.strategies.items()]
    return {"title": "Equivalence with single", "text": [
        f"From the same weights and the same global batch, one SGD step of each strategy, "
        f"compared with {found.reference} (whose largest weight change was "
        f"{found.max_abs_step_of_single:.3g}). Why they differ: {found.why}"],
        "table": pd.DataFrame(rows)}


def anchor(title: str) -> str:
    """A section's anchor, as GitHub makes it from a Markdown heading: 'Table 1: COCO box AP'
    -> 'table-1-coco-box-ap'; the HTML report uses the same."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


# Under the contents list: how to read every table.
READING = ("Tables give the mean over an entry's seeds ± their standard deviation, and n, the "
           "number of runs; n/a marks a number that does not exist, - an empty field. Skipped "
           "and failed runs are left out of the tables and figures and listed with their reason "
           "under Runs, at the end.")


def _contents(sections: list[dict]) -> list[tuple[str, str]]:
    """(title, anchor) of every section after the first (the answer), for the contents list."""
    return [(s["title"], anchor(s["title"])) for s in sections[1:]]


def _table(section: dict) -> pd.DataFrame | None:
    """The section's table as a reader sees it (a frame not yet formatted gets formatted)."""
    table = section.get("table")
    if table is None or "notes" in table.attrs:
        return table
    return _formatted(table, {})


def render_markdown(sections: list[dict]) -> str:
    out = [f"# {TITLE}\n"]
    for i, section in enumerate(sections):
        out.append(f"## {section['title']}\n")
        out += [text + "\n" for text in section.get("text", [])]
        table = _table(section)
        if table is not None:
            out.append(markdown_table(table))
        if section.get("bullets"):
            out.append("".join(f"- {b}\n" for b in section["bullets"]))
        out += [f"![{caption}]({path})\n" for _, path, caption in section.get("figures", [])]
        if i == 0:  # the answer first, then where everything else is
            out.append("**Contents**\n\n" + "".join(f"- [{title}](#{slug})\n"
                                                    for title, slug in _contents(sections))
                       + f"\n{READING}\n")
    return "\n".join(out)


# A run or entry id (ps-colocated-w2-b2-s0), which a browser would otherwise break at a hyphen
RUN_ID = re.compile(r"(?<![\w-])(?=[\w-]*\d)[a-z]\w*(?:-\w+)+")


def _inline(text: str) -> str:
    """Text for HTML: escaped, with Markdown's `code` as <code> (no Markdown left raw), and run
    ids kept whole on their line."""
    escaped = re.sub(r"`([^`]*)`", r"<code>\1</code>", html.escape(text))
    return RUN_ID.sub(lambda m: f"<span class='id'>{m.group(0)}</span>", escaped)


def html_table(shown: pd.DataFrame) -> str:
    """A table as a reader sees it: numbers right-aligned and never broken, ids never broken,
    prose wrapping at its spaces; its notes under it."""
    numeric, wrap = numeric_columns(shown), wrapping_columns(shown)
    kinds = ["num" if n else "" if w else "key" for n, w in zip(numeric, wrap)]
    cls = [f" class='{k}'" if k else "" for k in kinds]
    head = "".join(f"<th{c}>{_inline(str(h))}</th>" for c, h in zip(cls, shown.columns))
    rows = "".join("<tr>" + "".join(f"<td{c}>{_inline(str(v))}</td>" for c, v in zip(cls, row))
                   + "</tr>" for row in shown.itertuples(index=False))
    notes = "".join(f"<p class='note'>{_inline(n)}</p>" for n in shown.attrs.get("notes") or [])
    return (f"<div class='table'><table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>"
            f"</table></div>{notes}")


def render_html(sections: list[dict], pngs: dict[str, bytes]) -> str:
    """The whole report in one file: figures are embedded, nothing is fetched from elsewhere."""
    esc = html.escape
    out = ["<!DOCTYPE html>", "<html lang='en'><head><meta charset='utf-8'>",
           "<meta name='viewport' content='width=device-width, initial-scale=1'>",
           f"<title>{TITLE}</title>", f"<style>{CSS}</style></head><body>", f"<h1>{TITLE}</h1>"]
    for i, section in enumerate(sections):
        out.append(f"<section id='{anchor(section['title'])}'><h2>{esc(section['title'])}</h2>")
        out += [f"<p>{_inline(text)}</p>" for text in section.get("text", [])]
        table = _table(section)
        if table is not None:
            out.append(html_table(table))
        if section.get("bullets"):
            out.append("<ul>" + "".join(f"<li>{_inline(b)}</li>" for b in section["bullets"])
                       + "</ul>")
        for name, _, caption in section.get("figures", []):
            data = base64.b64encode(pngs[name]).decode("ascii")
            out.append(f"<figure id='figure-{name}'><img alt='{esc(caption)}' "
                       f"src='data:image/png;base64,{data}'><figcaption>{esc(caption)}"
                       "</figcaption></figure>")
        out.append("</section>")
        if i == 0:  # the answer first, then where everything else is
            out.append("<nav class='contents' aria-label='Contents'><p>Contents</p><ol>"
                       + "".join(f"<li><a href='#{slug}'>{esc(title)}</a></li>"
                                 for title, slug in _contents(sections))
                       + f"</ol><p class='reading'>{esc(READING)}</p></nav>")
    return "\n".join(out + ["</body></html>"]) + "\n"
