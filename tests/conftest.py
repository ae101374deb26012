"""Shared test settings: offline Hugging Face, a non-interactive matplotlib, one torch thread.

Tiny models run faster on one thread than on two competing ones, and a test suite that
runs beside other work must not oversubscribe the cores.
"""
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
# as the Snakefile sets it for every job: torch's idle OpenMP threads must not spin beside numba's
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

torch.set_num_threads(1)


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def clean_run(tmp_path_factory):
    """One uninterrupted run of the real workflow on the tiny test config (shared)."""
    from wfutil import TINY, snakemake
    workdir = tmp_path_factory.mktemp("oattn_workflow")
    snakemake(workdir, TINY)
    return workdir


# The test modules that use the real workflow's `clean_run` (or a run made from it)
WORKFLOW_MODULES = {f"tests/{p.name}" for p in Path(__file__).parent.glob("test_*.py")
                    if "clean_run" in p.read_text(encoding="utf-8")}


def pytest_xdist_make_scheduler(config, log):
    """With pytest-xdist (`make test` runs `-n 2`): every test module goes whole to one worker
    (its module fixtures, a model or a browser, are built once), and the modules that use the
    real workflow all go to the same worker, where the session's `clean_run` is made once.
    (xdist's own `--dist loadgroup` cannot do the latter with pytest 9: it renames node ids
    through an attribute pytest 9 no longer reads.)"""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndWorkflow(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "workflow" if module in WORKFLOW_MODULES else module

    return ModulesAndWorkflow(config, log)
