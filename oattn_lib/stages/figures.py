"""Stage `figures`: Figures 1-6 of the paper for one model, and where Theorem 1 holds (the
paraproduct's residual against logit temperature), from the stored artifacts."""
from __future__ import annotations

import json
import logging
import time

import numpy as np
import pandas as pd

from .. import plots, store
from ..haar import haar_basis
from ..temperature import (
    crossover,
    geometric_mean,
    residual_curve,
    temperature_grid,
)
from ..network import head_array, load_organization, model_mask
from .entropy import coarsest_kept

log = logging.getLogger("oattn")

__all__ = ["figures"]


def figures(model_name: str, attention_stores: list, organized_stores: list, decomposed_stores: list,
            entropy_store, outs: dict, *, entropy_samples: int, trihaar_samples: int, trihaar_top_k: int,
            temperature_taus: int, temperature_random_orders: int, temperature_samples: int,
            crop=None) -> None:
    """Figures 1-6 of the paper for one model, and the temperature figure of Theorem 1.

    outs: fig1..fig6 (png), and for the temperature figure `temperature` (png),
    `temperature_csv` (every curve), `temperature_json` (the crossovers, read by the
    summary) and `temperature_finding` (the sentence the caption includes). `crop` is the
    model's extract.crop, the window the decompose stage analysed.
    """
    start = time.perf_counter()

    def done(what):
        log.info("%s: %.1f s", what, time.perf_counter() - start)

    # every variable but the coefficients a store may keep (1.1 GB each of bi- and tri-Haar at
    # 1024 tokens x 270 heads): the figure heads' own are `fig_bihaar`
    dec0 = store.read_store(decomposed_stores[0], require=("fig_bihaar",), lazy=True)
    dec0 = dec0.drop_vars([v for v in ("bihaar", "trihaar") if v in dec0.variables]).load()
    org0, _ = load_organization(organized_stores[0])
    names = [f"{int(l)}.{int(h)}" for l, h in zip(dec0["fig_layer"].values, dec0["fig_head_index"].values)]
    units = [f"{int(l)}.{int(h)}" for l, h in zip(dec0["unit_layer"].values, dec0["unit_head"].values)]
    i = 0
    not_run = dec0.attrs.get("paraproduct_not_run")  # a store without pre-softmax scores
    plots.save(plots.fig1_organized_head(dec0["fig_original"].values[i], dec0["fig_organized3d"].values[i],
                                         f"{model_name}, head {names[i]}, sample 0"), outs["fig1"])
    plots.save(plots.fig_not_run(f"Figure 2: {model_name}, paraproduct of head {names[i]}", not_run) if not_run else
               plots.fig2_paraproduct(dec0["fig_exact"].values[i], dec0["fig_approx"].values[i],
                                      dec0["fig_residual"].values[i], float(dec0["fig_rel_residual"].values[i]),
                                      float(dec0["fig_rel_residual_unorganized"].values[i]),
                                      f"{model_name}, head {names[i]}, sample 0"), outs["fig2"])
    plots.save(plots.fig3_head_geometry(dec0["diffusion_coords"].values, org0.affinity_h,
                                        org0.tree_h.labels, units, org0.tree_h.order), outs["fig3"])
    done("figures 1-3")
    sup = np.outer(dec0["support_q"].values, dec0["support_k"].values).ravel()
    lev = np.add.outer(dec0["level_q"].values, dec0["level_k"].values).ravel()
    by_support = np.lexsort((np.arange(sup.size), lev, -sup))
    picks = list(range(min(2, len(names))))
    coeffs = [dec0["fig_bihaar"].values[j].ravel()[by_support] for j in picks]
    sups = [sup[by_support] for _ in picks]
    bh = haar_basis(org0.tree_h)[0]
    plots.save(plots.fig4_bihaar(coeffs, sups, [names[j] for j in picks],
                                 bh[org0.tree_h.order][:, :min(6, bh.shape[1])]), outs["fig4"])
    done("figure 4")
    ent = store.read_store(entropy_store)
    k = min(entropy_samples, ent.sizes["sample"])
    plots.save(plots.fig5_entropy_heatmaps(ent["head_entropy"].values[:k], [f"sample {s}" for s in range(k)],
                                           layers=ent["layer"].values, heads=ent["head"].values), outs["fig5"])
    vals = []
    k6 = min(trihaar_samples, len(decomposed_stores))
    for path in decomposed_stores[:k6]:
        vals.append(_coarsest_trihaar(path, trihaar_top_k))
    plots.save(plots.fig6_top_trihaar(np.stack(vals), [f"sample {s}" for s in range(k6)]), outs["fig6"])
    done("figures 5-6")
    k = min(temperature_samples, len(decomposed_stores))
    if not_run:
        _temperature_not_run(model_name, outs, not_run)
    else:
        _temperature(model_name, attention_stores[:k], decomposed_stores[:k], outs, temperature_taus,
                     temperature_random_orders, crop)
    done("temperature figure")


