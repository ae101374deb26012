"""Two analyses side by side (`oattn_lib.compare`): a planted pair of heads that swap places between
two sets of samples is found and nothing else is; the per-sample measures do not depend on the
tensor's scale; the exact permutation test is the enumeration it claims to be."""
from __future__ import annotations

from itertools import combinations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import oattn_lib
from oattn_lib.comparison import NOT_SHOWN, load_side, two_sample

# each head's sharpness: the logits' scale, far enough apart that the heads' entropy ranks are
# steady from sample to sample
SHARPNESS = np.array([0.0, 0.4, 1.0, 1.8, 2.8, 4.0, 5.5, 7.5])
SWAPPED = ((0, 1), (1, 2))  # (layer, head) of the planted pair: heads 1 and 6 of the flat order
FAST = {"organize": {"n_iters": 1}, "decompose": {"questionnaire2d_iters": 1, "random_tree_seeds": 1},
        "entropy": {"head_top_k": 16, "network_top_k": 16}, "progress": False}


def network(sharpness: np.ndarray, n_samples: int, seed: int, n_tokens: int = 12, scale: float = 1.0) -> list:
    """Samples of a synthetic network of 2 layers x 4 heads: each head's probabilities a softmax
    of random logits times its sharpness."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_samples):
        logits = rng.normal(size=(8, n_tokens, n_tokens)) * sharpness[:, None, None]
        p = np.exp(logits - logits.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out.append(xr.Dataset({"probs": (("layer", "head", "query", "key"),
                                         (scale * p).reshape(2, 4, n_tokens, n_tokens).astype(np.float32))},
                              coords={"layer": [0, 1], "head": [0, 1, 2, 3], "query": np.arange(n_tokens),
                                      "key": np.arange(n_tokens)}, attrs={"model": "synthetic", "kind": "attention"}))
    return out


N = 6  # samples a side: the exact test's smallest two-sided p-value is 2 / C(12, 6), 0.0022


@pytest.fixture(scope="module")
def planted():
    swapped = SHARPNESS.copy()
    swapped[[1, 6]] = swapped[[6, 1]]
    a = oattn_lib.analyze(network(SHARPNESS, N, seed=1), name="a", **FAST)
    b = oattn_lib.analyze(network(swapped, N, seed=2), name="b", **FAST)
    return a, b


@pytest.fixture(scope="module")
def again():
    """a's network on new samples."""
    return oattn_lib.analyze(network(SHARPNESS, N, seed=3), name="a2", **FAST)


def test_a_planted_pair_of_heads_is_found_and_nothing_else(planted, again):
    a, b = planted
    c = oattn_lib.compare(a, b, permutations=999, bootstrap=500)
    assert c.heads["p"].min() == pytest.approx(2 / 924)  # every relabelling of 6 + 6 samples
    h = c.heads.set_index(["layer", "head"])
    changed = set(h.index[h["changed"]])
    assert changed == set(SWAPPED), c.heads
    # the head made sharper moves up the entropy ranking, the one made flatter down
    assert h.loc[SWAPPED[0], "rank_change"] > 0 > h.loc[SWAPPED[1], "rank_change"]
    assert h.loc[SWAPPED[0], "verdict"] == "rank changed: higher entropy in b"
    assert (h.drop(list(SWAPPED))["verdict"] == NOT_SHOWN).all()
    assert np.isnan(h["margin"]).all()  # no replicates: no noise floor measured, and the table says so
    # the same network on new samples: no head changes (the baseline can win)
    assert not oattn_lib.compare(a, again, permutations=999, bootstrap=500).heads["changed"].any()


def test_the_measures_of_two_models_do_not_depend_on_scale(planted):
    """b's tensors times 7 are the same network for every scale-free measure: each difference is
    0 (a raw entropy would be 7 times larger), and no verdict says otherwise."""
    a, _ = planted
    scaled = oattn_lib.analyze(network(SHARPNESS, N, seed=1, scale=7.0), name="scaled", **FAST)
    c = oattn_lib.compare(a, scaled, heads=False, permutations=999, bootstrap=500)
    assert c.heads is None
    tested = c.models[c.models["unit"] == "sample"]
    assert len(tested) == 3
    np.testing.assert_allclose(tested["difference"], 0, atol=1e-5)
    assert (tested["verdict"] == "no difference shown").all()
    raw_a = a.heads["head_entropy"].mean()
    assert scaled.heads["head_entropy"].mean() == pytest.approx(7 * raw_a, rel=1e-4)


def test_two_networks_differ_where_one_is_nearly_uniform(planted, again):
    """Heads 20 times flatter are nearly constant: their energy sits in the constant Haar function,
    so their scale-free entropy falls; the same sharpness on new samples shows no difference."""
    a, _ = planted
    flat = oattn_lib.analyze(network(SHARPNESS * 0.05, N, seed=4), name="flat", **FAST)
    c = oattn_lib.compare(a, flat, heads=False, permutations=999, bootstrap=500)
    row = c.models.set_index("measure").loc["median_head_entropy_scale_free"]
    assert row["verdict"] == "lower in b" and row["ci_high"] < 0 and row["p_adjusted"] < 0.05
    assert row["a_low"] <= row["a"] <= row["a_high"] and row["b_low"] <= row["b"] <= row["b_high"]
    same = oattn_lib.analyze(network(SHARPNESS, 8, seed=4), name="same", **FAST)
    tested = oattn_lib.compare(a, same, heads=False, permutations=999, bootstrap=500).models
    assert (tested[tested["unit"] == "sample"]["verdict"] == "no difference shown").all()


