"""Paraproduct decomposition of the softmax of an organized head (docs/method.md §7, Theorem 1).

The head f (N x M, rows = queries) is averaged over the dyadic rectangles of the
balanced binary trees (docs/method.md §2.5) of its organized row and column axes:
E_{j,j'} f = P_j f Q_{j'}^T expanded back to N x M, with P_j, Q_{j'} the row-normalised
membership matrices of the folders at levels j and j'. The levels of the two trees
need not match (J_r = ceil(log2 N), J_c = ceil(log2 M) refinements down to single
entries), and N, M need not be powers of two: nothing is cropped.

With A = exp and g_{j,j'} = exp(E_{j,j'} f), exp(f) telescopes exactly into g_{0,0},
the one-dimensional differences along each axis and the mixed differences
g_{j+1,j'+1} - g_{j,j'+1} - g_{j+1,j'} + g_{j,j'}. The paraproduct keeps the
first-order term of every one-dimensional difference and the terms
exp(E f) * (D f + Dx f * Dy f) of every mixed one (A' = A'' = exp). Softmax is the
row normalisation of exp(f) by its exact row sums, a linear map applied to every term.
`approximations` gives, from the same block averages and in the same pass over the level pairs,
the paraproduct without its cross terms, the paper's Corollary 1 and its Taylor variant
(docs/method.md §7.7), each divided by the exact row sums and by its own, and uniform attention.

Numerical range. The decomposition is pointwise: all the terms at entry (i, k) may be
multiplied by one factor of that entry without changing the identity, but f itself may
be shifted before the block averages only by a constant on every block of every level
used, i.e. by a global constant, since E_{j,j'}(f - c) = E_{j,j'} f - c needs exactly
that. So the range is controlled by factors on the terms, never by editing f. Row i's
terms are multiplied by exp(-s_i), s_i the largest exponent E_{j,j'} f[i, k] among all
the terms of the row (every scale pair, every column). Block averages mix rows, so s_i
can exceed the row maximum m_i by the spread between rows; with this factor every
exponential is at most 1 whatever that spread, so nothing overflows inside the sum
(terms below exp(-745) times the largest underflow to 0, far below its rounding). The
softmax approximation is then the sum times exp(s_i - m_i) / Z_i, with
Z_i = sum_k exp(f[i, k] - m_i), applied in log form so that a representable result
never overflows on the way. The result itself can be too large for float64: with half
the rows near +800 and half near -800 the coarse averages are near 0, and for a -800 row
the approximation of the softmax is of order 800 exp(800) / M, about 10^349 (checked in
50-digit arithmetic). `paraproduct` then raises a ValueError naming f rather than
returning inf or nan.

The exact telescoping sum has a different limit. Its terms can exceed the value they
add up to by exp(s_i - f[i, k]): up to exp(1600) for rows at +-800, beyond float64's
whole range (about exp(1454)). Added as floats they leave an absolute error of about
1e-16 times the largest term: 0.4 on values <= 1 for rows at +-400, and 6e8
for a 64 x 64 head with rows at +-40 in random order plus noise 8. No factor or order
of summation avoids this, because the largest terms really are that large. But the sum
is a linear combination of the g_{j,j'} with integer coefficients, so `telescoping_sum`
first adds up, in exact integer arithmetic, the coefficients that the terms of docs/method.md §7.2
(g_{0,0}, the one-dimensional and the mixed differences) give each g_{j,j'}, and only
then evaluates the g_{j,j'} that keep a nonzero coefficient. The result is exact for any
finite input; what it checks is the bookkeeping of the terms (a wrong sign or index
leaves a coarser g_{j,j'} in the sum) and the block averages where the sum ends.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple
from functools import lru_cache

import numpy as np
import torch

from ._arrays import as_tensor, back
from .trees import balanced_tree

__all__ = ["APPROXIMATIONS", "Approximations", "Paraproduct", "ROW_SUM_FLOOR", "approximations", "block_averages",
           "check_order", "paraproduct", "relative_residuals", "telescoping_sum"]


@dataclass(frozen=True, eq=False)
class Paraproduct:
    """The paraproduct decomposition of softmax(organized head) (docs/method.md §7).

    What `paraproduct` returns.

    Attributes
    ----------
    organized : ndarray or Tensor of shape (N, M)
        ``f[row_order][:, col_order]``.
    exact : ndarray or Tensor of shape (N, M)
        Its row softmax.
    approximation : ndarray or Tensor of shape (N, M)
        The paraproduct approximation of the softmax.
    residual : ndarray or Tensor of shape (N, M)
        exact - approximation.
    relative_residual : float
        ||residual||_F / ||exact||_F.
    row_order, col_order : ndarray of int64, shape (N,) and (M,)
        The permutations used.
    n_scales : tuple of int
        (J_r, J_c), the number of dyadic refinements used on the row and the column axis.
    """

    organized: np.ndarray | torch.Tensor
    exact: np.ndarray | torch.Tensor
    approximation: np.ndarray | torch.Tensor
    residual: np.ndarray | torch.Tensor
    relative_residual: float
    row_order: np.ndarray
    col_order: np.ndarray
    n_scales: tuple[int, int]


# -- block averages on the balanced trees ---------------------------------------------
@lru_cache(maxsize=32)
def _tree_labels(n: int) -> np.ndarray:
    """Folder labels (levels, n) of the balanced binary tree of 0..n-1, root first."""
    return balanced_tree(np.arange(n)).labels


def _depth(n: int) -> int:
    return _tree_labels(n).shape[0] - 1


class _Axis:
    """The balanced binary tree of 0..n-1 down to level `depth` (root = level 0), as the
    folder label of every item per level and the parent folder of every folder."""

    def __init__(self, n: int, depth: int, device):
        lab = np.array(_tree_labels(n)[:depth + 1])
        self.depth = depth
        self.counts = (lab.max(1) + 1).tolist()
        self.offsets = np.concatenate([[0], np.cumsum(self.counts)[:-1]]).tolist()
        self.labels = [torch.as_tensor(row, device=device) for row in lab]
        parents = [np.zeros(0, dtype=np.int64)]
        for level in range(1, depth + 1):
            par = np.empty(self.counts[level], dtype=np.int64)
            par[lab[level]] = lab[level - 1]
            parents.append(par)
        self.parents = [torch.as_tensor(par, device=device) for par in parents]
        self.sizes = torch.as_tensor(np.concatenate([np.bincount(row) for row in lab]), device=device)

    def sums(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """Sums of x over the folders of every level along `dim`, levels 0..depth one after
        the other: the finest from the items, each coarser one from the level below."""
        def zeros(level, like):
            shape = list(like.shape)
            shape[dim] = self.counts[level]
            return like.new_zeros(shape)

        out = [zeros(self.depth, x).index_add_(dim, self.labels[self.depth], x)]
        for level in range(self.depth - 1, -1, -1):
            out.append(zeros(level, out[-1]).index_add_(dim, self.parents[level + 1], out[-1]))
        return torch.cat(out[::-1], dim=dim)

    def span(self, level: int) -> slice:
        return slice(self.offsets[level], self.offsets[level] + self.counts[level])


class _Blocks:
    """The block means of f on every pair of levels (j <= jr, j' <= jc) of the balanced
    row and column trees, one value per pair of folders (the compact form of E_{j,j'} f)."""

    def __init__(self, f: torch.Tensor, jr: int, jc: int):
        n, m = f.shape
        self.rows, self.cols = _Axis(n, jr, f.device), _Axis(m, jc, f.device)
        sums = self.rows.sums(self.cols.sums(f, 1), 0)
        size = self.rows.sizes.to(f.dtype)[:, None] * self.cols.sizes.to(f.dtype)[None, :]
        self.compact = sums / size

    def block(self, a: int, b: int) -> torch.Tensor:
        """E_{a,b} f per pair of folders: (row folders at level a, column folders at level b)."""
        return self.compact[self.rows.span(a), self.cols.span(b)]

    def expanded(self, a: int, b: int) -> torch.Tensor:
        """E_{a,b} f, N x M."""
        return self.block(a, b)[self.rows.labels[a]][:, self.cols.labels[b]]


def _approximation(blocks: _Blocks, tau: float = 1.0, variants: bool = False):
    """Paraproduct approximation of exp(tau f), row i scaled by exp(-s_i); returns (sum, s), and
    with `variants` (sum, sum without the cross terms, cross, s).

    Every term exp(E_{j,j'} f) of row i is multiplied by exp(-s_i), s_i the largest
    exponent among the row's terms (see the module docstring), so no exponential exceeds 1
    and the sum is diag(exp(-s)) times the approximation of exp(f).

    Each term is constant on the blocks of one pair of levels: the mixed term of (j, j')
    and the one-dimensional ones ending there live on the folders of levels (j + 1, j' + 1).
    So every term is computed once per pair of folders, and the sum is expanded level by
    level: along the columns from each level to the next finer one, then along the rows.
    The row factor is applied per row folder, sigma = the largest exponent of the folder
    and its ancestors, and corrected by exp(sigma(parent) - sigma(child)) <= 1 on the way
    down, which ends at exp(-s_i) on every row. Work: about 4 N M entries in all (a dense
    sum over every scale pair is N M (J_r + 1)(J_c + 1)).

    `tau` a float gives (N, M) and (N,); a 1-D tensor of T temperatures gives (T, N, M) and
    (T, N), each temperature's the same numbers as alone: the loop over the level pairs is
    run once for all of them.

    `variants`: in the same pass, the approximation with every mixed term exp(E f) D instead of
    exp(E f)(D + Dx Dy) (the cross terms dropped; scaled and expanded as the sum), and
    sum_{j,j'} Dx_{j,j'} f * Dy_{j,j'} f itself, unscaled (docs/method.md §7.7).
    """
    rows, cols = blocks.rows, blocks.cols
    jr, jc = rows.depth, cols.depth
    single = not isinstance(tau, torch.Tensor)
    t = torch.as_tensor([tau] if single else tau, dtype=blocks.compact.dtype, device=blocks.compact.device)

    # one temperature: every block mean scaled at once (as many entries as the block means);
    # several: each block when used, so that no T-fold copy of all of them is held
    whole = t[:, None, None] * blocks.compact if single else None

    def e(a, b):
        if whole is not None:
            return whole[:, rows.span(a), cols.span(b)]
        return t[:, None, None] * blocks.block(a, b)

    per_folder = t[:, None] * blocks.compact.amax(1)  # tau > 0: the largest exponent of each row folder
    sigma = [per_folder[:, rows.span(0)]]
    for a in range(1, jr + 1):
        sigma.append(torch.maximum(sigma[a - 1][:, rows.parents[a]], per_folder[:, rows.span(a)]))

    def term(a, b):
        """(the term living on the folders of levels (a, b), times exp(-sigma); the same
        without its cross term; the cross term Dx Dy alone, unscaled, or None where a or b is 0)"""
        s = sigma[a][:, :, None]
        if a == 0 and b == 0:
            g = torch.exp(e(0, 0) - s)
            return g, g, None
        if a == 0:
            e0 = e(0, b - 1)[:, :, cols.parents[b]]
            g = torch.exp(e0 - s) * (e(0, b) - e0)
            return g, g, None
        pr = rows.parents[a]
        if b == 0:
            e0 = e(a - 1, 0)[:, pr]
            g = torch.exp(e0 - s) * (e(a, 0) - e0)
            return g, g, None
        pc = cols.parents[b]
        e01 = e(a - 1, b)[:, pr]                  # E_{j, j'+1}, with j = a - 1, j' = b - 1
        e00 = e(a - 1, b - 1)[:, pr][:, :, pc]    # E_{j, j'}
        dx0 = e(a, b - 1)[:, :, pc] - e00         # Dx_{j, j'}
        dx1 = e(a, b) - e01                       # Dx_{j, j'+1}
        g = torch.exp(e00 - s)
        # D + Dx Dy = Dx_{j,j'+1} - Dx_{j,j'} + Dx_{j,j'} Dy_{j,j'}
        full = g * (dx1 + dx0 * ((e01 - e00) - 1.0))
        if not variants:
            return full, None, None
        # D alone, and Dx Dy alone
        return full, g * (dx1 - dx0), dx0 * (e01 - e00)

    total = nocross = cross = None
    for a in range(jr + 1):
        acc, acc_nc, acc_x = term(a, 0)
        for b in range(1, jc + 1):
            pc = cols.parents[b]
            full, nc, x = term(a, b)
            acc = acc[:, :, pc] + full
            if variants:
                acc_nc = acc_nc[:, :, pc] + nc
                acc_x = x if acc_x is None else acc_x[:, :, pc] + x   # x is a tensor: a >= 1, b >= 1
        if total is None:
            total, nocross, cross = acc, acc_nc, acc_x
        else:
            pr = rows.parents[a]
            factor = torch.exp(sigma[a - 1][:, pr] - sigma[a])[:, :, None]
            total = total[:, pr] * factor + acc
            if variants:
                nocross = nocross[:, pr] * factor + acc_nc
                cross = acc_x if cross is None else cross[:, pr] + acc_x

    def entries(t):
        return t[:, rows.labels[jr]][:, :, cols.labels[jc]]

    out = [entries(total)]
    if variants:
        out += [entries(nocross), torch.zeros_like(out[0]) if cross is None else entries(cross)]
    out.append(sigma[jr][:, rows.labels[jr]])
    return tuple(o[0] for o in out) if single else tuple(out)


def _telescoping_coefficients(jr: int, jc: int) -> np.ndarray:
    """Integer coefficient of each g_{j,j'} in the exact telescoping sum, term by term."""
    c = np.zeros((jr + 1, jc + 1), dtype=np.int64)
    c[0, 0] += 1                               # g_{0,0}
    c[1:, 0] += 1                              # g_{j+1,0} - g_{j,0}
    c[:-1, 0] -= 1
    c[0, 1:] += 1                              # g_{0,j'+1} - g_{0,j'}
    c[0, :-1] -= 1
    c[1:, 1:] += 1                             # g_{j+1,j'+1} - g_{j,j'+1} - g_{j+1,j'} + g_{j,j'}
    c[:-1, 1:] -= 1
    c[1:, :-1] -= 1
    c[:-1, :-1] += 1
    return c


def _not_representable(what: str, row: int, log10_size: float, spread: float) -> ValueError:
    return ValueError(
        f"f: {what} is not representable in float64 (about 10^{log10_size:.0f} in row {row}): "
        f"block averages exceed that row's maximum by {spread:.4g}, because coarse blocks "
        "mix rows far apart in level; scale f down or decompose rows of similar level")


# -- validation -------------------------------------------------------------------------
def check_order(order, n: int, name: str) -> np.ndarray:
    """`order` as an int64 permutation of 0..n-1 (None: the identity); ValueError naming `name`.

    Parameters
    ----------
    order : array_like or Tensor of int, shape (n,), or None
        The permutation; float entries are accepted where they are finite whole numbers, bool
        ones never. None: the identity.
    n : int
        The length of the axis permuted.
    name : str
        The argument's name, for the error message.

    Returns
    -------
    ndarray of int64, shape (n,)
        The permutation.

    Raises
    ------
    ValueError
        Naming `name` when `order` is not 1-D of length n, not of integer values, or not a
        permutation of 0..n-1.
    """
    if order is None:
        return np.arange(n)
    if isinstance(order, torch.Tensor):
        order = order.detach().cpu().numpy()
    arr = np.asarray(order)
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name}: expected a permutation of length {n}, got shape {arr.shape}")
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer)
                                 or (np.issubdtype(arr.dtype, np.floating)
                                     and np.all(np.isfinite(arr)) and np.all(arr == np.round(arr)))):
        raise ValueError(f"{name}: expected integer indices, got dtype {arr.dtype}")
    arr = arr.astype(np.int64)
    if not np.array_equal(np.sort(arr), np.arange(n)):
        raise ValueError(f"{name}: not a permutation of 0..{n - 1}")
    return arr


