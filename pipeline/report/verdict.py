"""The verdict: what the results say in at most five sentences a reader takes in at a glance,
in the words a reader uses ("DDP, 2 workers"), never run ids, every number to three significant
figures. It opens the report (under it, the throughput figure) and the paper's abstract
(\\AnswerVerdict in numbers.tex); the long-form answer (answer.py) follows below it.

It says, for the largest worker count that ran more than one strategy on the real loader:
which strategies tie (within the noise of the fastest) and their speed against single's, which
are slower and by how much, and why in what was measured (the time split of the slowest; FSDP2's
regathering tested by the run that keeps its weights gathered); whether accuracy differs from
single's, with the interval of the difference; an outlier run or a noisy machine. A cause that
no run of the workflow tested is worded as a hypothesis: a tested one comes in as a CauseFinding
(VerdictInput.accuracy_cause: the accuracy ablation's finding, where it ran).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from .baseline_gap import BaselineGap, baseline_gaps
from .disturbance import MeasurementCheck
from .load import baseline_mask, reader_names
from .noise import Spread, difference
from .noise import spreads as noise_spreads
from .ranking import Ranking, rankings
from .ranking_why import SPLIT
from .tables import signed, significant

BEYOND, WITHIN = "beyond the noise", "within the noise"
MAX_SENTENCES = 5


@dataclass(frozen=True)
class CauseFinding:
    """A cause that runs of the workflow tested, and what they found, in a reader's words: e.g.
    cause "BatchNorm's statistics over each worker's share of the batch", finding "with GroupNorm
    the 2-worker AP is within the noise of single's (difference -0.00100, 95% interval -0.00300
    to +0.00100)". `supported`: whether the finding supports the cause; None where the runs
    cannot decide it (the cause stays a hypothesis)."""

    cause: str
    finding: str
    supported: bool | None = True


@dataclass(frozen=True)
class VerdictInput:
    """What the verdict is made from: summary.csv's frame, noise.comparisons' pairs, the
    measurement check, and the accuracy gap's tested cause where a run tested one."""

    summary: pd.DataFrame
    compared: pd.DataFrame
    check: MeasurementCheck | None = None
    accuracy_cause: CauseFinding | None = None


@dataclass(frozen=True)
class Verdict:
    sentences: tuple[str, ...]

    @property
    def text(self) -> str:
        return " ".join(self.sentences)


