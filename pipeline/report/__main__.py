"""The report stage's command line (what it writes: the package docstring).

    python -m pipeline.report --report-config '<report section JSON>' --preset NAME \\
        --summary results/summary/demo.csv --out-dir results/report/demo [--equivalence FILE] \\
        [--commbench FILE]... [--compute-run DIR]... [--held-out ENTRY]... RUN_DIR [RUN_DIR ...]
"""

from __future__ import annotations

import pydantic

from ..config import cli, schema
from .build import build_report


def main(argv: list[str] | None = None) -> None:
    def arguments(parser):
        parser.add_argument("--report-config", required=True, help="the report section as JSON")
        parser.add_argument("--preset", required=True)
        parser.add_argument("--summary", required=True, help="CSV with one row per run")
        parser.add_argument("--out-dir", required=True)
        parser.add_argument("--equivalence", help="results/equivalence/<preset>.json (pipeline.equivalence)")
        parser.add_argument(
            "--commbench",
            action="append",
            default=[],
            metavar="FILE",
            help="a commbench stage's file (the cost model's links); once per file",
        )
        parser.add_argument(
            "--compute-run",
            action="append",
            default=[],
            metavar="DIR",
            help="a run directory of report.predict's compute preset, where that "
            "is another preset (its single-GPU time feeds the predicted scaling)",
        )
        parser.add_argument(
            "--held-out",
            action="append",
            default=[],
            metavar="ENTRY",
            help="a held-out sweep entry's id (held_out: true): the cost model is "
            "fitted without its runs, then predicts them; once per entry",
        )
        parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")

    def body(args):
        try:
            report_cfg = schema.Report.model_validate_json(args.report_config)
        except pydantic.ValidationError as err:
            raise ValueError(
                f"--report-config: {schema.first_error(err)}; pass the report section of params.yaml as JSON"
            ) from None
        build_report(
            args.run_dirs,
            report_cfg,
            args.preset,
            args.summary,
            args.out_dir,
            args.equivalence,
            args.commbench,
            args.compute_run,
            args.held_out,
        )

    cli.run_stage(
        "Summary table, paper tables, figures and reports of all runs (see the docstring "
        "of pipeline/report/__init__.py).",
        body,
        arguments=arguments,
        errors=(FileNotFoundError, ValueError),
        follows_parent=False,
        prog="python -m pipeline.report",
        argv=argv,
    )


if __name__ == "__main__":
    main()
