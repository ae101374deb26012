"""The claims table: each verdict derived by its stated rule from the numbers, flipping where the
numbers cross the rule, and a summary stage whose numbers are recomputed here from the stores and
tables it read."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import claims, store
from oattn_lib.claims import HOLDS, MIXED, NOT_HERE, NOT_RUN, REPORTED
from oattn_lib.entropy import jaccard_stability
from oattn_lib.stability import REFERENCE
from oattn_lib.stages.summary import (
    LOWEST_FIRST,
    NO_THEOREM1,
    RANDOM,
    bottom_fraction_point,
    replicate_verdicts,
    residual_table,
    summary,
)

ORG, ORIG, RND = claims.ORGANIZED, claims.ORIGINAL, claims.RANDOM_ORDERS


def residuals(org, orig, rnd, column="residual", **extra):
    """A residual table, one head-sample per entry of `org` (sample i, layer 0, head 0); `rnd` is a
    list per head-sample of the random seeds' residuals."""
    rows = []
    for i, (o, a, rs) in enumerate(zip(org, orig, rnd)):
        rows += [{"sample": i, "layer": 0, "head": 0, "order": ORG, "seed": -1, column: o,
                  **{k: v[i] for k, v in extra.items()}},
                 {"sample": i, "layer": 0, "head": 0, "order": ORIG, "seed": -1, column: a}]
        rows += [{"sample": i, "layer": 0, "head": 0, "order": RND, "seed": s, column: r} for s, r in enumerate(rs)]
    return pd.DataFrame(rows)


# -- chance level -------------------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(6, 2), (7, 3), (5, 5), (8, 1)])
def test_chance_jaccard_is_the_mean_over_all_pairs_of_sets(n, k):
    sets = [set(s) for s in itertools.combinations(range(n), k)]
    brute = np.mean([len(a & b) / len(a | b) for a in sets for b in sets])
    assert claims.chance_jaccard(n, k) == pytest.approx(brute)


def test_top_sets_of_unrelated_samples_sit_at_the_chance_level_and_do_not_recur():
    # 300 samples of independent entropies over 20 heads: their top-3 sets overlap by chance only
    flat = np.random.default_rng(0).random((300, 20))
    jac = jaccard_stability(flat, 0.15, "top")
    mean = jac[~np.eye(300, dtype=bool)].mean()
    chance = claims.chance_jaccard(20, 3)
    assert mean == pytest.approx(chance, rel=0.05)
    c = claims.recurrence_claim("m", mean, 20, 3, [], 300, which="top")
    assert c.verdict == NOT_HERE and c.claim == claims.CLAIMS["top_recurrence"] and "top-3-of-20" in c.measured


# -- sparsity against both baselines -------------------------------------------------------------
@pytest.mark.parametrize("to_random, to_natural, verdict", [
    ([0.94, 0.5], [0.9, 0.8], HOLDS), ([0.96, 0.5], [0.9, 0.8], MIXED), ([1.0, 1.0], [0.5, 0.5], NOT_HERE),
    ([0.5, 0.5], [0.94, 0.94], HOLDS), ([0.5, 0.5], [0.96, 0.9], MIXED), ([0.5, 0.5], [1.1, 0.95], NOT_HERE),
])
def test_sparsity_holds_only_below_both_baselines(to_random, to_natural, verdict):
    org = np.full(2, 3.0)
    c = claims.sparsity_claim("m", org, org / to_random, org / np.asarray(to_natural))
    assert c.verdict == verdict
    assert c.value == pytest.approx(max(np.mean(to_random), np.mean(to_natural)))
    assert "natural order" in c.measured and "random trees" in c.measured


def test_sparsity_that_holds_against_random_trees_but_not_the_natural_order():
    org, rnd, nat = np.array([1.0, 1.1, 0.9]), np.array([2.0, 2.1, 2.2]), np.array([0.95, 1.0, 0.9])
    assert claims.sparsity_claim("m", org, rnd).verdict == HOLDS          # random trees only
    c = claims.sparsity_claim("m", org, rnd, nat)
    assert c.verdict == NOT_HERE and c.value == pytest.approx(np.mean(org / nat))
    only = claims.sparsity_claim("m", org, rnd).measured
    assert "against random trees only" in only and "network_sparsity_natural_trees" in only


def test_recurrence_verdict():
    chance = claims.chance_jaccard(16, 2)
    args = dict(n_heads=16, k=2, counts=[((0, 1), 3)], n_samples=3)
    assert claims.recurrence_claim("m", 0.5, **args).verdict == HOLDS
    assert claims.recurrence_claim("m", 0.49, **args).verdict == MIXED
    assert claims.recurrence_claim("m", 2 * chance, **args).verdict == MIXED
    assert claims.recurrence_claim("m", 2 * chance - 1e-9, **args).verdict == NOT_HERE
    assert "(0,1) 3/3" in claims.recurrence_claim("m", 0.5, **args).measured


