"""The explorer page's data for one model, from the workflow's stores (one sample in memory at a time)."""
from __future__ import annotations

import logging
import time

import numpy as np
import pandas as pd

from .. import store
from ..plan import shown_samples
from ..heads2d import read_organizations_2d, sample_organizations
from ..heads2d import figure_units, heads_for_2d
from .collect import read_sample
from .encode import Plan, encode_sample, encoded_bytes, full_head_bytes, plan, round_values

log = logging.getLogger("oattn")

__all__ = ["model_payload", "page_plan", "encode_page_sample", "assemble_payload", "figure_units", "table_payload",
           "ablation_metrics", "units_of", "stability_payload", "STABILITY_METRIC"]

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


def _organizations_2d(paths, organized2d_store, units2d: list[int], layers, heads, quantity: str, crop,
                      iters: int) -> dict:
    """A sample's 2-D organizations of `units2d` (`paths`: its attention, organized and decomposed
    stores): its organize2d store's (checked to hold those heads), or made here
    (`heads2d.sample_organizations`) where `organized2d_store` is None."""
    if organized2d_store is None:
        return sample_organizations(paths[0], paths[2], units2d, layers, heads, quantity=quantity, crop=crop,
                                    questionnaire2d_iters=iters)[0]
    orgs, _ = read_organizations_2d(organized2d_store)
    if list(orgs) != list(units2d):
        raise ValueError(f"{organized2d_store}: organizes heads {list(orgs)} in 2-D, the explorer shows "
                         f"{list(units2d)} (entropy extremes and figure heads of the current run): the store is "
                         "stale, delete it so the workflow regenerates it")
    return orgs


def _plan_of(pp: dict) -> Plan:
    p = pp["plan"]
    return Plan(p["side"], p["full_mode"], {int(k): list(v) for k, v in p["full"].items()}, p["size"], p["budget"])


def _check_stores(attention_stores, organized_stores, decomposed_stores, organized2d_stores) -> None:
    if not (len(attention_stores) == len(organized_stores) == len(decomposed_stores) > 0):
        raise ValueError(f"attention_stores, organized_stores, decomposed_stores: need one per sample, got "
                         f"{len(attention_stores)}, {len(organized_stores)}, {len(decomposed_stores)}")
    if organized2d_stores is not None and len(organized2d_stores) != len(attention_stores):
        raise ValueError(f"organized2d_stores: {len(organized2d_stores)} stores for {len(attention_stores)} samples")


def page_plan(attention_stores: list, organized_store, decomposed_store, entropy_store, *,
              quantity: str, crop=None, figure_heads=((0, 0),), heads_2d: int = 8, questionnaire2d_iters: int = 10,
              max_side: int = 128, data_bytes: int = 9_000_000, organized2d_store=None, keep_trial: bool = False,
              max_samples: int | None = None):
    """What a model's page shows, decided before any sample is encoded: the heads shown in 2-D
    (entropy extremes and figure heads), every shown sample's lengths (from the headers of
    `attention_stores`, one per shown sample: the first `max_samples` of the entropy store's,
    or all of them where None) and the resolution that fits `data_bytes`, measured on
    sample 0 (its stores: attention_stores[0], `organized_store`, `decomposed_store` and
    `organized2d_store`, or its 2-D organizations made here where that is None; read and
    encoded here). A JSON-able dict, the `explorer_plan` job's output, which each sample's
    encoding (`encode_page_sample`) and the page (`assemble_payload`) read. With `keep_trial`,
    returns (plan, sample 0 as `encode_page_sample` would give it, or None where the plan's
    resolution is not the one sample 0 was measured at)."""
    if not attention_stores:
        raise ValueError("attention_stores: need one per sample, got none")
    t0 = time.perf_counter()
    ent = store.read_store(entropy_store, require=("head_entropy", "head_sparsity"))
    n_total = ent.sizes["sample"]
    n_s = shown_samples(n_total, max_samples)
    if n_s != len(attention_stores):
        raise ValueError(f"{entropy_store}: {n_total} samples, of which the page shows {n_s} (explorer.max_samples "
                         f"{max_samples}); the explorer was given {len(attention_stores)}")
    n_layer, n_head = ent.sizes["layer"], ent.sizes["head"]
    n_units = n_layer * n_head
    # the model's indices of the stored layers and heads: every label of the page shows these
    layers, heads = [int(v) for v in ent["layer"].values], [int(v) for v in ent["head"].values]
    # the heads in 2-D: the extremes over every sample, as the organize2d stage picks them
    entropy = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(n_total, n_units)
    fig_units = figure_units(figure_heads, n_layer, n_head)
    units2d = heads_for_2d(fig_units, np.nanmean(entropy, axis=0), heads_2d)
    # every sample's (query, key) lengths: samples of their own lengths (attention files) are
    # planned at the longest; a store without pre-softmax scores has no 2-D organizations
    lengths, no_scores = [], None
    for path in attention_stores:
        att = store.read_store(path, lazy=True)
        n = (att.sizes["query"], att.sizes["key"]) if crop is None else (int(crop[1]) - int(crop[0]),) * 2
        lengths.append([int(n[0]), int(n[1])])
        if "scores" not in att.variables and no_scores is None:
            no_scores = (f"not computed: {store.store_path(path)} holds no pre-softmax scores (the model's attention "
                         "files hold probabilities only)")
    if no_scores:
        units2d = []
    paths = (attention_stores[0], organized_store, decomposed_store)
    s0 = read_sample(0, *paths, quantity=quantity, crop=crop, masks_of=units2d)
    _check_sample(s0, paths[0], lengths[0], layers, heads, f"the entropy store {entropy_store}")
    t = time.perf_counter()
    orgs0 = _organizations_2d(paths, organized2d_store, units2d, layers, heads, quantity, crop,
                              questionnaire2d_iters)
    t2d = time.perf_counter() - t
    n_q, n_k = max(q for q, _ in lengths), max(k for _, k in lengths)
    measured = _measured(s0, orgs0, n_q, n_k, n_units)
    p = plan(n_q, n_k, n_units, n_s, units2d, max_side, data_bytes, sample_bytes=measured,
             head_bytes=int(1.1 * full_head_bytes(s0, orgs0, units2d[0] if units2d else 0)))
    pp = {"n_samples": n_s, "n_samples_total": n_total, "layers": layers, "heads": heads, "n_query": n_q, "n_key": n_k, "lengths": lengths,
          "figure_units": fig_units, "units_2d": [int(u) for u in units2d], "units_2d_note": no_scores,
          "heads_2d": heads_2d, "questionnaire2d_iters": questionnaire2d_iters,
          "model_size": [s0.info["model_layers"], s0.info["model_heads"]],
          "plan": {"side": p.side, "full_mode": p.full_mode, "full": {str(k): sorted(v) for k, v in p.full.items()},
                   "size": p.size, "budget": p.budget},
          "seconds": {"plan": round(time.perf_counter() - t0, 2), "organize_2d": round(t2d, 2)}}
    if keep_trial:
        trial = measured.encoded(p)
        return pp, None if trial is None else {"encoded": trial, "info": _sample_info(s0, orgs0),
                                               "seconds": {"total": 0.0, "organize_2d": 0.0}}
    return pp


