"""Partition trees (docs/method.md §2): structure, flexible tree, balanced tree, xarray round trip."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from oattn_lib.trees import (PartitionTree, _greedy_merge, _node_means, balanced_tree, flexible_tree, random_tree,
                             tie_order)


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
    # constant affinity: every distance 0; identity: disconnected; zeros: no edges at all
    for a in (np.ones((30, 30)), np.eye(30), np.zeros((5, 5))):
        t = flexible_tree(a)
        assert_valid_tree(t)
    assert flexible_tree(np.ones((1, 1))).n_levels == 1
    assert flexible_tree(np.ones((2, 2))).n_levels == 2


# -- the greedy merge of one level (docs/method.md §2.3) on hand-built distance matrices ------
def merged(dist, constant=1.0):
    """The groups _greedy_merge forms, as a set of frozensets of node indices."""
    group = _greedy_merge(np.asarray(dist, dtype=float), constant)
    assert group.shape == (len(dist),)
    return {frozenset(np.flatnonzero(group == g).tolist()) for g in np.unique(group)}


def line(positions):
    x = np.asarray(positions, dtype=float)
    return np.abs(x[:, None] - x[None, :])


@given(st.integers(1, 40), st.integers(0, 2**31 - 1))
@settings(max_examples=30, deadline=None)
def test_node_distances_are_means_over_leaves(n, seed):
    """Segment sums give the membership product M D M^T of docs/method.md §2.2 step 3."""
    rng = np.random.default_rng(seed)
    d = rng.random((n, n))
    d = d + d.T
    node = np.unique(rng.integers(0, max(1, n // 2), n), return_inverse=True)[1]
    mem = (node[None, :] == np.arange(node.max() + 1)[:, None]).astype(float)
    mem /= mem.sum(1, keepdims=True)
    np.testing.assert_allclose(_node_means(d, node), mem @ d @ mem.T, rtol=1e-12)


@given(st.integers(1, 70), st.integers(1, 13), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_node_mean_distances_are_the_leaf_matrix_means_to_the_bit(n, d, seed):
    """The compiled node means of the coordinates' distances add what pdist, squareform and the
    membership product add, in their order: the trees cannot tell them apart. Coordinates
    decaying over 12 orders of magnitude, as a level's do; nodes of every size, one leaf each."""
    import scipy.spatial.distance

    from oattn_lib.tree_kernels import node_mean_distances, node_means
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)) * np.logspace(0, -12, d)
    if n > 3:
        x[1] = x[0]  # a distance of exactly 0 between two leaves
    node = np.arange(n) if seed % 3 == 0 else np.unique(rng.integers(0, max(1, n // 3), n), return_inverse=True)[1]
    d_leaf = scipy.spatial.distance.squareform(scipy.spatial.distance.pdist(x))
    ref = _node_means(d_leaf, node)
    got = node_mean_distances(x, node)
    assert got.shape == (node.max() + 1,) * 2
    np.testing.assert_array_equal(got, ref)
    # any matrix (the tie-break's -log affinity is no distance)
    raw = -np.log(rng.random((n, n)))
    np.fill_diagonal(raw, -0.0)  # -log(1): the product's sum turns it into 0.0
    for nodes in (node, np.arange(n)):
        got = node_means(raw, nodes)
        np.testing.assert_array_equal(got, _node_means(raw, nodes))
        assert not np.signbit(got).any()


def test_greedy_merge_stops_at_the_median():
    # points at 0, 1, 2, 3, 10, 30. With the 999 diagonal the median of the 36 entries is
    # the mean of the 9th and 10th smallest pair distances, (9 + 10) / 2 = 9.5. The four
    # close points form one group (each joins at distance 1 < 9.5 * 2^(1 - s)), the point
    # at 10 is refused by that group, and the point at 30 is nearest to the point at 10
    # at distance 20 >= 9.5, so the level stops there. Without the stop the last two,
    # both still single, would pair up (two singletons always merge).
    assert merged(line([0, 1, 2, 3, 10, 30])) == {frozenset({0, 1, 2, 3}), frozenset({4}),
                                                  frozenset({5})}
    # the stop also applies to the next-nearest neighbour a refused node tries: points at
    # 0, 6, 8, 17 (median (9 + 11) / 2 = 10). Nodes 1 and 2 pair up; node 0 (nearest 6)
    # and node 3 (nearest 9) are refused by that pair (6 and 9 >= 10 / 2), and node 3's
    # next single neighbour, node 0, is at 17 >= 10: both stay single, not (0, 3)
    assert merged(line([0, 6, 8, 17])) == {frozenset({0}), frozenset({1, 2}), frozenset({3})}


def test_greedy_merge_needs_one_merge_before_the_median_stop():
    # every distance equals the median, so only the rule "at least one merge has happened"
    # lets the first pair merge; the third node then stops the level
    d = np.ones((3, 3))
    assert merged(d) == {frozenset({0, 1}), frozenset({2})}


def test_greedy_merge_size_penalty():
    # points at 0, 1, 2, 4: pair distances 1, 1, 2, 2, 3, 4; median of the 16 entries
    # (4 diagonal 999s) = (2 + 3) / 2 = 2.5 = penalty (c = 1). Nodes 0 and 1 pair up;
    # node 2 joins their group of 2 since 1 < 2.5 * 2^(1 - 2) = 1.25; node 3 is refused
    # by the group of 3 since 2 >= 2.5 * 2^(1 - 3) = 0.625, and its next neighbour (3)
    # is beyond the median. No size factor would let node 3 in (2 < 2.5); a factor
    # 2^(1 - 1 - s2) would refuse node 2 (1 >= 0.625), which then pairs with node 3;
    # a median without the diagonal (2) would refuse node 2 and stop.
    assert merged(line([0, 1, 2, 4])) == {frozenset({0, 1, 2}), frozenset({3})}
    # a smaller constant raises the penalty (med / c): node 3 now joins (2 < 10 / 4)
    assert merged(line([0, 1, 2, 4]), constant=0.25) == {frozenset({0, 1, 2, 3})}


def test_greedy_merge_tries_the_next_nearest_neighbour():
    # nodes 0-2: a cluster (distance 1); nodes 3-4: a pair (distance 1); node 5 is 2.5
    # from node 0, 3 from node 3, 3.5 from node 4 and 6 from nodes 1, 2; the rest 10.
    d = np.full((6, 6), 10.0)
    for (a, b), v in {(0, 1): 1, (0, 2): 1, (1, 2): 1, (3, 4): 1, (0, 5): 2.5, (3, 5): 3,
                      (4, 5): 3.5, (1, 5): 6, (2, 5): 6}.items():
        d[a, b] = d[b, a] = v
    # median = mean of the 9th and 10th smallest pair distances = (6 + 10) / 2 = 8.
    # Node 5 comes last: its nearest group {0, 1, 2} refuses it (2.5 >= 8 * 2^(1 - 3)),
    # then its next-nearest neighbour, node 3 at 3 (within 2 * 2.5 and below 8), is in
    # a group of 2 that accepts it (3 < 8 * 2^(1 - 2)). Giving up after the first
    # refusal would leave node 5 single.
    assert merged(d) == {frozenset({0, 1, 2}), frozenset({3, 4, 5})}


def test_greedy_merge_next_nearest_only_if_comparably_near():
    # nodes 0-2: a tight cluster (distance 1); node 3 is 3 from node 2 and 4 from nodes
    # 0 and 1; node 4 is 7 from node 3 and 5 from node 5; every other pair is far.
    big = 20.0
    d = np.full((6, 6), big)
    for (a, b), v in {(0, 1): 1, (0, 2): 1, (1, 2): 1, (2, 3): 3, (0, 3): 4, (1, 3): 4,
                      (3, 4): 7, (4, 5): 5, (3, 5): 10, (2, 4): 12}.items():
        d[a, b] = d[b, a] = v
    # median of the 36 entries = mean of the 9th and 10th smallest pair distances
    # (10 + 12) / 2 = 11. The cluster forms first; node 3 is refused by it (3 >= 11 / 4,
    # and 4 >= 11 / 4); its next neighbour, node 4 at 7, is more than twice its nearest
    # distance 3, so node 3 stays single, and node 4 then pairs with node 5. Trying node 4
    # anyway (no 2x rule, or a 3x one) would pair 3 with 4 (7 < 11).
    assert merged(d) == {frozenset({0, 1, 2}), frozenset({3}), frozenset({4, 5})}


@pytest.mark.parametrize("kind", ["curve", "cloud"])
def test_flexible_tree_size_at_256(kind):
    # docs/method.md §2.2: n = 256 gives about 10 levels and about 2n folders. A tree of pairs has
    # log2(256) + 1 = 9 levels and 2n - 1 folders, one of triples log3(256) + 1 = 6 and
    # 1.5n; the flexible tree merges pairs and triples (a singleton joins a group of s
    # nodes only within med * 2^(1 - s)) and carries isolated nodes up unchanged (a
    # folder on two levels counts twice here). Measured: curve 8 levels and 1.53n
    # folders; 5-D cloud 10 levels and 1.70n. The band 7-12 levels, 1.4n-2.3n folders
    # holds both; merging without the size penalty gives 5-6 levels, one merge per level
    # about n levels.
    rng = np.random.default_rng(0)
    if kind == "curve":
        s = rng.random(256) * 2 * np.pi
        pts = np.stack([np.cos(s), np.sin(2 * s), 0.3 * s], axis=1)
    else:
        pts = rng.random((256, 5))
    d2 = ((pts[:, None] - pts[None]) ** 2).sum(-1)
    scale = 0.1 if kind == "curve" else 0.3
    t = flexible_tree(np.exp(-d2 / (scale * np.median(d2))))
    assert_valid_tree(t)
    n_folders = sum(t.n_folders(lev) for lev in range(t.n_levels))
    assert 7 <= t.n_levels <= 12, t
    assert 1.4 * 256 <= n_folders <= 2.3 * 256, n_folders


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


# -- the head tree against the architecture (docs/method.md §2.5) ------------------------------------------
def test_level_agreement_scores_each_level_against_a_labelling():
    from oattn_lib.trees import level_agreement
    layer = np.repeat(np.arange(3), 4)  # 3 layers x 4 heads
    kv = layer * 2 + (np.arange(12) % 4) // 2  # 2 key/value heads per layer
    rng = np.random.default_rng(0)
    perm = rng.permutation(12)  # the tree's items in any order: agreement is about sets, not positions
    tree = PartitionTree(np.stack([np.zeros(12, int), layer, kv, np.arange(12)])[:, perm])
    got_layer = level_agreement(tree, layer[perm])
    got_kv = level_agreement(tree, kv[perm])
    np.testing.assert_allclose(got_layer, [0, 1, got_layer[2], 0])
    np.testing.assert_allclose(got_kv, [0, got_kv[1], 1, 0])
    assert 0 < got_layer[2] < 1 and 0 < got_kv[1] < 1  # nested: partly right
    # a tree blind to layers scores about 0 on average, never 1
    blind = [level_agreement(random_tree(12, rng), layer)[1:-1] for _ in range(50)]
    assert abs(np.mean(np.concatenate(blind))) < 0.1 and np.max(np.concatenate(blind)) < 1
    with pytest.raises(ValueError, match="labels"):
        level_agreement(tree, layer[:5])


def test_adjusted_rand_index_is_sklearns_on_every_row():
    """The index of each row of a partition matrix against one labelling, all rows at once, is
    scikit-learn's `adjusted_rand_score` of that row, to the last bit: labels of any values,
    one class, all singletons, rows of other class counts."""
    from sklearn.metrics import adjusted_rand_score

    from oattn_lib.trees import adjusted_rand_index

    rng = np.random.default_rng(3)
    for n in (1, 2, 5, 17, 40):
        labels = rng.integers(0, 4, n) * 7 - 3
        rows = np.stack([rng.integers(0, 2, n), rng.integers(0, 9, n), np.zeros(n, int), np.arange(n)[::-1],
                         labels, rng.permutation(n) // 3])
        want = [adjusted_rand_score(labels, row) for row in rows]
        assert adjusted_rand_index(labels, rows).tolist() == want, n
        # and each row alone, as the only row
        assert [adjusted_rand_index(labels, row[None])[0] for row in rows] == want


def test_architecture_agreement_scores_kv_groups_only_for_a_grouped_model():
    from oattn_lib.trees import architecture_agreement
    layer = np.repeat(np.arange(3), 4)
    head = np.tile(np.arange(4), 3)
    kv = head // 2  # 2 key/value heads per layer, numbered within the layer
    tree = PartitionTree(np.stack([np.zeros(12, int), layer, layer * 2 + kv, np.arange(12)]))
    by_layer, by_kv = architecture_agreement(tree, layer, head, kv)
    # the groups are (layer, kv) pairs: level 2 is exactly them, not the kv index alone
    np.testing.assert_allclose(by_layer[1], 1.0)
    np.testing.assert_allclose(by_kv[2], 1.0)
    # a group per head (multi-head attention) or no groups: nothing to score
    assert np.isnan(architecture_agreement(tree, layer, head, head)[1]).all()
    assert np.isnan(architecture_agreement(tree, layer, head, None)[1]).all()
    np.testing.assert_array_equal(architecture_agreement(tree, layer, head, None)[0], by_layer)


# -- rounding noise and item order (docs/method.md §2.2 step 3, §2.3) ----------------------------
def test_an_exact_tie_in_the_greedy_merge_does_not_depend_on_a_one_ulp_change():
    # node 0 is at distance 1 from nodes 1 and 2 (and from 3 and 5): an exact tie, which ranks by
    # node index; moving one of the tied distances by one step either way must not reorder it
    d = np.array([[0, 1, 1, 1, 5, 1], [1, 0, 1, 3, 1, 5], [1, 1, 0, 5, 1, 1], [1, 3, 5, 0, 3, 1],
                  [5, 1, 1, 3, 0, 2], [1, 5, 1, 1, 2, 0]], dtype=float)
    want = merged(d)
    for direction in (0.0, 2.0):
        e = d.copy()
        e[0, 2] = e[2, 0] = np.nextafter(1.0, direction)
        assert merged(e) == want, direction


def _gaussian_affinity(seed, n=64):
    """Points in a cube under a wide Gaussian kernel: fast-decaying diffusion eigenvalues, so at
    the coarse levels the embedding distances are tiny differences of nearly equal coordinates."""
    x = np.random.default_rng(seed).random((n, 3))
    return np.exp(-((x[:, None] - x[None]) ** 2).sum(-1) / 4)


@pytest.mark.parametrize("seed", range(5))
def test_a_flexible_tree_depends_on_the_affinity_not_on_its_last_bits_or_item_order(seed):
    # computed as |a|^2 + |b|^2 - 2ab, the coarse levels' distances were rounding noise (or 0) and
    # the tree changed under a one-step change of 5% of the entries (2 seeds in 10) and under a
    # renaming of the items (9 in 10)
    from oattn_lib.stability import rename_tree, same_folders

    a = _gaussian_affinity(seed)
    ref = flexible_tree(a)
    rng = np.random.default_rng(100 + seed)
    b = a.copy()
    hit = np.triu(rng.random(a.shape) < 0.05, 1)
    b[hit] = np.nextafter(b[hit], np.inf)
    b = np.triu(b) + np.triu(b, 1).T
    assert same_folders(flexible_tree(b), ref)
    p = rng.permutation(a.shape[0])
    assert same_folders(rename_tree(flexible_tree(a[p][:, p]), np.argsort(p)), ref)


def test_the_merge_log_records_the_joins_that_make_the_groups():
    d = line([0, 1, 2, 3, 10, 30])
    log = []
    group = _greedy_merge(d, 1.0, log=log)
    joined = {frozenset((int(i), int(j))) for what, i, j in log if what == "join"}
    assert joined and all(group[i] == group[j] for i, j in map(tuple, joined))
    # every node is visited or the level stops: the log names each decision of the loop
    assert {what for what, _, _ in log} <= {"skip", "stop", "penalty", "join", "median", "2x nn", "single"}
    assert np.array_equal(_greedy_merge(d, 1.0), group)  # the log changes nothing


def _cut_off_affinity(seed, n=24, n_off=3):
    """A Gaussian cluster plus `n_off` items whose affinities to everything are below the 1e-8
    cut of the diffusion embedding (as an attention sink's key is at 1024 tokens): after the cut
    those items are exactly alike, so only the affinities before the cut tell them apart."""
    a = _gaussian_affinity(seed, n)
    rng = np.random.default_rng(seed)
    m = n + n_off
    out = np.zeros((m, m))
    out[:n, :n] = a
    off = 10.0 ** -rng.uniform(12, 40, size=(n_off, m))
    out[n:, :] = off
    out[:, n:] = np.maximum(out[:, n:], off.T)
    out = np.minimum(out, out.T)
    np.fill_diagonal(out, 1.0)
    return out


@pytest.mark.parametrize("seed", range(4))
def test_items_the_cut_leaves_alike_are_told_apart_by_their_affinity_not_their_index(seed):
    # ranked by index, which of the cut-off items joins a folder first followed the item order, and
    # a renaming of the items changed the folders (as it did for SmolLM2's keys at 1024 tokens)
    from oattn_lib.stability import rename_tree, same_folders

    a = _cut_off_affinity(seed)
    ref = flexible_tree(a)
    rng = np.random.default_rng(200 + seed)
    for _ in range(12):
        p = rng.permutation(a.shape[0])
        renamed = rename_tree(flexible_tree(a[p][:, p]), np.argsort(p))
        assert same_folders(renamed, ref)
        # the sibling order too: psi_1 is not a vector the eigensolver picked inside the
        # repeated top eigenvalue of the disconnected graph
        assert renamed == ref


def test_tie_order_ranks_a_tie_by_the_secondary_key_then_by_index():
    v = np.array([3.0, 1.0, 1.0 + 1e-9, 1.0, 2.0])
    assert tie_order(v).tolist() == [1, 2, 3, 4, 0]
    assert tie_order(v, secondary=np.array([0, 5, 4, 5 * (1 + 1e-9), 0.0])).tolist() == [2, 1, 3, 4, 0]
    rows = np.stack([v, v[::-1]])
    sec = np.stack([np.array([0, 5, 4, 5, 0.0]), np.array([0, 9, 0, 7, 0.0])])
    assert tie_order(rows, secondary=sec).tolist() == [[2, 1, 3, 4, 0], [2, 3, 1, 0, 4]]


# -- the partial eigensolver of large trees -----------------------------------------------------
def _normalised_affinity(n: int, seed: int = 0) -> np.ndarray:
    """P of `trees._diffusion_embedding` for a structured affinity of n items (7 groups + noise)."""
    rng = np.random.default_rng(seed)
    x = rng.random((n, 40))
    x[:, :3] *= 5 * (np.arange(n) % 7)[:, None] / 7
    g = x @ x.T
    g /= np.sqrt(np.outer(np.diag(g), np.diag(g)))
    a = np.exp(-(1 - g) / 0.05)
    a *= a > 1e-8
    d = a.sum(1)
    p1 = a / np.outer(d, d)
    d2 = np.sqrt(p1.sum(1))
    return p1 / np.outer(d2, d2), a


def test_inertia_counts_the_eigenvalues_above_a_threshold():
    """Against eigvalsh, on matrices whose factorization has 2 x 2 pivot blocks (a zero
    diagonal forces them) and thresholds next to an eigenvalue."""
    from oattn_lib.trees import _inertia_above
    rng = np.random.default_rng(1)
    for trial in range(120):
        n = int(rng.integers(2, 70))
        m = rng.standard_normal((n, n))
        m = m + m.T
        if trial % 2:
            np.fill_diagonal(m, 0.0)
        w = np.linalg.eigvalsh(m)
        for theta in (-5.0, 0.0, 3.0 * rng.standard_normal(), w[n // 2] - 1e-7, w[n // 2] + 1e-7, w[-1] + 1.0):
            assert _inertia_above(m, theta) == int((w > theta).sum()), (trial, theta)


def test_partial_eigenpairs_are_the_full_solvers_largest():
    from oattn_lib.trees import _top_eigenpairs
    p, _ = _normalised_affinity(1100)
    w, v = _top_eigenpairs(p, 12)
    wf, vf = np.linalg.eigh(p)
    top = np.argsort(np.abs(wf))[::-1][:12]
    order = np.argsort(np.abs(w))[::-1]
    np.testing.assert_allclose(np.abs(w[order]), np.abs(wf[top]), rtol=0, atol=1e-12)
    np.testing.assert_allclose(np.abs((v[:, order] * vf[:, top]).sum(0)), 1.0, atol=1e-9)


def test_a_skipped_eigenvalue_falls_back_to_every_eigenpair(monkeypatch):
    """Lanczos from one vector can miss a repeated eigenvalue and return the next one instead:
    the inertia count sees the gap, and the embedding comes from the full solver."""
    import scipy.sparse.linalg

    from oattn_lib import trees
    p, _ = _normalised_affinity(1100)
    eigsh = scipy.sparse.linalg.eigsh

    def skipping(a, k, **kw):
        w, v = eigsh(a, k=k + 1, **kw)
        keep = np.argsort(np.abs(w))[::-1]
        keep = np.delete(keep, 1)  # the second largest is missed
        return w[keep], v[:, keep]

    monkeypatch.setattr(scipy.sparse.linalg, "eigsh", skipping)
    assert trees._top_eigenpairs(p, 12) is None
    u, s = trees._top_singular(p, 12)
    wf = np.linalg.eigvalsh(p)
    np.testing.assert_allclose(s, np.sort(np.abs(wf))[::-1][:12], atol=1e-12)


def _disconnected(p_big: np.ndarray, seed: int = 0):
    """Block-diagonal P: p_big, then a 3-item and a 2-item component and two isolated items,
    the items shuffled; returns (P, component of each item, permutation applied)."""
    rng = np.random.default_rng(seed)
    blocks = [p_big]
    for m in (3, 2):
        b = rng.random((m, m)) + 1.0
        b = (b + b.T) / 2
        d = np.sqrt(b.sum(1))
        blocks.append(b / np.outer(d, d))
    blocks += [np.ones((1, 1)), np.ones((1, 1))]
    n = sum(len(b) for b in blocks)
    p, comp, at = np.zeros((n, n)), np.empty(n, dtype=np.int64), 0
    for c, b in enumerate(blocks):
        p[at:at + len(b), at:at + len(b)] = b
        comp[at:at + len(b)] = c
        at += len(b)
    perm = rng.permutation(n)
    return p[np.ix_(perm, perm)], comp[perm], perm


def test_a_disconnected_graph_is_solved_per_component(monkeypatch):
    """docs/method.md §2.2: the eigenvalue 1 repeats once per component; each component's own
    eigenpairs (padded with exact zeros) are P's, the repeated ones ranked largest component
    first, and the large component is solved by Lanczos, never by every eigenpair of P."""
    import torch

    from oattn_lib import trees
    p_big, _ = _normalised_affinity(1100)
    p, comp, _ = _disconnected(p_big)
    full = torch.linalg.eigh

    def small_only(a):
        assert a.shape[0] < 1024, "every eigenpair of a large matrix was computed"
        return full(a)

    monkeypatch.setattr(torch.linalg, "eigh", small_only)
    u, s = trees._top_singular(p, 12)
    wf = np.linalg.eigvalsh(p)
    np.testing.assert_allclose(s, np.sort(np.abs(wf))[::-1][:12], atol=1e-12)
    w = np.einsum("ik,ij,jk->k", u, p, u)  # signed eigenvalues
    np.testing.assert_allclose(np.abs(w), s, atol=1e-12)
    np.testing.assert_allclose(p @ u, u * w, atol=1e-10)
    np.testing.assert_allclose(u.T @ u, np.eye(12), atol=1e-10)
    owner = [np.unique(comp[u[:, k] != 0]) for k in range(12)]
    assert all(len(o) == 1 for o in owner), "a vector spans two components"
    ones = np.flatnonzero(np.abs(s - 1) < 1e-9)
    # the 5 components' eigenvalue 1: by size (1100, 3, 2, then the isolated items by first index)
    first_item = [np.flatnonzero(comp == c).min() for c in (3, 4)]
    expect = [0, 1, 2] + [c for _, c in sorted(zip(first_item, (3, 4)))]
    assert [int(owner[k][0]) for k in ones[:5]] == expect


@given(st.integers(1, 60), st.floats(0.0, 0.2), st.integers(0, 2**31 - 1))
@settings(max_examples=40, deadline=None)
def test_graph_components_are_scipys(n, density, seed):
    import scipy.sparse
    import scipy.sparse.csgraph

    from oattn_lib.tree_kernels import graph_components
    rng = np.random.default_rng(seed)
    p = rng.random((n, n)) * (rng.random((n, n)) < density)
    p = p + p.T
    n_comp, comp = graph_components(p)
    ref_n, ref = scipy.sparse.csgraph.connected_components(scipy.sparse.csr_matrix(p), directed=False)
    assert n_comp == ref_n
    # the same partition, components numbered by their first item
    assert np.array_equal(comp, np.unique(ref, return_index=True)[1].argsort().argsort()[ref])


def test_a_disconnected_trees_solvers_agree(monkeypatch):
    """The tree of a disconnected affinity is the same whether each component's eigenpairs come
    from Lanczos or from every eigenpair: the eigenspace of 1 no longer depends on the solver."""
    from oattn_lib import trees
    _, a_big = _normalised_affinity(1030, seed=3)
    n_big = len(a_big)
    a = np.zeros((n_big + 9, n_big + 9))
    a[:n_big, :n_big] = a_big
    rng = np.random.default_rng(4)
    a[n_big:n_big + 6, n_big:n_big + 6] = 0.5 + 0.5 * rng.random((6, 6))
    a[n_big:, n_big:] = (a[n_big:, n_big:] + a[n_big:, n_big:].T) / 2
    np.fill_diagonal(a, 1.0)
    partial = trees.flexible_tree(a)
    monkeypatch.setattr(trees, "PARTIAL_EIGEN_MIN", 10 ** 9)
    full = trees.flexible_tree(a)
    np.testing.assert_array_equal(partial.labels, full.labels)
    assert_valid_tree(partial)


def test_a_large_tree_is_the_one_every_eigenpair_gives(monkeypatch):
    from oattn_lib import trees
    _, a = _normalised_affinity(1024, seed=2)
    partial = trees.flexible_tree(a)
    monkeypatch.setattr(trees, "PARTIAL_EIGEN_MIN", 10 ** 9)
    full = trees.flexible_tree(a)
    np.testing.assert_array_equal(partial.labels, full.labels)


def test_a_prefix_of_the_tie_order_is_the_full_orders_first_columns():
    from oattn_lib.trees import tie_order_prefix
    rng = np.random.default_rng(5)
    incomplete = 0
    for trial in range(60):
        m, rows = int(rng.integers(70, 300)), int(rng.integers(1, 12))
        if trial % 2:  # runs of near-equal values, some longer than the prefix
            v = rng.integers(0, 6, (rows, m)).astype(float) * (1 + 1e-8 * rng.standard_normal((rows, m)))
        else:
            v = rng.random((rows, m))
        sec = np.round(rng.random((rows, m)), 1)
        for k in (1, 4, 32):
            for s in (None, sec, lambda: sec):
                got, complete = tie_order_prefix(v, k, secondary=s)
                np.testing.assert_array_equal(got[complete], tie_order(v, secondary=s)[complete, :k])
                incomplete += int((~complete).sum())
    assert incomplete > 0  # the check that a run may continue past the prefix was exercised


@pytest.mark.parametrize("kind", ["points", "ties", "near_ties"])
def test_the_merge_decides_as_with_every_neighbour_sorted(monkeypatch, kind):
    """Ranking only the first few neighbours of each node (then a whole row where a node tries
    more) makes every decision the full sort makes: the same groups, the same log."""
    import oattn_lib.trees as trees
    rng = np.random.default_rng(["points", "ties", "near_ties"].index(kind))
    for _ in range(12):
        m = int(rng.integers(5, 160))
        if kind == "points":
            x = rng.random((m, 3))
            d = np.sqrt(((x[:, None] - x[None]) ** 2).sum(-1))
        else:
            d = rng.integers(1, 5, (m, m)).astype(float)
            if kind == "near_ties":
                d *= 1 + 1e-9 * rng.standard_normal((m, m))
            d = d + d.T
        np.fill_diagonal(d, 0.0)
        tb = np.round(rng.random((m, m)), 1)
        tb = tb + tb.T
        for constant in (0.5, 1.0, 3.0):
            for tiebreak in (None, tb):
                got = []
                for k in (2, 10 ** 6):
                    monkeypatch.setattr(trees, "NEIGHBOURS_SORTED", k)
                    log = []
                    got.append((_greedy_merge(d, constant, log, tiebreak=tiebreak), log))
                np.testing.assert_array_equal(got[0][0], got[1][0])
                assert got[0][1] == got[1][1]


def test_an_affinity_that_is_not_one_gets_an_error_naming_what_is_wrong():
    a = np.random.default_rng(0).random((6, 6))
    sym = (a + a.T) / 2
    for bad, what in ((a, r"not symmetric \(max \|A - A\^T\| = "), (sym[:5], "square matrix"),
                      (sym - 1.0, "negative entries"), (np.where(sym > 0.5, np.nan, sym), "NaN or inf")):
        with pytest.raises(ValueError, match=what):
            flexible_tree(bad)
    # asymmetry within the tolerance (relative to the largest entry) is rounding: the mean is used
    near = sym * 1e3
    near[0, 1] += 1e-4
    np.testing.assert_array_equal(flexible_tree(near).labels, flexible_tree((near + near.T) / 2).labels)