def _check_allowed(allowed, shape: tuple[int, int], device) -> torch.Tensor | None:
    if allowed is None:
        return None
    a = torch.as_tensor(np.asarray(allowed) if not isinstance(allowed, torch.Tensor) else allowed, device=device)
    if a.dtype != torch.bool:
        raise ValueError(f"allowed: expected a boolean mask, got dtype {a.dtype}")
    if tuple(a.shape) != shape:
        raise ValueError(f"allowed: expected the shape of f {shape}, got {tuple(a.shape)}")
    return a


def _check_scales(n_scales, n: int, m: int) -> tuple[int, int]:
    full = (_depth(n), _depth(m))
    if n_scales is None:
        return full
    pair = tuple(n_scales) if isinstance(n_scales, (tuple, list)) else (n_scales, n_scales)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0
                             for v in pair):
        raise ValueError("n_scales: expected None, a nonnegative integer or a pair of them, "
                         f"got {n_scales!r}")
    return min(int(pair[0]), full[0]), min(int(pair[1]), full[1])


def _norm(t: torch.Tensor) -> float:
    """Frobenius norm without overflow in the squares (entries up to float64's maximum)."""
    big = float(t.abs().max())
    if big == 0.0 or not np.isfinite(big):
        return big
    return big * float(torch.linalg.norm(t / big))