# -- Theorem 1: the residual's size, and whether organizing helps, pair by pair ---------------------
def test_residuals_above_one_everywhere_do_not_hold_however_they_rank():
    """txl-tiny's case: organized 4.41 below original 5.07 and random 7.69 at every head-sample,
    yet every residual is worse than predicting zero."""
    n = 8
    c = claims.paraproduct_claim("txl-tiny", residuals([4.41] * n, [5.07] * n, [[7.69] * 3] * n))
    assert c.verdict == NOT_HERE and c.value == pytest.approx(4.41)
    assert "below 1 in 0/8" in c.measured and "below the original order in 8/8" in c.measured
    # the same ranking with every residual below 1 holds
    ok = claims.paraproduct_claim("m", residuals([0.441] * n, [0.507] * n, [[0.769] * 3] * n))
    assert ok.verdict == HOLDS


@pytest.mark.parametrize("org, orig, verdict", [
    ([0.5] * 6, 0.9, HOLDS),                          # below 1 and below both baselines in 6/6 (p = 1/64)
    ([0.5] * 5 + [0.95], 0.9, MIXED),                 # below the original in 5/6 only: p = 0.11
    ([0.5] * 3 + [0.95] * 3, 0.9, NOT_HERE),          # below the original in at most half the pairs
    ([0.5] * 4 + [1.0] * 2, 1.5, HOLDS),              # below 1 in 4/6, and below both baselines everywhere
    ([0.5] * 3 + [1.0] * 3, 1.5, NOT_HERE),           # ... but residual >= 1 in half the head-samples
    ([0.5] * 5 + [float("nan")], 0.9, MIXED),         # not representable: worse than any baseline
])
def test_paraproduct_verdict_flips_where_the_pairs_cross_the_rule(org, orig, verdict):
    c = claims.paraproduct_claim("m", residuals(org, [orig] * 6, [[2.0, 3.0]] * 6))
    assert c.verdict == verdict


def test_a_few_heads_far_below_do_not_make_a_geometric_mean_win():
    # the organized geometric mean (0.071) is below the original's (0.2), but it wins 3 pairs of 6
    org, orig = [0.01] * 3 + [0.5] * 3, [0.1] * 3 + [0.4] * 3
    assert np.exp(np.log(org).mean()) < np.exp(np.log(orig).mean())
    assert claims.paraproduct_claim("m", residuals(org, orig, [[0.9]] * 6)).verdict == NOT_HERE


def test_random_orders_are_averaged_per_head_sample_geometrically():
    # seeds 0.01 and 1.0: geometric mean 0.1 (organized 0.2 is above it), arithmetic 0.505 (below)
    table = residuals([0.2] * 6, [0.9] * 6, [[0.01, 1.0]] * 6)
    wide = claims.head_sample_residuals(table)
    np.testing.assert_allclose(wide[RND], 0.1)
    assert claims.paraproduct_claim("m", table).verdict == NOT_HERE
    assert claims.paraproduct_claim("m", residuals([0.05] * 6, [0.9] * 6, [[0.01, 1.0]] * 6)).verdict == HOLDS


def test_paraproduct_not_run_says_why():
    c = claims.paraproduct_claim("m", None, not_run="no scores")
    assert c.verdict == NOT_RUN and "no scores" in c.measured and c.quote == claims.QUOTES["paraproduct"]


@pytest.mark.parametrize("above, verdict", [(6, HOLDS), (5, MIXED), (3, NOT_HERE), (0, NOT_HERE)])
def test_smoothness_counts_the_organized_head_samples_whose_residual_is_smoother(above, verdict):
    soft = np.full(6, 0.3)
    res = np.where(np.arange(6) < above, 0.6, 0.2)
    table = residuals([0.5] * 6, [0.9] * 6, [[2.0]] * 6, alpha_softmax=soft, alpha_residual=res)
    # the other orders' exponents go the other way and must not count
    table.loc[table["order"] != ORG, "alpha_softmax"] = 1.0
    table.loc[table["order"] != ORG, "alpha_residual"] = 0.0
    c = claims.smoothness_claim("m", table)
    assert c.verdict == verdict and c.value == pytest.approx(np.median(res - soft))
    assert claims.smoothness_claim("m", None, not_run=NO_THEOREM1).verdict == NOT_RUN


def test_corollary1_is_judged_on_its_own_residual():
    table = residuals([0.5] * 6, [0.9] * 6, [[2.0]] * 6)
    table["corollary1_residual"] = residuals([1.5] * 6, [1.9] * 6, [[3.0]] * 6)["residual"]
    assert claims.paraproduct_claim("m", table).verdict == HOLDS
    c = claims.corollary1_claim("m", table)
    assert c.verdict == NOT_HERE and c.claim == claims.CLAIMS["corollary1"] and c.value == pytest.approx(1.5)
    assert "A′ = A″ = 1" in c.measured


