"""Tree EMD (docs/method.md §4): metric properties, the reference definition, the affinity."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.spatial.distance import cdist

from oattn_lib import emd
from oattn_lib.emd import emd_affinity, pairwise_l1, tree_emd
from oattn_lib.trees import PartitionTree, random_tree

FAST = settings(max_examples=25, deadline=None)


def random_nested_tree(n: int, n_levels: int, rng: np.random.Generator) -> PartitionTree:
    """Random nested partitions; folders often have a single child (repeated levels)."""
    levels = [np.zeros(n, dtype=np.int64)]
    for _ in range(n_levels - 2):
        prev, lab, nxt = levels[-1], np.empty(n, dtype=np.int64), 0
        for f in np.unique(prev):
            items = rng.permutation(np.flatnonzero(prev == f))
            k = int(rng.integers(1, min(3, items.size) + 1))
            cuts = np.sort(rng.choice(np.arange(1, items.size), k - 1, replace=False)) if k > 1 else []
            for part in np.split(items, cuts):
                lab[part] = nxt
                nxt += 1
        levels.append(lab)
    levels.append(rng.permutation(n))
    return PartitionTree(np.stack(levels))


def reference_tree_emd(X, axis, trees, alpha, beta):
    """docs/method.md §4.1 literally: every (level, folder) pair of both trees, duplicates included."""
    def folders(tree):
        out = []
        for lev in range(tree.n_levels):  # root level = 1 in docs/method.md §4.1
            for f in range(tree.n_folders(lev)):
                mem = tree.labels[lev] == f
                w = (mem.sum() / tree.n) ** beta * 2.0 ** ((1 - (lev + 1)) * alpha)
                out.append((mem, w))
        return out

    fa, fb = folders(trees[0]), folders(trees[1])
    feats = []
    for s in range(X.shape[axis]):
        xs = np.take(X, s, axis=axis).astype(np.float64)
        feats.append([wa * wb * xs[ma][:, mb].mean() for ma, wa in fa for mb, wb in fb])
    feats = np.array(feats)
    return np.abs(feats[:, None, :] - feats[None, :, :]).sum(-1)


# -- pairwise_l1 --------------------------------------------------------------------------
@FAST
@given(m=st.integers(1, 40), d=st.integers(1, 700), seed=st.integers(0, 2**32 - 1))
def test_pairwise_l1_equals_cityblock(m, d, seed):
    F = np.random.default_rng(seed).standard_normal((m, d)).astype(np.float32)
    want = cdist(F.astype(np.float64), F.astype(np.float64), "cityblock")
    got = pairwise_l1(F)
    assert got.shape == (m, m)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("m,d,strip", [(1, 5, 64), (2, 3, 64), (17, 1000, 64), (33, 257, 128),
                                       (16, 64, 64), (5, 130, 64)])
def test_pairwise_l1_strips_accumulate(m, d, strip):
    """Several feature strips, the last one partial; odd row counts and partial blocks."""
    F = np.random.default_rng(m * d).standard_normal((m, d)).astype(np.float32)
    want = cdist(F.astype(np.float64), F.astype(np.float64), "cityblock")
    np.testing.assert_allclose(emd._pairwise_l1_numba(F, strip=strip), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_pairwise_l1_tasks_cover_every_pair_once(threads):
    """Many strips and runs of block pairs, handed out to the threads as they come; a sum
    added twice or skipped would show. Added in two column blocks, as the tree EMD does."""
    import numba
    F = np.random.default_rng(5).standard_normal((150, 3000)).astype(np.float32)
    want = cdist(F.astype(np.float64), F.astype(np.float64), "cityblock")
    old = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        total = emd._L1Sum(F.shape[0], "cpu", strip=64)
        total.add(np.ascontiguousarray(F[:, :1234]))
        total.add(np.ascontiguousarray(F[:, 1234:]), 3000 - 1234)
        got = total.result().numpy()
    finally:
        numba.set_num_threads(old)
    np.testing.assert_allclose(got, want, rtol=1e-5)


@FAST
@given(m=st.integers(1, 70), d=st.integers(1, 600), strip=st.sampled_from([16, 64, 1024]),
       seed=st.integers(0, 2**32 - 1))
def test_pairwise_l1_rows_that_end_early(m, d, strip, seed):
    """Rows zero past their own column (all zero, or none), tiled in any order: the kernel
    stops each tile where one row of every pair is zero and adds the rest as the rows'
    tails, in two column blocks; the same as all differences."""
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((m, d)).astype(np.float32)
    ends = rng.integers(0, d + 1, m)
    ends[rng.integers(m)] = d
    F[np.arange(d)[None, :] >= ends[:, None]] = 0
    want = cdist(F.astype(np.float64), F.astype(np.float64), "cityblock")
    for order in (None, np.argsort(ends, kind="stable"), rng.permutation(m)):
        total = emd._L1Sum(m, "cpu", strip=strip, order=order)
        cut = int(rng.integers(0, d + 1))
        total.add(np.ascontiguousarray(F[:, :cut]) if cut else np.zeros((m, 1), np.float32), cut)
        total.add(np.ascontiguousarray(F[:, cut:]) if cut < d else np.zeros((m, 1), np.float32), d - cut)
        got = total.result().numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
        assert np.array_equal(got, got.T) and np.all(np.diag(got) == 0)


def test_pairwise_l1_packs_columns_zero_in_every_row():
    """With `compact`, the columns zero in every row are dropped before the differences
    (they add nothing), in blocks with and without enough of them to pack."""
    rng = np.random.default_rng(3)
    F = rng.random((40, 900)).astype(np.float32)
    F[:, rng.random(900) < 0.5] = 0
    F[:, :300][:, rng.random(300) < 0.05] = 0
    want = cdist(F.astype(np.float64), F.astype(np.float64), "cityblock")
    total = emd._L1Sum(40, "cpu", compact=True)
    packed, d = total._pack(np.ascontiguousarray(F), 900)
    assert d == int((F != 0).any(0).sum()) and np.array_equal(packed, F[:, (F != 0).any(0)])
    for part in (F[:, :300], F[:, 300:]):  # few dead columns, then many
        total.add(np.ascontiguousarray(part))
    np.testing.assert_allclose(total.result().numpy(), want, rtol=1e-5)


def test_pairwise_l1_accurate_for_long_features():
    F = np.random.default_rng(0).random((3, 300_001)).astype(np.float32)
    F[1] += 1e-3
    want = cdist(F.astype(np.float64), F.astype(np.float64), "cityblock")
    np.testing.assert_allclose(pairwise_l1(F), want, rtol=1e-6)


@FAST
@given(m=st.integers(1, 25), d=st.integers(1, 50), seed=st.integers(0, 2**32 - 1))
def test_pairwise_l1_is_a_metric(m, d, seed):
    rng = np.random.default_rng(seed)
    F = rng.standard_normal((m, d)).astype(np.float32)
    F[rng.integers(m)] = F[0]  # a repeated row
    D = pairwise_l1(F)
    assert np.array_equal(D, D.T)
    assert np.all(np.diag(D) == 0)
    assert np.all(D >= 0)
    tol = 1e-5 * (1 + D.max())
    assert np.all(D[:, None, :] <= D[:, :, None] + D[None, :, :] + tol)  # D[i,k] <= D[i,j] + D[j,k]


def test_pairwise_l1_zero_on_identical_rows():
    F = np.tile(np.random.default_rng(1).standard_normal(301).astype(np.float32), (7, 1))
    assert np.array_equal(pairwise_l1(F), np.zeros((7, 7)))


def test_pairwise_l1_returns_the_input_kind():
    F = np.random.default_rng(2).standard_normal((9, 70)).astype(np.float32)
    Dn = pairwise_l1(F)
    Dt = pairwise_l1(torch.from_numpy(F))
    assert isinstance(Dn, np.ndarray) and isinstance(Dt, torch.Tensor)
    np.testing.assert_array_equal(Dn, Dt.numpy())  # the same CPU kernel on the same rows: exactly


def test_torch_path_matches_cpu_kernel():
    """The chunked cdist used on accelerators, checked on CPU with small chunks."""
    F = np.random.default_rng(3).standard_normal((11, 301)).astype(np.float32)
    got = emd._pairwise_l1_torch(torch.from_numpy(F), row_chunk=4, col_chunk=100).numpy()
    assert np.array_equal(got, got.T) and np.all(np.diag(got) == 0)
    np.testing.assert_allclose(got, pairwise_l1(F), rtol=1e-5, atol=1e-4)


# -- tree_emd -----------------------------------------------------------------------------
@FAST
@given(shape=st.tuples(st.integers(1, 5), st.integers(1, 5), st.integers(1, 5)),
       axis=st.integers(0, 2), levels=st.tuples(st.integers(2, 5), st.integers(2, 5)),
       alpha=st.sampled_from([0.0, 0.7, 1.0]), beta=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
       seed=st.integers(0, 2**32 - 1))
def test_tree_emd_matches_the_definition(shape, axis, levels, alpha, beta, seed):
    """Distinct folders with summed level weights give the same L1 as all (level, folder)."""
    rng = np.random.default_rng(seed)
    X = rng.standard_normal(shape).astype(np.float32)
    rest = [a for a in range(3) if a != axis]
    trees = tuple(random_nested_tree(shape[a], lv, rng) for a, lv in zip(rest, levels))
    want = reference_tree_emd(X, axis, trees, alpha, beta)
    np.testing.assert_allclose(tree_emd(X, axis, trees, alpha, beta), want, rtol=1e-5, atol=1e-5)


def test_tree_emd_repeated_levels_example():
    """A hand-made tree where folders repeat over levels, with alpha and beta both nonzero."""
    tq = PartitionTree(np.array([[0, 0, 0, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 1, 1],
                                 [0, 0, 1, 2, 2], [0, 1, 2, 3, 4]]))
    tk = PartitionTree(np.array([[0, 0, 0], [0, 0, 1], [0, 1, 2]]))
    X = np.random.default_rng(4).standard_normal((5, 3, 6)).astype(np.float32)
    for alpha, beta in [(0.5, 1.5), (1.0, 0.0), (0.0, 1.0)]:
        want = reference_tree_emd(X, 2, (tq, tk), alpha, beta)
        np.testing.assert_allclose(tree_emd(X, 2, (tq, tk), alpha, beta), want, rtol=1e-5, atol=1e-6)


@FAST
@given(axis=st.integers(0, 2), seed=st.integers(0, 2**32 - 1))
def test_tree_emd_permuting_slices_permutes_D(axis, seed):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((6, 7, 5)).astype(np.float32)
    trees = tuple(random_tree(X.shape[a], rng) for a in range(3) if a != axis)
    perm = rng.permutation(X.shape[axis])
    D = tree_emd(X, axis, trees, 0.5, 1.0)
    Dp = tree_emd(np.take(X, perm, axis=axis), axis, trees, 0.5, 1.0)
    np.testing.assert_allclose(Dp, D[np.ix_(perm, perm)], rtol=1e-6, atol=1e-6)


def test_tree_emd_zero_on_identical_slices_and_metric():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((8, 6, 5)).astype(np.float32)
    X[:, :, 3] = X[:, :, 1]
    D = tree_emd(X, 2, (random_tree(8, rng), random_tree(6, rng)))
    assert D[1, 3] == 0 and D[3, 1] == 0
    assert np.array_equal(D, D.T) and np.all(np.diag(D) == 0)
    assert np.all(D[:, None, :] <= D[:, :, None] + D[None, :, :] + 1e-9)


def test_tree_emd_torch_in_torch_out():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((4, 5, 3)).astype(np.float32)
    trees = (random_tree(4, rng), random_tree(3, rng))
    Dt = tree_emd(torch.from_numpy(X), 1, trees)
    assert isinstance(Dt, torch.Tensor)
    np.testing.assert_allclose(Dt.numpy(), tree_emd(X, 1, trees), rtol=1e-6)


def dense_features(X, axis, trees, alpha, beta):
    """The product form of docs/method.md §4.1: M_A X_s M_B^T with weighted, row-normalised memberships."""
    def means(tree, a, b):
        mem = tree.folders[0].astype(float)
        return mem * (tree.folder_weights(a, b) / mem.sum(1))[:, None]
    ma, mb = means(trees[0], alpha, beta), means(trees[1], alpha, beta)
    xs = np.moveaxis(X.astype(float), axis, 0)
    return np.einsum("ai,sij,bj->sab", ma, xs, mb).reshape(xs.shape[0], -1)


def caterpillar(n):
    return PartitionTree(np.array([np.minimum(np.arange(n), lev) for lev in range(n)])) if n > 1 \
        else PartitionTree(np.zeros((1, 1), dtype=np.int64))


def flat(n):
    return PartitionTree(np.stack([np.zeros(n, dtype=np.int64), np.arange(n)])) if n > 1 \
        else PartitionTree(np.zeros((1, 1), dtype=np.int64))


@st.composite
def emd_case(draw):
    shape = tuple(draw(st.integers(1, 9)) for _ in range(3))
    axis = draw(st.integers(0, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    trees = []
    for a in (a for a in range(3) if a != axis):
        kind = draw(st.sampled_from(["nested", "balanced", "caterpillar", "flat"]))
        n = shape[a]
        trees.append({"nested": lambda: random_nested_tree(n, draw(st.integers(2, 5)), rng),
                      "balanced": lambda: random_tree(n, rng), "caterpillar": lambda: caterpillar(n),
                      "flat": lambda: flat(n)}[kind]())
    return rng.standard_normal(shape).astype(np.float32), axis, tuple(trees)


@FAST
@given(case=emd_case(), block_bytes=st.sampled_from([1, 100, 3000, 1 << 30]),
       torch_path=st.booleans(), alpha=st.sampled_from([0.0, 1.0]), beta=st.sampled_from([0.0, 1.0]))
def test_features_by_sweeps_and_chunks_equal_the_product_form(case, block_bytes, torch_path, alpha, beta):
    """Folder means built split by split, and the EMD from chunks of features with the
    chunks' roots carried to the folders above, equal the dense definition."""
    from oattn_lib import sweep
    X, axis, trees = case
    want = dense_features(X, axis, trees, alpha, beta)
    old_bytes, old_ok = emd._BLOCK_BYTES, sweep._numba_ok
    try:
        emd._BLOCK_BYTES = block_bytes
        if torch_path:  # the device path (CUDA), on CPU: torch sweeps and chunked cdist
            sweep._numba_ok = lambda x: False
            emd._L1Sum.numba = property(lambda self: False, lambda self, value: None)
        np.testing.assert_allclose(emd.tree_features(X, axis, trees, alpha, beta).numpy(), want, rtol=1e-5, atol=1e-6)
        D = tree_emd(X, axis, trees, alpha, beta)
    finally:
        emd._BLOCK_BYTES, sweep._numba_ok = old_bytes, old_ok
        if torch_path:
            del emd._L1Sum.numba
    np.testing.assert_allclose(D, cdist(want, want, "cityblock"), rtol=1e-5, atol=1e-5)


