"""A torch.profiler trace (Chrome trace JSON, gzipped or not) summarised: where an iteration's
time goes when the device idles. Torch-free: it reads the file the profiler exported.

    python -m pipeline.measure.profile TRACE.json[.gz]     prints the summary as JSON

Within the window of the profiled steps (the profiler's ProfilerStep#N annotations, else every
event):
  busy share    the union of the device's intervals (kernels, copies, memsets) over the window
  host gaps     the longest stretches the device idled, each with what the host ran in it: the
                innermost Python frames and the ops that cover most of the gap
  syncs         time in host-device synchronisations (cudaStreamSynchronize, blocking
                cudaMemcpy, aten::item, aten::nonzero, ...), each name's count and seconds
  top kernels   the device's work by name, seconds and share of the window
A trace with no device events (a CPU run) reads its ops as the "device": its busy share is the
time the host spent inside aten ops, its gaps the Python in between; the summary says so.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "python_function", "user_annotation", "cuda_runtime", "cuda_driver")
# What makes the host wait for the device (or copies a device value to it, which waits)
SYNC_NAMES = re.compile(
    r"^(cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|"
    r"cudaMemcpy|cudaStreamWaitEvent|aten::item|aten::_local_scalar_dense|"
    r"aten::nonzero|aten::is_nonzero|aten::equal)$"
)
STEP = re.compile(r"^ProfilerStep#\d+$")


@dataclass(frozen=True)
class Gap:
    start_ms: float  # from the window's start
    ms: float
    frames: list  # the innermost Python frames that cover most of the gap
    ops: list  # the host ops with the largest overlap, with their overlap in ms


@dataclass(frozen=True)
class Summary:
    device: str  # "kernels" or "cpu ops (no device events in the trace)"
    window_ms: float
    steps: int  # profiled steps in the window (0: no step annotations)
    busy_share: float
    gaps: list  # Gap, longest first
    syncs: dict  # name -> {"count", "ms"}
    top: list  # {"name", "count", "ms", "share"}, most time first

    def to_json(self) -> dict:
        return asdict(self)

    def markdown(self) -> str:
        lines = [
            f"- window {self.window_ms:.1f} ms over {self.steps} step(s); device ({self.device}) "
            f"busy {100 * self.busy_share:.1f} % of it",
            "- longest gaps (device idle), with what the host ran in them:",
        ]
        lines += [
            f"  - {g.ms:.2f} ms at +{g.start_ms:.1f} ms: frames {'; '.join(g.frames) or '-'}; "
            f"ops {'; '.join(f'{n} ({ms:.2f} ms)' for n, ms in g.ops) or '-'}"
            for g in self.gaps
        ]
        lines.append(
            "- host-device syncs: "
            + (", ".join(f"{name} x{s['count']} {s['ms']:.2f} ms" for name, s in self.syncs.items()) or "none")
        )
        lines.append(
            "- top device work: "
            + ", ".join(f"{t['name'][:60]} {t['ms']:.1f} ms ({100 * t['share']:.1f} %)" for t in self.top)
        )
        return "\n".join(lines)


def read_events(path: Path) -> list[dict]:
    """The complete ('X') events of a Chrome trace, gzipped or not."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Overlapping (start, end) intervals merged, in order."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def clip(intervals, low: float, high: float) -> list[tuple[float, float]]:
    return [(max(a, low), min(b, high)) for a, b in intervals if b > low and a < high]


def overlap(event: dict, start: float, end: float) -> float:
    return max(0.0, min(event["ts"] + event["dur"], end) - max(event["ts"], start))


def summarise(events: list[dict], gaps: int = 8, top: int = 10) -> Summary:
    steps = [e for e in events if e.get("cat") in ("user_annotation", "cpu_op") and STEP.match(e["name"])]
    device = [e for e in events if e.get("cat") in DEVICE_CATEGORIES]
    kind = "kernels"
    if not device:  # a CPU trace: the ops are the work, the Python between them the gaps
        device = [e for e in events if e.get("cat") == "cpu_op" and not STEP.match(e["name"])]
        kind = "cpu ops (no device events in the trace)"
    spans = steps or events
    low = min(e["ts"] for e in spans)
    high = max(e["ts"] + e["dur"] for e in spans)
    busy = union(clip([(e["ts"], e["ts"] + e["dur"]) for e in device], low, high))
    window = high - low
    idle, last = [], low
    for start, end in busy + [(high, high)]:
        if start > last:
            idle.append((last, start))
        last = max(last, end)
    idle.sort(key=lambda gap: gap[0] - gap[1])
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES and not STEP.match(e["name"])]
    return Summary(
        kind,
        window / 1000,
        len(steps),
        sum(b - a for a, b in busy) / window if window else 0.0,
        [behind(start, end, low, host) for start, end in idle[:gaps]],
        syncs([e for e in events if low <= e["ts"] <= high]),
        top_work(device, window, top),
    )


def behind(start: float, end: float, origin: float, host: list[dict]) -> Gap:
    """What the host ran while the device idled from `start` to `end` (microseconds)."""
    length = end - start
    covering = [e for e in host if overlap(e, start, end) >= 0.5 * length]
    frames = sorted((e for e in covering if e.get("cat") == "python_function"), key=lambda e: e["dur"])
    ops = sorted(
        (
            (e["name"], overlap(e, start, end))
            for e in host
            if e.get("cat") in ("cpu_op", "cuda_runtime") and overlap(e, start, end) > 0
        ),
        key=lambda pair: -pair[1],
    )
    return Gap(
        (start - origin) / 1000,
        length / 1000,
        [e["name"] for e in frames[:3]],
        [(name, ms / 1000) for name, ms in ops[:3]],
    )


def syncs(events: list[dict]) -> dict:
    found: dict[str, dict] = defaultdict(lambda: {"count": 0, "ms": 0.0})
    for e in events:
        name = e["name"]
        if SYNC_NAMES.match(name) or (e.get("cat") == "gpu_memcpy" and "DtoH" in name):
            found[name]["count"] += 1
            found[name]["ms"] += e["dur"] / 1000
    return dict(sorted(found.items(), key=lambda item: -item[1]["ms"]))


def top_work(device: list[dict], window: float, top: int) -> list[dict]:
    totals: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in device:
        totals[e["name"]][0] += 1
        totals[e["name"]][1] += e["dur"]
    ranked = sorted(totals.items(), key=lambda item: -item[1][1])[:top]
    return [
        {"name": name, "count": count, "ms": dur / 1000, "share": dur / window if window else 0.0}
        for name, (count, dur) in ranked
    ]


def slim(path: Path, limit: int) -> str:
    """Rewrite a gzipped trace under `limit` bytes by leaving out the shortest Python frames
    (the summary was read from the whole one); says what was left out."""
    with gzip.open(path, "rt") as handle:
        trace = json.load(handle)
    events = trace["traceEvents"]
    for floor_us in (10, 100, 1000, float("inf")):
        kept = [e for e in events if e.get("cat") != "python_function" or e.get("dur", 0) >= floor_us]
        with gzip.open(path, "wt") as handle:
            json.dump(dict(trace, traceEvents=kept), handle)
        if path.stat().st_size <= limit:
            break
    return (
        "without Python frames" if floor_us == float("inf") else f"without Python frames shorter than {floor_us:g} us"
    )


def main(argv: list[str] | None = None) -> int:
    (path,) = argv if argv is not None else sys.argv[1:]
    print(json.dumps(summarise(read_events(Path(path))).to_json(), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
