"""The explorer page's data for one model, from the workflow's stores (one sample in memory at a time)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from .. import store
from ..heads2d import read_organizations_2d, sample_organizations
from ..heads2d import figure_units, heads_for_2d
from .collect import read_sample
from .encode import Plan, encode_sample, encoded_bytes, full_head_bytes, plan, round_values

log = logging.getLogger("oattn")

__all__ = ["model_payload", "figure_units", "table_payload", "ablation_metrics", "units_of", "stability_payload",
           "STABILITY_METRIC"]

STABILITY_METRIC = "Haar entropy: largest change over replicates (relative)"
"""The grid metric of a model with a stability stage (docs/method.md §14): per head, the largest
|replicate - reference| / |reference| of its Haar entropy over the sample's replicates."""

# the rankings of the prune stage (oattn_lib.ablation.RANKINGS) that score heads by something
# other than the Haar entropy the grid already shows; random orders score nothing
_NOT_A_HEAD_SCORE = ("Haar entropy", "random")


def units_of(layers, heads, stored_layers, stored_heads, where: str) -> np.ndarray:
    """Units (positions in the stored layer x head grid) of heads named by the model's (layer,
    head) indices; ValueError naming `where` for a head the stores do not hold."""
    sl, sh = np.asarray(stored_layers), np.asarray(stored_heads)
    lay, hd = np.asarray(layers, dtype=np.int64), np.asarray(heads, dtype=np.int64)
    li, hi = np.searchsorted(sl, lay), np.searchsorted(sh, hd)
    bad = (li >= sl.size) | (hi >= sh.size)
    bad |= ~bad & ((sl[np.minimum(li, sl.size - 1)] != lay) | (sh[np.minimum(hi, sh.size - 1)] != hd))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{where}: layer {lay[i]}, head {hd[i]} is not among the stored layers {sl.tolist()} x "
                         f"heads {sh.tolist()}")
    return li * sh.size + hi


def ablation_metrics(rankings_csv, layers, heads) -> dict:
    """Per-head scores of the prune stage's rankings (gradient importance and the like), as
    {name: (unit,) values}; {} without a rankings file. `layers`, `heads`: the model's indices of
    the stored layers and heads (the rankings name heads by the model's indices)."""
    if rankings_csv is None:
        return {}
    df = pd.read_csv(rankings_csv)
    out = {}
    for name, g in df[df["order"] == 0].groupby("ranking", sort=False):
        if name.startswith(_NOT_A_HEAD_SCORE) or g["score"].isna().all():
            continue
        v = np.full(len(layers) * len(heads), np.nan)
        v[units_of(g["layer"], g["head"], layers, heads, f"{rankings_csv}: ranking {name!r}")] = g["score"].to_numpy()
        out[f"ablation: {name}"] = v
    return out


def stability_payload(stability_store, samples, layers, heads) -> tuple[list, list]:
    """What the page shows of the stability stage (docs/method.md §14) for the page's `samples`
    (the entropy store's sample ids): per sample, the (unit,) values of STABILITY_METRIC, and
    {"lo", "hi"} (unit,) ranges of each head's Haar entropy over its replicates, the reference
    included, with each replicate's perturbation; a sample without replicates has NaNs and None."""
    from ..stability import REFERENCE, relative_spread

    ds = store.read_store(stability_store, require=("head_entropy",))
    units = units_of(ds["unit_layer"].values, ds["unit_head"].values, layers, heads, f"{stability_store}: unit")
    n_units = len(layers) * len(heads)
    ent = ds["head_entropy"].transpose("sample", "replicate", "unit").values.astype(np.float64)
    pert = [str(v) for v in ds["perturbation"].values]
    if pert.count(REFERENCE) != 1:
        raise ValueError(f"{stability_store}: expected one reference replicate ({REFERENCE!r}), perturbations {pert}")
    ref = pert.index(REFERENCE)
    where = {int(v): i for i, v in enumerate(ds["sample"].values)}
    metric, ranges = [], []
    for sample in samples:
        v = np.full(n_units, np.nan)
        if int(sample) not in where:
            metric.append(round_values(v))
            ranges.append(None)
            continue
        e = ent[where[int(sample)]]  # (replicate, unit in the store's order)
        v[units] = relative_spread(e, e[ref]).max(axis=0)
        lo, hi = np.full(n_units, np.nan), np.full(n_units, np.nan)
        lo[units], hi[units] = e.min(axis=0), e.max(axis=0)
        metric.append(round_values(v))
        ranges.append({"lo": round_values(lo, 7), "hi": round_values(hi, 7), "perturbations": pert})
    return metric, ranges


