"""Stage `prune`: the head-ablation study of one model (docs/method.md §11): Figure 7, Tables 3 and 4.

Every ranking of `oattn_lib.ablation` scores the heads on the extracted samples; its first k
heads are masked (`models.gating`) and the network is measured on held-out data that shares
nothing with those samples. Written: the curves, the rankings, Table 3 (area under each
curve, the largest fraction masked within the tolerance) and Table 4 (each ranking's
stability across samples) with their measured prose, Figure 7, and the bottom-k test: each
ranking's first k = round(entropy.fraction x heads) heads masked, beside the k-subsets of its
null (docs/method.md §11.5).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .. import store
from ..ablation import (ATTN_ENTROPY, CONFIDENCE, GRADIENT, HAAR_HIGH, HAAR_LOW, METRICS, NULL_SET, PERPLEXITY,
                        RANDOM, RANKINGS, NullSets, attention_confidence, attention_entropy, curve_summary,
                        evaluate_masks, gradient_importance, lowest_first, mask_counts, masks_from_order,
                        masks_from_sets, normalize_per_layer, null_sets, random_order, ranking_sets,
                        ranking_stability)
from ..entropy import n_extreme
from ..models import adapter_for
from ..models.kinds import HeldOut
from ..runtime import resolve_device

log = logging.getLogger("oattn")

__all__ = ["prune"]


@dataclass(frozen=True)
class _Measured:
    """What the study measured on one model, for its tables and figure."""

    name: str
    objective: str  # what was measured (models.gating.OBJECTIVES): the key of ablation.METRICS
    shape: tuple[int, int]  # (layer, head)
    n_samples: int
    n_held_out: int
    ks: np.ndarray  # numbers of heads masked
    per_sample: dict  # ranking -> (sample, layer, head) scores, low = masked first (not random)
    mean_scores: dict  # ranking -> (layer, head) score the order sorts (not random)
    orders: dict  # ranking -> list of head orders (flat layer * n_head + head)
    curves: dict  # ranking -> (len(ks),) metric; random: (seeds, len(ks))

    @property
    def n_units(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def fractions(self) -> np.ndarray:
        return self.ks / self.n_units

    @property
    def base(self) -> float:
        """The unmasked network's metric."""
        return float(self.curves[HAAR_LOW][0])


# -- inputs -------------------------------------------------------------------------------------
def _read_samples(attention_stores: list, entropy_store) -> tuple[list, np.ndarray, dict]:
    """The extracted samples (their attention stores' tokens, coordinates and attributes, without
    the attention itself), their Haar entropies (sample, layer, head) and the attention-based
    scores of each sample (ranking -> (sample, layer, head)). One store's probabilities are in
    memory at a time (1.1 GB for 270 heads at 1024 tokens)."""
    attention, stats = [], {ATTN_ENTROPY: [], CONFIDENCE: []}
    for p in attention_stores:
        ds = store.read_store(p, require=("probs",), finite=("probs",), variables=("probs",))
        probs = ds["probs"].transpose("layer", "head", "query", "key").values
        stats[ATTN_ENTROPY].append(attention_entropy(probs))
        stats[CONFIDENCE].append(attention_confidence(probs))
        attention.append(ds.drop_vars("probs"))
        del probs, ds
    ent = store.read_store(entropy_store, require=("head_entropy",), finite=("head_entropy",))
    haar = ent["head_entropy"].transpose("sample", "layer", "head").values.astype(np.float64)
    if haar.shape[0] != len(attention):
        raise ValueError(f"entropy store has {haar.shape[0]} samples but {len(attention)} attention stores "
                         "were given")
    return attention, haar, {k: np.stack(v) for k, v in stats.items()}


