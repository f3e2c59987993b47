"""The answer: what the results say, generated from them (answer() -> Answer). The abstract,
the results, the conclusion and the top of the report state it: for each worker count the entries
ranked by images/s and by AP with the noise rule's verdicts (noise.py, ranking.py), by how much,
and why in the data's terms (ranking_why.py: time split, communication share, bytes per
iteration, memory per worker, the cost model's reading); the baseline's AP gap (baseline_gap.py);
the entries that did not run, once, with their reason; the counts and the time it all took. No
number in it is typed: a different machine or preset gets its own.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from ..runtime.records.equivalence import EquivalenceRecord
from .baseline_gap import baseline_gaps, equivalence_sentence, equivalence_short, gap_headline, gap_sentence
from .load import RunDir, strategy_label
from .ranking import Ranking, headline, ranking_sentences, rankings
from .ranking_why import WHY_COLUMNS, model_summary, short_why, why_throughput
from .render import Section
from .tables import entry_means, tex_escape
from .wording import duration, joined, macro


def inference_seconds(runs: list[RunDir]) -> dict[str, float]:
    """run id -> the seconds its final evaluation's inference took (metrics.json)."""
    return {run.run_id: float(run.metrics.inference_seconds or 0.0) for run in runs if run.ok}


def not_run_sentence(summary: pd.DataFrame) -> str:
    """Every entry with a run that did not complete, once, with its reason; an entry of which
    some runs finished is said to be ranked on those, fewer seeds than planned."""
    bad = summary[summary["status"] != "ok"]
    if bad.empty:
        return "Every run of the sweep completed."
    verbs = {"skipped": "was skipped", "failed": "failed"}
    completed = summary[summary["status"] == "ok"].groupby("entry").size()
    found, partial = [], False
    for (status, reason), group in bad.fillna({"reason": ""}).groupby(["status", "reason"], sort=False):
        named = []
        for entry, runs_ in group.groupby("entry", sort=False):
            total, done = int((summary["entry"] == entry).sum()), int(completed.get(entry, 0))
            count = f"{total} run{'s' if total > 1 else ''}"
            if len(runs_) < total:
                count = f"{len(runs_)} of its {total} runs"
            if done:  # the other seeds finished: ranked on them
                partial = True
                count += f"; ranked on the {done} seed{'s' if done > 1 else ''} that finished"
            named.append(f"{strategy_label(runs_.iloc[0]['strategy'], '')} ({entry}, {count})")
        why = str(reason).strip().rstrip(".")
        said = f"{joined(named)} {verbs.get(status, f'ended {status}')}" + (f": {why}." if why else ".")
        found.append(said[0].upper() + said[1:])
    opening = (
        "Not completed on this machine (an entry none of whose runs finished is neither ranked nor discussed): "
        if partial
        else "Not run on this machine, so neither ranked nor discussed: "
    )
    return opening + " ".join(found)


@dataclass(frozen=True)
class Answer:
    """The answer in generated sentences, and the counts numbers.tex defines."""

    counts: dict[str, int]
    counts_sentence: str
    time_sentence: str
    workflow_time: str
    throughput: list[str]  # paragraphs, one per worker count (and data mode)
    accuracy: list[str]  # paragraphs
    not_run: str
    abstract: str
    conclusion: str
    scope: str
    out_of_sample: str = ""  # the cost model on the held-out entries (holdout.py); '' if none

    def section(self) -> Section:
        """The report's long-form answer, right under the verdict (verdict.py)."""
        return Section(
            "The answer in full: rankings, intervals and entries",
            [
                self.counts_sentence,
                *self.throughput,
                *filter(None, [self.out_of_sample]),
                *self.accuracy,
                self.not_run,
                self.time_sentence,
                self.scope,
            ],
        )

    def macros(self) -> str:
        paragraphs = {
            "AnswerCounts": [self.counts_sentence],
            "AnswerTime": [self.time_sentence],
            "WorkflowTime": [self.workflow_time],
            "AnswerThroughput": self.throughput,
            "AnswerAccuracy": self.accuracy,
            "NotRun": [self.not_run],
            "AnswerAbstract": [self.abstract],
            "AnswerConclusion": [self.conclusion],
            "AnswerScope": [self.scope],
        }
        return "".join(macro(name, str(value)) for name, value in self.counts.items()) + "".join(
            macro(name, "\n\n".join(tex_escape(p) for p in texts)) for name, texts in paragraphs.items()
        )


def counts_of(summary: pd.DataFrame) -> tuple[dict[str, int], str]:
    ok = summary["status"] == "ok"
    skipped = int((summary["status"] == "skipped").sum())
    failed = int(len(summary) - ok.sum() - skipped)
    per_entry = summary[ok].groupby("entry", sort=False).size()
    seeded = per_entry[per_entry >= 2]
    counts = {
        "RunCount": len(summary),
        "CompletedCount": int(ok.sum()),
        "SkippedCount": skipped,
        "FailedCount": failed,
        "EntryCount": int(summary["entry"].nunique()),
        "CompletedEntryCount": len(per_entry),
        "SeededEntries": len(seeded),
        "SingleSeedEntries": int((per_entry == 1).sum()),
    }
    repeats = [f"{count} ran over {n} seeds" for n, count in sorted(seeded.value_counts().items(), reverse=True)]
    once = counts["SingleSeedEntries"]
    ran = joined(repeats + ([f"{once} ran once"] if once else []))
    return counts, (
        f"{counts['RunCount']} training runs of {counts['EntryCount']} sweep entries (an entry's "
        f"runs differ only in their seed): {counts['CompletedCount']} completed, {skipped} skipped"
        + (f", {failed} failed" if failed else "")
        + ". "
        + (f"Of the {len(per_entry)} entries that ran, {ran}." if len(per_entry) else "No entry completed a run.")
    )


