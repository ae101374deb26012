"""How far each number can be trusted (docs/method.md §14): the perturbations, the replicate
analyses of the stability stage on stores written here, their summary recomputed from the stored
replicates, the bootstrap over samples, and the claims' word on whether a verdict survives."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import xarray as xr

from oattn_lib import store
from oattn_lib.claims import HOLDS, INCONCLUSIVE, verdict_text
from oattn_lib.questionnaire import questionnaire3d
from oattn_lib.smoothness import THEOREM1_MEASURES
from oattn_lib.stability import (FIG_MEASURES, REFERENCE, bootstrap_samples, bottom_sets, mean_pair_jaccard, perturb,
                                 relative_spread, rename_tree, replicate_plan, replicate_sets, same_folders)
from oattn_lib.stages.decompose import decompose
from oattn_lib.stages.entropy import entropy
from oattn_lib.stages.organize import organize
from oattn_lib.stages.stability import stability
from oattn_lib.trees import PartitionTree
from scored_stores import planted
from scored_stores import planted_store as attention_store

ORGANIZE = dict(n_iters=2, alpha=0.0, beta=1.0, constant=1.0, eps=1.0, head_uses_initial_trees=False)
SETTINGS = dict(replicates=2, perturbations=["ulp", "float16", "relabel", "sibling"], ulp_fraction=0.05, seed=0,
                bootstrap=300, paraproduct=True)


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """Three planted samples through organize, decompose, entropy and stability (samples 0 and 1
    replicated), as the workflow runs them."""
    d = tmp_path_factory.mktemp("stability")
    att, org, dec = ([d / f"{kind}{i}.zarr" for i in range(3)] for kind in ("att", "org", "dec"))
    for i in range(3):
        attention_store(att[i], planted(i))
        organize(att[i], org[i], "scores", params=ORGANIZE)
        decompose(att[i], org[i], dec[i], "scores", figure_heads=[[0, 0], [-1, -1]], questionnaire2d_iters=2,
                  random_tree_seeds=1)
    entropy(dec, d / "entropy.zarr", head_top_k=40, network_top_k=20)
    stability(att[:2], org[:2], dec[:2], d / "entropy.zarr", d / "stability.zarr", d / "stability.csv",
              d / "stability.md", samples=[0, 1], quantity="scores", organize=ORGANIZE, head_top_k=40,
              network_top_k=20, settings=SETTINGS, fraction=0.25, questionnaire2d_iters=2, model_name="planted")
    return d


# -- perturbations ---------------------------------------------------------------------------
def test_the_plan_has_the_reference_first_and_one_float16_replicate():
    plan = replicate_plan(["sibling", "float16", "ulp"], 3)
    assert plan == [(REFERENCE, 0), ("ulp", 0), ("ulp", 1), ("ulp", 2), ("float16", 0), ("sibling", 0),
                    ("sibling", 1), ("sibling", 2)]
    with pytest.raises(ValueError, match=r"stability.perturbations: \['jitter'\]"):
        replicate_plan(["jitter"], 2)


def test_ulp_moves_the_fraction_of_nonzero_entries_by_exactly_one_step():
    rng = np.random.default_rng(0)
    x = rng.random((10, 12, 5)).astype(np.float32)
    x[:, :3] = 0.0  # masked entries: structure, never moved
    p = perturb(x, "ulp", np.random.default_rng(1), ulp_fraction=0.1)
    moved = p.array != x
    assert moved.sum() == round(0.1 * np.count_nonzero(x)) and not moved[:, :3].any()
    step = np.abs(p.array[moved].view(np.int32) - x[moved].view(np.int32))
    assert (step == 1).all()  # one float32 step, up or down
    assert (p.array[moved] > x[moved]).any() and (p.array[moved] < x[moved]).any()
    again = perturb(x, "ulp", np.random.default_rng(1), ulp_fraction=0.1).array
    assert np.array_equal(again, p.array)  # a replicate is a function of its random state


def test_relabel_and_sibling_rename_every_axis():
    x = np.random.default_rng(0).random((6, 7, 4)).astype(np.float32)
    for name, organizes in (("relabel", True), ("sibling", False)):
        p = perturb(x, name, np.random.default_rng(2))
        pq, pk, pu = p.perms
        assert p.organize is organizes
        assert np.array_equal(p.array, x[pq][:, pk][:, :, pu])
    p16 = perturb(x, "float16", None)
    assert np.array_equal(p16.array, x.astype(np.float16).astype(np.float32)) and p16.perms is None


def test_same_folders_ignores_sibling_order_and_nothing_else():
    a = PartitionTree(np.array([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 2, 3]]))
    swapped = PartitionTree(np.array([[0, 0, 0, 0], [1, 1, 0, 0], [3, 2, 1, 0]]))
    other = PartitionTree(np.array([[0, 0, 0, 0], [0, 1, 0, 1], [0, 1, 2, 3]]))
    assert a != swapped and same_folders(a, swapped)
    assert not same_folders(a, other)
    perm = np.array([2, 0, 3, 1])
    assert same_folders(rename_tree(rename_tree(a, perm), np.argsort(perm)), a)


def test_a_planted_organization_does_not_depend_on_the_item_order():
    x = planted(0).transpose(2, 3, 0, 1).reshape(24, 24, 8)
    ref = questionnaire3d(x, **ORGANIZE)
    for seed in range(3):
        p = perturb(x, "relabel", np.random.default_rng(seed))
        o = questionnaire3d(p.array, **ORGANIZE)
        for t, t0, pm in zip((o.tree_q, o.tree_k, o.tree_h), (ref.tree_q, ref.tree_k, ref.tree_h), p.perms):
            assert same_folders(rename_tree(t, np.argsort(pm)), t0)


# -- the stage -------------------------------------------------------------------------------
def test_the_reference_replicate_is_the_entropy_stages_analysis(planted_run):
    stab = store.read_store(planted_run / "stability.zarr")
    ent = store.read_store(planted_run / "entropy.zarr")
    r0 = int(np.flatnonzero(stab["perturbation"].values == REFERENCE)[0])
    for i, s in enumerate(stab["sample"].values):
        np.testing.assert_allclose(stab["head_entropy"].values[i, r0],
                                   ent["head_entropy"].values[s].reshape(-1), rtol=1e-12)
        np.testing.assert_allclose(stab["network_entropy"].values[i, r0], ent["network_entropy"].values[s],
                                   rtol=1e-12)
        np.testing.assert_allclose(stab["sparsity_ratio"].values[i, r0],
                                   ent["network_sparsity"].values[s] / ent["network_sparsity_random"].values[s],
                                   rtol=1e-12)


def test_the_workflows_per_sample_jobs_and_table_job_make_the_one_calls_store(planted_run, tmp_path):
    """The workflow replicates each sample in a job of its own (stability_sample, a store each)
    and joins them (stability): the same store and table as the one call, to the bit (the same
    code on the same inputs), whatever order the samples' jobs finished in. A replicate store
    given for the wrong sample is an error naming it."""
    from oattn_lib.stages.stability import stability_sample_stores
    from oattn_lib.stages.stability_tables import stability_tables

    d = planted_run
    per = [tmp_path / f"rep{s}.zarr" for s in (0, 1)]
    order = [1, 0]
    stability_sample_stores([d / f"att{s}.zarr" for s in order], [d / f"org{s}.zarr" for s in order],
                            [d / f"dec{s}.zarr" for s in order], [per[s] for s in order], samples=order,
                            quantity="scores", organize=ORGANIZE, head_top_k=40, network_top_k=20, settings=SETTINGS,
                            questionnaire2d_iters=2)
    out = tmp_path / "stability.zarr"
    stability_tables(per, d / "entropy.zarr", out, tmp_path / "s.csv", tmp_path / "s.md", samples=[0, 1],
                     settings=SETTINGS, fraction=0.25, model_name="planted")
    joined, one = store.read_store(out), store.read_store(d / "stability.zarr")
    assert set(joined.variables) == set(one.variables) and joined.sizes == one.sizes
    for name in one.variables:
        assert joined[name].dims == one[name].dims, name
        assert np.array_equal(joined[name].values, one[name].values, equal_nan=joined[name].dtype.kind == "f"), name
    assert (tmp_path / "s.csv").read_text() == (d / "stability.csv").read_text()
    with pytest.raises(ValueError, match=r"rep1\.zarr: replicates of sample 1, expected sample 0"):
        stability_tables(per[::-1], d / "entropy.zarr", tmp_path / "x.zarr", tmp_path / "x.csv", tmp_path / "x.md",
                         samples=[0, 1], settings=SETTINGS, fraction=0.25)
    assert not (tmp_path / "x.zarr").exists()


def test_the_reference_figure_heads_are_measured_as_decompose_and_theorem1_measure_them(planted_run, tmp_path):
    from oattn_lib.stages.theorem1 import theorem1

    stab = store.read_store(planted_run / "stability.zarr")
    r0 = int(np.flatnonzero(stab["perturbation"].values == REFERENCE)[0])
    for i, s in enumerate(stab["sample"].values):
        dec = store.read_store(planted_run / f"dec{s}.zarr")
        np.testing.assert_allclose(stab["paraproduct_residual"].values[i, r0], dec["fig_rel_residual"].values,
                                   rtol=1e-9)
        np.testing.assert_array_equal(stab["diffusion_coords"].values[i, r0],
                                      dec["diffusion_coords"].transpose("unit", "component").values)
        # the theorem1 stage organizes every head itself, with the same iterations: the same numbers
        theorem1("planted", [planted_run / f"att{s}.zarr"], tmp_path / f"t{s}.csv", samples=1, max_heads=100,
                 random_orders=1, seed=0, questionnaire2d_iters=2)
        t1 = pd.read_csv(tmp_path / f"t{s}.csv")
        t1 = t1[t1["order"] == "2-D organized"].set_index(["layer", "head"])
        for j, unit in enumerate(zip(stab["fig_layer"].values, stab["fig_head_index"].values)):
            # every column of the theorem1 table has its replicate values, `residual` as paraproduct_residual
            for column, measure in zip(THEOREM1_MEASURES, FIG_MEASURES):
                got, want = stab[measure].values[i, r0, j], t1.loc[unit, column]
                assert (np.isnan(got) and np.isnan(want)) or got == pytest.approx(want, rel=1e-9), (unit, column)
    # what the replicates changed is in the summary, one row per figure head measure
    table = pd.read_csv(planted_run / "stability.csv")
    for measure in FIG_MEASURES:
        assert set(table.loc[table["measure"] == measure, "perturbation"]) == {"ulp", "float16", "relabel"}


def test_the_figure_measures_are_the_theorem1_tables_columns():
    # written out in stability.py (no torch there), held equal here
    assert FIG_MEASURES == tuple("paraproduct_residual" if m == "residual" else m for m in THEOREM1_MEASURES)


def test_a_renamed_replicate_gives_each_head_its_own_diffusion_coordinates_back(planted_run):
    from oattn_lib.clustering import best_silhouette

    stab = store.read_store(planted_run / "stability.zarr")
    pert = stab["perturbation"].values
    c = stab["diffusion_coords"].values  # (sample, replicate, unit, component)
    ref = c[:, pert == REFERENCE]
    # the planted trees come back (previous test), so do the affinities: each component up to its sign,
    # and with them the claims' clustering statistic of the map
    for rep in (c[:, pert == "relabel"], c[:, pert == "sibling"], c[:, pert == "ulp"]):
        err = np.minimum(np.abs(rep - ref), np.abs(rep + ref)).max(axis=(0, 1, 2))
        assert (err <= 1e-3 * np.abs(ref).max()).all(), err
        for i in range(c.shape[0]):
            for r in range(rep.shape[1]):
                assert best_silhouette(rep[i, r], rng=0) == pytest.approx(best_silhouette(ref[i, 0], rng=0), abs=1e-3)


def test_a_planted_structure_keeps_its_trees_and_numbers_in_every_replicate(planted_run):
    stab = store.read_store(planted_run / "stability.zarr")
    assert stab.sizes["replicate"] == 1 + 2 + 1 + 2 + 2 and list(stab["sample"].values) == [0, 1]
    pert = stab["perturbation"].values
    # float16 rounds the entries by up to 0.008 here, as much as the noise inside a cluster, so it
    # may reorganize a cluster's inside; the information-free perturbations may not
    for axis in "qkh":
        assert stab[f"same_tree_{axis}"].values[:, pert != "float16"].all(), axis
    ulp = stab["head_entropy"].values[:, pert == "ulp"]
    ref = stab["head_entropy"].values[:, pert == REFERENCE]
    assert np.abs(ulp - ref).max() <= 1e-5 * np.abs(ref).max()
    f16 = stab["head_entropy"].values[:, pert == "float16"]
    assert np.abs(f16 - ref).max() <= 1e-2 * np.abs(ref).max()
    assert (bottom_sets(stab["head_entropy"].values, 0.25) == bottom_sets(np.repeat(ref, 8, 1), 0.25)).all()
    # relabel gives the reference trees back, measured on the stored tensor: the same numbers
    np.testing.assert_allclose(stab["head_entropy"].values[:, pert == "relabel"], np.repeat(ref, 2, 1), rtol=1e-12)


def test_the_summary_table_is_recomputed_from_the_stored_replicates(planted_run):
    stab = store.read_store(planted_run / "stability.zarr")
    table = pd.read_csv(planted_run / "stability.csv").set_index(["measure", "perturbation"])
    pert = stab["perturbation"].values
    for p in ("ulp", "float16", "sibling"):
        v = stab["head_entropy"].values  # (sample, replicate, unit)
        ref = v[:, pert == REFERENCE]
        rel = np.abs(v[:, pert == p] - ref) / np.abs(ref)
        assert table.loc[("head_entropy", p), "spread_max"] == pytest.approx(rel.max(), rel=1e-9, abs=1e-300)
        assert table.loc[("head_entropy", p), "spread_median"] == pytest.approx(np.median(rel), rel=1e-9, abs=1e-300)
        n = stab["network_sparsity"].values
        rel_n = np.abs(n[:, pert == p] - n[:, pert == REFERENCE]) / n[:, pert == REFERENCE]
        assert table.loc[("network_sparsity", p), "spread_max"] == pytest.approx(rel_n.max(), rel=1e-9, abs=1e-300)
        assert table.loc[("same_tree_h", p), "agreement"] == stab["same_tree_h"].values[:, pert == p].mean()
        assert table.loc[("head_entropy", p), "replicates"] == (pert == p).sum()
    # the sibling replicates rename the items of the Haar basis: the sums may move, the trees not
    assert table.loc[("same_tree_q", "sibling"), "agreement"] == 1.0
    assert np.isnan(stab["paraproduct_residual"].values[:, pert == "sibling"]).all()


def test_the_bootstrap_pairs_only_distinct_samples():
    e = np.random.default_rng(0).random((5, 20))
    boot = bootstrap_samples(e, 0.2, 50, seed=3)
    member = bottom_sets(e, 0.2)
    for d in range(50):
        idx = boot["draw_samples"][d]
        pairs = [(a, b) for i, a in enumerate(idx) for b in idx[i + 1:] if a != b]
        want = np.mean([(member[a] & member[b]).sum() / (member[a] | member[b]).sum() for a, b in pairs])
        assert boot["recurrence"][d] == pytest.approx(want, rel=1e-12)
        assert np.array_equal(boot["bottom_count"][d], member[idx].sum(0))
    # identical samples recur perfectly in every draw, and only their copies pair with themselves
    same = bootstrap_samples(np.tile(e[:1], (4, 1)), 0.2, 20)["recurrence"]
    assert np.all((same == 1) | np.isnan(same))


def test_replicate_sets_put_each_replicate_into_the_reference_samples():
    ref = np.arange(12.0).reshape(3, 4)
    stab = xr.Dataset({"head_entropy": (("sample", "replicate", "unit"), np.stack([ref[1], ref[1] + 100])[None])},
                      coords={"sample": [1], "perturbation": ("replicate", [REFERENCE, "ulp"]),
                              "replicate_index": ("replicate", [0, 0])})
    sets, labels = replicate_sets(stab, ref)
    assert labels == ["none #0", "ulp #0"]
    np.testing.assert_array_equal(sets[0], ref)
    np.testing.assert_array_equal(sets[1][[0, 2]], ref[[0, 2]])
    np.testing.assert_array_equal(sets[1][1], ref[1] + 100)


# -- claims ------------------------------------------------------------------------------------
def test_a_verdict_that_flips_between_replicates_says_so():
    assert verdict_text(HOLDS, [HOLDS, HOLDS], "numerical replicates") == "same in 2/2 numerical replicates"
    assert (verdict_text(HOLDS, [HOLDS, INCONCLUSIVE, INCONCLUSIVE], "numerical replicates")
            == f"flips in 2/3 numerical replicates ({INCONCLUSIVE} in 2)")
    assert verdict_text(HOLDS, [], "numerical replicates") == ""


def test_a_replicate_whose_bottom_set_moves_changes_the_recurrence_measured():
    # 3 samples x 10 heads: the reference's bottom sets agree perfectly; replicate "ulp #1" moves
    # sample 0's lowest heads to the top: its bottom set then shares nothing with the others
    rng = np.random.default_rng(0)
    base = rng.random(10) + 1.0
    ent = np.tile(base, (3, 1))
    rep = np.stack([ent[0], ent[0] * (1 + 1e-7), np.where(base < np.sort(base)[2], 10.0, base)])  # (replicate, unit)
    stab = xr.Dataset({"head_entropy": (("sample", "replicate", "unit"), rep[None])},
                      coords={"sample": [0], "perturbation": ("replicate", np.array([REFERENCE, "ulp", "ulp"], dtype=object)),
                              "replicate_index": ("replicate", [0, 0, 1])})
    member = bottom_sets(replicate_sets(stab, ent)[0], 0.2)
    assert mean_pair_jaccard(member)[2] < 0.5 <= mean_pair_jaccard(member)[1] == 1.0


def test_relative_spread_is_zero_where_nothing_moved():
    np.testing.assert_array_equal(relative_spread([0.0, 2.0, 3.0], [0.0, 1.0, 3.0]), [0.0, 1.0, 0.0])


# -- the workflow ------------------------------------------------------------------------------
@pytest.mark.workflow
def test_the_workflow_gives_intervals_and_says_which_verdicts_survive(clean_run):
    from wfutil import TINY

    res = clean_run / "results"
    replicated = {m["name"]: m for m in TINY["models"] if "stability" in m}
    assert set(replicated) == {"txl", "lm"}
    verdicts = pd.read_csv(res / "claims.csv", keep_default_na=False, na_values=[""])
    checked = set()
    for name, m in replicated.items():
        stab = store.read_store(res / name / "stability.zarr")
        n_samples = m["extract"]["n_samples"]
        assert list(stab["sample"].values) == list(range(m["stability"].get("samples", n_samples)))
        ent = store.read_store(res / name / "entropy.zarr")
        r0 = int(np.flatnonzero(stab["perturbation"].values == REFERENCE)[0])
        rows = stab["sample"].values
        np.testing.assert_allclose(stab["network_entropy"].values[:, r0], ent["network_entropy"].values[rows],
                                   rtol=1e-12)
        # Table 2's range over the replicates holds every replicate and the table's own number
        t2 = pd.read_csv(res / name / "tables" / "table2.csv", keep_default_na=False)
        for i, s in enumerate(rows):
            lo, _, hi = str(t2.loc[s, "network_entropy_replicates"]).partition("–")
            lo, hi = float(lo), float(hi or lo)
            v = stab["network_entropy"].values[i]
            assert lo == pytest.approx(v.min(), rel=1e-3) and hi == pytest.approx(v.max(), rel=1e-3)
            assert lo * (1 - 1e-3) <= t2.loc[s, "network_entropy"] <= hi * (1 + 1e-3)
        assert all(t2.loc[s, "network_entropy_replicates"] == "" for s in range(n_samples) if s not in rows)
        # each verdict of the model is decided in every replicate: the same in R/R, or flips in k/R
        n_rep = stab.sizes["replicate"] - 1
        for key in ("sparsity", "recurrence", "diffusion"):
            for text in verdicts.loc[(verdicts["model"] == name) & (verdicts["key"] == key)
                                     & verdicts["p"].notna(), "numerically_robust"]:
                assert text == f"same in {n_rep}/{n_rep} numerical replicates" or text.startswith("flips in "), text
        # Theorem 1's rows in the replicates with a paraproduct (not sibling) where they ran
        n_para = int((stab["perturbation"].values != "sibling").sum()) - 1
        for key in ("paraproduct", "corollary1"):
            rows = verdicts[(verdicts["model"] == name) & (verdicts["key"] == key) & verdicts["p"].notna()]
            for text in rows["numerically_robust"]:
                checked.add((name, key))
                assert text == f"same in {n_para}/{n_para} numerical replicates" or text.startswith("flips in "), \
                    (key, text)
    assert {("txl", "paraproduct"), ("txl", "corollary1")} <= checked, checked
    vit = verdicts[(verdicts["model"] == "vit") & verdicts["p"].notna()]
    assert set(vit["numerically_robust"]) <= {"not replicated", "not replicated: one ablation run"}  # no section
    summary = (res / "summary.md").read_text()
    assert summary.count("### Stability (docs/method.md §14)") == 2
