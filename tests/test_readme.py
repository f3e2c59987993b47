"""Every command in the README and in docs/ runs as written (issue 39, point 8; issue 50).

Every fenced block of README.md and of each page of docs/ (```sh, ```yaml, an untyped one, and
those indented inside a list item) is classified in exactly one place:

* in `RUN_BY` below: the start of the block's first line (it must begin exactly one block's
  first line, over all those files), the test of this module that runs the block, and how; or
* in the file itself, as not runnable here: the block's first line ends with, or is, a
  comment `# not runnable here: REASON` (a GPU, a cluster, a container engine, the network),
  so that the reason stands beside the command where a reader copies it. A block whose first
  line continues with a backslash takes the comment on a line of its own above the command.

A block that is neither (or both), and an entry of `RUN_BY` that no block starts with, fails
`test_every_block_is_classified`, which names the block by its file, line and first line.
`test_the_readme_is_instructions` keeps the README short and free of commit hashes: measured
figures and their history are docs/measurements.md's.

How the runnable blocks run, and why so. The module takes 75 s of CPU (2 minutes on 2 cores
shared with other work), the fast tier's part of it 40 s: the commbench run by hand (2
processes), then Snakemake planning the workflow for each dry run; the coco2017 plans, the
set-up, the fast tier's collection, the benchmarks' --help and the training by hand are marked
slow (CI runs them).

* Snakemake commands run as written with `-n` (a dry run: it plans every job, checks params.yaml
  and every target, and runs nothing) on a copy of the workflow (tests/workflow.py:
  copy_workflow) with the repository's own params.yaml: the real demo and coco2017 take
  minutes and hours, and the demo's real run is tests/finished_demo's (on the shrunk demo).
  `--forcerun <run>/train_summary.json` must be a target that exists: its train job is the one
  forced (a run id without its `-s<seed>` is a MissingRuleException), and the console
  shows each job's purpose in one line, without lists of inputs or reasons.
  The SLURM profile's command is planned the same way (`-n` submits nothing);
  tests/test_slurm.py submits the profile's jobs to a real local SLURM where slurmd is installed.
* The overlay (README: "Change a value"): its YAML block is written to the file its command
  names and the command planned with `-n` on a copy of the workflow; params.yaml is left as it
  was, and Snakemake's own merge of the file (snakemake.utils.update_config, what
  `--configfile` does) keeps every preset of params.yaml.
* `python -m pytest -m "not slow"` runs with `--collect-only -q -n 0`: it checks the marker
  expression selects the fast tier (some tests, none marked slow) without running the suite
  from inside the suite; running it is what a developer does and CI runs every test.
* The set-up one-liners: `apt-get install` simulated (`apt-get -s`: no root, no download) with
  the package lists they name, `apt-get update` left to CI (root and the network: `.ci/run`
  runs the test one-liner exactly, checked here and in tests/test_environment.py), the venv is
  the lock (tests/test_environment.py: test_installed_environment_is_the_lock), and the
  workflow's own command planned (above).
* The benchmark scripts (docs/gpu.md): each exists and its own `--help` parses (all in one process, torch
  imported once: each script trains for minutes when run); torchrun's options on the
  sync_overheads line parse with torchrun's parser. accuracy_seeds.py's command line with the
  arguments docs/measurements.md gives is parsed and each of its configurations validated against params.yaml,
  the script stopped before it generates data (tests/test_accuracy_seeds.py runs the script for
  real on a shrunk demo).
* The what-if commands (README: "Ask the cost model about your own cluster") run as written, in-process, in a folder
  laid out as a finished clone's: the example cluster file and a made-up finished demo
  (tests/test_whatif.py builds it; that module runs the command in a process of its own).
* The DVC block (README: "COCO 2017 through DVC") is run by tests/test_coco_fetch.py
  (test_dvc_commands_leave_a_users_trees_alone, marked slow: a local HTTP server stands in for
  COCO's), which reads its commands from this block (readme_dvc_commands); here: that it does.

A command `snakemake -p` prints runs by hand as well (test_printed_commands_run_by_hand): its
stage takes the knobs the workflow passes in FRCNN_BENCH_KNOBS from params.yaml's default preset
when that variable is not set (pipeline/config/stages.py: parsed_config).
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from argparse import Namespace
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pipeline import strategies
from pipeline.config import params, schema, stages

from .conftest import HANG_S, REPO
from .workflow import copy_workflow, edit_params, jobs, tiny_params

README = REPO / "README.md"
PAGES = [README] + sorted((REPO / "docs").glob("*.md"))  # every file whose blocks are classified
MARK = "# not runnable here:"
BIN = Path(sys.executable).parent  # the environment's bin, as the README's `.venv/bin/`

# The start of a block's first line -> the test that runs the block, and how.
RUN_BY = {
    "apt-get update && xargs -a apt/paper.txt": (
        "test_setup_one_liners", "apt-get install simulated (-s) with apt/paper.txt; the venv is the lock "
        "(test_environment); `.venv/bin/snakemake --cores all` planned (-n) on a copy of the demo"),
    "apt-get update && cat apt/paper.txt apt/tests.txt": (
        "test_setup_one_liners", "equals .ci/run's command (CI runs it); apt-get install simulated (-s) with "
        "apt/paper.txt and apt/tests.txt; the venv is the lock (test_environment)"),
    '.venv/bin/python -m pytest -m "not slow"': (
        "test_fast_tier_selects_the_fast_tests", "run with --collect-only -q -n 0: the fast tier is selected"),
    ".venv/bin/snakemake --cores all --config preset=demo-quick": (
        "test_demo_quick_plans", "dry run (-n) on a copy of the workflow: one training job per strategy"),
    ".venv/bin/python -m pipeline.compare": (
        "test_compare_commands_run", "each line run as written in a clone's folder holding made-up finished "
        "demo and demo-quick runs, beside ../before/results (tests/test_compare.py builds them)"),
    "presets:": (
        "test_configfile_overlay_plans", "written to the file the overlay command names; the preset validated"),
    ".venv/bin/snakemake --cores all --config set=": (
        "test_set_override_plans", "dry run (-n) on a copy of the workflow; the `set=` value resolved as "
        "the Snakefile resolves it, numbers kept numbers"),
    ".venv/bin/snakemake --cores all --configfile": (
        "test_configfile_overlay_plans", "dry run (-n) on a copy of the workflow with the YAML block as its file; "
        "params.yaml unchanged, every preset kept by Snakemake's merge"),
    ".venv/bin/python benchmarks/accuracy_seeds.py --preset demo-parity": (
        "test_accuracy_seeds_command_parses", "its arguments parsed, each --config validated against params.yaml, "
        "stopped before any data is generated (test_accuracy_seeds runs the script shrunk)"),
    ".venv/bin/snakemake --cores all --config preset=coco2017": (
        "test_coco2017_commands_plan", "dry run (-n) on a copy of the workflow"),
    ".venv/bin/python benchmarks/compare_strategies.py": (
        "test_benchmark_scripts_parse", "each script exists and its --help parses; torchrun's options parse"),
    ".venv/bin/snakemake --profile profiles/slurm --config preset=coco2017": (
        "test_coco2017_commands_plan", "dry run (-n) through the profile (submits nothing); test_slurm runs the "
        "profile on a local SLURM where slurmd is installed"),
    ". .venv/bin/activate": (
        "test_dvc_block_is_run_by_test_coco_fetch", "run by test_coco_fetch (slow), which reads this block"),
    "data  ->  train": (None, "the stages' diagram, not a command"),
    ".venv/bin/python -m pipeline.whatif": (
        "test_whatif_commands_run", "each line run as written in a folder holding the example cluster "
        "file and a made-up finished demo under results/ (tests/test_whatif.py); its CSV written there"),
    ".venv/bin/snakemake --cores all --forcerun": (
        "test_forcerun_names_a_real_run", "dry run (-n) on a copy of the demo: its train job is the forced one"),
}


@dataclass(frozen=True)
class Block:
    file: str       # README.md or docs/<page>.md
    line: int       # of the opening fence, 1-based
    info: str       # sh, yaml, or "" (untyped)
    text: str       # without the fences, dedented by the fence's indentation

    @property
    def first(self) -> str:
        return self.text.splitlines()[0].strip() if self.text.strip() else ""

    @property
    def reason(self) -> str | None:
        """The reason the README gives beside the block for not running it here, if any."""
        found = re.search(re.escape(MARK) + r"\s*(.*)$", self.first)
        return found.group(1).strip() if found else None

    def __str__(self) -> str:
        return f"{self.file}:{self.line} ```{self.info}: {self.first[:100]}"


def blocks(text: str, file: str = "README.md") -> list[Block]:
    """Every fenced block, at any indentation (a block inside a list item is indented)."""
    found, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = re.fullmatch(r"( *)```\s*(\S*)\s*", lines[i])
        if not opening:
            i += 1
            continue
        indent, body, j = opening.group(1), [], i + 1
        while j < len(lines) and not re.fullmatch(r" *```\s*", lines[j]):
            body.append(lines[j][len(indent):] if lines[j].startswith(indent) else lines[j].lstrip())
            j += 1
        if j == len(lines):
            raise AssertionError(f"{file}:{i + 1}: a fence that is never closed")
        found.append(Block(file, i + 1, opening.group(2), "\n".join(body)))
        i = j + 1
    return found


def classification(found: list[Block]) -> tuple[dict[str, Block], list[str]]:
    """RUN_BY's key of each block (or its README mark) and the problems: a block classified
    nowhere or twice, a key that starts no block or several."""
    problems, keyed = [], {}
    for key in RUN_BY:
        starting = [b for b in found if b.first.startswith(key)]
        if len(starting) != 1:
            problems.append(f"RUN_BY[{key!r}] starts {len(starting)} blocks, not one: "
                            + ("; ".join(map(str, starting)) or "the block was changed or removed"))
        else:
            keyed[key] = starting[0]
    by_block = {(b.file, b.line): k for k, b in keyed.items()}
    for b in found:
        if b.reason is not None and (b.file, b.line) in by_block:
            problems.append(f"{b}: both marked not runnable and run by {RUN_BY[by_block[b.file, b.line]][0]}")
        elif b.reason is not None and len(b.reason) < 10:
            problems.append(f"{b}: marked not runnable here without a reason beside it")
        elif b.reason is None and (b.file, b.line) not in by_block:
            problems.append(f"{b}: neither run by a test (RUN_BY in tests/test_readme.py) nor marked "
                            f"'{MARK} REASON' on its first line")
    return keyed, problems


def readme_blocks() -> list[Block]:
    """The blocks of the README and of every page of docs/."""
    return [b for page in PAGES for b in blocks(page.read_text(), page.relative_to(REPO).as_posix())]


def blocks_run_by(test: str) -> list[Block]:
    keyed, problems = classification(readme_blocks())
    found = [keyed[k] for k, (name, _) in RUN_BY.items() if name == test and k in keyed]
    assert found, f"no README block is run by {test}: {problems}"
    return found


def command(text: str) -> str:
    """A block's command: continuation lines joined, comments kept out."""
    joined = text.replace("\\\n", " ")
    return " ".join(line.split(" #")[0].strip() for line in joined.splitlines() if line.strip())