def time_of(summary: pd.DataFrame, inference: dict[str, float]) -> tuple[str, str]:
    """The completed runs' recorded seconds of training and evaluation, summed, and what that
    leaves out."""
    done = summary[summary["status"] == "ok"]
    seconds = float(
        done["train_seconds"].fillna(0).sum()
        + done["evaluation_seconds"].fillna(0).sum()
        + sum(inference.get(run, 0.0) or 0.0 for run in done["run_id"])
    )
    text = duration(seconds)
    return text, (
        f"The {len(done)} completed runs trained and evaluated for {text} in all on their "
        "machine: the sum of the "
        "seconds their records hold for training, for the evaluations during training and for "
        "the final evaluation's inference. Process start-up, data preparation, the link "
        "benchmark, the equivalence check and the report are not in it, so the workflow takes "
        "longer."
    )


def scope_sentence(dataset: str) -> str:
    if dataset == "coco2017":
        return (
            "These runs train on COCO 2017, the published study's data; only its own recipe "
            "and hardware make their AP and time comparable with the published values."
        )
    return (
        f"These runs train on {dataset} data, not COCO 2017: they show that every strategy "
        "trains and is measured the same way and how the strategies compare on this machine; "
        "their absolute AP and times are not comparable with the published values."
    )


def answer(
    summary: pd.DataFrame,
    compared: pd.DataFrame,
    predicted: pd.DataFrame | None = None,
    equivalence: EquivalenceRecord | None = None,
    dataset: str = "unknown",
    inference: dict[str, float] | None = None,
    out_of_sample: str = "",
) -> Answer:
    """The answer from the results: `summary` (load.summary_frame, every run), `compared`
    (noise.comparisons), `predicted` (prediction.prediction_frame: the runs the model was fitted
    beside), `equivalence` (the one-step check's record), `inference` (run id -> its final
    evaluation's seconds), `out_of_sample` (holdout.HeldOut.sentence: the model on the held-out
    entries, '' where none was held out)."""
    counts, counts_sentence = counts_of(summary)
    workflow_time, time_sentence = time_of(summary, inference or {})
    done = summary[summary["status"] == "ok"]
    primary = "real" if (done["data_mode"] == "real").any() else None
    means = entry_means(summary, WHY_COLUMNS).set_index("entry") if len(done) else None

    def shown(r: Ranking) -> bool:  # an in-memory entry alone at its workers: the loader's table
        return r.mode == primary or primary is None or len(r.order) > 1

    speed = [r for r in rankings(summary, compared, "images_per_second") if shown(r)]
    throughput = [
        " ".join(ranking_sentences(r) + (why_throughput(r, means, summary, predicted) if len(r.order) > 1 else []))
        for r in speed
    ]
    aside = [e for r in rankings(summary, compared, "images_per_second") if not shown(r) for e in r.order]
    if aside:
        one = len(aside) == 1
        throughput.append(
            f"{joined(aside)} ran on in-memory tensors, alone at "
            f"{'its' if one else 'their'} worker count: "
            f"{'it measures' if one else 'they measure'} the loader's share (the "
            "data modes' table), not a ranking."
        )
    quality = [r for r in rankings(summary, compared, "AP") if shown(r)]
    gaps = baseline_gaps(summary)
    accuracy = [" ".join(ranking_sentences(r)) for r in quality]
    beyond = [g for g in gaps if g.above or g.below]
    accuracy += [gap_sentence(g) for g in gaps]
    if beyond and (why := equivalence_sentence(equivalence)):
        accuracy.append(f"Why they differ: the multi-worker strategies do not take single's step. {why}")
    if not accuracy:
        accuracy = ["No completed run was scored (AP)."]
    not_run = not_run_sentence(summary)
    headlines = [headline(r) for r in speed if len(r.order) > 1 and r.mode == (primary or r.mode)]
    abstract = " ".join([counts_sentence, *headlines, *(gap_headline(g) for g in gaps)])
    multi = [r for r in speed if len(r.order) > 1 and r.workers > 1]
    why_ap = equivalence_short(equivalence)
    conclusion = (
        " ".join(
            [
                *headlines,
                *filter(None, (short_why(r, means) for r in multi)),
                *filter(None, (model_summary(r, predicted) for r in multi)),
                *filter(None, [out_of_sample]),
                *(gap_headline(g)[:-1] + (f": {why_ap}." if why_ap and (g.above or g.below) else ".") for g in gaps),
            ]
        )
        or "No two entries ran at one worker count."
    )
    return Answer(
        counts,
        counts_sentence,
        time_sentence,
        workflow_time,
        throughput,
        accuracy,
        not_run,
        abstract,
        conclusion,
        scope_sentence(dataset),
        out_of_sample,
    )
