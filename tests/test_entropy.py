"""Haar entropies, sparsity, Table 1 counts and stability (docs/method.md §6)."""
import logging

import numpy as np
import pytest

from oattn_lib.entropy import (clamped_top_k, coarsest, extreme_heads, head_entropy, head_sparsity,
                               jaccard_stability, network_entropy, network_sparsity)
from oattn_lib.haar import haar_basis
from oattn_lib.questionnaire import Organization
from oattn_lib.trees import PartitionTree, random_tree


def make_org(nq, nk, nh, seed=0):
    rng = np.random.default_rng(seed)
    eye = np.eye(1)
    return Organization(random_tree(nq, rng), random_tree(nk, rng), random_tree(nh, rng), eye, eye, eye)


def naive_head_entropy(x, org, top_k):
    bq, sq, lq = haar_basis(org.tree_q)
    bk, sk, lk = haar_basis(org.tree_k)
    entries = []
    for a in range(len(sq)):
        for b in range(len(sk)):
            entries.append((-sq[a] * sk[b], lq[a] + lk[b], a * len(sk) + b, a, b))
    entries.sort()
    chosen = entries[:top_k]
    out = []
    for h in range(x.shape[2]):
        c = bq.T @ x[:, :, h].astype(float) @ bk
        out.append(sum(abs(c[a, b]) for *_, a, b in chosen))
    return np.array(out)


def test_head_entropy_matches_naive_loop():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, 7, 5)).astype(np.float32)
    org = make_org(9, 7, 5)
    for k in (1, 10, 63):
        np.testing.assert_allclose(head_entropy(x, org, top_k=k), naive_head_entropy(x, org, k), rtol=1e-5)


def test_network_entropy_matches_naive_loop():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 5, 4))
    org = make_org(6, 5, 4, seed=1)
    bases = [haar_basis(t) for t in (org.tree_q, org.tree_k, org.tree_h)]
    c = np.einsum("qkh,qa,kb,hc->abc", x, *(b[0] for b in bases))
    keys = []
    for idx in np.ndindex(c.shape):
        sup = np.prod([bases[ax][1][i] for ax, i in enumerate(idx)])
        lev = sum(bases[ax][2][i] for ax, i in enumerate(idx))
        keys.append((-sup, lev, np.ravel_multi_index(idx, c.shape), idx))
    keys.sort()
    expect = sum(abs(c[k[3]]) for k in keys[:20])
    assert network_entropy(x, org, top_k=20) == pytest.approx(expect, rel=1e-5)


def test_head_entropy_invariant_to_relabelling_heads():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 8, 6)).astype(np.float32)
    org = make_org(8, 8, 6)
    p = rng.permutation(6)
    np.testing.assert_allclose(head_entropy(x[:, :, p], org, 16), head_entropy(x, org, 16)[p], rtol=1e-6)
    # the network entropy does not depend on how heads are numbered, if the head tree
    # is relabelled with them
    org_p = Organization(org.tree_q, org.tree_k, PartitionTree(org.tree_h.labels[:, p]),
                         org.affinity_q, org.affinity_k, org.affinity_h)
    assert network_entropy(x[:, :, p], org_p, 10) == pytest.approx(network_entropy(x, org, 10), rel=1e-5)


def test_sparsity_l1_over_l2():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(8, 8, 3)).astype(np.float32)
    org = make_org(8, 8, 3)
    s = head_sparsity(x, org)
    assert ((s >= 1 - 1e-6) & (s <= 8 + 1e-6)).all()  # 1 <= l1/l2 <= sqrt(64)
    const = np.ones((8, 8, 2), np.float32)
    const[:, :, 1] = 0
    np.testing.assert_allclose(head_sparsity(const, make_org(8, 8, 2)), [1.0, 0.0], atol=1e-6)
    # [c, 0] along heads is two head-Haar coefficients of equal size: l1/l2 = sqrt(2)
    assert network_sparsity(const, make_org(8, 8, 2)) == pytest.approx(np.sqrt(2), abs=1e-6)
    assert network_sparsity(np.ones((8, 8, 2)), make_org(8, 8, 2)) == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize("shape,dims", [((9, 6, 5), (0, 1)), ((9, 6, 5), 0), ((40,), 0), ((4, 5, 6), (1, 2)),
                                        ((4, 5, 6), (0, 1, 2)), ((1, 1, 1), (0, 1))])
