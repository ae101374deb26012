"""Tree earth mover's distance between slices of a 3-tensor, and its affinity (docs/method.md §4).

The tree EMD of Ankenman (2014) as used by the 3D questionnaire (Mishne et al. 2016):
given partition trees on the two axes that are not compared, a slice is described by the
weighted means of its entries over every pair of folders (a coarse-to-fine summary of the
slice), and the distance between two slices is the L1 distance between these summaries.

The summaries are built by sweeps through the trees (`sweep`: each folder mean from the
means of its two parts, O(n) per vector) a chunk of subtrees at a time, and each block
of features is added into the L1 distances and dropped (`TreeEMD`): memory stays at
about X plus a few blocks, and no dense folder-membership product is formed.

The L1 between the feature rows is the hot spot of the questionnaire (most of its time;
`bench/emd_kernel.py` measures it): on CPU a cache-blocked numba kernel over the upper triangle,
on other devices chunked `torch.cdist`. On a small busy machine, run with
OMP_WAIT_POLICY=PASSIVE in the environment (read when torch is imported): otherwise
torch's idle OpenMP threads spin while the numba threads work, and the kernel can be
several times slower.
"""
from __future__ import annotations

import dataclasses
import math

import numba
import numpy as np
import torch

from ._arrays import all_finite, as_tensor, back
from .sweep import Program, chunk_programs, empty, fetch_add, run_program, splits, whole_program
from .trees import PartitionTree

__all__ = ["pairwise_l1", "tree_features", "tree_emd", "TreeEMD", "emd_affinity"]

# Rows are tiled in blocks of _BLOCK (a multiple of 4: the micro-kernel takes 4 x 2 rows).
_BLOCK = 16
# Columns of one feature strip, on which a thread does all its block pairs while the
# strip is in cache. Long enough that the per-strip reductions of the micro-kernel cost
# little; the best length found for 270 to 2048 rows (`bench/emd_kernel.py` times the kernel).
_STRIP = 1024


# -- CPU kernel ---------------------------------------------------------------------------
@numba.njit(cache=True)
def _l1_plan(m, block):  # pragma: no cover - compiled
    """Row-block pairs of the upper triangle (row block, then column block) and their
    cumulative cost (a diagonal pair costs about half an off-diagonal one)."""
    nb = (m + block - 1) // block
    n_pairs = nb * (nb + 1) // 2
    bi = np.empty(n_pairs, np.int64)
    bj = np.empty(n_pairs, np.int64)
    cost = np.empty(n_pairs + 1, np.float64)
    cost[0] = 0.0
    p = 0
    for a in range(nb):
        for b in range(a, nb):
            bi[p] = a
            bj[p] = b
            cost[p + 1] = cost[p] + (0.5 if a == b else 1.0)
            p += 1
    return bi, bj, cost


