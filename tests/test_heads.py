"""The heads table (`oattn_lib.heads`): ranks and sets as Table 1's own code makes them, rows only
for stored heads, the decomposed stores' per-head values on the right heads, and intervals that
cover what they estimate."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib.entropy import extreme_heads
from oattn_lib.heads import SAMPLE_COLUMNS, head_summary, rank_within, sample_rows

LAYERS, HEADS = np.array([0, 2, 5]), np.array([1, 3, 4, 7])


def entropy_store(e: np.ndarray, seed: int = 0) -> xr.Dataset:
    """An entropy store of head entropies e (sample, layer, head), its other measures random."""
    rng = np.random.default_rng(seed)
    dims = ("sample", "layer", "head")
    return xr.Dataset({"head_entropy": (dims, e), "head_sparsity": (dims, rng.uniform(1, 3, e.shape)),
                       "head_l2": (dims, np.where(np.isfinite(e), rng.uniform(1, 2, e.shape), np.nan))},
                      coords={"sample": np.arange(e.shape[0]), "layer": LAYERS[:e.shape[1]], "head": HEADS[:e.shape[2]]})


def test_ranks_and_sets_are_table_1s():
    rng = np.random.default_rng(1)
    e = rng.normal(size=(6, 3, 4))
    e[2, 1, 1] = e[2, 0, 3]  # a tie: the lower unit index ranks first, as Table 1's sets do
    rows = sample_rows(entropy_store(e), fraction=0.25)
    assert list(rows.columns) == list(SAMPLE_COLUMNS) and len(rows) == 6 * 12
    flat = e.reshape(6, -1)
    ext = extreme_heads(flat, 0.25)
    s = head_summary(rows).set_index(["layer", "head"])
    units = [(int(a), int(b)) for a in LAYERS for b in HEADS]
    assert [s.loc[u, "bottom_count"] for u in units] == ext["bottom"].tolist()
    assert [s.loc[u, "top_count"] for u in units] == ext["top"].tolist()
    for i in range(6):
        r = rows[rows["sample"] == i]
        assert (r["layer"].iloc[r["entropy_rank"].argmin()], r["head"].iloc[r["entropy_rank"].argmin()]) == \
            units[int(flat[i].argmin())]
        assert sorted(r["entropy_rank"]) == list(range(1, 13))
    tied = rows[(rows["sample"] == 2)].set_index(["layer", "head"])["entropy_rank"]
    assert tied[(0, 7)] + 1 == tied[(2, 3)]


def test_unstored_heads_have_no_rows_and_do_not_rank():
    rng = np.random.default_rng(2)
    e = rng.normal(size=(3, 3, 4))
    e[:, 1, 2] = np.nan  # layer 2, head 4 not stored
    e[:, 0, 0] = -100.0  # the lowest everywhere
    rows = sample_rows(entropy_store(e), fraction=0.1)
    assert len(rows) == 3 * 11 and not ((rows["layer"] == 2) & (rows["head"] == 4)).any()
    assert set(rows.groupby("sample")["entropy_rank"].max()) == {11}
    assert rows[(rows["layer"] == 0) & (rows["head"] == 1)]["in_bottom"].all()
    assert rows.groupby("sample")["in_bottom"].sum().eq(1).all()


def test_decomposed_values_land_on_their_heads():
    """The decomposed store lists its units in its own order: each value must go to the head it
    names, the figure heads' residuals to the figure heads only."""
    rng = np.random.default_rng(3)
    e = rng.normal(size=(2, 3, 4))
    units = [(int(a), int(b)) for a in LAYERS for b in HEADS]
    decs = []
    for s in range(2):
        perm = rng.permutation(12)
        ul, uh = np.array([units[p][0] for p in perm]), np.array([units[p][1] for p in perm])
        kv = uh // 4  # heads 1, 3 in group 0; 4, 7 in group 1
        coords = rng.normal(size=(12, 3))
        decs.append(xr.Dataset(
            {"diffusion_coords": (("unit", "component"), coords),
             "fig_rel_residual": ("fig_head", [0.25 + s, 0.5 + s]),
             "fig_rel_residual_unorganized": ("fig_head", [0.75 + s, 1.0 + s])},
            coords={"unit_layer": ("unit", ul), "unit_head": ("unit", uh), "unit_kv_group": ("unit", kv),
                    "fig_layer": ("fig_head", [5, 0]), "fig_head_index": ("fig_head", [7, 3])}))
    rows = sample_rows(entropy_store(e), decs).set_index(["sample", "layer", "head"])
    for s, ds in enumerate(decs):
        for u in range(12):
            key = (s, int(ds["unit_layer"][u]), int(ds["unit_head"][u]))
            assert rows.loc[key, "diffusion_1"] == ds["diffusion_coords"].values[u, 0]
            assert rows.loc[key, "diffusion_2"] == ds["diffusion_coords"].values[u, 1]
            assert rows.loc[key, "kv_group"] == key[2] // 4
        assert rows.loc[(s, 5, 7), "paraproduct_residual"] == 0.25 + s
        assert rows.loc[(s, 0, 3), "paraproduct_residual_original"] == 1.0 + s
    assert rows["paraproduct_residual"].notna().sum() == 4
    with pytest.raises(ValueError, match="decomposed: 1 stores"):
        sample_rows(entropy_store(e), decs[:1])