def test_l1_over_l2_in_slabs_equals_one_pass(monkeypatch, shape, dims):
    """Slab by slab (no float64 copy of the whole tensor) gives the one-pass ratio."""
    import torch

    from oattn_lib import entropy
    c = torch.from_numpy(np.random.default_rng(4).normal(size=shape).astype(np.float32))
    c[..., 0] = 0
    d = c.double()
    l1, l2 = d.abs().sum(dims), d.pow(2).sum(dims).sqrt()
    want = torch.where(l2 > 0, l1 / torch.where(l2 > 0, l2, torch.ones_like(l2)), torch.zeros_like(l1))
    for slab in (1, 7, 1 << 22):
        monkeypatch.setattr(entropy, "_SLAB", slab)
        torch.testing.assert_close(entropy.l1_over_l2(c, dims), want, rtol=1e-12, atol=0)


def test_coarsest_prefers_large_support_then_coarse_level():
    idx = coarsest([np.array([4, 4, 2, 2]), np.array([3, 1, 2])],
                   [np.array([0, 0, 1, 1]), np.array([0, 1, 0])], 4)
    # supports: (0,0)=12, (1,0)=12, (0,2)=8, (1,2)=8, (2,0)=6 ...
    assert idx.tolist() == [0, 3, 2, 5]
    with pytest.raises(ValueError, match="top_k"):
        coarsest([np.ones(3), np.ones(3)], [np.zeros(3), np.zeros(3)], 10)


def test_top_k_is_clamped_to_the_coefficients_a_short_sample_has(caplog):
    # the rule of the entropy stage, the stability replicates and the API: top_k where the sample has as
    # many basis functions, else all of them, which `coarsest` then accepts; said only where it clamps
    rng = np.random.default_rng(0)
    for shape in [(3, 4), (2, 5), (3, 4, 2), (1, 1, 7)]:
        total = int(np.prod(shape))
        for top_k in (1, total - 1, total, total + 1, 10 * total):
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="oattn"):
                k = clamped_top_k(top_k, shape, "entropy.head_top_k", "sample0.zarr")
            assert k == min(top_k, total)
            assert bool(caplog.records) == (top_k > total)
            supports = [rng.integers(1, 5, n) for n in shape]
            assert coarsest(supports, [np.zeros(n, dtype=np.int64) for n in shape], k).size == k
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="oattn"):
        assert clamped_top_k(100, (3, 4, 5), "entropy.network_top_k", "sample3.zarr") == 60
    [record] = caplog.records
    assert record.getMessage().startswith("sample3.zarr: 60 tri-Haar coefficients, fewer than entropy.network_top_k "
                                          "= 100")


def test_extreme_heads_and_jaccard():
    e = np.array([[5.0, 1.0, 3.0, 9.0, 2.0, 7.0, 4.0, 8.0, 6.0, 0.5],
                  [5.0, 1.2, 3.0, 9.0, 2.0, 7.0, 4.0, 8.0, 6.0, 0.4],
                  [5.0, 0.1, 3.0, 9.0, 2.0, 7.0, 4.0, 8.0, 6.0, 0.9]])
    res = extreme_heads(e, fraction=0.1)
    assert res["k"] == 1
    assert res["top"].tolist() == [0, 0, 0, 3, 0, 0, 0, 0, 0, 0]
    assert res["bottom"][9] == 2 and res["bottom"][1] == 1 and res["bottom"].sum() == 3
    j = jaccard_stability(e, fraction=0.2)
    np.testing.assert_allclose(np.diag(j), 1.0)
    np.testing.assert_allclose(j, j.T)
    assert j[0, 1] == 1.0 and j[0, 2] == 1.0  # bottom-2 sets {9, 1} in every batch
    with pytest.raises(ValueError, match="fraction"):
        extreme_heads(e, fraction=0)
    with pytest.raises(ValueError, match="entropies_by_batch"):
        extreme_heads(np.zeros(4))


