"""Haar "entropies" and sparsity of organized heads and networks (docs/method.md §6).

The paper's l1 entropy sums the magnitudes of the coarsest Haar coefficients (those with
the largest support). It measures coarse-scale structure, not sparsity: under random
trees coarse coefficients shrink. Sparsity proper is reported beside it as the l1/l2
ratio of all coefficients (the l2 norm is the same in every orthonormal basis).

The sums over stored coefficients (`coarse_l1`, `l1_over_l2`, `l1_norm`) take numpy arrays
or torch tensors and compute in the library they were given, so the entropy stage, which
only reads coefficients, runs without importing torch; the expansions themselves
(`head_entropy` and the like) are torch's, from `haar`.
"""
from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import numpy as np

from ._arrays import as_tensor, is_tensor

if TYPE_CHECKING:
    import torch

log = logging.getLogger("oattn")

__all__ = ["coarsest", "clamped_top_k", "coarse_l1", "coarse_coefficients", "level_sums", "ratio_of_sums", "l1_norm", "l1_over_l2", "head_entropy", "network_entropy", "head_sparsity", "network_sparsity",
           "extreme_heads", "jaccard_stability", "n_extreme"]


def coarsest(supports: list[np.ndarray], levels: list[np.ndarray], top_k: int) -> np.ndarray:
    """Flat indices of the `top_k` tensor-product basis functions with the largest support.

    `supports`/`levels` hold one array per axis; the support of a product function is the
    product of the supports, its level the sum of the levels. Ties go to the coarser
    level, then to the lower flat index (docs/method.md §6.1).

    Candidates are pruned before the sort: a function whose position in each axis's own order
    is r_a is preceded by at least prod(r_a + 1) - 1 others (every combination of functions
    at or before it on each axis), so only positions with prod(r_a + 1) <= top_k can take part:
    about top_k (ln top_k)^(d-1) / (d-1)! candidates, not the whole tensor (nor top_k^d, which
    for the network's 4096 coarsest functions at 1024 tokens x 270 heads was every one of its
    283 million).

    Parameters
    ----------
    supports : list of ndarray of int, each of shape (n_a,)
        One array per axis a: the support of each of that axis's Haar functions (from
        `haar.haar_basis`).
    levels : list of ndarray of int, each of shape (n_a,)
        One array per axis a: the level of each of that axis's Haar functions (from
        `haar.haar_basis`).
    top_k : int
        The number of basis functions to keep, between 1 and n_0 * n_1 * ...

    Returns
    -------
    ndarray of int64, shape (top_k,)
        Flat indices into the (n_0, n_1, ...) tensor, coarsest first.

    Raises
    ------
    ValueError
        Naming top_k when it is not between 1 and the number of coefficients.
    """
    shape = tuple(len(s) for s in supports)
    total = int(np.prod(shape))
    if not 1 <= top_k <= total:
        raise ValueError(f"top_k: must be between 1 and the number of coefficients "
                         f"({total} for shape {shape}), got {top_k}")
    bound = np.ones(1, dtype=np.int64)
    items, sup, lev = [], np.ones(1), np.zeros(1, dtype=np.int64)
    for s, lv in zip(supports, levels):
        s, lv = np.asarray(s, dtype=float), np.asarray(lv, dtype=np.int64)
        order = np.lexsort((np.arange(s.size), lv, -s))[:top_k]
        # each candidate so far extends by the positions r with bound * (r + 1) <= top_k
        m = np.minimum(order.size, top_k // bound)
        parent = np.repeat(np.arange(bound.size), m)
        r = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
        items = [it[parent] for it in items] + [order[r]]
        sup, lev, bound = sup[parent] * s[order[r]], lev[parent] + lv[order[r]], bound[parent] * (r + 1)
    flat = np.ravel_multi_index(items, shape)
    return flat[np.lexsort((flat, lev, -sup))[:top_k]]


def clamped_top_k(top_k: int, shape, key: str, where: str = "") -> int:
    """The number of coarsest coefficients an entropy sums: `top_k`, or all of a sample that has fewer.

    A sample of its own length (the user's texts, docs/method.md §9.4.1) may have fewer basis
    functions than the configured top_k (docs/method.md §6.2); its entropy then sums every
    coefficient, and a warning naming the sample and `key` says so. The entropy stage, the
    stability replicates and the Python API clamp by this one rule.

    Parameters
    ----------
    top_k : int
        The number asked for (`entropy.head_top_k` or `entropy.network_top_k`).
    shape : sequence of int
        The number of basis functions along each axis of the expansion: (n_query, n_key) for
        a head's bi-Haar expansion, (n_query, n_key, n_unit) for the network's tri-Haar one.
    key : str
        The setting's name, for the warning.
    where : str
        The sample (its store's path), for the warning; "" for none.

    Returns
    -------
    int
        min(top_k, prod(shape)).
    """
    total = math.prod(int(n) for n in shape)
    if top_k <= total:
        return top_k
    what = {2: "bi-Haar", 3: "tri-Haar"}.get(len(shape), "Haar")
    log.warning("%s%d %s coefficients, fewer than %s = %d: its entropy sums all of them (a short sample; "
                "the k of each sample is recorded)", f"{where}: " if where else "", total, what, key, top_k)
    return total


def coarse_coefficients(c, supports: list[np.ndarray], levels: list[np.ndarray], keep: int):
    """The coefficients of the `keep` coarsest basis functions of c's leading axes, and their flat indices.

    Coarsest first (docs/method.md §6.6): what the entropies read. `coarsest` ranks the
    functions in one total order, so the first k of these are the k coarsest for every
    k <= keep: `coarse_l1(c, ..., k)` equals the sum of |first k rows|.

    Parameters
    ----------
    c : ndarray or torch.Tensor of shape (n_0, n_1, ...) or (n_0, n_1, ..., n_batch)
        Coefficients with one axis per entry of `supports` and optionally a trailing batch axis.
    supports : list of ndarray of int, each of shape (n_a,)
        The support of each Haar function of axis a (from `haar.haar_basis`).
    levels : list of ndarray of int, each of shape (n_a,)
        The level of each Haar function of axis a (from `haar.haar_basis`).
    keep : int
        The number of coarsest functions to keep; larger than the number of functions keeps
        them all.

    Returns
    -------
    coefficients : ndarray or torch.Tensor of shape (kept,) or (kept, n_batch)
        The kept coefficients, coarsest first, in c's library and on its device.
    indices : ndarray of int64, shape (kept,)
        Their flat indices into the (n_0, n_1, ...) tensor.

    Raises
    ------
    ValueError
        Naming top_k (from `coarsest`) when `keep` is less than 1.
    """
    n_basis = int(np.prod([len(s) for s in supports]))
    idx = coarsest(supports, levels, min(keep, n_basis))
    flat = c.reshape(n_basis, -1)
    if is_tensor(c):
        import torch

        kept = flat[torch.as_tensor(idx, device=c.device)]
    else:
        kept = flat[idx]
    return (kept if c.ndim > len(supports) else kept[:, 0]), idx


def level_sums(c, levels: list[np.ndarray]):
    """Sums of |c| and of c^2 over the coefficients of each combination of levels, in float64.

    The energy of each scale (docs/method.md §6.6), from which the l1/l2 sparsity of the
    whole expansion follows exactly (`ratio_of_sums`). Taken a slab of c's first axis at a
    time (no float64 copy of all of c), by index sums: no loop over levels or heads.

    Parameters
    ----------
    c : torch.Tensor or ndarray of shape (n_0, n_1, ...) or (n_0, n_1, ..., n_batch)
        Coefficients with one leading axis per entry of `levels` and optionally one trailing
        batch axis (heads).
    levels : list of ndarray of int, each of shape (n_a,)
        The Haar levels of each leading axis a of c (`haar.haar_basis`).

    Returns
    -------
    l1 : torch.Tensor of float64, shape (n_levels_0, n_levels_1, ...) or (n_levels_0, n_levels_1, ..., n_batch)
        Sum of |c| per combination of levels (and per batch entry), on c's device.
    l2sq : torch.Tensor of float64, same shape as `l1`
        Sum of c^2 per combination of levels (and per batch entry), on c's device.
    level_values : list of ndarray, each of shape (n_levels_a,)
        The distinct levels of each axis, in increasing order: the coordinates of the level
        axes of `l1` and `l2sq`.

    Raises
    ------
    ValueError
        Naming c when its shape does not match the levels' lengths (plus at most one batch
        axis), or when it has an axis of length 0.
    """
    import torch

    x, _ = as_tensor(c, "c", dtype=None, finite=False)
    d = len(levels)
    if x.ndim not in (d, d + 1) or any(x.shape[a] != len(levels[a]) for a in range(d)):
        raise ValueError(f"c: shape {tuple(x.shape)} does not match the levels' lengths "
                         f"{[len(v) for v in levels]} (plus at most one batch axis)")
    uniq = [np.unique(np.asarray(v)) for v in levels]
    inv = [np.searchsorted(u, np.asarray(v)) for u, v in zip(uniq, levels)]
    n_lev = [u.size for u in uniq]
    inner_n = int(np.prod(n_lev[1:], dtype=np.int64))
    inner = torch.as_tensor(np.ravel_multi_index(np.meshgrid(*inv[1:], indexing="ij"), n_lev[1:]).ravel()
                            if d > 1 else np.zeros(1, dtype=np.int64), device=x.device)
    batch = tuple(x.shape[d:])
    first = torch.as_tensor(inv[0], device=x.device)
    l1 = torch.zeros((n_lev[0], inner_n, *batch), dtype=torch.float64, device=x.device)
    l2 = torch.zeros_like(l1)
    per = int(np.prod(x.shape[1:], dtype=np.int64))
    step = max(1, _SLAB // max(1, per))
    for i in range(0, x.shape[0], step):
        part = x[i:i + step].reshape(-1, inner.numel(), *batch).double()
        rows = first[i:i + step]
        for out, v in ((l1, part.abs()), (l2, part * part)):
            slab = torch.zeros((part.shape[0], inner_n, *batch), dtype=torch.float64, device=x.device)
            out.index_add_(0, rows, slab.index_add_(1, inner, v))
    shape = (*n_lev, *batch)
    return l1.reshape(shape), l2.reshape(shape), uniq


def ratio_of_sums(l1, l2sq, dims):
    """l1 / sqrt(l2sq) of sums over `dims`: the l1/l2 sparsity from `level_sums`.

    An all-zero expansion has ratio 0, as in `l1_over_l2`.

    Parameters
    ----------
    l1 : ndarray of shape (n_levels_0, n_levels_1, ...) or (n_levels_0, n_levels_1, ..., n_batch)
        Sums of |c| (the first output of `level_sums`, as numpy).
    l2sq : ndarray, same shape as `l1`
        Sums of c^2 (the second output of `level_sums`, as numpy).
    dims : int or tuple of int
        The axes summed over.

    Returns
    -------
    ndarray
        The ratio, of the shape of `l1` without `dims`; 0 where the sum of `l2sq` is 0.
    """
    a, b = np.sum(l1, axis=dims), np.sqrt(np.sum(l2sq, axis=dims))
    return np.where(b > 0, a / np.where(b > 0, b, 1.0), 0.0)


def _bases(org, axes):
    from .haar import haar_basis

    return [haar_basis(getattr(org, f"tree_{a}")) for a in axes]


def coarse_l1(c: np.ndarray | torch.Tensor, supports: list[np.ndarray], levels: list[np.ndarray], top_k: int):
    """Sum of |c| over the `top_k` coarsest basis functions of its leading axes.

    Parameters
    ----------
    c : ndarray or torch.Tensor of shape (n_0, n_1, ...) or (n_0, n_1, ..., n_batch)
        Coefficients with one axis per entry of `supports` and optionally one trailing batch
        axis (heads).
    supports : list of ndarray of int, each of shape (n_a,)
        The support of each Haar function of axis a (from `haar.haar_basis`).
    levels : list of ndarray of int, each of shape (n_a,)
        The level of each Haar function of axis a (from `haar.haar_basis`).
    top_k : int
        The number of coarsest basis functions summed over (see `coarsest`).

    Returns
    -------
    ndarray of float64, shape (n_batch,) or ()
        The sum over the batch axis, or a 0-d array without one; numpy whatever c is.

    Raises
    ------
    ValueError
        Naming top_k when it is not between 1 and n_0 * n_1 * ...
    """
    idx = coarsest(supports, levels, top_k)
    n_basis = int(np.prod([len(s) for s in supports]))
    flat = c.reshape(n_basis, -1)
    if is_tensor(c):
        import torch

        out = flat[torch.as_tensor(idx, device=c.device)].abs().double().sum(0).cpu().numpy()
    else:
        out = np.abs(flat[idx]).sum(0, dtype=np.float64)
    return out if c.ndim > len(supports) else out[0]


def head_entropy(X, org, top_k: int = 400) -> np.ndarray:
    """Per-head l1 entropy: sum of |C_h| over the `top_k` coarsest bi-Haar functions (docs/method.md §6.2).

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The heads, in (query, key, head) order; computed in float32 on X's device.
    org : Organization
        The organization of X; its query and key trees (`tree_q`, `tree_k`) are used.
    top_k : int, default 400
        The number of coarsest bi-Haar functions summed over, between 1 and n_query * n_key.

    Returns
    -------
    ndarray of float64, shape (n_head,)
        The l1 entropy of each head.

    Raises
    ------
    ValueError
        Naming X when it is not 3-D, has an axis of length 0 or NaN/inf entries; naming
        tree_q or tree_k when its number of items does not match X's axis; naming top_k when
        it is out of range.
    """
    from .haar import bihaar

    x, _ = as_tensor(X, "X", ndim=3)
    c = bihaar(x, org.tree_q, org.tree_k)
    bq, bk = _bases(org, "qk")
    return coarse_l1(c, [bq[1], bk[1]], [bq[2], bk[2]], top_k)


def network_entropy(X, org, top_k: int = 100) -> float:
    """Network l1 entropy: sum of |C| over the `top_k` coarsest tri-Haar functions (docs/method.md §6.2).

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The heads, in (query, key, head) order; computed in float32 on X's device.
    org : Organization
        The organization of X; its three trees (`tree_q`, `tree_k`, `tree_h`) are used.
    top_k : int, default 100
        The number of coarsest tri-Haar functions summed over, between 1 and
        n_query * n_key * n_head.

    Returns
    -------
    float
        The l1 entropy of the network.

    Raises
    ------
    ValueError
        Naming X when it is not 3-D, has an axis of length 0 or NaN/inf entries; naming
        tree_q, tree_k or tree_h when its number of items does not match X's axis; naming
        top_k when it is out of range.
    """
    from .haar import trihaar

    x, _ = as_tensor(X, "X", ndim=3)
    c = trihaar(x, org.tree_q, org.tree_k, org.tree_h)
    bases = _bases(org, "qkh")
    return float(coarse_l1(c, [b[1] for b in bases], [b[2] for b in bases], top_k))


def l1_over_l2(c: np.ndarray | torch.Tensor, dims):
    """l1 norm over l2 norm of `c` along `dims` (the sparsity of docs/method.md §6.3; lower is sparser).

    numpy in, numpy out; torch in, torch out (on c's device). Sums are float64, taken a
    slab of `c` at a time in two reused float64 buffers (no float64 copy of all of c, and
    no fresh temporaries: freed ones were not reused here, and the peak grew by the float64
    size of c).

    Parameters
    ----------
    c : ndarray or torch.Tensor of any shape
        Float coefficients.
    dims : int or tuple of int
        The axes the norms are taken along (negative ones count from the end).

    Returns
    -------
    ndarray or torch.Tensor of float64
        The ratio, of c's shape without `dims`; 0 where a slice is all zero (its l2 norm is 0).
    """
    dims = tuple(d % max(c.ndim, 1) for d in ((dims,) if isinstance(dims, int) else dims))
    if c.ndim == 0:
        c = c.reshape(1)
    per = int(np.prod(c.shape[1:]))  # elements of one slice c[i]
    step = max(1, _SLAB // max(1, per))
    size = min(c.shape[0], step) * per
    if is_tensor(c):
        import torch

        xp, buf = torch, torch.empty(2 * size, dtype=torch.float64, device=c.device)
    else:
        xp, buf = np, np.empty(2 * size, dtype=np.float64)
    l1s, l2s = [], []
    for i in range(0, c.shape[0], step):
        part = c[i:i + step]
        n = int(np.prod(part.shape))
        x, t = buf[:n].reshape(part.shape), buf[size:size + n].reshape(part.shape)
        x[...] = part
        l1s.append(xp.abs(x, out=t).sum(dims))
        l2s.append(xp.multiply(x, x, out=t).sum(dims))
    if 0 in dims:  # slabs along a reduced axis: add up
        l1, l2 = xp.stack(l1s).sum(0), xp.sqrt(xp.stack(l2s).sum(0))
    else:
        l1, l2 = xp.concatenate(l1s), xp.sqrt(xp.concatenate(l2s))
    # an all-zero slice is as sparse as can be: ratio 0, not 0/0
    return xp.where(l2 > 0, l1 / xp.where(l2 > 0, l2, xp.ones_like(l2)), xp.zeros_like(l1))


# Elements of one float64 slab in `l1_over_l2`.
_SLAB = 1 << 20


def l1_norm(c: np.ndarray | torch.Tensor) -> float:
    """sum |c| in float64, a slab at a time.

    `c.abs().double()` would hold two more copies of c, the second twice its size.

    Parameters
    ----------
    c : ndarray or torch.Tensor of any shape
        The coefficients.

    Returns
    -------
    float
        The sum of the absolute values of all entries of c.
    """
    flat = c.reshape(-1)
    if is_tensor(c):
        import torch

        return float(sum(flat[i:i + _SLAB].abs().sum(dtype=torch.float64).item()
                         for i in range(0, flat.numel(), _SLAB)))
    return float(sum(np.abs(flat[i:i + _SLAB]).sum(dtype=np.float64) for i in range(0, flat.size, _SLAB)))


def head_sparsity(X, org) -> np.ndarray:
    """Per-head l1/l2 ratio of all bi-Haar coefficients; lower is sparser (docs/method.md §6.3).

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The heads, in (query, key, head) order; computed in float32 on X's device.
    org : Organization
        The organization of X; its query and key trees (`tree_q`, `tree_k`) are used.

    Returns
    -------
    ndarray of float64, shape (n_head,)
        The l1/l2 ratio of each head's bi-Haar coefficients, as numpy.

    Raises
    ------
    ValueError
        Naming X when it is not 3-D, has an axis of length 0 or NaN/inf entries; naming
        tree_q or tree_k when its number of items does not match X's axis.
    """
    from .haar import bihaar

    x, _ = as_tensor(X, "X", ndim=3)
    return l1_over_l2(bihaar(x, org.tree_q, org.tree_k), (0, 1)).cpu().numpy()


def network_sparsity(X, org) -> float:
    """l1/l2 ratio of all tri-Haar coefficients of the network; lower is sparser (docs/method.md §6.3).

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The heads, in (query, key, head) order; computed in float32 on X's device.
    org : Organization
        The organization of X; its three trees (`tree_q`, `tree_k`, `tree_h`) are used.

    Returns
    -------
    float
        The l1/l2 ratio of all the tri-Haar coefficients.

    Raises
    ------
    ValueError
        Naming X when it is not 3-D, has an axis of length 0 or NaN/inf entries; naming
        tree_q, tree_k or tree_h when its number of items does not match X's axis.
    """
    from .haar import trihaar

    x, _ = as_tensor(X, "X", ndim=3)
    return float(l1_over_l2(trihaar(x, org.tree_q, org.tree_k, org.tree_h).reshape(-1), 0))


def n_extreme(n_heads: int, fraction: float) -> int:
    """Size of the top/bottom set: round(fraction * H), at least 1 (docs/method.md §6.4, Table 1).

    Parameters
    ----------
    n_heads : int
        H, the number of heads.
    fraction : float
        The fraction of the heads in the set, in (0, 1].

    Returns
    -------
    int
        The size of the set.

    Raises
    ------
    ValueError
        Naming fraction when it is not in (0, 1].
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction: must be in (0, 1], got {fraction}")
    return max(1, int(round(fraction * n_heads)))


def _ranked_sets(entropies_by_batch, fraction: float):
    e = np.asarray(entropies_by_batch, dtype=float)
    if e.ndim != 2 or e.shape[0] == 0 or e.shape[1] == 0:
        raise ValueError(f"entropies_by_batch: expected a non-empty (batch, head) array, got shape {e.shape}")
    if not np.isfinite(e).all():
        raise ValueError("entropies_by_batch: contains NaN or inf")
    k = n_extreme(e.shape[1], fraction)
    # stable order: equal entropies rank by head index
    bottom = np.argsort(e, axis=1, kind="stable")[:, :k]
    top = np.argsort(-e, axis=1, kind="stable")[:, :k]
    return bottom, top


def extreme_heads(entropies_by_batch, fraction: float = 0.1) -> dict[str, np.ndarray]:
    """How often each head is in the top and bottom `fraction` across batches (Table 1).

    In each batch the heads are ranked by entropy; equal entropies rank by head index. The
    set size is `n_extreme(n_head, fraction)`.

    Parameters
    ----------
    entropies_by_batch : array_like of float, shape (n_batch, n_head)
        The entropy of each head in each batch.
    fraction : float, default 0.1
        The fraction of the heads in the top and the bottom set, in (0, 1].

    Returns
    -------
    dict
        ``{"top": counts, "bottom": counts, "n_batches": B, "k": k}``: "top" and "bottom" are
        int ndarrays of shape (n_head,), the number of batches in which each head is among the k
        highest (lowest) entropies; "n_batches" (int) is the number of batches B and "k" (int)
        the set size.

    Raises
    ------
    ValueError
        Naming entropies_by_batch when it is not a non-empty 2-D array or contains NaN or inf;
        naming fraction when it is not in (0, 1].
    """
    bottom, top = _ranked_sets(entropies_by_batch, fraction)
    n_heads = np.asarray(entropies_by_batch).shape[1]
    return {"top": np.bincount(top.ravel(), minlength=n_heads),
            "bottom": np.bincount(bottom.ravel(), minlength=n_heads),
            "n_batches": bottom.shape[0], "k": bottom.shape[1]}


def jaccard_stability(entropies_by_batch, fraction: float = 0.1, which: str = "bottom") -> np.ndarray:
    """Jaccard index of the bottom (or top) `fraction` head sets between every pair of batches.

    In each batch the heads are ranked by entropy; equal entropies rank by head index. The
    set size is `n_extreme(n_head, fraction)`.

    Parameters
    ----------
    entropies_by_batch : array_like of float, shape (n_batch, n_head)
        The entropy of each head in each batch.
    fraction : float, default 0.1
        The fraction of the heads in each set, in (0, 1].
    which : {"bottom", "top"}, default "bottom"
        Which set is compared: the lowest or the highest entropies.

    Returns
    -------
    ndarray of float64, shape (n_batch, n_batch)
        The Jaccard index of the sets of every pair of batches.

    Raises
    ------
    ValueError
        Naming which when it is neither "bottom" nor "top"; naming entropies_by_batch when it is
        not a non-empty 2-D array or contains NaN or inf; naming fraction when it is not in (0, 1].
    """
    if which not in ("bottom", "top"):
        raise ValueError(f"which: must be 'bottom' or 'top', got {which!r}")
    bottom, top = _ranked_sets(entropies_by_batch, fraction)
    sets = bottom if which == "bottom" else top
    n_heads = np.asarray(entropies_by_batch).shape[1]
    member = np.zeros((sets.shape[0], n_heads), dtype=np.int64)
    np.put_along_axis(member, sets, 1, axis=1)
    inter = member @ member.T
    size = member.sum(1)
    return inter / (size[:, None] + size[None, :] - inter)
