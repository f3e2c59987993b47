"""A disturbed measurement is flagged, never silently used. Two checks, whose verdicts open the
report (its first section, `section`), the paper's Method section (\\MachineNoise in
numbers.tex, `tex_macro`) and the cost model's (pipeline/report/prediction.py):

Runs identical by construction (`identical_runs_check`): one worker in one process of single,
ddp (no compression hook), ps (colocated), zero and fsdp computes exactly single's steps (their
tests: tests/test_strategies.py), so runs of them with the same images a step, data mode,
precision, memory layout, threads and device should be as fast as each other, seeds included.
When the fastest of such a group is more than TOLERANCE faster than its slowest, the machine
was noisy. Why 10 %: what the wrappers add at one process is at most fsdp's 15.5-16.5 ms an
iteration (FSDP2's copies in and out of its buffers; ddp +2.7-2.9, zero +3.0-3.2, ps +0.9-1.3:
benchmarks/timing_cost.py, README), 5 % of the demo's ~330 ms step of 8 images; 10 % leaves as
much again for a quiet machine's run-to-run drift. A workflow that shared the machine with
another job measured 24.3 to 34.4 images/s for them (41 %).

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
from ..runtime.record import Check, CommbenchRecord, RunSummary
from .load import RunDir
from .render import Section
from .tables import tex_escape

TOLERANCE = 0.10  # fastest over slowest of runs identical by construction, minus 1
# What computes exactly single's steps at one worker in one process: strategy -> its variants
# that do (None: any). ddp's compression hooks change the step; ps at one process is colocated.
IDENTICAL_TO_SINGLE = {"single": None, "ddp": {""}, "ps": None, "zero": None, "fsdp": None}


def identical_to_single(s: RunSummary) -> bool:
    """Whether a run (a completed one's summary) computes exactly single's steps
    (IDENTICAL_TO_SINGLE)."""
    variants = IDENTICAL_TO_SINGLE.get(s.strategy, set())
    return (s.workers == 1 and (s.processes or 1) == 1 and s.images_per_second is not None and s.images_per_second > 0
            and (variants is None or (s.variant or "") in variants))


@dataclass(frozen=True)
class IdenticalRuns:
    """A group of runs identical by construction: what they share and each one's images/s."""

    setting: str
    speeds: tuple[tuple[str, float], ...]  # (run id, images/s), slowest first

    @property
    def spread(self) -> float:
        """How much faster the fastest run was than the slowest: fastest / slowest - 1."""
        return self.speeds[-1][1] / self.speeds[0][1] - 1

    @property
    def noisy(self) -> bool:
        return self.spread > TOLERANCE

    def sentence(self) -> str:
        runs = ", ".join(f"{run} {speed:.1f}" for run, speed in self.speeds)
        verdict = (f"more than the {TOLERANCE:.0%} tolerance: the machine was noisy" if self.noisy
                   else f"within the {TOLERANCE:.0%} tolerance")
        return (f"{len(self.speeds)} runs identical by construction ({self.setting}) measured "
                f"{self.speeds[0][1]:.1f} to {self.speeds[-1][1]:.1f} images/s ({runs}): the "
                f"fastest {self.spread:.0%} above the slowest, {verdict}.")


def identical_runs_check(runs: list[RunDir]) -> list[IdenticalRuns]:
    """THE check of a noisy machine: the report's runs that compute exactly single's steps (`identical_to_single`),
    grouped by images a step, data mode, precision, memory layout, threads and device; one
    IdenticalRuns per group of 2 or more (a group of one has nothing to agree with). A group
    whose `noisy` is true says the machine was."""
    groups: dict[tuple, list[tuple[str, float]]] = {}
    for run in runs:
        if not run.ok:
            continue
        s = run.summary
        if not identical_to_single(s):
            continue
        key = (s.images_per_worker, s.data_mode, s.precision, bool(s.channels_last), s.threads,
               str(s.device or "cpu"))
        groups.setdefault(key, []).append((run.run_id, float(s.images_per_second)))
    return [IdenticalRuns(f"one worker, {images} images a step, {mode} data, {precision}"
                          f"{', channels last' if layout else ''}, {threads} thread(s), {device}",
                          tuple(sorted(speeds, key=lambda pair: pair[1])))
            for (images, mode, precision, layout, threads, device), speeds in groups.items()
            if len(speeds) > 1]


# ---- the commbench stage's inputs --------------------------------------------------------------
@dataclass(frozen=True)
class Input:
    """One commbench measurement the cost model takes, and whether it trusts it."""

    processes: int
    name: str      # "all_reduce link", "shared-compute factor", "fsdp timed on the model"
    value: str     # what was measured, in words
    status: str    # trusted | disturbed | unchecked
    reason: str = ""

    def text(self) -> str:
        return (f"{self.name} at {self.processes} processes ({self.value})"
                + (f": {self.reason}" if self.reason else ""))


def _status(check: Check | None) -> tuple[str, str]:
    if check is None:
        return "unchecked", ""
    return ("disturbed", check.disturbed) if check.disturbed else ("trusted", "")


def commbench_inputs(commbench: dict[int, CommbenchRecord]) -> list[Input]:
    """Every input the cost model takes from the commbench JSONs (process count -> JSON):
    each link's fit, the shared-compute factor and each strategy timed on the model, with
    its check's verdict."""
    found = []
    for n, bench in sorted(commbench.items()):
        for name, prim in bench.primitives.items():
            value = (f"latency {prim.alpha_s * 1e6:.1f} us, "
                     f"{(prim.bandwidth_gbit_s or math.nan):.2f} Gbit/s")
            found.append(Input(n, f"{name} link", value, *_status(prim.check)))
        if bench.shared_compute:
            found.append(Input(n, "shared-compute factor", f"x{bench.shared_compute.factor:.3f}",
                               *_status(bench.shared_compute.check)))
        calibrations = bench.calibrations
        for name, timings in (calibrations.strategies if calibrations else {}).items():
            value = ", ".join(f"{key.removesuffix('_s')} {seconds * 1e3:.1f} ms"
                              for key, seconds in timings.items())
            found.append(Input(n, f"{name} timed on the model", value,
                               *_status(calibrations.checks.get(name))))
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
    by = {status: [i for i in inputs if i.status == status]
          for status in ("trusted", "disturbed", "unchecked")}
    parts = []
    if by["trusted"]:
        parts.append("Inputs trusted (inside the bands of a quiet machine: " + BANDS_TEXT + "): "
                     + "; ".join(f"{i.name} at {i.processes} processes" for i in by["trusted"]) + ".")
    for i in by["disturbed"]:
        instead = ("not used: the factor of a quiet machine whose processes have the cores to "
                   "themselves is assumed instead (shown in the table)" if i.name == "shared-compute factor"
                   else "used as measured (there is nothing to stand in for it), flagged: the "
                        "predictions that take it are less certain")
        parts.append(f"NOT trusted, disturbed: {i.text()}; {instead}.")
    if by["unchecked"]:
        parts.append("Unchecked (a commbench JSON from before its checks; rerun the commbench "
                     "stage to check them), used as measured: "
                     + "; ".join(i.text() for i in by["unchecked"]) + ".")
    return " ".join(parts)


# ---- what the report and the paper say ---------------------------------------------------------
@dataclass(frozen=True)
class MeasurementCheck:
    """Both checks' results: what the report's first lines and \\MachineNoise say."""

    identical: tuple[IdenticalRuns, ...]
    disturbed: tuple[Input, ...]  # commbench inputs outside their band after repeats

    @property
    def noisy(self) -> bool:
        return any(group.noisy for group in self.identical)

    @property
    def warns(self) -> bool:
        """Whether there is something to warn of: then its section opens the report (build.py),
        above the answer; else it follows the answer."""
        return self.noisy or bool(self.disturbed)

    def lines(self) -> list[str]:
        """The report's first lines: noisy or not, and why; each disturbed commbench input."""
        if self.noisy:
            worst = max(self.identical, key=lambda g: g.spread)
            head = (f"The machine was noisy: runs identical by construction differ in speed by up "
                    f"to {worst.spread:.0%}, more than the {TOLERANCE:.0%} tolerance, so a "
                    "difference in images/s of that size between any two runs of this report may "
                    "be the machine's, not the strategies'.")
        elif self.identical:
            head = (f"No sign of a noisy machine: runs identical by construction agree within the "
                    f"{TOLERANCE:.0%} tolerance.")
        else:
            head = ("Machine noise not checked: no two completed runs are identical by "
                    "construction (one worker of single, ddp, ps, zero or fsdp with the same "
                    "settings).")
        lines = [head] + [group.sentence() for group in self.identical]
        if self.disturbed:
            lines.append("The commbench stage measured the machine while it was disturbed, and "
                         "kept these marked after its repeats: "
                         + "; ".join(i.text() for i in self.disturbed)
                         + ". The cost model's section says what it did with them.")
        return lines

    def section(self) -> Section:
        return Section("Measurement check: noisy machine, disturbed measurements", [
            self.lines()[0],
            f"Rule: runs that compute exactly single's steps (one worker in one process of "
            f"single, ddp without a compression hook, ps, zero or fsdp, with the same images a "
            f"step, data mode, precision, layout, threads and device) are as fast as each other "
            f"on a quiet machine: the fastest more than {TOLERANCE:.0%} above the slowest marks "
            "it noisy (the wrappers' own cost at one process is at most 5% of the demo's step). "
            "The commbench stage repeats a measurement outside its band and marks one that stays "
            f"there ({BANDS_TEXT})."], bullets=self.lines()[1:])

    def tex_macro(self) -> str:
        """\\MachineNoise for numbers.tex: the paper's Method section's sentence."""
        groups = " ".join(g.sentence() for g in self.identical)
        names = [f"{i.name} at {i.processes} processes" for i in self.disturbed]
        disturbed = ", ".join(names[:-1]) + (" and " if len(names) > 1 else "") + names[-1] if names else ""
        text = " ".join([self.lines()[0]] + ([groups] if groups else []) + (
            [f"The commbench stage's {disturbed} stayed outside the band of a quiet machine after "
             "its repeats and are flagged in the report; the cost model does not use a disturbed "
             "shared-compute factor."] if self.disturbed else []))
        return f"\\newcommand{{\\MachineNoise}}{{{tex_escape(text)}}}\n"


def measurement_check(runs: list[RunDir], commbench: dict[int, CommbenchRecord]) -> MeasurementCheck:
    """Both checks over the report's runs and commbench JSONs (process count -> JSON)."""
    return MeasurementCheck(tuple(identical_runs_check(runs)),
                            tuple(i for i in commbench_inputs(commbench) if i.status == "disturbed"))
