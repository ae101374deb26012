"""Tree earth mover's distance between slices of a 3-tensor, and its affinity (SPEC 3.1).

The tree EMD of Ankenman (2014) as used by the 3D questionnaire (Mishne et al. 2016):
given partition trees on the two axes that are not compared, a slice is described by the
weighted means of its entries over every pair of folders (a coarse-to-fine summary of the
slice), and the distance between two slices is the L1 distance between these summaries.

`pairwise_l1` is the hot spot of the questionnaire: on CPU it is a cache-blocked numba
kernel over the upper triangle, on other devices chunked `torch.cdist`. On a small busy
machine, run with OMP_WAIT_POLICY=PASSIVE in the environment (read when torch is
imported): otherwise torch's idle OpenMP threads spin while the numba threads work, and
the kernel can be several times slower.
"""
from __future__ import annotations

import math

import numba
import numpy as np
import torch

from ._arrays import as_tensor, back
from .trees import PartitionTree

__all__ = ["pairwise_l1", "tree_emd", "emd_affinity"]

# Rows are tiled in blocks of _BLOCK (a multiple of 4: the micro-kernel takes 4 x 2 rows).
_BLOCK = 16
# Bytes of one feature strip (all m rows) that should stay in a core's L2 cache while
# every block pair is processed on it.
_STRIP_BYTES = 1 << 20


# -- CPU kernel ---------------------------------------------------------------------------
@numba.njit(parallel=True, fastmath=True, cache=True)
def _l1_upper_blocks(F, block, strip, n_workers):  # pragma: no cover - compiled
    """Sum of |F[i] - F[j]| over all row pairs, as a symmetric float64 (m, m) matrix.

    Rows are tiled in blocks; the upper-triangle block pairs are shared out among
    `n_workers` threads once (balanced by cost), and each thread walks the feature axis
    in strips of `strip` columns, doing all its pairs on a strip while it is in cache.
    A single parallel region per call: threads never wait for each other between strips,
    which matters on a busy machine. Within a strip the sums are float32 (short, so
    accurate); they are added to float64 tiles across strips, which keeps the result
    accurate for d in the hundreds of thousands.
    """
    m, d = F.shape
    nb = (m + block - 1) // block
    n_pairs = nb * (nb + 1) // 2
    bi = np.empty(n_pairs, np.int64)
    bj = np.empty(n_pairs, np.int64)
    p = 0
    for a in range(nb):
        for b in range(a, nb):
            bi[p] = a
            bj[p] = b
            p += 1
    # greedy balance: a diagonal block pair costs about half an off-diagonal one
    n_workers = max(1, min(n_workers, n_pairs))
    load = np.zeros(n_workers, np.float64)
    count = np.zeros(n_workers, np.int64)
    owned = np.empty((n_workers, n_pairs), np.int64)
    for p in range(n_pairs):
        w = np.argmin(load)
        owned[w, count[w]] = p
        count[w] += 1
        load[w] += 0.5 if bi[p] == bj[p] else 1.0
    acc = np.zeros((n_pairs, block, block), np.float64)
    for w in numba.prange(n_workers):
        for k0 in range(0, d, strip):
            k1 = min(k0 + strip, d)
            for q in range(count[w]):
                p = owned[w, q]
                i_base = bi[p] * block
                j_base = bj[p] * block
                diag = bi[p] == bj[p]
                tile = acc[p]
                # micro-kernel: 4 rows of block I against 2 rows of block J per pass over the
                # strip (6 loads for 8 pairs); rows past m are clamped to m - 1 (computed,
                # never written back), which keeps the inner loop free of branches
                for ii in range(0, block, 4):
                    # strip views indexed from 0: with k >= 0 provable, no negative-index
                    # wraparound is emitted and the loop vectorizes to contiguous loads
                    a0 = F[min(i_base + ii, m - 1), k0:k1]
                    a1 = F[min(i_base + ii + 1, m - 1), k0:k1]
                    a2 = F[min(i_base + ii + 2, m - 1), k0:k1]
                    a3 = F[min(i_base + ii + 3, m - 1), k0:k1]
                    jj_start = ii if diag else 0
                    for jj in range(jj_start, block, 2):
                        b0 = F[min(j_base + jj, m - 1), k0:k1]
                        b1 = F[min(j_base + jj + 1, m - 1), k0:k1]
                        s00 = np.float32(0.0)
                        s01 = np.float32(0.0)
                        s10 = np.float32(0.0)
                        s11 = np.float32(0.0)
                        s20 = np.float32(0.0)
                        s21 = np.float32(0.0)
                        s30 = np.float32(0.0)
                        s31 = np.float32(0.0)
                        for k in range(k1 - k0):
                            y0 = b0[k]
                            y1 = b1[k]
                            x = a0[k]
                            s00 += abs(x - y0)
                            s01 += abs(x - y1)
                            x = a1[k]
                            s10 += abs(x - y0)
                            s11 += abs(x - y1)
                            x = a2[k]
                            s20 += abs(x - y0)
                            s21 += abs(x - y1)
                            x = a3[k]
                            s30 += abs(x - y0)
                            s31 += abs(x - y1)
                        tile[ii, jj] += s00
                        tile[ii, jj + 1] += s01
                        tile[ii + 1, jj] += s10
                        tile[ii + 1, jj + 1] += s11
                        tile[ii + 2, jj] += s20
                        tile[ii + 2, jj + 1] += s21
                        tile[ii + 3, jj] += s30
                        tile[ii + 3, jj + 1] += s31
    out = np.zeros((m, m), np.float64)
    for p in range(n_pairs):
        i_base = bi[p] * block
        j_base = bj[p] * block
        for ii in range(min(block, m - i_base)):
            for jj in range(min(block, m - j_base)):
                i = i_base + ii
                j = j_base + jj
                if i < j:
                    out[i, j] = acc[p, ii, jj]
                    out[j, i] = acc[p, ii, jj]
    return out