def argv(line: str) -> list[str]:
    """A README command's words, `.venv/bin/X` as this environment's X."""
    words = shlex.split(line.split(" #")[0])
    return [str(BIN / w.removeprefix(".venv/bin/")) if w.startswith(".venv/bin/") else w for w in words]


# ---- the classification ----------------------------------------------------------------------

def test_every_block_is_classified():
    found = readme_blocks()
    assert len(found) >= 15 and {b.file for b in found} > {"README.md"}
    _, problems = classification(found)
    assert not problems, "README blocks:\n" + "\n".join(problems)
    for name, _ in RUN_BY.values():
        assert name is None or callable(globals().get(name)), f"RUN_BY names {name}, not a test here"


def test_an_unclassified_block_is_named():
    text = ("* **A list item**:\n\n  ```sh\n  .venv/bin/snakemake --cores all --new-flag\n"
            "  ```\n\n```yaml\nother: 1  # not runnable here: it needs a GPU cluster\n```\n")
    found = readme_blocks() + blocks(text, "docs/new.md")
    assert found[-2].info == "sh" and found[-2].first == ".venv/bin/snakemake --cores all --new-flag"
    assert found[-1].reason == "it needs a GPU cluster"
    _, problems = classification(found)
    assert problems == [f"docs/new.md:{found[-2].line} ```sh: .venv/bin/snakemake --cores all --new-flag: neither "
                        f"run by a test (RUN_BY in tests/test_readme.py) nor marked '{MARK} REASON' on its "
                        "first line"]