def test_tree_emd_in_blocks_at_scale():
    """Many chunks and several top programs on a 300-item tree; the same as one block."""
    rng = np.random.default_rng(8)
    X = rng.standard_normal((300, 20, 6)).astype(np.float32)
    for axis, trees in ((2, (random_tree(300, rng), random_tree(20, rng))),
                        (1, (caterpillar(300), random_tree(6, rng))),
                        (0, (random_tree(20, rng), flat(6)))):
        one = pairwise_l1(emd.tree_features(X, axis, trees))
        old = emd._BLOCK_BYTES
        try:
            emd._BLOCK_BYTES = 4000
            blocks = tree_emd(X, axis, trees)
        finally:
            emd._BLOCK_BYTES = old
        np.testing.assert_allclose(blocks, one, rtol=1e-5)


@pytest.mark.parametrize("shuffled", [False, True])
def test_tree_emd_of_causal_attention(shuffled):
    """Causal attention (query q sees the keys up to q in every head): the slices tiled by
    how far they reach, the folders by the reach of their items, the heads' columns zero in
    every head packed; the same distances as the dense features', the tokens in order or
    shuffled (no ordering of them assumed)."""
    rng = np.random.default_rng(10)
    n, h = 70, 4
    s = rng.standard_normal((n, n, h))
    allowed = np.tril(np.ones((n, n), dtype=bool))
    p = np.exp(np.where(allowed[:, :, None], s, -np.inf))
    X = (p / p.sum(1, keepdims=True)).astype(np.float32)
    if shuffled:
        X = X[rng.permutation(n)][:, rng.permutation(n)]
    many = emd.TreeEMD(X)
    assert many._has_zeros() and many._support(2) is None
    by_query, by_key = many._support(0)
    assert np.array_equal(by_query, (X != 0).any(2).sum(1)) and np.array_equal(by_key, (X != 0).any(2).sum(0))
    old = emd._BLOCK_BYTES
    try:
        emd._BLOCK_BYTES = 30000  # many chunks, and top programs
        for axis in range(3):
            trees = tuple(random_tree(X.shape[a], rng) for a in range(3) if a != axis)
            for alpha, beta in ((0.0, 1.0), (1.0, 0.0)):
                want = dense_features(X, axis, trees, alpha, beta)
                np.testing.assert_allclose(many(axis, trees, alpha, beta).numpy(), cdist(want, want, "cityblock"),
                                           rtol=1e-5, atol=1e-6)
    finally:
        emd._BLOCK_BYTES = old


