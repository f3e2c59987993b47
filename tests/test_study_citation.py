"""The study this benchmark reproduces is cited as what it is (issue 48, point 4): its authors,
title, course, university and year, its hardware and software, and which of its tables each
quoted value comes from; no file of the tree says its values came from where the project files
its issues."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

from pipeline.config.params import load_resolved

REPO = Path(__file__).resolve().parents[1]
WHO = ["Wang", "Wu", "Ha", "Faster {RCNN} Image Identification Parallelism Performance "
       "Comparison between", "EE451", "Parallel and Distributed Computation",
       "University of Southern California", "2021"]
WHAT = ["PyTorch 1.8.1", "GTX 1080 Ti", "NCCL", "COCO 2017"]


def _one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def test_the_study_is_cited_with_its_authors_course_hardware_and_tables():
    bib = _one_line((REPO / "paper" / "references.bib").read_text())
    entry = bib[bib.index("@techreport{wang2021dpddp"):]
    entry = entry[:entry.index("@", 1)]
    for part in WHO + WHAT + ["its Table 1", "its Table 2"]:
        assert part in entry, part
    paper = _one_line((REPO / "paper" / "paper.tex").read_text())
    assert paper.count("wang2021dpddp") >= 2 and "could not trace" not in paper
    for part in ["Wang, Wu and Ha", "EE451", "University of Southern California", "1.8.1",
                 "GTX 1080 Ti", r"Table~1 gives COCO box AP", r"Table~2 gives"]:
        assert part in paper, part
    source = load_resolved(REPO / "params.yaml").report.published.source
    for part in ["Yingnan Wang, Jiawei Wu and Zechen Ha", "EE451", "2021", "GTX 1080 Ti"]:
        assert part in source, part


def test_no_file_of_the_tree_mentions_an_issue_tracker():
    words = "issue" + " tracker"  # spelt apart, so that this file does not match itself
    found = subprocess.run(["git", "grep", "-i", "-l", "-E", "issue[ -]?" + "tracker"],
                           cwd=REPO, capture_output=True, text=True).stdout.split()
    assert found == [], (words, found)