# -- pruning ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("low, higher, verdict", [
    (0.71, True, HOLDS), (0.69, True, MIXED), (0.50, True, NOT_HERE), (0.45, True, NOT_HERE),
    (0.29, False, HOLDS), (0.45, False, MIXED), (0.70, False, NOT_HERE),
])
def test_pruning_verdict_is_oriented_by_the_metric(low, higher, verdict):
    c = claims.pruning_claim("m", low, 0.5, 0.1, higher)
    assert c.verdict == verdict
    assert c.value == pytest.approx((low - 0.5) / 0.1 * (1 if higher else -1))


def test_pruning_not_run_and_single_random_order():
    assert claims.pruning_claim("m", None, None, None).verdict == NOT_RUN
    assert claims.pruning_claim("m", 0.6, 0.5, float("nan")).verdict == HOLDS  # no spread: sign only
    assert claims.pruning_claim("m", 0.4, 0.5, 0.0).verdict == NOT_HERE


@pytest.mark.parametrize("low, higher, verdict", [(0.9, True, HOLDS), (0.75, True, MIXED), (0.69, True, NOT_HERE),
                                                  (0.49, False, HOLDS), (0.9, False, NOT_HERE)])
def test_pruning_at_the_bottom_fraction_against_random_orders(low, higher, verdict):
    rnd = [0.6, 0.7, 0.8]  # mean 0.7, sd 0.1
    c = claims.pruning_bottom_claim("m", low, rnd, 3, 24, higher)
    assert c.verdict == verdict and c.value == pytest.approx((low - 0.7) / 0.1 * (1 if higher else -1))
    assert "3 of 24 lowest-entropy heads masked" in c.measured
    assert claims.pruning_bottom_claim("m", None, None, not_run="why").verdict == NOT_RUN


def test_bottom_fraction_point_reads_the_curves_at_table1s_set_size(tmp_path):
    ks = [0, 1, 2, 3, 5, 12]  # 25% of 12 heads is 3
    rows = [{"ranking": LOWEST_FIRST, "order": 0, "k": k, "fraction": k / 12, "perplexity": 10.0 + k} for k in ks]
    rows += [{"ranking": RANDOM, "order": j, "k": k, "fraction": k / 12, "perplexity": 20.0 + k + j}
             for j in range(3) for k in ks]
    rows += [{"ranking": "gradient", "order": 0, "k": k, "fraction": k / 12, "perplexity": 0.0} for k in ks]
    pd.DataFrame(rows).to_csv(tmp_path / "curves.csv", index=False)
    got = bottom_fraction_point(tmp_path / "curves.csv", "perplexity", True, 0.25)
    assert (got["k"], got["n_units"], got["note"]) == (3, 12, "")
    assert got["low"] == pytest.approx(np.log(13.0))
    np.testing.assert_allclose(got["random"], np.log([23.0, 24.0, 25.0]))
    got = bottom_fraction_point(tmp_path / "curves.csv", "perplexity", False, 0.3)  # 4 heads: not on the grid
    assert got["k"] == 3 and "4 heads" in got["note"] and got["low"] == pytest.approx(13.0)


# -- Table 2 on a scale-free measure ----------------------------------------------------------------
def test_table2_order_survives_reverses_or_overlaps():
    txl = ("txl", [1200.0, 2476.0], [0.5, 0.6])
    vit = ("vit", [2.47, 9.77], [0.1, 0.2])
    assert claims.table2_order_claim({"t": txl, "v": vit}).verdict == HOLDS
    reversed_ = claims.table2_order_claim({"t": txl, "v": ("vit", vit[1], [0.7, 0.8])})
    assert reversed_.verdict == NOT_HERE and reversed_.value == 0.0 and reversed_.model.startswith("t > v")
    assert claims.table2_order_claim({"t": txl, "v": ("vit", vit[1], [0.55, 0.9])}).verdict == MIXED
    assert claims.table2_order_claim({"t": txl, "t2": ("txl", [1.0], [9.0])}) is None  # one kind: no comparison
    missing = claims.table2_order_claim({"t": txl, "v": ("vit", vit[1], None)})
    assert missing.verdict == NOT_RUN and "v has no network_entropy_scale_free" in missing.measured
    row = claims.table2_claim("t", *txl[1:])
    assert row.verdict == REPORTED and "1200–2476" in row.measured and "0.5–0.6" in row.measured
    assert claims.table2_claim("t", txl[1]).verdict == NOT_RUN


# -- the diffusion map ------------------------------------------------------------------------------
def test_silhouette_is_sklearns_for_any_labelling_and_undefined_for_one_group():
    from sklearn.metrics import silhouette_score
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 3))
    d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
    labels = np.stack([rng.integers(0, 4, 30) for _ in range(5)] + [np.r_[np.zeros(29, int), 1]])  # one singleton
    np.testing.assert_allclose(claims.silhouette(d, labels), [silhouette_score(x, lab) for lab in labels])
    assert claims.silhouette(d, labels[0] * 7 + 5) == pytest.approx(claims.silhouette(d, labels[0]))
    assert np.isnan(claims.silhouette(d, np.zeros(30, int)))


