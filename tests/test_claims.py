"""The claims table: verdicts worded from the numbers by the stated thresholds, and a summary stage
whose numbers are recomputed here from the stores and tables it read."""
import itertools
import json

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import claims, store
from oattn_lib.claims import HOLDS, MIXED, NOT_HERE, NOT_RUN
from oattn_lib.stages.summary import LOWEST_FIRST, RANDOM, summary


# -- chance level -------------------------------------------------------------------------------
@pytest.mark.parametrize("n, k", [(6, 2), (7, 3), (5, 5), (8, 1)])
def test_chance_jaccard_is_the_mean_over_all_pairs_of_sets(n, k):
    sets = [set(s) for s in itertools.combinations(range(n), k)]
    brute = np.mean([len(a & b) / len(a | b) for a in sets for b in sets])
    assert claims.chance_jaccard(n, k) == pytest.approx(brute)


# -- verdicts flip where the numbers cross the thresholds ------------------------------------------
@pytest.mark.parametrize("ratios, verdict", [
    ([0.94, 0.5], HOLDS), ([0.96, 0.5], MIXED), ([1.0, 0.99], MIXED), ([1.0, 1.0], NOT_HERE), ([1.2, 0.9], NOT_HERE),
])
def test_sparsity_verdict(ratios, verdict):
    c = claims.sparsity_claim("m", np.array(ratios) * 3.0, np.full(len(ratios), 3.0))
    assert c.verdict == verdict and c.value == pytest.approx(np.mean(ratios))


def test_recurrence_verdict():
    chance = claims.chance_jaccard(16, 2)
    args = dict(n_heads=16, k=2, bottom_counts=[((0, 1), 3)], n_samples=3)
    assert claims.recurrence_claim("m", 0.5, **args).verdict == HOLDS
    assert claims.recurrence_claim("m", 0.49, **args).verdict == MIXED
    assert claims.recurrence_claim("m", 2 * chance, **args).verdict == MIXED
    assert claims.recurrence_claim("m", 2 * chance - 1e-9, **args).verdict == NOT_HERE
    assert "(0,1) 3/3" in claims.recurrence_claim("m", 0.5, **args).measured


@pytest.mark.parametrize("org, orig, rnd, verdict", [
    (0.1, 0.2, 0.3, HOLDS), (0.11, 0.2, 0.3, MIXED), (0.05, 0.04, 0.3, MIXED), (0.05, 0.3, 0.05, MIXED),
    (0.5, 0.2, 0.3, NOT_HERE), (None, 0.2, 0.3, NOT_HERE), (0.5, None, None, MIXED),
])
def test_paraproduct_verdict(org, orig, rnd, verdict):
    c = claims.paraproduct_claim("m", org, orig, rnd)
    assert c.verdict == verdict
    assert ("not finite" in c.measured) == (None in (org, orig, rnd))


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


# -- the summary stage, on files written here ----------------------------------------------------------
def write_model(root, name, rng, n_s=4, layers=3, heads=4, prune=True, metric=("accuracy", True, "accuracy")):
    e = rng.random((n_s, layers, heads)) * 10
    e[:, 0, 0] = 0.1  # one head at the bottom in every sample
    ent = xr.Dataset({"head_entropy": (("sample", "layer", "head"), e)},
                     coords={"sample": np.arange(n_s), "layer": np.arange(layers), "head": np.arange(heads)})
    store.write_store(ent, root / f"{name}_entropy.zarr")
    pd.DataFrame({"model": name, "set": ["top"] * 3 + ["bottom"] * 3, "rank": [1, 2, 3] * 2,
                  "layer": [1, 2, 2, 0, 1, 2], "head": [1, 2, 3, 0, 0, 1],
                  "count": ["2/4", "1/4", "1/4", "4/4", "2/4", "1/4"], "mean_entropy": 1.0}
                 ).to_csv(root / f"{name}_t1.csv", index=False)
    pd.DataFrame({"model": name, "sample": np.arange(n_s), "network_sparsity": rng.random(n_s) + 1,
                  "network_sparsity_random_trees": rng.random(n_s) + 1.5}).to_csv(root / f"{name}_t2.csv", index=False)
    (root / f"{name}_temp.json").write_text(json.dumps({
        "at_model_tau": {"2-D organized": 0.08, "original": 0.2, "random": None},
        "crossover": {"original": {"text": "below the original order's for tau < 2.5 (crossover)"},
                      "random": {"text": "below the random orders' over the whole range (no crossover)"}}}))
    # what the prune stage writes: the metric measured, its direction and what the areas are of
    pd.DataFrame({"model": name, "metric": metric[0], "higher_is_better": metric[1], "auc_of": metric[2],
                  "ranking": [LOWEST_FIRST, RANDOM], "auc": [0.6, 0.7], "auc_sd": [np.nan, 0.02]}
                 ).to_csv(root / f"{name}_t3.csv", index=False)
    for t in (1, 2, 3, 4):
        (root / f"{name}_t{t}.md").write_text(f"table {t} of {name}\n")
    inputs = {f"entropy_{name}": root / f"{name}_entropy.zarr", f"table1csv_{name}": root / f"{name}_t1.csv",
              f"table2csv_{name}": root / f"{name}_t2.csv", f"temperature_{name}": root / f"{name}_temp.json",
              **{f"table{t}_{name}": root / f"{name}_t{t}.md" for t in (1, 2)}}
    if prune:
        inputs.update({f"table3csv_{name}": root / f"{name}_t3.csv",
                       **{f"table{t}_{name}": root / f"{name}_t{t}.md" for t in (3, 4)}})
    return inputs


