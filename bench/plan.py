"""How long Snakemake takes to plan a run of many samples (a benchmark, not a test).

The embedded default's vit-tiny (a model small enough to be analysed in batch jobs,
`jobs.batch_max_entries`) alone, with `--samples` samples, results under a temporary directory,
planned by `snakemake -n` (nothing runs; `check_disk: false`, since nothing is written): the
wall time, the jobs planned, the jobs of each stage, and the peak resident memory of the
Snakemake process. `--per-sample` plans one job per sample instead (`batch_max_entries: 0`),
`--profile` plans through a profile (the SLURM one needs its executor plugin, installed by
`make .venv/.installed`).

    python bench/plan.py --samples 10000
    python bench/plan.py --samples 10000 --per-sample --profile workflow/profiles/slurm
"""
from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from oattn_lib.plan import rule_stage

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=10000)
    ap.add_argument("--per-sample", action="store_true", help="one job per sample (jobs.batch_max_entries 0)")
    ap.add_argument("--batch-max-samples", type=int, help="jobs.batch_max_samples (default: the schema's)")
    ap.add_argument("--profile", help="plan through this profile (e.g. workflow/profiles/slurm)")
    args = ap.parse_args()

    cfg = yaml.safe_load((ROOT / "config.yaml").read_text())
    vit = next(m for m in cfg["models"] if m["name"] == "vit-tiny")
    vit["extract"]["n_samples"] = args.samples
    vit.pop("stability", None)
    cfg["models"] = [vit]
    cfg["check_disk"] = False
    jobs = {}
    if args.per_sample:
        jobs["batch_max_entries"] = 0
    if args.batch_max_samples:
        jobs["batch_max_samples"] = args.batch_max_samples
    if jobs:
        cfg["jobs"] = jobs
    with tempfile.TemporaryDirectory() as tmp:
        cfg["results"] = str(Path(tmp) / "results")
        path = Path(tmp) / "config.yaml"
        path.write_text(yaml.safe_dump(cfg))
        cmd = [sys.executable, "-m", "snakemake", "-n", "-s", str(ROOT / "Snakefile"), "--directory", tmp,
               "--configfile", str(path), "--cores", "2", "--quiet", "rules"]
        if args.profile:
            cmd += ["--profile", str(ROOT / args.profile)]
        t = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        seconds = time.perf_counter() - t
    if proc.returncode:
        raise SystemExit(f"snakemake -n failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    planned = {}
    for line in (proc.stdout + proc.stderr).split("Job stats:")[-1].splitlines()[3:]:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        if parts[0] != "total":
            stage = rule_stage(parts[0])
            planned[stage] = planned.get(stage, 0) + int(parts[1])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024 ** 2
    how = "one job per sample" if args.per_sample else "batched"
    print(f"{args.samples} samples of vit-tiny, {how}{', profile ' + args.profile if args.profile else ''}: "
          f"{sum(planned.values())} jobs planned in {seconds:.1f} s, peak {peak:.2f} GB")
    print("jobs per stage: " + ", ".join(f"{k} {v}" for k, v in sorted(planned.items())))


if __name__ == "__main__":
    main()
