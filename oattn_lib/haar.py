"""Haar bases on partition trees and the bi-/tri-Haar transforms (docs/method.md §3).

The basis of Gavish, Nadler and Coifman (2010): column 0 is the constant; each folder
with m children contributes m - 1 vectors that are constant on each child and balance
the largest child against the rest. `haar_basis` builds it densely (the reference, and
the supports and levels); the transforms never do: they sweep through the tree
(`sweep.haar_sweep`, O(n) per vector), on the device of the input, and give the
coefficients in the basis's column order.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch

from ._arrays import as_tensor, back
from .sweep import haar_sweep
from .trees import PartitionTree

__all__ = ["haar_basis", "bihaar", "inverse_bihaar", "trihaar", "trihaar_of_bihaar", "inverse_trihaar",
           "bihaar_support", "trihaar_support"]


def _check_tree(tree, name: str) -> PartitionTree:
    if not isinstance(tree, PartitionTree):
        raise ValueError(f"{name}: expected a PartitionTree, got {type(tree).__name__}")
    return tree


@lru_cache(maxsize=64)
def _basis_cached(tree: PartitionTree):
    n = tree.n
    cols = [np.full((n, 1), 1.0 / np.sqrt(n))]
    support = [np.array([n])]
    level = [np.array([0])]
    keys = [np.array([[-1, -1, -1]])]  # (level, smallest element of folder, rank)
    for lev in range(tree.n_levels - 1):
        child = tree.labels[lev + 1]
        par = tree.parents[lev + 1]
        csize = tree.folder_sizes[lev + 1]
        n_child = np.bincount(par)
        # rank of each child inside its parent: by size descending, then by its smallest item
        # (docs/method.md §3.2: a property of the tree, not of how its folders are numbered)
        srt = np.lexsort((tree.smallest_items[lev + 1], -csize, par))
        first_of_parent = np.searchsorted(par[srt], par[srt], side="left")
        rank = np.empty(par.size, dtype=np.int64)
        rank[srt] = np.arange(par.size) - first_of_parent
        # S = sizes of the children ranked after this one, in the same parent
        cum = np.empty(par.size)
        cum[srt] = np.cumsum(csize[srt]) - np.cumsum(csize[srt])[first_of_parent] + csize[srt][first_of_parent]
        parent_size = tree.folder_sizes[lev][par]
        big_s = parent_size - cum
        is_vec = rank < n_child[par] - 1
        if not is_vec.any():
            continue
        v_par, v_rank = par[is_vec], rank[is_vec]
        v_s, v_S = csize[is_vec].astype(float), big_s[is_vec].astype(float)
        norm = np.sqrt(v_s * v_S * (v_s + v_S))
        item_par = tree.labels[lev][:, None]
        item_rank = rank[child][:, None]
        same = item_par == v_par[None, :]
        vals = np.where(item_rank == v_rank[None, :], v_S[None, :],
                        np.where(item_rank > v_rank[None, :], -v_s[None, :], 0.0))
        cols.append(same * vals / norm[None, :])
        support.append(tree.folder_sizes[lev][v_par])
        level.append(np.full(v_par.size, lev))
        keys.append(np.stack([np.full(v_par.size, lev), tree.smallest_items[lev][v_par], v_rank], 1))
    k = np.concatenate(keys)
    perm = np.lexsort((k[:, 2], k[:, 1], k[:, 0]))
    basis = np.concatenate(cols, axis=1)[:, perm]
    out = (basis, np.concatenate(support)[perm], np.concatenate(level)[perm])
    for a in out:
        a.setflags(write=False)
    return out


def haar_basis(tree: PartitionTree) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Orthonormal Haar basis of R^n on `tree` (docs/method.md §3.1-§3.3).

    Columns are ordered by level, then by the folder's smallest item, then by child rank.
    The arrays are cached per tree and read-only.

    Parameters
    ----------
    tree : PartitionTree
        The tree on n items.

    Returns
    -------
    B : ndarray of shape (n, n)
        float64 with orthonormal columns, column 0 the constant.
    support : ndarray of shape (n,)
        support[j] is the size of the folder vector j lives on (n for the constant).
    level : ndarray of shape (n,)
        level[j] is the level of vector j's folder (root = 0).

    Raises
    ------
    ValueError
        If `tree` is not a `PartitionTree`.
    """
    return _basis_cached(_check_tree(tree, "tree"))


def _prepare(X, name: str, trees, ndim):
    """X as a contiguous float tensor with a head axis, checked against the trees."""
    x, was_np = as_tensor(X, name, ndim=ndim, dtype=None)
    x = (x if x.is_floating_point() else x.float()).contiguous()
    single = x.ndim == 2
    if single:
        x = x[:, :, None]
    for axis, (tree, tname) in enumerate(zip(trees, ("tree_q", "tree_k", "tree_h"))):
        _check_tree(tree, tname)
        if x.shape[axis] != tree.n:
            raise ValueError(f"{tname}: has {tree.n} items but {name} axis {axis} has length {x.shape[axis]}")
    return x, was_np, single


