"""Speed and memory of the analysis engine (a benchmark, not a test).

Builds seeded planted tensors (clusters of smooth query-key patterns, axes permuted) at
the paper's sizes, 256x256x128 (Transformer-XL) and 197x197x144 (ViT, uncropped), plus
64, 128 and 512 per axis, and prints one JSON object with the wall time of each stage
and the peak RSS of each size's whole per-tensor analysis (each size runs in a fresh
process, so peaks do not mix). Usage: python bench/engine.py [--sizes 64,128,...] [--iters 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

SIZES = {"64": (64, 64, 64), "128": (128, 128, 128), "txl": (256, 256, 128),
         "vit": (197, 197, 144), "512": (512, 512, 128)}


def planted(shape, n_clusters=4, seed=0):
    nq, nk, nh = shape
    rng = np.random.default_rng(seed)
    q = np.linspace(0, 1, nq)[:, None]
    k = np.linspace(0, 1, nk)[None, :]
    labels = rng.integers(0, n_clusters, nh)
    bases = [np.sin(2 * np.pi * rng.uniform(0.5, 2) * q + rng.uniform(0, 3))
             * np.cos(2 * np.pi * rng.uniform(0.5, 2) * k) for _ in range(n_clusters)]
    x = np.stack([bases[c] + 0.05 * rng.normal(size=(nq, nk)) for c in labels], axis=2)
    x = x[np.ix_(rng.permutation(nq), rng.permutation(nk), rng.permutation(nh))]
    return np.ascontiguousarray(x, dtype=np.float32)


def run_one(name: str, iters: int) -> dict:
    import torch

    from oattn_lib.diffusion import diffusion_map
    from oattn_lib.emd import pairwise_l1
    from oattn_lib.entropy import head_entropy, network_entropy
    from oattn_lib.haar import bihaar, trihaar
    from oattn_lib.paraproduct import paraproduct
    from oattn_lib.questionnaire import questionnaire3d

    torch.set_num_threads(os.cpu_count() or 1)
    shape = SIZES[name]
    x = planted(shape)
    pairwise_l1(np.random.default_rng(0).random((8, 64), dtype=np.float32))  # numba compile/cache load
    out = {"shape": list(shape)}
    t = time.perf_counter()
    org = questionnaire3d(x, n_iters=iters)
    out["questionnaire3d_s"] = time.perf_counter() - t
    t = time.perf_counter()
    he = head_entropy(x, org, top_k=min(400, shape[0] * shape[1]))
    ne = network_entropy(x, org, top_k=100)
    dm = diffusion_map(org.affinity_h, n_components=3)
    out["entropy_and_diffusion_s"] = time.perf_counter() - t
    t = time.perf_counter()
    bihaar(x, org.tree_q, org.tree_k)
    trihaar(x, org.tree_q, org.tree_k, org.tree_h)
    out["bihaar_and_trihaar_s"] = time.perf_counter() - t
    t = time.perf_counter()
    paraproduct(x[:, :, 0].astype(np.float64), row_order=org.tree_q.order, col_order=org.tree_k.order)
    out["paraproduct_one_head_s"] = time.perf_counter() - t
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["tree_levels"] = [org.tree_q.n_levels, org.tree_k.n_levels, org.tree_h.n_levels]
    out["network_entropy"] = float(ne)
    out["mean_head_entropy"] = float(np.mean(he))
    out["diffusion_top_eigs"] = [float(v) for v in np.asarray(dm.eigenvalues)[:4]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,128,vit,txl,512")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.iters)))
        return
    results = {"threads": os.cpu_count(), "iters": args.iters}
    for name in args.sizes.split(","):
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--iters", str(args.iters)],
                              capture_output=True, text=True)
        if proc.returncode:
            results[name] = {"error": proc.stderr.strip().splitlines()[-1:]}
        else:
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {results[name]}", file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