def test_layer_silhouette_finds_planted_clusters_and_not_random_points():
    rng = np.random.default_rng(1)
    layers = np.repeat(np.arange(4), 8)
    planted = rng.normal(size=(32, 3)) * 0.1 + np.eye(4, 3)[layers] * 3.0
    s, p = claims.layer_silhouette_test(planted, layers, rng=0)
    assert s > 0.8 and p == pytest.approx(1 / 201)  # no shuffle comes close
    # the same heads listed in another order, their layers with them: the same silhouette
    perm = rng.permutation(32)
    assert claims.layer_silhouette_test(planted[perm], layers[perm], rng=0)[0] == pytest.approx(s)
    noise = rng.normal(size=(32, 3))
    s0, p0 = claims.layer_silhouette_test(noise, layers, rng=0)
    assert abs(s0) < 0.2 and p0 > 0.05
    assert claims.layer_silhouette_test(noise, layers, rng=0) == (s0, p0)  # seeded: the same shuffles
    assert np.isnan(claims.layer_silhouette_test(noise, np.zeros(32, int), rng=0)[1])  # one layer


@pytest.mark.parametrize("pvalues, vit, txl", [
    ([0.01, 0.01, 0.5], HOLDS, MIXED), ([0.01, 0.5, 0.5], MIXED, HOLDS), ([0.5, 0.5, 0.5], NOT_HERE, HOLDS),
    ([0.01, 0.01, 0.01], HOLDS, NOT_HERE),
])
def test_diffusion_reading_depends_on_the_kind_the_paper_describes(pvalues, vit, txl):
    s = [0.3, 0.2, 0.1]
    assert claims.diffusion_claim("v", "vit", s, pvalues).verdict == vit
    assert claims.diffusion_claim("t", "txl", s, pvalues).verdict == txl
    assert claims.diffusion_claim("h", "hf", s, pvalues).verdict == vit  # read as clustered
    assert claims.diffusion_claim("v", "vit", [np.nan], [np.nan]).verdict == NOT_RUN


def test_a_negative_silhouette_that_beats_the_shuffles_is_not_a_cluster():
    # heads nearer other layers than their own, though less so than under shuffled labels
    assert claims.diffusion_claim("v", "vit", [-0.03, -0.02, 0.01], [0.005] * 3).verdict == MIXED
    assert claims.diffusion_claim("v", "vit", [-0.03, -0.02, -0.01], [0.005] * 3).verdict == NOT_HERE
    assert claims.diffusion_claim("t", "txl", [-0.03, -0.02, -0.01], [0.005] * 3).verdict == HOLDS


# -- the tables ------------------------------------------------------------------------------------
def test_summary_reads_the_prune_stages_names():
    from oattn_lib import ablation
    assert (LOWEST_FIRST, RANDOM) == (ablation.HAAR_LOW, ablation.RANDOM)


def test_claims_rst_is_one_table_with_a_row_per_claim():
    from docutils.core import publish_doctree
    rows = [claims.sparsity_claim("a_b", [1.0], [2.0]), claims.pruning_claim("a*b", None, None, None)]
    tree = publish_doctree(claims.claims_rst(rows))
    tables = [n for n in tree.findall() if n.tagname == "table"]
    assert len(tables) == 1
    body_rows = [n for n in tables[0].findall() if n.tagname == "row"]
    assert len(body_rows) == 3
    text = tables[0].astext()
    assert "a_b" in text and "a*b" in text and NOT_RUN in text and HOLDS in text
    assert "by virtue of network sparsity" in text and "could be discarded" in text


