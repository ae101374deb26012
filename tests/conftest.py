"""Shared test settings: offline Hugging Face, a non-interactive matplotlib, one torch thread.

Tiny models run faster on one thread than on two competing ones, and a test suite that
runs beside other work must not oversubscribe the cores.
"""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

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
