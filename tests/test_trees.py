"""Partition trees (SPEC 1): structure, flexible tree, balanced tree, xarray round trip."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from oattn_lib.trees import PartitionTree, balanced_tree, flexible_tree, random_tree


def assert_valid_tree(t: PartitionTree):
    lab = t.labels
    assert np.unique(lab[0]).size == 1, "root is one folder"
    assert np.unique(lab[-1]).size == t.n, "leaves are singletons"
    for lev in range(1, t.n_levels):
        # nested: each folder at lev has one parent
        for f in np.unique(lab[lev]):
            assert np.unique(lab[lev - 1][lab[lev] == f]).size == 1
    assert np.array_equal(np.sort(t.order), np.arange(t.n)), "order is a permutation"
    # depth-first: every folder is contiguous in the leaf order
    for lev in range(t.n_levels):
        seq = lab[lev][t.order]
        changes = np.count_nonzero(seq[1:] != seq[:-1]) if t.n > 1 else 0
        assert changes == np.unique(seq).size - 1


def block_affinity(sizes, rng, within=1.0, between=0.01, noise=0.05):
    labels = np.repeat(np.arange(len(sizes)), sizes)
    a = np.where(labels[:, None] == labels[None, :], within, between)
    a = a + noise * rng.random(a.shape)
    return (a + a.T) / 2, labels


@given(st.integers(1, 70), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_balanced_tree_is_valid_and_keeps_order(n, seed):
    order = np.random.default_rng(seed).permutation(n)
    t = balanced_tree(order)
    assert_valid_tree(t)
    assert np.array_equal(t.order, order)
    # every folder splits into ceil/floor halves
    for lev in range(t.n_levels - 1):
        for f in range(t.n_folders(lev)):
            kids = np.unique(t.labels[lev + 1][t.labels[lev] == f])
            sizes = [int((t.labels[lev + 1] == k).sum()) for k in kids]
            m = sum(sizes)
            assert sizes == ([m] if m == 1 else [(m + 1) // 2, m // 2])


@given(st.integers(2, 60), st.integers(0, 2**31 - 1))
@settings(max_examples=25, deadline=None)
def test_flexible_tree_valid_on_random_affinities(n, seed):
    rng = np.random.default_rng(seed)
    pts = rng.normal(size=(n, 3))
    a = np.exp(-((pts[:, None] - pts[None]) ** 2).sum(-1))
    t = flexible_tree(a)
    assert_valid_tree(t)
    assert t.n == n


def test_flexible_tree_deterministic():
    rng = np.random.default_rng(1)
    a, _ = block_affinity([20, 30, 14], rng)
    assert flexible_tree(a, seed=3) == flexible_tree(a, seed=3)
    assert np.array_equal(flexible_tree(a).labels, flexible_tree(a.copy()).labels)


@pytest.mark.parametrize("sizes", [[25, 25], [40, 24], [10, 30, 20]])
def test_flexible_tree_top_split_separates_blocks(sizes):
    rng = np.random.default_rng(0)
    a, labels = block_affinity(sizes, rng)
    perm = rng.permutation(len(labels))
    a, labels = a[np.ix_(perm, perm)], labels[perm]
    t = flexible_tree(a)
    assert_valid_tree(t)
    # the top split keeps every block whole; a level below it matches the blocks exactly
    lev = next(lv for lv in range(t.n_levels) if t.n_folders(lv) > 1)
    for b in range(len(sizes)):
        assert np.unique(t.labels[lev][labels == b]).size == 1
    assert any(t.n_folders(lv) == len(sizes)
               and all(np.unique(t.labels[lv][labels == b]).size == 1 for b in range(len(sizes)))
               for lv in range(t.n_levels))
    # and each block is contiguous in the organized order
    seq = labels[t.order]
    assert np.count_nonzero(seq[1:] != seq[:-1]) == len(sizes) - 1


def test_flexible_tree_smooth_order_on_a_line():
    # points on a line, shuffled: the organized order must be monotone along the line
    rng = np.random.default_rng(2)
    x = np.sort(rng.random(60))
    perm = rng.permutation(60)
    xs = x[perm]
    a = np.exp(-((xs[:, None] - xs[None]) / 0.05) ** 2)
    t = flexible_tree(a)
    ordered = xs[t.order]
    d = np.diff(ordered)
    assert (d > 0).all() or (d < 0).all()


def test_flexible_tree_degenerate_inputs_terminate():
    for a in (np.ones((30, 30)), np.eye(30), np.zeros((5, 5))):
        t = flexible_tree(a)
        assert_valid_tree(t)
        assert t.n_levels <= 30
    assert flexible_tree(np.ones((1, 1))).n_levels == 1
    assert flexible_tree(np.ones((2, 2))).n_levels == 2


def test_bad_trees_and_affinities_raise():
    with pytest.raises(ValueError, match="not nested"):
        PartitionTree(np.array([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1], [0, 1, 2, 3]]))
    with pytest.raises(ValueError, match="singletons"):
        PartitionTree(np.array([[0, 0, 0], [0, 0, 1]]))
    with pytest.raises(ValueError, match="root"):
        PartitionTree(np.array([[0, 1], [0, 1]]))
    with pytest.raises(ValueError, match="symmetric"):
        flexible_tree(np.array([[1.0, 0.2], [0.9, 1.0]]))
    with pytest.raises(ValueError, match="negative"):
        flexible_tree(np.array([[1.0, -0.5], [-0.5, 1.0]]))
    with pytest.raises(ValueError, match="NaN"):
        flexible_tree(np.array([[1.0, np.nan], [np.nan, 1.0]]))
    with pytest.raises(ValueError, match="square"):
        flexible_tree(np.ones((3, 4)))
    with pytest.raises(ValueError, match="permutation"):
        balanced_tree([0, 0, 1])


def test_canonical_labels_and_equality():
    a = PartitionTree(np.array([[5, 5, 5, 5], [7, 3, 7, 3], [9, 1, 8, 2]]))
    b = PartitionTree(np.array([[0, 0, 0, 0], [1, 0, 1, 0], [3, 0, 2, 1]]))
    assert a == b
    assert a.labels.tolist() == [[0, 0, 0, 0], [1, 0, 1, 0], [3, 0, 2, 1]]
    assert a.order.tolist() == [1, 3, 2, 0]


def test_folders_dedupe_single_child_chains():
    # item 2 is carried as a single-child folder from level 1 to the leaves
    t = PartitionTree(np.array([[0, 0, 0], [0, 0, 1], [0, 1, 2]]))
    mem, first, last = t.folders
    sets = {tuple(np.flatnonzero(m)) for m in mem}
    assert sets == {(0, 1, 2), (0, 1), (2,), (0,), (1,)}
    assert len(mem) == 5
    i = [tuple(np.flatnonzero(m)) for m in mem].index((2,))
    assert (first[i], last[i]) == (1, 2)
    # weights: alpha = 0 counts the copies, beta scales by size
    w = t.folder_weights(alpha=0.0, beta=1.0)
    assert w[i] == pytest.approx(2 * (1 / 3))
    w = t.folder_weights(alpha=1.0, beta=0.0)
    assert w[i] == pytest.approx(2.0 ** -1 + 2.0 ** -2)


def test_xarray_round_trip():
    t = random_tree(13, np.random.default_rng(0))
    da = t.to_dataarray("tree_q")
    assert da.dims == ("level", "item")
    assert PartitionTree.from_dataarray(da) == t
