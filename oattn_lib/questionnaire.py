"""The questionnaire: co-organizing the axes of attention tensors (docs/method.md §5).

Each axis gets a partition tree built from an affinity between its slices; the affinity
of one axis is the tree-EMD over the product of the other axes' trees, so every tree
refines the others' geometry in turn.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch

from ._arrays import as_tensor
from .emd import TreeEMD, emd_affinity
from .kernel_notice import announces_kernels
from .trees import Organization, PartitionTree, flexible_tree

__all__ = ["Organization", "questionnaire3d", "questionnaire2d", "cosine_affinity"]

log = logging.getLogger(__name__)


def cosine_affinity(slices: torch.Tensor) -> np.ndarray:
    """Cosine similarity between flattened slices (rows of a 2-D tensor), negatives set to 0.

    The diagonal is 1 even for an all-zero slice, which has no direction (docs/method.md §5.1).
    Computed from the slices' Gram matrix in float64, on the tensor's device.

    Parameters
    ----------
    slices : torch.Tensor of shape (n, d)
        The n slices, one per row, float.

    Returns
    -------
    ndarray of shape (n, n)
        float64 numpy, symmetric.
    """
    return _cosine(slices, 0)


def _cosine(x: torch.Tensor, axis: int) -> np.ndarray:
    """Cosine affinity between the slices of x along `axis`, from their float64 Gram matrix."""
    g = _gram(x, axis)
    norm = np.sqrt(np.diag(g))
    norm = np.where(norm > 0, norm, 1.0)
    a = np.clip(g / norm[:, None] / norm[None, :], 0.0, None)
    np.fill_diagonal(a, 1.0)
    return (a + a.T) / 2


# Elements of one float64 piece of the slices in `_gram`.
_GRAM_PIECE = 1 << 22


def _gram(x: torch.Tensor, axis: int) -> np.ndarray:
    """Gram matrix <X_i, X_j> of the slices of x along `axis`, in float64, as numpy.

    Built a piece of the flattened slices at a time (float64 copies of ~32 MB, never of
    all of x), and of each piece's product only the upper triangle of row blocks: the
    Gram matrix is symmetric, so that is about 5/8 of a full product's work. Of each piece
    only the rows from its first nonzero one to its last take part: the others add exact
    zeros. Causal attention's pieces are zero on one side of the diagonal (a query's slice
    is zero past its position, a key's before it), so its Gram matrix costs about a third
    (docs/method.md §5.1).
    """
    n = x.shape[axis]
    g = torch.zeros((n, n), dtype=torch.float64, device=x.device)
    rest = x.numel() // n
    if axis == 0:
        flat = x.reshape(n, rest)
        width = max(1, _GRAM_PIECE // n)
        pieces = (flat[:, j:j + width] for j in range(0, rest, width))
    else:
        per = x[0].numel() // n  # elements of one slice within x[i]
        step = max(1, _GRAM_PIECE // max(1, n * per))
        pieces = (x[i:i + step].movedim(axis, 0).reshape(n, -1) for i in range(0, x.shape[0], step))
    buf = None
    for piece in pieces:
        nonzero = torch.nonzero(piece.ne(0).any(dim=1)).reshape(-1)
        if nonzero.numel() == 0:
            continue
        if buf is None:  # one float64 buffer for every piece (fresh ones were not reused)
            buf = torch.empty(piece.numel(), dtype=torch.float64, device=x.device)
        r0, r1 = int(nonzero[0]), int(nonzero[-1]) + 1
        piece = piece[r0:r1]
        p = buf[:piece.numel()].view(piece.shape).copy_(piece)
        blocks = r0 + np.linspace(0, r1 - r0, min(4, r1 - r0) + 1).astype(int)
        for b0, b1 in zip(blocks[:-1], blocks[1:]):
            g[b0:b1, b0:r1] += p[b0 - r0:b1 - r0] @ p[b0 - r0:].T
    g = torch.triu(g)
    return (g + g.T - torch.diag(torch.diag(g))).cpu().numpy()


def _per_axis(value, name: str) -> tuple[float, float, float]:
    if np.ndim(value) == 0:
        return (float(value),) * 3
    v = tuple(float(x) for x in value)
    if len(v) != 3:
        raise ValueError(f"{name}: expected a number or 3 values (query, key, head), got {value!r}")
    return v


@announces_kernels
def questionnaire3d(X, n_iters: int = 3, alpha=0.0, beta=1.0, constant: float = 1.0,
                    head_uses_initial_trees: bool = False, seed: int = 0, eps: float = 1.0,
                    n_eigs: int = 12) -> Organization:
    """Organize a network tensor X (query, key, head) by the 3-D questionnaire (docs/method.md §5.2).

    Initial query and key trees come from cosine affinities of the flattened slices;
    each iteration then rebuilds the head, query and key trees in turn from tree-EMD
    affinities over the newest trees of the other two axes. Runs on the device of X.

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The network tensor, float (computed in float32).
    n_iters : int, default 3
        Number of iterations (head, query and key tree each), at least 1.
    alpha, beta : float or sequence of 3 floats, default 0.0 and 1.0
        The EMD folder-weight exponents (a number, or one per axis in (query, key, head) order).
    constant : float, default 1.0
        The constant of the trees' greedy merges (`trees.flexible_tree`), positive.
    head_uses_initial_trees : bool, default False
        True reproduces the authors' code, whose head step always used the initial query and
        key trees.
    seed : int, default 0
        Passed to `trees.flexible_tree`, whose construction is deterministic (it uses no
        randomness).
    eps : float, default 1.0
        Scale of the Gaussian affinity of the EMD (`emd.emd_affinity`), positive.
    n_eigs : int, default 12
        Number of diffusion eigenpairs `trees.flexible_tree` computes.

    Returns
    -------
    Organization
        The query, key and head trees and their float64 affinities.

    Raises
    ------
    ValueError
        If X is not a 3-D numeric array, has an axis of length 0 or contains NaN or inf; if
        `n_iters` < 1, `eps` <= 0 or `constant` <= 0; or if `alpha` or `beta` is neither a
        number nor 3 values.
    """
    x, _ = as_tensor(X, "X", ndim=3)
    if n_iters < 1:
        raise ValueError(f"n_iters: must be >= 1, got {n_iters}")
    if eps <= 0:
        raise ValueError(f"eps: must be positive, got {eps}")
    aq, ak, ah = _per_axis(alpha, "alpha")
    bq, bk, bh = _per_axis(beta, "beta")
    nq, nk, nh = x.shape

    def tree(aff):
        return flexible_tree(aff, constant=constant, n_eigs=n_eigs, seed=seed)

    progress = _Progress(n_iters, x.shape)
    aff_q, aff_k = _cosine(x, 0), _cosine(x, 1)
    emd = TreeEMD(x, check_finite=False)  # x is checked; its buffers serve all nine steps
    tree_q, tree_k = tree(aff_q), tree(aff_k)
    init_q, init_k = tree_q, tree_k
    progress.step("initial query and key trees (cosine affinities)")
    aff_h = np.ones((nh, nh))
    tree_h = None
    for it in range(n_iters):
        tq, tk = (init_q, init_k) if head_uses_initial_trees else (tree_q, tree_k)
        aff_h = _affinity(emd, 2, (tq, tk), (aq, ak), (bq, bk), eps)
        tree_h = tree(aff_h)
        progress.step(f"iteration {it + 1}/{n_iters}: head tree")
        aff_q = _affinity(emd, 0, (tree_k, tree_h), (ak, ah), (bk, bh), eps)
        tree_q = tree(aff_q)
        progress.step(f"iteration {it + 1}/{n_iters}: query tree", slow=True)
        aff_k = _affinity(emd, 1, (tree_q, tree_h), (aq, ah), (bq, bh), eps)
        tree_k = tree(aff_k)
        progress.step(f"iteration {it + 1}/{n_iters}: key tree, levels q={tree_q.n_levels} k={tree_k.n_levels} "
                      f"h={tree_h.n_levels}", slow=True)
    return Organization(tree_q, tree_k, tree_h, aff_q, aff_k, aff_h)


class _Progress:
    """The questionnaire's steps in the log: at INFO once it has run `QUIET_S` seconds (a
    1024-token LLM sample takes minutes), with the time to go estimated from the query and key
    steps so far (the head steps are cheap); at DEBUG before, so small tensors stay quiet."""

    QUIET_S = 10.0

    def __init__(self, n_iters: int, shape):
        self.total, self.n_slow, self.done = 1 + 3 * n_iters, 2 * n_iters, 0
        self.shape = tuple(int(n) for n in shape)
        self.start = self.last = time.perf_counter()
        self.slow = []  # seconds of the query and key steps

    def step(self, what: str, slow: bool = False) -> None:
        """One step done: `what`, `slow` for a query or key step."""
        now = time.perf_counter()
        took, self.last, self.done = now - self.last, now, self.done + 1
        if slow:
            self.slow.append(took)
        left = self.total - self.done
        togo = (self.n_slow - len(self.slow)) * sum(self.slow) / len(self.slow) if self.slow else float("nan")
        level = logging.INFO if now - self.start > self.QUIET_S else logging.DEBUG
        log.log(level, "questionnaire of %d x %d x %d: step %d/%d, %s, %.0f s (%.0f s in all%s)", *self.shape, self.done, self.total, what, took, now - self.start,
                f", about {togo:.0f} s to go" if left and togo == togo else "")


def _affinity(emd: TreeEMD, axis, trees, alphas, betas, eps) -> np.ndarray:
    """EMD affinity between the slices of the tensor along `axis`, over the two given trees."""
    # Folder weights factor per axis, so per-axis (alpha, beta) pass through as a pair.
    d = emd(axis, trees, alpha=alphas, beta=betas)
    g = emd_affinity(d, eps=eps)
    g = g.detach().cpu().numpy() if isinstance(g, torch.Tensor) else np.asarray(g)
    g = g.astype(np.float64)
    return (g + g.T) / 2


@announces_kernels
def questionnaire2d(M, n_iters: int = 10, alpha: float = 1.0, beta: float = 0.0,
                    constant: float = 1.0, eps: float = 1.0, n_eigs: int = 12,
                    seed: int = 0) -> tuple[PartitionTree, PartitionTree]:
    """Organize one head M (rows = queries, columns = keys) by the 2-D questionnaire (docs/method.md §5.3).

    The row tree starts from cosine affinities of the rows; each iteration rebuilds the
    column tree from the tree-EMD over the row tree, then the row tree from the EMD over
    the column tree. The organized head is ``M[row_tree.order][:, col_tree.order]``.

    Parameters
    ----------
    M : ndarray or torch.Tensor of shape (n_rows, n_cols)
        One head, float (computed in float32).
    n_iters : int, default 10
        Number of iterations (column tree, then row tree), at least 1.
    alpha : float, default 1.0
        The EMD folder-weight exponent alpha.
    beta : float, default 0.0
        The EMD folder-weight exponent beta.
    constant : float, default 1.0
        The constant of the trees' greedy merges (`trees.flexible_tree`), positive.
    eps : float, default 1.0
        Scale of the Gaussian affinity of the EMD (`emd.emd_affinity`).
    n_eigs : int, default 12
        Number of diffusion eigenpairs `trees.flexible_tree` computes.
    seed : int, default 0
        Passed to `trees.flexible_tree`, whose construction is deterministic (it uses no
        randomness).

    Returns
    -------
    row_tree : PartitionTree
        Tree on the n_rows rows.
    col_tree : PartitionTree
        Tree on the n_cols columns.

    Raises
    ------
    ValueError
        If M is not a 2-D numeric array, has an axis of length 0 or contains NaN or inf, or if
        `n_iters` < 1 or `constant` <= 0.
    """
    m, _ = as_tensor(M, "M", ndim=2)
    if n_iters < 1:
        raise ValueError(f"n_iters: must be >= 1, got {n_iters}")
    emd = TreeEMD(m[:, :, None], check_finite=False)  # a singleton third axis: the 3-D EMD unchanged
    single = PartitionTree(np.zeros((1, 1), dtype=np.int64))

    def tree(aff):
        return flexible_tree(aff, constant=constant, n_eigs=n_eigs, seed=seed)

    tree_r = tree(cosine_affinity(m))
    tree_c = None
    for _ in range(n_iters):
        tree_c = tree(_affinity(emd, 1, (tree_r, single), (alpha, 0.0), (beta, 0.0), eps))
        tree_r = tree(_affinity(emd, 0, (tree_c, single), (alpha, 0.0), (beta, 0.0), eps))
    return tree_r, tree_c