def test_intervals_cover_the_mean_they_estimate():
    """40 heads with known means, 30 samples each: the 95% bootstrap intervals of the mean
    entropy cover the true mean for most heads, a head constant over samples has a point
    interval, and the summary does not depend on the samples' order."""
    rng = np.random.default_rng(4)
    mu = rng.uniform(0, 10, size=40)
    e = mu + rng.normal(size=(30, 40))
    e[:, 7] = mu[7]
    ds = xr.Dataset({"head_entropy": (("sample", "layer", "head"), e.reshape(30, 5, 8)),
                     "head_sparsity": (("sample", "layer", "head"), np.ones((30, 5, 8))),
                     "head_l2": (("sample", "layer", "head"), np.ones((30, 5, 8)))},
                    coords={"sample": np.arange(30), "layer": np.arange(5), "head": np.arange(8)})
    s = head_summary(sample_rows(ds)).sort_values(["layer", "head"]).reset_index(drop=True)
    covered = (s["entropy_low"] <= mu) & (mu <= s["entropy_high"])
    assert covered.mean() >= 0.85, covered.mean()
    tol = 1e-9  # a resampled mean of equal values may differ from them in the last bits
    assert (s["entropy_low"] <= s["entropy_mean"] + tol).all() and (s["entropy_mean"] <= s["entropy_high"] + tol).all()
    assert s.loc[7, "entropy_low"] == pytest.approx(mu[7]) and s.loc[7, "entropy_high"] == pytest.approx(mu[7])
    assert np.allclose(s["entropy_sd"].drop(7), 1.0, atol=0.45)
    # the rank's interval is the mean rank's over samples
    assert ((s["rank_low"] <= s["rank_mean"]) & (s["rank_mean"] <= s["rank_high"])).all()
    shuffled = ds.isel(sample=rng.permutation(30)).assign_coords(sample=np.arange(30))
    t = head_summary(sample_rows(shuffled)).sort_values(["layer", "head"]).reset_index(drop=True)
    for col in ("entropy_mean", "rank_mean", "bottom_count", "top_count"):
        np.testing.assert_allclose(t[col].to_numpy(float), s[col].to_numpy(float), rtol=1e-12)


def test_the_replicates_spread_brackets_the_reference():
    """A stability store whose replicates move one sample's entropies: each head's range over the
    whole-model replicates holds its reference mean, and is the spread of the replicates' means."""
    rng = np.random.default_rng(5)
    e = rng.normal(size=(3, 3, 4))
    rows = sample_rows(entropy_store(e), fraction=0.25)
    ref = e.reshape(3, -1)
    shifts = np.array([0.0, 0.3, -0.2])  # replicate 0 is the reference
    reps = ref[1][None, :] + shifts[:, None] * np.linspace(-1, 1, 12)[None, :]
    stab = xr.Dataset({"head_entropy": (("sample", "replicate", "unit"), reps[None]),
                       "bootstrap_bottom_count": (("draw", "unit"), rng.integers(0, 4, (50, 12))),
                       "bootstrap_top_count": (("draw", "unit"), rng.integers(0, 4, (50, 12)))},
                      coords={"sample": [1], "perturbation": ("replicate", ["none", "ulp", "ulp"]),
                              "replicate_index": ("replicate", [0, 0, 1])})
    s = head_summary(rows, stability=stab).sort_values(["layer", "head"]).reset_index(drop=True)
    whole = np.stack([np.stack([ref[0], r, ref[2]]).mean(0) for r in reps])  # (R, units)
    np.testing.assert_allclose(s["entropy_replicates_low"], whole.min(0))
    np.testing.assert_allclose(s["entropy_replicates_high"], whole.max(0))
    assert ((s["entropy_replicates_low"] <= s["entropy_mean"] + 1e-12)
            & (s["entropy_mean"] <= s["entropy_replicates_high"] + 1e-12)).all()
    counts = np.stack([(rank_within(np.stack([ref[0], r, ref[2]])) <= 3).sum(0) for r in reps])
    np.testing.assert_array_equal(s["bottom_count_replicates_low"], counts.min(0))
    assert {"bottom_count_boot_low", "top_count_boot_high"} <= set(s.columns)
    with pytest.raises(ValueError, match="rows: holds the models"):
        head_summary(pd.concat([rows, rows.assign(model="other")]))