def _coarsest_trihaar(path, top_k: int) -> np.ndarray:
    """The `top_k` coarsest tri-Haar coefficients of a decomposed store (all of a shorter one),
    coarsest first (`stages.entropy.coarsest_kept`)."""
    d = store.read_store(path, require=("trihaar_coarse",), lazy=True)
    total = d.sizes["qbasis"] * d.sizes["kbasis"] * d.sizes["hbasis"]
    return coarsest_kept(d, path, "trihaar", min(top_k, total), "figures.trihaar_top_k")


# -- where Theorem 1 holds -----------------------------------------------------------------
ORDERS = ("2-D organized", "original", "random")


def _temperature_not_run(model_name, outs, reason: str) -> None:
    """The temperature figure's outputs when it cannot be computed: the JSON's `skipped` (read by
    the summary), an empty CSV, the finding and the figure saying why."""
    store.atomic_write_text(outs["temperature_json"], json.dumps({"model": model_name, "skipped": reason},
                                                                 indent=1) + "\n")
    store.atomic_write_text(outs["temperature_csv"], "sample,layer,head,order,seed,tau,rel_residual\n")
    store.atomic_write_text(outs["temperature_finding"], f"*{model_name.replace('_', chr(92) + '_')}*: not run: "
                                                         f"{reason}.\n")
    plots.save(plots.fig_not_run(f"{model_name}: where Theorem 1 holds", reason), outs["temperature"])
    log.info("temperature: not run: %s", reason)