def test_the_readme_is_instructions():
    """About 300 lines, and no commit hash (a word of 7 to 40 hex digits, letters and digits
    both): measured figures and their history are docs/measurements.md's, which may cite them."""
    text = README.read_text()
    assert len(text.splitlines()) <= 320
    hashes = re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", text)
    assert not hashes, f"README.md cites commit hashes {hashes}: name the tree in docs/measurements.md"
    for page in PAGES[1:]:  # each page of docs/ is linked from the README
        assert f"(docs/{page.name}" in text, f"README.md does not link docs/{page.name}"


def test_marked_blocks_say_why():
    """Each block the README and docs/ mark names what this machine lacks for it: a GPU, a container
    engine or root, a cluster, the network."""
    marked = [b for b in readme_blocks() if b.reason is not None]
    assert len(marked) >= 5  # gpu_check, docker, podman, apptainer, uv
    for block in marked:
        assert re.search(r"GPU|Docker|Apptainer|root|cluster|network|PyPI", block.reason), block


# ---- the workflow's commands -------------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_copy(tmp_path_factory) -> Path:
    """The workflow with the repository's own params.yaml, copied once for every dry run."""
    return copy_workflow(tmp_path_factory.mktemp("readme-demo"))


def dry_run(workdir: Path, words: list[str]) -> subprocess.CompletedProcess:
    result = subprocess.run(words + ["-n"], cwd=workdir, capture_output=True, text=True, timeout=HANG_S,
                            env={k: v for k, v in os.environ.items() if k != stages.KNOBS_ENV})
    assert result.returncode == 0, f"{shlex.join(words)} -n failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert "This was a dry-run" in result.stdout + result.stderr
    return result