# -- the summary stage, on files written here ----------------------------------------------------------
def write_model(root, name, rng, n_s=4, layers=3, heads=4, prune=True, metric=("accuracy", True, "accuracy"),
                natural=True, scale_free=True, residual=(0.3, 0.6, 0.9)):
    e = rng.random((n_s, layers, heads)) * 10
    e[:, 0, 0] = 0.1  # one head at the bottom in every sample
    ent = xr.Dataset({"head_entropy": (("sample", "layer", "head"), e)},
                     coords={"sample": np.arange(n_s), "layer": np.arange(layers), "head": np.arange(heads)})
    store.write_store(ent, root / f"{name}_entropy.zarr")
    pd.DataFrame({"model": name, "set": ["top"] * 3 + ["bottom"] * 3, "rank": [1, 2, 3] * 2,
                  "layer": [1, 2, 2, 0, 1, 2], "head": [1, 2, 3, 0, 0, 1],
                  "count": ["2/4", "1/4", "1/4", "4/4", "2/4", "1/4"], "mean_entropy": 1.0}
                 ).to_csv(root / f"{name}_t1.csv", index=False)
    t2 = pd.DataFrame({"model": name, "sample": np.arange(n_s), "network_entropy": rng.random(n_s) * 100,
                       "network_sparsity": rng.random(n_s) + 1,
                       "network_sparsity_random_trees": rng.random(n_s) + 1.5})
    if natural:
        t2["network_sparsity_natural_trees"] = rng.random(n_s) + 1.2
    if scale_free:
        t2["network_entropy_scale_free"] = rng.random(n_s)
    t2.to_csv(root / f"{name}_t2.csv", index=False)
    (root / f"{name}_temp.json").write_text(json.dumps({
        "at_model_tau": {"2-D organized": 0.08, "original": 0.2, "random": None},
        "crossover": {"original": {"text": "below the original order's for tau < 2.5 (crossover)"},
                      "random": {"text": "below the random orders' over the whole range (no crossover)"}}}))
    # the temperature curves: 2 figure heads of 3 samples; at tau = 1 the residuals `residual`, at the
    # other temperatures the reverse order (which must not count)
    rows = []
    for s, (la, he), tau in itertools.product(range(3), [(0, 1), (2, 3)], (0.5, 1.0, 2.0)):
        o, a, r = residual if tau == 1.0 else residual[::-1]
        rows += [{"sample": s, "layer": la, "head": he, "order": ORG, "seed": -1, "tau": tau, "rel_residual": o},
                 {"sample": s, "layer": la, "head": he, "order": ORIG, "seed": -1, "tau": tau, "rel_residual": a}]
        rows += [{"sample": s, "layer": la, "head": he, "order": RND, "seed": j, "tau": tau, "rel_residual": r}
                 for j in range(2)]
    pd.DataFrame(rows).to_csv(root / f"{name}_temp.csv", index=False)
    # the decomposed stores: diffusion coordinates of the heads, clustered by layer
    unit_layer, unit_head = np.repeat(np.arange(layers), heads), np.tile(np.arange(heads), layers)
    for s in range(n_s):
        coords = rng.normal(size=(layers * heads, 3)) * 0.05 + unit_layer[:, None] * 1.0
        store.write_store(xr.Dataset({"diffusion_coords": (("unit", "component"), coords)},
                                     coords={"unit_layer": ("unit", unit_layer), "unit_head": ("unit", unit_head)}),
                          root / f"{name}_dec{s}.zarr")
    # what the prune stage writes: the metric measured, its direction and what the areas are of
    pd.DataFrame({"model": name, "metric": metric[0], "higher_is_better": metric[1], "auc_of": metric[2],
                  "ranking": [LOWEST_FIRST, RANDOM], "auc": [0.6, 0.7], "auc_sd": [np.nan, 0.02]}
                 ).to_csv(root / f"{name}_t3.csv", index=False)
    n_units, ks = layers * heads, [0, 1, 3, 6, 12]
    curves = [{"ranking": LOWEST_FIRST, "order": 0, "k": k, "fraction": k / n_units, metric[0]: 0.9 - 0.01 * k}
              for k in ks]
    curves += [{"ranking": RANDOM, "order": j, "k": k, "fraction": k / n_units, metric[0]: 0.8 - 0.02 * k - 0.01 * j}
               for j in range(3) for k in ks]
    pd.DataFrame(curves).to_csv(root / f"{name}_curves.csv", index=False)
    for t in (1, 2, 3, 4):
        (root / f"{name}_t{t}.md").write_text(f"table {t} of {name}\n")
    inputs = {f"entropy_{name}": root / f"{name}_entropy.zarr", f"table1csv_{name}": root / f"{name}_t1.csv",
              f"table2csv_{name}": root / f"{name}_t2.csv", f"temperature_{name}": root / f"{name}_temp.json",
              f"temperaturecsv_{name}": root / f"{name}_temp.csv",
              f"decomposed_{name}": [root / f"{name}_dec{s}.zarr" for s in range(n_s)],
              **{f"table{t}_{name}": root / f"{name}_t{t}.md" for t in (1, 2)}}
    if prune:
        inputs.update({f"table3csv_{name}": root / f"{name}_t3.csv", f"curves_{name}": root / f"{name}_curves.csv",
                       **{f"table{t}_{name}": root / f"{name}_t{t}.md" for t in (3, 4)}})
    return inputs


def run_summary(tmp_path, kinds, inputs):
    outs = {"md": tmp_path / "summary.md", "claims_csv": tmp_path / "claims.csv", "claims_rst": tmp_path / "claims.rst"}
    summary(kinds, inputs, outs, 0.25)
    return pd.read_csv(outs["claims_csv"]), outs


