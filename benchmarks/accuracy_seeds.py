"""AP over seeds: one run of a preset (its single run unless --entry says otherwise) trained
once per seed and configuration, with mean, standard deviation and 95 % interval of AP, AP50
and images/s, and Welch's t between configurations. A single run misleads by up to 0.05 AP on
the demo (issue 15): compare configurations here.

    .venv/bin/python benchmarks/accuracy_seeds.py [--preset demo-parity] [--seeds 7]
        [--parallel 2] [--entry '{"strategy": "ps", ...}'] [--set KEY=VALUE ...]
        [--config 'NAME: KEY=VALUE ...' ...] [--out FILE]

--config adds a configuration: a name, then overrides of the preset in dotted keys with YAML
values, e.g.  --config 'recipe:'  --config 'warm-up 50: train.warmup_iters=50'; keys under
`entry.` change the sweep entry instead: --config 'ssp1: entry.staleness=1'.
Runs are started as the workflow starts them, but without its check that the machine has a
core per process (a dedicated parameter server shares them).
Without --config the preset is trained as it is. --set applies to every configuration (a
shrunk demo: data.synthetic.train_images=32 train.epochs=1). The first configuration is
compared with each of the others. --parallel runs that many trainings at once, each with
cores/parallel threads (on a GPU they share it). The results, with provenance, go to --out
(JSON). The statistics are the report's (pipeline/report/noise.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.common import evaluate, train  # noqa: E402
from pipeline.config import params, schema
from pipeline.data import synthetic  # noqa: E402
from pipeline.report.noise import NOISE_RULE, Spread, difference  # noqa: E402
from pipeline.runtime import provenance
from pipeline.runtime.files import write_json  # noqa: E402
from pipeline.strategies import sweep

METRICS = ("AP", "AP50", "images_per_second")
SHOWN = {"AP": "AP", "AP50": "AP50", "images_per_second": "images/s"}


def overrides(text: str, where: str) -> dict:
    """'a.b=1 c=x' -> {"a": {"b": 1}, "c": "x"} (values read as YAML)."""
    nested: dict = {}
    for item in text.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"{where}: '{item}' is not KEY=VALUE (e.g. train.warmup_iters=50)")
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return nested


def configuration(raw: dict, preset: str, *changes: dict) -> schema.Preset:
    """The preset with the changes merged in, validated as params.yaml is (a wrong key or
    value is refused with its path and remedy)."""
    raw = json.loads(json.dumps(raw))
    for change in changes:
        raw["presets"][preset] = params.merged(raw["presets"][preset], change)
    try:
        return schema.Preset.model_validate(params.validate(raw)[preset])
    except params.ParamsError as err:
        raise SystemExit(f"error: {err}") from None


def train_and_score(cfg: schema.Preset, entry: dict, seed: int, out: Path) -> dict:
    """One seed of the entry: trained, then scored on the validation split, as the workflow does."""
    run = dataclasses.replace(sweep.fill(entry, cfg), seed=seed)
    summary = train(cfg, run, out)
    metrics = evaluate(cfg, run, out)
    return {
        "seed": seed,
        "AP": metrics.AP,
        "AP50": metrics.AP50,
        "images_per_second": summary.images_per_second,
        "warmup_iters": summary.warmup_iters,
        "iterations": summary.iterations,
        "run_id": summary.run_id,
        **{name: summary.to_json()[name] for name in summary.facts},
    }  # ps: its staleness


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="demo-parity")
    parser.add_argument("--seeds", type=int, default=7)
    parser.add_argument("--parallel", type=int, default=1, help="trainings at once")
    parser.add_argument(
        "--entry", default='{"strategy": "single", "workers": 1}', help="the sweep entry to train, as JSON"
    )
    parser.add_argument("--set", nargs="*", default=[], help="KEY=VALUE for every configuration")
    parser.add_argument("--config", action="append", default=[], help="'NAME: KEY=VALUE ...'")
    parser.add_argument("--work", help="directory for data and runs (default: a new temporary one)")
    parser.add_argument("--out", help="results as JSON (default: WORK/accuracy_seeds.json)")
    args = parser.parse_args(argv)

    raw = params.load(REPO / "params.yaml")
    if args.preset not in raw["presets"]:
        raise SystemExit(f"error: --preset {args.preset}: not in params.yaml ({', '.join(raw['presets'])})")
    common = overrides(" ".join(args.set), "--set")
    configs, entries = {}, {}
    for text in args.config or ["as-is:"]:
        name, sep, changes = text.partition(":")
        if not sep or not name.strip():
            raise SystemExit(f"--config '{text}': write it as 'NAME: KEY=VALUE ...'")
        changed = overrides(changes, f"--config {name}")
        entries[name.strip()] = {**json.loads(args.entry), **changed.pop("entry", {})}
        configs[name.strip()] = configuration(raw, args.preset, common, changed)
    work = Path(args.work or tempfile.mkdtemp(prefix="accuracy-seeds-"))
    cores = os.cpu_count() or 1
    data: dict[str, Any] = {}  # one generated dataset per distinct data section
    generators: dict[str, Any] = {}
    for name, cfg in list(configs.items()):
        generator = cfg.data.synthetic
        key = json.dumps(None if generator is None else generator.model_dump(), sort_keys=True)
        data.setdefault(key, work / f"data-{len(data)}")
        generators.setdefault(key, generator)
        configs[name] = schema.replaced(
            cfg,
            data={"root": str(data[key])},
            train={"threads": max(1, cores // args.parallel), "monitor_interval_s": 0},
        )
    for key, root in data.items():
        if not (root / "annotations").exists():
            synthetic.generate(root, generators[key])
    print(
        f"{args.preset}: {args.seeds} seeds x {len(configs)} configuration(s), {args.parallel} at "
        f"once, {cores} cores; work in {work}",
        flush=True,
    )

    jobs = {(name, seed): work / f"{name.replace(' ', '_')}-s{seed}" for name in configs for seed in range(args.seeds)}
    results: dict[str, list[dict]] = {name: [] for name in configs}
    with concurrent.futures.ThreadPoolExecutor(args.parallel) as pool:
        futures = {
            pool.submit(train_and_score, configs[name], entries[name], seed, out): name
            for (name, seed), out in jobs.items()
        }
        for future in concurrent.futures.as_completed(futures):
            record = future.result()
            results[futures[future]].append(record)
            print(
                f"   {futures[future]} seed {record['seed']}: AP {record['AP']:.4f} AP50 "
                f"{record['AP50']:.4f} ({record['images_per_second']:.1f} images/s)",
                flush=True,
            )

    print(
        f"\n{'configuration':<24}{'runs':>5}"
        + "".join(f"{SHOWN[m] + ' mean ± sd':>21}{'95 % interval':>20}" for m in METRICS)
    )
    table = {}
    for name, records in results.items():
        records.sort(key=lambda r: r["seed"])
        table[name] = {m: Spread.of([r[m] for r in records]) for m in METRICS}
        cells = ""
        for m in METRICS:
            spread = table[name][m]
            low, high = spread.interval
            cells += f"{spread.mean:>13.4f} ± {spread.sd:.4f}{f'[{low:.3f}, {high:.3f}]':>20}"
        print(f"{name:<24}{len(records):>5}{cells}")
    names = list(configs)
    comparisons = []
    for other in names[1:]:
        for m in METRICS:
            d = difference(table[names[0]][m], table[other][m])
            comparisons.append(
                {
                    "a": names[0],
                    "b": other,
                    "metric": m,
                    "difference": d.a.mean - d.b.mean,
                    "low": d.low,
                    "high": d.high,
                    "t": d.t,
                    "df": d.df,
                    "verdict": d.verdict,
                }
            )
            print(
                f"{names[0]} - {other}: {SHOWN[m]} {d.a.mean - d.b.mean:+.4f} (95 % interval {d.low:+.4f} to "
                f"{d.high:+.4f}; Welch t = {d.t:.2f}, df {d.df:.1f}): {d.verdict}"
            )
    report = {
        "preset": args.preset,
        "seeds": args.seeds,
        "rule": NOISE_RULE,
        "configurations": {
            name: {
                "overrides": text,
                "runs": results[name],
                **{
                    m: {"mean": s.mean, "sd": s.sd, "n": s.n, "interval95": list(s.interval)}
                    for m, s in table[name].items()
                },
            }
            for name, text in zip(names, args.config or ["as-is:"], strict=False)
        },
        "comparisons": comparisons,
        "provenance": provenance.collect(configs[names[0]].model_dump(), parallel=args.parallel, cores=cores),
    }
    write_json(Path(args.out or work / "accuracy_seeds.json"), report)
    return report


if __name__ == "__main__":
    main()
