"""The claims table: baselines that can win, Theorem 1 as stated, one head one vote, nulls that fit
each sentence, verdicts from intervals and Holm-corrected p-values, and a summary stage whose
numbers are recomputed here from the stores and tables it read."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import claims, store
from oattn_lib.claims import EVERY_BASELINE, HOLDS, INCONCLUSIVE, NOT_HERE, NOT_RUN, PREMISE_NOT_MET, REPORTED
from oattn_lib.clustering import cluster_test
from oattn_lib.stability import REFERENCE
from oattn_lib.stages.summary import LOWEST_FIRST, NO_THEOREM1, RANDOM, residual_table, summary

ORG, ORIG, RND = claims.ORGANIZED, claims.ORIGINAL, claims.RANDOM_ORDERS
FAST = {"n_boot": 300, "seed": 0}


def decided(rows):
    """The rows after Holm's correction, by baseline."""
    final, _ = claims.finalize(rows)
    return {c.baseline: c for c in final}


def theorem1_table(n_samples, n_heads, org, orig=None, rnd=None, uniform=None, nocross=None, rng=None, **columns):
    """A theorem1 table: every (sample, head) of layer 0 in the three kinds of order; each argument a
    function (sample, head) -> value or a constant, for the organized row (orig, rnd: the residual
    in those orders)."""
    def val(f, s, h):
        return f(s, h) if callable(f) else f

    rows = []
    for s, h in itertools.product(range(n_samples), range(n_heads)):
        base = {"sample": s, "layer": 0, "head": h}
        o = {"residual": val(org, s, h), **({} if uniform is None else {"uniform_residual": val(uniform, s, h)}),
             **({} if nocross is None else {"residual_nocross": val(nocross, s, h)}),
             **{k: val(v, s, h) for k, v in columns.items()}}
        rows.append({**base, "order": ORG, "seed": -1, **o})
        if orig is not None:
            rows.append({**base, "order": ORIG, "seed": -1, "residual": val(orig, s, h)})
        if rnd is not None:
            rows += [{**base, "order": RND, "seed": k, "residual": val(rnd, s, h)} for k in range(2)]
    return pd.DataFrame(rows)


# -- chance, nulls ---------------------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(6, 1), (8, 3), (12, 4), (10, 10)])
def test_chance_jaccard_is_the_mean_over_all_pairs_of_sets(n, k):
    sets = [set(c) for c in itertools.combinations(range(n), k)]
    brute = np.mean([len(a & b) / len(a | b) for a in sets for b in sets])
    assert claims.chance_jaccard(n, k) == pytest.approx(brute)


def test_the_recurrence_null_sits_at_chance_and_depends_on_the_sizes_only():
    null = claims.recurrence_null(5, 30, 3, 4000, 0)
    assert null.mean() == pytest.approx(claims.chance_jaccard(30, 3), abs=0.005)
    assert np.array_equal(null, claims.recurrence_null(5, 30, 3, 4000, 0))


# -- sparsity ------------------------------------------------------------------------------------------
def test_sparsity_holds_only_where_the_organized_tensor_is_sparser_than_both_baselines():
    rng = np.random.default_rng(0)
    org = rng.uniform(0.5, 0.6, 10)
    rows = decided(claims.sparsity_rows("m", org, org / 0.8, org / 0.8, **FAST))
    assert rows[EVERY_BASELINE].verdict == HOLDS and rows["random trees"].effect == pytest.approx(-np.log(0.8))
    # as sparse as the natural order (within 1%): that baseline, and so the claim, does not hold
    rows = decided(claims.sparsity_rows("m", org, org / 0.8, org * rng.uniform(0.99, 1.01, 10), **FAST))
    assert rows["natural order (balanced trees)"].verdict == NOT_HERE and rows[EVERY_BASELINE].verdict == NOT_HERE
    assert rows["random trees"].verdict == HOLDS
    # 3% sparser is below the 5% margin: never holds, however consistent
    rows = decided(claims.sparsity_rows("m", org, org / 0.97, None, **FAST))
    assert rows["random trees"].verdict == NOT_HERE and rows["natural order (balanced trees)"].verdict == NOT_RUN


