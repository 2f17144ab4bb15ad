"""``python -m tests.slurm.snakemake_main ...``: Snakemake's command line as the Slurm tests run
it, with two changes to the Slurm executor plugin: its status checks come at a constant
interval, the profile's ``slurm-init-seconds-before-status-checks`` (and a Ctrl-C during one
cancels the jobs it checks, below).

snakemake-executor-plugin-slurm (2.8) waits 10 s longer before each status check in which no
job of the run completed (up to 180 s, and a failed job counts as none): a one-minute job is
seen 68 s after its submission at best, and a chain of failed attempts (out-of-memory
escalation) waits 12, 22, 32 s... between them. Snakemake's ``seconds-between-status-checks``
does not reach this (the plugin replaces the interval after its first check) and the plugin has
no setting for it. On a site that spares a shared slurmdbd; on the test cluster (one node, a
``sacct`` query of ~0.1 s on a loaded machine) it is idle time in every test. Only the tests
run this module (tests/slurm/conftest.py ``snakemake_cmd``); the users' profiles/slurm keeps
the plugin as it is. The jobs' own Snakemake (``python -m snakemake`` inside each Slurm job)
polls nothing.
"""

from __future__ import annotations

import sys

from snakemake_executor_plugin_slurm import Executor

_plugin_check = Executor.check_active_jobs
_plugin_cancel = Executor.cancel_jobs


async def _check_at_constant_interval(self, active_jobs):
    # Snakemake takes the jobs out of the list that Ctrl-C cancels while a check runs
    # (snakemake-interface-executor-plugins RemoteExecutor._wait_for_jobs): a Ctrl-C then
    # cancels none of them. At one check every 2 s a Ctrl-C falls in one often (the
    # preemption test's did once at the plugin's own intervals: Snakemake exited, its training
    # job ran on); those jobs are cancelled too (scancel of a finished one is no error)
    self._checking = list(active_jobs)
    try:
        async for job in _plugin_check(self, active_jobs):
            yield job
    finally:
        self._checking = []
    # after the plugin's own update of the interval (its +10 s)
    self.next_seconds_between_status_checks = (
        self.workflow.executor_settings.init_seconds_before_status_checks
    )


def _cancel_checked_jobs_too(self, active_jobs):
    checking = [j for j in getattr(self, "_checking", []) if j not in active_jobs]
    _plugin_cancel(self, [*active_jobs, *checking])


Executor.check_active_jobs = _check_at_constant_interval
Executor.cancel_jobs = _cancel_checked_jobs_too

if __name__ == "__main__":
    from snakemake.cli import main

    sys.exit(main())
