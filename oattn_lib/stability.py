"""How far each number can be trusted: replicate analyses under perturbations that carry no
information (docs/method.md §14).

A replicate analyses the same attention again after a change that no reader of the attention
could call a change of the data:

- `ulp`: a fraction of the nonzero entries moved by one float32 step (up or down at random);
  exact zeros (masked entries) stay zero, since a mask is structure, not a measurement;
- `float16`: every entry rounded to float16 and back (storage in half precision; one replicate,
  it has no randomness);
- `relabel`: the queries, keys and heads renamed by random permutations before the
  questionnaire, and its trees renamed back (the organization should not depend on the order
  in which the items are listed: the tree builder has no seed, so this is where its choices
  between equals show);
- `sibling`: the reference trees, with the items renamed before the Haar expansion: only the
  conventions that rank equal things by item index (equal-size siblings, docs/method.md §3.2, and
  equal supports among the coarsest functions, §6.1) can move the numbers.

Each replicate gives every measure the reference analysis gives (per-head coarse entropy and
l1/l2 sparsity, network entropy and sparsity, the organized/random sparsity ratio, the head
tree's agreement with layers and key/value groups, the figure heads' paraproduct residual),
and whether each tree is the reference tree. `replicate_sets` turns them into whole-model
replicates (every sample's replicate r), from which the across-sample statistics (bottom-set
recurrence, Table 1's counts) and the claims' verdicts are recomputed per replicate;
`bootstrap_samples` resamples the samples for the across-sample statistics' sampling spread.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import xarray as xr

__all__ = ["PERTURBATIONS", "REFERENCE", "FIG_MEASURES", "replicate_plan", "distinct_pair_jaccard", "perturb", "same_folders", "unit_permutation_back",
           "head_tree_agreement", "relative_spread", "replicate_sets", "bottom_sets", "mean_pair_jaccard",
           "bootstrap_samples", "recurrence_interval", "stability_summary", "spread_text"]

PERTURBATIONS = ("ulp", "float16", "relabel", "sibling")
"""The perturbations of a replicate, in the order a store lists them (module docstring)."""
REFERENCE = "none"
"""The perturbation name of replicate 0 of every store: the unperturbed analysis."""
_DETERMINISTIC = ("float16",)


def replicate_plan(perturbations, replicates: int) -> list[tuple[str, int]]:
    """(perturbation, index) of every replicate of a sample: the reference first, then
    `replicates` of each random perturbation and one of each deterministic one, in
    `PERTURBATIONS` order."""
    bad = sorted(set(perturbations) - set(PERTURBATIONS))
    if bad:
        raise ValueError(f"stability.perturbations: {bad} unknown; allowed: {list(PERTURBATIONS)}")
    if int(replicates) < 1:
        raise ValueError(f"stability.replicates: must be >= 1, got {replicates}")
    plan = [(REFERENCE, 0)]
    for p in PERTURBATIONS:
        if p in perturbations:
            plan += [(p, i) for i in range(1 if p in _DETERMINISTIC else int(replicates))]
    return plan


def replicate_rng(seed: int, sample: int, perturbation: str, index: int) -> np.random.Generator:
    """The random state of one replicate: a function of the config's seed, the sample, the
    perturbation and the replicate's index only (a rerun, or another sample count, gives the
    same replicate)."""
    return np.random.default_rng([int(seed), int(sample), PERTURBATIONS.index(perturbation), int(index)])


@dataclass(frozen=True)
class Perturbed:
    """A perturbed network tensor and the renaming of its items.

    `array` (query, key, unit) float32; `perms`: for relabel and sibling, the permutation of each
    axis (array = x[pq][:, pk][:, :, pu]), else None. `organize`: whether the questionnaire is
    rerun on `array` (False for sibling: the reference trees, renamed)."""

    array: np.ndarray
    perms: tuple[np.ndarray, np.ndarray, np.ndarray] | None
    organize: bool


def perturb(x: np.ndarray, perturbation: str, rng: np.random.Generator, ulp_fraction: float = 0.01) -> Perturbed:
    """One replicate's input from the reference tensor x (query, key, unit), float32."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if perturbation == "ulp":
        if not 0 < ulp_fraction <= 1:
            raise ValueError(f"stability.ulp_fraction: must be in (0, 1], got {ulp_fraction}")
        out = x.copy()
        flat = out.reshape(-1)
        nonzero = np.flatnonzero(flat)
        k = int(round(ulp_fraction * nonzero.size))
        pick = rng.choice(nonzero, size=k, replace=False) if k else nonzero[:0]
        up = rng.random(k) < 0.5
        flat[pick] = np.nextafter(flat[pick], np.where(up, np.float32(np.inf), np.float32(-np.inf)))
        return Perturbed(out, None, True)
    if perturbation == "float16":
        return Perturbed(x.astype(np.float16).astype(np.float32), None, True)
    if perturbation in ("relabel", "sibling"):
        perms = tuple(rng.permutation(n) for n in x.shape)
        pq, pk, pu = perms
        # one gather into one new array (x[pq][:, pk][:, :, pu] held two copies at once)
        return Perturbed(x[np.ix_(pq, pk, pu)], perms, perturbation == "relabel")
    raise ValueError(f"perturbation: {perturbation!r} unknown; allowed: {list(PERTURBATIONS)}")


