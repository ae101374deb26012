"""Paraproduct decomposition of softmax (docs/method.md §7)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from scipy.ndimage import gaussian_filter

from oattn_lib.paraproduct import (APPROXIMATIONS, ROW_SUM_FLOOR, approximations, block_averages, paraproduct,
                                   relative_residuals, telescoping_sum)
from oattn_lib.trees import balanced_tree

SHAPES = [(1, 1), (2, 3), (7, 5), (16, 16), (197, 197)]


def _smooth_head(n, m, seed=0, sigma=4.0):
    rng = np.random.default_rng(seed)
    f = gaussian_filter(rng.normal(size=(n, m)), sigma, mode="wrap")
    return (f - f.mean()) / f.std()


def _sincos(n=197, m=197):
    i, j = np.arange(n)[:, None], np.arange(m)[None, :]
    return np.sin(i / 20) * np.cos(j / 30)


def _reference(f, n_scales=None, cross=True):
    """Brute force, entry by entry and scale by scale, for small heads (n_scales: (J_r, J_c)
    refinements, default down to single entries; cross=False: the mixed terms without Dx Dy)."""
    n, m = f.shape
    tr, tc = balanced_tree(np.arange(n)).labels, balanced_tree(np.arange(m)).labels

    def avg(j, k):
        out = np.empty_like(f)
        for a in range(n):
            for b in range(m):
                out[a, b] = f[np.ix_(tr[j] == tr[j, a], tc[k] == tc[k, b])].mean()
        return out

    jr, jc = n_scales or (tr.shape[0] - 1, tc.shape[0] - 1)
    e = {(j, k): avg(j, k) for j in range(jr + 1) for k in range(jc + 1)}
    approx = np.exp(e[0, 0])
    for j in range(jr):
        approx = approx + np.exp(e[j, 0]) * (e[j + 1, 0] - e[j, 0])
    for k in range(jc):
        approx = approx + np.exp(e[0, k]) * (e[0, k + 1] - e[0, k])
    for j in range(jr):
        for k in range(jc):
            d = e[j + 1, k + 1] - e[j, k + 1] - e[j + 1, k] + e[j, k]
            dx, dy = e[j + 1, k] - e[j, k], e[j, k + 1] - e[j, k]
            approx = approx + np.exp(e[j, k]) * (d + dx * dy if cross else d)
    return e, approx / np.exp(f).sum(1, keepdims=True)


@pytest.mark.parametrize("shape", SHAPES)
def test_telescoping_sum_is_exact(shape):
    f = 2.0 * np.random.default_rng(1).normal(size=shape)
    shifted = np.exp(f - f.max(1, keepdims=True))
    tel = telescoping_sum(f)
    assert tel.dtype == np.float64
    np.testing.assert_allclose(tel, shifted, rtol=1e-6, atol=1e-6 * shifted.max())


def test_telescoping_sum_truncated_ends_at_block_averages():
    f = np.random.default_rng(2).normal(size=(13, 9))
    tel = telescoping_sum(f, n_scales=(2, 1))
    want = np.exp(block_averages(f, 2, 1) - f.max(1, keepdims=True))
    np.testing.assert_allclose(tel, want, rtol=1e-10)


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (7, 5), (6, 11)])
def test_matches_brute_force_reference(shape):
    f = np.random.default_rng(3).normal(size=shape)
    e, approx = _reference(f)
    np.testing.assert_allclose(paraproduct(f).approximation, approx, rtol=1e-10, atol=1e-13)
    for (j, k), avg in e.items():
        np.testing.assert_allclose(block_averages(f, j, k), avg, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("shape, n_scales", [((7, 5), (1, 2)), ((13, 9), (2, 0)), ((6, 11), (0, 3)),
                                             ((16, 12), (3, 3))])
def test_truncated_scales_match_brute_force_reference(shape, n_scales):
    # the terms end at folders of the coarser levels, expanded to entries at the end
    f = 2.0 * np.random.default_rng(8).normal(size=shape)
    _, approx = _reference(f, n_scales)
    np.testing.assert_allclose(paraproduct(f, n_scales=n_scales).approximation, approx, rtol=1e-10, atol=1e-13)


def test_residuals_over_temperatures_are_the_paraproducts_of_the_scaled_head():
    rng = np.random.default_rng(9)
    f = 3.0 * _smooth_head(45, 38)
    r, c = rng.permutation(45), rng.permutation(38)
    allowed = np.tril(np.ones((45, 38), dtype=bool))
    taus = [0.1, 0.5, 1.0, 4.0]
    got = relative_residuals(f, taus, r, c, allowed=allowed)
    want = [paraproduct(t * f, r, c, allowed=allowed).relative_residual for t in taus]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert got[2] == paraproduct(f, r, c, allowed=allowed).relative_residual  # tau = 1: exactly its computation
    # +-800 rows: not representable at tau = 1, representable at tau = 0.5 (+-400)
    far = relative_residuals(FAR_APART["+-800"], [0.5, 1.0])
    assert np.isfinite(far[0]) and np.isnan(far[1])
    for bad in ([0.0, 1.0], [-1.0], [[1.0]], [np.nan]):
        with pytest.raises(ValueError, match="taus"):
            relative_residuals(f, bad)
    with pytest.raises(ValueError, match="row_order"):
        relative_residuals(f, [1.0], row_order=np.zeros(45, dtype=int))


def test_finest_block_average_is_the_head_and_coarsest_its_mean():
    f = np.random.default_rng(4).normal(size=(197, 197))
    jr = balanced_tree(np.arange(197)).n_levels - 1
    np.testing.assert_allclose(block_averages(f, jr, jr), f, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(block_averages(f, 0, 0), np.full_like(f, f.mean()), rtol=1e-12)


def test_residual_is_quadratic_in_the_amplitude():
    # the approximation keeps every first-order term and the second-order cross terms, so
    # the residual of A(s f) shrinks like s^2 as s -> 0 (measured exponent 2.0000 on
    # [1e-3, 1e-2]); dropping a first-order term would make it linear
    f = _smooth_head(64, 48)
    amps = np.array([1e-3, 1e-2, 1e-1, 1.0])
    rr = np.array([paraproduct(s * f).relative_residual for s in amps])
    assert (np.diff(rr) > 0).all()
    exponent = np.log(rr[1] / rr[0]) / np.log(amps[1] / amps[0])
    assert abs(exponent - 2.0) < 0.01, exponent


def _leading_residual(f):
    """The s^2 coefficient of the exp residual of s f, from Taylor expansion by scale.

    One-dimensional difference: e^E (e^Dx - 1) - e^E Dx = e^E Dx^2 / 2 + O(3).
    Mixed: e^E (e^(Dx+Dy+D) - e^Dx - e^Dy + 1) - e^E (D + Dx Dy)
         = e^E (D (Dx + Dy) + D^2 / 2) + O(3).
    At s -> 0, e^E -> 1 and the softmax divides by Z -> M.
    """
    n, m = f.shape
    jr, jc = balanced_tree(np.arange(n)).n_levels - 1, balanced_tree(np.arange(m)).n_levels - 1
    e = {(j, k): block_averages(f, j, k) for j in range(jr + 1) for k in range(jc + 1)}
    r = np.zeros_like(f)
    for j in range(jr):
        r += (e[j + 1, 0] - e[j, 0]) ** 2 / 2
    for k in range(jc):
        r += (e[0, k + 1] - e[0, k]) ** 2 / 2
    for j in range(jr):
        for k in range(jc):
            dx, dy = e[j + 1, k] - e[j, k], e[j, k + 1] - e[j, k]
            d = e[j + 1, k + 1] - e[j, k + 1] - e[j + 1, k] + e[j, k]
            r += d * (dx + dy) + d ** 2 / 2
    return r


@pytest.mark.parametrize("head", ["smooth", "sincos", "noise"])
def test_leading_residual_term(head):
    # residual(s f) * M / s^2 -> the Taylor coefficient, entry by entry (measured
    # agreement 4e-5 to 1.3e-4 of its maximum at s = 1e-4: the O(s) correction)
    f = {"smooth": _smooth_head(40, 30), "sincos": _sincos(37, 29),
         "noise": np.random.default_rng(0).normal(size=(13, 11))}[head]
    s = 1e-4
    got = paraproduct(s * f).residual * f.shape[1] / s ** 2
    want = _leading_residual(f)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-3 * np.abs(want).max())


# Heads whose rows sit at very different levels: block averages mix rows, so a row's
# terms can exceed its own values by the spread between rows.
def _rows_apart(level, n=32, m=24, noise=1.0, kind="halves", seed=0):
    rng = np.random.default_rng(seed)
    sign = np.where(np.arange(n) < n // 2, 1.0, -1.0) if kind == "halves" \
        else rng.choice([-1.0, 1.0], size=n)
    return level * sign[:, None] + noise * rng.normal(size=(n, m))


FAR_APART = {"+-400": _rows_apart(400), "+-800": _rows_apart(800),
             "+-40, noise 8": _rows_apart(40, 64, 64, noise=8.0, kind="random")}


@pytest.mark.parametrize("case", list(FAR_APART))
def test_telescoping_is_exact_when_rows_are_far_apart(case):
    # the terms of a -400 row reach exp(800) times its values; summed as floats they
    # missed exp(f - rowmax) by 0.4 (+-400), gave inf (+-800) and 6e8 (+-40, noise 8)
    f = FAR_APART[case]
    want = np.exp(f - f.max(1, keepdims=True))
    np.testing.assert_allclose(telescoping_sum(f), want, rtol=1e-6, atol=1e-6)


def test_approximation_is_finite_and_accurate_when_rows_are_far_apart():
    # +-400: the approximation of the softmax of a -400 row is about 1e175, representable;
    # the brute-force reference (no shifts at all) still fits in float64 here
    f = _rows_apart(400, 8, 6)
    p = paraproduct(f)
    _, approx = _reference(f)
    assert np.isfinite(approx).all() and np.abs(approx).max() > 1e170
    np.testing.assert_allclose(p.approximation, approx, rtol=1e-9)
    np.testing.assert_allclose(p.residual, p.exact - p.approximation, rtol=1e-12)
    big = np.abs(p.residual).max()
    want = big * np.linalg.norm(p.residual / big) / np.linalg.norm(p.exact)
    assert np.isfinite(p.relative_residual) and p.relative_residual == pytest.approx(want, rel=1e-12)
    for case in ("+-400", "+-40, noise 8"):
        p = paraproduct(FAR_APART[case])
        assert np.isfinite(p.approximation).all() and np.isfinite(p.residual).all()
        assert np.isfinite(p.relative_residual)


def test_unrepresentable_results_raise_naming_f():
    # +-800: the approximation of the softmax of a -800 row is about 800 e^800 / M, near
    # 1e349 (50-digit arithmetic): no float64 holds it
    with pytest.raises(ValueError, match=r"^f: .*not representable in float64"):
        paraproduct(FAR_APART["+-800"])
    with pytest.raises(ValueError, match=r"^f: .*not representable in float64"):
        telescoping_sum(FAR_APART["+-800"], n_scales=(0, 3))  # ends at exp(mean - rowmax)
    with pytest.raises(ValueError, match=r"^f: .*overflow"):
        paraproduct(1e307 * np.random.default_rng(0).normal(size=(6, 5)))
    for bad in (np.inf, -np.inf, np.nan):
        f = np.zeros((4, 4))
        f[1, 2] = bad
        for fn in (paraproduct, telescoping_sum):
            with pytest.raises(ValueError, match=r"^f: contains NaN or inf"):
                fn(f)


def test_rows_sum_to_one_and_parts_are_consistent():
    f = 3.0 * _smooth_head(40, 30)
    p = paraproduct(f)
    np.testing.assert_allclose(p.exact.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(p.exact, torch.softmax(torch.from_numpy(f), 1).numpy(), rtol=1e-12)
    np.testing.assert_allclose(p.residual, p.exact - p.approximation, rtol=0, atol=1e-15)
    assert p.relative_residual == pytest.approx(
        np.linalg.norm(p.residual) / np.linalg.norm(p.exact), rel=1e-12)
    assert p.n_scales == (6, 5)


def test_single_scale_keeps_only_the_mean():
    f = np.random.default_rng(5).normal(size=(8, 8))
    p = paraproduct(f, n_scales=0)
    want = np.exp(f.mean()) / np.exp(f).sum(1, keepdims=True)
    np.testing.assert_allclose(p.approximation, np.broadcast_to(want, f.shape), rtol=1e-12)


def test_permutation_consistency():
    rng = np.random.default_rng(6)
    head = _sincos(31, 23)
    p, q = rng.permutation(31), rng.permutation(23)
    scrambled = head[p][:, q]
    res = paraproduct(scrambled, row_order=np.argsort(p), col_order=np.argsort(q))
    ref = paraproduct(head)
    np.testing.assert_array_equal(res.organized, head)
    np.testing.assert_allclose(res.approximation, ref.approximation, rtol=1e-12)
    assert res.relative_residual == pytest.approx(ref.relative_residual, rel=1e-12)
    np.testing.assert_array_equal(res.row_order, np.argsort(p))


def test_constant_shift_invariance_and_range():
    # adding a constant to the head scales every term by the same factor; a per-row
    # shift does not (coarse block averages mix rows), although softmax itself is
    f = _smooth_head(20, 17)
    a, b = paraproduct(f), paraproduct(f + 30.0)
    np.testing.assert_allclose(a.approximation, b.approximation, rtol=1e-9)
    rows = np.random.default_rng(7).normal(size=(20, 1)) * 5
    c = paraproduct(f + rows)
    np.testing.assert_allclose(c.exact, a.exact, rtol=1e-12)
    assert not np.allclose(c.approximation, a.approximation)
    big = paraproduct(f * 200.0)  # scores spanning hundreds: no overflow
    assert np.isfinite(big.approximation).all() and np.isfinite(big.relative_residual)


def test_torch_and_float32_input():
    f = _smooth_head(12, 10)
    ref = paraproduct(f)
    out = paraproduct(torch.from_numpy(f.astype(np.float32)))
    assert isinstance(out.approximation, torch.Tensor) and out.approximation.dtype == torch.float64
    np.testing.assert_allclose(out.approximation.numpy(), ref.approximation, rtol=1e-5, atol=1e-7)
    assert isinstance(telescoping_sum(torch.from_numpy(f)), torch.Tensor)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 24), m=st.integers(1, 24), seed=st.integers(0, 2**16))
def test_telescoping_and_rows_for_any_shape(n, m, seed):
    f = np.random.default_rng(seed).normal(size=(n, m))
    p = paraproduct(f)
    assert p.approximation.shape == (n, m)
    np.testing.assert_allclose(p.exact.sum(1), 1.0, rtol=1e-12)
    np.testing.assert_allclose(telescoping_sum(f), np.exp(f - f.max(1, keepdims=True)), rtol=1e-9)


@pytest.mark.parametrize("kwargs, name", [
    (dict(f=np.zeros((2, 2, 2))), "f"),
    (dict(f=np.array([[0.0, np.nan]])), "f"),
    (dict(f=np.zeros((0, 3))), "f"),
    (dict(f=np.zeros((3, 4)), row_order=[0, 1, 1]), "row_order"),
    (dict(f=np.zeros((3, 4)), row_order=[0, 1]), "row_order"),
    (dict(f=np.zeros((3, 4)), row_order=[0.5, 1, 2]), "row_order"),
    (dict(f=np.zeros((3, 4)), col_order=[3, 2, 1, 4]), "col_order"),
    (dict(f=np.zeros((3, 4)), col_order=np.arange(4).reshape(2, 2)), "col_order"),
    (dict(f=np.zeros((3, 4)), n_scales=-1), "n_scales"),
    (dict(f=np.zeros((3, 4)), n_scales=(1, 2, 3)), "n_scales"),
])
def test_bad_input_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        paraproduct(**kwargs)


def test_masked_head_is_compared_with_the_models_masked_softmax():
    """A causal head: `exact` is the masked softmax (never a softmax over future positions),
    the approximation vanishes where the model may not look, and an all-allowed mask is no mask."""
    rng = np.random.default_rng(5)
    f = rng.standard_normal((11, 11))
    causal = np.tril(np.ones((11, 11), dtype=bool))
    r, c = rng.permutation(11), rng.permutation(11)
    pp = paraproduct(f, row_order=r, col_order=c, allowed=causal)
    want = torch.softmax(torch.from_numpy(f).masked_fill(torch.from_numpy(~causal), float("-inf")), -1).numpy()
    np.testing.assert_allclose(pp.exact, want[np.ix_(r, c)], atol=1e-15)
    assert (pp.approximation[~causal[np.ix_(r, c)]] == 0).all()
    # the same decomposition of exp(f), renormalised by the masked row sums
    full = paraproduct(f, row_order=r, col_order=c)
    z_full, z_mask = np.exp(f).sum(1), np.where(causal, np.exp(f), 0).sum(1)
    scale = (z_full / z_mask)[r][:, None]
    keep = causal[np.ix_(r, c)]
    np.testing.assert_allclose(pp.approximation[keep], (full.approximation * scale)[keep], rtol=1e-12)
    assert pp.relative_residual != pytest.approx(full.relative_residual, rel=1e-3)
    same = paraproduct(f, row_order=r, col_order=c, allowed=np.ones((11, 11), dtype=bool))
    np.testing.assert_allclose(same.approximation, full.approximation, rtol=1e-12)
    with pytest.raises(ValueError, match="allowed"):
        paraproduct(f, allowed=causal[:5])


@pytest.mark.parametrize("causal", [False, True])
def test_temperatures_in_batches_are_the_temperatures_one_at_a_time(monkeypatch, causal):
    """The batched pass over the levels gives each temperature what it gives alone, in batches of
    any size (a chunk boundary inside the grid), with NaN where float64 cannot represent it."""
    import oattn_lib.paraproduct as pp
    rng = np.random.default_rng(4)
    f = 3.0 * _smooth_head(45, 38) + rng.standard_normal((45, 38))
    r, c = rng.permutation(45), rng.permutation(38)
    allowed = np.tril(np.ones((45, 38), dtype=bool)) if causal else None
    taus = [0.05, 0.3, 1.0, 2.0, 7.0, 300.0]
    far = FAR_APART["+-800"]  # not representable from tau = 1 on
    far_taus = [0.1, 0.5, 2.0, 1.0, 0.25]
    got = {}
    for size in (None, 1, 3 * 45 * 38):
        if size:
            monkeypatch.setattr(pp, "BATCH_ENTRIES", size)
        got[size] = (relative_residuals(f, taus, r, c, allowed=allowed), relative_residuals(far, far_taus))
    alone = got.pop(1)
    assert np.isfinite(alone[0][:3]).all()
    np.testing.assert_array_equal(np.isnan(alone[1]), [False, False, True, True, False])
    for batched in got.values():
        for a, b in zip(batched, alone):
            np.testing.assert_array_equal(np.isnan(a), np.isnan(b))
            np.testing.assert_allclose(a, b, rtol=1e-12)
        assert batched[0][2] == alone[0][2]


# -- the approximations compared with the paraproduct (docs/method.md §7.5, §7.7) ------------------
K = {name: k for k, name in enumerate(APPROXIMATIONS)}
PAIRS = [("paraproduct", "paraproduct_nocross"), ("corollary1", "corollary1_nocross"), ("taylor", "taylor_nocross")]


@pytest.mark.parametrize("causal", [False, True])
def test_the_first_approximation_is_the_paraproduct(causal):
    rng = np.random.default_rng(11)
    f = 2.0 * _smooth_head(23, 17) + rng.standard_normal((23, 17))
    r, c = rng.permutation(23), rng.permutation(17)
    allowed = np.tril(np.ones((23, 17), dtype=bool)) if causal else None
    ap, pp = approximations(f, r, c, allowed), paraproduct(f, r, c, allowed=allowed)
    np.testing.assert_array_equal(ap.exact, pp.exact)
    np.testing.assert_allclose(ap.true_z[K["paraproduct"]], pp.approximation, rtol=1e-12, atol=1e-16)
    assert ap.residual[K["paraproduct"]] == pytest.approx(pp.relative_residual, rel=1e-12)
    assert ap.representable.all() and ap.names == APPROXIMATIONS


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (7, 5), (6, 11)])
def test_the_paraproduct_without_cross_terms_matches_brute_force_reference(shape):
    f = np.random.default_rng(3).normal(size=shape)
    _, approx = _reference(f, cross=False)
    np.testing.assert_allclose(approximations(f).true_z[K["paraproduct_nocross"]], approx, rtol=1e-10, atol=1e-13)


def test_without_cross_terms_is_the_same_exactly_where_every_dx_or_dy_vanishes():
    # a function of the columns alone has Dx = 0 on every pair of levels (and of the rows alone
    # Dy = 0): every cross term Dx Dy is 0. A sum of the two has Dx Dy = (a's difference)(b's
    # difference), not 0, and its D are 0, so there the variants differ.
    i, j = np.arange(13)[:, None], np.arange(9)[None, :]
    a, b = np.sin(i / 2.0) * np.ones((1, 9)), np.ones((13, 1)) * np.cos(j / 1.5)
    for f in (2.0 * b, 2.0 * a):
        ap = approximations(f)
        for full, nocross in PAIRS:
            np.testing.assert_allclose(ap.true_z[K[nocross]], ap.true_z[K[full]], rtol=1e-12, atol=1e-15)
            assert ap.residual[K[nocross]] == pytest.approx(ap.residual[K[full]], rel=1e-10, abs=1e-14)
    ap = approximations(2.0 * (a + b))
    for full, nocross in PAIRS:
        gap = np.abs(ap.true_z[K[nocross]] - ap.true_z[K[full]]).max()
        assert gap > 1e-3 * np.abs(ap.exact).max(), (full, gap)


@pytest.mark.parametrize("causal", [False, True])
def test_uniform_attention_is_the_closed_form_in_every_order(causal):
    # each row of U is the mean of that row of A over its allowed entries, so A - U is orthogonal
    # to U and ||A - U||^2 = ||A||^2 - ||U||^2 < ||A||^2: a relative residual below 1 is no test
    rng = np.random.default_rng(12)
    f = 3.0 * rng.standard_normal((15, 12))
    allowed = None
    if causal:
        allowed = np.tril(np.ones((15, 12), dtype=bool))
        allowed[2] = False                                       # a row with nothing allowed
    ap = approximations(f, allowed=allowed)
    a = ap.exact
    ok = np.ones_like(a, dtype=bool) if allowed is None else allowed
    u = np.where(ok, 1.0 / np.maximum(ok.sum(1, keepdims=True), 1), 0.0)
    np.testing.assert_allclose(ap.uniform, u, rtol=1e-15)
    want = np.sqrt(1.0 - (u ** 2).sum() / (a ** 2).sum())
    assert ap.uniform_residual == pytest.approx(want, rel=1e-12) and ap.uniform_residual < 1.0
    for seed in range(3):
        r, c = np.random.default_rng([seed, 1]).permutation(15), np.random.default_rng([seed, 2]).permutation(12)
        assert approximations(f, r, c, allowed).uniform_residual == pytest.approx(want, rel=1e-12)


def test_self_normalised_rows_sum_to_one_and_attend_nowhere_where_a_row_sum_is_not_positive():
    rng = np.random.default_rng(13)
    f = 0.3 * _smooth_head(16, 14) + 0.1 * rng.standard_normal((16, 14))
    f[3] = -6.0                     # 1 + (f - mu) < 0 on all of row 3: the Taylor polynomial's sum is negative
    allowed = np.tril(np.ones((16, 14), dtype=bool), k=2)
    allowed[7] = False
    ap = approximations(f, allowed=allowed)
    for k, name in enumerate(APPROXIMATIONS):
        sums = ap.selfnorm[k].sum(1)
        defined = np.abs(sums - 1.0) < 1e-9
        # every row sums to 1 where its own sum was positive, else it is zero (and so is a row with nothing allowed)
        assert np.all(defined | (np.abs(ap.selfnorm[k]).sum(1) == 0)), name
        assert np.all(ap.selfnorm[k][~allowed] == 0)
        # the scale of a row cancels: dividing the true-Z approximation by its own row sums is the same
        tz = ap.true_z[k][defined]
        own = tz.sum(1, keepdims=True)
        np.testing.assert_allclose(ap.selfnorm[k][defined], tz / own, rtol=1e-9, atol=1e-15)
        # the residual counts an undefined row as its whole softmax row: finite
        err = np.linalg.norm(ap.exact - ap.selfnorm[k]) / np.linalg.norm(ap.exact)
        assert ap.selfnorm_residual[k] == pytest.approx(err, rel=1e-12) and np.isfinite(ap.selfnorm_residual[k])
    # by hand: 1 + (f - mu) over its row sums on the allowed entries, undefined on row 3 only
    first = np.where(allowed, 1.0 + (f - f.mean()), 0.0)
    own = first.sum(1)
    k = K["taylor_nocross"]
    bad = np.flatnonzero(allowed.any(1) & (np.abs(ap.selfnorm[k]).sum(1) == 0))
    assert list(bad) == [3] and own[3] < 0
    good = own > 0
    np.testing.assert_allclose(ap.selfnorm[k][good], first[good] / own[good, None], rtol=1e-12)
    assert np.linalg.norm(ap.exact[3]) > 0 and np.isfinite(ap.residual[k])
    # a sum that cancels to its rounding error is 0, not a divisor: sum D on unmasked rows attends nowhere
    ap = approximations(f)
    k = K["corollary1_nocross"]
    assert np.all(ap.selfnorm[k] == 0) and ap.selfnorm_residual[k] == 1.0 and ROW_SUM_FLOOR < 1e-9


def test_approximations_beyond_float64_are_infinite_not_raised():
    far = FAR_APART["+-800"]
    ap = approximations(far)
    assert not ap.representable[K["paraproduct"]] and ap.residual[K["paraproduct"]] == np.inf
    assert np.isfinite(ap.uniform_residual)
    with pytest.raises(ValueError, match="allowed"):
        approximations(far, allowed=np.ones((3, 3), dtype=bool))
    t = approximations(torch.from_numpy(_smooth_head(9, 7)))
    assert isinstance(t.true_z, torch.Tensor) and tuple(t.true_z.shape) == (len(APPROXIMATIONS), 9, 7)


def test_the_approximations_without_block_structure_do_not_depend_on_the_order():
    # double-centring, f - mu and uniform attention commute with permutations of rows and columns:
    # only the paraproduct, C and the Taylor variant's cross terms see the order
    rng = np.random.default_rng(14)
    f = 2.0 * _smooth_head(20, 18) + rng.standard_normal((20, 18))
    allowed = np.tril(np.ones((20, 18), dtype=bool), k=3)
    base = approximations(f, allowed=allowed)
    r, c = rng.permutation(20), rng.permutation(18)
    other = approximations(f, r, c, allowed)
    for name in ("corollary1_nocross", "taylor_nocross"):
        assert other.residual[K[name]] == pytest.approx(base.residual[K[name]], rel=1e-12), name
        np.testing.assert_allclose(other.true_z[K[name]], base.true_z[K[name]][np.ix_(r, c)], rtol=1e-10,
                                   atol=1e-15)
    assert other.uniform_residual == pytest.approx(base.uniform_residual, rel=1e-12)
    for name in ("paraproduct", "corollary1", "taylor"):
        assert abs(other.residual[K[name]] - base.residual[K[name]]) > 1e-6 * base.residual[K[name]], name