# -- recurrence ----------------------------------------------------------------------------------------
def test_recurrence_against_chance_and_beyond_the_heads_amplitude():
    rng = np.random.default_rng(1)
    amp = np.tile(np.linspace(1.0, 10.0, 100), (8, 1)) * rng.uniform(0.99, 1.01, (8, 100))
    # entropy a function of amplitude alone: its low heads recur, but nothing beyond amplitude
    ent = 3.0 * amp * rng.uniform(0.999, 1.001, amp.shape)
    rows = decided(claims.recurrence_rows("m", ent, 0.1, amplitude=amp, permutations=999, **FAST))
    assert rows["chance (random sets of the same size)"].verdict == HOLDS
    assert rows["the head's amplitude (entropy beyond its Frobenius norm)"].verdict == NOT_HERE
    assert rows[EVERY_BASELINE].verdict == NOT_HERE
    # entropy that also marks 10 heads low whatever their amplitude: beyond amplitude too
    ent2 = ent.copy()
    ent2[:, 40:50] /= 50.0
    rows = decided(claims.recurrence_rows("m", ent2, 0.1, amplitude=amp, permutations=999, **FAST))
    assert rows[EVERY_BASELINE].verdict == HOLDS
    # unrelated samples: at chance, does not hold
    rows = decided(claims.recurrence_rows("m", rng.random((8, 100)), 0.1, permutations=999, **FAST))
    c = rows["chance (random sets of the same size)"]
    assert c.verdict == NOT_HERE and c.p > 0.05 and abs(c.effect) < 0.03


def test_recurrence_effect_is_the_mean_pair_jaccard_minus_chance():
    e = np.random.default_rng(2).random((5, 20))
    c = claims.recurrence_rows("m", e, 0.2, "top", permutations=99, **FAST)[0]
    sets = [set(np.argsort(-s, kind="stable")[:4]) for s in e]
    jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2)])
    assert c.effect == pytest.approx(jac - claims.chance_jaccard(20, 4)) and c.key == "top_recurrence"
    assert claims.recurrence_rows("m", e[:1], 0.2)[0].verdict == NOT_RUN


# -- the approximations -----------------------------------------------------------------------------------
def test_a_paraproduct_that_uniform_attention_beats_does_not_hold_however_it_ranks():
    rng = np.random.default_rng(3)
    # organized below the original and random orders everywhere, but above uniform attention
    t = theorem1_table(4, 16, lambda s, h: 0.95 + 0.02 * rng.random(), orig=2.0, rnd=3.0, uniform=0.6, nocross=1.5)
    rows = decided(claims.approximation_rows("m", t, "paraproduct", **FAST))
    assert rows["uniform attention"].verdict == NOT_HERE and rows["uniform attention"].effect < 0
    assert rows["original order"].verdict == HOLDS and rows[EVERY_BASELINE].verdict == NOT_HERE
    # below uniform by more than 5% everywhere: holds
    t = theorem1_table(4, 16, lambda s, h: 0.3 + 0.02 * rng.random(), orig=2.0, rnd=3.0, uniform=0.6, nocross=1.5)
    assert decided(claims.approximation_rows("m", t, "paraproduct", **FAST))[EVERY_BASELINE].verdict == HOLDS


def test_cross_terms_that_change_nothing_leave_the_claim_undecided_or_failed():
    t = theorem1_table(4, 16, 0.3, orig=2.0, rnd=3.0, uniform=0.6, nocross=lambda s, h: 0.3 * (1 + 0.001 * h))
    rows = decided(claims.approximation_rows("m", t, "paraproduct", **FAST))
    assert rows["no cross terms (A″ Dx Dy dropped)"].verdict == NOT_HERE
    assert rows[EVERY_BASELINE].verdict == NOT_HERE