def rename_tree(tree, perm: np.ndarray):
    """`tree` on items renamed by `perm` (new item i is old item perm[i]); its inverse is
    rename_tree(t, argsort(perm))."""
    from .trees import PartitionTree

    return PartitionTree(tree.labels[:, perm])


def same_folders(a, b) -> bool:
    """Whether two trees have the same folders at every level (sibling order aside: the
    questionnaire's sibling order follows an eigenvector's sign)."""
    if a.labels.shape != b.labels.shape:
        return False
    return all(np.array_equal(a.smallest_items[lev][a.labels[lev]], b.smallest_items[lev][b.labels[lev]])
               for lev in range(a.n_levels))


def unit_permutation_back(values: np.ndarray, perm: np.ndarray | None) -> np.ndarray:
    """Per-unit values of a renamed analysis back in the reference unit order."""
    if perm is None:
        return values
    out = np.empty_like(values)
    out[perm] = values
    return out


def head_tree_agreement(tree, unit_layer: np.ndarray, unit_head: np.ndarray,
                        unit_kv_group: np.ndarray | None) -> tuple[float, float]:
    """The best adjusted Rand index, over the head tree's inner levels, of its folders against
    the units' layers and (a grouped-query model) their key/value heads
    (`trees.architecture_agreement`); NaN without inner levels (or, for the second, without
    groups). The tables stage lists every level (docs/method.md §2.5)."""
    from .trees import architecture_agreement

    if tree.n_levels <= 2:
        return float("nan"), float("nan")
    by_layer, by_kv = (v[1:tree.n_levels - 1] for v in architecture_agreement(tree, unit_layer, unit_head,
                                                                                  unit_kv_group))
    return float(np.max(by_layer)), float(np.max(by_kv))


