"""Speed and memory of one attention layer: softmax vs linear Tensor Attention (a benchmark,
not a test).

One self-attention layer (input projection, attention, output projection) of width d = 64
with one head, batch 1, float32 on the CPU, forward + backward, at sequence lengths 256 to
16384, non-causal and causal:

- softmax: torch's fused scaled_dot_product_attention (what nn.MultiheadAttention runs),
- softmax-explicit: softmax(q k^T / sqrt(d)) v with the n x n matrix formed,
- tensor_q: Tensor Attention in its linear-time form (oattn_lib.tensor_attention;
  non-causal Q (K^T K)(Q^T V) / tr, causal the chunked prefix-sum form).

Each (layer, n, causal) runs in a fresh process: the time is the median of --repeats
forward+backward passes after one warm-up; the peak memory is the process's peak resident
memory above its resident memory just before the layer first ran (noise: a few MB).
Prints a table, the length from which tensor_q is faster than each softmax (the
crossover on this machine), and one JSON object.
Usage: python bench/attention.py [--sizes 256,512,...] [--threads 1] [--repeats 3]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

LAYERS = ("softmax", "softmax-explicit", "tensor_q")
D = 64


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run_child(layer: str, n: int, causal: bool, threads: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    from oattn_lib.tensor_attention import tensor_attention

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    in_proj = torch.nn.Linear(D, 3 * D)
    out_proj = torch.nn.Linear(D, D)
    x = torch.randn(1, n, D, requires_grad=True)

    def attend(q, k, v):
        if layer == "softmax":
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if layer == "softmax-explicit":
            s = q @ k.transpose(-1, -2) / D ** 0.5
            if causal:
                s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
            return torch.softmax(s, -1) @ v
        return tensor_attention(q, k, v, "tensor_q", causal=causal)

    def step():
        q, k, v = (t.unsqueeze(1) for t in in_proj(x).chunk(3, -1))  # (1, head=1, n, d)
        y = out_proj(attend(q, k, v).squeeze(1))
        y.square().mean().backward()
        x.grad = None
        for p in (*in_proj.parameters(), *out_proj.parameters()):
            p.grad = None

    base = _rss_mb()
    t = time.perf_counter()
    step()  # warm-up
    first = time.perf_counter() - t
    times = []
    for _ in range(1 if first > 5 else repeats):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KB on Linux
    times.sort()
    return {"layer": layer, "n": n, "causal": causal, "time_s": times[len(times) // 2],
            "peak_mb": max(0.0, peak - base)}


def crossover(rows: list[dict], baseline: str, causal: bool) -> int | None:
    """Smallest n from which tensor_q is faster than `baseline` at every measured n >= it."""
    t = {(r["layer"], r["n"]): r["time_s"] for r in rows if r["causal"] == causal}
    sizes = sorted({n for (_, n) in t})
    ok = [n for n in sizes if (("tensor_q", n) in t and (baseline, n) in t and t["tensor_q", n] < t[baseline, n])]
    for i, n in enumerate(sizes):
        if all(m in ok for m in sizes[i:]):
            return n
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,512,1024,2048,4096,8192,16384")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=3, metavar=("LAYER", "N", "CAUSAL"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        layer, n, causal = args.child
        print(json.dumps(run_child(layer, int(n), causal == "1", args.threads, args.repeats)))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    print(f"one attention layer, d = {D}, 1 head, batch 1, float32, forward + backward, "
          f"{args.threads} thread(s)")
    print(f"{'causal':>6} {'n':>6} " + " ".join(f"{l + ' s':>18} {'MB':>7}" for l in LAYERS))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                        os.environ.get("PYTHONPATH", "")])}
    for causal in (False, True):
        for n in sizes:
            cells = []
            for layer in LAYERS:
                out = subprocess.run([sys.executable, __file__, "--child", layer, str(n), str(int(causal)),
                                      "--threads", str(args.threads), "--repeats", str(args.repeats)],
                                     capture_output=True, text=True, env=env)
                if out.returncode:
                    raise RuntimeError(f"{layer} n={n}: {out.stderr[-2000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                rows.append(r)
                cells.append(f"{r['time_s']:>18.4f} {r['peak_mb']:>7.0f}")
            print(f"{str(causal):>6} {n:>6} " + " ".join(cells), flush=True)
    result = {"d": D, "threads": args.threads, "rows": rows, "crossover": {}}
    for causal in (False, True):
        for base in ("softmax", "softmax-explicit"):
            n = crossover(rows, base, causal)
            key = f"{'causal' if causal else 'non-causal'} tensor_q vs {base}"
            result["crossover"][key] = n
            at_start = " (already at the shortest length measured)" if n == sizes[0] else ""
            print(f"{key}: " + (f"linear tensor attention is faster from n = {n}{at_start}" if n else
                                "softmax is faster at every measured n (no crossover)"))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
