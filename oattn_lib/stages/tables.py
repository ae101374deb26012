"""Stage `tables`: Table 1 (most frequent top/bottom heads, Jaccard stability) and Table 2
(network entropy per sample)."""
from __future__ import annotations

import logging

import numpy as np
import pandas as pd

from .. import store
from ..entropy import extreme_heads, jaccard_stability
from ..trees import PartitionTree, level_agreement

log = logging.getLogger("oattn")

__all__ = ["tables", "head_tree_architecture"]


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
        layer = ds["unit_layer"].values
        by_layer = level_agreement(tree, layer)
        grouped = "unit_kv_group" in ds and np.unique(ds["unit_kv_group"].values).size < np.unique(
            ds["unit_head"].values).size
        by_kv = (level_agreement(tree, layer * (int(ds["unit_kv_group"].values.max()) + 1)
                                 + ds["unit_kv_group"].values) if grouped else np.full(tree.n_levels, np.nan))
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


def tables(entropy_store, out_table1_csv, out_table1_md, out_table2_csv, out_table2_md,
           fraction: float = 0.1, model_name: str = "", organized_stores: list | None = None,
           out_head_tree_csv=None) -> None:
    """Table 1 (most frequent top/bottom heads, Jaccard stability; with `organized_stores`, how the
    head tree's folders relate to layers and key/value heads, also written to
    `out_head_tree_csv`) and Table 2 (network entropy)."""
    ds = store.read_store(entropy_store, require=("head_entropy", "network_entropy"))
    e = ds["head_entropy"].values  # (sample, layer, head)
    n_s, n_layer, n_head = e.shape
    flat = e.reshape(n_s, -1)
    ext = extreme_heads(flat, fraction)
    jac = jaccard_stability(flat, fraction, "bottom")
    off = jac[~np.eye(n_s, dtype=bool)]
    mean_e = flat.mean(0)
    rows = []
    for which, counts in (("top", ext["top"]), ("bottom", ext["bottom"])):
        # most frequent first; ties: more extreme mean entropy first
        key = -mean_e if which == "top" else mean_e
        order = np.lexsort((key, -counts))[:3]
        for rank, u in enumerate(order, 1):
            rows.append({"model": model_name, "set": which, "rank": rank, "layer": int(u // n_head),
                         "head": int(u % n_head), "count": f"{int(counts[u])}/{n_s}",
                         "mean_entropy": float(mean_e[u])})
    t1 = pd.DataFrame(rows)
    stability = (float(off.mean()) if off.size else float("nan"))
    t2 = pd.DataFrame({"model": model_name, "sample": ds["sample"].values,
                       "network_entropy": ds["network_entropy"].values,
                       "network_sparsity": ds["network_sparsity"].values,
                       "network_sparsity_random_trees": ds["network_sparsity_random"].values,
                       "network_l1": ds["network_l1"].values,
                       "network_l1_random_trees": ds["network_l1_random"].values})
    note1 = (f"\n\nSet size k = {ext['k']} of {n_layer * n_head} heads per sample. Bottom-{fraction:.0%} "
             f"Jaccard stability across {n_s} samples: mean {stability:.3f} "
             f"(min {off.min() if off.size else float('nan'):.3f}).\n")
    if organized_stores:
        arch = head_tree_architecture(organized_stores)
        note1 += _architecture_note(arch, len(organized_stores))
        if out_head_tree_csv is not None:
            store.atomic_write_text(out_head_tree_csv, arch.assign(model=model_name).to_csv(index=False))
    for df, csv, md, note in (
            (t1, out_table1_csv, out_table1_md, note1),
            (t2, out_table2_csv, out_table2_md,
             "\n\nnetwork_entropy: sum of the |coefficients| of the coarsest tri-Haar functions (the "
             "paper's measure); network_sparsity: l1/l2 of all tri-Haar coefficients (lower is sparser), "
             "beside the same under random trees.\n")):
        store.atomic_write_text(csv, df.to_csv(index=False))
        store.atomic_write_text(md, df.to_markdown(index=False, floatfmt=".4g") + note)