def test_summary_opens_with_the_claims_table_recomputed_from_its_inputs(tmp_path):
    from sklearn.metrics import silhouette_score
    rng = np.random.default_rng(0)
    inputs = {**write_model(tmp_path, "vit_a", rng), **write_model(tmp_path, "txl-b", rng, prune=False, natural=False)}
    got, outs = run_summary(tmp_path, {"vit_a": "vit", "txl-b": "txl"}, inputs)
    # grouped by claim, models in config order; the cross-model row after the models' Table 2 rows
    assert list(got["claim"]) == [claims.CLAIMS[k] for k in claims.CLAIMS
                                  for _ in range(1 if k == "table2_order" else 2)]
    cross = got[got["claim"] == claims.CLAIMS["table2_order"]].iloc[0]
    assert list(got.drop(cross.name)["model"]) == ["vit_a", "txl-b"] * (len(claims.CLAIMS) - 1)
    assert set(got.columns) >= {"claim", "model", "measured", "paper", "verdict", "value", "stability", "quote"}
    assert (got["quote"] == [claims.QUOTES[claims.claim_key(c)] for c in got["claim"]]).all()
    row = got.set_index(["model", "claim"])
    C = claims.CLAIMS
    for name in ("vit_a", "txl-b"):
        value = row.loc[name]["value"]
        t2 = pd.read_csv(tmp_path / f"{name}_t2.csv")
        ratios = [(t2["network_sparsity"] / t2["network_sparsity_random_trees"]).mean()]
        if name == "vit_a":
            ratios.append((t2["network_sparsity"] / t2["network_sparsity_natural_trees"]).mean())
        assert value[C["sparsity"]] == pytest.approx(max(ratios))
        # bottom and top 25% (3 of 12 heads) sets by sorting, and their Jaccard over all pairs of samples
        e = store.read_store(tmp_path / f"{name}_entropy.zarr")["head_entropy"].values.reshape(4, -1)
        for key, sign in (("recurrence", 1), ("top_recurrence", -1)):
            sets = [set(np.argsort(sign * s, kind="stable")[:3]) for s in e]
            jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.permutations(sets, 2)])
            assert value[C[key]] == pytest.approx(jac)
        assert value[C["paraproduct"]] == pytest.approx(0.3)  # the organized residual at tau = 1, not 0.9
        sil = [silhouette_score(store.read_store(tmp_path / f"{name}_dec{s}.zarr")["diffusion_coords"].values,
                                np.repeat(np.arange(3), 4)) for s in range(4)]
        assert value[C["diffusion"]] == pytest.approx(np.median(sil), rel=1e-6)
    ver = row["verdict"]
    assert ver["vit_a", C["paraproduct"]] == HOLDS        # 0.3 < 1, below 0.6 and 0.9 in 6/6 head-samples
    assert ver["vit_a", C["smoothness"]] == NOT_RUN and ver["vit_a", C["corollary1"]] == NOT_RUN
    assert NO_THEOREM1 in row.loc[("vit_a", C["smoothness"]), "measured"]
    assert ver["vit_a", C["pruning"]] == NOT_HERE          # area 0.6 < random 0.7, higher is better
    # 3 of 12 heads masked: lowest first 0.87 against random 0.74, 0.73, 0.72 (sd 0.01)
    assert ver["vit_a", C["pruning_bottom"]] == HOLDS
    assert value_of(row, "vit_a", C["pruning_bottom"]) == pytest.approx((0.87 - 0.73) / 0.01)
    assert ver["txl-b", C["pruning"]] == NOT_RUN and ver["txl-b", C["pruning_bottom"]] == NOT_RUN
    assert ver["vit_a", C["diffusion"]] == HOLDS and ver["txl-b", C["diffusion"]] == NOT_HERE  # clustered
    assert "against random trees only" in row.loc[("txl-b", C["sparsity"]), "measured"]
    assert ver["vit_a", C["table2"]] == REPORTED
    assert cross["verdict"] in (HOLDS, MIXED, NOT_HERE) and "vit_a" in cross["model"] and "txl-b" in cross["model"]
    assert "6/6 batches" in row.loc[("txl-b", C["recurrence"]), "paper"]
    md = outs["md"].read_text()
    assert md.index("| claim | model | the paper says |") < md.index("## vit_a") < md.index("table 3 of vit_a")
    assert "table 3 of txl-b" not in md
    assert "sign test" in md and "crossover" in md and "the same attention heads do the fewest processing" in md


def value_of(row, model, claim):
    return row.loc[(model, claim), "value"]


