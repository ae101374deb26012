"""Speed and memory of the analysis engine, step by step (a benchmark, not a test).

Builds seeded planted tensors (clusters of smooth query-key patterns plus noise, axes
permuted) in float32 and runs, with the paper defaults: the 3-D questionnaire, bi-Haar of
every head, tri-Haar of the network, and the entropies and sparsities computed from those
coefficients (what `organize`, the core of `decompose` and `entropy` do for one sample);
then, apart from the target, the diffusion map of heads and the paraproduct of one head.
Sizes: the paper's 256x256x128 (Transformer-XL) and 197x197x144 (ViT, uncropped), 64, 128
and 512 per axis, and one SmolLM2-135M sample (30 layers x 9 heads = 270 heads) at 1024
and 2048 tokens, dense or causal (`1024c`, `2048c`: each head a masked softmax, zero past the
diagonal, as a decoder's probabilities). Each size runs in a fresh process; for each step it prints the wall time
and the peak RSS during that step (VmHWM, reset before the step), the step's own CPU time,
and the questionnaire's phases (cosine affinities, tree-EMD feature sweeps, the L1 kernel
with the number of |a - b| terms it summed and its rate, flexible trees, EMD
affinities); at the end a table and the growth exponent of the wall and CPU time of each
step and phase between consecutive sizes of a series (time ~ tokens^p). Usage:

    python bench/engine.py [--sizes 64,128,vit,txl,512,1024,2048,1024c,2048c] [--iters 3]

On a shared machine, read the load average printed with each size, and the CPU times:
with both cores free the wall time of the multi-threaded phases is about half their CPU
time, and the L1 kernel's rate (|a - b| terms per CPU second) says whether it ran at the
speed of its arithmetic. Set
OMP_WAIT_POLICY=PASSIVE (the default here, read when torch is imported) so torch's idle
OpenMP threads do not spin while numba's work.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

import numpy as np

SIZES = {"64": (64, 64, 64), "128": (128, 128, 128), "txl": (256, 256, 128),
         "vit": (197, 197, 144), "512": (512, 512, 128),
         "1024": (1024, 1024, 270), "2048": (2048, 2048, 270),
         "1024c": (1024, 1024, 270), "2048c": (2048, 2048, 270)}
# series whose growth exponent is reported: (name, tokens)
SERIES = ([("64", 64), ("128", 128), ("txl", 256), ("512", 512)], [("1024", 1024), ("2048", 2048)],
          [("1024c", 1024), ("2048c", 2048)])
TARGET_STEPS = ("questionnaire", "bihaar", "trihaar", "entropies")


def planted(shape, n_clusters=4, seed=0, causal=False):
    """Seeded planted (query, key, head) float32 tensor, built without a float64 copy;
    `causal`: each head's masked softmax over keys (query q sees keys up to q), as a decoder
    LLM's probabilities."""
    nq, nk, nh = shape
    rng = np.random.default_rng(seed)
    q = np.linspace(0, 1, nq)[:, None]
    k = np.linspace(0, 1, nk)[None, :]
    labels = rng.integers(0, n_clusters, nh)
    bases = [np.sin(2 * np.pi * rng.uniform(0.5, 2) * q + rng.uniform(0, 3))
             * np.cos(2 * np.pi * rng.uniform(0.5, 2) * k) for _ in range(n_clusters)]
    pq, pk, ph = rng.permutation(nq), rng.permutation(nk), rng.permutation(nh)
    x = np.empty(shape, dtype=np.float32)
    for h in range(nh):
        head = bases[labels[ph[h]]] + 0.05 * rng.normal(size=(nq, nk))
        x[:, :, h] = head[np.ix_(pq, pk)]
    if causal:
        allowed = np.arange(nk)[None, :] <= np.arange(nq)[:, None]
        for h in range(nh):
            e = np.where(allowed, np.exp(3 * x[:, :, h]), 0)
            x[:, :, h] = e / e.sum(1, keepdims=True)
    return x


