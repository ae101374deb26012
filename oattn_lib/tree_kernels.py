"""The compiled parts of the flexible tree (docs/method.md §2.2).

The connected components of its normalised affinity (`graph_components`, step 2: the
eigenpairs are computed per component), one O(n^2) pass where scipy's needed a sparse copy
of a dense matrix. Each level of `trees.flexible_tree` needs the mean, over the leaves of
every pair of current nodes, of the Euclidean distances between the leaves' diffusion
coordinates. Computed as scipy's `pdist`, its square form and a sparse membership product,
that was three passes over an n x n float64 matrix per level, most of a level's time. Here one
pass over the coordinates gives the node sums, with the same additions in the same order
(`node_mean_distances`), so the trees are the same to the bit. A module of its own so that
`trees`, which the reading stages import, does not import numba.
"""
from __future__ import annotations

import numba
import numpy as np

__all__ = ["graph_components", "node_mean_distances", "node_means"]


@numba.njit(cache=True)
def _components(p):  # pragma: no cover - compiled
    """Component labels (numbered by their first item) of the graph of p's nonzero entries, p
    symmetric: a depth-first search over the rows."""
    n = p.shape[0]
    label = np.full(n, -1, np.int64)
    stack = np.empty(n, np.int64)
    c = 0
    for s in range(n):
        if label[s] >= 0:
            continue
        label[s] = c
        stack[0] = s
        top = 1
        while top:
            top -= 1
            i = stack[top]
            for j in range(n):
                if label[j] < 0 and p[i, j] != 0:
                    label[j] = c
                    stack[top] = j
                    top += 1
        c += 1
    return c, label


def graph_components(p: np.ndarray) -> tuple[int, np.ndarray]:
    """The connected components of the undirected graph of the nonzero entries of `p`.

    Components are numbered in the order of their first item (docs/method.md §2.2).

    Parameters
    ----------
    p : ndarray of shape (n, n)
        Symmetric; an edge joins items i and j where p[i, j] is not zero.

    Returns
    -------
    n_components : int
        The number of components.
    component : ndarray of shape (n,)
        int64, the component of each item.
    """
    return _components(np.ascontiguousarray(p, dtype=np.float64))


@numba.njit(inline="always")
def _segment_sums(col, members, starts, out):  # pragma: no cover - compiled
    """out[b] = the sum of col over node b's leaves, in ascending order from 0."""
    for b in range(len(starts) - 1):
        s = 0.0
        for t in range(starts[b], starts[b + 1]):
            s += col[members[t]]
        out[b] = s


@numba.njit(parallel=True, cache=True)
def _node_distance_sums(xt, members, starts):  # pragma: no cover - compiled
    """sums[b, a] = sum over leaves j of node b (ascending) of (sum over leaves i of node a
    (ascending) of |x_i - x_j|), each distance the square root of its coordinates' squared
    differences added in coordinate order; xt is (coordinates, leaves)."""
    d, n = xt.shape
    m = len(starts) - 1
    out = np.empty((m, m))
    for a in numba.prange(m):
        col = np.zeros(n)
        acc = np.empty(n)
        for t in range(starts[a], starts[a + 1]):
            i = members[t]
            acc[:] = 0.0
            for k in range(d):
                v = xt[k, i]
                for j in range(n):
                    u = v - xt[k, j]
                    acc[j] += u * u
            for j in range(n):
                col[j] += np.sqrt(acc[j])
        _segment_sums(col, members, starts, out[:, a])
    return out


def node_mean_distances(x: np.ndarray, node_of_leaf: np.ndarray) -> np.ndarray:
    """Mean Euclidean distance between the leaves of every pair of nodes (docs/method.md §2.2).

    Bit for bit `trees._node_means(squareform(pdist(x)), node_of_leaf)` (tests/test_trees.py):
    the distances' squared differences are added in coordinate order, as pdist adds them, and
    the sums over leaves in the sparse product's order (over node a's leaves first, each in
    ascending order); without the n x n matrix.

    Parameters
    ----------
    x : ndarray of shape (n, d)
        The coordinates of the n leaves.
    node_of_leaf : ndarray of shape (n,)
        int, the node of each leaf; nodes 0..m-1, every one with a leaf.

    Returns
    -------
    ndarray of shape (m, m)
        float64; entry [b, a] the mean, over the leaves i of node a and j of node b, of the
        Euclidean distance between rows x_i and x_j.
    """
    members, starts, c = _grouped(node_of_leaf)
    sums = _node_distance_sums(np.ascontiguousarray(np.asarray(x, dtype=np.float64).T), members, starts)
    return sums / c[:, None] / c[None, :]


def _grouped(node_of_leaf: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The leaves grouped by node, each node's in ascending order; where each node's start; the
    number of leaves of each node (float64)."""
    node_of_leaf = np.asarray(node_of_leaf, dtype=np.int64)
    counts = np.bincount(node_of_leaf)
    members = np.argsort(node_of_leaf, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return members, starts, counts.astype(np.float64)


@numba.njit(parallel=True, cache=True)
def _node_sums(d, members, starts):  # pragma: no cover - compiled
    """sums[b, a] = sum over leaves j of node b (ascending) of (sum over leaves i of node a
    (ascending) of d[i, j])."""
    n = d.shape[0]
    m = len(starts) - 1
    out = np.empty((m, m))
    for a in numba.prange(m):
        col = np.zeros(n)
        for t in range(starts[a], starts[a + 1]):
            i = members[t]
            for j in range(n):
                col[j] += d[i, j]
        _segment_sums(col, members, starts, out[:, a])
    return out


def node_means(d: np.ndarray, node_of_leaf: np.ndarray) -> np.ndarray:
    """Mean of `d` over the leaves of every pair of nodes, in one pass over d.

    Bit for bit `trees._node_means(d, node_of_leaf)` (the same additions in the sparse
    product's order); d transposed (+ 0.0, as the product adds it to 0) where every leaf is
    its own node, in order (a tree's first level).

    Parameters
    ----------
    d : ndarray of shape (n, n)
        Values between the n leaves.
    node_of_leaf : ndarray of shape (n,)
        int, the node of each leaf; nodes 0..m-1, every one with a leaf.

    Returns
    -------
    ndarray of shape (m, m)
        float64; entry [b, a] the mean of d[i, j] over the leaves i of node a and j of node b.
    """
    node_of_leaf = np.asarray(node_of_leaf)
    if np.array_equal(node_of_leaf, np.arange(len(node_of_leaf))):
        return np.ascontiguousarray(np.asarray(d, dtype=np.float64).T) + 0.0
    members, starts, c = _grouped(node_of_leaf)
    return _node_sums(np.ascontiguousarray(d, dtype=np.float64), members, starts) / c[:, None] / c[None, :]
