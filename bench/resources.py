"""Measured peak memory and wall time of the analysis jobs of finished runs, beside what
`oattn_lib.resources` asks a cluster for.

For every benchmark file of a modelled rule (`<results>/benchmarks/<model>/<rule>[_sample<k>].tsv`,
Snakemake's `benchmark:` directive: peak RSS `max_rss` in MB, wall seconds `s`), the job's tensor
size is read from the headers of the model's stores (`largest_array_mb`: sample k's stores for a
per-sample job, every sample's for a job of all samples) and its work counted in samples (for
stability: samples x replicates). Prints one row per job with the modelled memory and time, and
with --csv appends the measured rows to a CSV (bench/resources.csv is the record the model is
fitted to and tested against: tests/test_resources.py).

    python bench/resources.py results --source default
    python bench/resources.py results/llm --source llm --csv bench/resources.csv
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oattn_lib.resources import MODELS, largest_array_mb, memory_mb, runtime_minutes  # noqa: E402

_FILE = re.compile(r"^(?P<rule>[a-z][a-z0-9_]*?)(?:_sample(?P<sample>\d+))?\.tsv$")
COLUMNS = ["source", "model", "rule", "sample", "tensor_mb", "work", "max_rss_mb", "seconds"]


def _samples(base: Path) -> list[int]:
    return sorted(int(p.name[6:-5]) for p in (base / "attention").glob("sample*.zarr"))


def _work(rule: str, base: Path, samples: list[int]) -> int:
    """Samples the job analysed one after another (stability: samples x replicates)."""
    if rule == "stability":
        import xarray as xr

        st = xr.open_zarr(base / "stability.zarr", consolidated=False)
        return int(st.sizes["sample"] * (st.sizes["replicate"] - 1))
    return len(samples)


def measured(results: Path, source: str) -> list[dict]:
    rows = []
    for path in sorted((results / "benchmarks").glob("*/*.tsv")):
        m = _FILE.match(path.name)
        if not m or m["rule"] not in MODELS:
            continue
        model, base = path.parent.name, results / path.parent.name
        samples = [int(m["sample"])] if m["sample"] is not None else _samples(base)
        stores = [base / d / f"sample{k}.zarr" for k in samples for d in ("attention", "organized", "decomposed")]
        with path.open() as fh:
            rec = list(csv.DictReader(fh, delimiter="\t"))[-1]
        rows.append({"source": source, "model": model, "rule": m["rule"],
                     "sample": m["sample"] if m["sample"] is not None else "all",
                     "tensor_mb": round(largest_array_mb(stores), 3), "work": _work(m["rule"], base, samples),
                     "max_rss_mb": float(rec["max_rss"]), "seconds": float(rec["s"])})
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a finished run's results folder")
    ap.add_argument("--source", required=True, help="a label for the run (default, llm, ...)")
    ap.add_argument("--csv", type=Path, help="append the measured rows to this CSV")
    args = ap.parse_args()
    rows = measured(args.results, args.source)
    print(f"{'model':10s} {'rule':10s} {'sample':>6s} {'tensor MB':>10s} {'work':>5s} {'peak MB':>8s} "
          f"{'asks MB':>8s} {'ratio':>6s} {'wall s':>7s} {'asks min':>8s}")
    for r in rows:
        ask = memory_mb(r["rule"], r["tensor_mb"])
        print(f"{r['model']:10s} {r['rule']:10s} {r['sample']:>6s} {r['tensor_mb']:10.1f} {r['work']:5d} "
              f"{r['max_rss_mb']:8.0f} {ask:8d} {ask / r['max_rss_mb']:6.2f} {r['seconds']:7.1f} "
              f"{runtime_minutes(r['rule'], r['tensor_mb'], r['work']):8d}")
    if args.csv:
        new = not args.csv.exists()
        with args.csv.open("a", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            if new:
                w.writeheader()
            w.writerows(rows)


if __name__ == "__main__":
    main()