def _status(key: str) -> float:
    """A VmXXX line of /proc/self/status, in MB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS (Linux >= 4.0)
    except OSError:
        pass


class Steps:
    """Wall time, CPU time and peak RSS of each named step."""

    def __init__(self):
        self.out = {}

    def run(self, name, fn, *args, **kwargs):
        _reset_peak()
        t, c = time.perf_counter(), time.process_time()
        result = fn(*args, **kwargs)
        self.out[name] = {"s": round(time.perf_counter() - t, 3), "cpu_s": round(time.process_time() - c, 2),
                          "peak_rss_mb": round(_status("VmHWM")), "rss_after_mb": round(_status("VmRSS"))}
        print(f"  {name}: {self.out[name]}", file=sys.stderr, flush=True)
        return result


class Phases:
    """Wall and CPU time of the questionnaire's phases, by timing the engine functions it
    calls (wrapped here, in the benchmark's own process): the initial cosine affinities,
    the feature sweeps of the tree EMD, its L1 kernel (with the number of |a - b| terms
    it sums), the flexible trees, the EMD affinities."""

    def __init__(self):
        self.out = {}

    def _wrap(self, owner, attr, phase, count=None):
        fn = getattr(owner, attr)

        def timed(*args, **kwargs):
            t, c = time.perf_counter(), time.process_time()
            try:
                return fn(*args, **kwargs)
            finally:
                o = self.out.setdefault(phase, {"s": 0.0, "cpu_s": 0.0, "calls": 0})
                o["s"] += time.perf_counter() - t
                o["cpu_s"] += time.process_time() - c
                o["calls"] += 1
                if count:
                    o["abs_diffs"] = o.get("abs_diffs", 0) + count(*args, **kwargs)
        setattr(owner, attr, timed)

    def install(self):
        from oattn_lib import emd, questionnaire

        def l1_terms(total, F, d=None):  # the terms this call summed (rows ending early skip some)
            if not hasattr(total, "terms"):  # the device path: every pair, every column
                return total.m * (total.m - 1) // 2 * (F.shape[1] if d is None else d)
            done, total.counted = total.terms - getattr(total, "counted", 0), total.terms
            return done
        self._wrap(questionnaire, "_cosine", "cosine")
        self._wrap(emd, "run_program", "emd_feature_sweeps")
        self._wrap(emd, "_copy", "emd_feature_sweeps")
        self._wrap(emd._L1Sum, "add", "emd_l1_kernel", count=l1_terms)
        self._wrap(emd._L1Sum, "result", "emd_l1_kernel")
        self._wrap(questionnaire, "flexible_tree", "flexible_trees")
        self._wrap(questionnaire, "emd_affinity", "emd_affinities")

    def report(self) -> dict:
        out = {k: {**v, "s": round(v["s"], 2), "cpu_s": round(v["cpu_s"], 2)} for k, v in self.out.items()}
        l1 = out.get("emd_l1_kernel")
        if l1 and l1["cpu_s"] > 0:
            l1["abs_diffs_per_cpu_s"] = float(f"{l1['abs_diffs'] / l1['cpu_s']:.3g}")
        return out


def run_one(name: str, iters: int) -> dict:
    import torch

    from oattn_lib.diffusion import diffusion_map
    from oattn_lib.emd import pairwise_l1
    from oattn_lib.entropy import coarse_l1, l1_over_l2
    from oattn_lib.haar import bihaar, haar_basis, trihaar
    from oattn_lib.paraproduct import paraproduct
    from oattn_lib.questionnaire import questionnaire3d

    torch.set_num_threads(os.cpu_count() or 1)
    shape = SIZES[name]
    load = os.getloadavg()
    x = torch.from_numpy(planted(shape, causal=name.endswith("c")))
    pairwise_l1(np.random.default_rng(0).random((8, 64), dtype=np.float32))  # numba compile/cache load
    steps, phases = Steps(), Phases()
    phases.install()
    org = steps.run("questionnaire", questionnaire3d, x, n_iters=iters)
    print(f"  questionnaire phases: {phases.report()}", file=sys.stderr, flush=True)
    (_, sq, lq), (_, sk, lk), (_, sh, lh) = (haar_basis(t) for t in (org.tree_q, org.tree_k, org.tree_h))
    c2 = steps.run("bihaar", bihaar, x, org.tree_q, org.tree_k)

    def head_measures():
        return (coarse_l1(c2, [sq, sk], [lq, lk], min(400, shape[0] * shape[1])),
                l1_over_l2(c2, (0, 1)))
    he, hs = steps.run("entropies_head", head_measures)
    del c2  # the workflow stores it; nothing below needs it
    c3 = steps.run("trihaar", trihaar, x, org.tree_q, org.tree_k, org.tree_h)

    def network_measures():
        return (float(coarse_l1(c3, [sq, sk, sh], [lq, lk, lh], 100)), float(l1_over_l2(c3.reshape(-1), 0)))
    ne, ns = steps.run("entropies_network", network_measures)
    del c3
    dm = steps.run("diffusion", diffusion_map, org.affinity_h, n_components=3)
    head = x[:, :, 0].double().numpy()
    steps.run("paraproduct_one_head", paraproduct, head, row_order=org.tree_q.order, col_order=org.tree_k.order)
    st = steps.out
    st["entropies"] = {"s": round(st["entropies_head"]["s"] + st["entropies_network"]["s"], 3),
                       "peak_rss_mb": max(st["entropies_head"]["peak_rss_mb"], st["entropies_network"]["peak_rss_mb"])}
    st["entropies"]["cpu_s"] = round(st["entropies_head"]["cpu_s"] + st["entropies_network"]["cpu_s"], 2)
    target = {"s": round(sum(st[k]["s"] for k in TARGET_STEPS), 2),
              "cpu_s": round(sum(st[k]["cpu_s"] for k in TARGET_STEPS), 2),
              "peak_rss_mb": max(st[k]["peak_rss_mb"] for k in TARGET_STEPS)}
    import oattn_lib
    return {"shape": list(shape), "engine": os.path.dirname(oattn_lib.__file__), "loadavg_start": [round(v, 2) for v in load],
            "loadavg_end": [round(v, 2) for v in os.getloadavg()], "steps": st,
            "questionnaire_phases": phases.report(),
            "organize_decompose_entropy": target,
            "process_peak_rss_mb": max(v["peak_rss_mb"] for v in st.values()),
            "tree_levels": [org.tree_q.n_levels, org.tree_k.n_levels, org.tree_h.n_levels],
            "distinct_folders": [len(t.folders[1]) for t in (org.tree_q, org.tree_k, org.tree_h)],
            "network_entropy": ne, "network_sparsity": ns,
            "mean_head_entropy": float(np.mean(he)), "mean_head_sparsity": float(hs.mean()),
            "diffusion_top_eigs": [float(v) for v in np.asarray(dm.eigenvalues)[:4]]}


def growth(results: dict) -> dict:
    """Exponent p of time ~ tokens^p between consecutive sizes of a series, of the wall
    and the CPU time (steadier on a shared machine) of each step, questionnaire phase and
    of organize + decompose + entropy."""
    def exponent(a, b, t0, t1):
        return round(math.log(b / a) / math.log(t1 / t0), 2) if a > 0 and b > 0 else None

    out = {}
    for series in SERIES:
        done = [(n, t) for n, t in series if "steps" in results.get(n, {})]
        for (n0, t0), (n1, t1) in zip(done, done[1:]):
            r0, r1 = results[n0], results[n1]
            rows = {"organize_decompose_entropy": (r0["organize_decompose_entropy"], r1["organize_decompose_entropy"])}
            rows.update({k: (r0["steps"][k], r1["steps"][k]) for k in (*TARGET_STEPS, "paraproduct_one_head")})
            rows.update({k: (v, r1["questionnaire_phases"][k]) for k, v in r0["questionnaire_phases"].items()
                         if k in r1["questionnaire_phases"]})
            out[f"{n0}->{n1}"] = {k: {"s": exponent(a["s"], b["s"], t0, t1),
                                      "cpu_s": exponent(a.get("cpu_s", 0), b.get("cpu_s", 0), t0, t1)}
                                  for k, (a, b) in rows.items()}
    return out


def table(results: dict) -> str:
    """The numbers a reader wants, one line per size and step: wall s, CPU s, peak RSS MiB."""
    lines = []
    for name, r in results.items():
        if not isinstance(r, dict) or "steps" not in r:
            continue
        lines.append(f"{name} {tuple(r['shape'])}  load {r['loadavg_start'][0]} -> {r['loadavg_end'][0]}")
        rows = {"organize+decompose+entropy": r["organize_decompose_entropy"],
                **{k: r["steps"][k] for k in TARGET_STEPS},
                **{f"  q: {k}": v for k, v in r["questionnaire_phases"].items()}}
        for k, v in rows.items():
            extra = f"  {v['abs_diffs']:.3g} |a-b| at {v['abs_diffs_per_cpu_s']:.3g}/cpu-s" if "abs_diffs" in v else ""
            peak = f"{v['peak_rss_mb']:>7} MiB" if "peak_rss_mb" in v else " " * 11
            lines.append(f"  {k:30s} {v['s']:9.2f} s {v.get('cpu_s', float('nan')):9.2f} cpu-s {peak}{extra}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,128,vit,txl,512,1024")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(run_one(args.one, args.iters)))
        return
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    results = {"threads": os.cpu_count(), "iters": args.iters}
    for name in args.sizes.split(","):
        print(f"{name} {SIZES[name]} (load {os.getloadavg()[0]:.2f}):", file=sys.stderr, flush=True)
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--iters", str(args.iters)],
                              stdout=subprocess.PIPE, text=True, env=env)
        if proc.returncode:
            results[name] = {"error": f"exit status {proc.returncode}"}
        else:
            results[name] = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"{name}: {json.dumps(results[name].get('organize_decompose_entropy', results[name]))}",
              file=sys.stderr, flush=True)
    results["growth_exponent"] = growth(results)
    print(table(results), file=sys.stderr)
    for pair, g in results["growth_exponent"].items():
        print(f"growth exponent {pair}: " + ", ".join(f"{k} {v['s']} (cpu {v['cpu_s']})" for k, v in g.items()),
              file=sys.stderr)
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