# -- public API -------------------------------------------------------------------------
def block_averages(f, row_level: int, col_level: int):
    """E_{j,j'} f (docs/method.md §7.1): f averaged over the dyadic rectangles of levels (j, j').

    f is averaged over the folders of level j of the row tree times level j' of the column tree
    (balanced binary trees on f's own order).

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        The head; computed in float64 on its device.
    row_level : int
        j, a level of the row tree: 0 (the root) to its depth, J_r = ceil(log2 N).
    col_level : int
        j', a level of the column tree: 0 (the root) to its depth, J_c = ceil(log2 M).

    Returns
    -------
    array or Tensor of float64, shape (N, M)
        E_{j,j'} f expanded back to N x M, numpy or torch like f.

    Raises
    ------
    ValueError
        Naming f when it is not 2-D, has an axis of length 0 or NaN/inf entries; naming
        row_level or col_level when it is not an integer between 0 and the tree's depth.
    """
    x, was_numpy = as_tensor(f, "f", ndim=2, dtype=torch.float64)
    n, m = x.shape
    for name, lev, size in (("row_level", row_level, n), ("col_level", col_level, m)):
        if isinstance(lev, bool) or not isinstance(lev, (int, np.integer)) \
                or not 0 <= lev <= _depth(size):
            raise ValueError(f"{name}: expected an integer in 0..{_depth(size)}, got {lev!r}")
    return back(_Blocks(x, int(row_level), int(col_level)).expanded(int(row_level), int(col_level)), was_numpy)