def table_payload(title: str, csv, select: str, note: str = "") -> dict:
    """A table for the page: columns, rows (numbers rounded), and what a click on a row selects
    (`head`: a (layer, head) row, `sample`, or `ranking`: the grid shows its scores)."""
    df = pd.read_csv(csv).drop(columns=["model"], errors="ignore")
    rows = []
    for rec in df.itertuples(index=False):
        rows.append([None if isinstance(v, float) and not np.isfinite(v) else
                     (float(f"{v:.5g}") if isinstance(v, float) else v.item() if hasattr(v, "item") else v)
                     for v in rec])
    return {"title": title, "columns": list(df.columns), "rows": rows, "select": select, "note": note}


def _measured(s0, orgs0, n_q: int, n_k: int, n_units: int):
    """One sample's bytes in the page at a resolution, measured on sample 0 (gzip included), with
    a 10% margin for samples that compress less well; samples of their own lengths are counted
    at the longest's, n_q x n_k (sample 0's bytes at full resolution scaled by the area)."""
    cache = {}
    scale = max(1.0, n_q * n_k / (s0.x.shape[1] * s0.x.shape[2]))

    def sample_bytes(side: int) -> int:
        if side not in cache:
            full_mode = n_q <= side and n_k <= side
            trial = Plan(side, full_mode, {0: list(range(n_units))} if full_mode else {})
            encoded = encode_sample(s0, orgs0, trial, 0)
            cache[side] = (int(1.1 * (scale if full_mode else 1.0) * encoded_bytes(encoded)), trial, encoded)
        return cache[side][0]

    def encoded(p: Plan) -> dict | None:
        """Sample 0 as encoded for a trial that `p` would encode the same way (the same level of
        detail and the same heads at full resolution), or None: at 1024 tokens an encoding takes
        as long as reading the sample."""
        hit = cache.get(p.side)
        if hit is None or hit[1].full_mode != p.full_mode or sorted(hit[1].full.get(0, [])) != sorted(p.full.get(0, [])):
            return None
        return hit[2]

    sample_bytes.encoded = encoded
    return sample_bytes


def _organizations_2d(i: int, paths, organized2d_stores, units2d: list[int], layers, heads, quantity: str, crop,
                      iters: int) -> dict:
    """Sample i's 2-D organizations of `units2d`: its organize2d store's (checked to hold those
    heads), or made here (`stages.organize2d.sample_organizations`)."""
    if organized2d_stores is None:
        return sample_organizations(paths[0], paths[2], units2d, layers, heads, quantity=quantity, crop=crop,
                                    questionnaire2d_iters=iters)[0]
    orgs, _ = read_organizations_2d(organized2d_stores[i])
    if list(orgs) != list(units2d):
        raise ValueError(f"{organized2d_stores[i]}: organizes heads {list(orgs)} in 2-D, the explorer shows "
                         f"{list(units2d)} (entropy extremes and figure heads of the current run): the store is "
                         "stale, delete it so the workflow regenerates it")
    return orgs