def test_the_theorem1_table_replaces_the_temperature_curves_where_present(tmp_path):
    rng = np.random.default_rng(2)
    inputs = write_model(tmp_path, "m", rng)
    # every head of 2 samples: every residual above 1 (the temperature curves' are below)
    table = pd.concat([residuals([4.41] * 6, [5.07] * 6, [[7.69] * 2] * 6, alpha_softmax=[0.2] * 6,
                                 alpha_residual=[0.5] * 6).assign(head=h) for h in range(2)], ignore_index=True)
    table["corollary1_residual"] = table["residual"] / 10
    table.to_csv(tmp_path / "theorem1.csv", index=False)
    got, _ = run_summary(tmp_path, {"m": "vit"}, {**inputs, "theorem1_m": tmp_path / "theorem1.csv"})
    row = got.set_index("claim")
    C = claims.CLAIMS
    assert row.loc[C["paraproduct"], "verdict"] == NOT_HERE and "every head" in row.loc[C["paraproduct"], "measured"]
    assert row.loc[C["paraproduct"], "value"] == pytest.approx(4.41)
    assert row.loc[C["smoothness"], "verdict"] == HOLDS and row.loc[C["smoothness"], "value"] == pytest.approx(0.3)
    assert row.loc[C["corollary1"], "verdict"] == HOLDS and row.loc[C["corollary1"], "value"] == pytest.approx(0.441)
    # a table without the exponents: the smoothness claim alone is not run
    table.drop(columns=["alpha_softmax"]).to_csv(tmp_path / "theorem1.csv", index=False)
    got, _ = run_summary(tmp_path, {"m": "vit"}, {**inputs, "theorem1_m": tmp_path / "theorem1.csv"})
    row = got.set_index("claim")
    assert row.loc[C["smoothness"], "verdict"] == NOT_RUN and NO_THEOREM1 in row.loc[C["smoothness"], "measured"]
    assert row.loc[C["corollary1"], "verdict"] == HOLDS
    # without the table the temperature curves decide, and the every-head claims are not run
    got, _ = run_summary(tmp_path, {"m": "vit"}, inputs)
    assert got.set_index("claim").loc[C["paraproduct"], "verdict"] == HOLDS
    assert got.set_index("claim").loc[C["corollary1"], "verdict"] == NOT_RUN


def test_a_temperature_figure_without_scores_leaves_theorem1_not_run(tmp_path):
    rng = np.random.default_rng(3)
    inputs = write_model(tmp_path, "m", rng)
    (tmp_path / "m_temp.json").write_text(json.dumps({"model": "m", "skipped": "no pre-softmax scores"}))
    (tmp_path / "m_temp.csv").write_text("sample,layer,head,order,seed,tau,rel_residual\n")
    got, outs = run_summary(tmp_path, {"m": "attention"}, inputs)
    row = got.set_index("claim")
    assert row.loc[claims.CLAIMS["paraproduct"], "verdict"] == NOT_RUN
    assert "no pre-softmax scores" in row.loc[claims.CLAIMS["paraproduct"], "measured"]
    assert "not run: no pre-softmax scores" in outs["md"].read_text()


def test_residual_table_takes_tau_one_of_the_temperature_curves(tmp_path):
    write_model(tmp_path, "m", np.random.default_rng(4))
    table, source = residual_table(None, tmp_path / "m_temp.csv")
    assert list(table.columns) == ["sample", "layer", "head", "order", "seed", "residual"]
    assert len(table) == 3 * 2 * 4 and source == "the temperature figure's heads"
    assert set(table.loc[table["order"] == ORG, "residual"]) == {0.3}
    assert residual_table(None, None) == (None, "")


def test_pruning_claim_takes_the_metric_table3_measured(tmp_path):
    """The same areas (0.6 vs random 0.7 +- 0.02) hold for a causal LM's perplexity (lower is
    better) and do not for an encoder's cosine similarity, both `kind: hf`: the direction comes
    from Table 3, not from the model kind."""
    rng = np.random.default_rng(1)
    inputs = {**write_model(tmp_path, "llm", rng, metric=("perplexity", False, "log perplexity")),
              **write_model(tmp_path, "enc", rng, metric=("cosine similarity to the unmasked model", True,
                                                           "cosine similarity to the unmasked model"))}
    got, _ = run_summary(tmp_path, {"llm": "hf", "enc": "hf"}, inputs)
    prune = got[got["claim"] == claims.CLAIMS["pruning"]].set_index("model")
    assert prune.loc["llm", "verdict"] == HOLDS and prune.loc["enc", "verdict"] == NOT_HERE
    assert "log perplexity" in prune.loc["llm", "measured"] and "lower is better" in prune.loc["llm", "measured"]
    assert "cosine similarity" in prune.loc["enc", "measured"]
    # at the bottom 25%: log(0.87) against log(0.74), log(0.73), log(0.72); lower is better for perplexity
    bottom = got[got["claim"] == claims.CLAIMS["pruning_bottom"]].set_index("model")
    r = np.log([0.74, 0.73, 0.72])
    assert bottom.loc["llm", "value"] == pytest.approx(-(np.log(0.87) - r.mean()) / r.std(ddof=1))
    assert bottom.loc["llm", "verdict"] == NOT_HERE and bottom.loc["enc", "verdict"] == HOLDS
    assert table2_cross_absent(got)


def table2_cross_absent(got):
    return claims.CLAIMS["table2_order"] not in set(got["claim"])  # one kind: nothing to compare