def test_summary_opens_with_the_claims_table_recomputed_from_its_inputs(tmp_path):
    rng = np.random.default_rng(0)
    inputs = {**write_model(tmp_path, "vit_a", rng), **write_model(tmp_path, "txl-b", rng, prune=False)}
    outs = {"md": tmp_path / "summary.md", "claims_csv": tmp_path / "claims.csv",
            "claims_rst": tmp_path / "claims.rst"}
    summary({"vit_a": "vit", "txl-b": "txl"}, inputs, outs, 0.25)
    got = pd.read_csv(outs["claims_csv"])
    assert list(got["claim"]) == [claims.CLAIMS[k] for k in ("sparsity", "recurrence", "paraproduct", "pruning")
                                  for _ in range(2)]
    assert list(got["model"]) == ["vit_a", "txl-b"] * 4
    for name, kind in (("vit_a", "vit"), ("txl-b", "txl")):
        row = got[got["model"] == name].set_index("claim")["value"]
        t2 = pd.read_csv(tmp_path / f"{name}_t2.csv")
        ratio = t2["network_sparsity"] / t2["network_sparsity_random_trees"]
        assert row[claims.CLAIMS["sparsity"]] == pytest.approx(ratio.mean())
        # bottom 25% (3 of 12 heads) sets by sorting, and their Jaccard over all pairs of samples
        e = store.read_store(tmp_path / f"{name}_entropy.zarr")["head_entropy"].values.reshape(4, -1)
        sets = [set(np.argsort(s, kind="stable")[:3]) for s in e]
        jac = np.mean([len(a & b) / len(a | b) for a, b in itertools.permutations(sets, 2)])
        assert row[claims.CLAIMS["recurrence"]] == pytest.approx(jac)
        assert row[claims.CLAIMS["paraproduct"]] == pytest.approx(0.08)
    ver = got.set_index(["model", "claim"])["verdict"]
    assert ver["vit_a", claims.CLAIMS["paraproduct"]] == HOLDS  # 0.08 <= 0.1, below original, random not finite
    assert ver["vit_a", claims.CLAIMS["pruning"]] == NOT_HERE   # area 0.6 < random 0.7, higher is better
    assert ver["txl-b", claims.CLAIMS["pruning"]] == NOT_RUN
    assert ver["txl-b", claims.CLAIMS["recurrence"]] == claims.recurrence_claim(
        "x", got.set_index(["model", "claim"])["value"]["txl-b", claims.CLAIMS["recurrence"]], 12, 3, [], 4).verdict
    assert "6/6 batches" in got[got["model"] == "txl-b"]["paper"].iloc[1]
    md = outs["md"].read_text()
    assert md.index("| claim | model |") < md.index("## vit_a") < md.index("table 3 of vit_a")
    assert "table 3 of txl-b" not in md
    assert "thresholds" in md and "crossover" in md


def test_pruning_claim_takes_the_metric_table3_measured(tmp_path):
    """The same areas (0.6 vs random 0.7 +- 0.02) hold for a causal LM's perplexity (lower is
    better) and do not for an encoder's cosine similarity, both `kind: hf`: the direction comes
    from Table 3, not from the model kind."""
    rng = np.random.default_rng(1)
    inputs = {**write_model(tmp_path, "llm", rng, metric=("perplexity", False, "log perplexity")),
              **write_model(tmp_path, "enc", rng, metric=("cosine similarity to the unmasked model", True,
                                                           "cosine similarity to the unmasked model"))}
    outs = {"md": tmp_path / "summary.md", "claims_csv": tmp_path / "claims.csv",
            "claims_rst": tmp_path / "claims.rst"}
    summary({"llm": "hf", "enc": "hf"}, inputs, outs, 0.25)
    got = pd.read_csv(outs["claims_csv"])
    prune = got[got["claim"] == claims.CLAIMS["pruning"]].set_index("model")
    assert prune.loc["llm", "verdict"] == HOLDS and prune.loc["enc", "verdict"] == NOT_HERE
    assert "log perplexity" in prune.loc["llm", "measured"] and "lower is better" in prune.loc["llm", "measured"]
    assert "cosine similarity" in prune.loc["enc", "measured"]
