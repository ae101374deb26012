"""Start-up of a stage job: a fresh interpreter importing the stage's module, as every job does.

Each stage job is a new Python process (Snakemake's `script:`), which pays for its imports
before any work: torch's alone takes about 2 s. For each stage this starts a fresh
interpreter `--repeat` times, imports the stage module the way its script does (runtime,
then the stage), and reports the median start-up as the job itself logs it
(`runtime.startup_seconds`: from the process's start), the heavy libraries loaded, and the
largest imports by `python -X importtime`. Prints one JSON object per stage, then a table
(bench/startup.csv records figures it measured).

    python bench/startup.py                 # every stage, 3 starts each
    python bench/startup.py organize tables --repeat 5

Run it on an idle machine: start-up is mostly reading and compiling-in of shared libraries
and module code, and it grows with whatever else competes for the disk and the cores.
"""
from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
STAGES = ["data", "train", "prepare_model", "kernels", "extract", "organize", "decompose", "entropy", "tables",
          "figures", "prune", "explorer", "summary", "softmax_free_table"]
HEAVY = ["torch", "numba", "xarray", "zarr", "pandas", "scipy", "transformers", "torchvision", "matplotlib",
         "plotly"]

_PROBE = """
import sys, json
from oattn_lib.runtime import startup_seconds
import oattn_lib.stages.{stage}
print(json.dumps({{"startup": startup_seconds(), "loaded": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def probe(stage: str) -> dict:
    """One fresh start: start-up seconds and heavy modules loaded."""
    out = subprocess.run([sys.executable, "-c", _PROBE.format(stage=stage, heavy=HEAVY)], cwd=REPO,
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def top_imports(stage: str, n: int = 5) -> list[tuple[str, float]]:
    """The `n` heavy libraries whose import took longest, each with everything it imported
    (cumulative seconds; one library imported inside another counts in both)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import oattn_lib.stages.{stage}"], cwd=REPO,
                         capture_output=True, text=True, check=True).stderr
    total: dict[str, float] = {}
    for line in err.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|\s+(\S+)$", line)
        if m and m.group(2) in HEAVY:
            total[m.group(2)] = int(m.group(1)) / 1e6
    return sorted(total.items(), key=lambda kv: -kv[1])[:n]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("stages", nargs="*", default=STAGES, help=f"stage modules (default: {' '.join(STAGES)})")
    ap.add_argument("--repeat", type=int, default=3, help="fresh starts per stage (median reported)")
    args = ap.parse_args(argv)
    rows = []
    for stage in args.stages:
        runs = [probe(stage) for _ in range(args.repeat)]
        row = {"stage": stage, "startup_s": round(statistics.median(r["startup"] for r in runs), 2),
               "startup_min_s": round(min(r["startup"] for r in runs), 2), "loaded": runs[0]["loaded"],
               "top_imports": [(p, round(t, 2)) for p, t in top_imports(stage)]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| stage | start-up, median (s) | fastest (s) | heavy libraries loaded | largest imports (s) |")
    print("|---|---|---|---|---|")
    for r in rows:
        top = ", ".join(f"{p} {t:.2f}" for p, t in r["top_imports"][:3])
        print(f"| {r['stage']} | {r['startup_s']:.2f} | {r['startup_min_s']:.2f} | {', '.join(r['loaded'])} | {top} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
