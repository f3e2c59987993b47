"""When a commbench measurement is trusted: the bands a quiet machine's measurements fall in.
Outside its band the commbench stage (pipeline/commbench/) measures it again, up to
`commbench.retries` more times (params.yaml); if every attempt stays outside, it keeps the
least disturbed attempt and marks it `disturbed` in its JSON, with the reason and every
attempt's values. The report says which inputs the cost model trusted
(pipeline/report/prediction.py). No torch here: the report reads the bands too.

The bands, and why (measured on this project's 2-core Xeon VM with the demo's commbench: tiny
detector, 4 images, gloo, 2 processes; quiet = the machine's other processes took 0.2-0.3 CPU-s
over the stage's 41-56 s; loaded = beside two `python -c 'while True: pass'`, or other jobs):
  other load      the CPU processes other than the job's took while a measurement ran, in cores
                  (links.with_other_load, from /proc/stat), at most OTHER_LOAD: another job on
                  the machine shows here directly, whatever the timings' own noise. Quiet:
                  0.00-0.11 cores (the torchrun agent's polls count); two spinning processes:
                  0.63-0.96. Not judged on GPUs, nor where /proc/stat shows other CPUs than the
                  process may use (a container).
  shared compute  together / alone within FACTOR_BAND x the expected factor: 1 where the
                  processes have the cores to themselves (each takes cores / processes threads:
                  runtime/distributed.py), processes x threads / cores where they do not. Quiet:
                  x0.961-1.044 once warm (x1.00-1.02 in tests/test_commbench.py); loaded:
                  x1.22-1.75, and x1.536 (3 busy processes on 2 cores: 3/2) beside one other
                  CPU-bound job. [0.90, 1.20] holds the quiet values and excludes one extra
                  job's share even on 4 cores (x1.25); below 0.90 the step alone was the slower.
  spread          the relative interquartile range of a timing's repeats, (p75 - p25) / p50. The
                  median a measurement keeps is robust to one outlier of 5 repeats, and so is
                  this; when several repeats were hit, the median is at risk, and this shows it.
                  The model's step, at most SPREAD: quiet 0.03-0.25 (the stage's first
                  `together` up to 0.30), fsdp's 0.08-0.17; loaded 0.13-0.95, so it catches a
                  passing disturbance that hit several repeats. A link, the median over message
                  sizes, at most LINK_SPREAD: quiet 0.14-0.87 (at a few KiB gloo's latency
                  jitters by tens of microseconds), loaded 0.10-0.58, so it catches only gross
                  disturbance: the other load is the test.
  link fit        its worst relative residual is kept, not judged: a quiet machine's fits missed
                  a message size by 0.23-0.89, a loaded one's by 0.25-0.96.
A machine whose processes share physical cores (hyperthreads) can stay outside the compute band
without another job; the mark then says "disturbed" all the same, and the report names it.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

log = logging.getLogger("commbench")

OTHER_LOAD = 0.30  # cores other processes took while a measurement ran
FACTOR_BAND = (0.90, 1.20)  # shared compute: together / alone, over the expected factor
SPREAD = 0.30  # relative interquartile range of the model's step over its repeats
LINK_SPREAD = 0.50  # ... of a link's timings, the median over message sizes

BANDS_TEXT = (
    f"other processes' CPU while it ran at most {OTHER_LOAD:.2f} cores, the "
    f"shared-compute factor within [{FACTOR_BAND[0]:.2f}, {FACTOR_BAND[1]:.2f}] x a quiet "
    "machine's (1 where the processes have the cores to themselves), the relative "
    f"interquartile range of a timing's repeats at most {SPREAD:.2f} for the model's "
    f"step and {LINK_SPREAD:.2f} for a link; outside, measured again (commbench.retries), "
    "then marked disturbed"
)


def relative_spread(samples: list[float]) -> float:
    """(p75 - p25) / p50 of the repeats; 0 with fewer than 2."""
    if len(samples) < 2:
        return 0.0
    low, middle, high = statistics.quantiles(samples, n=4, method="inclusive")
    return (high - low) / middle if middle > 0 else 0.0


def expected_factor(device_type: str, processes: int, threads: int, cores: int) -> float:
    """The shared-compute factor of a quiet machine: 1 on GPUs (a device each) and where the
    processes' threads fit on the cores, else the oversubscription."""
    return 1.0 if device_type == "cuda" else max(1.0, processes * threads / max(1, cores))


