"""How each stage grows with the number of tokens: one preset run at several lengths.

Runs a preset (default `workflow/presets/llm4k.yaml`) as it is and at shorter lengths (its
models' `extract.max_length` replaced, everything else kept), each into its own results folder
(`<results>-<tokens>` for the shorter ones), with `snakemake --profile
workflow/profiles/default`; a length whose folder holds a finished run (its summary.md) is read,
not run again, even where the code changed since (delete the folder to measure it again).
Then, from the jobs' Snakemake benchmarks and the whole job's CPU time and peak each job's log
ends with (bench/stages.py reads them), it prints per stage a job's CPU time (the mean over the
stage's jobs: every job runs one thread, so this is its wall time on a free core, whatever else
ran beside it) and the largest peak resident memory at each
length, the growth exponent p of each between consecutive lengths (time ~ tokens^p) and the
disk of the attention and decomposed stores per sample:

    python bench/scaling.py                          # 1024, 2048 and the preset's 4096
    python bench/scaling.py --no-run                 # read the finished runs only

A stage's exponent says what a longer context costs: p = 2 grows like the attention tensor (its
tokens^2 entries), p = 3 like the questionnaire's pairwise distances between rows. A stage whose
time is mostly its fixed start-up (entropy, a few seconds) shows an exponent near 0.
"""
from __future__ import annotations

import argparse
import importlib.util
import math
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_stages", REPO / "bench" / "stages.py")
stages = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(stages)


def variant(preset: dict, tokens: int) -> dict:
    """The preset with every model's extract.max_length set to `tokens`, into its own folder."""
    out = dict(preset)
    out["results"] = f"{preset['results']}-{tokens}"
    out["models"] = [{**m, "extract": {**m.get("extract", {}), "max_length": tokens}} for m in preset["models"]]
    return out


def exponent(n1: float, t1: float, n2: float, t2: float) -> float:
    """p with t ~ n^p through (n1, t1) and (n2, t2); NaN where a value is missing or not positive."""
    if not (t1 > 0 and t2 > 0 and n1 > 0 and n2 > 0 and n1 != n2):
        return float("nan")
    return math.log(t2 / t1) / math.log(n2 / n1)


def disk_mb(folder: Path) -> float:
    """Bytes under `folder` in MB (0 when it does not exist)."""
    if not folder.is_dir():
        return 0.0
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6


def per_stage(runs: list[tuple[int, Path]]) -> list[dict]:
    """One row per (model, stage): a job's CPU seconds (mean over its jobs) and the largest peak MB
    at each length, and the exponents between consecutive lengths."""
    tables = {}
    for tokens, results in runs:
        for row in stages.summarise(stages.read_benchmarks(results)):
            tables.setdefault((row["model"], row["rule"]), {})[tokens] = row
    out = []
    for (model, rule), by_tokens in sorted(tables.items()):
        row = {"model": model, "stage": rule}
        lengths = [t for t, _ in runs]
        for t in lengths:
            r = by_tokens.get(t)
            row[f"wall_s@{t}"] = round(r["cpu_s"] / r["jobs"], 1) if r else float("nan")
            row[f"rss_mb@{t}"] = r["peak_rss_mb"] if r else float("nan")
        for a, b in zip(lengths, lengths[1:]):
            row[f"p_wall {a}-{b}"] = exponent(a, row[f"wall_s@{a}"], b, row[f"wall_s@{b}"])
            row[f"p_rss {a}-{b}"] = exponent(a, row[f"rss_mb@{a}"], b, row[f"rss_mb@{b}"])
        out.append(row)
    return out


def markdown(rows: list[dict], runs: list[tuple[int, Path]]) -> str:
    lengths = [t for t, _ in runs]
    head = (["stage"] + [f"CPU {t} (s)" for t in lengths] + [f"peak {t} (MB)" for t in lengths]
            + [f"p CPU {a}-{b}" for a, b in zip(lengths, lengths[1:])]
            + [f"p peak {a}-{b}" for a, b in zip(lengths, lengths[1:])])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ([f"{r['model']} {r['stage']}"] + [f"{r[f'wall_s@{t}']:g}" for t in lengths]
                 + [f"{r[f'rss_mb@{t}']:g}" for t in lengths]
                 + [f"{r[f'p_wall {a}-{b}']:.2f}" for a, b in zip(lengths, lengths[1:])]
                 + [f"{r[f'p_rss {a}-{b}']:.2f}" for a, b in zip(lengths, lengths[1:])])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", type=Path, default=REPO / "workflow" / "presets" / "llm4k.yaml")
    ap.add_argument("--tokens", default="1024,2048", help="shorter lengths to run beside the preset's own")
    ap.add_argument("--no-run", action="store_true", help="read finished runs only")
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args(argv)
    preset = yaml.safe_load(args.preset.read_text())
    own = {m["extract"]["max_length"] for m in preset["models"]}
    if len(own) != 1:
        raise SystemExit(f"{args.preset}: its models' extract.max_length differ ({sorted(own)}); one length expected")
    configs = []
    for tokens in sorted(int(t) for t in args.tokens.split(",") if t):
        path = REPO / "results" / "bench" / f"scaling-{args.preset.stem}-{tokens}.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(variant(preset, tokens), sort_keys=False))
        configs.append((tokens, path, REPO / variant(preset, tokens)["results"]))
    configs.append((own.pop(), args.preset, REPO / preset["results"]))
    if not args.no_run:
        for tokens, path, results in configs:
            if (results / "summary.md").is_file():
                continue
            print(f"== {tokens} tokens: {path}", flush=True)
            subprocess.run([sys.executable, "-m", "snakemake", "--profile", "workflow/profiles/default",
                            "--configfile", str(path), "--cores", str(args.cores)], cwd=REPO, check=True)
    runs = [(tokens, results) for tokens, _, results in configs]
    print(markdown(per_stage(runs), runs))
    print()
    for tokens, results in runs:
        models = sorted(p.name for p in results.iterdir() if (p / "attention").is_dir()) if results.is_dir() else []
        for model in models:
            n = len(list((results / model / "attention").glob("sample*.zarr"))) or 1
            print(f"{tokens} tokens, {model}: attention store {disk_mb(results / model / 'attention') / n:.0f} MB "
                  f"per sample, decomposed {disk_mb(results / model / 'decomposed') / n:.0f} MB per sample")
    return 0


if __name__ == "__main__":
    sys.exit(main())