def _transform(x: torch.Tensor, trees, inverse: bool, out: torch.Tensor | None = None) -> torch.Tensor:
    """Haar sweep along axes 0, 1, ... with the given trees, into `out` (a new tensor if None;
    it may be x itself)."""
    for axis, tree in enumerate(trees):
        out = haar_sweep(x if axis == 0 else out, tree, axis, inverse=inverse, out=out)
    return out


def bihaar(X, tree_q: PartitionTree, tree_k: PartitionTree, overwrite: bool = False):
    """bi-Haar coefficients C_h = B_Q^T X_h B_K of every head (docs/method.md §3.5).

    Computed by fast sweeps through the trees (`sweep.haar_sweep`), O(n) per vector and
    with no memory beyond the result, on the device of X.

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head) or (n_query, n_key)
        The heads, or one head; float (an integer input is computed in float32).
    tree_q : PartitionTree
        Tree on the n_query queries.
    tree_k : PartitionTree
        Tree on the n_key keys.
    overwrite : bool, default False
        Write the coefficients over X itself, as `trihaar`'s.

    Returns
    -------
    C : ndarray or torch.Tensor of shape (n_query, n_key, n_head) or (n_query, n_key)
        Same shape, dtype and device as X, indexed by (query basis, key basis[, head]), in the
        column order of `haar_basis`.

    Raises
    ------
    ValueError
        If `tree_q` or `tree_k` is not a `PartitionTree` or its number of items differs from the
        length of its axis of X, or X does not have 2 or 3 dimensions, has an axis of length 0,
        or contains NaN or inf.
    """
    x, was_np, single = _prepare(X, "X", (tree_q, tree_k), (2, 3))
    c = _transform(x, (tree_q, tree_k), inverse=False, out=x if overwrite else None)
    return back(c[:, :, 0] if single else c, was_np)


def inverse_bihaar(C, tree_q: PartitionTree, tree_k: PartitionTree):
    """Reconstruct heads from bi-Haar coefficients: X_h = B_Q C_h B_K^T (docs/method.md §3.5).

    The inverse of `bihaar`.

    Parameters
    ----------
    C : ndarray or torch.Tensor of shape (n_query, n_key, n_head) or (n_query, n_key)
        bi-Haar coefficients, float, indexed by (query basis, key basis[, head]).
    tree_q : PartitionTree
        Tree on the n_query queries.
    tree_k : PartitionTree
        Tree on the n_key keys.

    Returns
    -------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head) or (n_query, n_key)
        The heads; same shape, dtype and device as C.

    Raises
    ------
    ValueError
        If a tree is not a `PartitionTree` or its number of items differs from the length of
        its axis of C, or C does not have 2 or 3 dimensions, has an axis of length 0, or
        contains NaN or inf.
    """
    c, was_np, single = _prepare(C, "C", (tree_q, tree_k), (2, 3))
    x = _transform(c, (tree_q, tree_k), inverse=True)
    return back(x[:, :, 0] if single else x, was_np)


def trihaar(X, tree_q: PartitionTree, tree_k: PartitionTree, tree_h: PartitionTree, overwrite: bool = False,
            out=None):
    """tri-Haar coefficients of the network: X x_1 B_Q^T x_2 B_K^T x_3 B_H^T (docs/method.md §3.5).

    Computed by Haar sweeps through the three trees (`sweep.haar_sweep`), on the device of X.

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The network tensor, float (an integer input is computed in float32).
    tree_q : PartitionTree
        Tree on the n_query queries.
    tree_k : PartitionTree
        Tree on the n_key keys.
    tree_h : PartitionTree
        Tree on the n_head heads.
    overwrite : bool, default False
        The coefficients are written over X itself where X is a contiguous float tensor or
        array (no memory beyond it: a copy is as large as X); X is lost.
    out : ndarray or torch.Tensor of shape (n_query, n_key, n_head), optional
        A contiguous tensor of X's shape, dtype and device (or a numpy array on the CPU) that
        receives the coefficients instead, and is returned: a buffer reused from call to call
        (fresh memory of this size costs more in page faults than the sweeps that fill it).

    Returns
    -------
    C : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        Same shape, dtype and device as X, indexed by (query basis, key basis, head basis);
        `out` itself where it is given.

    Raises
    ------
    ValueError
        If a tree is not a `PartitionTree` or its number of items differs from the length of
        its axis of X; if X is not 3-D, has an axis of length 0 or contains NaN or inf; if both
        `overwrite` and `out` are given; or if `out` is not a contiguous array of X's shape,
        dtype and device.
    """
    x, was_np, _ = _prepare(X, "X", (tree_q, tree_k, tree_h), 3)
    if out is not None:
        if overwrite:
            raise ValueError("trihaar: overwrite and out exclude each other")
        dest, _ = as_tensor(out, "out", ndim=3, dtype=None, finite=False)  # its contents are overwritten
        if dest.shape != x.shape or dest.dtype != x.dtype or dest.device != x.device or not dest.is_contiguous():
            raise ValueError(f"out: expected a contiguous {x.dtype} array of shape {tuple(x.shape)} on {x.device}, "
                             f"got {dest.dtype} {tuple(dest.shape)} on {dest.device}")
        _transform(x, (tree_q, tree_k, tree_h), inverse=False, out=dest)
        return out
    # x is X itself, or a contiguous float copy of it that nothing else holds
    return back(_transform(x, (tree_q, tree_k, tree_h), inverse=False, out=x if overwrite else None), was_np)


