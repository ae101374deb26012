"""Stage `tables`: Table 1 (most frequent top/bottom heads, Jaccard stability) and Table 2
(network entropy per sample)."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from .. import store
from ..entropy import extreme_heads, jaccard_stability
from ..stability import bottom_sets, mean_pair_jaccard, recurrence_interval, replicate_sets, spread_text
from ..trees import PartitionTree, architecture_agreement

log = logging.getLogger("oattn")

__all__ = ["tables", "head_tree_architecture", "masked_text"]


def head_tree_architecture(organized_stores: list) -> pd.DataFrame:
    """Does the organization find the architecture? For each level of the head tree (the root
    and the leaves left out), its number of folders and the adjusted Rand index of its folders
    against the heads' layers and, in a grouped-query model, against their key/value heads
    (a (layer, kv_group) pair each): mean and sd over samples. Read from the organized stores
    (`tree_h` and the unit coordinates)."""
    rows = []
    for i, path in enumerate(organized_stores):
        ds = store.read_store(path, require=("tree_h",))
        tree = PartitionTree(ds["tree_h"].values)
        by_layer, by_kv = architecture_agreement(tree, ds["unit_layer"].values, ds["unit_head"].values,
                                                 ds["unit_kv_group"].values if "unit_kv_group" in ds else None)
        for lev in range(1, tree.n_levels - 1):
            rows.append({"sample": i, "level": lev, "folders": int(tree.labels[lev].max()) + 1,
                         "ari_layer": by_layer[lev], "ari_kv_group": by_kv[lev]})
    cols = ["level", "folders", "ari_layer", "ari_layer_sd", "ari_kv_group", "ari_kv_group_sd", "samples"]
    if not rows:
        return pd.DataFrame(columns=cols)
    df = pd.DataFrame(rows)
    g = df.groupby("level")
    out = pd.DataFrame({"folders": g["folders"].mean(), "ari_layer": g["ari_layer"].mean(),
                        "ari_layer_sd": g["ari_layer"].std(ddof=1), "ari_kv_group": g["ari_kv_group"].mean(),
                        "ari_kv_group_sd": g["ari_kv_group"].std(ddof=1), "samples": g["sample"].count()})
    return out.reset_index()[cols]


def _architecture_note(arch: pd.DataFrame, n_samples: int) -> str:
    if arch.empty:
        return ("\n\nHead tree against the architecture: the head trees have no level between the root and "
                "the leaves.\n")
    grouped = arch["ari_kv_group"].notna().any()
    cols = ["level", "folders", "ari_layer"] + (["ari_kv_group"] if grouped else [])
    best = arch.loc[arch["ari_layer"].idxmax()]
    text = (f"\n\nHead tree against the architecture (adjusted Rand index of each level's folders, mean over "
            f"{n_samples} samples; 1 = the folders are exactly the layers"
            + (" / the key-value heads" if grouped else "") + ", 0 = chance): the level closest to the layers is "
            f"level {int(best['level'])} ({best['folders']:.3g} folders, ARI {best['ari_layer']:.2f}).")
    if grouped:
        kv = arch.loc[arch["ari_kv_group"].idxmax()]
        text += (f" Closest to the key/value heads: level {int(kv['level'])} ({kv['folders']:.3g} folders, "
                 f"ARI {kv['ari_kv_group']:.2f}).")
    return text + "\n\n" + arch[cols].to_markdown(index=False, floatfmt=".3g") + "\n"


def _replicated(stability_store, e: np.ndarray, fraction: float):
    """From a stability store (docs/method.md §14): the whole-model replicates of the head entropies
    (R, samples, units), the store, and each replicate's bottom / top counts and recurrence."""
    stab = store.read_store(stability_store, require=("head_entropy", "network_entropy", "bootstrap_recurrence"))
    sets, _ = replicate_sets(stab, e)
    bottom, top = bottom_sets(sets, fraction, "bottom"), bottom_sets(sets, fraction, "top")
    return stab, {"bottom": bottom.sum(1), "top": top.sum(1), "recurrence": mean_pair_jaccard(bottom)}


def _per_sample_range(stab, name: str, n_s: int) -> list[str]:
    """Each sample's range of `name` over its replicates ("" for a sample without replicates)."""
    out = [""] * n_s
    for s, v in zip(stab["sample"].values, stab[name].transpose("sample", "replicate").values):
        out[int(s)] = spread_text(v)
    return out


def _stability_note(stab, rep: dict, n_s: int) -> str:
    lo, hi = recurrence_interval(stab)
    n_rep = stab.sizes["replicate"] - 1
    return (f"\nOver {n_rep} replicate analyses of samples {stab['sample'].values.tolist()} (docs/method.md §14; "
            f"tables/stability.md): bottom-set Jaccard stability {spread_text(rep['recurrence'], '.3f')}; "
            f"count_replicates is each count's range over them. Bootstrap over the {n_s} samples "
            f"({stab.sizes['draw']} draws): Jaccard stability 95% interval {lo:.3f}–{hi:.3f}; count_bootstrap is each "
            "count's 95% interval.\n")


def masked_text(attrs: dict) -> str:
    """The tables' sentence on the entries the model masks (docs/method.md §9.5), from an entropy
    store's attributes; "" where the analysis set none (nothing masked, or probabilities)."""
    n = int(attrs.get("masked_filled", 0))
    if attrs.get("masked") == "row_mean" and n:
        return (f"\nMasked entries: the {n} scores the model masks (its causal future; all samples) were set "
                "per row to the mean of the row's allowed scores before the organization and the Haar expansions "
                "(extract.masked: row_mean).\n")
    if attrs.get("masked") == "keep":
        return ("\nMasked entries: scores the model masks, if any, were analysed as computed before the mask "
                "(extract.masked: keep, the paper's convention).\n")
    return ""


