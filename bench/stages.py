"""Wall time, CPU time and peak memory per stage of a finished workflow run.

Reads the benchmark files Snakemake wrote for every job (`<results>/benchmarks/**.tsv`, the
rules' `benchmark:` directive: wall seconds `s`, `cpu_time`, peak resident set `max_rss` in
MB) and prints, per model and rule, the number of jobs, their total and largest wall time,
total CPU time and the largest peak RSS, as a Markdown table (the per-stage table of a run, as
the docs' measurements page shows the LLM preset's) and, with --json, one JSON object per row. Beside them, each
job's start-up (interpreter, Snakemake's preamble and imports, until the stage begins), read
from the first line of its log (`<results>/logs/<model>/<rule>[_sample<k>].log`, written by
`runtime.setup_logging`): the stages' total and their largest.

Snakemake samples a job every 0.5 s for 15 s, then every 30 s: its `cpu_time` stops at the
last sample (a 40-second job's at 15 s) and its `max_rss` misses a peak between samples. A
job's log ends with what the kernel counted for the whole job (`runtime.job_usage`): where it
does, the CPU time is the log's and the peak the larger of the two; the summary line says for
how many jobs.

    python bench/stages.py results/llm
    python bench/stages.py results --json

A job's file is `benchmarks/<model>/<rule>[_sample<k>].tsv` (`_part<k>` for the explorer's
sample jobs, `_samples<first>-<last>` for a batch of a small model's samples where it has
several); the rule is the file name without that suffix. Files elsewhere under benchmarks/ (softmax_free/...) keep
their directory as the model.
"""
from __future__ import annotations

import argparse
import csv
import json
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oattn_lib.runtime import read_job_usage  # noqa: E402

_SAMPLE = re.compile(r"_(?:sample|part)\d+$|_samples\d+-\d+$")
_STARTUP = re.compile(r" start-up (\d+(?:\.\d+)?) s")


def rule_of(stem: str) -> str:
    """The rule of a job's benchmark or log file named `stem` (no directory, no extension): the
    name without its `_sample<k>`, `_part<k>` or `_samples<a>-<b>` suffix."""
    return _SAMPLE.sub("", stem)


def startup_seconds(log: Path) -> float:
    """The start-up a job's log records on its first line (NaN without a log or that line)."""
    try:
        with log.open() as fh:
            m = _STARTUP.search(fh.readline())
    except OSError:
        return float("nan")
    return float(m.group(1)) if m else float("nan")


def whole_job(results: Path, benchmark: Path, sampled_rss: float) -> tuple[dict | None, float]:
    """The `runtime.job_usage` the log of the job of `benchmark` (results/benchmarks/...tsv) ends
    with (None without it), and the job's peak: the larger of Snakemake's sampled one (NaN where
    it has none) and the log's."""
    usage = read_job_usage((results / "logs" / benchmark.relative_to(results / "benchmarks")).with_suffix(".log"))
    if usage is None:
        return None, sampled_rss
    return usage, usage["peak_rss_mb"] if sampled_rss != sampled_rss else max(sampled_rss, usage["peak_rss_mb"])


def read_benchmarks(results: Path) -> dict[tuple[str, str], list[dict]]:
    """{(model, rule): [one dict per job: s, cpu_time, max_rss]} from results/benchmarks."""
    root = results / "benchmarks"
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no benchmarks (run the workflow with --results {results} first)")
    rows: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for path in sorted(root.rglob("*.tsv")):
        with path.open() as fh:
            records = list(csv.DictReader(fh, delimiter="\t"))
        if not records:
            raise ValueError(f"{path}: an empty benchmark file")
        rec = records[-1]
        try:
            job = {k: float(rec[k]) if rec[k] not in ("", "NA", "-") else float("nan")
                   for k in ("s", "cpu_time", "max_rss")}
        except KeyError as exc:
            raise ValueError(f"{path}: no column {exc} (not a Snakemake benchmark file)") from None
        rel = path.relative_to(root)
        model = "/".join(rel.parts[:-1]) or "-"
        job["startup"] = startup_seconds((results / "logs" / rel).with_suffix(".log"))
        usage, job["max_rss"] = whole_job(results, path, job["max_rss"])
        job["from_log"] = usage is not None
        if usage is not None:
            job["cpu_time"] = usage["cpu_s"]
        rows[(model, rule_of(path.stem))].append(job)
    return rows


def summarise(rows: dict[tuple[str, str], list[dict]]) -> list[dict]:
    out = []
    for (model, rule), jobs in sorted(rows.items()):
        out.append({"model": model, "rule": rule, "jobs": len(jobs),
                    "wall_s": round(sum(j["s"] for j in jobs), 1),
                    "wall_max_s": round(max(j["s"] for j in jobs), 1),
                    "cpu_s": round(sum(j["cpu_time"] for j in jobs), 1),
                    "peak_rss_mb": round(max(j["max_rss"] for j in jobs)),
                    "startup_s": round(sum(j["startup"] for j in jobs), 1),
                    "logged": sum(j["from_log"] for j in jobs),
                    "startup_max_s": round(max((j["startup"] for j in jobs if j["startup"] == j["startup"]),
                                               default=float("nan")), 2)})
    return out


def markdown(table: list[dict]) -> str:
    lines = ["| model | stage | jobs | wall, total (s) | wall, largest job (s) | CPU (s) | peak RSS (MB) "
             "| start-up, total (s) | start-up, largest (s) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in table:
        lines.append(f"| {r['model']} | {r['rule']} | {r['jobs']} | {r['wall_s']:g} | {r['wall_max_s']:g} "
                     f"| {r['cpu_s']:g} | {r['peak_rss_mb']} | {r['startup_s']:g} | {r['startup_max_s']:g} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, help="the run's results directory (config key `results`)")
    ap.add_argument("--json", action="store_true", help="one JSON object per row instead of a table")
    args = ap.parse_args(argv)
    table = summarise(read_benchmarks(args.results))
    if args.json:
        for row in table:
            print(json.dumps(row))
    else:
        print(markdown(table))
        print(f"\n{sum(r['jobs'] for r in table)} jobs, wall time summed over jobs "
              f"{sum(r['wall_s'] for r in table):.0f} s, CPU {sum(r['cpu_s'] for r in table):.0f} s, "
              f"start-up {sum(r['startup_s'] for r in table if r['startup_s'] == r['startup_s']):.0f} s, "
              f"largest peak RSS {max(r['peak_rss_mb'] for r in table)} MB; CPU and peaks of "
              f"{sum(r['logged'] for r in table)} jobs from their logs, the others' from Snakemake's samples")
    return 0


if __name__ == "__main__":
    sys.exit(main())
