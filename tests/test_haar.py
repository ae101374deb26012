"""Haar bases on trees and the bi-/tri-Haar transforms (docs/method.md §3)."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from oattn_lib import sweep
from oattn_lib.haar import (bihaar, bihaar_support, haar_basis, inverse_bihaar, inverse_trihaar,
                            trihaar, trihaar_of_bihaar)
from oattn_lib.sweep import haar_sweep
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


def caterpillar(n: int) -> PartitionTree:
    """The deepest tree: each level splits one item off the folder of the rest."""
    return PartitionTree(np.array([np.minimum(np.arange(n), lev) for lev in range(n)]) if n > 1
                         else np.zeros((1, 1), dtype=int))


def flat(n: int) -> PartitionTree:
    """The shallowest: the root's children are the n singletons (one folder of n children)."""
    return PartitionTree(np.stack([np.zeros(n, dtype=int), np.arange(n)]) if n > 1 else np.zeros((1, 1), dtype=int))


trees_of_every_shape = st.one_of(
    random_trees(),
    st.integers(1, 40).map(caterpillar),
    st.integers(1, 40).map(flat),
    st.tuples(st.integers(1, 40), st.integers(0, 2**31 - 1)).map(
        lambda a: random_tree(a[0], np.random.default_rng(a[1]))))


@pytest.fixture(params=["kernel", "torch"])
def path(request, monkeypatch):
    """Both implementations of the sweeps: the CPU kernels and the torch one used on GPUs."""
    if request.param == "torch":
        monkeypatch.setattr(sweep, "_numba_ok", lambda x: False)
    return request.param


@given(tree=trees_of_every_shape, axis=st.integers(0, 2), shape=st.tuples(st.integers(1, 4), st.integers(1, 80)),
       seed=st.integers(0, 2**31 - 1))
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_fast_transform_equals_the_dense_basis(path, tree, axis, shape, seed):
    """Sweep along any axis = the dense product with the basis, in its column order; the
    inverse sweep undoes it (odd folder sizes, singletons, single children, deep trees)."""
    dims = [shape[0], shape[1]]
    dims.insert(axis, tree.n)
    x = np.random.default_rng(seed).normal(size=dims)
    b = haar_basis(tree)[0]
    want = np.moveaxis(np.tensordot(b, x, axes=([0], [axis])), 0, axis)  # B^T along axis
    got = haar_sweep(torch.from_numpy(x), tree, axis).numpy()
    np.testing.assert_allclose(got, want, atol=1e-12)
    np.testing.assert_allclose(haar_sweep(torch.from_numpy(want.copy()), tree, axis, inverse=True).numpy(), x,
                               atol=1e-12)
    inplace = torch.from_numpy(x.copy())
    assert haar_sweep(inplace, tree, axis, out=inplace) is inplace
    np.testing.assert_allclose(inplace.numpy(), want, atol=1e-12)


@pytest.mark.parametrize("make", [caterpillar, flat])
@pytest.mark.parametrize("n", [1, 2, 3, 64, 301])
def test_fast_transforms_on_extreme_trees_float32(path, make, n):
    rng = np.random.default_rng(n)
    tq, tk, th = make(n), random_tree(7, rng), make(5)
    x = rng.normal(size=(n, 7, 5)).astype(np.float32)
    bq, bk, bh = (haar_basis(t)[0] for t in (tq, tk, th))
    c = trihaar(x, tq, tk, th)
    assert c.dtype == np.float32
    np.testing.assert_allclose(c, np.einsum("qkh,qa,kb,hc->abc", x.astype(float), bq, bk, bh), atol=2e-5)
    np.testing.assert_allclose(inverse_trihaar(c, tq, tk, th), x, atol=2e-5)


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
    # two children of equal size rank by their smallest item (docs/method.md §3.2): {0} before
    # {2} and {4} before {5}, whatever the tree's sibling order, so no sign is left open
    for j in range(6):
        np.testing.assert_allclose(b[:, j], want[:, j], atol=1e-12, err_msg=f"column {j}")
    assert support.tolist() == [6, 6, 6, 3, 2, 2]
    assert level.tolist() == [0, 0, 0, 1, 2, 2]


def _reversed_siblings(tree: PartitionTree) -> PartitionTree:
    """The same folders with every folder's children in the reverse sibling order."""
    return PartitionTree(tree.labels.max(1, keepdims=True) - tree.labels)


@given(tree=trees_of_every_shape, seed=st.integers(0, 2**31 - 1))
@settings(max_examples=60, deadline=None)
def test_basis_is_a_function_of_the_folders(tree, seed):
    # the sibling order of a tree (how its builder numbered the folders) must not change the
    # basis: equal-size children rank by smallest item, not by label (docs/method.md §3.2)
    other = _reversed_siblings(tree)
    b, support, level = haar_basis(tree)
    b2, support2, level2 = haar_basis(other)
    np.testing.assert_allclose(b2, b, rtol=0, atol=1e-13)
    assert np.array_equal(support2, support) and np.array_equal(level2, level)
    x = np.random.default_rng(seed).standard_normal((tree.n, 3, 2))
    np.testing.assert_allclose(haar_sweep(torch.from_numpy(x.copy()), other, 0).numpy(),
                               haar_sweep(torch.from_numpy(x.copy()), tree, 0).numpy(), rtol=0, atol=1e-12)