def test_one_head_on_48_samples_decides_nothing():
    t = theorem1_table(48, 1, 0.1, orig=2.0, rnd=3.0, uniform=0.9, nocross=0.5)
    rows = decided(claims.approximation_rows("m", t, "paraproduct", **FAST))
    for name in ("uniform attention", "original order"):
        assert rows[name].n_units == 1 and not rows[name].p < 0.05 and rows[name].verdict == INCONCLUSIVE


def test_an_undefined_or_unrepresentable_residual_counts_as_far_worse():
    t = theorem1_table(3, 10, np.inf, orig=2.0, rnd=3.0, uniform=0.6, nocross=np.inf)
    rows = decided(claims.approximation_rows("m", t, "paraproduct", **FAST))
    assert rows["original order"].effect == -claims.CLIP and rows["original order"].verdict == NOT_HERE
    assert rows["no cross terms (A″ Dx Dy dropped)"].effect == 0.0        # both undefined: a tie


def test_each_approximation_reads_its_own_columns_and_says_when_they_are_missing():
    t = theorem1_table(3, 8, 0.3, orig=0.9, rnd=0.9, uniform=0.9, nocross=0.9,
                       corollary1_residual=2.0, corollary1_nocross=3.0)
    t.loc[t["order"] != ORG, "corollary1_residual"] = 4.0
    cor = decided(claims.approximation_rows("m", t, "corollary1", **FAST))
    assert cor["uniform attention"].verdict == NOT_HERE          # 2.0 against uniform's 0.9
    assert cor["original order"].effect == pytest.approx(np.log(2.0))
    taylor = claims.approximation_rows("m", t, "corollary1_taylor", **FAST)
    assert [c.verdict for c in taylor] == [NOT_RUN] and "taylor_residual" in taylor[0].measured
    assert claims.approximation_rows("m", None, "paraproduct", not_run="no scores")[0].verdict == NOT_RUN


# -- Theorem 1 as stated ------------------------------------------------------------------------------
def test_theorem1_reads_premise_not_met_where_no_head_meets_it():
    t = theorem1_table(3, 8, 0.3, alpha_scores=-0.8, alpha_residual=0.9, alpha_softmax=-0.5)
    row = decided(claims.smoothness_row("m", t, **FAST))
    (c,) = row.values()
    assert c.verdict == PREMISE_NOT_MET and "0/8 heads" in c.measured


def test_theorem1_on_the_heads_that_meet_its_premise_compares_with_twice_their_exponent():
    rng = np.random.default_rng(4)
    # 12 of 16 heads meet the premise (alpha 0.3); their residual at 0.62 +- 0.02: at least 2 alpha
    def a(s, h):
        return 0.3 if h < 12 else 0.8

    t = theorem1_table(3, 16, 0.3, alpha_scores=a, alpha_residual=lambda s, h: 0.62 + 0.02 * rng.standard_normal(),
                       alpha_softmax=0.2)
    (c,) = decided(claims.smoothness_row("m", t, **FAST)).values()
    assert c.verdict == HOLDS and c.n_units == 12 and "12/16 heads" in c.measured
    # the residual no smoother than the scores (0.3 against 2 x 0.3): the bound fails
    t = theorem1_table(3, 16, 0.3, alpha_scores=a, alpha_residual=lambda s, h: 0.3 + 0.02 * rng.standard_normal(),
                       alpha_softmax=0.2)
    (c,) = decided(claims.smoothness_row("m", t, **FAST)).values()
    assert c.verdict == NOT_HERE and c.effect == pytest.approx(-0.3, abs=0.02)
    assert claims.smoothness_row("m", t.drop(columns="alpha_scores"))[0].verdict == NOT_RUN


# -- pruning ---------------------------------------------------------------------------------------------
def bottom_table(haar, null, k=27, n_units=270, exact=False, higher=True, log_metric=False, others=()):
    rows = [{"set": LOWEST_FIRST, "index": 0, "heads": "", "value": haar}]
    rows += [{"set": name, "index": 0, "heads": "", "value": v} for name, v in others]
    rows += [{"set": "null", "index": i, "heads": "", "value": v} for i, v in enumerate(null)]
    return pd.DataFrame(rows).assign(k=k, n_units=n_units, null="exact" if exact else "random", n_null=len(null),
                                     n_sets_total=int(__import__("math").comb(n_units, k)), metric="accuracy",
                                     higher_is_better=higher, log_metric=log_metric)


