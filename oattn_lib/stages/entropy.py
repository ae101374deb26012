"""Stage `entropy`: per-head and per-network l1 entropies and sparsity of every sample (docs/method.md §6).

It only reads and sums stored coefficients, in numpy: the job starts without torch's import."""
from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from .. import store
from ..entropy import coarse_l1, l1_over_l2

log = logging.getLogger("oattn")

__all__ = ["entropy", "clamped_top_k"]


def clamped_top_k(top_k: int, supports: list, path, key: str, what: str) -> int:
    """`top_k`, or every coefficient of a sample that has fewer (with a warning naming `key`)."""
    total = int(np.prod([len(s) for s in supports]))
    if top_k <= total:
        return top_k
    log.warning("%s: %d %s coefficients, fewer than %s = %d: its entropy sums all of them (a short sample; "
                "the entropy store records the k of each sample)", path, total, what, key, top_k)
    return total


def entropy(decomposed_stores: list, out, head_top_k: int, network_top_k: int,
            config_slice: dict | None = None, code: str | None = None) -> None:
    """Per-head and per-network l1 entropies and sparsity for every sample (docs/method.md §6)."""
    rows = {k: [] for k in ("head_entropy", "head_sparsity", "network_entropy", "network_sparsity",
                            "network_l1", "network_l1_random", "network_sparsity_random", "head_top_k",
                            "network_top_k")}
    first = None
    for path in decomposed_stores:
        # lazily, one coefficient tensor at a time: at 270 heads x 1024 tokens the bi- and
        # tri-Haar coefficients are 1.1 GB each
        ds = store.read_store(path, require=("bihaar", "trihaar"), lazy=True)
        if first is None:
            first = {"attrs": dict(ds.attrs), "unit_layer": ds["unit_layer"].values,
                     "unit_head": ds["unit_head"].values}
        sup2 = [ds["support_q"].values, ds["support_k"].values]
        lev2 = [ds["level_q"].values, ds["level_k"].values]
        c2 = store.load_variable(ds, "bihaar", path, finite=True)
        # a sample of its own length (the user's texts, docs/method.md §9.4.1) may have fewer coefficients than top_k:
        # then all of them, recorded per sample and said in the log
        k2 = clamped_top_k(head_top_k, sup2, path, "entropy.head_top_k", "bi-Haar")
        k3 = clamped_top_k(network_top_k, sup2 + [ds["support_h"].values], path, "entropy.network_top_k", "tri-Haar")
        rows["head_top_k"].append(k2)
        rows["network_top_k"].append(k3)
        try:
            rows["head_entropy"].append(coarse_l1(c2, sup2, lev2, k2))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc} (entropy.head_top_k)") from exc
        rows["head_sparsity"].append(l1_over_l2(c2, (0, 1)))
        del c2
        c3 = store.load_variable(ds, "trihaar", path, finite=True)
        try:
            rows["network_entropy"].append(float(coarse_l1(c3, sup2 + [ds["support_h"].values],
                                                           lev2 + [ds["level_h"].values], k3)))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc} (entropy.network_top_k)") from exc
        rows["network_sparsity"].append(float(l1_over_l2(c3.reshape(-1), 0)))
        del c3
        for k in ("network_l1", "network_l1_random", "network_sparsity_random"):
            rows[k].append(float(ds[k].values))
    n_s = len(decomposed_stores)
    # the (layer, head) grid of the stored heads: the model's indices as coordinates (a
    # subset of layers or heads, extract.layers / extract.heads, gives a smaller grid)
    layers, heads = first["unit_layer"], first["unit_head"]
    layer_ids, head_ids = np.unique(layers), np.unique(heads)
    rows_at, cols_at = np.searchsorted(layer_ids, layers), np.searchsorted(head_ids, heads)

    def grid(v):
        g = np.full((layer_ids.size, head_ids.size), np.nan)
        g[rows_at, cols_at] = v
        return g

    out_ds = xr.Dataset(
        {"head_entropy": (("sample", "layer", "head"), np.stack([grid(v) for v in rows["head_entropy"]])),
         "head_sparsity": (("sample", "layer", "head"), np.stack([grid(v) for v in rows["head_sparsity"]])),
         **{k: ("sample", np.asarray(rows[k])) for k in rows if k.startswith("network")},
         "head_top_k": ("sample", np.asarray(rows["head_top_k"], dtype=np.int64))},
        coords={"sample": np.arange(n_s), "layer": layer_ids, "head": head_ids},
        attrs={"model": first["attrs"].get("model", ""),
               **store.provenance_attrs(config_slice or {}, first["attrs"].get("checkpoint_sha256"), code=code,
                                        head_top_k=head_top_k, network_top_k=network_top_k)})
    store.write_store(out_ds, out)
    log.info("entropy: %d samples, network entropy %s", n_s, np.round(rows["network_entropy"], 3).tolist())
