"""Fixes of Snakemake bugs that change what a run does, installed by the Snakefile.

Snakemake 9.10 to 9.16 start a job that is alone among the ready ones without reserving its
cores (or any resource), and give them back when it ends: each such job leaves the run one
more core than `--cores`. Late in a run the scheduler starts several jobs per core (7 at once
on 2 cores in the LLM preset, 17 GB resident together). Snakemake 9.17 fixed it upstream
(snakemake/snakemake#4026); `reserve_lone_jobs` does what that fix does on the versions that
need it, and nothing on others.

Snakemake 9 (up to 9.15 at least, snakemake/snakemake#3644) answers a target that no rule
produces (a typo in `snakemake results/...`) with a traceback ending in "AttributeError: 'str'
object has no attribute 'is_storage'" instead of its "No rule to produce" message: the message
formats the target as a file object, and a target given on the command line is a string.
`readable_missing_targets` lets that formatting take a string.
"""
from __future__ import annotations

__all__ = ["AFFECTED", "major_minor", "reserve_lone_jobs", "readable_missing_targets"]

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


def readable_missing_targets() -> bool:
    """Make Snakemake's file formatting (`snakemake.io.fmt.fmt_iofile`, used by its error
    messages) take a plain string, as its "No rule to produce" message passes one. A no-op
    where the formatting has no such function or already does. Returns whether it is installed."""
    try:
        from snakemake.io import fmt
    except ImportError:
        return False
    fmt_iofile = getattr(fmt, "fmt_iofile", None)
    if fmt_iofile is None:
        return False
    if getattr(fmt_iofile, "_oattn_takes_strings", False):
        return True

    def fmt_any(f, *args, **kwargs):
        if not hasattr(f, "is_storage"):  # a plain path string: nothing to annotate
            return str(f)
        return fmt_iofile(f, *args, **kwargs)

    fmt_any._oattn_takes_strings = True
    fmt.fmt_iofile = fmt_any
    return True
