"""Stage `entropy`: per-head and per-network l1 entropies and sparsity of every sample (docs/method.md §6).

It only reads and sums stored coefficients, in numpy: the job starts without torch's import."""
from __future__ import annotations

import logging

import numpy as np
import xarray as xr

from .. import store
from ..entropy import clamped_top_k, coarsest, ratio_of_sums

log = logging.getLogger("oattn")

__all__ = ["entropy", "coarsest_kept", "EXPANSIONS"]


# the expansions a decomposed store holds: their axes and their names in messages
EXPANSIONS = {"bihaar": ("qk", "bi-Haar"), "trihaar": ("qkh", "tri-Haar")}


def coarsest_kept(ds, path, expansion: str, top_k: int, key: str) -> np.ndarray:
    """The coefficients of the `top_k` coarsest basis functions of a decomposed store's
    `expansion` ("bihaar": (top_k, unit); "trihaar": (top_k,)), coarsest first (docs/method.md
    §6.6): a prefix of the kept ones, or picked from every coefficient where the store keeps
    them (decompose.keep_coefficients) and top_k exceeds the prefix; else an error naming `key`.
    `ds`: the store, opened lazily; top_k: at most the number of basis functions."""
    axes, label = EXPANSIONS[expansion]
    name = f"{expansion}_coarse"
    axis = ds[name].dims[0]
    if top_k <= ds.sizes[axis]:
        return store.load_variable(ds.isel({axis: slice(0, top_k)}), name, path, finite=True)
    if expansion not in ds.variables:
        raise ValueError(f"{store.store_path(path)}: keeps the {ds.sizes[axis]} coarsest {label} coefficients, "
                         f"fewer than {key} = {top_k}; raise decompose.coarse_coefficients or set "
                         "decompose.keep_coefficients: true")
    c = store.load_variable(ds, expansion, path, finite=True)
    idx = coarsest([ds[f"support_{a}"].values for a in axes], [ds[f"level_{a}"].values for a in axes], top_k)
    return c.reshape(-1, *c.shape[len(axes):])[idx]


# what the entropy stage reads of a decomposed store
NEEDED = ("bihaar_coarse", "trihaar_coarse", "bihaar_level_l1", "bihaar_level_l2sq", "trihaar_level_l1",
          "trihaar_level_l2sq")
BASELINES = ("network_l1", "network_l1_random", "network_sparsity_random", "network_l1_natural",
             "network_sparsity_natural")


def entropy(decomposed_stores: list, out, head_top_k: int, network_top_k: int,
            config_slice: dict | None = None, code: str | None = None) -> None:
    """Per-head and per-network l1 entropies and sparsity for every sample (docs/method.md §6),
    from the coarsest coefficients and the level sums the decompose stage keeps (§6.6).

    Parameters
    ----------
    decomposed_stores : list of paths
        One decomposed store per sample, in the samples' order.
    out : path
        The entropy store written.
    head_top_k, network_top_k : int
        The coarsest bi-Haar (per head) and tri-Haar (per network) coefficients summed (§6.2);
        all of a sample that has fewer.
    config_slice, code : optional
        Provenance attributes of the store (§12.3).

    Notes
    -----
    The store holds, over (sample, layer, head): `head_entropy`, `head_sparsity` and `head_l2`,
    each head's Frobenius norm (the l2 norm of its bi-Haar coefficients, the basis being
    orthonormal: the scale a head's entropy grows with, §6.4), NaN where a (layer, head) is not
    stored; over (sample): the network's entropy, sparsity, l2 norm and baselines (§6.3) and each
    sample's top_k. Its attributes record the rule for masked entries (§9.5)."""
    rows = {k: [] for k in ("head_entropy", "head_sparsity", "head_l2", "network_entropy", "network_sparsity",
                            "network_l1", "network_l1_random", "network_sparsity_random", "network_l1_natural",
                            "network_sparsity_natural", "network_l2", "head_top_k", "network_top_k")}
    first, filled = None, 0
    for path in decomposed_stores:
        # lazily: only the kept prefix is read (every coefficient of a store that keeps them
        # is 1.1 GB each of bi- and tri-Haar at 270 heads x 1024 tokens)
        ds = store.read_store(path, require=NEEDED + BASELINES, lazy=True)
        if first is None:
            first = {"attrs": dict(ds.attrs), "unit_layer": ds["unit_layer"].values,
                     "unit_head": ds["unit_head"].values}
        filled += int(ds.attrs.get("masked_filled", 0))
        sup2 = [ds["support_q"].values, ds["support_k"].values]
        sup3 = sup2 + [ds["support_h"].values]
        # a sample of its own length (the user's texts, docs/method.md §9.4.1) may have fewer coefficients than top_k:
        # then all of them, recorded per sample and said in the log
        k2 = clamped_top_k(head_top_k, [len(s) for s in sup2], "entropy.head_top_k", str(path))
        k3 = clamped_top_k(network_top_k, [len(s) for s in sup3], "entropy.network_top_k", str(path))
        rows["head_top_k"].append(k2)
        rows["network_top_k"].append(k3)
        rows["head_entropy"].append(np.abs(coarsest_kept(ds, path, "bihaar", k2, "entropy.head_top_k"))
                                    .sum(0, dtype=np.float64))
        rows["network_entropy"].append(float(np.abs(coarsest_kept(ds, path, "trihaar", k3, "entropy.network_top_k"))
                                             .sum(dtype=np.float64)))
        # l1/l2 of every coefficient, exactly, from the sums per level
        lv = {v: store.load_variable(ds, v, path, finite=True) for v in NEEDED[2:]}
        rows["head_sparsity"].append(ratio_of_sums(lv["bihaar_level_l1"], lv["bihaar_level_l2sq"], (0, 1)))
        rows["head_l2"].append(np.sqrt(lv["bihaar_level_l2sq"].sum((0, 1), dtype=np.float64)))
        rows["network_sparsity"].append(float(ratio_of_sums(lv["trihaar_level_l1"], lv["trihaar_level_l2sq"],
                                                            (0, 1, 2))))
        # the l2 norm of every tri-Haar coefficient is the tensor's Frobenius norm (an orthonormal
        # basis): what a scale-free network entropy divides by (docs/method.md §6.4)
        rows["network_l2"].append(float(np.sqrt(lv["trihaar_level_l2sq"].sum(dtype=np.float64))))
        for k in BASELINES:
            rows[k].append(float(store.load_variable(ds, k, path, finite=True)))
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
         "head_l2": (("sample", "layer", "head"), np.stack([grid(v) for v in rows["head_l2"]])),
         **{k: ("sample", np.asarray(rows[k])) for k in rows if k.startswith("network")},
         "head_top_k": ("sample", np.asarray(rows["head_top_k"], dtype=np.int64))},
        coords={"sample": np.arange(n_s), "layer": layer_ids, "head": head_ids},
        attrs={"model": first["attrs"].get("model", ""),
               # the rule for the scores' masked entries (docs/method.md §9.5), and how many it set in all
               **({"masked": first["attrs"]["masked"], "masked_filled": filled} if "masked" in first["attrs"] else {}),
               **store.provenance_attrs(config_slice or {}, first["attrs"].get("checkpoint_sha256"), code=code,
                                        head_top_k=head_top_k, network_top_k=network_top_k)})
    store.write_store(out_ds, out)
    log.info("entropy: %d samples, network entropy %s", n_s, np.round(rows["network_entropy"], 3).tolist())