def planned(result: subprocess.CompletedProcess) -> list[dict]:
    """Each job a dry run printed, in the default profile's one line (rules/common.smk:
    purpose): "Job 5: train: <run> -> <its train_summary.json> (log: ...)"."""
    return [{"rule": rule, "line": line} for rule, line in
            re.findall(r"^Job \d+: (\w+): (.*)$", result.stdout + result.stderr, re.MULTILINE)]


def test_forcerun_names_a_real_run(demo_copy):
    """`--forcerun <run>/train_summary.json` plans, and the job it forces is that run's training
    (a run id without its `-s<seed>` is no target: MissingRuleException); the console says each
    job's purpose in one line, without the lists of inputs and reasons (profiles/default)."""
    (block,) = blocks_run_by("test_forcerun_names_a_real_run")
    words = argv(command(block.text))
    target = words[words.index("--forcerun") + 1]
    result = dry_run(demo_copy, words)
    text = result.stdout + result.stderr
    assert [job["rule"] for job in planned(result) if target in job["line"]] == ["train"]
    assert re.search(r"^    forced:\n        train$", text, re.MULTILINE)  # Snakemake's reasons, summed up
    assert not re.search(r"^ +(input|reason): ", text, re.MULTILINE)
    assert len(planned(result)) == sum(jobs(result).values())


@pytest.mark.slow
def test_coco2017_commands_plan(demo_copy):
    """`--config preset=coco2017`, locally and through the SLURM profile, plans the study."""
    found = blocks_run_by("test_coco2017_commands_plan")
    assert len(found) == 2
    for block in found:
        words = argv(command(block.text))
        assert "preset=coco2017" in words
        result = dry_run(demo_copy, words)
        counts = jobs(result)
        assert counts["train"] == counts["evaluate"] > 0 and counts["data"] == 1, counts
        assert "results/runs/coco2017/single-w1-b2-s0/train_summary.json" in result.stdout + result.stderr


