"""Diffusion map of heads (docs/method.md §8)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from oattn_lib.diffusion import diffusion_map


def _gaussian_affinity(points, eps=None):
    d2 = ((points[:, None, :] - points[None, :, :]) ** 2).sum(-1)
    eps = np.median(d2) if eps is None else eps
    return np.exp(-d2 / eps)


def _two_clusters(n_per=15, seed=0):
    rng = np.random.default_rng(seed)
    pts = np.concatenate([rng.normal(0, 0.3, (n_per, 2)), rng.normal(5, 0.3, (n_per, 2))])
    return _gaussian_affinity(pts, eps=1.0), np.repeat([0, 1], n_per)


@pytest.mark.parametrize("seed", [0, 1])
def test_psi1_separates_two_clusters(seed):
    a, labels = _two_clusters(seed=seed)
    perm = np.random.default_rng(seed).permutation(labels.size)
    dm = diffusion_map(a[perm][:, perm])
    side = dm.coords[:, 0] > 0
    lab = labels[perm]
    assert len(set(side[lab == 0])) == 1 and len(set(side[lab == 1])) == 1
    assert side[lab == 0][0] != side[lab == 1][0]


def test_disconnected_clusters_split_exactly():
    a, labels = _two_clusters()
    a[np.ix_(labels == 0, labels == 1)] = 0
    a[np.ix_(labels == 1, labels == 0)] = 0
    dm = diffusion_map(a)
    psi1 = dm.coords[:, 0]
    assert np.ptp(psi1[labels == 0]) < 1e-8 and np.ptp(psi1[labels == 1]) < 1e-8
    assert np.sign(psi1[0]) != np.sign(psi1[-1])
    assert dm.eigenvalues[1] == pytest.approx(1.0, abs=1e-8)


def test_eigenvalues_descending_and_lambda0_is_one():
    pts = np.random.default_rng(2).normal(size=(40, 3))
    a = _gaussian_affinity(pts)
    dm = diffusion_map(a, n_components=5)
    ev = dm.eigenvalues
    assert ev.shape == (6,) and dm.coords.shape == (40, 5)
    assert ev[0] == pytest.approx(1.0, abs=1e-10)
    assert np.all(np.diff(ev) <= 1e-12)
    # the same spectrum as the Markov matrix D^-1 G
    markov = np.sort(np.linalg.eigvals(a / a.sum(1, keepdims=True)).real)[::-1]
    np.testing.assert_allclose(ev, markov[:6], atol=1e-9)
    # phi_0 is the stationary vector sqrt(d), unit norm
    d = a.sum(1)
    np.testing.assert_allclose(dm.phi0, np.sqrt(d) / np.linalg.norm(np.sqrt(d)), rtol=1e-6)


def test_coordinates_are_right_eigenvectors_of_markov_matrix():
    pts = np.random.default_rng(3).normal(size=(30, 2))
    a = _gaussian_affinity(pts)
    markov = a / a.sum(1, keepdims=True)
    for t in (1, 2):
        dm = diffusion_map(a, n_components=3, t=t)
        for k in range(3):
            lam = dm.eigenvalues[k + 1]
            np.testing.assert_allclose(markov @ dm.coords[:, k], lam * dm.coords[:, k], atol=1e-8)
    # t scales each coordinate by lambda^t
    c1, c2 = diffusion_map(a, t=1), diffusion_map(a, t=2)
    np.testing.assert_allclose(c2.coords, c1.coords * np.abs(c1.eigenvalues[1:]), atol=1e-10)


def test_invariant_to_relabelling():
    pts = np.random.default_rng(4).normal(size=(35, 3))
    a = _gaussian_affinity(pts)
    perm = np.random.default_rng(5).permutation(35)
    dm, dp = diffusion_map(a), diffusion_map(a[perm][:, perm])
    np.testing.assert_allclose(dp.eigenvalues, dm.eigenvalues, atol=1e-10)
    # eigenvectors are defined up to sign: compare column by column, up to a flip
    for k in range(3):
        x, y = dp.coords[:, k], dm.coords[perm, k]
        s = np.sign(x @ y)
        np.testing.assert_allclose(x, s * y, atol=1e-8)


def test_signs_are_deterministic():
    pts = np.random.default_rng(6).normal(size=(25, 2))
    dm = diffusion_map(_gaussian_affinity(pts), n_components=4)
    for k in range(4):
        col = dm.coords[:, k]
        first = col[np.abs(col) > 1e-12 * np.abs(col).max()][0]
        assert first > 0
    np.testing.assert_array_equal(dm.coords, diffusion_map(_gaussian_affinity(pts), 4).coords)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_few_items_pad_with_zeros(n):
    a = np.ones((n, n))
    dm = diffusion_map(a, n_components=3)
    assert dm.coords.shape == (n, 3) and dm.eigenvalues.shape == (4,)
    assert np.all(dm.coords[:, n - 1:] == 0) and np.all(dm.eigenvalues[n:] == 0)
    assert dm.eigenvalues[0] == pytest.approx(1.0)


def test_isolated_item_and_zero_matrix_are_finite():
    a, _ = _two_clusters()
    a[3, :] = 0
    a[:, 3] = 0
    dm = diffusion_map(a)
    assert np.isfinite(dm.coords).all() and np.isfinite(dm.eigenvalues).all()
    z = diffusion_map(np.zeros((5, 5)))
    assert np.isfinite(z.coords).all() and np.isfinite(z.eigenvalues).all()


def test_torch_input_returns_torch():
    pts = np.random.default_rng(7).normal(size=(20, 2))
    a = _gaussian_affinity(pts)
    dt = diffusion_map(torch.from_numpy(a))
    assert isinstance(dt.coords, torch.Tensor)
    np.testing.assert_allclose(dt.coords.numpy(), diffusion_map(a).coords, atol=1e-10)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 20), k=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_shapes_and_order_for_any_size(n, k, seed):
    pts = np.random.default_rng(seed).normal(size=(n, 2))
    dm = diffusion_map(_gaussian_affinity(pts, eps=1.0), n_components=k)
    assert dm.coords.shape == (n, k) and dm.eigenvalues.shape == (k + 1,)
    m = min(k, n - 1) + 1
    assert np.all(np.diff(dm.eigenvalues[:m]) <= 1e-10)
    assert np.isfinite(dm.coords).all()


@pytest.mark.parametrize("a, kwargs, name", [
    (np.array([[1.0, 2.0], [0.0, 1.0]]), {}, "affinity"),
    (np.array([[1.0, -1.0], [-1.0, 1.0]]), {}, "affinity"),
    (np.array([[1.0, np.nan], [np.nan, 1.0]]), {}, "affinity"),
    (np.ones((2, 3)), {}, "affinity"),
    (np.ones((3, 3)), dict(n_components=0), "n_components"),
    (np.ones((3, 3)), dict(t=-1), "t"),
])
def test_bad_input_names_the_argument(a, kwargs, name):
    with pytest.raises(ValueError, match=name):
        diffusion_map(a, **kwargs)
