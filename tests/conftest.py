"""Shared test settings: offline Hugging Face, a non-interactive matplotlib, one torch thread.

Tiny models run faster on one thread than on two competing ones, and a test suite that
runs beside other work must not oversubscribe the cores.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# as the Snakefile sets it for every job: torch's idle OpenMP threads must not spin beside numba's
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402

# the suite's CPU time per test module, with OATTN_TEST_CPU_DIR set (bench/budget.py)
pytest_plugins = ["cpu_budget"]


@pytest.fixture(scope="session")
def clean_run(tmp_path_factory):
    """One uninterrupted run of the real workflow on the tiny test config, made once for the
    whole test session and copied into each process that asks for it.

    With pytest-xdist every worker has its own session: the first to ask builds the run in a
    directory all workers share, under a file lock, and every worker (the builder too) works on
    its own copy (results/ and Snakemake's .snakemake/ records, whose paths are relative), so
    that tests writing configs or reports into it never meet another process's. A worker that
    asks while the run is being built waits for it; the build runs on every core meanwhile."""
    import os
    import shutil

    from filelock import FileLock
    from wfutil import TINY, snakemake

    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "clean_run_shared"
    done = shared / ".complete"
    with FileLock(str(shared) + ".lock"):
        if not done.exists():
            if shared.exists():  # a build that failed in another worker: start again
                shutil.rmtree(shared)
            shared.mkdir()
            snakemake(shared, TINY)
            done.touch()
    workdir = tmp_path_factory.mktemp("oattn_workflow")
    shutil.copytree(shared / "results", workdir / "results", symlinks=True)
    shutil.copytree(shared / ".snakemake", workdir / ".snakemake", symlinks=True,
                    ignore=shutil.ignore_patterns("locks", "incomplete", "log"))
    shutil.copy2(shared / "config.yaml", workdir / "config.yaml")
    return workdir


def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist (`make test` runs `-n 2`): every test module goes whole to one worker,
    so that its module fixtures (a model, a browser) are built once; the modules that read the
    shared workflow run (`clean_run`) spread over the workers like any other."""
    from xdist.scheduler import LoadScopeScheduling

    return LoadScopeScheduling(config, log)