def model_payload(model: str, kind: str, attention_stores: list, organized_stores: list,
                  decomposed_stores: list, entropy_store, tables: list[dict], rankings_csv=None, *,
                  quantity: str, crop=None, figure_heads=((0, 0),), heads_2d: int = 8,
                  questionnaire2d_iters: int = 10, max_side: int = 128, data_bytes: int = 9_000_000,
                  stability_store=None, organized2d_stores: list | None = None) -> dict:
    """Everything the page shows of a model: per-head metrics, per-sample heads at the planned
    resolution, tables, and with a `stability_store` each head's entropy range over the
    replicates (`stability_payload`); `meta` says what is shown at which resolution.

    The 2-D organizations of the heads shown in 2-D are read from `organized2d_stores` (one
    per sample, the organize2d stage's), or made here by the same code where none are given."""
    if not (len(attention_stores) == len(organized_stores) == len(decomposed_stores) > 0):
        raise ValueError(f"attention_stores, organized_stores, decomposed_stores: need one per sample, got "
                         f"{len(attention_stores)}, {len(organized_stores)}, {len(decomposed_stores)}")
    t0 = time.perf_counter()
    ent = store.read_store(entropy_store, require=("head_entropy", "head_sparsity"))
    n_s = ent.sizes["sample"]
    if n_s != len(attention_stores):
        raise ValueError(f"{entropy_store}: {n_s} samples, the explorer was given {len(attention_stores)}")
    n_layer, n_head = ent.sizes["layer"], ent.sizes["head"]
    n_units = n_layer * n_head
    # the model's indices of the stored layers and heads: every label of the page shows these
    layers, heads = [int(v) for v in ent["layer"].values], [int(v) for v in ent["head"].values]
    entropy = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(n_s, n_units)
    sparsity = ent["head_sparsity"].transpose("sample", "layer", "head").values.reshape(n_s, n_units)
    fig_units = figure_units(figure_heads, n_layer, n_head)
    units2d = heads_for_2d(fig_units, np.nanmean(entropy, axis=0), heads_2d)
    # every sample's (query, key) lengths: samples of their own lengths (attention files) are
    # planned at the longest; a store without pre-softmax scores has no 2-D organizations
    lengths, no_scores = [], None
    for path in attention_stores:
        att = store.read_store(path, lazy=True)
        n = (att.sizes["query"], att.sizes["key"]) if crop is None else (int(crop[1]) - int(crop[0]),) * 2
        lengths.append(n)
        if "scores" not in att.variables and no_scores is None:
            no_scores = (f"not computed: {store.store_path(path)} holds no pre-softmax scores (the model's attention "
                         "files hold probabilities only)")
    if no_scores:
        units2d = []
    samples, kv, t2d = [], None, 0.0
    paths = list(zip(attention_stores, organized_stores, decomposed_stores))
    if organized2d_stores is not None and len(organized2d_stores) != n_s:
        raise ValueError(f"organized2d_stores: {len(organized2d_stores)} stores for {n_s} samples")

    def load(i):
        nonlocal t2d
        s = read_sample(i, *paths[i], quantity=quantity, crop=crop, masks_of=units2d)
        t = time.perf_counter()
        orgs = _organizations_2d(i, paths[i], organized2d_stores, units2d, layers, heads, quantity, crop,
                                 questionnaire2d_iters)
        t2d += time.perf_counter() - t
        return s, orgs

    s0, orgs0 = load(0)
    n_q, n_k = max(q for q, _ in lengths), max(k for _, k in lengths)
    measured = _measured(s0, orgs0, n_q, n_k, n_units)
    p = plan(n_q, n_k, n_units, n_s, units2d, max_side, data_bytes, sample_bytes=measured,
             head_bytes=int(1.1 * full_head_bytes(s0, orgs0, units2d[0] if units2d else 0)))
    model_size = s0.info["model_layers"], s0.info["model_heads"]
    masked = False
    for i in range(n_s):
        s, orgs = (s0, orgs0) if i == 0 else load(i)
        if s.x.shape[1:] != lengths[i]:
            raise ValueError(f"{paths[i][0]}: {s.x.shape[1:]} tokens, its store's sizes say {lengths[i]}")
        if (s.info["layers"], s.info["heads"]) != (layers, heads):
            raise ValueError(f"{paths[i][0]}: holds layers {s.info['layers']} x heads {s.info['heads']}, "
                             f"the entropy store {entropy_store} layers {layers} x heads {heads}")
        kv = s.info["kv_group"]
        masked |= s.layer_allowed is not None
        reused = measured.encoded(p) if i == 0 else None
        samples.append(reused if reused is not None else encode_sample(s, orgs, p, i))
        log.info("explorer %s: sample %d encoded (%d heads organized in 2-D)", model, i, len(orgs))
        s0 = orgs0 = s = orgs = None  # one sample in memory at a time (also while the next one loads)
    metrics = {"Haar entropy (coarsest l1)": [round_values(v) for v in entropy],
               "l1/l2 sparsity (lower is sparser)": [round_values(v) for v in sparsity]}
    for name, v in ablation_metrics(rankings_csv, layers, heads).items():
        metrics[name] = [round_values(v)] * n_s
    ranges = None
    if stability_store is not None:
        metrics[STABILITY_METRIC], ranges = stability_payload(stability_store, ent["sample"].values, layers, heads)
    meta = {"model": model, "kind": kind, "quantity": quantity, "n_layer": n_layer, "n_head": n_head,
            "layers": layers, "heads": heads, "model_layers": model_size[0], "model_heads": model_size[1],
            "masked": masked,
            "n_query": n_q, "n_key": n_k, "n_samples": n_s,
            "lengths": [list(n) for n in lengths] if len(set(lengths)) > 1 else None, "units_2d_note": no_scores, "crop": list(crop) if crop is not None else None,
            "kv_group": kv.reshape(-1).tolist() if kv is not None else None,
            "figure_units": fig_units, "units_2d": units2d, "heads_2d": heads_2d,
            "questionnaire2d_iters": questionnaire2d_iters, "plan": p.describe(),
            "build_seconds": {"total": round(time.perf_counter() - t0, 2), "organize_2d": round(t2d, 2)}}
    return {"meta": meta, "metrics": metrics, "samples": samples, "tables": tables, "entropy_ranges": ranges}