def telescoping_sum(f, n_scales=None):
    """The exact telescoping reconstruction of exp(f - rowmax(f)) (docs/method.md §7.2).

    f is taken as already organized. The sum of g_{0,0}, all one-dimensional and all
    mixed differences up to scales n_scales = (J_r, J_c) (default: down to single
    entries) equals exp(E_{J_r,J_c} f - rowmax(f)); with the default it is
    exp(f - rowmax(f)). Like terms are combined before any g_{j,j'} is evaluated, which
    makes the sum exact for any finite f (see the module docstring); every term of row i
    carries the factor exp(-rowmax_i).

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        The organized head; computed in float64 on its device.
    n_scales : int or tuple of (int, int), optional
        (J_r, J_c), the number of dyadic refinements on the row and the column axis, or one
        integer for both (capped at the trees' depths); None: down to single entries.

    Returns
    -------
    array or Tensor of float64, shape (N, M)
        The telescoping sum, numpy or torch like f.

    Raises
    ------
    ValueError
        Naming f when it is not 2-D, has an axis of length 0 or NaN/inf entries, or when the
        result is not representable (possible only for truncated scales, whose block averages
        can exceed the row maximum); naming n_scales when it is not None, a nonnegative integer
        or a pair of them.
    """
    x, was_numpy = as_tensor(f, "f", ndim=2, dtype=torch.float64)
    jr, jc = _check_scales(n_scales, *x.shape)
    coef = _telescoping_coefficients(jr, jc)
    blocks = _Blocks(x, jr, jc)
    rowmax = x.amax(1, keepdim=True)
    out = torch.zeros_like(x)
    for j, k in zip(*np.nonzero(coef)):
        out += float(coef[j, k]) * torch.exp(blocks.expanded(int(j), int(k)) - rowmax)
    if not bool(torch.isfinite(out).all()):
        row = int((~torch.isfinite(out)).any(1).nonzero()[0, 0])
        spread = float(blocks.expanded(jr, jc)[row].amax() - rowmax[row, 0])
        raise _not_representable("the truncated telescoping sum", row, spread / np.log(10), spread)
    return back(out, was_numpy)


