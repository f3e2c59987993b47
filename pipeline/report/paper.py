"""The paper stage: compile paper/paper.tex with latexmk into one PDF, atomically.

    python -m pipeline.report.paper --source paper/paper.tex --report-dir results/report/demo \
        --out results/paper/demo/paper.pdf

paper.tex inputs what the report stage wrote in the preset's report directory (numbers.tex, the
.tex tables, figures.tex and the PDF figures): latexmk defines \reportdir for it. The build runs
in a scratch directory beside the output, so a failed build leaves the previous PDF as it was;
the LaTeX log of a failure is
kept beside the output (paper.failed.log) and its first error is printed.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..config import cli
from ..runtime.files import atomic_path

TOOLS = ("latexmk", "pdflatex", "bibtex")
INSTALL = (
    "install a LaTeX toolchain: apt-get install latexmk texlive-latex-recommended "
    "texlive-latex-extra texlive-fonts-recommended lmodern (see README.md); the HTML "
    "report, results/report/<preset>/report.html, has every table and figure without it"
)


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def first_error(log: str) -> str:
    """The first '! ...' error of a LaTeX log with the line that follows it, or its tail."""
    match = re.search(r"^!.*(?:\n.*){0,3}", log, re.M)
    return match.group(0) if match else log[-1500:]


def build(source: Path, report_dir: Path, out: Path) -> None:
    missing = missing_tools()
    if missing:
        raise SystemExit(f"error: cannot build {out}: {', '.join(missing)} not found; {INSTALL}")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".paper-build-", dir=out.parent) as scratch:
        # From the paper's directory (its bibliography is beside it), with the report
        # directory relative to it: TeX reads paths with spaces badly, relative ones are short.
        reportdir = os.path.relpath(report_dir.resolve(), source.parent.resolve())
        done = subprocess.run(
            [
                "latexmk",
                "-pdf",
                "-interaction=nonstopmode",
                "-halt-on-error",
                "-file-line-error",
                f"-usepretex=\\def\\reportdir{{{reportdir}}}",
                f"-outdir={Path(scratch).resolve()}",
                source.name,
            ],
            cwd=source.parent,
            capture_output=True,
            text=True,
        )
        pdf = Path(scratch) / f"{source.stem}.pdf"
        log_file = Path(scratch) / f"{source.stem}.log"
        log = log_file.read_text(errors="replace") if log_file.exists() else done.stdout
        if done.returncode != 0 or not pdf.exists():
            kept = out.with_name(f"{out.stem}.failed.log")
            kept.write_text(log)
            raise SystemExit(f"error: latexmk could not build {source} (full log: {kept}):\n{first_error(log)}")
        with atomic_path(out) as tmp:
            shutil.copyfile(pdf, tmp)
    print(f"wrote {out}", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        parser.add_argument("--source", required=True, help="paper/paper.tex")
        parser.add_argument("--report-dir", required=True, help="results/report/<preset>")
        parser.add_argument("--out", required=True, help="results/paper/<preset>/paper.pdf")

    cli.run_stage(
        "Compile the paper with latexmk (module docstring).",
        lambda args: build(Path(args.source), Path(args.report_dir), Path(args.out)),
        arguments=arguments,
        argv=argv,
    )


if __name__ == "__main__":
    main()