def test_three_equal_children_rank_by_smallest_item():
    # with three equal children the order changes the vectors, not only their signs: the first
    # vector balances child 1 against children 2-3
    labels = np.array([[0] * 6, [2, 1, 0, 2, 1, 0], [0, 1, 2, 3, 4, 5]])
    b = haar_basis(PartitionTree(labels))[0]
    # children {0, 3}, {1, 4}, {2, 5}: ranked {0, 3} first, then {1, 4}
    want1 = np.array([2, -1, -1, 2, -1, -1]) / np.sqrt(12)
    want2 = np.array([0, 1, -1, 0, 1, -1]) / 2
    np.testing.assert_allclose(b[:, 1], want1, atol=1e-12)
    np.testing.assert_allclose(b[:, 2], want2, atol=1e-12)


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


def test_splits_are_the_basis():
    """Each split is one basis vector: support and parts as the dense basis has them."""
    rng = np.random.default_rng(3)
    for tree in (random_tree(37, rng), caterpillar(9), flat(6), PartitionTree(np.array(
            [[0, 0, 0, 0, 0, 0], [2, 1, 2, 0, 1, 1], [3, 1, 3, 0, 2, 2], [4, 1, 5, 0, 2, 3]]))):
        sp, b = sweep.splits(tree), haar_basis(tree)[0]
        assert sorted(sp.column.tolist()) == list(range(1, tree.n))
        assert np.all(np.diff(sp.height) >= 0), "splits by height: parts first"
        for s in range(tree.n - 1):
            col = b[:, sp.column[s]]
            left, right = (_items(sp, v) for v in (sp.left[s], sp.right[s]))
            assert np.all(col[left] > 0) and np.all(col[right] < 0)
            assert np.count_nonzero(np.abs(col) > 1e-12) == left.size + right.size
        # every distinct folder has a node covering exactly its items
        mem = tree.folders[0]
        for f, v in enumerate(sp.folder_node):
            assert np.array_equal(np.flatnonzero(mem[f]), np.sort(_items(sp, v)))


def _items(sp, v):
    if v < sp.n:
        return np.array([v])
    return np.r_[_items(sp, sp.left[v - sp.n]), _items(sp, sp.right[v - sp.n])]


def test_inverse_sweeps_in_place_undo_bihaar():
    rng = np.random.default_rng(0)
    tq, tk = random_tree(33, rng), random_tree(17, rng)
    x = torch.from_numpy(rng.normal(size=(33, 17, 6)).astype(np.float32))
    c = bihaar(x, tq, tk)
    y = c.clone()
    for axis, tree in ((0, tq), (1, tk)):
        haar_sweep(y, tree, axis, inverse=True, out=y)
    torch.testing.assert_close(y, x, atol=1e-5, rtol=0)


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


@pytest.mark.parametrize("transposed", [False, True])
@pytest.mark.parametrize("r", [1, 5, 300])
def test_means_of_zero_vectors_skip_to_exact_zeros(r, transposed):
    """Folder means of vectors (and blocks of them) that are all zero, as causal attention's
    past the diagonal, are written as zeros without the arithmetic, into an output full of
    other values; the rest equal the torch sweeps'."""
    rng = np.random.default_rng(12)
    n, n_b = 40, 70
    tree = random_tree(n, rng)
    sp = sweep.splits(tree)
    prog = sweep.whole_program(sp, sp.folder_node, tree.folder_weights(0.0, 1.0))
    x = rng.random((n_b, n, r)).astype(np.float32)
    x[rng.random(n_b) < 0.5] = 0  # whole slices
    x[:, :, : r // 2][rng.random(n_b) < 0.3] = 0  # parts of the slices' columns
    rows = rng.permutation(n_b)[:50]
    shape = (r, rows.size, prog.emit.size) if transposed else (rows.size, prog.emit.size, r)
    got = sweep.run_program(torch.from_numpy(x), prog, 1, out=torch.full(shape, 7.0), rows=rows,
                            transposed=transposed)
    old = sweep._numba_ok
    try:
        sweep._numba_ok = lambda t: False
        want = sweep.run_program(torch.from_numpy(x), prog, 1, rows=rows, transposed=transposed)
    finally:
        sweep._numba_ok = old
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-7)
    zero = ~x[rows].any(axis=(1, 2))
    assert (got.numpy()[:, zero] if transposed else got.numpy()[zero]).max() == 0 and zero.sum() > 5


