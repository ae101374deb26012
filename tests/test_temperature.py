"""Where Theorem 1 holds: the residual against logit temperature, the masked reference of causal
heads, the crossover, and the figure stage that writes them (oattn_lib.temperature)."""
import json

import numpy as np
import pytest
import torch
import xarray as xr

from oattn_lib import plots, store
from oattn_lib.paraproduct import paraproduct
from oattn_lib.stages.figures import _temperature
from scored_stores import scored_samples
from oattn_lib.temperature import (
    attention_mask,
    crossover,
    geometric_mean,
    relative_residual,
    residual_curve,
    temperature_grid,
)

RNG = np.random.default_rng(0)


def smooth_head(n=16, m=16, noise=0.3, seed=0):
    rng = np.random.default_rng(seed)
    x = np.linspace(0, 1, n)[:, None] + 2 * np.linspace(0, 1, m)[None] ** 2
    return 3 * x + noise * rng.standard_normal((n, m))


def masked_oracle(f, causal, row_order=None, col_order=None):
    """The masked reference computed otherwise: torch's masked softmax (as the model computes it)
    and the paraproduct's approximation of exp(f) (its softmax approximation times the full row
    sums), masked and divided by the masked row sums."""
    r = np.arange(f.shape[0]) if row_order is None else row_order
    c = np.arange(f.shape[1]) if col_order is None else col_order
    pp = paraproduct(f, r, c)
    g, m = pp.organized, causal[np.ix_(r, c)]
    ref = torch.softmax(torch.from_numpy(g).masked_fill(torch.from_numpy(m), float("-inf")), 1).numpy()
    approx_exp = pp.approximation * np.exp(g - g.max(1, keepdims=True)).sum(1, keepdims=True)
    z_masked = np.where(m, 0.0, np.exp(g - g.max(1, keepdims=True))).sum(1, keepdims=True)
    approx = np.where(m, 0.0, approx_exp / z_masked)
    return np.linalg.norm(ref - approx) / np.linalg.norm(ref)


# -- the grid -------------------------------------------------------------------------------
def test_grid_is_log_spaced_over_the_range_and_holds_the_model_tau():
    t = temperature_grid(17)
    assert t.size == 17 and t[0] == pytest.approx(0.1) and t[-1] == pytest.approx(10.0)
    assert t[8] == 1.0
    np.testing.assert_allclose(np.diff(np.log(t)), np.log(100) / 16)
    t4 = temperature_grid(4)
    assert t4.size == 5 and 1.0 in t4 and np.all(np.diff(t4) > 0)
    with pytest.raises(ValueError, match="n:"):
        temperature_grid(1)


# -- the residual, unmasked and masked --------------------------------------------------------
def test_unmasked_residual_is_the_paraproducts():
    f = smooth_head()
    r, c = RNG.permutation(16), RNG.permutation(16)
    want = paraproduct(f, r, c).relative_residual
    assert relative_residual(f, r, c) == want  # the same code on the same head: exactly
    # A mask that allows everything takes the masked path: exp(f - rowmax) / Z instead of
    # torch.softmax, which rounds differently (per entry a few ulps, differently per CPU: the
    # kernels are vectorised). The ratio (~0.9 here) moves by about as much; a mask that
    # dropped or kept a wrong entry would move it by orders of magnitude more.
    assert relative_residual(f, r, c, allowed=np.ones_like(f, dtype=bool)) == pytest.approx(want, rel=1e-13)


@pytest.mark.parametrize("organized", [False, True])
def test_masked_residual_is_against_the_models_masked_softmax(organized):
    f = smooth_head(20, 20, noise=1.0, seed=1)
    causal = np.triu(np.ones((20, 20), dtype=bool), 1)
    r, c = (RNG.permutation(20), RNG.permutation(20)) if organized else (None, None)
    got = relative_residual(f, r, c, allowed=~causal)
    assert got == pytest.approx(masked_oracle(f, causal, r, c), rel=1e-9)
    # a softmax over the future positions is another number
    assert abs(got - paraproduct(f, r, c).relative_residual) > 1e-3 * got


def test_masked_residual_permutes_the_mask_with_the_head():
    """Masking the organized head with the unpermuted mask would be a plausible bug."""
    f = smooth_head(12, 12, noise=1.0, seed=2)
    causal = np.triu(np.ones((12, 12), dtype=bool), 1)
    r, c = RNG.permutation(12), RNG.permutation(12)
    got = relative_residual(f, r, c, allowed=~causal)
    wrong = masked_oracle(f[np.ix_(r, c)], causal)  # mask not permuted
    assert got == pytest.approx(masked_oracle(f, causal, r, c), rel=1e-9)
    assert abs(got - wrong) > 1e-3 * got