def paraproduct(f, row_order=None, col_order=None, n_scales=None, allowed=None) -> Paraproduct:
    """Paraproduct approximation of softmax of an organized head (docs/method.md §7.3, Theorem 1).

    With fewer scales (`n_scales`) the residual includes the finer detail.

    The decomposition is done on A = exp, pointwise, where Theorem 1 applies: exact
    telescoping into g_{0,0} + one-dimensional + mixed differences of
    g_{j,j'} = exp(E_{j,j'} f); approximation = g_{0,0} + exp(E_{j,0} f)(E_{j+1,0} f -
    E_{j,0} f) + exp(E_{0,j'} f)(E_{0,j'+1} f - E_{0,j'} f) + sum over (j, j') of
    exp(E_{j,j'} f)(D f + Dx f * Dy f). For numerical range every term of row i is
    multiplied by exp(-s_i), s_i the largest exponent among the row's terms (one factor
    per row, so the decomposition is unchanged up to that row scaling; a shift of f
    before the block averages would instead change the function being decomposed), and
    the result is scaled back in log form (module docstring). Hence the approximation
    does not change when a constant is added to f, but it does change under a per-row
    shift of f (coarse block averages mix rows), although softmax(f) does not.

    Softmax approximation: the approximation of exp(f), each row divided by the exact
    row sum Z_i = sum_k exp(f[i, k]). Reason: softmax(f) = diag(1/Z) exp(f) with Z a
    fixed per-row number of the exact head, so applying this linear map to every term
    decomposes softmax(f) itself term by term (the exact terms still telescope to
    softmax(f)), and the softmax residual is exactly the exp residual with row i
    divided by Z_i. Renormalising the approximation by its own row sums would be a
    nonlinear step outside the decomposition, hiding part of the residual in the
    normaliser (and dividing by a sum that can be near zero or negative). As a
    consequence the rows of `approximation` need not sum exactly to 1. `approximations`
    gives the self-normalised one beside it (docs/method.md §7.5).

    Masked (causal, sliding-window) heads: the reference is then the model's masked softmax,
    never a softmax over positions the model cannot see: the masked softmax is the
    linear map "zero the masked entries, divide row i by its masked sum Z_i" applied to
    exp(f), so it is applied to every term of the same pointwise decomposition of exp(f)
    (whose block averages see f at every position: the pre-mask scores). `exact` is the
    masked softmax, `approximation` is zero at masked entries, and a row with no allowed
    entry is zero in both.

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        The head, rows = queries (pre-softmax scores); any N, M >= 1. Computed in float64
        whatever the input precision.
    row_order, col_order : int array of shape (N,) and (M,), optional
        Permutations organizing the axes (e.g. from the 2D questionnaire, docs/method.md §5.3);
        None means identity, i.e. f is already organized.
    n_scales : int or tuple of (int, int), optional
        An integer, or a (rows, cols) pair, limiting the number of dyadic refinements; None:
        all scales, down to single entries.
    allowed : bool array of shape (N, M), optional
        The model's mask in f's own order, False where the model may not attend; None: no mask.

    Returns
    -------
    Paraproduct
        numpy arrays for numpy input and torch tensors on the input's device for torch input,
        all float64; row_order and col_order are numpy int64 arrays.

    Raises
    ------
    ValueError
        Naming f when the approximation of the softmax is too large for float64 (rows hundreds
        apart in level; the module docstring has an example), or when f is not 2-D, has an axis
        of length 0 or NaN/inf entries; naming row_order, col_order, n_scales or allowed when
        they are not valid.
    """
    x, was_numpy = as_tensor(f, "f", ndim=2, dtype=torch.float64)
    organized, mask, blocks, r, c = _prepare(x, row_order, col_order, n_scales, allowed)
    exact, approximation, residual, rel = _softmax_parts(organized, mask, blocks)
    return Paraproduct(organized=back(organized, was_numpy), exact=back(exact, was_numpy),
                       approximation=back(approximation, was_numpy),
                       residual=back(residual, was_numpy), relative_residual=rel,
                       row_order=r, col_order=c, n_scales=(blocks.rows.depth, blocks.cols.depth))


ROW_SUM_FLOOR = 1e-12
"""A self-normalised approximation is undefined on a row whose own sum over the allowed entries is
at most this fraction of the sum of their absolute values: below the rounding error of a float64
sum of up to about 10^4 terms, so a sum that vanishes in exact arithmetic is not divided by."""

APPROXIMATIONS = ("paraproduct", "paraproduct_nocross", "corollary1", "corollary1_nocross", "taylor", "taylor_nocross")
"""The approximations of exp(f) that `approximations` compares with the softmax, in its order
(docs/method.md §7.3, §7.7): the paraproduct, and without its cross terms; the paper's Corollary 1,
sum_{j,j'} (D + Dx Dy), and sum D alone; its Taylor variant 1 + (f - mu) + sum Dx Dy, and
1 + (f - mu)."""


@dataclass(frozen=True, eq=False)
class Approximations:
    """The approximations of softmax(organized head) of `APPROXIMATIONS`, and uniform attention.

    Each approximation divided by the exact row sums and by its own, and uniform attention
    (docs/method.md §7.5, §7.7): what `approximations` returns.

    Attributes
    ----------
    names : tuple of str
        `APPROXIMATIONS`, the order of the leading axis K of the stacked arrays.
    organized : ndarray or Tensor of shape (N, M)
        ``f[row_order][:, col_order]``.
    allowed : ndarray or Tensor of bool, shape (N, M), or None
        The mask in the organized order (None: no mask).
    exact : ndarray or Tensor of shape (N, M)
        The (masked) row softmax of `organized`.
    true_z : ndarray or Tensor of shape (K, N, M)
        Each approximation of exp(f) divided by the exact row sums Z_i and zero at masked
        entries (§7.5); not finite where float64 cannot hold it (§7.4).
    selfnorm : ndarray or Tensor of shape (K, N, M)
        Each approximation divided by its own row sums over the allowed entries, zero at masked
        entries; zero on a row where that sum is not finite and > 0, i.e. not finite or at most
        `ROW_SUM_FLOOR` times the sum of the absolute values: undefined there, the approximation
        attends nowhere in that row and its error is the row of `exact`. A row with no allowed
        entry is zero, as in `exact`.
    uniform : ndarray or Tensor of shape (N, M)
        Uniform attention: 1/n_i on the n_i allowed entries of row i, 0 elsewhere.
    residual, selfnorm_residual : ndarray of shape (K,)
        ||exact - approximation||_F / ||exact||_F of `true_z` and of `selfnorm`; +inf where the
        approximation has an entry that is not finite (beyond float64), NaN where `exact` is zero
        (no allowed entry at all).
    uniform_residual : float
        The same of `uniform`.
    representable : ndarray of bool, shape (K,)
        Whether float64 holds each `true_z` (all its entries finite).
    mean : float
        mu, the mean of f over all entries (masked ones included), where Corollary 1 and its
        Taylor variant take A' = A'' = 1.
    row_order, col_order : ndarray of int64, shape (N,) and (M,)
        The permutations used.
    """

    names: tuple[str, ...]
    organized: np.ndarray | torch.Tensor
    allowed: np.ndarray | torch.Tensor | None
    exact: np.ndarray | torch.Tensor
    true_z: np.ndarray | torch.Tensor
    selfnorm: np.ndarray | torch.Tensor
    uniform: np.ndarray | torch.Tensor
    residual: np.ndarray
    selfnorm_residual: np.ndarray
    uniform_residual: float
    representable: np.ndarray
    mean: float
    row_order: np.ndarray
    col_order: np.ndarray