@pytest.mark.parametrize("as_numpy", [False, True])
def test_trihaar_over_its_input_gives_the_same_coefficients_in_the_inputs_memory(as_numpy):
    """decompose writes the tri-Haar coefficients over the network tensor (one 1.1 GB copy less
    at 1024 tokens x 270 heads): the same coefficients, bit for bit, now in X itself."""
    rng = np.random.default_rng(3)
    x = rng.random((33, 20, 7)).astype(np.float32)
    trees = [random_tree(n, rng) for n in x.shape]
    want = trihaar(torch.from_numpy(x.copy()), *trees)
    X = x.copy() if as_numpy else torch.from_numpy(x.copy())
    got = trihaar(X, *trees, overwrite=True)
    np.testing.assert_array_equal(np.asarray(got), want.numpy())
    np.testing.assert_array_equal(np.asarray(X), want.numpy())  # X holds them
    assert not np.array_equal(np.asarray(X), x)
    # an input that is not contiguous float is copied first, and left alone
    y = torch.from_numpy(x.astype(np.float64)).permute(1, 0, 2).contiguous().permute(1, 0, 2)
    kept = y.clone()
    np.testing.assert_allclose(trihaar(y, *trees, overwrite=True).numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    assert torch.equal(y, kept)


@pytest.mark.parametrize("as_numpy", [False, True])
def test_bihaar_over_its_input_then_the_head_sweep_is_the_trihaar_bit_for_bit(as_numpy):
    """decompose writes the bi-Haar coefficients over the network tensor and sweeps them along the
    heads into the tri-Haar ones: each the separate transform's coefficients, bit for bit (the same
    sweeps in the same order), in X's memory; a head tree of the wrong size is an error."""
    rng = np.random.default_rng(5)
    x = rng.random((31, 24, 9)).astype(np.float32)
    tq, tk, th = (random_tree(n, rng) for n in x.shape)
    want2, want3 = bihaar(torch.from_numpy(x.copy()), tq, tk), trihaar(torch.from_numpy(x.copy()), tq, tk, th)
    X = x.copy() if as_numpy else torch.from_numpy(x.copy())
    c2 = bihaar(X, tq, tk, overwrite=True)
    np.testing.assert_array_equal(np.asarray(c2), want2.numpy())
    np.testing.assert_array_equal(np.asarray(X), want2.numpy())  # X holds them
    c3 = trihaar_of_bihaar(c2, th, overwrite=True)
    np.testing.assert_array_equal(np.asarray(c3), want3.numpy())
    np.testing.assert_array_equal(np.asarray(X), want3.numpy())
    # without overwrite the input is left alone
    c2 = want2.clone()
    np.testing.assert_array_equal(trihaar_of_bihaar(c2, th).numpy(), want3.numpy())
    assert torch.equal(c2, want2)
    # the head tree's size is checked against the head axis (not the query's or the key's)
    with pytest.raises(ValueError, match="tree_h: has 24 items but C axis 2 has length 9"):
        trihaar_of_bihaar(want2, tk)


def test_trihaar_into_a_reused_buffer_is_the_same_coefficients_whatever_it_held():
    """decompose's baselines go one after another into one buffer: each the coefficients trihaar
    returns on its own, whatever the buffer held (NaN here); X is left alone; a buffer of another
    shape or dtype, or out with overwrite, is an error naming it."""
    rng = np.random.default_rng(6)
    x = rng.random((17, 12, 5)).astype(np.float32)
    X = torch.from_numpy(x.copy())
    buf = torch.full(x.shape, float("nan"))
    for seed in range(3):
        trees = [random_tree(n, np.random.default_rng(seed)) for n in x.shape]
        assert trihaar(X, *trees, out=buf) is buf
        np.testing.assert_array_equal(buf.numpy(), trihaar(torch.from_numpy(x.copy()), *trees).numpy())
    np.testing.assert_array_equal(X.numpy(), x)
    with pytest.raises(ValueError, match=r"out: expected a contiguous torch.float32 array of shape \(17, 12, 5\)"):
        trihaar(X, *trees, out=torch.zeros((17, 12, 4)))
    with pytest.raises(ValueError, match="out: expected a contiguous torch.float32"):
        trihaar(X, *trees, out=torch.zeros(x.shape, dtype=torch.float64))
    with pytest.raises(ValueError, match="overwrite and out exclude each other"):
        trihaar(X, *trees, out=buf, overwrite=True)


@pytest.mark.parametrize("inverse", [False, True])
def test_a_tree_of_another_length_is_refused_naming_the_shape(inverse):
    """The sweep's kernel indexes by the tree without bounds checks: a tree of another length
    than its axis (the query tree given for the keys) is a ValueError naming the axis, the
    shape and the leaves, never a write outside the tensor; so is an `out` of another shape."""
    x = torch.rand(7, 5, 3, dtype=torch.float64)
    tree = balanced_tree(np.arange(7))
    haar_sweep(x, tree, 0, inverse=inverse)  # the right axis
    with pytest.raises(ValueError, match=r"axis 1 of a tensor of shape \(7, 5, 3\) does not have the tree's 7 leaves"):
        haar_sweep(x, tree, 1, inverse=inverse)
    with pytest.raises(ValueError, match="axis 3"):
        haar_sweep(x, tree, 3, inverse=inverse)
    with pytest.raises(ValueError, match=r"out has shape \(7, 5\), expected \(7, 5, 3\)"):
        haar_sweep(x, tree, 0, inverse=inverse, out=torch.empty(7, 5, dtype=torch.float64))
