"""What a decomposed store keeps (docs/method.md §6.6): by default the coarsest coefficients,
the level sums and the figure heads' coefficients; every coefficient with keep_coefficients.
The entropies and figures read from either give the same numbers."""
from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from oattn_lib import store
from oattn_lib.entropy import coarsest
from oattn_lib.stages.decompose import decompose
from oattn_lib.stages.entropy import entropy
from oattn_lib.stages.organize import organize

from test_faults import attention_store

FIG = [[0, 1], [-1, -1]]


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    """One sample of 3 layers x 2 heads at 40 tokens, organized, decomposed both ways."""
    root = tmp_path_factory.mktemp("dec")
    scores = np.random.default_rng(3).normal(size=(3, 2, 40, 40)) * 2
    att = attention_store(root / "att.zarr", scores)
    organize(att, root / "org.zarr", "probs", params={"n_iters": 2})
    for name, keep in (("coarse", False), ("all", True)):
        decompose(att, root / "org.zarr", root / f"{name}.zarr", "probs", figure_heads=FIG, questionnaire2d_iters=2,
                  random_tree_seeds=1, coarse_coefficients=300, keep_coefficients=keep)
    return root


def open_store(path):
    return xr.open_zarr(path, consolidated=False).load()


def disk_bytes(path):
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def test_the_default_store_keeps_the_coarsest_and_the_sums_of_every_coefficient(sample):
    coarse, full = open_store(sample / "coarse.zarr"), open_store(sample / "all.zarr")
    assert "bihaar" not in coarse and "trihaar" not in coarse and coarse.attrs["coefficients"] == "coarsest"
    assert full.attrs["coefficients"] == "all"
    c2, c3 = full["bihaar"].values, full["trihaar"].values
    assert coarse.sizes["coarse2"] == coarse.sizes["coarse3"] == 300
    sup = [coarse[f"support_{a}"].values for a in "qkh"]
    lev = [coarse[f"level_{a}"].values for a in "qkh"]
    # the kept coefficients are the coarsest, coarsest first, of this expansion
    assert coarse["coarse2_index"].values.tolist() == coarsest(sup[:2], lev[:2], 300).tolist()
    assert coarse["coarse3_index"].values.tolist() == coarsest(sup, lev, 300).tolist()
    np.testing.assert_array_equal(coarse["bihaar_coarse"].values, c2.reshape(-1, 6)[coarse["coarse2_index"].values])
    np.testing.assert_array_equal(coarse["trihaar_coarse"].values, c3.ravel()[coarse["coarse3_index"].values])
    # the level sums: per head, per (query level, key level), of every coefficient
    lq, lk = np.searchsorted(coarse["qlevel"].values, lev[0]), np.searchsorted(coarse["klevel"].values, lev[1])
    want = np.zeros((coarse.sizes["qlevel"], coarse.sizes["klevel"], 6))
    np.add.at(want, (lq[:, None], lk[None, :]), np.abs(c2.astype(np.float64)))
    np.testing.assert_allclose(coarse["bihaar_level_l1"].values, want, rtol=1e-12)
    assert coarse["trihaar_level_l2sq"].values.sum() == pytest.approx((c3.astype(np.float64) ** 2).sum(), rel=1e-12)
    # the figure heads' own coefficients: (layer 0, head 1) and (layer 2, head 1), units 1 and 5
    np.testing.assert_array_equal(coarse["fig_bihaar"].values, np.moveaxis(c2[:, :, [1, 5]], 2, 0))
    # what is left out is the full expansions (most of a store at 1024 tokens)
    dropped = sum(disk_bytes(sample / "all.zarr" / v) for v in ("bihaar", "trihaar"))
    assert dropped > 40_000 and disk_bytes(sample / "coarse.zarr") < disk_bytes(sample / "all.zarr") - dropped / 2


@pytest.mark.parametrize("top_k", [(1, 1), (37, 300), (300, 123)])
def test_entropies_from_the_kept_coefficients_equal_those_from_every_coefficient(sample, tmp_path, top_k):
    k2, k3 = top_k
    entropy([sample / "coarse.zarr"], tmp_path / "a.zarr", k2, k3)
    entropy([sample / "all.zarr"], tmp_path / "b.zarr", k2, k3)
    a, b = open_store(tmp_path / "a.zarr"), open_store(tmp_path / "b.zarr")
    for v in ("head_entropy", "head_sparsity", "network_entropy", "network_sparsity"):
        np.testing.assert_allclose(a[v].values, b[v].values, rtol=1e-12, err_msg=v)
    # and they are the sums of the engine's definitions, not of some other prefix
    from oattn_lib.entropy import coarse_l1, l1_over_l2
    full = open_store(sample / "all.zarr")
    sup = [full[f"support_{x}"].values for x in "qk"]
    lev = [full[f"level_{x}"].values for x in "qk"]
    np.testing.assert_allclose(a["head_entropy"].values[0].ravel(), coarse_l1(full["bihaar"].values, sup, lev, k2),
                               rtol=1e-12)
    np.testing.assert_allclose(a["network_sparsity"].values[0], l1_over_l2(full["trihaar"].values.ravel(), 0),
                               rtol=1e-12)


def test_a_top_k_beyond_the_kept_coefficients_names_the_keys_and_writes_nothing(sample, tmp_path):
    out = tmp_path / "ent.zarr"
    with pytest.raises(ValueError, match=r"coarse\.zarr: keeps the 300 coarsest bi-Haar coefficients, fewer than "
                                         r"entropy\.head_top_k = 301; raise decompose\.coarse_coefficients or set "
                                         r"decompose\.keep_coefficients: true"):
        entropy([sample / "coarse.zarr"], out, 301, 10)
    assert not out.exists()
    # a store that keeps every coefficient serves any top_k
    entropy([sample / "all.zarr"], out, 1000, 5000)
    assert open_store(out)["head_top_k"].values.tolist() == [1000]


def test_figure_6_reads_the_coarsest_tri_haar_coefficients(sample):
    from oattn_lib.stages.figures import _coarsest_trihaar
    full = open_store(sample / "all.zarr")
    sup = [full[f"support_{a}"].values for a in "qkh"]
    lev = [full[f"level_{a}"].values for a in "qkh"]
    want = full["trihaar"].values.ravel()[coarsest(sup, lev, 500)]
    np.testing.assert_array_equal(_coarsest_trihaar(sample / "coarse.zarr", 200), want[:200])
    np.testing.assert_array_equal(_coarsest_trihaar(sample / "all.zarr", 500), want)
    with pytest.raises(ValueError, match=r"keeps the 300 coarsest tri-Haar coefficients, fewer than "
                                         r"figures\.trihaar_top_k = 500"):
        _coarsest_trihaar(sample / "coarse.zarr", 500)


def test_a_bad_coarse_count_is_named(sample, tmp_path):
    with pytest.raises(ValueError, match=r"decompose\.coarse_coefficients: expected a positive integer, got 0"):
        decompose(sample / "att.zarr", sample / "org.zarr", tmp_path / "d.zarr", "probs", figure_heads=FIG,
                  questionnaire2d_iters=1, random_tree_seeds=1, coarse_coefficients=0)
    assert not (tmp_path / "d.zarr").exists()
    assert store.store_path(sample / "coarse.zarr").exists()