# -- the study ----------------------------------------------------------------------------------
def _scores(net, layout, samples: HeldOut, attn_stats: dict, haar: np.ndarray, grad_projections: int,
            seed: int, batch_size: int) -> tuple[dict, dict]:
    """Per-sample scores (sample, layer, head) and the mean scores (layer, head) the orders sort,
    of every ranking but random; low = masked first."""
    grad = gradient_importance(net, layout, samples, grad_projections, seed, batch_size)
    per_sample = {HAAR_LOW: haar, HAAR_HIGH: -haar, GRADIENT: normalize_per_layer(grad),
                  ATTN_ENTROPY: attn_stats[ATTN_ENTROPY], CONFIDENCE: attn_stats[CONFIDENCE]}
    mean_scores = {HAAR_LOW: haar.mean(0), HAAR_HIGH: -haar.mean(0),
                   GRADIENT: normalize_per_layer(grad.mean(0)),
                   ATTN_ENTROPY: per_sample[ATTN_ENTROPY].mean(0), CONFIDENCE: per_sample[CONFIDENCE].mean(0)}
    return per_sample, mean_scores


def _orders(mean_scores: dict, n_units: int, random_seeds: int, seed: int) -> dict:
    """Every ranking's head orders, in the order of RANKINGS: one each, random one per seed."""
    orders = {k: [lowest_first(v)] for k, v in mean_scores.items()}
    orders[RANDOM] = [random_order(n_units, seed + s) for s in range(random_seeds)]
    return {k: orders[k] for k in RANKINGS}


@dataclass(frozen=True)
class _Bottom:
    """The bottom-k test's sets (docs/method.md §11.5): each ranking's first k heads and its null."""

    k: int
    rankings: dict  # ranking (not random) -> (k,) flat unit indices, ascending
    null: NullSets

    @property
    def sets(self) -> np.ndarray:
        """(rankings + null sets, k): the rankings' sets in the order of RANKINGS, then the null's."""
        return np.concatenate([np.stack(list(self.rankings.values())), self.null.sets])


def _bottom(orders: dict, n_units: int, fraction: float, exact_max: int, n_random: int, seed: int) -> _Bottom:
    k = n_extreme(n_units, fraction)
    # a stream of its own: the null's draws neither depend on nor repeat the held-out selection
    # (default_rng(seed)) or the random orders (default_rng(seed + s))
    null = null_sets(n_units, k, exact_max, n_random, np.random.default_rng([seed, 1]))
    return _Bottom(k, ranking_sets(orders, k), null)


def _measure(net, layout, data: HeldOut, orders: dict, ks: np.ndarray, bottom: _Bottom,
             batch_size: int) -> tuple[dict, np.ndarray]:
    """The held-out metric of every ranking's masks (the curves: ranking -> (len(ks),), random
    (seeds, len(ks))) and of every set of the bottom-k test ((len(bottom.sets),)); each distinct
    mask is evaluated once, all in one batched evaluation."""
    L, H = layout.shape
    curve_masks = np.concatenate([masks_from_order(o, ks, (L, H)) for k in RANKINGS for o in orders[k]])
    set_masks = masks_from_sets(bottom.sets, (L, H))
    all_masks = np.concatenate([curve_masks, set_masks]).reshape(-1, L * H)
    uniq, inverse = np.unique(all_masks, axis=0, return_inverse=True)
    log.info("%d rankings x %d mask sizes = %d masks, and the bottom-%d test's %d rankings' sets and %d %s null "
             "sets of the %d k-subsets: %d masks, %d distinct; %d held-out examples each",
             sum(len(v) for v in orders.values()), len(ks), len(curve_masks), bottom.k, len(bottom.rankings),
             len(bottom.null.sets), bottom.null.kind, bottom.null.n_total, len(all_masks), len(uniq), len(data))
    t0 = time.perf_counter()
    metric_u = evaluate_masks(net, layout, data, torch.from_numpy(uniq.reshape(-1, L, H)), batch_size)
    dt = time.perf_counter() - t0
    log.info("%d distinct masks x %d held-out examples measured in %.1f s (%.3f s per mask)", len(uniq), len(data),
             dt, dt / len(uniq))
    metric_all = metric_u[inverse.reshape(-1)]
    curves, pos = {}, 0
    for k in RANKINGS:
        n_o = len(orders[k])
        c = metric_all[pos:pos + n_o * len(ks)].reshape(n_o, len(ks))
        curves[k] = c if k == RANDOM else c[0]
        pos += n_o * len(ks)
    return curves, metric_all[pos:]