def approximations(f, row_order=None, col_order=None, allowed=None) -> Approximations:
    """The paraproduct, Corollary 1 and its Taylor variant against softmax of one head.

    Each with and without the cross terms, and uniform attention, against softmax of one head
    (docs/method.md §7.5, §7.7), from one set of block averages and one pass over the level pairs.

    With D, Dx, Dy the differences of block averages of docs/method.md §7.3 and mu the mean of f,
    the approximations of exp(f) (`APPROXIMATIONS`) are

    - paraproduct: §7.3 (A' = A'' = exp); paraproduct_nocross: the same with every mixed term
      exp(E_{j,j'} f) D_{j,j'} f, the cross terms exp(E f) Dx Dy dropped;
    - corollary1: exp(mu) sum_{j,j'} (D_{j,j'} f + Dx_{j,j'} f * Dy_{j,j'} f), the paper's eq. 18
      with A' = A'' = 1; corollary1_nocross: exp(mu) sum_{j,j'} D_{j,j'} f. The sum of the D
      telescopes to the double-centred f, f - row means - column means + mu, which is how it is
      computed;
    - taylor: exp(mu) (1 + (f - mu) + sum_{j,j'} Dx Dy); taylor_nocross: exp(mu) (1 + (f - mu)),
      the first-order Taylor polynomial of exp about the mean.

    Each is mapped to the softmax twice: divided by the exact row sums Z_i, the linear map of
    §7.5 (as `paraproduct`, whose approximation and relative residual the first is), and divided
    by its own row sums over the allowed entries (self-normalised: rows summing to 1, a
    nonlinear step; undefined on a row whose own sum is not finite and > 0 beyond its rounding
    error, `ROW_SUM_FLOOR`, where it attends nowhere: zero). Uniform attention, the mean of each row of the softmax
    over its allowed entries, is the baseline any approximation must beat (§7.7).

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        Pre-softmax scores, rows = queries; computed in float64 on its device.
    row_order, col_order : int array of shape (N,) and (M,), optional
        Permutations organizing the axes (None: f is organized).
    allowed : bool array of shape (N, M), optional
        The model's mask in f's own order (§7.5); None: no mask.

    Returns
    -------
    Approximations
        Arrays numpy or torch like f, float64. Beyond float64 (§7.4) an approximation's entries
        and relative residuals are not finite instead of raising.

    Raises
    ------
    ValueError
        Naming f, row_order, col_order or allowed when they are not valid.
    """
    x, was_numpy = as_tensor(f, "f", ndim=2, dtype=torch.float64)
    organized, mask, blocks, r, c = _prepare(x, row_order, col_order, None, allowed)
    jr, jc = blocks.rows.depth, blocks.cols.depth
    para, para_nc, cross, shift = _approximation(blocks, variants=True)
    if jr and jc:  # sum of the D telescoped: E_{J,J'} - E_{J,0} - E_{0,J'} + E_{0,0}, the double-centred f
        sum_d = ((blocks.expanded(jr, jc) - blocks.expanded(jr, 0))
                 - (blocks.expanded(0, jc) - blocks.expanded(0, 0)))
    else:
        sum_d = torch.zeros_like(organized)
    mu = organized.mean()
    first = 1.0 + (organized - mu)
    scaled = torch.stack([para, para_nc, sum_d + cross, sum_d, first + cross, first])
    shifts = torch.stack([shift, shift] + [mu.expand(shift.shape)] * 4)
    exact, rowmax, z = _exact_softmax(organized, mask)
    true_z = _true_z(scaled, shifts, rowmax, z, mask)[0]
    ok = torch.ones_like(organized, dtype=torch.bool) if mask is None else mask
    zero = torch.zeros((), dtype=organized.dtype, device=organized.device)
    own = torch.where(ok, scaled, zero).sum(-1)                               # (K, N)
    # a sum within its rounding error of 0 is 0 (sum D cancels exactly on every unmasked row)
    floor = ROW_SUM_FLOOR * torch.where(ok, scaled.abs(), zero).sum(-1)
    defined = (torch.isfinite(own) & (own > floor)) | ~ok.any(-1)
    # an undefined row attends nowhere: its error is the whole softmax row, the rest still counts
    selfnorm = torch.where(ok & defined[..., None], scaled / torch.where(defined, own, 1.0)[..., None], zero)
    uniform = torch.where(ok, 1.0 / ok.sum(-1, keepdim=True).clamp(min=1).to(organized.dtype), zero)
    rel = _relative_residuals(exact, torch.cat([true_z, selfnorm, uniform[None]]))
    k = len(APPROXIMATIONS)
    representable = torch.isfinite(true_z).flatten(1).all(1).cpu().numpy()
    return Approximations(names=APPROXIMATIONS, organized=back(organized, was_numpy),
                          allowed=None if mask is None else back(mask, was_numpy), exact=back(exact, was_numpy),
                          true_z=back(true_z, was_numpy), selfnorm=back(selfnorm, was_numpy),
                          uniform=back(uniform, was_numpy), residual=rel[:k], selfnorm_residual=rel[k:2 * k],
                          uniform_residual=float(rel[2 * k]), representable=representable, mean=float(mu),
                          row_order=r, col_order=c)


