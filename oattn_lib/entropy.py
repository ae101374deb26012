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

from typing import TYPE_CHECKING

import numpy as np

from ._arrays import as_tensor, is_tensor

if TYPE_CHECKING:
    import torch

__all__ = ["coarsest", "coarse_l1", "l1_norm", "l1_over_l2", "head_entropy", "network_entropy", "head_sparsity", "network_sparsity",
           "extreme_heads", "jaccard_stability", "n_extreme"]


def coarsest(supports: list[np.ndarray], levels: list[np.ndarray], top_k: int) -> np.ndarray:
    """Flat indices of the `top_k` tensor-product basis functions with the largest support.

    `supports`/`levels` hold one array per axis; the support of a product function is the
    product of the supports, its level the sum of the levels. Ties go to the coarser
    level, then to the lower flat index (docs/method.md §6.1).

    Only the first `top_k` functions of each axis (in that axis's own order) can take
    part: any other one is preceded by at least `top_k` products that differ from it on
    that axis alone. So the sort runs over at most top_k^d candidates, not the whole tensor.

    supports, levels : one int array of shape (n_a,) per axis a (from `haar.haar_basis`).
    Returns int64 (top_k,), flat indices into the (n_0, n_1, ...) tensor, coarsest first.
    """
    shape = tuple(len(s) for s in supports)
    total = int(np.prod(shape))
    if not 1 <= top_k <= total:
        raise ValueError(f"top_k: must be between 1 and the number of coefficients "
                         f"({total} for shape {shape}), got {top_k}")
    cand, sup, lev = [], np.ones(1), np.zeros(1, dtype=np.int64)
    for s, lv in zip(supports, levels):
        s, lv = np.asarray(s, dtype=float), np.asarray(lv, dtype=np.int64)
        keep = np.lexsort((np.arange(s.size), lv, -s))[:top_k]
        cand.append(keep)
        sup = (sup[:, None] * s[keep][None, :]).ravel()
        lev = (lev[:, None] + lv[keep][None, :]).ravel()
    flat = np.ravel_multi_index(np.meshgrid(*cand, indexing="ij"), shape).ravel()
    return flat[np.lexsort((flat, lev, -sup))[:top_k]]


def _bases(org, axes):
    from .haar import haar_basis

    return [haar_basis(getattr(org, f"tree_{a}")) for a in axes]


def coarse_l1(c: np.ndarray | torch.Tensor, supports: list[np.ndarray], levels: list[np.ndarray], top_k: int):
    """Sum of |c| over the `top_k` coarsest basis functions of its leading axes.

    c (numpy or torch) has one axis per entry of `supports` and optionally one trailing
    batch axis (heads); returns a float64 numpy array over the batch axis, or a 0-d array
    without one.
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

    X is (query, key, head); `org` an Organization (its query and key trees are used).
    Returns a float64 array of shape (head,).
    """
    from .haar import bihaar

    x, _ = as_tensor(X, "X", ndim=3)
    c = bihaar(x, org.tree_q, org.tree_k)
    bq, bk = _bases(org, "qk")
    return coarse_l1(c, [bq[1], bk[1]], [bq[2], bk[2]], top_k)


def network_entropy(X, org, top_k: int = 100) -> float:
    """Network l1 entropy: sum of |C| over the `top_k` coarsest tri-Haar functions (docs/method.md §6.2).

    X : float array or tensor (query, key, head); `org` an Organization. Returns a float."""
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

    c : float array or tensor of any shape; the result is float64 of c's shape without `dims`.
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
    """sum |c| in float64, a slab at a time (`c.abs().double()` would hold two more copies of c:
    3.4 GB for the tri-Haar coefficients of 270 heads at 1024 tokens); numpy or torch."""
    flat = c.reshape(-1)
    if is_tensor(c):
        import torch

        return float(sum(flat[i:i + _SLAB].abs().sum(dtype=torch.float64).item()
                         for i in range(0, flat.numel(), _SLAB)))
    return float(sum(np.abs(flat[i:i + _SLAB]).sum(dtype=np.float64) for i in range(0, flat.size, _SLAB)))


def head_sparsity(X, org) -> np.ndarray:
    """Per-head l1/l2 ratio of all bi-Haar coefficients; lower is sparser (docs/method.md §6.3).

    X : float array or tensor (query, key, head); returns float64 numpy (head,)."""
    from .haar import bihaar

    x, _ = as_tensor(X, "X", ndim=3)
    return l1_over_l2(bihaar(x, org.tree_q, org.tree_k), (0, 1)).cpu().numpy()


def network_sparsity(X, org) -> float:
    """l1/l2 ratio of all tri-Haar coefficients of the network; lower is sparser (docs/method.md §6.3).

    X : float array or tensor (query, key, head); returns a float."""
    from .haar import trihaar

    x, _ = as_tensor(X, "X", ndim=3)
    return float(l1_over_l2(trihaar(x, org.tree_q, org.tree_k, org.tree_h).reshape(-1), 0))


def n_extreme(n_heads: int, fraction: float) -> int:
    """Size of the top/bottom set: round(fraction * H), at least 1 (docs/method.md §6.4, Table 1)."""
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

    entropies_by_batch is (batch, head). Returns {"top": counts (head,), "bottom":
    counts (head,), "n_batches": B, "k": set size}.
    """
    bottom, top = _ranked_sets(entropies_by_batch, fraction)
    n_heads = np.asarray(entropies_by_batch).shape[1]
    return {"top": np.bincount(top.ravel(), minlength=n_heads),
            "bottom": np.bincount(bottom.ravel(), minlength=n_heads),
            "n_batches": bottom.shape[0], "k": bottom.shape[1]}


def jaccard_stability(entropies_by_batch, fraction: float = 0.1, which: str = "bottom") -> np.ndarray:
    """Jaccard index of the bottom (or top) `fraction` head sets between every pair of batches.

    entropies_by_batch : float array of shape (batch, head). Returns float64 (batch, batch).
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
