"""The analysis under the other rule for masked entries (docs/method.md §9.5): which models get it,
and what it changes: exactly what the rule touches, and nothing for a store with no masked entry."""
from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
import xarray as xr

from oattn_lib import store
from oattn_lib.both_masked import OTHER_RULE, other_rule
from oattn_lib.plan import both_masked_models
from oattn_lib.config import SCHEMA, validate_config
from oattn_lib.network import MASKED, allowed_mask, read_network
from oattn_lib.stages.entropy import entropy
from oattn_lib.stages.masked_other import masked_entries, masked_other
from scored_stores import scored_samples

DECOMPOSE = {"figure_heads": [[0, 0], [-1, -1]], "questionnaire2d_iters": 2, "random_tree_seeds": 1}
TOP_K = {"head_top_k": 16, "network_top_k": 10}


def test_every_scores_model_gets_the_other_rule_and_no_probs_model():
    from wfutil import TINY

    assert set(OTHER_RULE) == set(MASKED) and all(other_rule(other_rule(r)) == r != other_rule(r) for r in MASKED)
    with pytest.raises(ValueError, match="extract.masked: 'zero'; allowed: row_mean, keep"):
        other_rule("zero")
    cfg = copy.deepcopy(TINY)
    # txl analyses scores (its default rule row_mean), vit and lm probabilities; lm on scores with keep
    cfg["models"][2]["extract"] |= {"quantity": "scores", "masked": "keep"}
    validate_config(cfg, str(SCHEMA))
    assert both_masked_models(cfg) == {"txl": "keep", "lm": "row_mean"}
    cfg["claims"]["both_masked"] = False
    assert both_masked_models(cfg) == {}


@pytest.fixture(scope="module")
def analyses(tmp_path_factory):
    """For a causal and a non-causal network of scores (2 samples, 2 layers x 2 heads, 16 tokens):
    the main analysis (row_mean) through the stages, and masked_other's under keep."""
    out = {}
    for causal in (True, False):
        root = tmp_path_factory.mktemp(f"causal{causal}")
        paths = scored_samples(root, np.random.default_rng(3), (2, 2, 16), causal)
        att, dec = [p[0] for p in paths], [p[1] for p in paths]
        entropy(dec, root / "entropy.zarr", **TOP_K)
        other = {k: [root / "keep" / f"{k}{s}.zarr" for s in range(2)] for k in ("organized", "decomposed")}
        masked_other(att, other["organized"], other["decomposed"], root / "keep" / "entropy.zarr",
                     analysis={"quantity": "scores", "crop": None, "masked": "keep"}, organize_params={"n_iters": 1},
                     decompose_params=DECOMPOSE, entropy_params=TOP_K)
        out[causal] = {"attention": att,
                       "main": {"organized": [root / f"{causal}_org{s}.zarr" for s in range(2)], "decomposed": dec,
                                "entropy": root / "entropy.zarr"},
                       "keep": {**other, "entropy": root / "keep" / "entropy.zarr"}}
    return out


def data(path) -> xr.Dataset:
    ds = store.read_store(path)
    ds.attrs = {}
    return ds


def test_each_rules_entropy_store_has_the_norms_of_the_heads_that_rule_makes(analyses):
    """head_l2 of the main (row_mean) and the other (keep) analysis: the Frobenius norm of every
    head of the network tensor as each rule fills it, read from the attention stores."""
    for causal, a in analyses.items():
        for rule in ("row_mean", "keep"):
            ent = store.read_store(a["main" if rule == "row_mean" else "keep"]["entropy"])
            assert ent.attrs["masked"] == rule
            for s, att in enumerate(a["attention"]):
                net = read_network(att, "scores", masked=rule)
                want = np.linalg.norm(net.array.astype(np.float64), axis=(0, 1))
                got = ent["head_l2"].sel(sample=s).values[net.unit_layer, net.unit_head]
                np.testing.assert_allclose(got, want, rtol=1e-5, err_msg=f"causal={causal}, rule={rule}")
    # the two rules' norms differ in a causal network (the masked scores are not their rows' means)
    main, keep = (store.read_store(analyses[True][k]["entropy"])["head_l2"].values for k in ("main", "keep"))
    assert (np.abs(main - keep) > 1e-3 * keep).all()


