"""Snakemake behaviour the workflow relies on, shown on real Snakemake runs: two bugs of
Snakemake 9.10-9.16 that the pinned version (requirements.txt, the Snakefile's `min_version`) has
fixed, held here so that another pin cannot bring them back unnoticed."""
from __future__ import annotations

import subprocess
import sys

# one job alone first (prepare), then three that each need every core
SNAKEFILE = """
rule final:
    input: expand("out{i}.txt", i=range(3))

rule prepare:
    output: "common.txt"
    threads: 2
    shell: "touch {output}"

rule work:
    input: "common.txt"
    output: "out{i}.txt"
    threads: 2
    shell: "python -c 'import time; print(time.time())' > {output}; sleep 1.5; python -c 'import time; print(time.time())' >> {output}"
"""


def test_jobs_needing_every_core_run_one_at_a_time(tmp_path):
    """Snakemake 9.10-9.16 started a job that was alone among the ready ones without reserving
    its cores (snakemake/snakemake#4026): here `prepare`, after which two `work` jobs of 2 threads
    each ran at once on 2 cores (7 jobs at once late in the LLM preset, 17 GB together)."""
    (tmp_path / "Snakefile").write_text(SNAKEFILE)
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--scheduler", "greedy", "-q"],
                   cwd=tmp_path, check=True, capture_output=True, timeout=300)
    runs = sorted(tuple(float(x) for x in (tmp_path / f"out{i}.txt").read_text().split()) for i in range(3))
    assert all(later[0] >= earlier[1] for earlier, later in zip(runs, runs[1:])), runs


def test_a_target_no_rule_makes_is_named_not_a_traceback(tmp_path):
    """A mistyped target of the real workflow: Snakemake's own "No rule to produce" message,
    naming it, and no AttributeError from formatting it (snakemake/snakemake#3644, up to 9.16)."""
    from wfutil import TINY, snakemake as run_snakemake

    model = TINY["models"][0]["name"]
    bad = f"results/{model}/organised/sample0.zarr/zarr.json"  # "organized" mistyped
    run = run_snakemake(tmp_path, TINY, "-n", bad, check=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"No rule to produce {bad}" in out, out[-3000:]
    assert "is_storage" not in out
