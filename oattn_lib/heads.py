"""Every head's measures as a table, one row per (sample, layer, head), and a per-head summary.

The summary is across samples, with each number's spread (docs/method.md §6.4, §14).

`sample_rows` reads what the entropy stage stores (each head's Haar entropy, l1/l2 sparsity and
Frobenius norm per sample) and what the decompose stage stores beside it (the head's
key/value group, its diffusion coordinates, the paraproduct residual of the figure heads), and
ranks the heads within each sample as Table 1 does. `head_summary` gathers them per head over
the samples, the independent units of an across-prompt number: the mean with its 95% bootstrap
interval over samples, Table 1's bottom and top counts, and where the stability stage ran, each
number's range over the replicate analyses and the counts' bootstrap interval.

The workflow writes both to `results/<model>/heads.parquet` and `heads_summary.parquet`
(`heads_files`); the notebook's `analyze(...).heads` is the same table, made by the same code.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import xarray as xr

from .entropy import n_extreme

__all__ = ["SAMPLE_COLUMNS", "SUMMARY_INTERVAL", "sample_rows", "head_summary", "heads_files", "rank_within"]

SAMPLE_COLUMNS = ("model", "sample", "layer", "head", "kv_group", "head_entropy", "head_sparsity", "head_l2",
                  "head_entropy_scale_free", "entropy_rank", "in_bottom", "in_top", "diffusion_1", "diffusion_2",
                  "paraproduct_residual", "paraproduct_residual_original")
"""The columns of `sample_rows`, in order."""
SUMMARY_INTERVAL = 0.95
"""The coverage of the bootstrap intervals over samples."""


def rank_within(entropies: np.ndarray) -> np.ndarray:
    """Each head's rank by entropy within its row, 1 for the lowest (docs/method.md §6.4).

    Equal values rank by head index, as Table 1's sets do.

    Parameters
    ----------
    entropies : ndarray of shape (..., n_units)
        The heads' entropies, one row per sample (or any leading axes).

    Returns
    -------
    ndarray of int64, shape (..., n_units)
        The ranks, 1..n_units along each row.
    """
    e = np.asarray(entropies, dtype=float)
    order = np.argsort(e, axis=-1, kind="stable")
    rank = np.empty(e.shape, dtype=np.int64)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(1, e.shape[-1] + 1), e.shape), axis=-1)
    return rank


def sample_rows(entropy: xr.Dataset, decomposed: list[xr.Dataset] | None = None, *, model: str = "",
                fraction: float = 0.1) -> pd.DataFrame:
    """One row per (sample, layer, head) of an entropy store, with Table 1's ranks and sets.

    Parameters
    ----------
    entropy : xarray.Dataset
        The entropy stage's store: `head_entropy`, `head_sparsity`, `head_l2` (sample, layer,
        head); NaN marks a (layer, head) pair that was not stored.
    decomposed : list of xarray.Dataset, optional
        The decomposed store of each sample, in the entropy store's sample order: the heads'
        `unit_kv_group`, `diffusion_coords` (unit, component) and the figure heads' paraproduct
        residuals (`fig_rel_residual`, `fig_rel_residual_unorganized`). Without them those
        columns are missing values.
    model : str
        The model's name, a column.
    fraction : float
        Table 1's fraction of heads in the bottom and top sets of a sample.

    Returns
    -------
    pandas.DataFrame
        `SAMPLE_COLUMNS`: `entropy_rank` is 1 for the sample's lowest entropy, `in_bottom` and
        `in_top` its Table 1 sets (docs/method.md §6.4), `head_entropy_scale_free` the entropy
        divided by the head's Frobenius norm (§6.4), `diffusion_1`, `diffusion_2` the head's
        first diffusion coordinates in its sample (§8; their signs are arbitrary per sample),
        `paraproduct_residual` the relative residual of Theorem 1 in the head's own 2-D
        organization and `_original` in its own order (§7.3), for the figure heads only.

    Raises
    ------
    ValueError
        Naming `entropy` when a variable is missing, `decomposed` when their number or units
        do not match it.
    """
    need = ("head_entropy", "head_sparsity", "head_l2")
    missing = [v for v in need if v not in entropy.data_vars]
    if missing:
        raise ValueError(f"entropy: has no variable {missing[0]!r} (has {sorted(entropy.data_vars)})")
    e = entropy["head_entropy"].transpose("sample", "layer", "head")
    n_s, n_l, n_h = e.shape
    layers, heads = entropy["layer"].values, entropy["head"].values
    flat = {v: entropy[v].transpose("sample", "layer", "head").values.reshape(n_s, -1).astype(np.float64)
            for v in need}
    stored = np.isfinite(flat["head_entropy"])
    # the ranks and sets are among the stored heads: an unstored pair ranks last and is in no set
    ranked = np.where(stored, flat["head_entropy"], np.inf)
    k = n_extreme(int(stored[0].sum()), fraction) if n_s and stored[0].any() else 0
    rank = rank_within(ranked)
    bottom = (rank <= k) & stored
    top_rank = rank_within(-np.where(stored, flat["head_entropy"], -np.inf))
    top = (top_rank <= k) & stored
    unit_layer = np.repeat(layers, n_h)
    unit_head = np.tile(heads, n_l)
    extra = {c: np.full((n_s, n_l * n_h), np.nan) for c in ("kv_group", "diffusion_1", "diffusion_2",
                                                            "paraproduct_residual", "paraproduct_residual_original")}
    if decomposed is not None:
        if len(decomposed) != n_s:
            raise ValueError(f"decomposed: {len(decomposed)} stores for the entropy store's {n_s} samples")
        grid_units = pd.MultiIndex.from_arrays([unit_layer, unit_head])
        for s, ds in enumerate(decomposed):
            # each store lists its units in its own order: their positions in the grid, at once
            at = grid_units.get_indexer(pd.MultiIndex.from_arrays([ds["unit_layer"].values, ds["unit_head"].values]))
            if (at < 0).any():
                raise ValueError(f"decomposed: sample {s} holds heads the entropy store does not")
            if "unit_kv_group" in ds.coords:
                extra["kv_group"][s, at] = ds["unit_kv_group"].values
            if "diffusion_coords" in ds:
                dc = ds["diffusion_coords"].transpose("unit", "component").values
                for c in range(min(2, dc.shape[1])):
                    extra[f"diffusion_{c + 1}"][s, at] = dc[:, c]
            if "fig_rel_residual" in ds and ds.sizes.get("fig_head", 0):
                fig = grid_units.get_indexer(pd.MultiIndex.from_arrays([ds["fig_layer"].values,
                                                                        ds["fig_head_index"].values]))
                ok = fig >= 0
                extra["paraproduct_residual"][s, fig[ok]] = ds["fig_rel_residual"].values[ok]
                extra["paraproduct_residual_original"][s, fig[ok]] = ds["fig_rel_residual_unorganized"].values[ok]
    with np.errstate(divide="ignore", invalid="ignore"):
        scale_free = flat["head_entropy"] / flat["head_l2"]
    df = pd.DataFrame({
        "model": model, "sample": np.repeat(entropy["sample"].values, n_l * n_h),
        "layer": np.tile(unit_layer, n_s), "head": np.tile(unit_head, n_s),
        "kv_group": extra["kv_group"].ravel(), "head_entropy": flat["head_entropy"].ravel(),
        "head_sparsity": flat["head_sparsity"].ravel(), "head_l2": flat["head_l2"].ravel(),
        "head_entropy_scale_free": scale_free.ravel(), "entropy_rank": rank.ravel(),
        "in_bottom": bottom.ravel(), "in_top": top.ravel(),
        **{c: extra[c].ravel() for c in ("diffusion_1", "diffusion_2", "paraproduct_residual",
                                         "paraproduct_residual_original")}})
    df = df[stored.ravel()].reset_index(drop=True)
    df["kv_group"] = df["kv_group"].astype("Int64")  # missing where the store names no groups
    return df[list(SAMPLE_COLUMNS)]


def _bootstrap_means(values: np.ndarray, draws: int, seed: int) -> np.ndarray:
    """Means over rows of `values` (n_samples, n_units) under `draws` resamplings of the rows
    with replacement: (draws, n_units). Each draw is a row of multinomial counts, so the means
    are one matrix product, whatever the number of samples."""
    n = values.shape[0]
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(n, np.full(n, 1.0 / n), size=draws) / n
    return weights @ values


def head_summary(rows: pd.DataFrame, *, stability: xr.Dataset | None = None, bootstrap: int = 2000,
                 seed: int = 0) -> pd.DataFrame:
    """Per head, its measures over the samples with their spread (docs/method.md §6.4, §14).

    Parameters
    ----------
    rows : pandas.DataFrame
        `sample_rows` of one model.
    stability : xarray.Dataset, optional
        The model's stability store (`head_entropy` (sample, replicate, unit) of the replicate
        analyses, `bootstrap_bottom_count`, `bootstrap_top_count` (draw, unit)). With it each
        head's mean entropy and bottom count get their range over the whole-model replicates
        (every sample's replicate r; a sample without replicates keeps its value) and the
        counts their bootstrap interval over samples.
    bootstrap : int
        Resamplings of the samples for the intervals of the means.
    seed : int
        Seed of those resamplings.

    Returns
    -------
    pandas.DataFrame
        One row per (layer, head), sorted by mean entropy rank: `model`, `layer`, `head`,
        `kv_group`, `n_samples`; `entropy_mean` with `entropy_low`, `entropy_high` (the
        `SUMMARY_INTERVAL` bootstrap interval over samples; missing for one sample) and
        `entropy_sd` (across samples); `sparsity_mean`, `entropy_scale_free_mean`;
        `rank_mean` with `rank_low`, `rank_high` (its bootstrap interval); `bottom_count`,
        `top_count` (Table 1's counts: the samples in which the head is in the set);
        `paraproduct_residual_mean` (figure heads). With `stability`: `entropy_replicates_low`,
        `entropy_replicates_high`, `rank_replicates_low`, `rank_replicates_high` (the mean
        rank's range), `bottom_count_replicates_low`, `bottom_count_replicates_high`,
        `bottom_count_boot_low`, `bottom_count_boot_high`, `top_count_boot_low`,
        `top_count_boot_high`.

    Raises
    ------
    ValueError
        Naming `rows` when it holds several models or a sample lacks a head another has.
    """
    if rows["model"].nunique() > 1:
        raise ValueError(f"rows: holds the models {sorted(rows['model'].unique())}; summarize one at a time")
    units = rows[["layer", "head"]].drop_duplicates().sort_values(["layer", "head"]).reset_index(drop=True)
    samples = np.sort(rows["sample"].unique())
    wide = rows.pivot(index="sample", columns=["layer", "head"])
    idx = pd.MultiIndex.from_frame(units)

    def grid(col):
        g = wide[col].reindex(index=samples, columns=idx)
        if g.isna().to_numpy().any() and col == "head_entropy":
            s, u = np.argwhere(g.isna().to_numpy())[0]
            raise ValueError(f"rows: sample {samples[s]} has no row for layer {units.layer[u]}, head {units.head[u]}")
        return g.to_numpy(dtype=float)

    e, rank = grid("head_entropy"), grid("entropy_rank")
    n_s = e.shape[0]
    q = (1 - SUMMARY_INTERVAL) / 2
    out = units.copy()
    out.insert(0, "model", rows["model"].iloc[0] if len(rows) else "")
    kv = rows.groupby(["layer", "head"])["kv_group"].first()
    out["kv_group"] = kv.reindex(idx).to_numpy()
    out["kv_group"] = out["kv_group"].astype("Int64")
    out["n_samples"] = n_s
    out["entropy_mean"] = e.mean(0)
    for name, values in (("entropy", e), ("rank", rank)):
        if n_s > 1:
            boot = _bootstrap_means(values, bootstrap, seed)
            lo, hi = np.quantile(boot, [q, 1 - q], axis=0)
        else:
            lo = hi = np.full(e.shape[1], np.nan)
        if name == "rank":
            out["rank_mean"] = values.mean(0)
        out[f"{name}_low"], out[f"{name}_high"] = lo, hi
        if name == "entropy":
            out["entropy_sd"] = e.std(0, ddof=1) if n_s > 1 else np.nan
            out["sparsity_mean"] = grid("head_sparsity").mean(0)
            out["entropy_scale_free_mean"] = grid("head_entropy_scale_free").mean(0)
    out["bottom_count"] = grid("in_bottom").sum(0).astype(np.int64)
    out["top_count"] = grid("in_top").sum(0).astype(np.int64)
    pp = grid("paraproduct_residual")
    seen = np.isfinite(pp)
    with np.errstate(invalid="ignore"):  # a head without a residual in any sample: missing
        out["paraproduct_residual_mean"] = np.where(seen, pp, 0).sum(0) / seen.sum(0)
    if stability is not None:
        out = out.assign(**_replicate_columns(stability, e, samples, rows))
    cols = ["model", "layer", "head", "kv_group", "n_samples", "entropy_mean", "entropy_low", "entropy_high",
            "entropy_sd", "sparsity_mean", "entropy_scale_free_mean", "rank_mean", "rank_low", "rank_high",
            "bottom_count", "top_count", "paraproduct_residual_mean"]
    cols += [c for c in out.columns if c not in cols]
    return out[cols].sort_values(["rank_mean", "layer", "head"], kind="stable").reset_index(drop=True)


def _replicate_columns(stab: xr.Dataset, e: np.ndarray, samples: np.ndarray, rows: pd.DataFrame) -> dict:
    """The stability store's spreads of each head's mean entropy and bottom count (head_summary)."""
    from .stability import replicate_sets

    n_units = e.shape[1]
    if stab.sizes.get("unit") != n_units:
        raise ValueError(f"stability: holds {stab.sizes.get('unit')} heads, the rows {n_units}")
    position = {int(s): i for i, s in enumerate(samples)}
    if any(int(s) not in position for s in stab["sample"].values):
        raise ValueError(f"stability: samples {stab['sample'].values.tolist()} are not all among the rows' "
                         f"{samples.tolist()}")
    # replicate_sets indexes samples by position: the stability store's sample labels, as positions
    relabelled = stab.assign_coords(sample=[position[int(s)] for s in stab["sample"].values])
    reps, _ = replicate_sets(relabelled, e)  # (R, n_samples, units)
    means = reps.mean(1)
    k = int(rows.groupby("sample")["in_bottom"].sum().iloc[0])
    ranks = rank_within(reps)
    counts = (ranks <= k).sum(1)  # (R, units): each replicate's bottom count
    mean_ranks = ranks.mean(1)
    out = {"entropy_replicates_low": means.min(0), "entropy_replicates_high": means.max(0),
           "rank_replicates_low": mean_ranks.min(0), "rank_replicates_high": mean_ranks.max(0),
           "bottom_count_replicates_low": counts.min(0), "bottom_count_replicates_high": counts.max(0)}
    q = (1 - SUMMARY_INTERVAL) / 2
    for which in ("bottom", "top"):
        name = f"bootstrap_{which}_count"
        if name in stab:
            lo, hi = np.quantile(stab[name].transpose("draw", "unit").values, [q, 1 - q], axis=0)
            out[f"{which}_count_boot_low"], out[f"{which}_count_boot_high"] = lo, hi
    return out


def heads_files(entropy_store, decomposed_stores: list, out_rows, out_summary, *, model: str, fraction: float,
                stability_store=None, bootstrap: int = 2000, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Write a model's `sample_rows` and `head_summary` as parquet files, from its stores.

    Parameters
    ----------
    entropy_store : str or os.PathLike
        The entropy store.
    decomposed_stores : list of str or os.PathLike
        Each sample's decomposed store, in the entropy store's sample order.
    out_rows, out_summary : str or os.PathLike
        The parquet files written (atomically).
    model : str
        As in `sample_rows`.
    fraction : float
        As in `sample_rows`.
    stability_store : str or os.PathLike, optional
        The stability store, where the stability stage ran.
    bootstrap : int, default 2000
        As in `head_summary`.
    seed : int, default 0
        As in `head_summary`.

    Returns
    -------
    rows : pandas.DataFrame
        `sample_rows`, as written to `out_rows`.
    summary : pandas.DataFrame
        `head_summary`, as written to `out_summary`.

    Raises
    ------
    StoreError
        Naming a store that is missing or unreadable.
    """
    from . import store

    ent = store.read_store(entropy_store, require=("head_entropy", "head_sparsity", "head_l2"))
    dec = [store.read_store(p, variables=("diffusion_coords", "fig_rel_residual", "fig_rel_residual_unorganized"),
                            lazy=True) for p in decomposed_stores]
    stab = (store.read_store(stability_store, require=("head_entropy",)) if stability_store is not None else None)
    rows = sample_rows(ent, dec, model=model, fraction=fraction)
    summary = head_summary(rows, stability=stab, bootstrap=bootstrap, seed=seed)
    for df, path in ((rows, out_rows), (summary, out_summary)):
        store.atomic_write_parquet(df, path)
    return rows, summary
