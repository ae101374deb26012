"""Snakemake bugs the workflow works around (oattn_lib/snakemake_fixes.py), shown on a real
Snakemake run of a minimal workflow."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import snakemake

from oattn_lib.snakemake_fixes import AFFECTED, major_minor

REPO = Path(__file__).resolve().parents[1]

# one job alone first (prepare), then three that each need every core
SNAKEFILE = """
import sys
sys.path.insert(0, {repo!r})
if {fix}:
    from oattn_lib.snakemake_fixes import reserve_lone_jobs
    reserve_lone_jobs()

rule final:
    input: expand("out{{i}}.txt", i=range(3))

rule prepare:
    output: "common.txt"
    threads: 2
    shell: "touch {{output}}"

rule work:
    input: "common.txt"
    output: "out{{i}}.txt"
    threads: 2
    shell: "python -c 'import time; print(time.time())' > {{output}}; sleep 1.5; python -c 'import time; print(time.time())' >> {{output}}"
"""


def _intervals(tmp_path: Path, fix: bool) -> list[tuple[float, float]]:
    d = tmp_path / ("fixed" if fix else "plain")
    d.mkdir()
    (d / "Snakefile").write_text(SNAKEFILE.format(repo=str(REPO), fix=fix))
    subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--scheduler", "greedy", "-q"], cwd=d,
                   check=True, capture_output=True, timeout=300)
    return sorted(tuple(float(x) for x in (d / f"out{i}.txt").read_text().split()) for i in range(3))


def _overlaps(iv) -> bool:
    return any(b[0] < a[1] for a, b in zip(iv, iv[1:]))


def test_jobs_needing_every_core_run_one_at_a_time(tmp_path):
    assert not _overlaps(_intervals(tmp_path, fix=True))
    if AFFECTED[0] <= major_minor(snakemake.__version__) < AFFECTED[1]:
        # the bug the fix is for: without it this Snakemake runs two of them at once
        assert _overlaps(_intervals(tmp_path, fix=False))


@pytest.mark.parametrize("text, version", [("9.15.0", (9, 15)), ("10.0.1", (10, 0)), ("9.17.2.dev3", (9, 17))])
def test_versions_are_read_by_major_and_minor(text, version):
    assert major_minor(text) == version


def test_a_target_no_rule_makes_is_named_not_a_traceback(tmp_path):
    """A mistyped target of the real workflow: Snakemake's own "No rule to produce" message,
    naming it, and no AttributeError from formatting it."""
    from wfutil import TINY, snakemake as run_snakemake

    model = TINY["models"][0]["name"]
    bad = f"results/{model}/organised/sample0.zarr/zarr.json"  # "organized" mistyped
    run = run_snakemake(tmp_path, TINY, "-n", bad, check=False)
    out = run.stdout + run.stderr
    assert run.returncode != 0
    assert f"No rule to produce {bad}" in out, out[-3000:]
    assert "is_storage" not in out


def test_file_formatting_takes_strings_and_files():
    from snakemake.io import IOFile
    from snakemake.io.fmt import fmt_iofile as before

    from oattn_lib.snakemake_fixes import readable_missing_targets

    assert readable_missing_targets() and readable_missing_targets()  # installed once, then kept
    from snakemake.io.fmt import fmt_iofile

    assert fmt_iofile("results/x.txt") == "results/x.txt"
    assert fmt_iofile(IOFile("results/y.txt")) == "results/y.txt"
    assert fmt_iofile is not before or getattr(before, "_oattn_takes_strings", False)