def test_blocks_by_support_emit_folders_by_decreasing_reach():
    """With item supports, each block's folders come by decreasing support (a folder's is
    its items' largest); the features are the same set, reordered within each block."""
    rng = np.random.default_rng(11)
    X = rng.random((50, 12, 3)).astype(np.float32)
    tree_a, tree_b = random_tree(50, rng), random_tree(3, rng)
    support = rng.permutation(50).astype(float)
    many = emd.TreeEMD(X)
    plain = [b[:, :d].numpy().copy() for b, d in many.blocks(1, (tree_a, tree_b), (0.0, 0.0), (1.0, 1.0), 6000)]
    ordered = [b[:, :d].numpy().copy() for b, d in many.blocks(1, (tree_a, tree_b), (0.0, 0.0), (1.0, 1.0), 6000,
                                                               item_support=support)]
    assert len(plain) == len(ordered) > 2
    f_b = len(tree_b.folder_weights(0.0, 1.0))
    for a, b in zip(plain, ordered):
        cols = lambda m: sorted(map(tuple, m.T.round(6)))  # noqa: E731
        assert cols(a) == cols(b)
    # the folder of each ordered column block: its largest item support, non-increasing
    full = emd.tree_features(X, 1, (tree_a, tree_b)).numpy()
    folders = tree_a.folders[0]
    reach = np.array([support[f].max() for f in folders])
    key = {tuple(full[:, i * f_b:(i + 1) * f_b].ravel().round(6)): reach[i] for i in range(len(folders))}
    for b in ordered:
        got = [key[tuple(b[:, j * f_b:(j + 1) * f_b].ravel().round(6))] for j in range(b.shape[1] // f_b)]
        assert got == sorted(got, reverse=True)


def test_one_tree_emd_serves_many_calls():
    """Buffers kept from call to call (grown when needed) give every call's own answer."""
    rng = np.random.default_rng(9)
    X = rng.standard_normal((30, 25, 12)).astype(np.float32)
    many = emd.TreeEMD(X)
    old = emd._BLOCK_BYTES
    try:
        emd._BLOCK_BYTES = 20000
        for axis, trees in [(2, (random_tree(30, rng), random_tree(25, rng))), (0, (flat(25), random_tree(12, rng))),
                            (1, (caterpillar(30), flat(12))), (2, (flat(30), caterpillar(25)))]:
            np.testing.assert_allclose(many(axis, trees).numpy(), tree_emd(X, axis, trees), rtol=1e-6)
            want = pairwise_l1(emd.tree_features(X, axis, trees))
            np.testing.assert_allclose(many(axis, trees).numpy(), want, rtol=1e-5)
    finally:
        emd._BLOCK_BYTES = old


# -- emd_affinity -------------------------------------------------------------------------
@FAST
@given(m=st.integers(1, 20), seed=st.integers(0, 2**32 - 1), eps=st.floats(0.1, 10.0))
def test_affinity_range_and_diagonal(m, seed, eps):
    F = np.random.default_rng(seed).standard_normal((m, 8)).astype(np.float32)
    G = emd_affinity(pairwise_l1(F), eps)
    assert np.all(np.isfinite(G)) and np.all(G > 0) and np.all(G <= 1)
    assert np.all(np.diag(G) == 1) and np.array_equal(G, G.T)


def test_affinity_uses_the_median_of_all_entries():
    D = np.array([[0.0, 1.0, 4.0], [1.0, 0.0, 2.0], [4.0, 2.0, 0.0]])
    np.testing.assert_allclose(emd_affinity(D, eps=2.0), np.exp(-D / (2.0 * 1.0)))


@pytest.mark.parametrize("device", [  # np.partition on CPU, torch.kthvalue on other devices
    "cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))])
@pytest.mark.parametrize("count", [1, 2, 3, 4, 25, 4096, 4097])
def test_median_by_selection_is_numpys_to_the_bit(count, device):
    # odd counts: the middle value; even: the mean of the two middle ones. All values distinct,
    # so a one-off index picks a neighbouring order statistic, which differs. (A distance
    # matrix holds every value twice, which hides some one-off indices: not used here.)
    x = np.random.default_rng(count).random(count)
    assert emd._median(torch.from_numpy(x).to(device)) == np.median(x)


@pytest.mark.parametrize("n", [4, 5, 64])
def test_affinity_scale_is_numpys_median(n):
    a = np.random.default_rng(n).random((n, n))
    D = a + a.T
    np.fill_diagonal(D, 0.0)
    assert emd._median(torch.from_numpy(D).reshape(-1)) == np.median(D)
    # Both sides take exp of the same quotients -D / median; torch's and numpy's exp are
    # different SIMD loops (chosen per CPU: AVX-512 or AVX2), each within about 1 ulp of
    # exp, so they may differ by a couple of ulps. A wrong scale is ~1e12 ulps off.
    np.testing.assert_array_max_ulp(emd_affinity(D), np.exp(-D / np.median(D)), maxulp=4)


def test_affinity_degenerate_inputs_are_finite():
    assert np.array_equal(emd_affinity(np.zeros((4, 4))), np.ones((4, 4)))
    # most slices identical: median 0, falls back to the mean of the nonzero distances
    D = np.zeros((4, 4))
    D[0, 1:] = D[1:, 0] = 3.0
    G = emd_affinity(D)
    np.testing.assert_allclose(G, np.exp(-D / 3.0))
    Gt = emd_affinity(torch.zeros(3, 3))
    assert isinstance(Gt, torch.Tensor) and bool((Gt == 1).all())


# -- validation ---------------------------------------------------------------------------
def _trees(rng=np.random.default_rng(7)):
    return random_tree(4, rng), random_tree(5, rng)


@pytest.mark.parametrize("kwargs,match", [
    (dict(X=np.zeros((4, 5))), "X: expected 3 dimensions"),
    (dict(axis=3), "axis"),
    (dict(axis=-1), "axis"),
    (dict(axis=1.5), "axis"),
    (dict(axis=True), "axis"),
    (dict(trees=_trees()[::-1]), r"trees\[0\]: a tree on 5 items for axis 0"),
    (dict(trees=_trees()[:1]), "trees: expected a pair"),
    (dict(trees=(_trees()[0], np.zeros((2, 5)))), r"trees\[1\]: expected a PartitionTree"),
    (dict(X=np.full((4, 5, 3), np.nan)), "X: contains NaN or inf"),
    (dict(X=np.full((4, 5, 3), np.inf)), "X: contains NaN or inf"),
    (dict(alpha=np.nan), "alpha"),
    (dict(beta="x"), "beta"),
])
def test_tree_emd_rejects_bad_input(kwargs, match):
    args = dict(X=np.zeros((4, 5, 3), np.float32), axis=2, trees=_trees(), alpha=0.0, beta=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        tree_emd(**args)


@pytest.mark.parametrize("F,match", [
    (np.zeros(5), "F: expected 2 dimensions"),
    (np.zeros((0, 5)), "F: has an axis of length 0"),
    (np.array([[0.0, np.nan]]), "F: contains NaN"),
])
def test_pairwise_l1_rejects_bad_input(F, match):
    with pytest.raises(ValueError, match=match):
        pairwise_l1(F)


@pytest.mark.parametrize("D,eps,match", [
    (np.zeros((3, 3)), 0.0, "eps: must be positive"),
    (np.zeros((3, 3)), -1.0, "eps: must be positive"),
    (np.zeros((3, 3)), np.nan, "eps: must be finite"),
    (np.zeros((3, 4)), 1.0, "D: expected a square"),
    (np.zeros(3), 1.0, "D: expected 2 dimensions"),
    (-np.ones((3, 3)), 1.0, "D: distances must be nonnegative"),
    (np.full((3, 3), np.inf), 1.0, "D: contains NaN or inf"),
])
def test_emd_affinity_rejects_bad_input(D, eps, match):
    with pytest.raises(ValueError, match=match):
        emd_affinity(D, eps)