def test_residual_vanishes_as_the_temperature_goes_to_zero_and_grows_with_it():
    f = smooth_head(noise=1.0)
    taus = np.array([1e-3, 1e-2, 0.1, 1.0])
    curve = residual_curve(f, taus, allowed=~np.triu(np.ones((16, 16), dtype=bool), 1))
    assert np.all(np.diff(curve) > 0) and curve[0] < 1e-4
    # second order in tau: a tenth of the temperature, about a hundredth of the residual
    assert curve[0] / curve[1] == pytest.approx(0.01, rel=0.2)


def test_curve_at_tau_one_is_the_residual_and_not_finite_is_nan():
    f = smooth_head()
    assert residual_curve(f, [1.0])[0] == relative_residual(f)  # tau = 1 runs the same computation: exactly
    # rows at +-800 in random order: the approximation is not representable in float64
    g = np.where(RNG.random((32, 1)) < 0.5, 800.0, -800.0) + RNG.standard_normal((32, 32))
    out = residual_curve(g, [1e-3, 1.0])
    assert np.isfinite(out[0]) and np.isnan(out[1])
    with pytest.raises(ValueError, match="row_order"):  # a wrong order is an error, not a NaN
        residual_curve(f, [1.0], row_order=np.zeros(16, dtype=int))


def test_attention_mask_is_what_every_head_of_the_layer_masks():
    causal = np.triu(np.ones((6, 6), dtype=bool), 1)
    probs = np.where(causal, 0.0, 1.0)[None].repeat(3, 0)
    probs[1, 4, 0] = 0.0  # one head's probability underflowed: not a mask
    assert np.array_equal(attention_mask(probs), causal)
    assert not attention_mask(np.ones((2, 4, 4))).any()
    with pytest.raises(ValueError, match="probs"):
        attention_mask(np.ones((4, 4)))


# -- the crossover ----------------------------------------------------------------------------
def test_crossover_interpolates_in_log_tau_and_log_residual():
    taus = np.array([0.1, 1.0, 10.0])
    base = np.array([1.0, 1.0, 1.0])
    org = np.array([0.1, 0.1, 10.0])  # crosses between 1 and 10, where log org goes -log10 -> log10
    x = crossover(taus, org, base)
    assert x.status == "stops beating" and x.tau == pytest.approx(np.sqrt(10.0))
    assert "τ < 3.16" in x.describe("original order's", 0.1, 10)


@pytest.mark.parametrize("org, status, tau", [
    ([0.1, 0.2, 0.3], "beats throughout", None),
    ([2.0, 3.0, 4.0], "never beats", None),
    ([2.0, 0.5, 0.5], "starts beating", None),
    ([0.5, np.nan, np.nan], "stops beating", 1.0),  # not finite counts as +inf: it loses
])
def test_crossover_cases(org, status, tau):
    x = crossover([0.1, 1.0, 10.0], org, [1.0, 1.0, 1.0])
    assert x.status == status
    if tau is not None:
        assert x.tau == pytest.approx(tau)
    assert ("no crossover" in x.describe("b", 0.1, 10)) == (status != "stops beating")


def test_crossover_flips_when_the_organized_curve_crosses_the_baseline():
    taus = temperature_grid(9)
    base = np.full(taus.size, 1.0)
    below = np.full(taus.size, 0.9)
    assert crossover(taus, below, base).status == "beats throughout"
    below[6] = 1.1
    x = crossover(taus, below, base)
    assert x.status == "stops beating" and taus[5] < x.tau < taus[6] and x.n_changes == 2


def test_geometric_mean_propagates_not_finite():
    np.testing.assert_allclose(geometric_mean([[1.0, 4.0], [4.0, np.nan]], axis=0), [2.0, np.nan])


