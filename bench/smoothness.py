"""Time and peak memory of the smoothness measures of Theorem 1 and Corollary 1 (docs/method.md §7.7).

For `residual_smoothness` (every approximation of `paraproduct.approximations` and three Haar decay
fits of one head: the measures of Theorem 1) and `haar_decay` (one array, or a batch in one
call), on one head of 128, 512 and 1024 tokens and
on 48 heads of 128 tokens (`haar_decay` batched; `residual_smoothness` one head after another,
as the paraproduct is per head). Each case runs in a fresh process on one thread
(`runtime.cap_threads(1)`), after a small warm-up call (numba's kernels loaded); it reports the
fastest and median wall time of `--repeat` runs, the process's peak resident memory, and that
peak minus the resident memory before the timed runs (what the call itself needed).

    python bench/smoothness.py [--repeat 3] [--tokens 128 512 1024] [--heads 48]
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from oattn_lib.runtime import cap_threads  # noqa: E402

cap_threads(1)  # before torch and numba are imported: their pools are sized then


def _rss_mb() -> float:
    """Current resident memory of this process, in MB (Linux)."""
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def run_case(fn: str, tokens: int, heads: int, repeat: int) -> dict:
    import numpy as np
    from scipy.ndimage import gaussian_filter

    from oattn_lib.smoothness import haar_decay, residual_smoothness

    rng = np.random.default_rng(0)
    f = gaussian_filter(rng.normal(size=(heads, tokens, tokens)), (0, 4, 4), mode="wrap")
    f = (f - f.mean((1, 2), keepdims=True)) / f.std((1, 2), keepdims=True)
    orders = [(rng.permutation(tokens), rng.permutation(tokens)) for _ in range(heads)]
    if fn == "haar_decay":
        def call():
            return haar_decay(f if heads > 1 else f[0])
        haar_decay(f[:1, :16, :16])
    else:
        def call():
            return [residual_smoothness(f[h], *orders[h]) for h in range(heads)]
        residual_smoothness(f[0, :16, :16])
    base = _rss_mb()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"function": fn, "tokens": tokens, "heads": heads, "min_s": round(min(times), 4),
            "median_s": round(float(np.median(times)), 4), "peak_rss_mb": round(peak, 1),
            "call_mb": round(max(0.0, peak - base), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tokens", type=int, nargs="+", default=[128, 512, 1024])
    ap.add_argument("--heads", type=int, default=48, help="heads of the batch case (at the smallest --tokens)")
    ap.add_argument("--case", help=argparse.SUPPRESS)  # function,tokens,heads: run one case here
    args = ap.parse_args()
    if args.case:
        fn, tokens, heads = args.case.split(",")
        print(json.dumps(run_case(fn, int(tokens), int(heads), args.repeat)))
        return
    cases = [(fn, t, 1) for fn in ("residual_smoothness", "haar_decay") for t in args.tokens]
    cases += [(fn, min(args.tokens), args.heads) for fn in ("residual_smoothness", "haar_decay")]
    print(f"{'function':<20} {'tokens':>6} {'heads':>5} {'min s':>8} {'median s':>9} {'peak MB':>8} {'call MB':>8}")
    for fn, tokens, heads in cases:
        out = subprocess.run([sys.executable, __file__, "--case", f"{fn},{tokens},{heads}", "--repeat",
                              str(args.repeat)], capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"{r['function']:<20} {r['tokens']:>6} {r['heads']:>5} {r['min_s']:>8.4f} {r['median_s']:>9.4f} "
              f"{r['peak_rss_mb']:>8.1f} {r['call_mb']:>8.1f}", flush=True)


if __name__ == "__main__":
    main()