def _join(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _span(values, unit: str = "") -> str:
    """'37.2 to 42.2 images/s', or '0.102' where they show alike at three figures."""
    low, high = significant(min(values)), significant(max(values))
    return (low if low == high else f"{low} to {high}") + unit


def _ranking(summary: pd.DataFrame, compared: pd.DataFrame) -> Ranking | None:
    """images/s at the largest worker count where two or more entries ran on the real loader."""
    found = [
        r
        for r in rankings(summary, compared, "images_per_second")
        if r.mode == "real" and r.workers > 1 and len(r.order) > 1
    ]
    return max(found, key=lambda r: r.workers) if found else None


def _single(summary: pd.DataFrame, batch) -> tuple[str, Spread] | None:
    """The baseline entry on the real loader at `batch` images a step (else any), its spread."""
    done = summary[(summary["status"] == "ok") & (summary["data_mode"] == "real")]
    base = done[baseline_mask(done)]
    if base.empty:
        return None
    same = base[base["global_batch"] == batch]
    entry = (same if len(same) else base)["entry"].iloc[0]
    return entry, Spread.of(base[base["entry"] == entry]["images_per_second"])


def _groups(r: Ranking) -> tuple[list[str], list[str]]:
    """The entries within the noise of the fastest (it first), and those slower beyond it;
    with fewer than 2 judged entries, the fastest mean and no slower one."""
    if len(r.judged) < 2:
        return [r.order[0]], []
    fast = r.judged[0]
    top = [fast] + [e for e in r.judged[1:] if r.verdict(fast, e) == WITHIN]
    return top, [e for e in r.judged if e not in top and r.verdict(fast, e) == BEYOND]


def _speed_sentences(r: Ranking, names: dict[str, str], summary: pd.DataFrame) -> list[str]:
    top, slower = _groups(r)
    fast = top[0]
    mean = {e: r.spreads[e].mean for e in r.order}
    batch = summary.loc[summary["entry"] == fast, "global_batch"].iloc[0]
    single = _single(summary, batch)
    against = ""
    if single is not None and single[1].mean:
        ratios = sorted(mean[e] / single[1].mean for e in top)
        span = _span(ratios).replace(" to ", "x to ") + "x"
        against = f", {span} single process ({significant(single[1].mean)} images/s)"
    lead = f"With {r.workers} workers"
    if len(top) > 1:
        first = (
            f"{lead}, {_join(names[e] for e in top)} tie within the noise at "
            f"{_span([mean[e] for e in top], ' images/s')}{against}."
        )
    elif len(r.judged) >= 2:
        first = f"{lead}, {names[fast]} is the fastest at {significant(mean[fast])} images/s{against}."
    else:
        first = (
            f"{lead}, {names[fast]} has the highest mean speed, {significant(mean[fast])} "
            f"images/s{against}, but with one run on a side no difference is judged."
        )
    if not slower or len(r.judged) < 2:
        return [first]
    slowest = slower[-1]
    ratio, low, high = r.difference(slowest, fast)
    others = [e for e in slower if e != slowest]
    also = (
        f"; {_join(f'{names[e]} at {significant(r.difference(e, fast)[0])}x' for e in others)} "
        f"{'is' if len(others) == 1 else 'are'} slower too"
        if others
        else ""
    )
    second = _capital(
        f"{names[slowest]} is the slowest at {significant(mean[slowest])} images/s, "
        f"{significant(ratio)}x {names[fast]}'s (95% interval {signed(low)} to "
        f"{signed(high)} images/s){_why_slow(summary, fast, slowest)}{also}."
    )
    return [first, second]


def _capital(sentence: str) -> str:
    """A sentence that opens with a strategy's name: 'parameter server is ...' -> 'The
    parameter server is ...'; 'ZeRO-1 is ...' stays."""
    return sentence if sentence[0].isupper() else "The " + sentence


def _why_slow(summary: pd.DataFrame, fast: str, slow: str) -> str:
    """The part of the measured time split that grows most from the fastest to the slowest."""
    done = summary[summary["status"] == "ok"]
    means = done.groupby("entry")[["sec_per_iter_mean", *(f"time_{p}" for p in SPLIT)]].mean()
    if fast not in means.index or slow not in means.index:
        return ""
    F, S = means.loc[fast], means.loc[slow]
    parts = {
        p: S[f"time_{p}"] - F[f"time_{p}"]
        for p in SPLIT
        if not (math.isnan(S[f"time_{p}"]) or math.isnan(F[f"time_{p}"]))
    }
    longer = S["sec_per_iter_mean"] - F["sec_per_iter_mean"]
    if not parts or math.isnan(longer) or longer <= 0:
        return ""
    part, most = max(parts.items(), key=lambda kv: kv[1])
    return f": its iteration is {significant(longer * 1000)} ms longer, {significant(most * 1000)} ms of it in {part}"


def _fsdp_sentence(r: Ranking, names: dict[str, str], summary: pd.DataFrame) -> str:
    """FSDP2's regathering in backward, tested by the run that keeps its weights gathered."""
    firsts = summary.groupby("entry", sort=False).first()
    fsdp = {
        ("keep" if v == "keep" else ""): e
        for e in r.order
        for s, v in [(firsts.loc[e, "strategy"], firsts.loc[e, "variant"])]
        if s == "fsdp"
    }
    if "" not in fsdp:
        return ""
    reshard = fsdp[""]
    if "keep" not in fsdp or r.spreads[reshard].n < 2 or r.spreads[fsdp["keep"]].n < 2:
        if reshard not in _groups(r)[1]:
            return ""
        return (
            "Why FSDP2 is slower is untested: that it gathers each block's weights again in backward is a hypothesis."
        )
    keep = fsdp["keep"]
    ratio, low, high = r.difference(reshard, keep)
    if r.verdict(reshard, keep) == WITHIN:
        return (
            f"Gathering each block's weights again in backward costs FSDP2 no measurable speed: "
            f"the run that keeps them gathered ({names[keep]}) is within the noise of it "
            f"({significant(ratio)}x)."
        )
    if ratio < 1:
        return (
            f"Gathering each block's weights again in backward costs FSDP2 speed: it runs at "
            f"{significant(ratio)}x the run that keeps them gathered (95% interval "
            f"{signed(low)} to {signed(high)} images/s)."
        )
    return (
        f"Gathering each block's weights again in backward does not slow FSDP2 here: it runs "
        f"at {significant(ratio)}x the run that keeps them gathered, beyond the noise."
    )


def _accuracy_sentence(
    summary: pd.DataFrame, workers: int, names: dict[str, str], fastest: str, cause: CauseFinding | None
) -> str:
    gaps = [g for g in baseline_gaps(summary) if g.workers == workers]
    if not gaps:
        return ""
    g: BaselineGap = gaps[0]
    values = [s.mean for s in g.others.values()]
    span = _span(values)
    level = (
        f"single process reaches AP {significant(g.spread.mean)}, the {workers}-worker "
        f"strateg{'y' if len(values) == 1 else 'ies'} {span}"
    )
    if g.unjudged and not (g.above or g.below or g.within):
        return f"Accuracy is not judged: {level}, with one run on a side."
    if not (g.above or g.below):
        return f"Accuracy does not differ beyond the noise: {level}."
    spreads = noise_spreads(summary[(summary["status"] == "ok") & summary["AP"].notna()], "AP")
    shown = fastest if fastest in g.others else next(iter(g.others))
    d = difference(spreads[shown], g.spread)
    found = (
        f"Accuracy differs: {level}; {names[shown]} differs by {signed(d.a.mean - d.b.mean)} "
        f"(95% interval {signed(d.low)} to {signed(d.high)})"
    )
    if cause is not None and cause.supported is None:
        return (
            f"{found}; runs that tested {cause.cause} cannot decide it ({cause.finding}), so "
            "it and per-worker sampling of proposals remain hypotheses."
        )
    if cause is not None:
        verb = "supports" if cause.supported else "does not support"
        return f"{found}, and a run that tested {cause.cause} {verb} it: {cause.finding}."
    return (
        f"{found}; why is untested: per-worker BatchNorm statistics or per-worker sampling of proposals are hypotheses."
    )


def _check_sentence(check: MeasurementCheck | None, summary: pd.DataFrame, names: dict[str, str]) -> str:
    if check is None:
        return ""
    if check.noisy:
        return (
            "The machine was noisy: seeds of one configuration disagree by more than 10%, so "
            "read differences of that size with care (the measurement check)."
        )
    outliers = check.outliers
    if not outliers:
        return ""
    rows = summary.set_index("run_id")

    def which(entry: str, run: str) -> str:  # 'ZeRO-1, 2 workers, seed 2'
        workers, seed = rows.loc[run, "workers"], rows.loc[run, "seed"]
        return f"{names[entry]}, {int(workers)} worker{'s' if int(workers) != 1 else ''}" + (
            "" if seed != seed else f", seed {int(seed)}"
        )

    said = _join(which(e.entry, run) for e, run, _ in outliers if run in rows.index)
    if not said:
        return ""
    one = len(outliers) == 1
    return (
        f"{'One run' if one else f'{len(outliers)} runs'} ({said}) "
        f"{'was an outlier' if one else 'were outliers'} among {'its' if one else 'their'} "
        "entry's seeds (the measurement check)."
    )


def verdict(found: VerdictInput) -> Verdict:
    summary = found.summary
    done = summary[summary["status"] == "ok"]
    if done.empty:
        return Verdict(("No run completed, so there is nothing to compare.",))
    names = reader_names(summary, workers=False)
    r = _ranking(summary, found.compared)
    if r is None:
        return Verdict(
            tuple(
                filter(
                    None,
                    (
                        "No two strategies ran at one worker count above 1 on the real loader, so none is compared.",
                        _check_sentence(found.check, summary, names),
                    ),
                )
            )
        )
    speed = _speed_sentences(r, names, summary)
    sentences = [
        *speed,
        _fsdp_sentence(r, names, summary),
        _accuracy_sentence(summary, r.workers, names, r.order[0], found.accuracy_cause),
        _check_sentence(found.check, summary, names),
    ]
    return Verdict(tuple(s for s in sentences if s))  # at most 2 + 1 + 1 + 1: MAX_SENTENCES