def _sample_info(s, orgs) -> dict:
    kv = s.info["kv_group"]
    return {"masked": s.layer_allowed is not None, "kv_group": kv.reshape(-1).tolist() if kv is not None else None,
            "n_2d": len(orgs)}


def _check_sample(s, path, length, layers, heads, against: str) -> None:
    if list(s.x.shape[1:]) != list(length):
        raise ValueError(f"{path}: {tuple(s.x.shape[1:])} tokens, {against} says {tuple(length)}")
    if (s.info["layers"], s.info["heads"]) != (layers, heads):
        raise ValueError(f"{path}: holds layers {s.info['layers']} x heads {s.info['heads']}, {against} layers "
                         f"{layers} x heads {heads}")


def encode_page_sample(i: int, attention_store, organized_store, decomposed_store, pp: dict, *, quantity: str,
                       crop=None, organized2d_store=None) -> dict:
    """Sample i of a page planned by `page_plan` (`pp`), encoded at the plan's resolution: a
    JSON-able dict, the `explorer_sample` job's output ({"encoded", "info", "seconds"}). Its 2-D
    organizations come from `organized2d_store` (the organize2d stage's), or are made here."""
    t0 = time.perf_counter()
    paths = (attention_store, organized_store, decomposed_store)
    units2d, layers, heads = pp["units_2d"], pp["layers"], pp["heads"]
    s = read_sample(i, *paths, quantity=quantity, crop=crop, masks_of=units2d)
    _check_sample(s, attention_store, pp["lengths"][i], layers, heads, "the page's plan (stale: delete it)")
    t = time.perf_counter()
    orgs = _organizations_2d(paths, organized2d_store, units2d, layers, heads, quantity, crop,
                             pp["questionnaire2d_iters"])
    t2d = time.perf_counter() - t
    encoded = encode_sample(s, orgs, _plan_of(pp), i)
    return {"encoded": encoded, "info": _sample_info(s, orgs),
            "seconds": {"total": round(time.perf_counter() - t0, 2), "organize_2d": round(t2d, 2)}}


