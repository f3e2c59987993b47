"""Repeat tests beside a competing load, to find the ones that fail only now and then.

    .venv/bin/python benchmarks/flake_hunt.py --count 20 --busy 2 [--slow] [TEST ...]

Starts `--busy` processes that each keep a core busy (`yes > /dev/null`), runs pytest in one
process (`-n 0`) with pytest-repeat's `--count`, then stops the busy processes, whatever
happened. Prints one line per test (passed / failed of its repeats) and the total; exits 1
where any repeat failed. Without TESTs it repeats SIGNAL_TESTS: every test that starts
processes and kills, stops or signals them, or takes a lock another process holds (with
`--slow`, the multi-minute ones too). No retry hides a failure: a repeat that fails is counted.
"""

from __future__ import annotations

import argparse
import collections
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# The tests that send signals, kill a job midway or wait on another process's state
# (tests/test_run_lock.py, test_bad_inputs.py, test_train.py, test_failed_runs.py, ...).
SIGNAL_TESTS = [
    "tests/test_run_lock.py",
    "tests/test_bad_inputs.py::test_a_second_process_on_a_run_is_refused",
    "tests/test_failed_runs.py::test_the_first_cause_is_a_ranks_own_error_then_a_killed_rank_never_a_lost_peer",
    "tests/test_train.py::test_killed_run_resumes_mid_epoch_to_the_uninterrupted_result",
]
SLOW_SIGNAL_TESTS = [
    "tests/test_dead_worker.py::test_a_hung_worker_fails_its_peers_within_the_timeout",
    "tests/test_strategies.py::test_sharded_strategies_resume_after_kill_to_the_uninterrupted_result",
    "tests/test_slurm.py::test_a_job_killed_by_the_scheduler_is_retried_and_resumes",
]
RESULT = re.compile(r"^(tests/\S+) (PASSED|FAILED|ERROR|SKIPPED)")
REPEAT = re.compile(r"\[(?:(.*)-)?\d+-\d+\]$")  # pytest-repeat's "[<params>-<i>-<count>]"


def tally(output: str) -> dict[str, collections.Counter]:
    """{test id without its repeat number: Counter of outcomes} from pytest's -v lines."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for line in output.splitlines():
        found = RESULT.match(line)
        if found:
            name = REPEAT.sub(lambda m: f"[{m.group(1)}]" if m.group(1) else "", found.group(1))
            counts[name][found.group(2)] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tests", nargs="*", help="pytest node ids (default: SIGNAL_TESTS)")
    parser.add_argument("--count", type=int, default=20, help="repeats of each test")
    parser.add_argument("--busy", type=int, default=2, help="processes that each keep a core busy")
    parser.add_argument("--slow", action="store_true", help="the multi-minute signal tests too")
    args = parser.parse_args()
    tests = args.tests or SIGNAL_TESTS + (SLOW_SIGNAL_TESTS if args.slow else [])
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(args.busy)]
    try:
        pytest = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-n",
                "0",
                "-p",
                "no:cacheprovider",
                "-m",
                "",
                "-v",
                "--count",
                str(args.count),
                *tests,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
    finally:
        for process in busy:
            process.kill()
            process.wait()
    counts = tally(pytest.stdout)
    for name, outcome in sorted(counts.items()):
        print(
            f"{outcome['PASSED']:3d} passed {outcome['FAILED'] + outcome['ERROR']:3d} failed "
            f"{outcome['SKIPPED']:3d} skipped  {name}"
        )
    failed = sum(c["FAILED"] + c["ERROR"] for c in counts.values())
    print(
        f"{sum(c['PASSED'] for c in counts.values())} passed, {failed} failed, beside {args.busy} busy "
        f"processes, {args.count} repeats each; pytest: {pytest.stdout.strip().splitlines()[-1]}"
    )
    if failed or pytest.returncode not in (0, 5):
        print(pytest.stdout[-20000:])
        raise SystemExit(1)


if __name__ == "__main__":
    main()