def test_the_bottom_row_masks_exactly_round_tenth_of_the_heads_and_ranks_among_every_set():
    from oattn_lib.entropy import n_extreme
    assert n_extreme(270, 0.1) == 27
    rng = np.random.default_rng(5)
    (c,) = claims.pruning_bottom_row("m", bottom_table(0.9, rng.uniform(0.5, 0.8, 199)), **FAST)
    assert "27 of 270" in c.measured and c.p == pytest.approx(1 / 200) and c.unit.startswith("set of 27")
    # exact: the Haar set is one of the 120 sets of 2 of 16 heads; second best of them
    null = np.r_[np.linspace(0.1, 0.8, 118), 0.85, 0.9]
    (c,) = claims.pruning_bottom_row("m", bottom_table(0.85, null, k=2, n_units=16, exact=True,
                                                       others=[("confidence (Voita et al.), lowest first", 0.9)]),
                                     **FAST)
    assert c.p == pytest.approx(2 / 120) and c.ci_low == c.ci_high == c.effect and "p = 0.0083" in c.measured
    # lower is better (perplexity, in log): the best set is the lowest
    (c,) = claims.pruning_bottom_row("m", bottom_table(10.0, np.full(50, 20.0), higher=False, log_metric=True),
                                     **FAST)
    assert c.effect == pytest.approx(np.log(2.0)) and "compared in log" in c.measured


def test_pruning_with_few_random_orders_cannot_hold_at_any_effect():
    rows, _ = claims.finalize(claims.pruning_row("m", 0.99, [0.5, 0.51, 0.52], **FAST))
    assert rows[0].verdict == INCONCLUSIVE and rows[0].p == 0.25 and np.isinf(rows[0].mde)
    assert claims.pruning_row("m", None, None)[0].verdict == NOT_RUN


# -- Table 2 ---------------------------------------------------------------------------------------------
def test_table2_order_is_judged_between_txl_and_vit_only():
    txl = ("txl", [1200.0, 2400.0] * 3, np.linspace(0.9, 1.0, 6))
    vit = ("vit", [2.0, 9.0] * 3, np.linspace(0.5, 0.6, 6))
    big = ("hf", [1e6] * 6, np.full(6, 50.0))
    rows = claims.table2_order_rows({"t": txl, "v": vit, "llm": big}, **FAST)
    final = {c.model: c for c in claims.finalize(rows)[0]}
    assert final["t vs v"].verdict == HOLDS and final["other pairs"].verdict == REPORTED
    assert "llm" in final["other pairs"].measured and "llm" not in final["t vs v"].model
    # reversed on the scale-free measure: does not hold, whatever the raw numbers
    rows = claims.table2_order_rows({"t": txl, "v": ("vit", vit[1], np.linspace(1.5, 1.6, 6)), "llm": big}, **FAST)
    assert {c.model: c for c in claims.finalize(rows)[0]}["t vs v"].verdict == NOT_HERE
    # no txl-vit pair: not run
    rows = claims.table2_order_rows({"t": txl, "llm": big}, **FAST)
    assert rows[0].verdict == NOT_RUN and claims.table2_order_rows({"a": txl, "b": txl}) == []