def assemble_payload(model: str, kind: str, pp: dict, samples: list[dict], entropy_store, tables: list[dict],
                     rankings_csv=None, *, quantity: str, crop=None, stability_store=None) -> dict:
    """Everything the page shows of a model, from its plan (`page_plan`), its samples as encoded
    (`encode_page_sample`, in sample order) and the per-head metrics of the entropy store, the
    prune stage's rankings and the stability stage's store; `meta` says what is shown at which
    resolution."""
    t0 = time.perf_counter()
    if len(samples) != pp["n_samples"]:
        raise ValueError(f"{model}: {len(samples)} encoded samples, the page's plan has {pp['n_samples']}")
    ent = store.read_store(entropy_store, require=("head_entropy", "head_sparsity"))
    n_total, layers, heads = ent.sizes["sample"], pp["layers"], pp["heads"]
    if n_total != pp.get("n_samples_total", pp["n_samples"]) or [int(v) for v in ent["layer"].values] != layers or \
            [int(v) for v in ent["head"].values] != heads:
        raise ValueError(f"{entropy_store}: {n_total} samples of layers {ent['layer'].values.tolist()} x heads "
                         f"{ent['head'].values.tolist()}, the page's plan {pp.get('n_samples_total', pp['n_samples'])} "
                         f"of {layers} x {heads}: the plan is stale, delete it")
    # the page shows the first n_s samples (explorer.max_samples); Tables 1-2 cover all of them
    n_s, n_units = pp["n_samples"], len(layers) * len(heads)
    ent = ent.isel(sample=slice(0, n_s))
    entropy = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(n_s, n_units)
    sparsity = ent["head_sparsity"].transpose("sample", "layer", "head").values.reshape(n_s, n_units)
    metrics = {"Haar entropy (coarsest l1)": [round_values(v) for v in entropy],
               "l1/l2 sparsity (lower is sparser)": [round_values(v) for v in sparsity]}
    for name, v in ablation_metrics(rankings_csv, layers, heads).items():
        metrics[name] = [round_values(v)] * n_s
    ranges = None
    if stability_store is not None:
        metrics[STABILITY_METRIC], ranges = stability_payload(stability_store, ent["sample"].values, layers, heads)
    lengths = [tuple(n) for n in pp["lengths"]]
    seconds = pp["seconds"]["plan"] + sum(s["seconds"]["total"] for s in samples) + time.perf_counter() - t0
    meta = {"model": model, "kind": kind, "quantity": quantity, "n_layer": len(layers), "n_head": len(heads),
            "layers": layers, "heads": heads, "model_layers": pp["model_size"][0], "model_heads": pp["model_size"][1],
            "masked": any(s["info"]["masked"] for s in samples),
            "n_query": pp["n_query"], "n_key": pp["n_key"], "n_samples": n_s, "n_samples_total": n_total,
            "lengths": [list(n) for n in lengths] if len(set(lengths)) > 1 else None,
            "units_2d_note": pp["units_2d_note"], "crop": list(crop) if crop is not None else None,
            "kv_group": samples[-1]["info"]["kv_group"],
            "figure_units": pp["figure_units"], "units_2d": pp["units_2d"], "heads_2d": pp["heads_2d"],
            "questionnaire2d_iters": pp["questionnaire2d_iters"], "plan": _plan_of(pp).describe(),
            "build_seconds": {"total": round(seconds, 2),
                              "organize_2d": round(pp["seconds"]["organize_2d"]
                                                   + sum(s["seconds"]["organize_2d"] for s in samples), 2)}}
    return {"meta": meta, "metrics": metrics, "samples": [s["encoded"] for s in samples], "tables": tables,
            "entropy_ranges": ranges}


def model_payload(model: str, kind: str, attention_stores: list, organized_stores: list,
                  decomposed_stores: list, entropy_store, tables: list[dict], rankings_csv=None, *,
                  quantity: str, crop=None, figure_heads=((0, 0),), heads_2d: int = 8,
                  questionnaire2d_iters: int = 10, max_side: int = 128, data_bytes: int = 9_000_000,
                  stability_store=None, organized2d_stores: list | None = None,
                  max_samples: int | None = None) -> dict:
    """Everything the page shows of a model (`assemble_payload`), in one process: the plan
    (`page_plan`), then each sample encoded (`encode_page_sample`, one sample in memory at a
    time; sample 0's trial encoding reused where the plan shows it the same way). The workflow
    runs these steps as jobs of their own for a model of one job per sample.

    The 2-D organizations of the heads shown in 2-D are read from `organized2d_stores` (one
    per sample, the organize2d stage's), or made here by the same code where none are given."""
    _check_stores(attention_stores, organized_stores, decomposed_stores, organized2d_stores)
    pp, trial = page_plan(attention_stores, organized_stores[0], decomposed_stores[0], entropy_store,
                          quantity=quantity, crop=crop, figure_heads=figure_heads, heads_2d=heads_2d,
                          questionnaire2d_iters=questionnaire2d_iters, max_side=max_side, data_bytes=data_bytes,
                          organized2d_store=None if organized2d_stores is None else organized2d_stores[0],
                          keep_trial=True, max_samples=max_samples)
    samples = []
    for i in range(pp["n_samples"]):
        o2d = None if organized2d_stores is None else organized2d_stores[i]
        if i == 0 and trial is not None:
            # the plan's trial encoding of sample 0 at the chosen resolution: encoding it again
            # would give the same bytes at the cost of a second encoding (bench/explorer.py times the build)
            samples.append(trial)
        else:
            samples.append(encode_page_sample(i, attention_stores[i], organized_stores[i], decomposed_stores[i], pp,
                                              quantity=quantity, crop=crop, organized2d_store=o2d))
        log.info("explorer %s: sample %d encoded (%d heads organized in 2-D)", model, i, len(pp["units_2d"]))
    return assemble_payload(model, kind, pp, samples, entropy_store, tables, rankings_csv, quantity=quantity,
                            crop=crop, stability_store=stability_store)
