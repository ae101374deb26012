"""Running the real workflow from tests: a tiny config, snakemake in a temporary directory."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

from oattn_lib.config import rule_stage

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

# The one tiny config (workflow/presets/test.yaml, also the SLURM CI's), run in a temporary
# directory with its results under results/ there.
TINY = {**yaml.safe_load((REPO / "workflow" / "presets" / "test.yaml").read_text()), "results": "results"}


def snakemake(workdir: Path, config: dict, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    cfg = workdir / "config.yaml"
    cfg.write_text(yaml.safe_dump(config))
    proc = subprocess.run(SNAKEMAKE + ["-s", str(REPO / "Snakefile"), "--directory", str(workdir),
                                       "--configfile", str(cfg), "--cores", "2", *args],
                          capture_output=True, text=True, timeout=1800)
    if check and proc.returncode:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-6000:]}")
    return proc


def planned_jobs(proc: subprocess.CompletedProcess) -> dict[str, int]:
    """The 'Job stats' table of a dry run, as {rule: count}."""
    text = proc.stdout + proc.stderr
    if "Nothing to be done" in text:
        return {}
    block = text.split("Job stats:")[-1]
    jobs = {}
    for line in block.splitlines()[3:]:
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if not m:
            break
        if m.group(1) != "total":
            jobs[m.group(1)] = int(m.group(2))
    return jobs


def by_stage(jobs: dict[str, int]) -> dict[str, int]:
    """Planned jobs per stage: a batch job of a model's samples (rule `<stage>_batch_<model>`,
    config jobs.batch_max_entries) counts for its stage, as each per-sample job does; the
    explorer's plan and sample jobs (explorer_plan, explorer_samples) count for the explorer, and
    a sample's replicates (stability_sample) for stability."""
    out: dict[str, int] = {}
    for rule, n in jobs.items():
        stage = rule_stage(rule)
        stage = {"explorer_plan": "explorer", "explorer_samples": "explorer",
                 "stability_sample": "stability"}.get(stage, stage)
        out[stage] = out.get(stage, 0) + n
    return out


def reordered(value):
    """`value` with every mapping's keys in reverse order: the same config, written otherwise."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value