# -- replicates --------------------------------------------------------------------------------------
def test_a_paraproduct_replicate_scales_its_figure_heads_residuals(tmp_path):
    # 6 samples of one figure head (0, 0); replicate "ulp #1" makes samples 0-3 ten times worse
    ent = np.random.default_rng(5).random((6, 10))
    table = residuals([0.5] * 6, [0.9] * 6, [[2.0]] * 6)
    res = np.stack([np.full(6, 0.5), np.full(6, 0.5), np.r_[np.full(4, 5.0), np.full(2, 0.5)]], axis=1)[:, :, None]
    stab = xr.Dataset({"head_entropy": (("sample", "replicate", "unit"), np.repeat(ent[:, None], 3, 1)),
                       "sparsity_ratio": (("sample", "replicate"), np.full((6, 3), 0.5)),
                       "paraproduct_residual": (("sample", "replicate", "fig_head"), res)},
                      coords={"sample": np.arange(6), "fig_layer": ("fig_head", [0]),
                              "fig_head_index": ("fig_head", [0]),
                              "perturbation": ("replicate", np.array([REFERENCE, "ulp", "ulp"], dtype=object)),
                              "replicate_index": ("replicate", [0, 0, 1])})
    store.write_store(stab, tmp_path / "stab.zarr")
    reps = replicate_verdicts(tmp_path / "stab.zarr", ent, np.full(6, 1.0), np.full(6, 2.0), 0.2, table, None,
                              natural=np.full(6, 1.0))
    assert reps["paraproduct"] == [HOLDS, NOT_HERE]
    assert reps["sparsity"] == [NOT_HERE, NOT_HERE]  # below random trees, equal to the natural order
    assert len(reps["top_recurrence"]) == 2
    assert replicate_verdicts(tmp_path / "stab.zarr", ent, np.full(6, 1.0), np.full(6, 2.0), 0.2, table,
                              "no scores")["paraproduct"] == []


def test_theorem1_and_diffusion_replicates_change_only_their_replicated_samples(tmp_path):
    # 6 samples of figure head (0, 0) and 8 heads in 2 layers; samples 0-3 replicated: ulp #0 moves
    # nothing, ulp #1 triples Corollary 1's residual, lowers the residual's exponent by 0.4 and
    # scatters the heads across layers; sibling has no paraproduct
    table = residuals([0.5] * 6, [0.9] * 6, [[2.0]] * 6)
    table["corollary1_residual"] = 0.8 * table["residual"]
    table["alpha_softmax"] = 0.3
    table["alpha_residual"] = np.where(table["order"] == ORG, 0.6, 0.0)
    pert = np.array([REFERENCE, "ulp", "ulp", "sibling"], dtype=object)

    def fig(ref, ulp1):  # (sample, replicate, fig_head), on another scale than the table's
        return np.tile(np.array([ref, ref, ulp1, np.nan])[None, :, None], (4, 1, 1))

    layers = np.repeat([0, 1], 4)
    clustered = np.c_[10.0 * layers + np.linspace(0, 0.3, 8), np.zeros(8)]
    scattered = np.c_[[0.0, 2, 4, 6, 1, 3, 5, 7], np.zeros(8)]
    coords = np.stack([clustered, clustered, scattered, clustered])[None].repeat(4, 0)
    ent = np.random.default_rng(5).random((6, 8))
    stab = xr.Dataset({"head_entropy": (("sample", "replicate", "unit"), np.repeat(ent[:4, None], 4, 1)),
                       "sparsity_ratio": (("sample", "replicate"), np.full((4, 4), 0.5)),
                       "paraproduct_residual": (("sample", "replicate", "fig_head"), fig(0.25, 0.25)),
                       "corollary1_residual": (("sample", "replicate", "fig_head"), fig(0.1, 0.3)),
                       "alpha_softmax": (("sample", "replicate", "fig_head"), fig(0.2, 0.2)),
                       "alpha_residual": (("sample", "replicate", "fig_head"), fig(0.9, 0.5)),
                       "diffusion_coords": (("sample", "replicate", "unit", "component"), coords)},
                      coords={"sample": np.arange(4), "fig_layer": ("fig_head", [0]), "fig_head_index": ("fig_head", [0]),
                              "unit_layer": ("unit", layers), "perturbation": ("replicate", pert),
                              "replicate_index": ("replicate", [0, 0, 1, 0])})
    store.write_store(stab, tmp_path / "stab.zarr")
    reps = replicate_verdicts(tmp_path / "stab.zarr", ent, np.full(6, 1.0), np.full(6, 2.0), 0.25, table, None,
                              kind="vit", silhouettes=np.full(6, 0.8), pvalues=np.full(6, 0.005))
    assert reps["paraproduct"] == [HOLDS, HOLDS]
    # 1.2 against 0.72 in the original order for 4 of 6 head-samples; shifted, not replaced by the
    # replicate's 0.5 (above its softmax's 0.2) nor scaled (0.6 x 0.5 / 0.9 above 0.3)
    assert reps["corollary1"] == [HOLDS, NOT_HERE]
    assert reps["smoothness"] == [HOLDS, NOT_HERE]
    # 2 of 6 samples clustered by layer in ulp #1 (the unreplicated 4 and 5): mixed
    assert reps["diffusion"] == [HOLDS, MIXED, HOLDS]
    # without the model's kind or reference silhouettes, no diffusion verdicts
    assert replicate_verdicts(tmp_path / "stab.zarr", ent, np.full(6, 1.0), np.full(6, 2.0), 0.25, table,
                              None)["diffusion"] == []
