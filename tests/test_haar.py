"""Haar bases on trees and the bi-/tri-Haar transforms (SPEC 2)."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from oattn_lib.haar import (bihaar, bihaar_support, haar_basis, inverse_bihaar, inverse_trihaar,
                            trihaar)
from oattn_lib.trees import PartitionTree, balanced_tree, random_tree


@st.composite
def random_trees(draw, max_n=40):
    """Arbitrary (not only binary) trees: random nested refinements of the root."""
    n = draw(st.integers(1, max_n))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    levels = [np.zeros(n, dtype=int)]
    while np.unique(levels[-1]).size < n:
        prev = levels[-1]
        # split every folder into 1..4 random parts
        new = prev * 4 + rng.integers(0, rng.integers(1, 5), size=n)
        levels.append(np.unique(new, return_inverse=True)[1])
        if len(levels) > 12:
            levels.append(np.arange(n))
    return PartitionTree(np.stack(levels))


@given(random_trees())
@settings(max_examples=60, deadline=None)
def test_basis_is_orthonormal(tree):
    b, support, level = haar_basis(tree)
    n = tree.n
    assert b.shape == (n, n)
    np.testing.assert_allclose(b @ b.T, np.eye(n), atol=1e-10)
    np.testing.assert_allclose(b.T @ b, np.eye(n), atol=1e-10)
    np.testing.assert_allclose(b[:, 0], 1 / np.sqrt(n))
    # each vector is supported inside its folder and is constant on its children
    for j in range(1, n):
        nz = np.flatnonzero(np.abs(b[:, j]) > 1e-12)
        assert nz.size <= support[j]
        assert abs(b[:, j].sum()) < 1e-10, "wavelets have zero mean"
    # sorting by support puts the constant first
    assert np.argsort(-support, kind="stable")[0] == 0


def test_basis_written_out_by_hand():
    # Root children in sibling order: A = {3} (size 1), B = {1, 4, 5} (size 3),
    # C = {0, 2} (size 2). At level 2, B splits into B1 = {1} and B2 = {4, 5}, while A
    # and C are carried down unchanged; at level 3, B2 and C split into singletons.
    tree = PartitionTree(np.array([[0, 0, 0, 0, 0, 0],
                                   [2, 1, 2, 0, 1, 1],
                                   [3, 1, 3, 0, 2, 2],
                                   [4, 1, 5, 0, 2, 3]]))
    b, support, level = haar_basis(tree)
    r2, r6 = np.sqrt(2), np.sqrt(6)
    want = np.array([
        # constant
        [1, 1, 1, 1, 1, 1] / r6,
        # root, children by size: B (3), C (2), A (1); vector 1: S_1 = 2 + 1 = 3 on B,
        # -s_1 = -3 on C and A; vector 2: S_2 = 1 on C, -s_2 = -2 on A
        [-3, 3, -3, -3, 3, 3] / np.sqrt(54),
        [1, 0, 1, -2, 0, 0] / r6,
        # level 1: only B has two children; B2 (size 2) gets S_1 = 1, B1 gets -2
        [0, -2, 0, 0, 1, 1] / r6,
        # level 2, by smallest item: C (item 0) before B2 (item 4), although B2 comes
        # first in the leaf order; and C, one level deeper than B, comes after B
        [1, 0, -1, 0, 0, 0] / r2,
        [0, 0, 0, 0, 1, -1] / r2,
    ]).T
    # two children of equal size leave their order, hence the sign, open (SPEC 2)
    tied = [4, 5]
    for j in range(6):
        got = b[:, j] * (np.sign(b[:, j] @ want[:, j]) if j in tied else 1.0)
        np.testing.assert_allclose(got, want[:, j], atol=1e-12, err_msg=f"column {j}")
    assert support.tolist() == [6, 6, 6, 3, 2, 2]
    assert level.tolist() == [0, 0, 0, 1, 2, 2]


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 16, 33, 197])
def test_exact_inverse_float32(n):
    rng = np.random.default_rng(n)
    tq, tk, th = random_tree(n, rng), random_tree(n + 2, rng), random_tree(max(1, n // 3), rng)
    x = rng.normal(size=(n, n + 2, max(1, n // 3))).astype(np.float32)
    c = bihaar(x, tq, tk)
    assert c.dtype == np.float32 and c.shape == x.shape
    np.testing.assert_allclose(inverse_bihaar(c, tq, tk), x, atol=1e-5)
    c3 = trihaar(x, tq, tk, th)
    np.testing.assert_allclose(inverse_trihaar(c3, tq, tk, th), x, atol=1e-5)
    # Parseval: orthonormal bases keep the l2 norm
    assert np.linalg.norm(c3) == pytest.approx(np.linalg.norm(x), rel=1e-5)


def test_bihaar_matches_explicit_products_and_single_head():
    rng = np.random.default_rng(0)
    tq, tk = random_tree(9, rng), random_tree(6, rng)
    x = rng.normal(size=(9, 6, 4))
    bq, bk = haar_basis(tq)[0], haar_basis(tk)[0]
    c = bihaar(x, tq, tk)
    for h in range(4):
        np.testing.assert_allclose(c[:, :, h], bq.T @ x[:, :, h] @ bk, atol=1e-5)
        np.testing.assert_allclose(bihaar(x[:, :, h], tq, tk), c[:, :, h], atol=1e-6)
    th = random_tree(4, rng)
    bh = haar_basis(th)[0]
    expect = np.einsum("qkh,qa,kb,hc->abc", x, bq, bk, bh)
    np.testing.assert_allclose(trihaar(x, tq, tk, th), expect, atol=1e-5)
    assert bihaar_support(tq, tk)[0, 0] == 9 * 6


def test_torch_input_stays_torch():
    rng = np.random.default_rng(0)
    tq = random_tree(5, rng)
    x = torch.randn(5, 5, 3)
    c = bihaar(x, tq, tq)
    assert isinstance(c, torch.Tensor) and c.dtype == torch.float32
    torch.testing.assert_close(inverse_bihaar(c, tq, tq), x, atol=1e-5, rtol=0)


def test_constant_and_smooth_signals_are_sparse():
    # a constant head has a single nonzero coefficient: the constant pair
    t = balanced_tree(np.arange(16))
    c = bihaar(np.full((16, 16), 3.0), t, t)
    assert abs(c[0, 0]) == pytest.approx(48.0)
    c[0, 0] = 0
    assert np.abs(c).max() < 1e-6


def test_bad_input_raises():
    t = balanced_tree(np.arange(4))
    with pytest.raises(ValueError, match="tree_k"):
        bihaar(np.zeros((4, 5, 2)), t, t)
    with pytest.raises(ValueError, match="dimensions"):
        bihaar(np.zeros(4), t, t)
    with pytest.raises(ValueError, match="NaN"):
        bihaar(np.full((4, 4), np.nan), t, t)
    with pytest.raises(ValueError, match="PartitionTree"):
        haar_basis(np.arange(4))