# -- the figure -------------------------------------------------------------------------------
def test_temperature_figure_draws_geometric_means_bands_and_marks():
    taus = temperature_grid(5)
    org = RNG.random((2, 3, taus.size)) + 0.1
    rnd = RNG.random((2, 6, taus.size)) + 0.1
    rnd[1, 0, -1] = np.nan
    fig = plots.fig_temperature(taus, {"organized": org, "random": rnd}, ["0.0", "1.1"], "t",
                                marks=[{"random": 2.0}, {"random": None}])
    ax0, ax1 = fig.axes[:2]
    lines = [ln for ln in ax0.lines if ln.get_gid() == "order"]
    np.testing.assert_allclose(lines[0].get_ydata(), geometric_mean(org[0], 0))
    assert ax0.get_xscale() == ax1.get_xscale() == "log"
    assert [ln.get_xdata()[0] for ln in ax0.lines if ln.get_gid() == "crossover"] == [2.0]
    assert not [ln for ln in ax1.lines if ln.get_gid() == "crossover"]
    bad = [ln for ln in ax1.lines if ln.get_gid() == "not-finite"]
    assert len(bad) == 1 and bad[0].get_xdata()[0] == taus[-1]
    assert [ln.get_xdata()[0] for ln in ax0.lines if ln.get_gid() == "model-tau"] == [1.0]
    with pytest.raises(ValueError, match="marks"):
        plots.fig_temperature(taus, {"organized": org}, ["a", "b"], marks=[{"x": 1.0}, {}])
    with pytest.raises(ValueError, match="curves"):
        plots.fig_temperature(taus, {"organized": org[:, :, :2]}, ["a", "b"])


# -- the stage, on stores the real organize and decompose stages wrote ------------------------------
def test_decompose_stores_the_orders_of_its_organized_head(stores):
    """The figure heads' 2-D orders are stored, and they are the ones fig_organized2d used."""
    from oattn_lib.network import read_network
    for paths, _ in stores.values():
        for apath, dpath in paths:
            dec = xr.open_zarr(dpath, consolidated=False).load()
            att = xr.open_zarr(apath, consolidated=False).load()
            # the paraproduct's head: the scores as the model computed them (its mask handled by §7.5)
            logits = read_network(att, "scores", masked="keep")
            for j, (layer, head) in enumerate(zip(dec["fig_layer"].values, dec["fig_head_index"].values)):
                g = logits.head(layer, head)
                r, c = dec["fig_row_order"].values[j], dec["fig_col_order"].values[j]
                assert sorted(r) == list(range(g.shape[0])) and sorted(c) == list(range(g.shape[1]))
                np.testing.assert_array_equal(dec["fig_organized2d"].values[j], g[np.ix_(r, c)].astype(np.float32))


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """Two samples of a 2-layer x 2-head network, causal or not, through organize and decompose."""
    root = tmp_path_factory.mktemp("temperature")
    rng = np.random.default_rng(3)
    out = {}
    for causal in (False, True):
        paths = scored_samples(root, rng, (2, 2, 12), causal)
        outs = {k: root / f"{causal}.{k}" for k in ("temperature_csv", "temperature_json", "temperature_finding")}
        outs["temperature"] = root / f"{causal}.png"
        _temperature("m", [p[0] for p in paths], [p[1] for p in paths], outs, 5, 2, None)
        out[causal] = (paths, outs)
    return out


@pytest.mark.parametrize("causal", [False, True])
def test_stage_curve_at_tau_one_is_the_decompose_stages_residual(stores, causal):
    """Figure 2's residuals (decompose) and the temperature curve at the model's tau agree,
    masked softmax included for a causal head."""
    import pandas as pd
    paths, outs = stores[causal]
    curves = pd.read_csv(outs["temperature_csv"])
    at1 = curves[curves["tau"] == 1.0]
    for s, (_, d) in enumerate(paths):
        dec = store.read_store(d)
        for j, (layer, head) in enumerate(zip(dec["fig_layer"].values, dec["fig_head_index"].values)):
            row = at1[(at1["sample"] == s) & (at1["layer"] == layer) & (at1["head"] == head)]
            org = row[row["order"] == "2-D organized"]["rel_residual"].item()
            orig = row[row["order"] == "original"]["rel_residual"].item()
            assert org == pytest.approx(float(dec["fig_rel_residual"].values[j]), rel=1e-12)
            assert orig == pytest.approx(float(dec["fig_rel_residual_unorganized"].values[j]), rel=1e-12)
    summary = json.loads(outs["temperature_json"].read_text())
    assert (summary["masked_entries"] > 0) == causal
    want = geometric_mean(at1[at1["order"] == "2-D organized"]["rel_residual"].to_numpy()[:, None], 0)[0]
    assert summary["at_model_tau"]["2-D organized"] == pytest.approx(want)
    assert outs["temperature"].stat().st_size > 10_000