@numba.njit(parallel=True, fastmath=True, cache=True)
def _l1_accumulate(F, d, block, strip, rows, bi, bj, lim, bounds, acc, counter):  # pragma: no cover - compiled
    """Add sum |F[r_i, :c] - F[r_j, :c]| of every row pair to the float64 tiles `acc`, where
    r = `rows` (tile position i holds row rows[i]) and c = lim[p] <= d for the pair's
    block pair p (`_l1_ends` says why the columns past it need no differences).

    Rows are tiled in blocks; a task is one strip of `strip` columns and one run of the
    upper-triangle block pairs (`bounds`, of about equal cost), done while the strip is
    in cache. Tasks go strip by strip to whichever thread is free (`fetch_add`), and
    thread w adds into its own tiles acc[w] (summed by the caller): no thread waits for
    a slow one, which matters on a busy machine. Within a strip the sums are float32
    (short, so accurate); they are added to float64 tiles across strips, which keeps the
    result accurate for d in the hundreds of thousands.
    """
    m = F.shape[0]
    n_workers = acc.shape[0]
    n_runs = bounds.size - 1
    n_tasks = ((d + strip - 1) // strip) * n_runs
    for w in numba.prange(n_workers):
        while True:
            task = fetch_add(counter, 0)
            if task >= n_tasks:
                break
            k0 = (task // n_runs) * strip
            run = task % n_runs
            for p in range(bounds[run], bounds[run + 1]):
                if k0 >= lim[p]:
                    continue
                k1 = min(k0 + strip, lim[p])
                i_base = bi[p] * block
                j_base = bj[p] * block
                diag = bi[p] == bj[p]
                tile = acc[w, p]
                # micro-kernel: 4 rows of block I against 2 rows of block J per pass over the
                # strip (6 loads for 8 pairs); rows past m are clamped to m - 1 (computed,
                # never written back), which keeps the inner loop free of branches
                for ii in range(0, block, 4):
                    # strip views indexed from 0: with k >= 0 provable, no negative-index
                    # wraparound is emitted and the loop vectorizes to contiguous loads
                    a0 = F[rows[min(i_base + ii, m - 1)], k0:k1]
                    a1 = F[rows[min(i_base + ii + 1, m - 1)], k0:k1]
                    a2 = F[rows[min(i_base + ii + 2, m - 1)], k0:k1]
                    a3 = F[rows[min(i_base + ii + 3, m - 1)], k0:k1]
                    jj_start = ii if diag else 0
                    for jj in range(jj_start, block, 2):
                        b0 = F[rows[min(j_base + jj, m - 1)], k0:k1]
                        b1 = F[rows[min(j_base + jj + 1, m - 1)], k0:k1]
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


@numba.njit(parallel=True, fastmath=True, cache=True)
def _l1_live(F, d, chunk):  # pragma: no cover - compiled
    """Which of the columns F[:, :d] (finite) are nonzero in some row, a chunk of columns
    per task (the largest magnitude of each column, vectorized)."""
    live = np.zeros(d, np.bool_)
    for c in numba.prange((d + chunk - 1) // chunk):
        k0 = c * chunk
        w = min(d, k0 + chunk) - k0
        top = np.zeros(w, F.dtype)
        for i in range(F.shape[0]):
            part = F[i, k0:k0 + w]
            for k in range(w):
                top[k] = max(top[k], abs(part[k]))
        for k in range(w):
            live[k0 + k] = top[k] > 0
    return live


@numba.njit(parallel=True, cache=True)
def _l1_gather(F, cols, out):  # pragma: no cover - compiled
    """out[i, :len(cols)] = F[i, cols], row by row."""
    for i in numba.prange(F.shape[0]):
        row = F[i]
        dst = out[i]
        for k in range(cols.size):
            dst[k] = row[cols[k]]


@numba.njit(parallel=True, cache=True)
def _l1_ends(F, d, rows):  # pragma: no cover - compiled
    """For tile position i, the end of the nonzero columns of row rows[i] of F: F[rows[i],
    end:d] is all zero.

    Past min(end_i, end_j) one of two rows is zero, so there |F_i - F_j| = |F_i| + |F_j|: the
    pair's distance is its differences up to any c >= min(end_i, end_j) plus both rows'
    sums of magnitudes from c on (`_l1_row_tails`). Causal attention's feature rows are
    zero past a column that moves with the position, so this skips about two thirds of the
    differences (docs/method.md §4.2).
    """
    m = rows.size
    last = np.zeros(m, np.int64)
    for i in numba.prange(m):
        row = F[rows[i]]
        for k in range(d - 1, -1, -1):
            if row[k] != 0:
                last[i] = k + 1
                break
    return last


@numba.njit(parallel=True, fastmath=True, cache=True)
def _l1_row_tails(F, d, rows, group, first, last):  # pragma: no cover - compiled
    """tail[i, t] = sum |F[rows[i], t * group:d]| for t >= first[i] (0 before; the row is zero
    from last[i] on): float32 sums of a group, added in float64."""
    m = rows.size
    n_groups = (d + group - 1) // group
    tail = np.zeros((m, n_groups + 1), np.float64)
    for i in numba.prange(m):
        row = F[rows[i]]
        for t in range((last[i] + group - 1) // group - 1, first[i] - 1, -1):
            k0 = t * group
            part = row[k0:min(last[i], k0 + group)]
            s = np.float32(0.0)  # a short float32 sum (vectorized), added in float64
            for k in range(part.size):
                s += abs(part[k])
            tail[i, t] = tail[i, t + 1] + s
    return tail


@numba.njit(parallel=True, cache=True)
def _l1_tails(tail, starts, bi, bj, m, block, acc):  # pragma: no cover - compiled
    """Add to the tiles acc of every block pair p the tails of both rows of each pair from
    column group starts[p] (`_l1_ends`)."""
    for p in numba.prange(bi.size):
        t = starts[p]
        for ii in range(block):
            i = min(bi[p] * block + ii, m - 1)
            for jj in range(block):
                acc[p, ii, jj] += tail[i, t] + tail[min(bj[p] * block + jj, m - 1), t]


@numba.njit(cache=True)
def _l1_finish(acc, bi, bj, m, block, rows):  # pragma: no cover - compiled
    """The symmetric (m, m) distance matrix from the tiles of all threads, tile position i
    written to row and column rows[i]."""
    out = np.zeros((m, m), np.float64)
    for p in range(bi.size):
        i_base = bi[p] * block
        j_base = bj[p] * block
        for ii in range(min(block, m - i_base)):
            for jj in range(min(block, m - j_base)):
                i = i_base + ii
                j = j_base + jj
                if i < j:
                    v = 0.0
                    for w in range(acc.shape[0]):
                        v += acc[w, p, ii, jj]
                    out[rows[i], rows[j]] = v
                    out[rows[j], rows[i]] = v
    return out


# Tasks per thread and strip that `_L1Sum` aims for (runs of block pairs): enough that the
# last task of a call is short, few enough that each has thousands of pairs' work.
_TASKS_PER_THREAD = 4


# Columns per group of the tails (`_l1_ends`): a pair's differences stop at a multiple.
_TAIL_GROUP = 64


class _L1Sum:
    """Pairwise L1 distances between m rows, summed over blocks of their columns.

    `order` (a permutation of the m rows, default as they are) is the order in which the
    CPU kernel tiles the rows: rows whose features end at about the same column tiled
    together let whole tiles stop early (`_l1_ends`). The result does not depend on it.
    """

    def __init__(self, m: int, device, strip: int | None = None, order=None, compact: bool = False):
        self.m, self.device, self.compact = m, torch.device(device), compact
        self._packed = None
        self.strip = strip or _STRIP
        self.numba = self.device.type == "cpu"
        if self.numba:
            n_workers = numba.get_num_threads()
            self.rows = np.arange(m, dtype=np.int64) if order is None else np.asarray(order, dtype=np.int64)
            self.bi, self.bj, self.cost = _l1_plan(m, _BLOCK)
            self.terms = 0  # |a - b| terms summed (a tile's rows past m included), for benchmarks
            self.acc = np.zeros((n_workers, self.bi.size, _BLOCK, _BLOCK), np.float64)
        else:
            self.out = torch.zeros((m, m), dtype=torch.float64, device=self.device)

    def add(self, F: torch.Tensor, d: int | None = None) -> None:
        """Add the distances over the columns F[:, :d] (F contiguous; not copied)."""
        d = F.shape[1] if d is None else d
        if d == 0:
            return
        if self.numba:
            Fn = np.ascontiguousarray(F.detach().numpy() if isinstance(F, torch.Tensor) else F, dtype=np.float32)
            if self.compact:
                Fn, d = self._pack(Fn, d)
            # per block pair, the columns past which one row of every pair is zero (`_l1_ends`),
            # rounded up to a group of the tails
            last = _l1_ends(Fn, d, self.rows)
            ends = np.maximum.reduceat(last, np.arange(0, self.m, _BLOCK))
            lim = np.minimum(ends[self.bi], ends[self.bj])
            lim = np.minimum(-(-lim // _TAIL_GROUP) * _TAIL_GROUP, d)
            starts = -(-lim // _TAIL_GROUP)
            strip = max(1, min(self.strip, d))
            n_strips = -(-d // strip)
            n_runs = min(self.bi.size, -(-_TASKS_PER_THREAD * self.acc.shape[0] // n_strips))
            # runs of block pairs of about equal cost
            bounds = np.searchsorted(self.cost, np.linspace(0, self.cost[-1], n_runs + 1)[1:-1])
            bounds = np.unique(np.r_[0, bounds, self.bi.size]).astype(np.int64)
            _l1_accumulate(Fn, d, _BLOCK, strip, self.rows, self.bi, self.bj, lim, bounds, self.acc,
                           np.zeros(1, np.int64))
            self.terms += int(np.where(self.bi == self.bj, _BLOCK * (_BLOCK + 1) // 2, _BLOCK * _BLOCK) @ lim)
            # each row's tail from the earliest start of its block's pairs (none where every
            # pair runs to d)
            first = np.full(-(-self.m // _BLOCK), starts.max(), dtype=np.int64)
            np.minimum.at(first, self.bi, starts)
            np.minimum.at(first, self.bj, starts)
            tail = _l1_row_tails(Fn, d, self.rows, _TAIL_GROUP, np.repeat(first, _BLOCK)[:self.m], last)
            _l1_tails(tail, starts, self.bi, self.bj, self.m, _BLOCK, self.acc[0])
        else:
            self.out += _pairwise_l1_torch(F[:, :d])

    def _pack(self, Fn: np.ndarray, d: int) -> tuple[np.ndarray, int]:
        """Fn's columns that are nonzero in some row, packed (a column zero in every row adds
        nothing to any distance), if that drops at least an eighth of them."""
        live = np.flatnonzero(_l1_live(Fn, d, 256))
        if live.size > d - d // 8:
            return Fn, d
        if self._packed is None or self._packed.size < self.m * live.size:
            self._packed = np.empty(self.m * max(live.size, d // 2), dtype=np.float32)
        out = self._packed[:self.m * live.size].reshape(self.m, live.size)
        _l1_gather(Fn, live, out)
        return out, live.size

    def result(self) -> torch.Tensor:
        if self.numba:
            return torch.from_numpy(_l1_finish(self.acc, self.bi, self.bj, self.m, _BLOCK, self.rows))
        return self.out


def _pairwise_l1_numba(F: np.ndarray, strip: int | None = None) -> np.ndarray:
    """The CPU kernel on all of F."""
    total = _L1Sum(F.shape[0], "cpu", strip)
    total.add(F)
    return total.result().numpy()


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
    """L1 distances between the rows of F: the EMD of docs/method.md §4.1 on tree features.

    On CPU this runs a cache-blocked multi-threaded kernel (numba); on other devices,
    chunked `torch.cdist(p=1)`. Either way only float32 partial sums over short feature
    chunks are formed, accumulated in float64.

    Parameters
    ----------
    F : ndarray or torch.Tensor of shape (m, d)
        One row of features per slice (`tree_features`), taken in float32.

    Returns
    -------
    ndarray or torch.Tensor of shape (m, m)
        The distances, float64, symmetric with a zero diagonal; numpy or torch like F, on
        F's device.

    Raises
    ------
    ValueError
        If F is not a 2-D numeric array, has an axis of length 0 or contains NaN or inf.
    """
    t, was_numpy = as_tensor(F, "F", ndim=2, finite=False)
    _check_finite(t, "F")
    return back(_pairwise_l1(t), was_numpy)


def _pairwise_l1(t: torch.Tensor) -> torch.Tensor:
    total = _L1Sum(t.shape[0], t.device)
    total.add(t.contiguous())
    return total.result()


def _check_finite(t: torch.Tensor, name: str) -> None:
    if not all_finite(t):
        raise ValueError(f"{name}: contains NaN or inf")


# -- tree EMD -----------------------------------------------------------------------------
# Bytes of one block of features: the blocks are built, used and dropped one at a time.
_BLOCK_BYTES = 64 << 20


class TreeEMD:
    """Tree EMDs between the slices of one (query, key, head) tensor, over any trees (docs/method.md §4).

    X is checked once; the buffers of the feature blocks are kept from call to call (fresh
    memory can cost more than the sweeps that fill it), so the questionnaire, which asks for
    nine EMDs of one tensor, builds one of these. Calling it,
    ``TreeEMD(X)(axis, trees, alpha, beta)``, gives the (n_slices, n_slices) float64 distance
    matrix of `tree_emd`, always as torch on X's device.

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The tensor, taken in float32 on its device.
    check_finite : bool, default True
        Check X for NaN and inf here; False where the caller has checked it.

    Raises
    ------
    ValueError
        If X is not a 3-D numeric array, has an axis of length 0 or (with `check_finite`)
        contains NaN or inf.
    """

    def __init__(self, X, check_finite: bool = True):
        t, _ = as_tensor(X, "X", ndim=3, finite=False)
        if check_finite:
            _check_finite(t, "X")
        self.X = t.contiguous()
        self._buffers: dict[str, torch.Tensor] = {}
        self._reach = None

    def __call__(self, axis: int, trees, alpha=0.0, beta=1.0) -> torch.Tensor:
        """The tree EMD between the slices of X along `axis`, as torch; see `tree_emd`.

        Parameters
        ----------
        axis : int
            The slices compared: 0 queries, 1 keys, 2 heads.
        trees : pair of PartitionTree
            Trees on the two other axes, in increasing axis order.
        alpha, beta : float or pair of floats, default 0.0 and 1.0
            The folder-weight exponents, for both trees or one per tree.

        Returns
        -------
        torch.Tensor of shape (n_slices, n_slices)
            The distances, float64, symmetric, on X's device.
        """
        axis, trees, al, be = self._check(axis, trees, alpha, beta)
        support = self._support(axis)
        total = _L1Sum(self.X.shape[axis], self.X.device,
                       order=None if support is None else np.argsort(support[0], kind="stable"),
                       compact=axis == 2 and self._has_zeros())
        for block, d in self.blocks(axis, trees, al, be, _BLOCK_BYTES,
                                    item_support=None if support is None else support[1]):
            total.add(block, d)
        return total.result()

    def _support(self, axis: int):
        """For the CPU kernel's order (`_L1Sum`, `_l1_ends`): (per slice, per item of the
        first other axis) the number of items of the other kind they share a nonzero with,
        over queries and keys; None for the heads, or when nothing is zero. In causal
        attention query q reaches the keys up to q and key k the queries from k: sorted
        so, each feature row is zero past a column that grows with the slice."""
        if axis == 2 or not self._has_zeros():
            return None
        by_query, by_key = self._reach
        return (by_query, by_key) if axis == 0 else (by_key, by_query)

    def _has_zeros(self) -> bool:
        """On CPU: whether some (query, key) is zero in every head (`_support`, `_L1Sum`)."""
        if self.X.device.type != "cpu":
            return False
        if self._reach is None:
            reach = _reach(self.X.numpy())
            self._reach = (reach.sum(axis=1), reach.sum(axis=0)) if not reach.all() else ()
        return bool(self._reach)

    def _check(self, axis, trees, alpha, beta):
        axis = _check_axis(axis)
        return axis, _check_trees(trees, self.X.shape, axis), _pair(alpha, "alpha"), _pair(beta, "beta")

    def _buffer(self, name: str, n: int) -> torch.Tensor:
        buf = self._buffers.get(name)
        if buf is None or buf.numel() < n:
            self._buffers.pop(name, None)
            buf = self._buffers[name] = empty((n,), self.X)
        return buf[:n]

    def blocks(self, axis: int, trees, alphas, betas, block_bytes: int | None, item_support=None):
        """The features of the slices along `axis` (`tree_features`), block by block.

        The first d columns of each block are some of the features; together, all of them.
        A block lives until the next one is asked for. With `item_support`, each block's
        folders of trees[0] come by decreasing support (a folder's: its items' largest),
        which costs nothing: the sweeps emit them in that order.

        Folder means are built by sweeps through the trees (`sweep`): every average over a
        folder from the averages over its parts, never a dense membership product. The
        folders of trees[0] are taken a chunk of subtrees at a time (chunks of at most
        ~max_items items, so a block holds about `block_bytes`), the means of the chunks'
        roots kept for the folders above them.

        Parameters
        ----------
        axis : int
            The slices: 0 queries, 1 keys, 2 heads, as checked by the caller.
        trees : pair of PartitionTree
            Trees on the two other axes, in increasing axis order, as checked by the caller.
        alphas, betas : pair of floats
            The folder-weight exponents of trees[0] and trees[1].
        block_bytes : int or None
            About how many bytes one block holds; None for one block, in the column order
            (folder of trees[0], folder of trees[1]).
        item_support : ndarray of shape (n_items,), optional
            A number per item of trees[0]'s axis, by which the folders of each block are
            ordered.

        Yields
        ------
        block : torch.Tensor of shape (n_slices, width)
            Features in X's dtype on its device (the kept buffers: read it before the next).
        d : int
            How many of its first columns are features.
        """
        t = self.X
        ta, tb = trees
        spa, spb = splits(ta), splits(tb)
        wa = ta.folder_weights(alphas[0], betas[0])
        wb = tb.folder_weights(alphas[1], betas[1])
        whole_b = whole_program(spb, spb.folder_node, wb)
        n_m, n_k, f_b = t.shape[axis], t.shape[1], len(wb)
        max_items = ta.n
        if block_bytes is not None:
            per_item = 2 * n_m * f_b * t.element_size()  # a chunk of c items has < 2c folders
            max_items = max(1, min(ta.n, block_bytes // per_item))
        chunks, n_emit, tops = chunk_programs(spa, spa.folder_node, wa, max_items)
        at = np.r_[0, np.cumsum([prog.emit.size - k for prog, k in zip(chunks, n_emit)])]
        c_max = max(p.load.size for p in chunks)
        e_max = max(p.emit.size for p in chunks + tops)
        swept, ws = self._buffer("swept", n_m * c_max * f_b), self._buffer("block", n_m * e_max * f_b)
        roots = self._buffer("roots", n_m * at[-1] * f_b).view(n_m, -1, f_b) if tops else None
        # Each chunk becomes (slice, chunk item, folder of the other tree): means over the
        # other tree's folders first, read straight from X (the kernel picks the chunk's
        # rows, and transposes for heads), then over the chunk's folders along the middle
        # axis. The (slice, folder, folder) result, reshaped, is the block of features,
        # the chunk's roots after them.
        root_support = []
        for i, (prog, k) in enumerate(zip(chunks, n_emit)):
            items, c = prog.load, prog.load.size
            reload = _reload(prog)
            if item_support is not None:
                reload, sup = _by_support(reload, np.asarray(item_support)[items], k)
                root_support.append(sup[k:])
            xb = swept[:n_m * c * f_b].view(n_m, c, f_b)
            if axis == 2:  # heads: X[chunk] swept along keys into (head, chunk item, key folder)
                run_program(t, whole_b, 1, out=xb, rows=items, transposed=True)
            else:  # queries: vectors X[q, chunk item, :]; keys: X[chunk item, k, :]
                rows = (np.arange(n_m)[:, None] * n_k + items[None, :] if axis == 0
                        else items[None, :] * n_k + np.arange(n_m)[:, None])
                run_program(t, whole_b, 2, out=xb, rows=rows.ravel())
            y = run_program(xb, reload, 1, out=ws[:n_m * prog.emit.size * f_b].view(n_m, -1, f_b))
            if roots is not None:
                _copy(roots[:, at[i]:at[i + 1]], y[:, k:])
            yield y.reshape(n_m, -1), k * f_b
        root_support = np.concatenate(root_support) if root_support else None
        for top in tops:
            if item_support is not None:
                top, _ = _by_support(top, root_support[top.load], top.emit.size)
            y = run_program(roots, top, 1, out=ws[:n_m * top.emit.size * f_b].view(n_m, -1, f_b))
            yield y.reshape(n_m, -1), y.shape[1] * f_b


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    # numpy on CPU: torch's strided copies between numba's parallel regions are erratic here
    # (far slower at times, waking its OpenMP threads)
    if dst.device.type == "cpu":
        np.copyto(dst.numpy(), src.numpy())
    else:
        dst.copy_(src)


@numba.njit(parallel=True, cache=True)
def _reach(X):  # pragma: no cover - compiled
    """(query, key) of a (query, key, head) array: is any head nonzero there."""
    n_q, n_k, n_h = X.shape
    out = np.zeros((n_q, n_k), np.bool_)
    for q in numba.prange(n_q):
        for k in range(n_k):
            for h in range(n_h):
                if X[q, k, h] != 0:
                    out[q, k] = True
                    break
    return out


def _by_support(prog: Program, load_support: np.ndarray, k: int) -> tuple[Program, np.ndarray]:
    """`prog` with its first k emitted nodes by decreasing support (stable), and the support
    of every node it emits, in the new order; a node's support is the largest of its loaded
    rows' (`load_support`)."""
    n_load = prog.load.size
    sup = np.empty(n_load + prog.left.size, dtype=np.float64)
    sup[:n_load] = load_support
    for k0, k1 in zip(prog.steps[:-1], prog.steps[1:]):  # parts come at lower heights
        sup[n_load + k0:n_load + k1] = np.maximum(sup[prog.left[k0:k1]], sup[prog.right[k0:k1]])
    first = np.argsort(-sup[prog.emit[:k]], kind="stable")
    perm = np.r_[first, np.arange(k, prog.emit.size)]
    emit = prog.emit[perm]
    return dataclasses.replace(prog, emit=emit, weight=prog.weight[perm]), sup[emit]


def _reload(prog: Program) -> Program:
    """The program reading its items from rows 0..len-1 (a gathered chunk) instead."""
    return Program(np.arange(prog.load.size), prog.left, prog.right, prog.wl, prog.wr, prog.steps,
                   prog.emit, prog.weight)


def tree_features(X, axis: int, trees, alpha: float = 0.0, beta: float = 1.0) -> torch.Tensor:
    """Tree EMD feature vector of every slice of X along `axis` (docs/method.md §4.1), as torch.

    Row s of the result holds w(A) w(B) mean(X_s[A, B]) over every pair of distinct folders
    (A in trees[0], B in trees[1]); a folder that repeats over k levels (single child)
    carries the sum of its k level weights, so the L1 distance between rows equals the L1
    over all (level, folder) pairs of docs/method.md §4.1. `tree_emd` never holds this
    matrix; this is its reference.

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The tensor, float (taken in float32).
    axis : int
        The slices: 0 queries, 1 keys, 2 heads.
    trees : pair of PartitionTree
        Trees on the two other axes, in increasing axis order.
    alpha, beta : float or pair of floats, default 0.0 and 1.0
        The folder-weight exponents (`tree_emd`), for both trees or one per tree.

    Returns
    -------
    torch.Tensor of shape (n_slices, F_a * F_b)
        float32 on X's device; F_a and F_b are the numbers of distinct folders of trees[0]
        and trees[1], in the column order (folder of trees[0], folder of trees[1]).

    Raises
    ------
    ValueError
        If X is not a finite 3-D numeric array, `axis` is not 0, 1 or 2, `trees` is not a pair
        of PartitionTree of the lengths of the other axes, or an exponent is not a finite number.
    """
    emd = TreeEMD(X)
    axis, trees, al, be = emd._check(axis, trees, alpha, beta)
    block, d = next(emd.blocks(axis, trees, al, be, None))
    return block[:, :d]


def tree_emd(X, axis: int, trees, alpha: float = 0.0, beta: float = 1.0):
    """Tree EMD between the slices of a (query, key, head) tensor along `axis` (docs/method.md §4).

    Folder weights are w(F) = (|F| / n)^beta * 2^((1 - level(F)) * alpha), root level 1.
    The features (`tree_features`) are built and consumed block by block: memory stays
    at about the size of X plus a few blocks, whatever the number of folders. For many
    EMDs of one tensor, `TreeEMD` keeps its buffers.

    Parameters
    ----------
    X : ndarray or torch.Tensor of shape (n_query, n_key, n_head)
        The tensor, float (taken in float32).
    axis : int
        The slices compared: 2 heads, X[:, :, h]; 0 queries; 1 keys.
    trees : pair of PartitionTree
        (tree on the first remaining axis, tree on the second), in increasing axis order,
        e.g. (T_Q, T_K) for axis=2.
    alpha, beta : float or pair of floats, default 0.0 and 1.0
        The folder-weight exponents: numbers, or pairs giving each tree its own exponent.

    Returns
    -------
    ndarray or torch.Tensor of shape (n_slices, n_slices)
        The distances, float64, symmetric; numpy or torch like X.

    Raises
    ------
    ValueError
        If X is not a finite 3-D numeric array, `axis` is not 0, 1 or 2, `trees` is not a pair
        of PartitionTree of the lengths of the other axes, or an exponent is not a finite number.
    """
    return back(TreeEMD(X)(axis, trees, alpha, beta), not isinstance(X, torch.Tensor))


def emd_affinity(D, eps: float = 1.0):
    """Gaussian affinity G = exp(-D / (eps * median(D))) between slices (docs/method.md §4.3).

    The median is over all n^2 entries of D (diagonal included, the mean of the two middle
    values when n^2 is even, as numpy's). Degenerate scales never divide by zero: if the
    median is 0 (more than half of the pairs are identical slices), the mean of the
    nonzero entries is used instead; if D is all zeros (every slice the same), G is all
    ones.

    Parameters
    ----------
    D : ndarray or torch.Tensor of shape (n, n)
        Nonnegative distances between n slices (`tree_emd`).
    eps : float, default 1.0
        The scale, in medians of D, positive.

    Returns
    -------
    G : ndarray or torch.Tensor of shape (n, n)
        float64 in (0, 1] (entries far beyond the scale may underflow to 0), with ones on the
        diagonal; numpy or torch like D.

    Raises
    ------
    ValueError
        If D is not a square numeric matrix, contains NaN or inf or has negative entries, or
        `eps` is not a positive number.
    """
    d, was_numpy = as_tensor(D, "D", ndim=2, dtype=torch.float64)
    if d.shape[0] != d.shape[1]:
        raise ValueError(f"D: expected a square distance matrix, got shape {tuple(d.shape)}")
    if bool((d < 0).any()):
        raise ValueError(f"D: distances must be nonnegative (min {float(d.min()):.3g})")
    eps = _check_real(eps, "eps")
    if eps <= 0:
        raise ValueError(f"eps: must be positive, got {eps}")
    scale = _median(d.reshape(-1))
    if scale == 0.0:
        flat = torch.sort(d.reshape(-1)).values  # sorted: the mean below sums in a fixed order
        nonzero = flat[flat > 0]
        if nonzero.numel() == 0:
            return back(torch.ones_like(d), was_numpy)
        scale = float(nonzero.mean())
    return back(torch.exp(-d / (eps * scale)), was_numpy)


def _median(flat: torch.Tensor) -> float:
    """numpy's median of a 1-D tensor (the mean of the two middle values for an even count):
    two order statistics by selection, not a sort, which is much cheaper on CPU."""
    n = flat.numel()
    lo, hi = (n - 1) // 2, n // 2
    if flat.device.type == "cpu":
        part = np.partition(flat.numpy(), [lo, hi])
        return float((part[lo] + part[hi]) / 2)
    return float((torch.kthvalue(flat, lo + 1).values + torch.kthvalue(flat, hi + 1).values) / 2)


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