def test_the_other_rule_changes_exactly_the_masked_entries_and_what_follows_from_them(analyses):
    a = analyses[True]
    for s, att in enumerate(a["attention"]):
        main, keep = data(a["main"]["decomposed"][s]), data(a["keep"]["decomposed"][s])
        layers = main["fig_layer"].values
        masked = ~allowed_mask(store.read_store(att), None)[layers]  # (fig_head, query, key)
        assert masked.any() and not masked.all()
        # the figure heads as analysed: different exactly where the model masks
        np.testing.assert_array_equal(main["fig_original"].values != keep["fig_original"].values, masked)
        # what never reads the rule: the 2-D organizations and paraproducts of the pre-mask scores
        for v in ("fig_row_order", "fig_col_order", "fig_exact", "fig_rel_residual", "fig_rel_residual_unorganized"):
            xr.testing.assert_equal(main[v], keep[v])
        # what the expansions give: another tensor, other coefficients and sparsities
        assert not np.allclose(main["trihaar_level_l2sq"].values.sum(), keep["trihaar_level_l2sq"].values.sum())
    ents = [store.read_store(a[k]["entropy"]) for k in ("main", "keep")]
    assert (ents[0]["network_sparsity"].values != ents[1]["network_sparsity"].values).all()
    assert ents[0].attrs["masked_filled"] > 0 and ents[1].attrs["masked_filled"] == 0


def test_a_network_with_no_masked_entry_gets_the_main_analysis_stores(analyses, tmp_path, caplog):
    a = analyses[False]
    assert [masked_entries(p) for p in a["attention"]] == [0, 0]
    assert [masked_entries(p) for p in analyses[True]["attention"]] == [2 * 2 * 16 * 15 // 2] * 2
    for kind in ("organized", "decomposed"):
        for main, keep in zip(a["main"][kind], a["keep"][kind]):
            xr.testing.assert_equal(data(main), data(keep))
    xr.testing.assert_equal(data(a["main"]["entropy"]), data(a["keep"]["entropy"]))
    # the stage says the rule changed nothing; a model analysing probabilities is refused
    with caplog.at_level(logging.INFO, logger="oattn"):
        masked_other(a["attention"][:1], [tmp_path / "o.zarr"], [tmp_path / "d.zarr"], tmp_path / "e.zarr",
                     analysis={"quantity": "scores", "crop": None, "masked": "keep"}, organize_params={"n_iters": 1},
                     decompose_params=DECOMPOSE, entropy_params=TOP_K)
    assert "no sample has a masked entry" in caplog.text
    with pytest.raises(ValueError, match="extract.quantity: 'probs'"):
        masked_other(a["attention"], [], [], tmp_path / "e.zarr", analysis={"quantity": "probs", "masked": "keep"},
                     organize_params={}, decompose_params=DECOMPOSE, entropy_params=TOP_K)


@pytest.mark.workflow
def test_the_rule_is_planned_for_the_scores_model_only(tmp_path):
    """One dry run of the tiny config (txl analyses scores, vit and lm probabilities): target
    `masked_other` plans txl's one job under the other rule, after its extraction, and no other."""
    from wfutil import TINY, planned_jobs, snakemake

    proc = snakemake(tmp_path, TINY, "-n", "masked_other")
    planned = planned_jobs(proc)
    assert {r: n for r, n in planned.items() if r.startswith("masked_other")} == {"masked_other_batch_txl": 1,
                                                                                 "masked_other": 1}
    assert planned["extract_batch_txl"] == 1 and not any("vit" in r for r in planned)
    out = proc.stdout + proc.stderr
    for s in (0, 1):
        assert f"results/txl/masked_keep/decomposed/sample{s}.zarr/zarr.json" in out
    assert "results/txl/masked_keep/entropy.zarr/zarr.json" in out and "results/lm/" not in out


def test_the_other_rule_is_one_job_per_model_with_every_sample():
    from oattn_lib.plan import masked_other_jobs

    jobs = masked_other_jobs({"txl-tiny": range(10), "a.b": [0, 1]})
    assert jobs == [("txl_tiny", "txl-tiny", list(range(10))), ("a_b", "a.b", [0, 1])]
    assert masked_other_jobs({}) == []
