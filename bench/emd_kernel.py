"""Timings of the tree EMD hot spot (docs/method.md §4) at the paper's size; prints JSON.

pairwise L1 on the feature shapes of one questionnaire iteration on a 256 x 256 x 128
(query, key, head) tensor, against torch.cdist(p=1), and tree_emd for the head, query and
key steps with random balanced trees. Wall and CPU times are both reported: on a shared
machine the CPU time of this process is the steadier number. The first call of the numba
kernel (compile or cache load) is timed apart and excluded from the repeats.

    python bench/emd_kernel.py [--repeat 3] [--cdist-repeat 1] [--size 256 256 128]
                               [--omp-wait-policy passive|active|unset]

The OpenMP wait policy matters: torch bundles its own libgomp, whose idle threads by
default keep spinning while numba's threads run, which on a 2-core machine makes the
numba kernel several times slower. It is read when torch is imported, so it is set here
before that import (default passive; `unset` leaves the environment alone).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time


def timed(fn, repeat: int) -> dict:
    """Wall-clock seconds, and process CPU seconds (less sensitive to a busy machine)."""
    import numpy as np

    times, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"min_s": round(min(times), 4), "median_s": round(float(np.median(times)), 4),
            "min_cpu_s": round(min(cpu), 4), "runs": repeat}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cdist-repeat", type=int, default=1)
    ap.add_argument("--size", type=int, nargs=3, default=[256, 256, 128], metavar=("Q", "K", "H"))
    ap.add_argument("--omp-wait-policy", choices=["passive", "active", "unset"], default="passive")
    args = ap.parse_args()
    if args.omp_wait_policy != "unset":
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()

    import numba
    import numpy as np
    import torch

    from oattn_lib.emd import pairwise_l1, tree_emd, tree_features
    from oattn_lib.trees import random_tree

    nq, nk, nh = args.size
    rng = np.random.default_rng(0)
    X = torch.from_numpy(rng.standard_normal((nq, nk, nh)).astype(np.float32))
    tq, tk, th = random_tree(nq, rng), random_tree(nk, rng), random_tree(nh, rng)
    fq, fk, fh = (len(t.folders[0]) for t in (tq, tk, th))

    t0 = time.perf_counter()
    pairwise_l1(np.ones((3, 10), np.float32))
    first_call = time.perf_counter() - t0

    out = {"machine": {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(),
                       "numba_threads": numba.get_num_threads(), "numba_layer": numba.threading_layer(),
                       "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
                       "processor": platform.processor(), "loadavg_start": os.getloadavg()},
           "size": [nq, nk, nh], "distinct_folders": {"query": fq, "key": fk, "head": fh},
           "numba_first_call_s": round(first_call, 3),
           "pairwise_l1": {}, "tree_features": {}, "tree_emd": {}}

    shapes = {"head": (nh, fq * fk), "query": (nq, fk * fh), "key": (nk, fq * fh)}
    for step, (m, d) in shapes.items():
        F = torch.from_numpy(rng.standard_normal((m, d)).astype(np.float32))
        Fn = F.numpy()
        ours = timed(lambda: pairwise_l1(Fn), args.repeat)
        ref = timed(lambda: torch.cdist(F, F, p=1.0), args.cdist_repeat)
        D, Dc = pairwise_l1(Fn), torch.cdist(F, F, p=1.0).double().numpy()
        out["pairwise_l1"][step] = {"shape": [m, d], "ours": ours, "torch_cdist": ref,
                                    "speedup_min": round(ref["min_s"] / ours["min_s"], 2),
                                    "max_rel_diff_vs_cdist": float(np.abs(D - Dc).max() / Dc.max())}
        del F, Fn, D, Dc

    steps = {"head": (2, (tq, tk)), "query": (0, (tk, th)), "key": (1, (tq, th))}
    total = 0.0
    for step, (axis, trees) in steps.items():
        out["tree_features"][step] = timed(lambda: tree_features(X, axis, trees), args.repeat)
        res = timed(lambda: tree_emd(X, axis, trees), args.repeat)
        out["tree_emd"][step] = res
        total += res["median_s"]
    out["tree_emd"]["one_iteration_median_s"] = round(total, 4)
    out["tree_emd"]["three_iterations_median_s"] = round(3 * total, 4)
    out["machine"]["loadavg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