def _pairwise_l1_numba(F: np.ndarray, strip: int | None = None) -> np.ndarray:
    F = np.ascontiguousarray(F, dtype=np.float32)
    m, d = F.shape
    if strip is None:
        # all m rows of a strip fit in _STRIP_BYTES; a multiple of 64 floats
        strip = max(256, (_STRIP_BYTES // (4 * m)) // 64 * 64)
    return _l1_upper_blocks(F, _BLOCK, min(strip, d), numba.get_num_threads())


# -- device kernel ------------------------------------------------------------------------
def _pairwise_l1_torch(F: torch.Tensor, row_chunk: int = 1024, col_chunk: int = 1 << 16) -> torch.Tensor:
    """Chunked `torch.cdist(p=1)` on F's device; float32 per feature chunk, float64 total."""
    m, d = F.shape
    out = torch.zeros((m, m), dtype=torch.float64, device=F.device)
    for r0 in range(0, m, row_chunk):
        rows = F[r0:r0 + row_chunk]
        for c0 in range(0, d, col_chunk):
            out[r0:r0 + row_chunk] += torch.cdist(
                rows[:, c0:c0 + col_chunk], F[:, c0:c0 + col_chunk], p=1.0).double()
    out = (out + out.T) / 2  # cdist of a row with itself is exactly 0; this fixes symmetry
    out.fill_diagonal_(0.0)
    return out


def pairwise_l1(F):
    """L1 distances between the rows of F (m, d): the EMD of SPEC 3.1 on tree features.

    Returns a symmetric float64 (m, m) matrix with a zero diagonal, as numpy or torch like
    the input. On CPU this runs a cache-blocked multi-threaded kernel (numba); on other
    devices, chunked `torch.cdist(p=1)`. Either way only float32 partial sums over short
    feature chunks are formed, accumulated in float64.
    """
    t, was_numpy = as_tensor(F, "F", ndim=2, finite=False)
    _check_finite(t, "F")
    return back(_pairwise_l1(t), was_numpy)


def _pairwise_l1(t: torch.Tensor) -> torch.Tensor:
    if t.device.type == "cpu":
        return torch.from_numpy(_pairwise_l1_numba(t.detach().contiguous().numpy()))
    return _pairwise_l1_torch(t)


def _check_finite(t: torch.Tensor, name: str) -> None:
    # numpy's check is several times faster than torch's on CPU, and F can be ~100 MB
    ok = np.isfinite(t.detach().numpy()).all() if t.device.type == "cpu" else torch.isfinite(t).all()
    if not bool(ok):
        raise ValueError(f"{name}: contains NaN or inf")


# -- tree EMD -----------------------------------------------------------------------------
def _weighted_means(tree: PartitionTree, alpha: float, beta: float, device) -> torch.Tensor:
    """Row-normalised membership of the distinct folders, each row scaled by its weight."""
    mem, _, _ = tree.folders
    m = mem.astype(np.float64)
    m *= (tree.folder_weights(alpha, beta) / m.sum(1))[:, None]
    return torch.from_numpy(m.astype(np.float32)).to(device)


def tree_features(X, axis: int, trees, alpha: float = 0.0, beta: float = 1.0) -> torch.Tensor:
    """Tree EMD feature vector of every slice of X along `axis` (SPEC 3.1), as torch.

    Row s of the (n_slices, F_a * F_b) result holds w(A) w(B) mean(X_s[A, B]) over every
    pair of distinct folders (A in trees[0], B in trees[1]); a folder that repeats over k
    levels (single child) carries the sum of its k level weights, so the L1 distance
    between rows equals the L1 over all (level, folder) pairs of the SPEC.
    """
    t, _ = as_tensor(X, "X", ndim=3, finite=False)
    _check_finite(t, "X")
    axis = _check_axis(axis)
    ta, tb = _check_trees(trees, t.shape, axis)
    (aa, ab), (ba, bb) = _pair(alpha, "alpha"), _pair(beta, "beta")
    ma = _weighted_means(ta, aa, ba, t.device)  # (F_a, n_a)
    mb = _weighted_means(tb, ab, bb, t.device)  # (F_b, n_b)
    xs = t.movedim(axis, 0)  # (slice, n_a, n_b); remaining axes keep increasing order
    # contract the longer axis first: fewer multiply-adds since F ~ 2n
    if ta.n >= tb.n:
        y = torch.matmul(ma, xs)  # (slice, F_a, n_b)
        feat = torch.matmul(y, mb.T)  # (slice, F_a, F_b)
    else:
        y = torch.matmul(xs, mb.T)  # (slice, n_a, F_b)
        feat = torch.matmul(ma, y)
    return feat.reshape(feat.shape[0], -1)


def tree_emd(X, axis: int, trees, alpha: float = 0.0, beta: float = 1.0):
    """Tree EMD between the slices of a (query, key, head) tensor along `axis` (SPEC 3.1).

    `axis` picks the slices compared (2: heads, X[:, :, h]; 0: queries; 1: keys);
    `trees` = (tree on the first remaining axis, tree on the second), in increasing axis
    order, e.g. (T_Q, T_K) for axis=2. Folder weights are
    w(F) = (|F| / n)^beta * 2^((1 - level(F)) * alpha), root level 1; `alpha` and `beta`
    are numbers, or pairs giving each tree its own exponent. Returns the
    symmetric (n_slices, n_slices) float64 distance matrix, numpy or torch like X.
    """
    was_numpy = not isinstance(X, torch.Tensor)
    return back(_pairwise_l1(tree_features(X, axis, trees, alpha, beta)), was_numpy)


def emd_affinity(D, eps: float = 1.0):
    """Gaussian affinity G = exp(-D / (eps * median(D))) between slices (SPEC 3.1).

    The median is over all n^2 entries of D (diagonal included, the mean of the two middle
    values when n^2 is even, as numpy's). Degenerate scales never divide by zero: if the
    median is 0 (more than half of the pairs are identical slices), the mean of the
    nonzero entries is used instead; if D is all zeros (every slice the same), G is all
    ones. G is float64 in (0, 1] (entries far beyond the scale may underflow to 0), with
    ones on the diagonal; numpy or torch like D.
    """
    d, was_numpy = as_tensor(D, "D", ndim=2, dtype=torch.float64)
    if d.shape[0] != d.shape[1]:
        raise ValueError(f"D: expected a square distance matrix, got shape {tuple(d.shape)}")
    if bool((d < 0).any()):
        raise ValueError(f"D: distances must be nonnegative (min {float(d.min()):.3g})")
    eps = _check_real(eps, "eps")
    if eps <= 0:
        raise ValueError(f"eps: must be positive, got {eps}")
    flat = torch.sort(d.reshape(-1)).values
    n2 = flat.numel()
    scale = float((flat[(n2 - 1) // 2] + flat[n2 // 2]) / 2)
    if scale == 0.0:
        nonzero = flat[flat > 0]
        if nonzero.numel() == 0:
            return back(torch.ones_like(d), was_numpy)
        scale = float(nonzero.mean())
    return back(torch.exp(-d / (eps * scale)), was_numpy)


# -- validation ---------------------------------------------------------------------------
def _check_axis(axis) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)) or not 0 <= axis <= 2:
        raise ValueError(f"axis: must be 0, 1 or 2 (the compared slices of a 3-tensor), got {axis!r}")
    return int(axis)


def _check_trees(trees, shape, axis: int) -> tuple[PartitionTree, PartitionTree]:
    rest = [a for a in range(3) if a != axis]
    if not isinstance(trees, (tuple, list)) or len(trees) != 2:
        raise ValueError(f"trees: expected a pair of trees on axes {rest} of X, got {trees!r}")
    for k, (tree, a) in enumerate(zip(trees, rest)):
        if not isinstance(tree, PartitionTree):
            raise ValueError(f"trees[{k}]: expected a PartitionTree, got {type(tree).__name__}")
        if tree.n != shape[a]:
            raise ValueError(f"trees[{k}]: a tree on {tree.n} items for axis {a} of X, "
                             f"which has length {shape[a]} (X shape {tuple(shape)})")
    return trees[0], trees[1]


def _pair(x, name: str) -> tuple[float, float]:
    """A number for both trees, or one per tree."""
    if isinstance(x, (tuple, list, np.ndarray)):
        if len(x) != 2:
            raise ValueError(f"{name}: expected a number or a pair (one per tree), got {x!r}")
        return _check_real(x[0], name), _check_real(x[1], name)
    v = _check_real(x, name)
    return v, v


def _check_real(x, name: str) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a real number, got {x!r}") from exc
    if not math.isfinite(v):
        raise ValueError(f"{name}: must be finite, got {v}")
    return v