def test_coarsest_candidate_pruning_equals_a_full_sort():
    # many ties in support and level: the pruned sort must pick exactly what a full sort picks
    rng = np.random.default_rng(5)
    for _ in range(30):
        shape = tuple(rng.integers(1, 9, size=rng.integers(1, 4)))
        sups = [rng.integers(1, 4, n) for n in shape]
        levs = [rng.integers(0, 3, n) for n in shape]
        total = int(np.prod(shape))
        sup = np.ones(shape)
        lev = np.zeros(shape, dtype=int)
        for ax, (s, lv) in enumerate(zip(sups, levs)):
            view = [1] * len(shape)
            view[ax] = -1
            sup = sup * s.reshape(view)
            lev = lev + lv.reshape(view)
        full = np.lexsort((np.arange(total), lev.ravel(), -sup.ravel()))
        for k in {1, total // 2 or 1, total}:
            assert coarsest(sups, levs, k).tolist() == full[:k].tolist()


def test_l1_norm_is_the_float64_sum_across_slabs(monkeypatch):
    import torch

    import oattn_lib.entropy as ent
    rng = np.random.default_rng(5)
    c = torch.from_numpy(rng.normal(size=(7, 5, 3)).astype(np.float32))
    ref = float(np.abs(c.numpy().astype(np.float64)).sum())
    for slab in (1, 4, 13, 105, 1 << 20):  # slab boundaries inside rows, at the end, beyond it
        monkeypatch.setattr(ent, "_SLAB", slab)
        assert ent.l1_norm(c) == pytest.approx(ref, rel=1e-12)
    assert ent.l1_norm(torch.zeros(0)) == 0.0


# -- what the decompose stage keeps of an expansion (docs/method.md §6.6) ----------------------
def test_the_kept_coarse_prefix_gives_every_smaller_top_k_entropy():
    # the entropy stage sums the first k kept coefficients: for every k <= keep that must be
    # the k coarsest, ties included (supports and levels with many ties)
    import torch

    from oattn_lib.entropy import coarse_coefficients, coarse_l1
    rng = np.random.default_rng(6)
    for _ in range(10):
        shape = (int(rng.integers(2, 9)), int(rng.integers(2, 9)))
        sups = [rng.integers(1, 4, n) for n in shape]
        levs = [rng.integers(0, 3, n) for n in shape]
        c = torch.from_numpy(rng.normal(size=(*shape, 3)).astype(np.float32))
        keep = int(rng.integers(1, shape[0] * shape[1] + 1))
        kept, idx = coarse_coefficients(c, sups, levs, keep)
        assert kept.shape == (keep, 3) and idx.tolist() == coarsest(sups, levs, keep).tolist()
        np.testing.assert_array_equal(kept.numpy(), c.reshape(-1, 3).numpy()[idx])
        for k in range(1, keep + 1):
            np.testing.assert_allclose(np.abs(kept.numpy()[:k]).sum(0, dtype=np.float64),
                                       coarse_l1(c, sups, levs, k), rtol=1e-12)
    # more than there are: all of them; no batch axis: a vector
    kept, idx = coarse_coefficients(np.arange(6.0).reshape(2, 3), [np.array([2, 1]), np.array([3, 1, 1])],
                                    [np.array([0, 1]), np.array([0, 1, 1])], 100)
    assert kept.shape == (6,) and sorted(idx.tolist()) == list(range(6))


@pytest.mark.parametrize("shape, n_axes", [((9, 7, 5), 2), ((6, 5, 4), 3), ((1, 4), 2)])
def test_level_sums_equal_a_loop_over_every_coefficient(monkeypatch, shape, n_axes):
    import torch

    import oattn_lib.entropy as ent
    rng = np.random.default_rng(7)
    c = rng.normal(size=shape).astype(np.float32)
    levels = [rng.integers(0, 4, n) * 2 for n in shape[:n_axes]]  # levels with gaps: coordinates, not indices
    uniq = [np.unique(v) for v in levels]
    want1 = np.zeros((*(u.size for u in uniq), *shape[n_axes:]))
    want2 = np.zeros_like(want1)
    for idx in np.ndindex(*shape[:n_axes]):
        at = tuple(np.searchsorted(u, v[i]) for u, v, i in zip(uniq, levels, idx))
        want1[at] += np.abs(c[idx].astype(np.float64))
        want2[at] += c[idx].astype(np.float64) ** 2
    for slab in (1, 7, 1 << 20):  # slabs of one row, across rows, all at once
        monkeypatch.setattr(ent, "_SLAB", slab)
        l1, l2, got_levels = ent.level_sums(torch.from_numpy(c), levels)
        np.testing.assert_allclose(l1.numpy(), want1, rtol=1e-12)
        np.testing.assert_allclose(l2.numpy(), want2, rtol=1e-12)
        assert [g.tolist() for g in got_levels] == [u.tolist() for u in uniq]
    # the sparsity of the whole expansion follows from the sums exactly
    dims = tuple(range(n_axes))
    np.testing.assert_allclose(ent.ratio_of_sums(l1.numpy(), l2.numpy(), dims), ent.l1_over_l2(c, dims), rtol=1e-12)
    with pytest.raises(ValueError, match=r"c: shape .* does not match the levels"):
        ent.level_sums(torch.from_numpy(c), [lv[:-1] if i == 0 else lv for i, lv in enumerate(levels)])