# -- diffusion -------------------------------------------------------------------------------------------
def blobs(rng, n=24):
    centres = np.array([[0, 0, 0], [4, 0, 0], [0, 4, 0]], dtype=float)
    return np.concatenate([rng.normal(c, 0.2, (n // 3, 3)) for c in centres])


def test_diffusion_reads_clusters_against_a_continuous_cloud_without_labels():
    rng = np.random.default_rng(6)
    clustered = [cluster_test(blobs(rng), 39, i) for i in range(6)]
    cloud = [cluster_test(rng.normal(size=(24, 3)) * [3, 1, 0.5], 39, i) for i in range(6)]
    assert decided(claims.diffusion_row("v", "vit", clustered, **FAST)).popitem()[1].verdict == HOLDS
    assert decided(claims.diffusion_row("v", "vit", cloud, **FAST)).popitem()[1].verdict != HOLDS
    assert decided(claims.diffusion_row("t", "txl", clustered, **FAST)).popitem()[1].verdict == NOT_HERE
    assert "layer" not in claims.diffusion_row("t", "txl", cloud, **FAST)[0].measured


# -- verdicts, tables ------------------------------------------------------------------------------------
def test_holm_spans_the_whole_table_and_a_summary_row_takes_the_largest_adjusted_p():
    org = np.random.default_rng(7).uniform(0.5, 0.6, 6)
    rows = claims.sparsity_rows("m", org, org / 0.8, org / 0.9, **FAST)
    alone, _ = claims.finalize(rows)
    crowded, mult = claims.finalize(rows + claims.sparsity_rows("n", org, org / 0.8, org / 0.9, **FAST))
    a = {c.baseline: c for c in alone}
    b = {(c.model, c.baseline): c for c in crowded}
    assert b[("m", "random trees")].p_adjusted > a["random trees"].p_adjusted
    assert b[("m", EVERY_BASELINE)].p_adjusted == max(b[("m", "random trees")].p_adjusted,
                                                      b[("m", "natural order (balanced trees)")].p_adjusted)
    assert sorted(mult.values()) == [1, 2, 3, 4]
    # redecide with the table's multipliers: the same rows, the same verdicts
    again = claims.redecide(rows, mult)
    assert again[("sparsity", "m", "random trees")] == b[("m", "random trees")].verdict


def test_claims_rst_is_one_table_with_a_row_per_test():
    from docutils.core import publish_doctree
    org = np.full(6, 0.5) * np.linspace(1, 1.01, 6)
    rows, _ = claims.finalize(claims.sparsity_rows("a_b", org, org / 0.8, None, **FAST)
                              + claims.pruning_row("a*b", None, None))
    tree = publish_doctree(claims.claims_rst(rows))
    tables = [n for n in tree.findall() if n.tagname == "table"]
    assert len(tables) == 1
    assert len([n for n in tables[0].findall() if n.tagname == "row"]) == len(rows) + 1
    text = tables[0].astext()
    assert "a_b" in text and "a*b" in text and NOT_RUN in text and HOLDS in text


def test_verdict_text_says_what_flips():
    assert claims.verdict_text(HOLDS, [HOLDS, HOLDS], "halves") == "same in 2/2 halves"
    assert claims.verdict_text(HOLDS, [HOLDS, NOT_HERE], "halves") == f"flips in 1/2 halves ({NOT_HERE} in 1)"
    assert claims.verdict_text(HOLDS, [], "halves") == ""


# -- the summary stage, on files written here ---------------------------------------------------------
SETTINGS = {"bootstrap": 200, "permutations": 199, "null_draws": 19, "seed": 0}


def write_model(root, name, rng, n_s=6, layers=3, heads=4, prune=True, natural=True, masked="",
                theorem1=True, sparser=0.8):
    e = rng.random((n_s, layers, heads)) * 10 + 1
    e[:, 0, 0] = 0.1  # one head at the bottom in every sample
    s = rng.uniform(1.0, 1.1, n_s)
    ent = xr.Dataset({"head_entropy": (("sample", "layer", "head"), e),
                      "head_l2": (("sample", "layer", "head"), rng.random((n_s, layers, heads)) + 1),
                      "network_sparsity": ("sample", s), "network_sparsity_random": ("sample", s / sparser),
                      "network_entropy": ("sample", rng.random(n_s) * 100 + 1),
                      "network_l2": ("sample", rng.random(n_s) + 1)},
                     coords={"sample": np.arange(n_s), "layer": np.arange(layers), "head": np.arange(heads)},
                     attrs={"masked": masked, "masked_filled": 10} if masked else {})
    if natural:
        ent["network_sparsity_natural"] = ("sample", s / sparser)
    store.write_store(ent, root / f"{name}_entropy.zarr")
    pd.DataFrame({"model": name, "set": ["top"] * 3 + ["bottom"] * 3, "rank": [1, 2, 3] * 2,
                  "layer": [1, 2, 2, 0, 1, 2], "head": [1, 2, 3, 0, 0, 1],
                  "count": ["2/6", "1/6", "1/6", "6/6", "2/6", "1/6"], "mean_entropy": 1.0}
                 ).to_csv(root / f"{name}_t1.csv", index=False)
    (root / f"{name}_temp.json").write_text(json.dumps({
        "crossover": {"original": {"text": "below the original order's for tau < 2.5 (crossover)"},
                      "random": {"text": "below the random orders' over the whole range (no crossover)"}}}))
    rows = []
    for smp, (la, he) in itertools.product(range(3), [(0, 1), (2, 3)]):
        rows += [{"sample": smp, "layer": la, "head": he, "order": o, "seed": -1, "tau": 1.0, "rel_residual": r}
                 for o, r in ((ORG, 0.3), (ORIG, 0.6))]
    pd.DataFrame(rows).to_csv(root / f"{name}_temp.csv", index=False)
    if theorem1:
        t = theorem1_table(n_s, heads, lambda a, b: 0.3 + 0.01 * b, orig=0.9, rnd=1.2, uniform=0.8, nocross=0.6,
                           alpha_scores=0.3, alpha_residual=0.7, alpha_softmax=0.1)
        t.to_csv(root / f"{name}_theorem1.csv", index=False)
    unit_layer, unit_head = np.repeat(np.arange(layers), heads), np.tile(np.arange(heads), layers)
    for smp in range(n_s):
        coords = rng.normal(size=(layers * heads, 3)) * 0.05 + unit_layer[:, None] * 1.0
        store.write_store(xr.Dataset({"diffusion_coords": (("unit", "component"), coords)},
                                     coords={"unit_layer": ("unit", unit_layer), "unit_head": ("unit", unit_head)}),
                          root / f"{name}_dec{smp}.zarr")
    pd.DataFrame({"model": name, "metric": "accuracy", "higher_is_better": True, "auc_of": "accuracy",
                  "ranking": [LOWEST_FIRST, RANDOM], "auc": [0.6, 0.7], "auc_sd": [np.nan, 0.02]}
                 ).to_csv(root / f"{name}_t3.csv", index=False)
    n_units, ks = layers * heads, [0, 1, 3, 6, 12]
    curves = [{"ranking": LOWEST_FIRST, "order": 0, "k": k, "fraction": k / n_units, "accuracy": 0.9 - 0.01 * k}
              for k in ks]
    curves += [{"ranking": RANDOM, "order": j, "k": k, "fraction": k / n_units, "accuracy": 0.8 - 0.02 * k - 0.01 * j}
               for j in range(3) for k in ks]
    pd.DataFrame(curves).to_csv(root / f"{name}_curves.csv", index=False)
    bottom_table(0.87, np.r_[np.linspace(0.5, 0.86, 65), 0.87], k=2, n_units=12, exact=True).to_csv(root / f"{name}_bottom.csv",
                                                                                       index=False)
    for t in (1, 2, 3, 4):
        (root / f"{name}_t{t}.md").write_text(f"table {t} of {name}\n")
    inputs = {f"entropy_{name}": root / f"{name}_entropy.zarr", f"table1csv_{name}": root / f"{name}_t1.csv",
              f"temperature_{name}": root / f"{name}_temp.json", f"temperaturecsv_{name}": root / f"{name}_temp.csv",
              f"decomposed_{name}": [root / f"{name}_dec{smp}.zarr" for smp in range(n_s)],
              **{f"table{t}_{name}": root / f"{name}_t{t}.md" for t in (1, 2)}}
    if theorem1:
        inputs[f"theorem1_{name}"] = root / f"{name}_theorem1.csv"
    if prune:
        inputs.update({f"table3csv_{name}": root / f"{name}_t3.csv", f"curves_{name}": root / f"{name}_curves.csv",
                       f"bottom_{name}": root / f"{name}_bottom.csv",
                       **{f"table{t}_{name}": root / f"{name}_t{t}.md" for t in (3, 4)}})
    return inputs


def run_summary(tmp_path, kinds, inputs):
    outs = {"md": tmp_path / "summary.md", "claims_csv": tmp_path / "claims.csv", "claims_rst": tmp_path / "claims.rst"}
    summary(kinds, inputs, outs, 0.25, SETTINGS)
    return pd.read_csv(outs["claims_csv"]), outs


def test_summary_opens_with_the_claims_recomputed_from_its_inputs(tmp_path):
    rng = np.random.default_rng(0)
    inputs = {**write_model(tmp_path, "vit_a", rng), **write_model(tmp_path, "txl-b", rng, prune=False, natural=False)}
    got, outs = run_summary(tmp_path, {"vit_a": "vit", "txl-b": "txl"}, inputs)
    assert list(got.columns) == claims.COLUMNS
    keys = list(dict.fromkeys(got["key"]))
    assert keys == [k for k in claims.CLAIMS if k in keys]                     # grouped in the order of CLAIMS
    row = got.set_index(["key", "model", "baseline"])
    for name in ("vit_a", "txl-b"):
        ent = store.read_store(tmp_path / f"{name}_entropy.zarr")
        ratio = np.log(ent["network_sparsity_random"].values / ent["network_sparsity"].values)
        assert row.loc[("sparsity", name, "random trees"), "effect"] == pytest.approx(ratio.mean())
        # bottom 25% (3 of 12 heads) by sorting, their Jaccard over every pair of samples, minus chance
        e = ent["head_entropy"].values.reshape(6, -1)
        sets = [set(np.argsort(s, kind="stable")[:3]) for s in e]
        jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.combinations(sets, 2)])
        chance_row = row.loc[("recurrence", name, "chance (random sets of the same size)")]
        assert chance_row["effect"] == pytest.approx(jac - claims.chance_jaccard(12, 3))
        assert chance_row["unit"] == "sample" and chance_row["n_units"] == 6
        para = row.loc[("paraproduct", name, "uniform attention")]
        assert para["unit"] == "head" and para["n_units"] == 4
        assert para["effect"] == pytest.approx(np.mean([np.log(0.8 / (0.3 + 0.01 * h)) for h in range(4)]))
    assert row.loc[("sparsity", "txl-b", "natural order (balanced trees)"), "verdict"] == NOT_RUN
    assert row.loc[("paraproduct", "vit_a", EVERY_BASELINE), "verdict"] == INCONCLUSIVE   # 4 heads < 5 units
    assert row.loc[("pruning", "txl-b", "random head orders"), "verdict"] == NOT_RUN
    bottom = row.loc[("pruning_bottom", "vit_a", "every set of as many heads")]
    assert bottom["p"] == pytest.approx(1 / 66) and "2 of 12" in bottom["measured"]
    cross = got[got["key"] == "table2_order"].iloc[0]
    assert cross["model"] == "txl-b vs vit_a" and cross["unit"] == "sample"
    both = got.dropna(subset=["p", "p_adjusted"])
    assert (both["p_adjusted"] >= both["p"]).all() and both["p_adjusted"].max() <= 1.0
    # every tested row says whether it replicates on halves of its samples; pruning cannot
    tested = got[got["p"].notna()]
    assert tested[~tested["key"].str.startswith("pruning")]["split_half"].str.contains("halves").all()
    assert (tested[tested["key"].str.startswith("pruning")]["split_half"] == "not applicable: one ablation run").all()
    md = outs["md"].read_text()
    assert md.index("### the organized network is sparse") < md.index("## vit_a") < md.index("table 3 of vit_a")
    assert "table 3 of txl-b" not in md and "Holm" in md and "crossover" in md
    assert outs["claims_rst"].read_text().startswith(".. list-table::")


def test_a_causal_model_gives_its_verdicts_under_both_masked_rules(tmp_path):
    rng = np.random.default_rng(1)
    inputs = write_model(tmp_path, "t", rng, masked="row_mean", sparser=0.8)
    other = write_model(tmp_path / "..", "t_keep", np.random.default_rng(1), sparser=1.0)   # no gain under keep
    inputs["maskedentropy_t"] = other["entropy_t_keep"]
    inputs["maskeddecomposed_t"] = other["decomposed_t_keep"]
    got, _ = run_summary(tmp_path, {"t": "txl"}, inputs)
    row = got.set_index(["key", "baseline"])
    s = row.loc[("sparsity", "random trees")]
    assert s["verdict"] == HOLDS and s["masked_rule"] == "row_mean"
    assert s["other_masked_rule"] == f"keep: {NOT_HERE} (the verdict flips)"
    assert row.loc[("paraproduct", "uniform attention"), "masked_rule"] != "row_mean"   # not on the expansions


def test_the_theorem1_table_decides_and_the_temperature_curves_stand_in_without_it(tmp_path):
    rng = np.random.default_rng(2)
    inputs = write_model(tmp_path, "m", rng, theorem1=False)
    got, _ = run_summary(tmp_path, {"m": "vit"}, inputs)
    row = got.set_index(["key", "baseline"])
    assert row.loc[("paraproduct", "uniform attention"), "verdict"] == NOT_RUN
    assert row.loc[("paraproduct", "original order"), "n_units"] == 2            # the two figure heads
    assert NO_THEOREM1 in row.loc[("smoothness", "2α of the scores (Theorem 1's bound), heads meeting its premise"),
                                  "measured"]


def test_residual_table_takes_tau_one_of_the_temperature_curves(tmp_path):
    write_model(tmp_path, "m", np.random.default_rng(4))
    table, source = residual_table(None, tmp_path / "m_temp.csv")
    assert list(table.columns) == ["sample", "layer", "head", "order", "seed", "residual"]
    assert len(table) == 3 * 2 * 2 and source == "the temperature figure's heads"
    assert set(table.loc[table["order"] == ORG, "residual"]) == {0.3}
    assert residual_table(None, None) == (None, "")


def test_a_replicate_that_moves_a_verdict_is_reported_as_a_flip(tmp_path):
    rng = np.random.default_rng(5)
    inputs = write_model(tmp_path, "m", rng, prune=False)
    ent = store.read_store(tmp_path / "m_entropy.zarr")["head_entropy"].values.reshape(6, -1)
    # samples 0-2 replicated: the ulp replicates leave everything, the float16 one makes those samples'
    # organized tensor as dense as random trees (ratio 1)
    pert = np.array([REFERENCE, "ulp", "ulp", "float16"], dtype=object)
    ratio = np.tile([0.8, 0.8, 0.8, 1.0], (3, 1))
    coords = np.stack([store.read_store(tmp_path / f"m_dec{s}.zarr")["diffusion_coords"].values for s in range(3)])
    stab = xr.Dataset({"head_entropy": (("sample", "replicate", "unit"), np.repeat(ent[:3, None], 4, 1)),
                       "sparsity_ratio": (("sample", "replicate"), ratio),
                       "diffusion_coords": (("sample", "replicate", "unit", "component"),
                                            np.repeat(coords[:, None], 4, 1))},
                      coords={"sample": np.arange(3), "perturbation": ("replicate", pert),
                              "replicate_index": ("replicate", [0, 0, 1, 0])})
    store.write_store(stab, tmp_path / "stab.zarr")
    got, _ = run_summary(tmp_path, {"m": "vit"}, {**inputs, "stability_m": tmp_path / "stab.zarr"})
    row = got.set_index(["key", "baseline"])
    s = row.loc[("sparsity", "random trees")]
    assert s["verdict"] == HOLDS and s["numerically_robust"].startswith("flips in 1/3 numerical replicates")
    assert row.loc[("recurrence", "chance (random sets of the same size)"), "numerically_robust"] \
        .startswith("same in 3/3")
