"""Stage `figures`: Figures 1-6 of the paper for one model, from the stored artifacts."""
from __future__ import annotations

import logging

import numpy as np

from .. import plots, store
from ..entropy import coarsest
from ..haar import haar_basis
from .common import load_organization

log = logging.getLogger("oattn")

__all__ = ["figures"]


def figures(model_name: str, attention_stores: list, organized_stores: list, decomposed_stores: list,
            entropy_store, outs: dict, entropy_samples: int = 3, trihaar_samples: int = 5,
            trihaar_top_k: int = 100) -> None:
    """Figures 1-6 of the paper for one model, from the stored artifacts."""
    dec0 = store.read_store(decomposed_stores[0])
    org0, _ = load_organization(organized_stores[0])
    names = [f"{int(l)}.{int(h)}" for l, h in zip(dec0["fig_layer"].values, dec0["fig_head_index"].values)]
    units = [f"{int(l)}.{int(h)}" for l, h in zip(dec0["unit_layer"].values, dec0["unit_head"].values)]
    i = 0
    plots.save(plots.fig1_organized_head(dec0["fig_original"].values[i], dec0["fig_organized3d"].values[i],
                                         f"{model_name}, head {names[i]}, sample 0"), outs["fig1"])
    plots.save(plots.fig2_paraproduct(dec0["fig_exact"].values[i], dec0["fig_approx"].values[i],
                                      dec0["fig_residual"].values[i], float(dec0["fig_rel_residual"].values[i]),
                                      float(dec0["fig_rel_residual_unorganized"].values[i]),
                                      f"{model_name}, head {names[i]}, sample 0"), outs["fig2"])
    plots.save(plots.fig3_head_geometry(dec0["diffusion_coords"].values, org0.affinity_h,
                                        org0.tree_h.labels, units, org0.tree_h.order), outs["fig3"])
    sup = np.outer(dec0["support_q"].values, dec0["support_k"].values).ravel()
    lev = np.add.outer(dec0["level_q"].values, dec0["level_k"].values).ravel()
    by_support = np.lexsort((np.arange(sup.size), lev, -sup))
    picks = list(range(min(2, len(names))))
    coeffs, sups = [], []
    for j in picks:
        u = int(dec0["fig_layer"].values[j]) * int(dec0["unit_head"].values.max() + 1) + int(dec0["fig_head_index"].values[j])
        coeffs.append(dec0["bihaar"].values[:, :, u].ravel()[by_support])
        sups.append(sup[by_support])
    bh = haar_basis(org0.tree_h)[0]
    plots.save(plots.fig4_bihaar(coeffs, sups, [names[j] for j in picks],
                                 bh[org0.tree_h.order][:, :min(6, bh.shape[1])]), outs["fig4"])
    ent = store.read_store(entropy_store)
    k = min(entropy_samples, ent.sizes["sample"])
    plots.save(plots.fig5_entropy_heatmaps(ent["head_entropy"].values[:k], [f"sample {s}" for s in range(k)]),
               outs["fig5"])
    vals = []
    k6 = min(trihaar_samples, len(decomposed_stores))
    for path in decomposed_stores[:k6]:
        d = store.read_store(path, require=("trihaar",))
        idx = coarsest([d["support_q"].values, d["support_k"].values, d["support_h"].values],
                       [d["level_q"].values, d["level_k"].values, d["level_h"].values],
                       min(trihaar_top_k, d["trihaar"].size))
        vals.append(d["trihaar"].values.ravel()[idx])
    plots.save(plots.fig6_top_trihaar(np.stack(vals), [f"sample {s}" for s in range(k6)]), outs["fig6"])