# Each check returns (score, reasons): score <= 1 is inside the band (the worst of value/limit
# over its criteria), reasons say what is outside it.
Verdict = tuple[float, list[str]]


def _spread(name: str, value: float, limit: float = SPREAD) -> Verdict:
    return value / limit, ([f"{name} spread {value:.2f} over its repeats > {limit:.2f}"] if value > limit else [])


def _other(value: float | None) -> Verdict:
    if value is None:  # not judged (bands' docstring)
        return 0.0, []
    return value / OTHER_LOAD, (
        [f"other processes took {value:.2f} cores meanwhile > {OTHER_LOAD:.2f}"] if value > OTHER_LOAD else []
    )


def _factor(name: str, factor: float, expected: float) -> Verdict:
    low, high = FACTOR_BAND[0] * expected, FACTOR_BAND[1] * expected
    score = max(factor / high, low / factor if factor > 0 else float("inf"))
    return score, ([f"{name} x{factor:.3f} outside [{low:.2f}, {high:.2f}]"] if score > 1 else [])


def _worst(*verdicts: Verdict) -> Verdict:
    return max(v[0] for v in verdicts), [r for v in verdicts for r in v[1]]


def link_verdict(primitive: dict) -> Verdict:
    """A primitive's fit (links.fitted's dict, with_other_load's `other_load`): the other
    processes' load meanwhile and its timings' median spread over the message sizes."""
    spread = statistics.median(primitive.get("relative_spread") or [0.0])
    return _worst(_other(primitive.get("other_load")), _spread("timing", spread, LINK_SPREAD))


def shared_verdict(shared: dict) -> Verdict:
    """shared_compute.measure's dict (with `other_load`): the factor against a quiet machine's,
    both timings' spreads, the other processes' load."""
    return _worst(
        _factor("factor", shared["factor"], shared["expected"]),
        _spread("alone", shared["alone_spread"]),
        _spread("together", shared["together_spread"]),
        _other(shared.get("other_load")),
    )


def calibration_verdict(found: dict, alone_s: float, expected: float) -> Verdict:
    """A strategy's timings on the model (Strategy.calibrate: {timings, spread: their worst,
    other_load}). Where they include the model as it is (`plain_s`, every process at once:
    shared compute's own step), that over shared compute's step alone is the shared-compute
    factor again, held to its band: the machine was as quiet while the strategy was timed."""
    timings = found["timings"]
    verdicts = [_spread("timing", found["spread"]), _other(found.get("other_load"))]
    if "plain_s" in timings and alone_s > 0:
        verdicts.append(_factor("plain step together over alone", timings["plain_s"] / alone_s, expected))
    return _worst(*verdicts)


def checked(
    what: str,
    measure: Callable[[], dict],
    verdict: Callable[[dict], Verdict],
    values: Callable[[dict], dict],
    retries: int,
    speak: bool = True,
) -> tuple[dict, dict]:
    """measure() until verdict() puts it in its band, at most 1 + `retries` times: the kept
    attempt (the first inside the band, else the one least outside it) and its check,
    {attempts: [values() of each, with its score], kept: index, disturbed: None or the
    reason}. Every rank must see the same values (the measurements all-reduce them), so all
    ranks repeat alike; `speak`: log each attempt outside the band (rank 0)."""
    attempts, found = [], []
    for attempt in range(1 + retries):
        result = measure()
        score, reasons = verdict(result)
        attempts.append({**values(result), "score": score})
        found.append((score, reasons, result))
        if score <= 1:
            break
        if speak:
            log.warning(
                "%s outside its band (%s): %s",
                what,
                "; ".join(reasons),
                "measuring again" if attempt < retries else "marked disturbed",
            )
    kept = min(range(len(found)), key=lambda i: found[i][0])
    score, reasons, result = found[kept]
    disturbed = (
        None
        if score <= 1
        else (f"{'; '.join(reasons)} (the least disturbed of {len(found)} attempts, all outside the band)")
    )
    return result, {"attempts": attempts, "kept": kept, "disturbed": disturbed}