def test_stage_compares_a_causal_head_with_its_masked_softmax(stores):
    import pandas as pd
    paths, outs = stores[True]
    curves = pd.read_csv(outs["temperature_csv"])
    at1 = curves[(curves["tau"] == 1.0) & (curves["order"] == "original")]
    a, d = paths[0]
    att, dec = store.read_store(a), store.read_store(d)
    layer, head = int(dec["fig_layer"].values[0]), int(dec["fig_head_index"].values[0])
    f = att["scores"].values[layer, head].astype(np.float64)
    causal = np.triu(np.ones(f.shape, dtype=bool), 1)
    got = at1[(at1["sample"] == 0) & (at1["layer"] == layer) & (at1["head"] == head)]["rel_residual"].item()
    assert got == pytest.approx(masked_oracle(f, causal), rel=1e-9)
    # never the softmax over future positions, which Figure 2 (decompose) no longer uses either
    assert got != pytest.approx(paraproduct(f).relative_residual, rel=1e-3)
    assert got == pytest.approx(float(dec["fig_rel_residual_unorganized"].values[0]), rel=1e-12)
    summary = json.loads(outs["temperature_json"].read_text())
    assert summary["masked_entries"] == 2 * 2 * (12 * 11 // 2)  # 2 samples x 2 heads
    assert "masked softmax" in outs["temperature_finding"].read_text()


def test_crossover_counts_per_head_sample_against_the_geometric_mean_of_random_orders():
    import pandas as pd

    from oattn_lib.temperature import crossover_counts

    taus = [0.1, 1.0, 10.0]
    rows = []

    def add(head, order, seed, values):
        rows.extend({"sample": 0, "layer": 0, "head": head, "order": order, "seed": seed, "tau": t, "residual": v}
                    for t, v in zip(taus, values))

    # head 0: below the original everywhere; head 1: stops beating it between tau 1 and 10
    add(0, "2-D organized", -1, [0.1, 0.2, 0.4])
    add(0, "original", -1, [0.2, 0.3, 0.5])
    add(1, "2-D organized", -1, [0.1, 0.2, 0.8])
    add(1, "original", -1, [0.2, 0.4, 0.4])
    orig = crossover_counts(pd.DataFrame(rows), "original")
    assert orig["n"] == 2 and orig["status"] == {"beats throughout": 1, "stops beating": 1}
    assert 1.0 < orig["tau"][0] < 10.0
    # random orders 0.01 and 1 at every tau: geometric mean 0.1, arithmetic 0.505; organized 0.3
    rows.clear()
    add(2, "2-D organized", -1, [0.3] * 3)
    add(2, "random", 0, [0.01] * 3)
    add(2, "random", 1, [1.0] * 3)
    assert crossover_counts(pd.DataFrame(rows), "random")["status"] == {"never beats": 1}
    assert crossover_counts(pd.DataFrame(rows), "original")["n"] == 0


def test_crossover_counts_is_crossover_on_every_head_sample():
    import pandas as pd

    from oattn_lib.temperature import crossover, crossover_counts, geometric_mean

    rng = np.random.default_rng(7)
    taus = temperature_grid(9)
    rows, curves = [], {}
    for s, h in np.ndindex(4, 6):
        org = np.exp(rng.normal(0, 1, taus.size).cumsum() * 0.3)
        seeds = np.exp(rng.normal(0, 1, (2, taus.size)).cumsum(1) * 0.3)
        if (s + h) % 7 == 0:
            org[rng.integers(taus.size)] = np.nan                     # not representable somewhere
        if (s + h) % 5 == 0:
            seeds[1, rng.integers(taus.size)] = np.nan
        curves[(s, h)] = (org, seeds)
        rows += [{"sample": s, "layer": 0, "head": h, "order": "2-D organized", "seed": -1, "tau": t, "residual": v}
                 for t, v in zip(taus, org)]
        rows += [{"sample": s, "layer": 0, "head": h, "order": "random", "seed": k, "tau": t, "residual": v}
                 for k in range(2) for t, v in zip(taus, seeds[k])]
    got = crossover_counts(pd.DataFrame(rows), "random")
    want = [crossover(taus, o, geometric_mean(b, axis=0)) for o, b in curves.values()]
    status = {}
    for x in want:
        status[x.status] = status.get(x.status, 0) + 1
    assert got["n"] == 24 and got["status"] == status and len(status) > 2
    np.testing.assert_allclose(got["tau"], sorted(x.tau for x in want if x.status == "stops beating"), rtol=1e-12)