def tables(entropy_store, out_table1_csv, out_table1_md, out_table2_csv, out_table2_md,
           fraction: float = 0.1, model_name: str = "", organized_stores: list | None = None,
           out_head_tree_csv=None, stability_store=None) -> None:
    """Table 1 (most frequent top/bottom heads, Jaccard stability; with `organized_stores`, how the
    head tree's folders relate to layers and key/value heads, also written to
    `out_head_tree_csv`) and Table 2 (network entropy). With a `stability_store`, each count,
    recurrence and network number also gets its range over the replicates and the recurrence its
    bootstrap interval over samples (docs/method.md §14)."""
    ds = store.read_store(entropy_store, require=("head_entropy", "network_entropy", "network_l2",
                                                  "network_sparsity_natural"))
    e = ds["head_entropy"].values  # (sample, layer, head)
    n_s, n_layer, n_head = e.shape
    layers, heads = ds["layer"].values, ds["head"].values
    flat = e.reshape(n_s, -1)
    ext = extreme_heads(flat, fraction)
    jac = jaccard_stability(flat, fraction, "bottom")
    off = jac[~np.eye(n_s, dtype=bool)]
    mean_e = flat.mean(0)
    stab, rep = _replicated(stability_store, flat, fraction) if stability_store is not None else (None, None)
    rows = []
    for which, counts in (("top", ext["top"]), ("bottom", ext["bottom"])):
        # most frequent first; ties: more extreme mean entropy first
        key = -mean_e if which == "top" else mean_e
        order = np.lexsort((key, -counts))[:3]
        for rank, u in enumerate(order, 1):
            # the model's layer and head indices (a store may hold only some: extract.layers/heads)
            rows.append({"model": model_name, "set": which, "rank": rank, "layer": int(layers[u // n_head]),
                         "head": int(heads[u % n_head]), "count": f"{int(counts[u])}/{n_s}",
                         "mean_entropy": float(mean_e[u])})
            if rep is not None:  # the count's range over the replicates, and over the bootstrap's draws
                c = rep[which][:, u]
                b = np.percentile(stab[f"bootstrap_{which}_count"].values[:, u], [2.5, 97.5])
                rows[-1] |= {"count_replicates": f"{spread_text(c, 'd')}/{n_s}",
                             "count_bootstrap": f"{spread_text(b, '.0f')}/{n_s}"}
    t1 = pd.DataFrame(rows)
    # each count beside its ranges, the mean entropy last
    t1 = t1[[c for c in t1.columns if c != "mean_entropy"] + ["mean_entropy"]]
    stability = (float(off.mean()) if off.size else float("nan"))
    t2 = pd.DataFrame({"model": model_name, "sample": ds["sample"].values,
                       "network_entropy": ds["network_entropy"].values,
                       "network_sparsity": ds["network_sparsity"].values,
                       "network_sparsity_random_trees": ds["network_sparsity_random"].values,
                       "network_sparsity_natural_trees": ds["network_sparsity_natural"].values,
                       "network_entropy_scale_free": ds["network_entropy"].values / ds["network_l2"].values,
                       "network_l1": ds["network_l1"].values,
                       "network_l1_random_trees": ds["network_l1_random"].values,
                       "network_l1_natural_trees": ds["network_l1_natural"].values})
    note1 = (f"\n\nSet size k = {ext['k']} of {n_layer * n_head} heads per sample. Bottom-{fraction:.0%} "
             f"Jaccard stability across {n_s} samples: mean {stability:.3f} "
             f"(min {off.min() if off.size else float('nan'):.3f}).\n")
    if rep is not None:
        note1 += _stability_note(stab, rep, n_s)
        t2["network_entropy_replicates"] = _per_sample_range(stab, "network_entropy", n_s)
        t2["network_sparsity_replicates"] = _per_sample_range(stab, "network_sparsity", n_s)
    if organized_stores:
        arch = head_tree_architecture(organized_stores)
        note1 += _architecture_note(arch, len(organized_stores))
        if out_head_tree_csv is not None:
            store.atomic_write_text(out_head_tree_csv, arch.assign(model=model_name).to_csv(index=False))
    masked = masked_text(ds.attrs)
    note1 += masked
    for df, csv, md, note in (
            (t1, out_table1_csv, out_table1_md, note1),
            (t2, out_table2_csv, out_table2_md,
             "\n\nnetwork_entropy: sum of the |coefficients| of the coarsest tri-Haar functions (the "
             "paper's measure), in the units of the analysed quantity (logits or probabilities); "
             "network_entropy_scale_free: the same divided by the l2 norm of every coefficient (the tensor's "
             "Frobenius norm), unchanged when the tensor is scaled, so that models analysing different "
             "quantities can be compared; network_sparsity: l1/l2 of all tri-Haar coefficients (lower is "
             "sparser), beside the same under two baselines: balanced trees over a random order of the tokens and "
             "heads (random_trees) and over their natural order (natural_trees, which keeps locality).\n"
             + masked)):
        store.atomic_write_text(csv, df.to_csv(index=False))
        store.atomic_write_text(md, df.to_markdown(index=False, floatfmt=".4g") + note)
