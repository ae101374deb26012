"""Level of detail for the explorer: heads averaged over tree folders, quantised, packed.

A partition tree (docs/method.md §2) whose leaves are laid out in its depth-first order cuts that
line into contiguous segments at every level, nested from the root down. So, in that
order, the whole tree is one integer per gap between neighbours: the `boundary_depth`,
the coarsest level at which the two neighbours lie in different folders. The folders of
level l are the runs between the gaps of depth <= l. A page ships a tree as its leaf order
and these depths; the browser draws the boundaries of any level from them.

A heatmap too large to ship whole is shown averaged over a cut of its row and column
trees: a set of folders, at most `max_side` per axis, that partition the axis (`tree_cut`
refines the largest folder first). The averages are exact means over the rectangles of
the cut (`block_mean`), then quantised to 8 bits per matrix (`quantise`). A head the model
masks (a causal decoder) is averaged over the entries it may attend to only: a rectangle
mixing masked and allowed entries is the mean of the allowed ones, one with none is NaN
(masked), never a mean of the pre-mask scores the model does not use.
"""
from __future__ import annotations

import base64
import gzip
import heapq

import numpy as np

from ..trees import PartitionTree, balanced_tree

__all__ = ["boundary_depth", "tree_cut", "uniform_cut", "block_mean", "quantise", "dequantise", "pack"]


def boundary_depth(tree: PartitionTree) -> np.ndarray:
    """For each gap between neighbours in `tree.order` ((n - 1,) integers), the coarsest level
    at which the two neighbours are in different folders (1 <= depth <= n_levels - 1)."""
    lab = tree.labels[:, tree.order]
    differs = lab[:, 1:] != lab[:, :-1]  # (level, gap); nested, so once True, True below
    return np.argmax(differs, axis=0).astype(np.int64)


def _segments(depth: np.ndarray, start: int, stop: int) -> list[int]:
    """The children of the folder [start, stop): its split points at its shallowest gap depth."""
    gaps = depth[start:stop - 1]
    cut = np.flatnonzero(gaps == gaps.min()) + start + 1
    return [start, *cut.tolist(), stop]


def tree_cut(depth: np.ndarray, max_folders: int) -> np.ndarray:
    """Edges (positions in the tree's order, 0 ... n) of a cut of the tree with at most
    `max_folders` folders: starting from the root, the largest folder is replaced by its
    children while the count allows; a folder whose children do not fit stays whole.
    With n <= max_folders the cut is the leaves, edges 0, 1, ..., n."""
    depth = np.asarray(depth)
    n = depth.size + 1
    if max_folders < 1:
        raise ValueError(f"max_folders: must be >= 1, got {max_folders}")
    if n <= max_folders:
        return np.arange(n + 1)
    count, final = 1, []
    heap = [(-n, 0, n)]
    while heap:
        neg, a, b = heapq.heappop(heap)
        if b - a == 1:
            final.append(a)
            continue
        kids = _segments(depth, a, b)
        if count - 1 + len(kids) - 1 > max_folders:
            final.append(a)
            continue
        count += len(kids) - 2
        for s, e in zip(kids[:-1], kids[1:]):
            heapq.heappush(heap, (-(e - s), s, e))
    return np.array(sorted(final) + [n])


def uniform_cut(n: int, max_folders: int) -> np.ndarray:
    """Edges of a cut of the balanced binary tree (docs/method.md §2.5) of positions 0 ... n - 1: contiguous
    runs of neighbouring tokens, the level of detail of a head in its own token order."""
    if n <= max_folders:
        return np.arange(n + 1)
    return tree_cut(boundary_depth(balanced_tree(np.arange(n))), max_folders)


def _block_sum(x: np.ndarray, r: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.add.reduceat(np.add.reduceat(x, r[:-1], axis=-2), c[:-1], axis=-1)


def block_mean(x: np.ndarray, row_edges: np.ndarray, col_edges: np.ndarray, allowed=None) -> np.ndarray:
    """Means of x (..., n, m) over the rectangles of row_edges x col_edges (positions in x's
    own order): (..., len(row_edges) - 1, len(col_edges) - 1). `allowed` (bool, broadcastable
    to x, in x's order; None: every entry): the mean of each rectangle is over its allowed
    entries only, NaN where it has none (the masked entries' values are never read)."""
    x = np.asarray(x, dtype=np.float64)
    r, c = np.asarray(row_edges), np.asarray(col_edges)
    if r[0] != 0 or r[-1] != x.shape[-2] or c[0] != 0 or c[-1] != x.shape[-1]:
        raise ValueError(f"row_edges/col_edges: must run from 0 to the shape {x.shape[-2:]}, "
                         f"got {r[0]}..{r[-1]} and {c[0]}..{c[-1]}")
    if allowed is None:
        return _block_sum(x, r, c) / np.outer(np.diff(r), np.diff(c))
    a = np.asarray(allowed)
    if a.dtype != bool or a.shape[-2:] != x.shape[-2:]:
        raise ValueError(f"allowed: expected a boolean mask of shape (..., {x.shape[-2]}, {x.shape[-1]}), "
                         f"got {a.dtype} {a.shape}")
    count = _block_sum(a.astype(np.float64), r, c)
    s = _block_sum(np.where(a, x, 0.0), r, c)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, s / count, np.nan)


def quantise(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """8-bit codes of x (..., n, m), one linear scale per matrix: (codes uint8, lo, hi), with
    x ~ lo + codes / 255 * (hi - lo) to within (hi - lo) / 510. NaN entries (masked) take no
    part in the range and are coded 0 (the page knows them from the mask); a matrix of NaN
    only has lo = hi = 0."""
    x = np.asarray(x, dtype=np.float64)
    nan = np.isnan(x)
    lo = np.where(nan, np.inf, x).min(axis=(-2, -1), keepdims=True)
    hi = np.where(nan, -np.inf, x).max(axis=(-2, -1), keepdims=True)
    lo, hi = np.where(np.isfinite(lo), lo, 0.0), np.where(np.isfinite(hi), hi, 0.0)
    span = np.where(hi > lo, hi - lo, 1.0)
    codes = np.rint(np.where(nan, 0.0, (x - lo) / span * 255)).astype(np.uint8)
    return codes, lo[..., 0, 0], hi[..., 0, 0]


def dequantise(codes: np.ndarray, lo, hi) -> np.ndarray:
    """The values that `quantise` codes stand for (what the page shows)."""
    lo = np.asarray(lo, dtype=np.float64)[..., None, None]
    hi = np.asarray(hi, dtype=np.float64)[..., None, None]
    return lo + codes.astype(np.float64) / 255 * (hi - lo)


def pack(codes: np.ndarray) -> str:
    """Bytes for the page: gzip, then base64 (the browser inflates them with DecompressionStream)."""
    return base64.b64encode(gzip.compress(np.ascontiguousarray(codes, dtype=np.uint8).tobytes(),
                                          compresslevel=6, mtime=0)).decode("ascii")
