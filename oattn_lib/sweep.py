"""Sweeps through a partition tree: folder means and Haar coefficients, split by split.

The fast transforms behind the Haar expansions (docs/method.md §3.4) and the tree-EMD
features (docs/method.md §4.2). A folder with m children, sorted by size descending (ties by
smallest item), is the chain of m - 1 binary splits "child i | children i+1..m" of its Haar
vectors, so a tree on n items is a binary tree of n - 1 splits (a folder with one child adds
none). The mean of a split is the size-weighted mean of its two parts, and the Haar coefficient of a split
v with parts L and R is sqrt(|L| |R| / |v|) (mean(L) - mean(R)). One sweep from the
leaves up gives every folder mean and every coefficient in O(n) per vector (a dense
basis product is O(n^2)); the inverse sweeps down.

A `Program` evaluates some of the splits on some of the items (a chunk of subtrees),
so callers can build folder means piece by piece and never hold them all. On CPU the
sweeps are multi-threaded numba kernels over blocks of columns (all splits of a block
stay in cache, and each input and output element is touched once); on other devices
they are torch index operations, one batched step per height of the split tree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numba
import numpy as np
import torch
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .trees import PartitionTree

__all__ = ["Splits", "Program", "splits", "chunk_programs", "whole_program", "run_program", "haar_sweep",
           "fetch_add"]

# Fewest columns per kernel task (see _width).
_WIDTH = 64
# Vectors per task when the vectors lie along the contiguous axis.
_GROUP = 64


@dataclass(frozen=True, eq=False)
class Splits:
    """The binary splits of a tree (module docstring), as `splits` builds them.

    Nodes 0..n-1 are the items, node n + s is split s; splits are numbered by height, so
    each comes after its parts. The arrays are int64.

    Attributes
    ----------
    n : int
        Number of items of the tree.
    left, right : ndarray of shape (n - 1,)
        The parts (nodes) of each split; left: the child on the positive side of its Haar
        vector.
    height : ndarray of shape (n - 1,)
        The height of each split, ascending.
    size : ndarray of shape (2n - 1,)
        The number of items under every node.
    parent : ndarray of shape (2n - 1,)
        The split above every node (-1 at the root).
    column : ndarray of shape (n - 1,)
        The Haar basis column of each split (docs/method.md §3.3 order; column 0 is the
        constant).
    folder_node : ndarray of shape (n_folders,)
        The node of each distinct folder, in `PartitionTree.folders` order.
    root : int
        The node of the root.
    """

    n: int
    left: np.ndarray
    right: np.ndarray
    height: np.ndarray
    size: np.ndarray
    parent: np.ndarray
    column: np.ndarray
    folder_node: np.ndarray
    root: int


@lru_cache(maxsize=64)
def splits(tree: PartitionTree) -> Splits:
    """The binary splits of `tree`, built from the leaves up (cached per tree).

    Parameters
    ----------
    tree : PartitionTree
        The tree, on n items.

    Returns
    -------
    Splits
        Its splits; the arrays are read-only int64: `left`, `right`, `height`, `column` of
        shape (n - 1,); `size`, `parent` of shape (2n - 1,); `folder_node` of shape
        (n_folders,).
    """
    n, lab = tree.n, tree.labels
    node = np.empty(n, dtype=np.int64)
    node[lab[-1]] = np.arange(n)  # node of each folder of the current level
    node_at = [node]
    left, right, key, batches = [], [], [], []
    count = n
    for lev in range(tree.n_levels - 2, -1, -1):
        par, csize, nf = tree.parents[lev + 1], tree.folder_sizes[lev + 1], tree.n_folders(lev)
        # by parent, size descending, smallest item (docs/method.md §3.2)
        srt = np.lexsort((tree.smallest_items[lev + 1], -csize, par))
        bounds = np.searchsorted(par[srt], np.arange(nf + 1))
        smallest = tree.smallest_items[lev]
        new = np.empty(nf, dtype=np.int64)
        start = count
        for f in range(nf):
            ch = node[srt[bounds[f]:bounds[f + 1]]]  # child nodes in rank order
            m = ch.size
            if m == 1:
                new[f] = ch[0]
                continue
            for i in range(m - 1):
                left.append(ch[i])
                right.append(count + 1 if i < m - 2 else ch[m - 1])
                key.append((lev, smallest[f], i))
                count += 1
            new[f] = count - (m - 1)
        batches.append((start, count))
        node = new
        node_at.append(node)
    left = np.asarray(left, dtype=np.int64).reshape(-1)
    right = np.asarray(right, dtype=np.int64).reshape(-1)
    # heights: parts come from earlier batches (lower levels) or later in the same chain
    h = np.zeros(count, dtype=np.int64)
    for start, stop in batches:
        for v in range(stop - 1, start - 1, -1):
            h[v] = 1 + max(h[left[v - n]], h[right[v - n]])
    order = np.argsort(h[n:], kind="stable")  # renumber splits by height
    relabel = np.r_[np.arange(n), n + np.argsort(order)].astype(np.int64)
    left, right, height = relabel[left[order]], relabel[right[order]], h[n:][order]
    column = np.empty(n - 1, dtype=np.int64)
    if n > 1:
        key = np.asarray(key)[order]
        column[np.lexsort((key[:, 2], key[:, 1], key[:, 0]))] = np.arange(1, n)
    size = np.ones(2 * n - 1, dtype=np.int64)
    for s in range(n - 1):
        size[n + s] = size[left[s]] + size[right[s]]
    parent = np.full(2 * n - 1, -1, dtype=np.int64)
    parent[left] = parent[right] = n + np.arange(n - 1)
    folder_node = np.concatenate([relabel[nodes[np.flatnonzero(new)]]
                                  for nodes, new in zip(node_at[::-1], _new_folders(tree))])
    out = Splits(n, left, right, height, size, parent, column, folder_node, int(relabel[node[0]]))
    for a in (left, right, height, size, parent, column, folder_node):
        a.setflags(write=False)
    return out


def _new_folders(tree: PartitionTree) -> list[np.ndarray]:
    """Per level, which folders are new there (not the only child of a folder above)."""
    out = [np.ones(1, dtype=bool)]
    for lev in range(1, tree.n_levels):
        par = tree.parents[lev]
        out.append(np.bincount(par, minlength=tree.n_folders(lev - 1))[par] != 1)
    return out


# -- programs -----------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class Program:
    """Splits to evaluate on loaded rows, and which node means to emit.

    Local nodes 0..len(load)-1 are the rows `load` of the source; local node
    len(load) + k is split k, the weighted mean `wl[k] * left + wr[k] * right` of two
    earlier local nodes. The output rows are `weight[e]` times the mean of local node
    `emit[e]`.

    Attributes
    ----------
    load : ndarray of shape (n_load,)
        The rows of the source read, int64.
    left, right : ndarray of shape (n_split,)
        The two local nodes each split averages, int64.
    wl, wr : ndarray of shape (n_split,)
        Their weights (the parts' shares of the split's items), float64.
    steps : ndarray of shape (n_heights + 1,)
        Bounds of the runs of splits of each height, int64.
    emit : ndarray of shape (n_emit,)
        The local nodes whose means are output, in output order, int64.
    weight : ndarray of shape (n_emit,)
        The factor of each output row, float64.
    """

    load: np.ndarray
    left: np.ndarray
    right: np.ndarray
    wl: np.ndarray
    wr: np.ndarray
    steps: np.ndarray
    emit: np.ndarray
    weight: np.ndarray


def _program(sp: Splits, loaded: np.ndarray, load_rows: np.ndarray, split_nodes: np.ndarray,
             emit_nodes: np.ndarray, weight: np.ndarray) -> Program:
    local = np.full(2 * sp.n - 1, -1, dtype=np.int64)
    local[loaded] = np.arange(loaded.size)
    local[split_nodes] = loaded.size + np.arange(split_nodes.size)
    s = split_nodes - sp.n
    lft, rgt = sp.left[s], sp.right[s]
    size = sp.size.astype(np.float64)
    steps = _steps(sp.height[s])
    return Program(load_rows.astype(np.int64), local[lft], local[rgt], size[lft] / size[split_nodes],
                   size[rgt] / size[split_nodes], steps, local[emit_nodes], np.asarray(weight, dtype=np.float64))


def _preorder(sp: Splits) -> np.ndarray:
    """All nodes in depth-first order from the root (left part first)."""
    out, stack = [], [sp.root]
    while stack:
        v = stack.pop()
        out.append(v)
        if v >= sp.n:
            stack += [sp.right[v - sp.n], sp.left[v - sp.n]]
    return np.asarray(out, dtype=np.int64)


def _steps(height: np.ndarray) -> np.ndarray:
    """Boundaries of the runs of equal height (heights ascending)."""
    if height.size == 0:
        return np.zeros(1, dtype=np.int64)
    return np.r_[0, np.flatnonzero(np.diff(height)) + 1, height.size].astype(np.int64)


def whole_program(sp: Splits, emit_nodes, weight) -> Program:
    """Load all n items (row i = item i), evaluate every split, emit the given nodes.

    Parameters
    ----------
    sp : Splits
        The splits of the tree (`splits`).
    emit_nodes : array_like of int, shape (n_emit,)
        The nodes whose means are output, in output order.
    weight : array_like of float, shape (n_emit,)
        The factor of each output row.

    Returns
    -------
    Program
        The program, for `run_program`.
    """
    items = np.arange(sp.n)
    return _program(sp, items, items, np.arange(sp.n, 2 * sp.n - 1), np.asarray(emit_nodes), weight)


def chunk_programs(sp: Splits, emit_nodes, weight, max_items: int) -> tuple[list[Program], list[int], list[Program]]:
    """Programs that emit the means of `emit_nodes` chunk by chunk, at most ~max_items items each.

    The tree is cut below its splits of more than `max_items` items; the subtrees under
    the cut are grouped into chunks. Chunk program c loads its items (rows = item
    indices), emits its share of `emit_nodes` (times `weight`) and then, unweighted, the
    means of its subtree roots.

    Parameters
    ----------
    sp : Splits
        The splits of the tree (`splits`).
    emit_nodes : array_like of int, shape (n_emit,)
        The nodes whose means are output.
    weight : array_like of float, shape (n_emit,)
        The factor of each node's mean.
    max_items : int
        About how many items one chunk holds, positive.

    Returns
    -------
    chunks : list of Program
        One program per chunk.
    n_emit : list of int
        The number of nodes of `emit_nodes` each chunk program emits, before its roots.
    tops : list of Program
        Programs that read the roots of all chunks (rows in chunk order) and emit the rest,
        at most 2 * max_items nodes each, evaluating only the splits under their nodes
        (none if the whole tree is one chunk).
    """
    n, size, parent = sp.n, sp.size, sp.parent
    emit_nodes, weight = np.asarray(emit_nodes, dtype=np.int64), np.asarray(weight, dtype=np.float64)
    cut = (size <= max_items) & ((parent < 0) | (size[np.maximum(parent, 0)] > max_items))
    owner = np.full(2 * n - 1, -1, dtype=np.int64)  # the subtree root under the cut
    for v in range(2 * n - 2, -1, -1):  # parents before parts
        owner[v] = v if cut[v] else (owner[parent[v]] if parent[v] >= 0 else -1)
    roots = np.flatnonzero(cut)
    groups, cur, filled = [], [], 0
    for r in roots[np.argsort(-size[roots], kind="stable")] if roots.size else []:
        if cur and filled + size[r] > max_items:
            groups.append(cur)
            cur, filled = [], 0
        cur.append(r)
        filled += size[r]
    if cur:
        groups.append(cur)
    nodes = np.arange(2 * n - 1)
    emit_pos = np.full(2 * n - 1, -1, dtype=np.int64)
    emit_pos[emit_nodes] = np.arange(emit_nodes.size)
    chunks, n_emit, loaded_roots = [], [], []
    for g in groups:
        g = np.asarray(g, dtype=np.int64)
        mine = np.isin(owner, g)
        items = nodes[:n][mine[:n]]
        own_emit = emit_nodes[mine[emit_nodes]]
        chunks.append(_program(sp, items, items, nodes[n:][mine[n:]], np.r_[own_emit, g],
                               np.r_[weight[emit_pos[own_emit]], np.ones(g.size)]))
        n_emit.append(own_emit.size)
        loaded_roots.append(g)
    tops = []
    if not cut[sp.root]:
        # top emits in depth-first order, in groups; each group evaluates only the splits
        # under its nodes and loads only the roots under them
        row_of_root = np.full(2 * n - 1, -1, dtype=np.int64)
        loaded = np.concatenate(loaded_roots)
        row_of_root[loaded] = np.arange(loaded.size)
        dfs = _preorder(sp)
        top_emit = dfs[(owner[dfs] < 0) & (emit_pos[dfs] >= 0)]
        per = 2 * max_items
        for e0 in range(0, top_emit.size, per):
            part = top_emit[e0:e0 + per]
            need, roots_needed, stack = set(), [], list(part)
            while stack:
                v = stack.pop()
                if v in need:
                    continue
                need.add(v)
                for w in (sp.left[v - n], sp.right[v - n]):
                    (stack if owner[w] < 0 else roots_needed).append(w)
            roots_needed = np.unique(np.asarray(roots_needed, dtype=np.int64))
            tops.append(_program(sp, roots_needed, row_of_root[roots_needed], np.sort(np.fromiter(need, np.int64)),
                                 part, weight[emit_pos[part]]))
    return chunks, n_emit, tops


# -- kernels ------------------------------------------------------------------------------
@intrinsic
def fetch_add(typingctx, counter, index):  # pragma: no cover - compiled
    """In numba code: atomically counter[index] += 1, returning the old value.

    The kernels hand out their tasks with it, one at a time to whichever thread is free: on
    a shared machine a thread can be descheduled for a while, and with a fixed share per
    thread every other one would wait for it. Called from numba code as
    ``fetch_add(counter, index)``; `typingctx` is numba's.

    Parameters
    ----------
    typingctx : numba typing context
        Passed by numba.
    counter : ndarray of int64
        The counters.
    index : int
        Which counter.

    Returns
    -------
    int
        In numba code: the counter's value before the increment (int64).
    """
    if not (isinstance(counter, types.Array) and counter.dtype == types.int64 and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, args[0])
        ptr = cgutils.get_item_pointer(context, builder, sig.args[0], ary, [args[1]])
        return builder.atomic_rmw("add", ptr, context.get_constant(types.int64, 1), "monotonic")
    return types.int64(counter, index), codegen


@numba.njit(inline="always")
def _task(task, n_b, r, width):  # pragma: no cover - compiled
    """Block of columns of task `task`: (first b, number of b, first column, columns per b)."""
    if r >= width:
        n_blk = (r + width - 1) // width
        b0 = task // n_blk
        j0 = (task - b0 * n_blk) * width
        return b0, 1, j0, min(width, r - j0)
    per = width // r
    b0 = task * per
    return b0, min(per, n_b - b0), 0, r


def _width(n_nodes: int, r: int) -> int:
    """Columns per task. Rows are read and written in runs as long as possible: short runs
    over many rows cost far more than the arithmetic. Up to 1024 columns, while the
    task's scratch (n_nodes rows) stays within about 16 MB (L3)."""
    widest = max(_WIDTH, min(1024, (1 << 22) // max(n_nodes, 1) // _WIDTH * _WIDTH))
    if r <= widest:
        return max(r, _WIDTH)  # whole rows: one task per vector batch
    return widest


def _n_tasks(n_b: int, r: int, width: int) -> int:
    if r >= width:
        return n_b * ((r + width - 1) // width)
    return (n_b + width // r - 1) // (width // r)


@numba.njit(inline="always")
def _load(src, rows, b0, nb, j0, jw, s):  # pragma: no cover - compiled
    """s[i, bb * jw + jj] = src[b0 + bb, rows[i], j0 + jj]: a block into scratch."""
    for bb in range(nb):
        for i in range(rows.size):
            row = rows[i]
            for jj in range(jw):
                s[i, bb * jw + jj] = src[b0 + bb, row, j0 + jj]


@numba.njit(inline="always")
def _store(s, nodes, weight, b0, nb, j0, jw, out):  # pragma: no cover - compiled
    """out[b0 + bb, e, j0 + jj] = weight[e] * s[nodes[e], bb * jw + jj]: scratch into a block."""
    for bb in range(nb):
        for e in range(nodes.size):
            ne, we = nodes[e], weight[e]
            for jj in range(jw):
                out[b0 + bb, e, j0 + jj] = we * s[ne, bb * jw + jj]


@numba.njit(inline="always")
def _all_zero(s, n_rows, w):  # pragma: no cover - compiled
    """Whether s[:n_rows, :w] is all zero (stops at the first nonzero; NaN counts as one)."""
    for i in range(n_rows):
        for t in range(w):
            if s[i, t] != 0:
                return False
    return True


@numba.njit(inline="always")
def _store_zeros(nodes, b0, nb, j0, jw, out, transposed):  # pragma: no cover - compiled
    """The zeros `_store` (or the transposed store) would write for an all-zero block."""
    for bb in range(nb):
        for e in range(nodes.size):
            for jj in range(jw):
                if transposed:
                    out[j0 + jj, b0 + bb, e] = 0
                else:
                    out[b0 + bb, e, j0 + jj] = 0


@numba.njit(parallel=True, fastmath=True, cache=True)
def _means_kernel(src, bmap, load, left, right, wl, wr, emit, weight, out, transposed,
                  n_tasks, width, n_workers):  # pragma: no cover - compiled
    """Program means of the vectors src[bmap[b], load[:], j] into out[b, :, j] (or, if
    `transposed`, out[j, b, :]): a gather and a transpose for free, on the way. Tasks
    (blocks of columns, or of vectors) go to whichever thread is free (`fetch_add`)."""
    n_b, r = bmap.size, src.shape[2]
    n_load, n_split, n_emit = load.size, left.size, emit.size
    counter = np.zeros(1, np.int64)
    if r == 1:  # vectors along the contiguous axis: one at a time, in L1
        n_groups = (n_b + _GROUP - 1) // _GROUP
        for worker in numba.prange(max(1, min(n_workers, n_groups))):
            v = np.empty(n_load + n_split, dtype=src.dtype)
            while True:
                grp = fetch_add(counter, 0)
                if grp >= n_groups:
                    break
                for b in range(grp * _GROUP, min(n_b, (grp + 1) * _GROUP)):
                    sb = bmap[b]
                    nonzero = False
                    for i in range(n_load):
                        v[i] = src[sb, load[i], 0]
                        nonzero |= v[i] != 0
                    if not nonzero:  # every mean is 0 (causal attention past the diagonal)
                        for e in range(n_emit):
                            if transposed:
                                out[0, b, e] = 0
                            else:
                                out[b, e, 0] = 0
                        continue
                    for k in range(n_split):
                        v[n_load + k] = wl[k] * v[left[k]] + wr[k] * v[right[k]]
                    for e in range(n_emit):
                        if transposed:
                            out[0, b, e] = weight[e] * v[emit[e]]
                        else:
                            out[b, e, 0] = weight[e] * v[emit[e]]
        return
    for worker in numba.prange(max(1, min(n_workers, n_tasks))):  # one scratch per thread
        s = np.empty((n_load + n_split, width), dtype=src.dtype)
        while True:
            task = fetch_add(counter, 0)
            if task >= n_tasks:
                break
            b0, nb, j0, jw = _task(task, n_b, r, width)
            w = nb * jw
            for bb in range(nb):
                sb = bmap[b0 + bb]
                for i in range(n_load):
                    row = load[i]
                    for jj in range(jw):
                        s[i, bb * jw + jj] = src[sb, row, j0 + jj]
            if _all_zero(s, n_load, w):  # every mean is 0 (causal attention past the diagonal)
                _store_zeros(emit, b0, nb, j0, jw, out, transposed)
                continue
            for k in range(n_split):
                a, c, lk, rk, d = wl[k], wr[k], left[k], right[k], n_load + k
                for t in range(w):
                    s[d, t] = a * s[lk, t] + c * s[rk, t]
            if transposed:
                for bb in range(nb):
                    for jj in range(jw):
                        t = bb * jw + jj
                        for e in range(n_emit):
                            out[j0 + jj, b0 + bb, e] = weight[e] * s[emit[e], t]
            else:
                _store(s, emit, weight, b0, nb, j0, jw, out)


@numba.njit(parallel=True, fastmath=True, cache=True)
def _haar_up(src, out, left, right, wl, wr, g, column, root, n_tasks, width, n_workers):  # pragma: no cover
    """Forward Haar sweep along axis 1; `out` may be `src` (each block is read first).
    Tasks go to whichever thread is free (`fetch_add`)."""
    n_b, n, r = src.shape
    rows = np.arange(n)
    ones = np.ones(n, dtype=src.dtype)
    sqrt_n = math.sqrt(n)
    counter = np.zeros(1, np.int64)
    if r == 1:  # vectors along the contiguous axis: one at a time, in L1
        n_groups = (n_b + _GROUP - 1) // _GROUP
        for worker in numba.prange(max(1, min(n_workers, n_groups))):
            v = np.empty(2 * n - 1, dtype=src.dtype)
            while True:
                grp = fetch_add(counter, 0)
                if grp >= n_groups:
                    break
                for b in range(grp * _GROUP, min(n_b, (grp + 1) * _GROUP)):
                    for i in range(n):
                        v[i] = src[b, i, 0]
                    for k in range(n - 1):
                        x, y = v[left[k]], v[right[k]]
                        v[n + k] = wl[k] * x + wr[k] * y
                        out[b, column[k], 0] = g[k] * (x - y)
                    out[b, 0, 0] = sqrt_n * v[root]
        return
    for worker in numba.prange(max(1, min(n_workers, n_tasks))):
        s = np.empty((2 * n - 1, width), dtype=src.dtype)
        c = np.empty((n, width), dtype=src.dtype)
        while True:
            task = fetch_add(counter, 0)
            if task >= n_tasks:
                break
            b0, nb, j0, jw = _task(task, n_b, r, width)
            w = nb * jw
            _load(src, rows, b0, nb, j0, jw, s)
            for k in range(n - 1):
                a, b, gk, lk, rk, col = wl[k], wr[k], g[k], left[k], right[k], column[k]
                for t in range(w):
                    x = s[lk, t]
                    y = s[rk, t]
                    s[n + k, t] = a * x + b * y
                    c[col, t] = gk * (x - y)
            for t in range(w):
                c[0, t] = sqrt_n * s[root, t]
            _store(c, rows, ones, b0, nb, j0, jw, out)


# -- drivers ------------------------------------------------------------------------------
def _as3(x: torch.Tensor, dim: int) -> torch.Tensor:
    """View a contiguous tensor as (before dim, dim, after dim)."""
    return x.reshape(math.prod(x.shape[:dim]), x.shape[dim], math.prod(x.shape[dim + 1:]))


def _numba_ok(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)


def empty(shape, like: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of the dtype and device of `like`.

    On CPU allocated by numpy, which asks the kernel for transparent huge pages (torch does
    not): far fewer TLB misses in the sweeps.

    Parameters
    ----------
    shape : sequence of int
        Its shape.
    like : torch.Tensor
        The tensor whose dtype and device it takes.

    Returns
    -------
    torch.Tensor of shape `shape`
        Uninitialised.
    """
    if like.device.type == "cpu" and like.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(np.empty(tuple(shape), dtype=np.float32 if like.dtype == torch.float32 else np.float64))
    return like.new_empty(tuple(shape))


def run_program(src: torch.Tensor, prog: Program, dim: int, out: torch.Tensor | None = None,
                rows: np.ndarray | None = None, transposed: bool = False) -> torch.Tensor:
    """Means of `prog` along axis `dim` of the contiguous tensor `src`, on its device.

    With src viewed as (B, n, r) (the axes before `dim`, `dim`, the axes after it), the
    vectors src[b, :, j] for b in `rows` (default all B) give out[b, e, j] = mean of
    emitted node e.

    Parameters
    ----------
    src : torch.Tensor
        Contiguous, float; viewed as (B, n, r) around axis `dim`.
    prog : Program
        What to evaluate (`whole_program`, `chunk_programs`); its `load` indexes axis `dim`.
    dim : int
        The axis of the vectors.
    out : torch.Tensor, optional
        Contiguous, of the result's shape: it receives the result (reused memory is cheaper
        than fresh pages, which cost more than the sweep that fills them). A new tensor if
        None.
    rows : ndarray of int, shape (n_rows,), optional
        The vectors b taken (all B if None).
    transposed : bool, default False
        Write out[j, b, e] instead.

    Returns
    -------
    torch.Tensor of shape (n_rows, n_emit, r), or (r, n_rows, n_emit) if `transposed`
        The means (`out`), n_emit = len(prog.emit); with all rows and not transposed, src's
        shape with axis `dim` of length n_emit. src's dtype and device.
    """
    src3 = _as3(src, dim)
    n_b = src3.shape[0] if rows is None else len(rows)
    r, n_e = src3.shape[2], prog.emit.size
    shape = (r, n_b, n_e) if transposed else (n_b, n_e, r)
    if rows is None and not transposed:
        shape = list(src.shape)
        shape[dim] = n_e
    out = empty(shape, src) if out is None else out
    if _numba_ok(src):
        s3 = src3.detach().numpy()
        dt = s3.dtype
        o3 = out.numpy().reshape((r, n_b, n_e) if transposed else (n_b, n_e, r))
        bmap = np.arange(n_b) if rows is None else np.asarray(rows, dtype=np.int64)
        width = _width(prog.load.size + prog.left.size, r)
        _means_kernel(s3, bmap, prog.load, prog.left, prog.right, prog.wl.astype(dt), prog.wr.astype(dt),
                      prog.emit, prog.weight.astype(dt), o3, transposed, _n_tasks(n_b, r, width), width,
                      numba.get_num_threads())
        return out
    dev, dt = src.device, src.dtype

    def t(a, kind=None):
        return torch.as_tensor(np.array(a), device=dev, dtype=kind or dt)
    if rows is not None:
        src3 = src3.index_select(0, t(rows, torch.long))
    n_load = prog.load.size
    s = src3.new_empty((src3.shape[0], n_load + prog.left.size, r))
    s[:, :n_load] = src3.index_select(1, t(prog.load, torch.long))
    for k0, k1 in zip(prog.steps[:-1], prog.steps[1:]):
        lk, rk = t(prog.left[k0:k1], torch.long), t(prog.right[k0:k1], torch.long)
        s[:, n_load + k0:n_load + k1] = (t(prog.wl[k0:k1])[:, None] * s.index_select(1, lk)
                                         + t(prog.wr[k0:k1])[:, None] * s.index_select(1, rk))
    res = s.index_select(1, t(prog.emit, torch.long)) * t(prog.weight)[:, None]
    if transposed:
        res = res.permute(2, 0, 1)
    return out.copy_(res.reshape(out.shape))


def haar_sweep(x: torch.Tensor, tree: PartitionTree, dim: int, inverse: bool = False,
               out: torch.Tensor | None = None) -> torch.Tensor:
    """Haar coefficients of every vector along axis `dim` of contiguous `x` (or the inverse).

    Row j of the result along `dim` is the coefficient of basis column j of
    `haar_basis(tree)` (docs/method.md §3.4).

    Parameters
    ----------
    x : torch.Tensor
        Contiguous, float, of any shape with x.shape[dim] == tree.n.
    tree : PartitionTree
        The tree on the items of axis `dim`.
    dim : int
        The axis swept.
    inverse : bool, default False
        The inverse sweep: x holds coefficients, the result the vectors.
    out : torch.Tensor, optional
        Contiguous, of x's shape: receives the result and may be `x` itself. A new tensor if
        None.

    Returns
    -------
    torch.Tensor
        The coefficients (or vectors), of x's shape, dtype and device.

    Raises
    ------
    ValueError
        If axis `dim` of x is not the tree's length, or `out` is not of x's shape.
    """
    sp = splits(tree)
    n = sp.n
    # the kernel indexes by the tree without bounds checks: a tree of another length (the query
    # tree given for the keys) would read and write outside the tensor, or crash the process
    if not -x.dim() <= dim < x.dim() or x.shape[dim] != n:
        raise ValueError(f"haar_sweep: axis {dim} of a tensor of shape {tuple(x.shape)} does not have the "
                         f"tree's {n} leaves")
    if out is None:
        out = empty(x.shape, x)
    elif tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"haar_sweep: out has shape {tuple(out.shape)}, expected {tuple(x.shape)}")
    size = sp.size.astype(np.float64)
    sl, sr, sv = size[sp.left], size[sp.right], size[n:]
    if _numba_ok(x) and not inverse:
        x3, o3 = _as3(x, dim).detach().numpy(), _as3(out, dim).detach().numpy()
        dt = x3.dtype
        width = _width(3 * n, x3.shape[2])
        _haar_up(x3, o3, sp.left, sp.right, (sl / sv).astype(dt), (sr / sv).astype(dt),
                 np.sqrt(sl * sr / sv).astype(dt), sp.column, sp.root, _n_tasks(x3.shape[0], x3.shape[2], width),
                 width, numba.get_num_threads())
        return out
    # torch (other devices, and the inverse, which no analysis needs fast): a slab of
    # vectors at a time, ~_SLAB elements of split means each
    x3, o3 = _as3(x, dim), _as3(out, dim)
    axis = 0 if x3.shape[0] > 1 else 2
    step = max(1, _SLAB // max(1, (2 * n - 1) * (x3.shape[2] if axis == 0 else 1)))
    for i in range(0, x3.shape[axis], step):
        _haar_torch(x3.narrow(axis, i, min(step, x3.shape[axis] - i)),
                    o3.narrow(axis, i, min(step, x3.shape[axis] - i)), sp, inverse, sl, sr, sv)
    return out


# Elements of split means held at once by the torch sweeps.
_SLAB = 1 << 25


def _haar_torch(x3, o3, sp: Splits, inverse, sl, sr, sv):
    """The sweep on the torch device of x3 (B, n, r), one batched step per split height."""
    dev, dt, n = x3.device, x3.dtype, sp.n

    def t(a, kind=None):
        return torch.as_tensor(np.array(a), device=dev, dtype=kind or dt)
    steps = _steps(sp.height)
    s = x3.new_empty((x3.shape[0], 2 * n - 1, x3.shape[2]))
    if not inverse:
        s[:, :n] = x3
        coef = x3.new_empty(x3.shape)
        for k0, k1 in zip(steps[:-1], steps[1:]):
            ml = s.index_select(1, t(sp.left[k0:k1], torch.long))
            mr = s.index_select(1, t(sp.right[k0:k1], torch.long))
            s[:, n + k0:n + k1] = t(sl[k0:k1] / sv[k0:k1])[:, None] * ml + t(sr[k0:k1] / sv[k0:k1])[:, None] * mr
            coef[:, t(sp.column[k0:k1], torch.long)] = t(np.sqrt(sl * sr / sv)[k0:k1])[:, None] * (ml - mr)
        coef[:, 0] = math.sqrt(n) * s[:, sp.root]
        o3.copy_(coef)
        return o3
    c = x3.clone()  # o3 may be x3
    s[:, sp.root] = c[:, 0] / math.sqrt(n)
    for k0, k1 in zip(steps[-2::-1], steps[:0:-1]):
        mv = s[:, n + k0:n + k1]
        cc = c[:, t(sp.column[k0:k1], torch.long)]
        s[:, t(sp.left[k0:k1], torch.long)] = mv + t(np.sqrt(sr / (sl * sv))[k0:k1])[:, None] * cc
        s[:, t(sp.right[k0:k1], torch.long)] = mv - t(np.sqrt(sl / (sr * sv))[k0:k1])[:, None] * cc
    o3.copy_(s[:, :n])
    return o3