def test_configfile_overlay_plans(demo_copy, tmp_path):
    """The README's overlay, written to the file its command names, plans its preset with every
    other preset kept (Snakemake merges the file key by key), and leaves params.yaml as it was."""
    from snakemake.utils import update_config

    (block, command_block) = sorted(blocks_run_by("test_configfile_overlay_plans"), key=lambda b: b.info != "yaml")
    assert block.info == "yaml" and command_block.info == "sh"
    words = argv(command(command_block.text))
    overlay, preset = words[words.index("--configfile") + 1], words[words.index("--config") + 1]
    name = preset.removeprefix("preset=")
    workdir = shutil.copytree(demo_copy, tmp_path / "clone", ignore=shutil.ignore_patterns(".snakemake"))
    (workdir / overlay).write_text(block.text)
    before = (workdir / "params.yaml").read_bytes()

    result = dry_run(workdir, words)
    assert jobs(result)["train"] > 0
    assert f"results/runs/{name}/" in result.stdout + result.stderr
    assert (workdir / "params.yaml").read_bytes() == before

    raw = yaml.safe_load(before)
    merged = yaml.safe_load(before)
    update_config(merged, yaml.safe_load(block.text))  # what --configfile does
    assert set(merged["presets"]) == set(raw["presets"]) | {name}
    assert all(merged["presets"][p] == raw["presets"][p] for p in raw["presets"])
    cfg = params.resolve(dict(merged, preset=name))  # refused with its message if wrong
    parent = params.resolve(dict(raw, preset=merged["presets"][name]["extends"]))
    assert cfg.train.epochs != parent.train.epochs and cfg.sweep == parent.sweep


def test_set_override_plans(demo_copy):
    """`--config set='train.epochs=4; ...'` plans the demo with the changed values, typed."""
    (block,) = blocks_run_by("test_set_override_plans")
    words = argv(command(block.text))
    result = dry_run(demo_copy, words)
    counts = jobs(result)
    assert counts["train"] == counts["evaluate"] > 0, counts
    overrides = words[words.index("--config") + 1].removeprefix("set=")
    cfg = params.load_resolved(REPO / "params.yaml", overrides=overrides)
    plain = params.load_resolved(REPO / "params.yaml")
    assert cfg.train.epochs == 4 != plain.train.epochs and cfg.train.lr_steps == [3]


def test_demo_quick_plans(demo_copy):
    """`--config preset=demo-quick` plans one training and one evaluation job per strategy."""
    (block,) = blocks_run_by("test_demo_quick_plans")
    result = dry_run(demo_copy, argv(command(block.text)))
    counts = jobs(result)
    assert counts["train"] == counts["evaluate"] == len(strategies.STRATEGIES), counts
    assert "results/runs/demo-quick/ddp-w2-b4-s0/train_summary.json" in result.stdout + result.stderr


def test_compare_commands_run(monkeypatch, tmp_path, capsys):
    """The compare block's lines, run as written in a clone holding made-up finished demo and
    demo-quick runs, beside a second clone (../before) with demo runs of its own."""
    from pipeline import compare

    from .test_compare import tree

    (block,) = blocks_run_by("test_compare_commands_run")
    tree(tree(tmp_path / "clone" / "results", "demo", {"single-w1-b8": [30.0, 30.2, 29.9]}),
         "demo-quick", {"single-w1-b8": [30.1]})
    tree(tmp_path / "before" / "results", "demo", {"single-w1-b8": [25.0, 25.1, 24.9]})
    monkeypatch.chdir(tmp_path / "clone")
    lines = [line for line in block.text.splitlines() if line.strip()]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line)
        assert words[:3] == [".venv/bin/python", "-m", "pipeline.compare"]
        compare.main(words[3:])
        printed = capsys.readouterr().out
        assert re.search(r"^single-w1-b8 +images/s .*n=3", printed, re.M), printed
    assert "beyond the noise" in printed  # 30.0 against 25.0 images/s, 3 seeds each
    assert (tmp_path / "clone" / "results" / "compare-demo.csv").exists()


