"""What the console shows besides Snakemake's own lines (its profile: tests/test_readme.py's
forcerun, tests/test_resources.py's --verbose plan): each rank's lines and warnings named, the
data's said once, and the answer's first sentence as the workflow's last words quote it."""
from __future__ import annotations

import os
import subprocess
import sys

from pipeline.report.render import Section, answer_sentence, render_markdown

# A process of a torchrun job as torchrun starts it (RANK, WORLD_SIZE): it logs as a stage does
# (cli.run_stage), a line of the data's, one of its own and a Python warning.
LOGS = """
import logging, warnings
from pipeline.runtime import logs
logs.configure()
logging.getLogger("pipeline.data.dataset").warning("instances_train2017.json: skipped 1 images")
logging.getLogger("train").info("loader: 23 images")
for _ in range(2):
    warnings.warn("a library's warning")  # twice from one place: shown once
"""
WARNED_AT = next(number for number, line in enumerate(LOGS.splitlines(), 1) if "warnings.warn(" in line)
WARNED = f"WARNING <string>:{WARNED_AT}: UserWarning: a library's warning"


def logged(rank: int, world: int) -> list[str]:
    env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world)}
    done = subprocess.run([sys.executable, "-c", LOGS], env=env, capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout == ""
    return [line.split(" ", 2)[2] for line in done.stderr.splitlines() if line[:2] == "20"]


def test_each_ranks_lines_carry_its_rank_and_the_datas_are_said_once():
    assert logged(1, 2) == ["[rank 1] INFO loader: 23 images", f"[rank 1] {WARNED}"]
    assert logged(0, 2) == ["[rank 0] WARNING instances_train2017.json: skipped 1 images",
                            "[rank 0] INFO loader: 23 images", f"[rank 0] {WARNED}"]
    assert logged(0, 1)[:2] == ["WARNING instances_train2017.json: skipped 1 images",
                                "INFO loader: 23 images"]  # one process: no rank to name


def test_the_answers_first_sentence_is_read_from_the_report():
    answer = ("With 2 workers, DDP has the highest mean speed, 20.3 images/s, 0.969x single "
              "process (21.0 images/s). Accuracy is not judged: single process reaches AP 0.0118.")
    markdown = render_markdown([Section("The answer", [answer, "No sign of a noisy machine."]),
                                Section("Runs", ["Every run. Its seeds."])])
    assert answer_sentence(markdown) == answer.split(". ", 1)[0] + "."
    assert answer_sentence(render_markdown([])) is None