def _relative_residuals(exact: torch.Tensor, approx: torch.Tensor) -> np.ndarray:
    """||exact - approx[k]||_F / ||exact||_F for each k of approx (K, N, M), float64 (K,): +inf where
    approx[k] has an entry that is not finite or the ratio overflows, NaN where exact is 0."""
    def norms(t):
        # Frobenius norms of (..., N, M); again with each array divided by its largest entry where
        # the squares overflow or underflow (the array's entries beyond 1e154 or below 1e-154)
        out = torch.linalg.vector_norm(t, dim=(-2, -1))
        redo = ~torch.isfinite(out) | (out < 1e-150)
        if bool(redo.any()):
            part = t[redo]
            big = part.abs().amax((-2, -1))
            ok = torch.isfinite(big) & (big > 0)
            safe = torch.where(ok, big, torch.ones_like(big))
            out[redo] = torch.where(ok, safe * torch.linalg.vector_norm(part / safe[..., None, None], dim=(-2, -1)),
                                    big)
        return out

    scale = norms(exact[None])[0]
    if not float(scale) > 0:
        return np.full(approx.shape[0], np.nan)
    rel = norms(exact[None] - approx) / scale          # not finite where approx is not
    return torch.where(torch.isfinite(rel), rel, torch.full_like(rel, float("inf"))).cpu().numpy()