def trihaar_of_bihaar(C, tree_h: PartitionTree, overwrite: bool = False):
    """tri-Haar coefficients of the network from the bi-Haar coefficients C of its heads.

    The Haar sweep along the head axis, the last of `trihaar`'s three, so the result is
    trihaar(X, tree_q, tree_k, tree_h) bit for bit where C = bihaar(X, tree_q, tree_k)
    (docs/method.md §3.5).

    Parameters
    ----------
    C : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        bi-Haar coefficients of every head (`bihaar`), indexed by (query basis, key basis,
        head); an integer input is computed in float32.
    tree_h : PartitionTree
        Tree on the n_head heads.
    overwrite : bool, default False
        As `trihaar`'s: the coefficients are written over C itself.

    Returns
    -------
    ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The tri-Haar coefficients; same shape, dtype and device as C.

    Raises
    ------
    ValueError
        If `tree_h` is not a `PartitionTree` or its number of items differs from the length of
        C's axis 2, or C is not 3-D, has an axis of length 0 or contains NaN or inf.
    """
    c, was_np = as_tensor(C, "C", ndim=3, dtype=None)
    c = (c if c.is_floating_point() else c.float()).contiguous()
    _check_tree(tree_h, "tree_h")
    if c.shape[2] != tree_h.n:
        raise ValueError(f"tree_h: has {tree_h.n} items but C axis 2 has length {c.shape[2]}")
    return back(haar_sweep(c, tree_h, 2, inverse=False, out=c if overwrite else None), was_np)


def inverse_trihaar(C, tree_q: PartitionTree, tree_k: PartitionTree, tree_h: PartitionTree):
    """Reconstruct the network tensor from its tri-Haar coefficients C (docs/method.md §3.5).

    The inverse of `trihaar`.

    Parameters
    ----------
    C : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        tri-Haar coefficients, float, indexed by (query basis, key basis, head basis).
    tree_q : PartitionTree
        Tree on the n_query queries.
    tree_k : PartitionTree
        Tree on the n_key keys.
    tree_h : PartitionTree
        Tree on the n_head heads.

    Returns
    -------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The network tensor; same shape, dtype and device as C.

    Raises
    ------
    ValueError
        If a tree is not a `PartitionTree` or its number of items differs from the length of
        its axis of C, or C is not 3-D, has an axis of length 0 or contains NaN or inf.
    """
    c, was_np, _ = _prepare(C, "C", (tree_q, tree_k, tree_h), 3)
    return back(_transform(c, (tree_q, tree_k, tree_h), inverse=True), was_np)


def bihaar_support(tree_q: PartitionTree, tree_k: PartitionTree) -> np.ndarray:
    """Support size of each bi-Haar basis function (a, b): support_Q(a) * support_K(b).

    Parameters
    ----------
    tree_q : PartitionTree
        Tree on the n_query queries.
    tree_k : PartitionTree
        Tree on the n_key keys.

    Returns
    -------
    ndarray of shape (n_query, n_key)
        int64, indexed by (query basis, key basis) in the column order of `haar_basis`.

    Raises
    ------
    ValueError
        If a tree is not a `PartitionTree`.
    """
    return np.outer(haar_basis(tree_q)[1], haar_basis(tree_k)[1])


def trihaar_support(tree_q: PartitionTree, tree_k: PartitionTree, tree_h: PartitionTree) -> np.ndarray:
    """Support size of each tri-Haar basis function (a, b, c).

    support_Q(a) * support_K(b) * support_H(c), from the supports of `haar_basis`.

    Parameters
    ----------
    tree_q : PartitionTree
        Tree on the n_query queries.
    tree_k : PartitionTree
        Tree on the n_key keys.
    tree_h : PartitionTree
        Tree on the n_head heads.

    Returns
    -------
    ndarray of shape (n_query, n_key, n_head)
        int64, indexed by (query basis, key basis, head basis).

    Raises
    ------
    ValueError
        If a tree is not a `PartitionTree`.
    """
    return bihaar_support(tree_q, tree_k)[:, :, None] * haar_basis(tree_h)[1][None, None, :]