# -- summaries ---------------------------------------------------------------------------------
def relative_spread(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """|values - reference| / |reference| (0 where both are 0, inf where only the reference is)."""
    v, r = np.asarray(values, dtype=float), np.asarray(reference, dtype=float)
    d = np.abs(v - r)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(d == 0, 0.0, d / np.abs(r))


def replicate_sets(stab: xr.Dataset, reference: np.ndarray, name: str = "head_entropy") -> tuple[np.ndarray, list]:
    """Whole-model replicates of a per-unit measure: (R, n_samples, units) where replicate r has,
    for every sample with replicates, that sample's replicate r, and for every other sample the
    reference `reference` (n_samples, units; the entropy store's). Returns the array and the
    replicate labels "perturbation #index" (the reference, replicate 0, first)."""
    ref = np.asarray(reference, dtype=float)
    vals = stab[name].transpose("sample", "replicate", "unit").values  # (s, R, u)
    rows = stab["sample"].values
    out = np.broadcast_to(ref, (vals.shape[1],) + ref.shape).copy()
    out[:, rows] = vals.transpose(1, 0, 2)
    labels = [f"{p} #{i}" for p, i in zip(stab["perturbation"].values, stab["replicate_index"].values)]
    return out, labels


def bottom_sets(entropies: np.ndarray, fraction: float, which: str = "bottom") -> np.ndarray:
    """Membership (..., units) bool of each row's bottom (or top) `fraction` of units, equal values
    ranked by unit index (as Table 1, docs/method.md §6.4)."""
    from .entropy import n_extreme

    e = np.asarray(entropies, dtype=float)
    k = n_extreme(e.shape[-1], fraction)
    order = np.argsort(e if which == "bottom" else -e, axis=-1, kind="stable")[..., :k]
    member = np.zeros(e.shape, dtype=bool)
    np.put_along_axis(member, order, True, axis=-1)
    return member


def mean_pair_jaccard(member: np.ndarray, pairs: np.ndarray | None = None) -> np.ndarray:
    """Mean Jaccard index over pairs of rows of `member` (..., rows, units) bool: every pair i < j,
    or the given (P, 2) index pairs. Returns (...) float."""
    m = member.astype(np.float64)
    inter = m @ np.swapaxes(m, -1, -2)
    size = m.sum(-1)
    union = size[..., :, None] + size[..., None, :] - inter
    jac = np.where(union > 0, inter / np.where(union > 0, union, 1.0), 1.0)
    if pairs is None:
        pairs = np.stack(np.triu_indices(m.shape[-2], 1), 1)
    return jac[..., pairs[:, 0], pairs[:, 1]].mean(-1)


def bootstrap_samples(entropies: np.ndarray, fraction: float, draws: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Bootstrap over samples of the across-sample statistics of Table 1 (docs/method.md §14.3).

    entropies: (n_samples, units), the reference head entropies. Each draw resamples the samples
    with replacement; its bottom-set recurrence is the mean Jaccard index over the pairs of drawn
    samples that are distinct samples (a sample paired with its own copy would count as perfect
    recurrence), and its counts are how often each unit is in the bottom / top set over the
    draw. Returns `recurrence` (draws,; NaN for a draw of one sample repeated), `bottom_count`,
    `top_count` (draws, units) int64 and `draw_samples` (draws, n_samples), the drawn samples."""
    e = np.asarray(entropies, dtype=float)
    n_s = e.shape[0]
    rng = np.random.default_rng(int(seed))
    idx = rng.integers(0, n_s, size=(int(draws), n_s))
    bottom, top = bottom_sets(e, fraction, "bottom"), bottom_sets(e, fraction, "top")
    return {"recurrence": distinct_pair_jaccard(bottom, idx),
            "bottom_count": bottom[idx].sum(1).astype(np.int64),
            "top_count": top[idx].sum(1).astype(np.int64),
            "draw_samples": idx}


def distinct_pair_jaccard(member: np.ndarray, draws: np.ndarray) -> np.ndarray:
    """For each draw of samples (rows of `draws`, (draws, n) sample indices), the mean Jaccard
    index of the sets `member` (samples, units) bool over the pairs of drawn samples that are
    distinct samples: a sample paired with its own copy would count as perfect recurrence
    (docs/method.md §14.3). (draws,); NaN for a draw of one sample repeated."""
    m = member.astype(np.float64)
    inter = m @ m.T
    size = m.sum(1)
    jac = inter / (size[:, None] + size[None, :] - inter)
    i, j = np.triu_indices(draws.shape[1], 1)
    a, b = draws[:, i], draws[:, j]  # (draws, pairs)
    distinct = a != b
    with np.errstate(invalid="ignore"):
        return np.where(distinct, jac[a, b], 0.0).sum(1) / distinct.sum(1)


def recurrence_interval(stab: xr.Dataset) -> tuple[float, float]:
    """The 95% bootstrap interval of the bottom-set recurrence of a stability store (NaN draws,
    one sample repeated, left out; NaNs when every draw is one)."""
    rec = stab["bootstrap_recurrence"].values
    if not np.isfinite(rec).any():
        return float("nan"), float("nan")
    lo, hi = np.nanpercentile(rec, [2.5, 97.5])
    return float(lo), float(hi)


# smoothness.THEOREM1_MEASURES, written out: importing it would import torch into the stages that
# only read stores (tests/test_stability.py holds the two equal)
FIG_MEASURES = ("paraproduct_residual", "residual_selfnorm", "residual_nocross", "residual_nocross_selfnorm",
                "uniform_residual",
                "corollary1_residual", "corollary1_selfnorm", "corollary1_nocross", "corollary1_nocross_selfnorm",
                "taylor_residual", "taylor_selfnorm", "taylor_nocross", "taylor_nocross_selfnorm",
                "alpha_scores", "alpha_softmax", "alpha_residual")
"""What each replicate measures of each figure head (docs/method.md §14.2): the theorem1 table's
measures (`smoothness.THEOREM1_MEASURES` in its order, its `residual` stored as
`paraproduct_residual`), in the head's own 2-D organized order (`smoothness.theorem1_measures`, as
the theorem1 stage), so that every column the claims read of that table has its replicate values."""

# scalar measures of a sample and per-unit measures, as the summary lists them
SCALARS = ("network_entropy", "network_sparsity", "sparsity_ratio", "ari_layer", "ari_kv_group")
PER_UNIT = ("head_entropy", "head_sparsity")
TREES = ("same_tree_q", "same_tree_k", "same_tree_h")


def stability_summary(stab: xr.Dataset, fraction: float = 0.1) -> pd.DataFrame:
    """One row per (measure, perturbation): how far the replicates move each measure from the
    reference (replicate 0), over the samples with replicates (docs/method.md §14.2).

    Columns: measure, perturbation, replicates (per sample), reference (mean over samples),
    spread_median and spread_max (relative |replicate - reference| / |reference|: of every
    sample and replicate for a network measure; of every sample, replicate and head for a
    per-head one), and for the head sets and trees `agreement`: the mean Jaccard index of each
    replicate's bottom / top set with the reference's, or the fraction of replicates whose tree
    has the reference's folders."""
    pert = stab["perturbation"].values
    rows = []
    ref_sel = pert == REFERENCE
    if ref_sel.sum() != 1:
        raise ValueError(f"stability store: expected one reference replicate ({REFERENCE!r}), found {int(ref_sel.sum())}")
    r0 = int(np.flatnonzero(ref_sel)[0])
    for p in [q for q in PERTURBATIONS if q in set(pert)]:
        sel = np.flatnonzero(pert == p)
        base = {"perturbation": p, "replicates": sel.size}
        for name in PER_UNIT + SCALARS:
            if name not in stab:
                continue
            v = stab[name].transpose("sample", "replicate", ...).values
            ref = v[:, r0:r0 + 1]
            s = relative_spread(v[:, sel], ref)
            finite = s[np.isfinite(s)] if np.isfinite(ref).any() else np.array([])
            rows.append({"measure": name, **base, "reference": float(np.nanmean(ref)) if np.isfinite(ref).any()
                         else float("nan"),
                         "spread_median": float(np.median(finite)) if finite.size else float("nan"),
                         "spread_max": float(finite.max()) if finite.size else float("nan"), "agreement": np.nan})
        e = stab["head_entropy"].transpose("sample", "replicate", "unit").values
        for which in ("bottom", "top"):
            mem = bottom_sets(e, fraction, which)  # (s, R, u)
            ref_m, rep_m = mem[:, r0:r0 + 1], mem[:, sel]
            inter = (ref_m & rep_m).sum(-1)
            union = (ref_m | rep_m).sum(-1)
            rows.append({"measure": f"{which}_set", **base, "reference": np.nan, "spread_median": np.nan,
                         "spread_max": np.nan, "agreement": float((inter / union).mean())})
        for name in FIG_MEASURES if p != "sibling" else ():
            if name not in stab:
                continue
            v = stab[name].transpose("sample", "replicate", "fig_head").values
            s = relative_spread(v[:, sel], v[:, r0:r0 + 1])
            s = s[np.isfinite(s)]
            rows.append({"measure": name, **base,
                         "reference": float(np.nanmean(v[:, r0])) if np.isfinite(v[:, r0]).any() else np.nan,
                         "spread_median": float(np.median(s)) if s.size else np.nan,
                         "spread_max": float(s.max()) if s.size else np.nan, "agreement": np.nan})
        for name in TREES:
            rows.append({"measure": name, **base, "reference": np.nan, "spread_median": np.nan, "spread_max": np.nan,
                         "agreement": float(stab[name].values[:, sel].mean())})
    return pd.DataFrame(rows, columns=["measure", "perturbation", "replicates", "reference", "spread_median",
                                       "spread_max", "agreement"])


def spread_text(values, fmt: str = ".4g") -> str:
    """"min–max" of finite replicate values (the reference among them), or "" when there are none."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return ""
    conv = int if fmt.endswith("d") else float
    lo, hi = conv(v.min()), conv(v.max())
    return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}–{hi:{fmt}}"