GRAD_BUDGET = 2 << 30
"""Bytes of activations a gradient pass may keep (`_rows_per_pass`)."""
EVAL_BUDGET = {"cpu": 512 << 20, "cuda": 2 << 30}
"""Bytes of activations an evaluation pass may hold, by device type (others: the GPU's). On a CPU
larger passes are slower per window, not faster (docs/method.md §11.4): the budget holds about
1,000 tokens of a 49,152-token vocabulary's logits per pass. bench/prune.py prints the seconds per
forward and the rows per pass; bench/prune.csv records the passes this choice rests on."""


def _rows_per_pass(batch_size: int, layout, n_tokens: int, *, grad: bool, budget: int = GRAD_BUDGET) -> int:
    """`batch_size` rows per pass, fewer where the largest activations of that many rows would
    exceed `budget` bytes (float32): the logits of a language model (`layout.n_vocab` per token),
    their log-softmax and a temporary, and the attention:

    grad (the gradient pass): the scores, probabilities and their gradients of every head of every
    layer, which eager attention keeps for the backward pass (3.4 GB of attention per row for
    SmolLM2's 270 heads at 1024 tokens, where 64 rows were 200 GB); fused attention keeps far less, but a kernel without
    a fused backward (float64, some masks) keeps as much.
    No grad (the masked evaluation, docs/method.md §11.4): one layer's attention at a time, at most
    its scores, probabilities and a temporary where a kernel materialises them.
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive integer, got {batch_size!r}")
    attention = layout.n_head * n_tokens * n_tokens * 4 * 3 * (layout.n_layer if grad else 1)
    per_row = attention + layout.n_vocab * n_tokens * 4 * 3
    rows = max(1, min(batch_size, budget // max(1, per_row)))
    if rows < batch_size:
        what = (f"{layout.n_layer * layout.n_head} heads' attention kept for the gradient" if grad
                else f"one layer's {layout.n_head} heads' attention")
        log.info("prune.batch_size %d capped to %d rows per %s pass at %d tokens: %s and %d logits per token are "
                 "%.2f GB per row (budget %.2f GB)", batch_size, rows, "gradient" if grad else "evaluation",
                 n_tokens, what, layout.n_vocab, per_row / 1e9, budget / 1e9)
    return rows


def prune(kind: str, model_cfg: dict, data_npz, data_meta, checkpoint, attention_stores: list,
          entropy_store, outs: dict, *, fraction_step: float, random_seeds: int, seed: int, held_out: dict,
          grad_projections: int, batch_size: int, tolerance: float, stability_fraction: float,
          bottom_exact_max: int, bottom_random_sets: int, fraction: float, device) -> None:
    """Head-ablation study of one model (docs/method.md §11): Figure 7, Tables 3 and 4, the curves,
    the bottom-k test.

    model_cfg: the model's `name`, its `path` (hf) and `data.image_size` (vit); the keyword
    arguments are the config's `prune` section (the schema's defaults filled in), `fraction`
    (config `entropy.fraction`: the bottom set is its n_extreme(heads, fraction) heads, Table 1's)
    and `device`.
    outs: paths for `curves` (csv), `rankings` (csv), `finding` (rst, the measured verdict
    the report captions include), `fig7` (png), `table3_csv`, `table3_md`, `table4_csv`,
    `table4_md`, `bottom` (csv: `_bottom_table`).
    """
    model_kind = adapter_for(kind)
    if not model_kind.prunes:
        raise model_kind.unsupported("have its heads masked (prune)", model_cfg.get("name"))
    dev = resolve_device(device)
    meta = json.loads(Path(data_meta).read_text())
    attention, haar, attn_stats = _read_samples(attention_stores, entropy_store)
    loaded = model_kind.ablation(model_cfg, data_npz=data_npz, meta=meta, checkpoint=checkpoint, device=dev)
    net, layout = loaded.net, loaded.layout
    if haar.shape[1:] != layout.shape:
        raise ValueError(f"entropy store has {haar.shape[1:]} (layer, head), the model {layout.shape}")
    rng = np.random.default_rng(seed)

    # the longest sample bounds a pass's memory (the user's texts have their own lengths); the
    # gradient pass keeps every layer's activations, the evaluation one layer's at a time
    n_tokens = max(a.sizes["query"] for a in attention)
    grad_rows = _rows_per_pass(batch_size, layout, n_tokens, grad=True)
    eval_rows = _rows_per_pass(batch_size, layout, n_tokens, grad=False,
                               budget=EVAL_BUDGET.get(dev.type, EVAL_BUDGET["cuda"]))
    samples, used = loaded.ranking_samples(attention)
    data, _ = loaded.held_out(samples, used, held_out, rng, eval_rows)
    per_sample, mean_scores = _scores(net, layout, samples, attn_stats, haar, grad_projections, seed, grad_rows)
    n_units = layout.n_layer * layout.n_head
    orders = _orders(mean_scores, n_units, random_seeds, seed)
    ks = mask_counts(n_units, fraction_step)
    bottom = _bottom(orders, n_units, fraction, bottom_exact_max, bottom_random_sets, seed)
    curves, set_values = _measure(net, layout, data, orders, ks, bottom, eval_rows)
    m = _Measured(model_cfg["name"], layout.objective, layout.shape, haar.shape[0], len(data), ks, per_sample, mean_scores,
                  orders, curves)
    _write_outputs(m, outs, tolerance, stability_fraction)
    store.atomic_write_text(outs["bottom"], _bottom_table(m, bottom, set_values).to_csv(index=False))


# -- outputs ------------------------------------------------------------------------------------
def _verdict(name: str, objective: str, table3: list, base: float, tol: float, n_units: int,
             smallest: float | None = None) -> str:
    """The finding as measured: does masking lowest-Haar-entropy first beat random orders?
    `smallest`: the smallest nonzero fraction of heads masked (the mask sizes' grid)."""
    metric, higher = METRICS[objective]
    row = {r["ranking"]: r for r in table3}
    sign = 1.0 if higher else -1.0
    low, high, grad, rnd = row[HAAR_LOW], row[HAAR_HIGH], row[GRADIENT], row[RANDOM]
    a_rand = np.asarray(rnd["auc_seeds"])
    n_r = a_rand.size
    if sign * low["auc"] > (sign * a_rand).max():
        vs_rand, predicts = f"better than every one of the {n_r} random orders", True
    elif sign * low["auc"] < (sign * a_rand).min():
        vs_rand, predicts = f"worse than every one of the {n_r} random orders", False
    else:
        vs_rand, predicts = f"within the spread of the {n_r} random orders", False

    def cmp(other):
        return "better" if sign * low["auc"] > sign * other["auc"] else "worse"

    def heads(frac):
        return f"{frac:.0%} ({round(frac * n_units)} of {n_units} heads)"

    auc_of = "log perplexity" if objective in PERPLEXITY else metric
    best = max(table3, key=lambda r: sign * r["auc"])
    tolerated = (f"Lowest entropy first masks up to {heads(low['tolerated_fraction'])} with at most {tol:.0%} "
                 f"relative loss of the {metric} (unmasked {base:.4g}); random orders "
                 f"{rnd['tolerated_fraction']:.0%} on average, gradient importance "
                 f"{heads(grad['tolerated_fraction'])}.")
    if smallest and all(r["tolerated_fraction"] == 0 for r in table3):
        tolerated = (f"No ranking stays within {tol:.0%} relative loss of the {metric} (unmasked {base:.4g}) "
                     f"at the smallest mask measured, {heads(smallest)}: finer mask sizes "
                     "(prune.fraction_step) would say how many heads can go.")
    verdict = ("**Low Haar entropy predicts prunable heads here**" if predicts else
               "**Low Haar entropy does not predict prunable heads here**")
    return (f"{verdict} ({name}, measured on held-out data). Masking heads lowest Haar entropy first gives a "
            f"curve of held-out {metric} {vs_rand}: area under the curve of {auc_of} {low['auc']:.4g} against "
            f"{a_rand.mean():.4g} for random orders (min {a_rand.min():.4g}, max {a_rand.max():.4g}; "
            f"{'higher' if higher else 'lower'} is better); {cmp(high)} than highest first "
            f"({high['auc']:.4g}) and {cmp(grad)} than gradient importance ({grad['auc']:.4g}). "
            + tolerated + " "
            f"Best ranking by area: {best['ranking']}.")


def _stability_prose(t4, n_samples: int, stability_fraction: float) -> str:
    rh = t4.set_index("ranking")
    return (f"Across the {n_samples} samples the Haar-entropy ranking has mean Spearman "
            f"{rh.loc[HAAR_LOW, 'spearman_mean']:.2f} and its bottom-{stability_fraction:.0%} set mean Jaccard "
            f"{rh.loc[HAAR_LOW, 'jaccard_mean']:.2f} (gradient importance {rh.loc[GRADIENT, 'spearman_mean']:.2f} / "
            f"{rh.loc[GRADIENT, 'jaccard_mean']:.2f}; random orders between seeds "
            f"{rh.loc[RANDOM, 'spearman_mean']:.2f} / {rh.loc[RANDOM, 'jaccard_mean']:.2f}); the mean Haar "
            f"entropy correlates with gradient importance at Spearman "
            f"{rh.loc[HAAR_LOW, 'spearman_with_gradient']:.2f}.")


def _bottom_table(m: _Measured, bottom: _Bottom, values: np.ndarray):
    """The bottom-k test as measured, one row per set (the rankings' in the order of RANKINGS, then
    the null's): `set` (the ranking, or NULL_SET), `index` (0 for a ranking, the null set's index),
    `heads` ("layer.head;..." ascending), `value` (the held-out metric with those heads masked),
    and the constants a p-value needs: `k`, `n_units`, `null` ("exact": every k-subset; "random"),
    `n_null`, `n_sets_total` (comb(n_units, k)), `metric`, `higher_is_better`, `log_metric` (Table
    3's areas are of the metric's log: compare in log). Read with pandas' keep_default_na=False:
    its default reads "null" as missing. n_sets_total can exceed int64 (comb(270, 27) has 38
    digits): pandas reads such a column as text, int() of it is exact."""
    import pandas as pd

    metric, higher = METRICS[m.objective]
    H = m.shape[1]
    sets = bottom.sets
    if values.shape != (len(sets),):
        raise ValueError(f"values: expected one per set ({len(sets)},), got shape {values.shape}")
    n_rank = len(bottom.rankings)
    heads = [";".join(f"{u // H}.{u % H}" for u in row) for row in sets.tolist()]
    return pd.DataFrame({
        "model": m.name, "set": list(bottom.rankings) + [NULL_SET] * len(bottom.null.sets),
        "index": np.r_[np.zeros(n_rank, dtype=int), np.arange(len(bottom.null.sets))], "heads": heads,
        "value": values.astype(np.float64), "k": bottom.k, "n_units": m.n_units, "null": bottom.null.kind,
        "n_null": len(bottom.null.sets), "n_sets_total": bottom.null.n_total, "metric": metric,
        "higher_is_better": higher, "log_metric": m.objective in PERPLEXITY})


def _blank_nan(df):
    return df.astype(object).where(df.notna(), None)


def _write_outputs(m: _Measured, outs: dict, tolerance: float, stability_fraction: float) -> None:
    import pandas as pd

    metric, higher = METRICS[m.objective]
    L, H = m.shape
    rows3 = curve_summary(m.fractions, m.curves, m.base, higher, tolerance, metric, log=m.objective in PERPLEXITY)
    positive = [f for f in m.fractions if f > 0]
    finding = _verdict(m.name, m.objective, rows3, m.base, tolerance, m.n_units, min(positive, default=None))
    t4 = pd.DataFrame(ranking_stability(m.orders, m.per_sample, m.mean_scores, stability_fraction))
    stab = _stability_prose(t4, m.n_samples, stability_fraction)
    log.info("%s", finding)
    log.info("%s", stab)

    curves = pd.DataFrame([{"ranking": k, "order": j, "k": int(kk), "fraction": float(f),
                            metric: float(np.atleast_2d(m.curves[k])[j, i])}
                           for k in RANKINGS for j in range(len(m.orders[k]))
                           for i, (kk, f) in enumerate(zip(m.ks, m.fractions))])
    store.atomic_write_text(outs["curves"], curves.to_csv(index=False))
    rankings = pd.DataFrame([{"ranking": k, "order": j, "position": p, "layer": int(u // H), "head": int(u % H),
                              "score": float(m.mean_scores[k].reshape(-1)[u]) if k != RANDOM else float("nan")}
                             for k in RANKINGS for j, o in enumerate(m.orders[k]) for p, u in enumerate(o)])
    store.atomic_write_text(outs["rankings"], rankings.to_csv(index=False))

    t3 = pd.DataFrame([{k: v for k, v in r.items() if k not in ("auc_seeds", "tolerated_seeds")} for r in rows3])
    auc_of = "log perplexity" if m.objective in PERPLEXITY else metric
    # what was measured, for readers of the CSV (the summary's claim): a decoder's is its perplexity
    t3.insert(0, "model", m.name)
    t3.insert(1, "metric", metric)
    t3.insert(2, "higher_is_better", higher)
    t3.insert(3, "auc_of", auc_of)
    t4.insert(0, "model", m.name)
    store.atomic_write_text(outs["table3_csv"], t3.to_csv(index=False))
    store.atomic_write_text(outs["table4_csv"], t4.to_csv(index=False))
    n_seeds = len(m.orders[RANDOM])
    md3 = t3.drop(columns=["model", "metric", "higher_is_better", "auc_of"]).rename(columns={
        "auc": f"AUC ({auc_of})", "auc_sd": "AUC sd", "n_orders": "orders",
        "tolerated_fraction": f"max fraction within {tolerance:.0%}", "tolerated_fraction_sd": "sd"})
    store.atomic_write_text(outs["table3_md"], (
        f"{finding}\n\n" + _blank_nan(md3).to_markdown(index=False, floatfmt=".4g", missingval="") +
        f"\n\n{m.name}: {m.n_units} heads ({L} layers x {H}), masked k = {m.ks.tolist()}; metric: held-out "
        f"{metric} ({'higher' if higher else 'lower'} is better), unmasked {m.base:.4g}, on {m.n_held_out} "
        f"held-out examples. AUC: trapezoidal area over the fraction masked (0 to 1); random: mean and sd over "
        f"{n_seeds} seeds. Max fraction: the largest fraction such that it and every smaller one lose "
        f"at most {tolerance:.0%} (relative) of the unmasked {metric}.\n"))
    md4 = t4.drop(columns=["model"]).rename(columns={
        "spearman_mean": "Spearman mean", "spearman_min": "Spearman min",
        "jaccard_mean": f"Jaccard bottom {stability_fraction:.0%} mean", "jaccard_min": "Jaccard min",
        "spearman_with_gradient": "Spearman with gradient importance"})
    store.atomic_write_text(outs["table4_md"], (
        f"{stab}\n\n" + _blank_nan(md4).to_markdown(index=False, floatfmt=".3g", missingval="") +
        f"\n\n{m.name}: per-sample scores of each ranking over {m.n_samples} samples (random: the {n_seeds} "
        f"seeds' orders, the chance level); bottom set = the {stability_fraction:.0%} of the {m.n_units} heads "
        "each ranking masks first. Last column: Spearman correlation of the ranking's mean score with the "
        "per-layer-normalised gradient importance.\n"))
    # reST: a trailing underscore would make the model name a link target
    rst_name = m.name.replace("_", "\\_")
    store.atomic_write_text(outs["finding"], f"*Measured on {rst_name}:* "
                            + f"{finding} {stab}".replace(m.name, rst_name) + "\n")
    _write_fig7(m, outs["fig7"])


def _write_fig7(m: _Measured, path) -> None:
    from .. import plots

    metric, _ = METRICS[m.objective]
    fig = plots.fig7_ablation(m.fractions, m.curves, f"held-out {metric}",
                              title=f"{m.name}: held-out {metric} vs. fraction of heads masked")
    if m.objective in PERPLEXITY:  # perplexity grows exponentially as heads go
        from matplotlib.ticker import FuncFormatter
        ax = fig.axes[0]
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FuncFormatter(lambda v, _: f"{v:g}"))
    plots.save(fig, path)
