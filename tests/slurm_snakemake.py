"""`python -m snakemake`, except that the SLURM executor plugin checks job status every
`--seconds-between-status-checks` seconds instead of backing off.

The plugin adds 10 s to its wait after each check that finds no job finished (up to 180 s),
whatever the profile sets: kind to a busy controller, but in a test of jobs that take seconds
it adds about 25 s to every job (measured: a 6 s report job took 33 s). Everything else, the
submission, the job step inside SLURM and the status command, is the plugin's own."""
import sys

from snakemake.cli import main
from snakemake_executor_plugin_slurm import Executor


def _interval(self) -> float:
    return self.workflow.remote_execution_settings.seconds_between_status_checks


Executor.next_seconds_between_status_checks = property(_interval, lambda self, value: None)

if __name__ == "__main__":
    sys.exit(main())