def relative_residuals(f, taus, row_order=None, col_order=None, n_scales=None, allowed=None) -> np.ndarray:
    """`paraproduct(tau * f, ...).relative_residual` for every tau > 0.

    NaN where float64 cannot represent it (the ValueErrors about range that `paraproduct`
    raises). The block averages of tau f are tau times those of f, so the organized head and
    its block averages are computed once and each temperature costs a few passes over N x M;
    the temperatures go through the paraproduct's levels together (`BATCH_ENTRIES` at a time),
    in the same operations, and tau = 1 alone, exactly as `paraproduct` computes it.

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        The head, rows = queries (pre-softmax scores); computed in float64.
    taus : array_like of float, shape (T,)
        The temperatures, positive and finite.
    row_order, col_order : int array of shape (N,) and (M,), optional
        Permutations organizing the axes, as in `paraproduct`.
    n_scales : int or tuple of (int, int), optional
        As in `paraproduct`.
    allowed : bool array of shape (N, M), optional
        The model's mask in f's own order, as in `paraproduct`; None: no mask.

    Returns
    -------
    ndarray of float64, shape (T,)
        The relative residual at each temperature; NaN where float64 cannot represent it.

    Raises
    ------
    ValueError
        Naming f, taus (not a 1-D array of positive finite temperatures), row_order,
        col_order, n_scales or allowed when they are not valid.
    """
    x, _ = as_tensor(f, "f", ndim=2, dtype=torch.float64)
    t = np.asarray(taus, dtype=np.float64)
    if t.ndim != 1 or not (np.isfinite(t).all() and (t > 0).all()):
        raise ValueError(f"taus: expected a 1-D array of positive finite temperatures, got {taus!r}")
    organized, mask, blocks, _, _ = _prepare(x, row_order, col_order, n_scales, allowed)
    out = np.full(t.size, np.nan)
    # tau = 1 (the model) as `paraproduct` computes it, to the last bit; the others in batches
    for i in np.flatnonzero(t == 1.0):
        try:
            out[i] = _softmax_parts(organized, mask, blocks)[3]
        except ValueError:  # _softmax_parts raises only about float64's range
            pass
    rest = np.flatnonzero(t != 1.0)
    per_chunk = max(1, BATCH_ENTRIES // organized.numel())
    for i in range(0, rest.size, per_chunk):
        out[rest[i:i + per_chunk]] = _relative_residual_batch(organized, mask, blocks, t[rest[i:i + per_chunk]])
    return out


BATCH_ENTRIES = 1 << 22
"""`relative_residuals` computes this many entries' worth of temperatures at once (a few
temporaries of T x N x M float64, 32 MB each): all of a 128-token head's temperatures, 4 of a
1024-token head's, one at a time from 2048 tokens on."""


def _relative_residual_batch(organized: torch.Tensor, mask, blocks: _Blocks, taus: np.ndarray) -> np.ndarray:
    """`_softmax_parts(organized, mask, blocks, tau)[3]` for each tau of `taus` in one pass (the
    same operations on a leading axis of temperatures), NaN where that raises (float64's range)."""
    t = torch.as_tensor(taus, dtype=organized.dtype, device=organized.device)
    terms = _softmax_terms(organized, mask, blocks, t)
    ok = (torch.isfinite(terms.approx_scaled).flatten(1).all(1)
          & torch.isfinite(terms.residual).flatten(1).all(1)).tolist()
    out = np.full(len(taus), np.nan)
    for i in np.flatnonzero(ok):
        rel = _norm(terms.residual[i]) / _norm(terms.exact[i])
        out[i] = rel if np.isfinite(rel) else np.nan
    return out


def _prepare(x: torch.Tensor, row_order, col_order, n_scales, allowed):
    """Validated orders and mask, the organized head and its block averages."""
    n, m = x.shape
    r = check_order(row_order, n, "row_order")
    c = check_order(col_order, m, "col_order")
    jr, jc = _check_scales(n_scales, n, m)
    rows, cols = torch.as_tensor(r, device=x.device), torch.as_tensor(c, device=x.device)
    organized = x[rows][:, cols]
    mask = _check_allowed(allowed, (n, m), x.device)
    mask = None if mask is None else mask[rows][:, cols]
    return organized, mask, _Blocks(organized, jr, jc), r, c


class _Terms(NamedTuple):
    scaled: torch.Tensor        # tau f, organized
    approx_scaled: torch.Tensor  # the approximation of exp(tau f), row i times exp(-shift_i)
    shift: torch.Tensor
    rowmax: torch.Tensor
    log_scale: torch.Tensor
    exact: torch.Tensor
    approximation: torch.Tensor
    residual: torch.Tensor


def _softmax_terms(organized: torch.Tensor, mask, blocks: _Blocks, tau=1.0) -> _Terms:
    """The exact (masked) softmax of tau * organized, its paraproduct approximation and the
    residual, unchecked: `tau` a float gives (N, M) tensors, a 1-D tensor of temperatures a
    leading axis of them (`_approximation`)."""
    if isinstance(tau, torch.Tensor):
        scaled = tau[:, None, None] * organized
    else:
        scaled = organized if tau == 1.0 else tau * organized
    approx_scaled, shift = _approximation(blocks, tau)
    exact, rowmax, z = _exact_softmax(scaled, mask)
    approximation, log_scale = _true_z(approx_scaled, shift, rowmax, z, mask)
    return _Terms(scaled, approx_scaled, shift, rowmax, log_scale, exact, approximation, exact - approximation)


def _exact_softmax(scaled: torch.Tensor, mask):
    """The (masked) row softmax of `scaled` (..., N, M), its rows' largest allowed entries m_i
    (0 where a row has none) and z_i = sum_k exp(f[i, k] - m_i) over the allowed entries (1 where
    none), so that Z_i = exp(m_i) z_i."""
    visible = scaled if mask is None else scaled.masked_fill(~mask, float("-inf"))
    rowmax = visible.amax(-1)
    rowmax = torch.where(torch.isfinite(rowmax), rowmax, torch.zeros_like(rowmax))  # rows with nothing allowed
    z = torch.exp(visible - rowmax[..., None]).sum(-1)  # >= 1 wherever a row has an allowed entry
    z = torch.where(z > 0, z, torch.ones_like(z))
    if mask is None:
        return torch.softmax(scaled, dim=-1), rowmax, z
    return torch.exp(visible - rowmax[..., None]) / z[..., None], rowmax, z


def _true_z(approx_scaled: torch.Tensor, shift: torch.Tensor, rowmax: torch.Tensor, z: torch.Tensor, mask):
    """An approximation of exp(f) held as approx_scaled (..., N, M) times exp(shift_i) (..., N),
    divided by the exact row sums Z_i = exp(m_i) z_i and zeroed at masked entries (docs/method.md
    §7.5), and the log of its row factor; not finite where float64 cannot hold the result."""
    # approx_scaled * exp(s - m) / z, scaled back in log form when exp(s - m) alone would overflow
    log_scale = (shift - rowmax - torch.log(z))[..., None]
    direct = approx_scaled * torch.exp(log_scale.clamp(max=700.0))
    small = log_scale <= 700.0
    if bool(small.all()):
        approximation = direct
    else:
        via_log = torch.sign(approx_scaled) * torch.exp(torch.log(approx_scaled.abs()) + log_scale)
        approximation = torch.where(small, direct, via_log)
    if mask is not None:
        approximation = torch.where(mask, approximation, torch.zeros_like(approximation))
    return approximation, log_scale


def _softmax_parts(organized: torch.Tensor, mask, blocks: _Blocks, tau: float = 1.0):
    """(exact, approximation, residual, relative residual) of softmax(tau * organized);
    ValueError where float64 cannot represent them."""
    t = _softmax_terms(organized, mask, blocks, tau)
    if not bool(torch.isfinite(t.approx_scaled).all()):
        raise ValueError(f"f: the paraproduct terms overflow float64 (|f| up to "
                         f"{float(t.scaled.abs().max()):.3g}): scale f down")
    if not bool(torch.isfinite(t.residual).all()):
        size = (torch.log(t.approx_scaled.abs()) + t.log_scale).amax(1) / np.log(10)
        row = int(size.argmax())
        raise _not_representable("the paraproduct approximation of softmax(f)", row,
                                 float(size[row]), float(t.shift[row] - t.rowmax[row]))
    rel = _norm(t.residual) / _norm(t.exact)
    if not np.isfinite(rel):
        raise ValueError(f"f: the relative residual is not representable in float64 "
                         f"(residual norm {_norm(t.residual):.3g}): scale f down")
    return t.exact, t.approximation, t.residual, rel