def test_the_exact_permutation_test_is_the_enumeration():
    rng = np.random.default_rng(5)
    xa, xb = rng.normal(size=(4, 3)), rng.normal(size=(3, 3)) + [0.0, 2.0, -1.0]
    t = two_sample(xa, xb, permutations=1000, bootstrap=200, seed=0)
    assert t["exact"]
    pooled, obs = np.vstack([xa, xb]), xb.mean(0) - xa.mean(0)
    null = np.array([pooled[list(c)].mean(0) - np.delete(pooled, list(c), 0).mean(0)
                     for c in combinations(range(7), 3)])
    np.testing.assert_allclose(t["p"], (np.abs(null) >= np.abs(obs) - 1e-12).mean(0))
    np.testing.assert_allclose(t["difference"], obs)
    mc = two_sample(xa, xb, permutations=20, bootstrap=200, seed=0)
    assert not mc["exact"] and (mc["p"] >= 1 / 21).all()


def test_the_page_and_figure_say_what_the_verdicts_mean(planted, tmp_path):
    a, b = planted
    c = oattn_lib.compare(a, b, permutations=199, bootstrap=200)
    fig = c.figure()
    assert len([ax for ax in fig.axes if ax.get_title()]) == 5
    page = c.page(tmp_path / "c.html").read_text()
    assert "not shown to change" in page and "is no evidence that it stays" in page
    assert "data:image/png;base64," in page and "<h2>Heads" in page
    with pytest.raises(ValueError, match="no heads.parquet"):
        load_side(tmp_path)
    from oattn_lib.comparison import Side, head_changes
    cut = b.heads[b.heads["layer"] == 0]
    with pytest.raises(ValueError, match="cut: has no head layer 1"):
        head_changes(load_side(a), Side("cut", cut, b.head_summary, b.table2))
    assert isinstance(c.models, pd.DataFrame)


def test_the_config_names_its_pairs_and_says_which_compare_head_by_head():
    from oattn_lib.config import ConfigError, compare_pairs

    models = [{"name": "lm", "kind": "hf", "path": "minilm"}, {"name": "lm2", "kind": "hf", "path": "minilm"},
              {"name": "txl", "kind": "txl"}, {"name": "vit", "kind": "vit"},
              {"name": "big", "kind": "hf", "path": "smollm2"}]
    pairs = compare_pairs({"models": models, "compare": [{"a": "lm", "b": "lm2"}, {"a": "txl", "b": "vit"},
                                                          {"a": "lm", "b": "big"},
                                                          {"a": "vit", "b": "txl", "heads": True}]})
    assert [p["heads"] for p in pairs] == [True, False, False, True]
    for bad, key in (({"a": "lm", "b": "nope"}, "compare[0].b: 'nope'"), ({"a": "lm", "b": "lm"}, "with itself")):
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            compare_pairs({"models": models, "compare": [bad]})
    with pytest.raises(ConfigError, match="listed twice"):
        compare_pairs({"models": models, "compare": [{"a": "lm", "b": "lm2"}, {"a": "lm", "b": "lm2"}]})


@pytest.mark.workflow
def test_the_workflow_compares_two_models_of_its_run(clean_run):
    """txl against vit in the tiny run, named in its config: only the compare job runs; two models
    are not compared head by head, and the page says so; the measures are the library's on the
    run's own tables; a pair naming no model stops the run at its start, naming the key."""
    from wfutil import TINY, snakemake

    from oattn_lib.comparison import load_side, model_differences

    cfg = {**TINY, "compare": [{"a": "txl", "b": "vit"}]}
    proc = snakemake(clean_run, cfg, "results/compare/txl_vs_vit/compare.html")
    log = proc.stdout + proc.stderr
    assert "rule compare" in log and "rule heads" not in log and "rule decompose" not in log
    out = clean_run / "results" / "compare" / "txl_vs_vit"
    models = pd.read_csv(out / "models.csv")
    claims = TINY["claims"]
    want = model_differences(load_side(clean_run / "results" / "txl"), load_side(clean_run / "results" / "vit"),
                             permutations=claims["permutations"], bootstrap=claims["bootstrap"], seed=0)
    pd.testing.assert_frame_equal(models, want, check_dtype=False, rtol=1e-9)
    assert pd.read_csv(out / "heads.csv").empty
    assert "Not compared head by head" in (out / "compare.html").read_text()
    proc = snakemake(clean_run, {**TINY, "compare": [{"a": "txl", "b": "nope"}]}, "-n", check=False)
    assert proc.returncode and "compare[0].b: 'nope' is not a model's name" in proc.stderr + proc.stdout
