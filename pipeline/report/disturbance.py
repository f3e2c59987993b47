"""A disturbed measurement is flagged, never silently used. Noise is judged like with like:
only runs that must cost the same are compared (pipeline/measure/stats.py's rule, which the GPU
check shares). The verdicts open the report (its measurement check, `section`), the paper's
Method section (\\MachineNoise in numbers.tex, `tex_macro`) and the cost model's
(pipeline/report/prediction.py):

An entry's seeds (`entry_repeats`): the runs of one sweep entry differ only in their seed, so
they cost the same. A run far outside its entry's other seeds (Repeats.outliers: a robust rule,
more than TOLERANCE and 3.5 scaled MADs from their median) is named as an outlier, its value
beside theirs; the entry's spread is then read without it. Where the rest still disagree by
more than TOLERANCE (fastest over slowest), the machine was noisy. Why 10 %: a quiet 2-core
machine's seeds of one entry agree within a few per cent (single's three seeds: 1 % apart),
while a workflow that shared the machine with another job measured runs 41 % apart.

Runs identical by construction (`identical_runs_check`): one worker in one process of ddp (no
compression hook), ps (colocated), zero and fsdp computes exactly single's steps (their tests:
tests/test_strategies.py), but their wrappers do not cost the same as single: their gap to
single's runs with the same images a step, data mode, precision, memory layout, threads and
device is that strategy's overhead (in ms an iteration and as a ratio, with its 95 % interval;
stats.gap, a strategy run once borrowing single's spread), never machine noise.

The commbench stage's measurements (`commbench_inputs`): each carries its check
(pipeline/costmodel/bands.py), inside its band (trusted), outside it after the stage's repeats
(disturbed), or none (a JSON from before the checks: unchecked). The cost model does not use a
disturbed shared-compute factor: it takes the factor a quiet machine shows (1 where the
processes have the cores to themselves), an assumption it names; disturbed links and strategy
timings have no stand-in and are used as measured, flagged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..costmodel.bands import BANDS_TEXT
from ..measure.stats import Gap, Repeats, gap
from ..runtime.records.commbench import Check, CommbenchRecord
from ..runtime.records.training import RunSummary
from .load import RunDir, reader_name, required, speed
from .render import Section
from .tables import signed, significant, tex_escape
from .wording import bandwidth_text

TOLERANCE = 0.10  # an entry's seeds, outliers aside: fastest over slowest minus 1; the outliers' margin
# What computes exactly single's steps at one worker in one process: strategy -> its variants
# that do (None: any). ddp's compression hooks change the step; ps at one process is colocated.
IDENTICAL_TO_SINGLE = {"single": None, "ddp": {""}, "ps": None, "zero": None, "fsdp": None}


def identical_to_single(s: RunSummary) -> bool:
    """Whether a run (a completed one's summary) computes exactly single's steps
    (IDENTICAL_TO_SINGLE)."""
    variants = IDENTICAL_TO_SINGLE.get(s.strategy or "", set())
    return (
        s.workers == 1
        and (s.processes or 1) == 1
        and s.images_per_second is not None
        and s.images_per_second > 0
        and (variants is None or (s.variant or "") in variants)
    )


def _speed(value: float) -> str:
    """Images/s as the check says them: three significant figures."""
    return significant(value)


def _runs(speeds) -> str:
    return ", ".join(f"{run} {_speed(speed)}" for run, speed in speeds)


# ---- an entry's seeds: repeats of one configuration -------------------------------------------
@dataclass(frozen=True)
class EntryRepeats:
    """The completed runs of one sweep entry (its seeds) and their images/s, slowest first, and
    those far outside the others (outliers)."""

    entry: str
    name: str  # as a reader says it: 'ZeRO-1, 2 workers'
    speeds: tuple[tuple[str, float], ...]  # (run id, images/s), slowest first
    outliers: tuple[tuple[str, float], ...]  # the same pairs, for the outliers
    retried: frozenset[str] = frozenset()  # run ids trained after a crash: judged like their seeds

    @property
    def kept(self) -> Repeats:
        """The seeds but the outliers: what the entry's spread is read from."""
        return Repeats.of(speed for run, speed in self.speeds if (run, speed) not in self.outliers)

    @property
    def spread(self) -> float:
        """Fastest over slowest minus 1 of the seeds but the outliers (NaN with fewer than 2)."""
        return self.kept.disagreement

    @property
    def noisy(self) -> bool:
        return not math.isnan(self.spread) and self.spread > TOLERANCE

    def outlier_sentences(self) -> list[str]:
        others = [speed for run, speed in self.speeds if (run, speed) not in self.outliers]
        listed = (
            ", ".join(_speed(v) for v in others[:-1]) + " and " + _speed(others[-1])
            if len(others) > 1
            else _speed(others[0])
        )
        return [
            f"{run} ran at {_speed(speed)} images/s against {listed} for the other seeds of "
            f"{self.entry} ({self.name}): an outlier, {abs(speed / self.kept.median - 1):.0%} "
            f"{'below' if speed < self.kept.median else 'above'} their median (more than "
            f"{TOLERANCE:.0%} and 3.5 robust deviations from it). It stays in the entry's "
            "means; the entry's spread is read without it."
            + (
                " It was trained again after its job crashed; its speed is that of the attempt that finished."
                if run in self.retried
                else ""
            )
            for run, speed in self.outliers
        ]

    def sentence(self) -> str:
        return (
            f"{self.entry}'s {len(self.speeds)} seeds measured {_runs(self.speeds)} images/s: "
            f"{self.spread:.0%} apart"
            + (", the outliers aside" if self.outliers else "")
            + (f", more than the {TOLERANCE:.0%} tolerance" if self.noisy else "")
            + "."
        )


def entry_repeats(runs: list[RunDir]) -> list[EntryRepeats]:
    """Each entry with 2 or more completed runs that measured images/s, in sweep order."""
    groups: dict[str, list[RunDir]] = {}
    for run in runs:
        s = run.summary
        if run.ok and s.images_per_second is not None and s.images_per_second > 0:
            groups.setdefault(run.entry, []).append(run)
    found = []
    for entry, members in groups.items():
        if len(members) < 2:
            continue
        speeds = tuple(sorted(((r.run_id, speed(r.summary)) for r in members), key=lambda pair: pair[1]))
        far = Repeats.of(v for _, v in speeds).outliers(TOLERANCE)
        outliers = tuple(pair for pair in speeds if pair[1] in far)
        s = members[0].summary
        retried = frozenset(r.run_id for r in members if r.summary.failed_attempts)
        name = reader_name(s.strategy, s.variant, s.data_mode, s.workers)
        found.append(EntryRepeats(entry, name, speeds, outliers, retried))
    return found


# ---- one process: a strategy's overhead over single -------------------------------------------
@dataclass(frozen=True)
class Overhead:
    """A one-process strategy against single's runs of the same setting: milliseconds an
    iteration (their medians' difference, the 95 % interval of the means') and the ratio of
    their times (stats.gap over ms per iteration)."""

    entry: str
    name: str
    runs: int
    gap: Gap  # ms per iteration: this entry's against single's

    def sentence(self) -> str:
        g = self.gap
        interval = (
            "" if math.isnan(g.delta_low) else f" (95% interval {signed(g.delta_low)} to {signed(g.delta_high)} ms)"
        )
        return (
            f"{self.name} ({self.entry}, {self.runs} run{'s' if self.runs > 1 else ''}): "
            f"{signed(g.delta)} ms an iteration{interval}, {significant(g.ratio)}x single's "
            f"time, {g.verdict}."
        )


@dataclass(frozen=True)
class IdenticalRuns:
    """Runs identical by construction in one setting: single's (the reference) and each
    one-process strategy's overhead over them."""

    setting: str
    single: tuple[tuple[str, float], ...]  # (run id, images/s), slowest first
    overheads: tuple[Overhead, ...]

    def sentence(self) -> str:
        median = Repeats.of(speed for _, speed in self.single).median
        found = (
            f"Identical by construction ({self.setting}): single's median "
            f"{_speed(median)} images/s over {len(self.single)} run"
            f"{'s' if len(self.single) > 1 else ''}"
        )
        if not self.overheads:
            return found + "."
        return (
            found + "; the one-process strategies compute single's steps inside their "
            "wrappers, and their gap to single is each one's own cost, not machine noise: "
            + " ".join(o.sentence() for o in self.overheads)
        )


def _ms(run: RunDir) -> float:
    """Milliseconds an iteration, from images/s and the images an iteration."""
    s = run.summary
    images = s.global_batch or required(s.images_per_worker, "images_per_worker") * required(s.workers, "workers")
    return 1000 * images / speed(s)


def identical_runs_check(runs: list[RunDir]) -> list[IdenticalRuns]:
    """The runs that compute exactly single's steps (`identical_to_single`), grouped by images a
    step, data mode, precision, memory layout, threads and device; one IdenticalRuns per group
    with a single run and another strategy's: the other strategies' overheads over single."""
    groups: dict[tuple, list[RunDir]] = {}
    for run in runs:
        if run.ok and identical_to_single(run.summary):
            s = run.summary
            key = (
                s.images_per_worker,
                s.data_mode,
                s.precision,
                bool(s.channels_last),
                s.threads,
                str(s.device or "cpu"),
            )
            groups.setdefault(key, []).append(run)
    found = []
    for (images, mode, precision, layout, threads, device), members in groups.items():
        single = [r for r in members if r.summary.strategy == "single"]
        others: dict[str, list[RunDir]] = {}
        for r in members:
            if r.summary.strategy != "single":
                others.setdefault(r.entry, []).append(r)
        if not single or not others:
            continue
        reference = Repeats.of(_ms(r) for r in single)
        overheads = tuple(
            Overhead(
                entry,
                reader_name(rs[0].summary.strategy, rs[0].summary.variant, rs[0].summary.data_mode, 1),
                len(rs),
                gap(Repeats.of(_ms(r) for r in rs), reference, borrow=True),
            )
            for entry, rs in others.items()
        )
        found.append(
            IdenticalRuns(
                f"one worker, {images} images a step, {mode} data, {precision}"
                f"{', channels last' if layout else ''}, {threads} thread(s), {device}",
                tuple(sorted(((r.run_id, speed(r.summary)) for r in single), key=lambda pair: pair[1])),
                overheads,
            )
        )
    return found


# ---- the commbench stage's inputs --------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    """One commbench measurement the cost model takes, and whether it trusts it."""

    processes: int
    name: str  # "all_reduce link", "shared-compute factor", "fsdp timed on the model"
    value: str  # what was measured, in words
    status: str  # trusted | disturbed | unchecked
    reason: str = ""

    def text(self) -> str:
        return f"{self.name} at {self.processes} processes ({self.value})" + (f": {self.reason}" if self.reason else "")


def _status(check: Check | None) -> tuple[str, str]:
    if check is None:
        return "unchecked", ""
    return ("disturbed", check.disturbed) if check.disturbed else ("trusted", "")


def commbench_inputs(commbench: dict[int, CommbenchRecord]) -> list[Input]:
    """Every input the cost model takes from the commbench JSONs (process count -> JSON):
    each link's fit, the shared-compute factor (and the in-step terms timed in its repeats,
    under its check) and each strategy timed on the model, with its check's verdict."""
    found = []
    for n, bench in sorted(commbench.items()):
        for name, prim in bench.primitives.items():
            value = f"latency {prim.alpha_s * 1e6:.1f} us, {bandwidth_text(prim.bandwidth_gbit_s)}"
            found.append(Input(n, f"{name} link", value, *_status(prim.check)))
        if bench.shared_compute:
            found.append(
                Input(
                    n,
                    "shared-compute factor",
                    f"x{bench.shared_compute.factor:.3f}",
                    *_status(bench.shared_compute.check),
                )
            )
            if (terms := bench.shared_compute.in_step) is not None:  # timed in the same repeats
                found.append(
                    Input(
                        n,
                        "in-step terms",
                        f"wait {terms.wait_s * 1e3:.1f} ms, "
                        f"{terms.bucket_s * 1e3:.2f} ms a bucket, "
                        f"{terms.message_s * 1e3:.2f} ms a message",
                        *_status(bench.shared_compute.check),
                    )
                )
        calibrations = bench.calibrations
        for name, timings in (calibrations.strategies if calibrations else {}).items():
            assert calibrations is not None  # the loop runs over its strategies only
            value = ", ".join(f"{key.removesuffix('_s')} {seconds * 1e3:.1f} ms" for key, seconds in timings.items())
            found.append(Input(n, f"{name} timed on the model", value, *_status(calibrations.checks.get(name))))
    return found


def shared_factor_disturbed(bench: CommbenchRecord | None) -> bool:
    """Whether this commbench file marked its shared-compute factor disturbed."""
    return bool(bench and bench.shared_compute and bench.shared_compute.disturbed)


def verdict(commbench: dict[int, CommbenchRecord]) -> str:
    """The cost model's verdict on its commbench inputs: which it trusted, which it did not
    and what it did instead, which nobody checked."""
    inputs = commbench_inputs(commbench)
    if not inputs:
        return "No commbench input to judge."
    by = {status: [i for i in inputs if i.status == status] for status in ("trusted", "disturbed", "unchecked")}
    parts = []
    if by["trusted"]:
        parts.append(
            "Inputs trusted (inside the bands of a quiet machine: "
            + BANDS_TEXT
            + "): "
            + "; ".join(f"{i.name} at {i.processes} processes" for i in by["trusted"])
            + "."
        )
    for i in by["disturbed"]:
        instead = (
            "not used: the factor of a quiet machine whose processes have the cores to "
            "themselves is assumed instead (shown in the table)"
            if i.name == "shared-compute factor"
            else "used as measured (there is nothing to stand in for it), flagged: the "
            "predictions that take it are less certain"
        )
        parts.append(f"NOT trusted, disturbed: {i.text()}; {instead}.")
    if by["unchecked"]:
        parts.append(
            "Unchecked (a commbench JSON from before its checks; rerun the commbench "
            "stage to check them), used as measured: " + "; ".join(i.text() for i in by["unchecked"]) + "."
        )
    return " ".join(parts)


# ---- what the report and the paper say ---------------------------------------------------------
@dataclass(frozen=True)
class MeasurementCheck:
    """The checks' results: what the report's first lines and \\MachineNoise say."""

    entries: tuple[EntryRepeats, ...]
    identical: tuple[IdenticalRuns, ...]
    disturbed: tuple[Input, ...]  # commbench inputs outside their band after repeats

    @property
    def noisy(self) -> bool:
        return any(e.noisy for e in self.entries)

    @property
    def noise(self) -> str:
        """Why the machine was noisy, in a clause; '' where it was quiet."""
        if not self.noisy:
            return ""
        worst = max((e for e in self.entries if e.noisy), key=lambda e: e.spread)
        return (
            f"the machine was noisy (the seeds of {worst.entry}, which cost the same, differ in "
            f"speed by {worst.spread:.0%}, more than the {TOLERANCE:.0%} tolerance)"
        )

    @property
    def outliers(self) -> list[tuple[EntryRepeats, str, float]]:
        """(its entry, run id, images/s) of every outlier run."""
        return [(e, run, speed) for e in self.entries for run, speed in e.outliers]

    def lines(self) -> list[str]:
        """The check's first line: noisy or not, and why; then each entry's seeds, each
        outlier, each setting's overheads, each disturbed commbench input."""
        outliers = self.outliers
        named = "; ".join(f"{run} ({_speed(speed)} images/s)" for _, run, speed in outliers)
        if self.noisy:
            worst = max((e for e in self.entries if e.noisy), key=lambda e: e.spread)
            head = (
                f"The machine was noisy: the seeds of one entry ({worst.entry}), which cost the "
                f"same, differ in speed by {worst.spread:.0%}"
                + (" with its outliers aside" if worst.outliers else "")
                + f", more than the {TOLERANCE:.0%} tolerance, so a difference in images/s of "
                "that size between two entries may be the machine's, not the strategies'."
            )
        elif self.entries:
            head = (
                f"No sign of a noisy machine: each entry's seeds agree within the "
                f"{TOLERANCE:.0%} tolerance"
                + (
                    f", once {len(outliers)} outlier run{'s' if len(outliers) > 1 else ''} "
                    f"{'are' if len(outliers) > 1 else 'is'} set aside: {named}"
                    if outliers
                    else ""
                )
                + "."
            )
        else:
            head = "Machine noise not checked: no entry completed two or more runs."
        lines = [head] + [o for e in self.entries for o in e.outlier_sentences()]
        lines += [e.sentence() for e in self.entries]
        lines += [group.sentence() for group in self.identical]
        if self.disturbed:
            lines.append(self.disturbed_sentence())
        return lines

    def disturbed_sentence(self) -> str:
        """The commbench inputs kept marked disturbed, in one sentence ("" where none is)."""
        if not self.disturbed:
            return ""
        return (
            "The commbench stage measured the machine while it was disturbed, and "
            "kept these marked after its repeats: "
            + "; ".join(i.text() for i in self.disturbed)
            + ". The cost model's section says what it did with them."
        )

    def section(self) -> Section:
        return Section(
            "Measurement check: noise, outliers, overheads, disturbed measurements",
            [
                self.lines()[0],
                f"Rule: noise is read only from runs that cost the same, an entry's seeds. A seed "
                f"more than {TOLERANCE:.0%} and 3.5 robust deviations (scaled median absolute "
                "deviations) from the median of its entry's seeds is an outlier, named; the others "
                f"more than {TOLERANCE:.0%} apart (fastest over slowest) mark the machine noisy. One "
                "worker of ddp without a compression hook, ps, zero or fsdp computes single's steps "
                "but pays for its wrapper: its gap to single's runs of the same setting is that "
                "overhead, in ms an iteration with its 95% interval (a strategy run once takes "
                "single's spread), not noise. The commbench stage repeats a measurement outside "
                f"its band and marks one that stays there ({BANDS_TEXT}).",
            ],
            bullets=self.lines()[1:],
        )

    def tex_macro(self) -> str:
        """\\MachineNoise for numbers.tex: the paper's Method section's sentences."""
        lines = self.lines()  # its first names the outliers, with their values
        overheads = [group.sentence() for group in self.identical]
        names = [f"{i.name} at {i.processes} processes" for i in self.disturbed]
        disturbed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1] if names else ""
        text = " ".join(
            [lines[0], *overheads]
            + (
                [
                    f"The commbench stage's {disturbed} stayed outside the band of a quiet machine after "
                    "its repeats and are flagged in the report; the cost model does not use a disturbed "
                    "shared-compute factor."
                ]
                if self.disturbed
                else []
            )
        )
        return f"\\newcommand{{\\MachineNoise}}{{{tex_escape(text)}}}\n"


def measurement_check(runs: list[RunDir], commbench: dict[int, CommbenchRecord]) -> MeasurementCheck:
    """The checks over the report's runs and commbench JSONs (process count -> JSON)."""
    return MeasurementCheck(
        tuple(entry_repeats(runs)),
        tuple(identical_runs_check(runs)),
        tuple(i for i in commbench_inputs(commbench) if i.status == "disturbed"),
    )
