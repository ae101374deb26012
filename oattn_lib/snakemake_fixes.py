"""Fixes of Snakemake bugs that change what a run does, installed by the Snakefile.

Snakemake 9.10 to 9.16 start a job that is alone among the ready ones without reserving its
cores (or any resource), and give them back when it ends: each such job leaves the run one
more core than `--cores`. Late in a run the scheduler starts several jobs per core (7 at once
on 2 cores in the LLM preset, 17 GB resident together). Snakemake 9.17 fixed it upstream
(snakemake/snakemake#4026); `reserve_lone_jobs` does what that fix does on the versions that
need it, and nothing on others.
"""
from __future__ import annotations

__all__ = ["AFFECTED", "major_minor", "reserve_lone_jobs"]

AFFECTED = ((9, 10), (9, 17))
"""Snakemake versions [first, end) whose scheduler leaks a lone job's resources."""


def major_minor(text: str) -> tuple[int, int]:
    """(major, minor) of a version string."""
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def reserve_lone_jobs() -> bool:
    """Make the running Snakemake reserve the resources of a job selected alone, as it does for
    jobs selected together (a no-op outside `AFFECTED`, or when already installed). Returns
    whether the fix is active."""
    import snakemake
    from snakemake.scheduling.job_scheduler import JobScheduler

    if not AFFECTED[0] <= major_minor(snakemake.__version__) < AFFECTED[1]:
        return False
    if getattr(JobScheduler.job_selector, "_oattn_reserves_lone_jobs", False):
        return True
    select = JobScheduler.job_selector

    def job_selector(self, jobs):
        selected = select(self, jobs)
        if len(jobs) == 1 and selected:  # the branch that returns before reserving
            with self._lock:
                self.update_available_resources(selected)
        return selected

    job_selector._oattn_reserves_lone_jobs = True
    JobScheduler.job_selector = job_selector
    return True
