"""The every-head Theorem 1 table: the rows the claims read are the paraproduct and smoothness
measures of each head in its own 2-D organized order, its original order and random orders."""
import numpy as np
import pandas as pd
import pytest
import torch

from oattn_lib import store
from oattn_lib.smoothness import THEOREM1_MEASURES, residual_smoothness
from oattn_lib.stages.extract import attention_dataset
from oattn_lib.stages.theorem1 import COLUMNS, chosen_heads, theorem1
from scored_stores import scored_samples

N = 12


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two samples of a 2-layer x 3-head network, causal or not, through organize and decompose,
    and their Theorem 1 tables (every head; two heads per sample)."""
    root = tmp_path_factory.mktemp("theorem1")
    rng = np.random.default_rng(5)
    out = {}
    for causal in (False, True):
        paths = scored_samples(root, rng, (2, 3, N), causal)
        tables = {}
        for max_heads in (6, 2):
            csv = root / f"{causal}_{max_heads}.csv"
            curves = root / f"{causal}_{max_heads}_curves.csv"
            theorem1("m", [p[0] for p in paths], csv, samples=2, max_heads=max_heads, random_orders=2, seed=0,
                     questionnaire2d_iters=2, out_curves=curves, temperature_taus=5)
            tables[max_heads] = pd.read_csv(csv)
            tables[f"curves{max_heads}"] = pd.read_csv(curves)
        out[causal] = (paths, tables)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_figure_heads_rows_are_the_decompose_stages_residuals(stores, causal):
    """The same 2-D questionnaire and the same masked softmax as Figure 2: its residuals in the
    organized and the original order are the table's for those heads (a swapped order, or a
    softmax over the causal future, would not agree)."""
    paths, tables = stores[causal]
    t = tables[6]
    for s, (_, d) in enumerate(paths):
        dec = store.read_store(d)
        for j, (layer, head) in enumerate(zip(dec["fig_layer"].values, dec["fig_head_index"].values)):
            rows = t[(t["sample"] == s) & (t["layer"] == layer) & (t["head"] == head)].set_index("order")
            assert rows.loc["2-D organized", "residual"] == pytest.approx(float(dec["fig_rel_residual"].values[j]),
                                                                         rel=1e-12)
            assert rows.loc["original", "residual"] == pytest.approx(
                float(dec["fig_rel_residual_unorganized"].values[j]), rel=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_every_head_of_every_sample_has_its_orders(stores, causal):
    paths, tables = stores[causal]
    t = tables[6]
    assert list(t.columns) == COLUMNS == ["sample", "layer", "head", "order", "seed", *THEOREM1_MEASURES]
    assert len(t) == 2 * 6 * (2 + 2)
    # every measure is written: the residuals against the true row sums and uniform attention's
    # are finite on these heads, every column has values, and uniform is one number per head
    # (in every order, up to rounding)
    finite = ["residual", "residual_nocross", "uniform_residual", "corollary1_residual", "corollary1_nocross",
              "taylor_residual", "taylor_nocross"]
    assert np.isfinite(t[finite].to_numpy()).all()
    assert t[list(THEOREM1_MEASURES)].notna().any().all()
    spread = t.groupby(["sample", "layer", "head"])["uniform_residual"].agg(lambda v: v.max() - v.min())
    assert (spread < 1e-12).all()
    assert (t["uniform_residual"] < 1).all()
    per_head = t.groupby(["sample", "layer", "head"])["order"].apply(sorted)
    assert len(per_head) == 12 and all(v == ["2-D organized", "original", "random", "random"] for v in per_head)
    rnd = t[t["order"] == "random"]
    assert sorted(rnd["seed"].unique()) == [0, 1] and (t[t["order"] != "random"]["seed"] == -1).all()
    # two random orders are two different orders
    assert (rnd.groupby(["sample", "layer", "head"])["residual"].nunique() == 2).all()


def test_the_original_orders_measures_are_residual_smoothness_of_the_stored_head(stores):
    paths, tables = stores[True]
    t = tables[6]
    att = store.read_store(paths[1][0])
    f = att["scores"].values[1, 2].astype(np.float64)
    m = residual_smoothness(f, allowed=~np.triu(np.ones((N, N), dtype=bool), 1))
    row = t[(t["sample"] == 1) & (t["layer"] == 1) & (t["head"] == 2) & (t["order"] == "original")].iloc[0]
    assert list(m.measures) == list(THEOREM1_MEASURES)
    for k, want in m.measures.items():
        assert (np.isnan(row[k]) and np.isnan(want)) or row[k] == pytest.approx(want, rel=1e-12), k
    assert row["residual"] == pytest.approx(m.residual, rel=1e-12)
    assert row["corollary1_residual"] == pytest.approx(m.corollary1_residual, rel=1e-12)


def test_a_random_subset_of_heads_per_sample_is_seeded_and_stated(stores):
    _, tables = stores[False]
    t = tables[2]
    picked = {s: sorted({(int(a), int(b)) for a, b in zip(g["layer"], g["head"])}) for s, g in t.groupby("sample")}
    for s in (0, 1):
        assert picked[s] == chosen_heads(range(2), range(3), 2, 0, s)
        assert len(picked[s]) == 2
    # the same heads' rows as in the every-head table: a subset, not other numbers
    full = tables[6].set_index(["sample", "layer", "head", "order", "seed"])
    sub = t.set_index(["sample", "layer", "head", "order", "seed"])
    np.testing.assert_array_equal(full.loc[sub.index, "residual"].to_numpy(), sub["residual"].to_numpy())
    # other seeds draw other subsets somewhere; a sample's draw does not depend on the others
    draws = {tuple(chosen_heads(range(4), range(4), 3, seed, 0)) for seed in range(20)}
    assert len(draws) > 5
    assert chosen_heads(range(2), range(3), 6, 0, 0) == [(la, h) for la in range(2) for h in range(3)]


def test_samples_all_measures_every_store_and_a_number_the_first_ones(stores, tmp_path):
    paths, tables = stores[False]
    att = [p[0] for p in paths]
    kw = dict(max_heads=6, random_orders=2, seed=0, questionnaire2d_iters=2)
    theorem1("m", att, tmp_path / "all.csv", samples="all", **kw)
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "all.csv"), tables[6])
    theorem1("m", att, tmp_path / "one.csv", samples=1, **kw)
    one = pd.read_csv(tmp_path / "one.csv")
    assert set(one["sample"]) == {0}
    pd.testing.assert_frame_equal(one, tables[6][tables[6]["sample"] == 0])


def test_a_store_without_scores_gives_an_empty_table(tmp_path):
    n = 8
    probs = torch.softmax(torch.randn(1, 2, n, n), -1).numpy()
    ds = attention_dataset(np.log(probs), probs, np.arange(n), {"model": "m", "kind": "attention", "sample": 0})
    ds = ds.drop_vars("scores")  # attention files of probabilities only
    a = tmp_path / "a.zarr"
    store.write_store(ds, a)
    theorem1("m", [a], tmp_path / "t.csv", samples=1, max_heads=4, random_orders=1, seed=0, questionnaire2d_iters=1)
    t = pd.read_csv(tmp_path / "t.csv")
    assert list(t.columns) == COLUMNS and len(t) == 0


@pytest.mark.parametrize("causal", [False, True])
def test_the_curves_at_the_models_tau_are_the_tables_residuals(stores, causal):
    """Two code paths (the paraproduct of residual_smoothness, the temperature curve) give one
    residual at tau = 1 for every head, order and seed; the grid is the temperature figure's."""
    _, tables = stores[causal]
    t, c = tables[6], tables["curves6"]
    assert sorted(c["tau"].unique()) == pytest.approx([0.1, 10 ** -0.5, 1.0, 10 ** 0.5, 10.0])
    at1 = c[c["tau"] == 1.0].set_index(["sample", "layer", "head", "order", "seed"])["residual"]
    rows = t.set_index(["sample", "layer", "head", "order", "seed"])["residual"]
    assert len(at1) == len(rows) == len(c) // 5
    np.testing.assert_allclose(at1.loc[rows.index].to_numpy(), rows.to_numpy(), rtol=1e-9)
