"""Compare two results directories number for number: every table (CSV, parquet) and every zarr
store.

    python bench/compare_results.py results_before results_after

Prints, per file, "identical" (bit for bit), the largest absolute and relative difference
of each numeric column / variable that differs, or what is missing on either side. Used to
show that a refactoring changes no number. Exit status 1 when anything differs.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr


def _diff(a: np.ndarray, b: np.ndarray) -> str | None:
    if a.shape != b.shape:
        return f"shape {a.shape} vs {b.shape}"
    if a.dtype.kind in "fiub" and b.dtype.kind in "fiub":
        if np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            return None
        d = np.abs(a.astype(float) - b.astype(float))
        scale = np.maximum(np.abs(a.astype(float)), 1e-300)
        return f"max abs diff {np.nanmax(d):.3g}, max rel diff {np.nanmax(d / scale):.3g}"
    return None if np.array_equal(a.astype(str), b.astype(str)) else "text differs"


def compare_csv(a: Path, b: Path) -> list[str]:
    """A CSV or parquet table's columns, value for value."""
    read = pd.read_parquet if a.suffix == ".parquet" else pd.read_csv
    x, y = read(a), read(b)
    if list(x.columns) != list(y.columns):
        return [f"columns {list(x.columns)} vs {list(y.columns)}"]
    return [f"{c}: {d}" for c in x.columns if (d := _diff(x[c].to_numpy(), y[c].to_numpy()))]


def compare_store(a: Path, b: Path) -> list[str]:
    x, y = (xr.open_zarr(p, consolidated=False).load() for p in (a, b))
    out = [f"variables only in one: {sorted(set(x.data_vars) ^ set(y.data_vars))}"] \
        if set(x.data_vars) != set(y.data_vars) else []
    out += [f"{v}: {d}" for v in sorted(set(x.data_vars) & set(y.data_vars))
            if (d := _diff(x[v].values, y[v].values))]
    return out


def main(before: str, after: str) -> int:
    a_root, b_root = Path(before), Path(after)
    files = sorted({p.relative_to(a_root) for pattern in ("*.csv", "*.parquet") for p in a_root.rglob(pattern)}
                   | {p.relative_to(a_root) for p in a_root.rglob("*.zarr") if p.is_dir()})
    bad = 0
    for rel in files:
        if "logs" in rel.parts or "benchmarks" in rel.parts:
            continue
        if not (b_root / rel).exists():
            print(f"{rel}: missing in {after}")
            bad += 1
            continue
        diffs = (compare_store if rel.suffix == ".zarr" else compare_csv)(a_root / rel, b_root / rel)
        print(f"{rel}: {'identical' if not diffs else '; '.join(diffs)}")
        bad += bool(diffs)
    print(f"{len(files)} files compared, {bad} differ")
    return int(bad > 0)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