def _temperature(model_name, attention_stores, decomposed_stores, outs, n_taus, n_random, crop) -> None:
    """Relative residual of the paraproduct against logit temperature for the figure heads of
    the first samples: the heads' 2-D organized order, the original order and random orders."""
    taus = temperature_grid(n_taus)
    curves = {o: [] for o in ORDERS}   # per (head, sample): (T,), random (n_random, T)
    rows, heads, n_masked = [], None, 0
    start = time.perf_counter()
    for s, (apath, dpath) in enumerate(zip(attention_stores, decomposed_stores)):
        if s:
            log.info("temperature: sample %d of %d, %.1f s", s, len(attention_stores), time.perf_counter() - start)
        dec = store.read_store(dpath, require=("fig_row_order", "fig_col_order"),
                               variables=("fig_row_order", "fig_col_order"))
        # one head at a time from the store (a store of 270 heads at 1024 tokens is 2.3 GB)
        att = store.read_store(apath, require=("scores", "probs"), lazy=True)
        units = list(zip(dec["fig_layer"].values.tolist(), dec["fig_head_index"].values.tolist()))
        heads = heads or units
        for j, (layer, head) in enumerate(units):
            g = head_array(att, "scores", layer, head, crop, where=apath).astype(np.float64)
            r, c = dec["fig_row_order"].values[j], dec["fig_col_order"].values[j]
            allowed = model_mask(att, layer, head, g, crop)
            n_masked += 0 if allowed is None else int((~allowed).sum())
            org = residual_curve(g, taus, r, c, allowed)
            orig = residual_curve(g, taus, None, None, allowed)
            rnd = []
            for seed in range(n_random):
                rng = np.random.default_rng([seed, s, j])
                rnd.append(residual_curve(g, taus, rng.permutation(g.shape[0]), rng.permutation(g.shape[1]),
                                          allowed))
            log.info("temperature: sample %d, head %d.%d: %d curves of %d temperatures at %d x %d tokens, %.1f s in all",
                     s, layer, head, 2 + n_random, taus.size, g.shape[0], g.shape[1], time.perf_counter() - start)
            for name, cs in (("2-D organized", [org]), ("original", [orig]), ("random", rnd)):
                curves[name].append(np.stack(cs))
                rows += [{"sample": s, "layer": layer, "head": head, "order": name,
                          "seed": i if name == "random" else -1, "tau": float(tau), "rel_residual": v}
                         for i, cv in enumerate(cs) for tau, v in zip(taus, cv)]
    n_h, n_s = len(heads), len(attention_stores)
    # (head, sample x curves, T)
    per_head = {o: np.stack(curves[o]).reshape(n_s, n_h, -1, taus.size).transpose(1, 0, 2, 3)
                .reshape(n_h, -1, taus.size) for o in ORDERS}
    whole = {o: geometric_mean(per_head[o].reshape(-1, taus.size), axis=0) for o in ORDERS}
    i1 = int(np.flatnonzero(taus == 1.0)[0])
    cross = {b: crossover(taus, whole["2-D organized"], whole[b]) for b in ("original", "random")}
    head_cross = [{b: crossover(taus, geometric_mean(per_head["2-D organized"][i], 0),
                                geometric_mean(per_head[b][i], 0)) for b in ("original", "random")}
                  for i in range(n_h)]
    lo, hi = float(taus[0]), float(taus[-1])
    names = [f"{la}.{he}" for la, he in heads]
    clauses = {b: cross[b].describe(f"{b} order's" if b == "original" else "random orders'", lo, hi)
               for b in cross}
    at1 = {o: float(whole[o][i1]) for o in ORDERS}
    not_finite = {o: [float(x) for x in taus[~np.isfinite(per_head[o]).all(axis=(0, 1))]] for o in ORDERS}

    def num(x):
        return "not finite" if not np.isfinite(x) else f"{x:.3g}"

    mask_text = (f"Causal heads: the reference is the model's own masked softmax ({n_masked} masked entries "
                 "over these heads: the model's own mask, stored with its attention); the block averages use the pre-mask "
                 "scores and the residual is taken on the allowed entries." if n_masked else
                 "No position is masked in these heads: the reference is the full softmax.")
    nf = "; ".join(f"{o}: τ = {', '.join(f'{x:.3g}' for x in v)}" for o, v in not_finite.items() if v)
    finding = (f"*Measured on {model_name.replace('_', chr(92) + '_')}* (figure heads {', '.join(names)}, "
               f"{n_s} samples, geometric means): the 2-D organized order's relative residual is "
               f"{clauses['original']}, and {clauses['random']}. At the model's τ = 1: organized "
               f"{num(at1['2-D organized'])}, original {num(at1['original'])}, random {num(at1['random'])} "
               f"({n_random} orders per head and sample). {mask_text}"
               + (f" Not finite (the paraproduct overflows float64) at {nf}." if nf else "") + "\n")
    summary = {"model": model_name, "taus": taus.tolist(), "model_tau": 1.0, "heads": names, "samples": n_s,
               "random_orders": n_random, "masked_entries": n_masked,
               "at_model_tau": {o: (v if np.isfinite(v) else None) for o, v in at1.items()},
               "curve": {o: [(v if np.isfinite(v) else None) for v in whole[o].tolist()] for o in ORDERS},
               "not_finite": not_finite,
               "crossover": {b: {"tau": x.tau, "status": x.status, "n_changes": x.n_changes, "text": clauses[b]}
                             for b, x in cross.items()},
               "per_head": [{"head": n, **{b: {"tau": x.tau, "status": x.status} for b, x in hc.items()}}
                            for n, hc in zip(names, head_cross)]}
    store.atomic_write_text(outs["temperature_json"], json.dumps(summary, indent=1) + "\n")
    store.atomic_write_text(outs["temperature_csv"], pd.DataFrame(rows).to_csv(index=False))
    store.atomic_write_text(outs["temperature_finding"], finding)

    marks = [{b: (x.tau if x.status == "stops beating" else None) for b, x in hc.items()} for hc in head_cross]
    title = (f"{model_name}: where Theorem 1 holds\nthe organized order's residual is below the original "
             f"order's for {cross['original'].where(lo, hi)}, below random orders' for {cross['random'].where(lo, hi)}")
    plots.save(plots.fig_temperature(taus, per_head, names, title, marks=marks), outs["temperature"])
    log.info("temperature: organized vs original %s; vs random %s", clauses["original"], clauses["random"])