@pytest.mark.slow
def test_setup_one_liners(demo_copy):
    """The quick start's set-up and workflow one-liner, and the tests' one-liner that CI runs."""
    one_liners = {b.first: b.first for b in blocks_run_by("test_setup_one_liners")}
    test_command = next(c for c in one_liners if c.endswith("-m pytest"))
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == test_command  # CI runs the README's command, apt-get update included
    for line in one_liners:
        parts = [p.strip() for p in line.split("&&")]
        assert parts[0] == "apt-get update"  # root and the network: CI's
        assert parts[2:4] == ["python3.11 -m venv .venv", ".venv/bin/pip install --no-cache-dir -r requirements.lock"]
        assert sys.version_info[:2] == (3, 11)  # the venv's python; its packages: test_environment
        if shutil.which("apt-get"):
            simulated = parts[1].replace("apt-get install", "apt-get -s install")
            result = subprocess.run(["bash", "-c", simulated], cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        if not parts[-1].endswith("-m pytest"):  # the workflow's own command, planned
            assert parts[-1] == ".venv/bin/snakemake --cores all"
            counts = jobs(dry_run(demo_copy, argv(parts[-1])))
            runs = int(re.search(r"for its (\d+) training runs", README.read_text())[1])
            assert counts["train"] == counts["evaluate"] == runs, counts


@pytest.mark.slow
def test_fast_tier_selects_the_fast_tests():
    (block,) = blocks_run_by("test_fast_tier_selects_the_fast_tests")
    words = argv(command(block.text)) + ["--collect-only", "-q", "-n", "0", "-p", "no:cacheprovider"]
    result = subprocess.run(words, cwd=REPO, capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    counted = re.search(r"(\d+)/(\d+) tests collected \((\d+) deselected\)", result.stdout)
    assert counted, result.stdout[-2000:]
    selected, total, deselected = map(int, counted.groups())
    assert 0 < selected < total and selected + deselected == total
    ids = [line for line in result.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    assert len(ids) == selected and "tests/test_readme.py::test_every_block_is_classified" in ids
    assert "tests/test_readme.py::test_forcerun_names_a_real_run" in ids
    assert not any(i.startswith("tests/test_readme.py::test_setup_one_liners") for i in ids)  # slow


# ---- the benchmarks ----------------------------------------------------------------------------

HELP_EACH = """
import contextlib, io, runpy, sys
from torch.distributed.run import get_args_parser
for script, launcher in __import__("json").loads(sys.argv[1]):
    if launcher:
        get_args_parser().parse_args(launcher[1:] + [script])  # exits 2 on an unknown option
    sys.argv, out = [script, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as exit:
        assert exit.code in (0, None), (script, exit.code)
    assert out.getvalue().startswith("usage:"), (script, out.getvalue()[:300])
    print("ok", script)
"""


@pytest.mark.slow
def test_benchmark_scripts_parse():
    (block,) = blocks_run_by("test_benchmark_scripts_parse")
    scripts = []
    for line in block.text.splitlines():
        words = argv(line)
        script = next(w for w in words if w.endswith(".py"))
        assert Path(words[0]).is_file(), words[0]  # .venv/bin/python or .venv/bin/torchrun
        assert (REPO / script).is_file(), script
        launcher = words[:words.index(script)] if words[0].endswith("torchrun") else []
        scripts.append((script, launcher))
    assert len(scripts) >= 10
    result = subprocess.run([sys.executable, "-c", HELP_EACH, json.dumps(scripts)], cwd=REPO,
                            capture_output=True, text=True, timeout=HANG_S)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert result.stdout.count("ok ") == len(scripts)


def test_whatif_commands_run(monkeypatch, tmp_path, capsys):
    """The what-if block's commands in a folder laid out as a finished clone's: the example
    cluster file and a made-up finished demo (its run folders and commbench JSON)."""
    from pipeline import whatif

    from .test_whatif import finished_preset

    (block,) = blocks_run_by("test_whatif_commands_run")
    finished_preset(tmp_path / "results", "demo")
    (tmp_path / "examples").mkdir()
    shutil.copy(REPO / "examples" / "cluster-8x8.yaml", tmp_path / "examples")
    monkeypatch.chdir(tmp_path)
    lines = [line for line in block.text.splitlines() if line.strip()]
    assert len(lines) == 2
    for line in lines:
        words = shlex.split(line)
        assert words[:3] == [".venv/bin/python", "-m", "pipeline.whatif"]
        whatif.main(words[3:])
        assert capsys.readouterr().out.startswith(f"{whatif.LABEL}: 8 x 8 GPUs")
    written = pd.read_csv(tmp_path / "results" / "whatif" / "cluster-8x8.csv")
    assert set(written["gpus"]) == {1, 2, 4, 8, 16, 32, 64}


def test_accuracy_seeds_command_parses(monkeypatch, tmp_path):
    """The README's command line, up to generating data: its arguments and configurations."""
    from benchmarks import accuracy_seeds

    class Parsed(Exception):
        pass

    def stop(root, spec):
        raise Parsed(spec)

    (block,) = blocks_run_by("test_accuracy_seeds_command_parses")
    words = shlex.split(command(block.text))
    assert words[:2] == [".venv/bin/python", "benchmarks/accuracy_seeds.py"]
    monkeypatch.setattr(accuracy_seeds.synthetic, "generate", stop)
    with pytest.raises(Parsed) as parsed:
        accuracy_seeds.main(words[2:] + ["--work", str(tmp_path)])
    parity = params.load_resolved(REPO / "params.yaml", preset="demo-parity")
    assert parsed.value.args[0] == parity.data.synthetic  # the preset the README names


def test_dvc_block_is_run_by_test_coco_fetch():
    """test_coco_fetch runs the DVC commands it reads from this block (against a local server)."""
    from . import test_coco_fetch

    (block,) = blocks_run_by("test_dvc_block_is_run_by_test_coco_fetch")
    commands = test_coco_fetch.readme_dvc_commands()
    assert commands and callable(test_coco_fetch.test_dvc_commands_leave_a_users_trees_alone)
    for words in commands:
        assert "dvc " + " ".join(words) in block.text, words
    assert (BIN / "activate").is_file() and (BIN / "dvc").is_file()


# ---- commands `snakemake -p` prints ------------------------------------------------------------

def printed_commands(result: subprocess.CompletedProcess) -> dict[str, list[str]]:
    """rule -> the shell commands `snakemake -n -p` printed for its jobs."""
    found: dict[str, list[str]] = {}
    rule = None
    for line in (result.stdout + result.stderr).splitlines():
        head = re.match(r"(?:local)?rule (\w+):|Job \d+: (\w+): ", line)  # --verbose, or not
        if head:
            rule = head[1] or head[2]
        elif line.startswith("Shell command: ") and rule:
            found.setdefault(rule, []).append(line.removeprefix("Shell command: "))
    return found


@pytest.fixture(scope="module")
def tiny_printed(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("readme-tiny"))
    edit_params(workdir, tiny_params)
    return workdir, printed_commands(dry_run(workdir, [str(BIN / "snakemake"), "--cores", "2", "-p"]))


def by_hand(workdir: Path, shell: str) -> subprocess.CompletedProcess:
    """A printed command pasted into a shell that lacks the workflow's environment, in the
    directory Snakemake ran in (its log's directory there: Snakemake makes it before a job)."""
    # the shell's `> LOG 2>&1`, or the launcher's own --log (train and evaluate jobs)
    log = re.search(r"(?:> (\S+) 2>&1|--log (\S+))$", shell)
    log = log[1] or log[2]
    (workdir / log).parent.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != stages.KNOBS_ENV}
    result = subprocess.run(["bash", "-c", shell], cwd=workdir, env=env, capture_output=True, text=True,
                            timeout=HANG_S)
    result.log = (workdir / log).read_text()
    assert result.returncode == 0, result.log[-3000:]
    return result


@pytest.mark.slow  # end to end: every printed command run; parsing them is fast (test_knobs_*)
def test_printed_commands_run_by_hand(tiny_printed):
    """commbench's command, copied from `snakemake -p`, run without FRCNN_BENCH_KNOBS: its knobs
    come from params.yaml's default preset, said in one line (it ended in KeyError: 'timeout_s')."""
    workdir, printed = tiny_printed
    (shell,) = printed["commbench"]
    result = by_hand(workdir, shell)
    out = workdir / re.search(r"--out (\S+)", shell)[1]
    assert json.loads(out.read_text())["processes"] == 2
    said = [line for line in result.log.splitlines() if stages.KNOBS_ENV in line]
    assert said == [f"{stages.KNOBS_ENV} is not set and no --knobs given: the commbench stage takes its knobs "
                    'from params.yaml\'s default preset (demo): '
                    '{"parallel": {"crash_retries": 1, "max_restarts": 0, "timeout_s": 120}}']


@pytest.mark.slow
def test_printed_data_and_train_commands_run_by_hand(tiny_printed):
    """The data job's and single's training job's printed commands, by hand, train the run."""
    workdir, printed = tiny_printed
    (data,) = printed["data"]
    by_hand(workdir, data)
    (train,) = [c for c in printed["train"] if "--out results/runs/demo/single-w1-b4-s0 " in c]
    result = by_hand(workdir, train)
    summary = json.loads((workdir / "results/runs/demo/single-w1-b4-s0/train_summary.json").read_text())
    assert summary["status"] == "ok", summary
    # said once, by the launcher (on the terminal: before it holds the run and opens its log)
    said = (result.stderr + result.log).splitlines()
    assert sum(stages.KNOBS_ENV in line for line in said) == 1, said[-20:]


# ---- where the knobs come from -----------------------------------------------------------------

def commbench_args(cfg: schema.Config, **given) -> Namespace:
    return Namespace(config=json.dumps(stages.config_for(cfg, "commbench")), knobs=given.get("knobs"))


def test_knobs_from_the_default_preset_or_a_clear_error(monkeypatch, tmp_path, capsys):
    cfg = params.load_resolved(REPO / "params.yaml", preset="coco2017")
    monkeypatch.delenv(stages.KNOBS_ENV, raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as refused:  # no params.yaml here
        stages.parsed_config(commbench_args(cfg), "commbench")
    assert "--knobs" in str(refused.value) and stages.KNOBS_ENV in str(refused.value)
    assert "parallel.timeout_s" in str(refused.value) and "params.yaml" in str(refused.value)

    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    got = stages.parsed_config(commbench_args(cfg), "commbench")
    default = params.load_resolved(REPO / "params.yaml")
    assert isinstance(got, schema.CommbenchStage) and got.parallel.timeout_s == default.parallel.timeout_s
    assert got.model_dump() == stages.with_knobs(stages.config_for(cfg, "commbench"),
                                                 stages.knobs_for(default, "commbench"))
    assert capsys.readouterr().err.count("\n") == 1

    knobs = {"parallel": {"timeout_s": 7, "max_restarts": 3}}  # given: used, nothing said
    assert stages.parsed_config(commbench_args(cfg, knobs=json.dumps(knobs)), "commbench").parallel.timeout_s == 7
    monkeypatch.setenv(stages.KNOBS_ENV, json.dumps({"commbench": knobs}))
    assert stages.parsed_config(commbench_args(cfg), "commbench").parallel.max_restarts == 3
    monkeypatch.delenv(stages.KNOBS_ENV)
    # the stage's whole view (stages.view) carries them
    whole = stages.view(schema.replaced(cfg, parallel={"timeout_s": 9}), "commbench")
    assert stages.parsed_config(Namespace(config=json.dumps(whole.model_dump()), knobs=None), "commbench") == whole
    assert capsys.readouterr().err == ""


# ---- links between the README and docs/ ---------------------------------------------------------

def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_pages_resolves():
    """Each relative link of the README and docs/ names a file that exists, and a heading of it
    where it names one (`docs/measurements.md#accuracy`)."""
    broken = []
    for page in PAGES:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+://", target):
                continue
            path, _, heading = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            if not file.exists():
                broken.append(f"{page.name}: {target} (no such file)")
            elif heading and heading not in {anchor(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)}:
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken
