"""Smoothness of the paraproduct's residual (Theorem 1) and the approximation of Corollary 1
(docs/method.md §7.7).

Theorem 1 says more than "the residual is small": for f mixed alpha-Hölder on the organized
trees, the residual A(f) - Ã(f) of the paraproduct lies in Lambda^{2 alpha}, a smoother class
than A(f). `haar_decay` measures a Hölder-type exponent of an array from the decay of its
bi-Haar coefficients across the scales of the balanced binary trees of its rows and columns;
`residual_smoothness` applies it to the exact softmax of an organized head and to the residual
of its paraproduct. `corollary1` is the approximation with A' = A'' = 1 (the paper's softmax
invariance) and its residual.

Normalisation. On [0, 1]^2 with L2-normalised Haar functions, f is mixed alpha-Hölder when
|<f, psi_R>| <= C |R|^{alpha + 1/2} for every dyadic rectangle R. The discrete bi-Haar basis
(`haar.bihaar`) is orthonormal in R^{N x M}: a vector on a folder of n of the N items has
entries of size 1/sqrt(n), so for samples f[i, k] = F(x_i, y_k) its coefficient is
c = sqrt(n m) * (mean difference of f over the halves of R) = sqrt(|R| N M) * osc_R(F), with
|R| = n m / (N M), while the continuous coefficient is sqrt(|R|) * osc_R(F). The two differ by
the constant factor sqrt(N M), so log2 |c| decays with log2 |R| at the slope alpha + 1/2 in
both normalisations, and alpha = slope - 1/2.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from ._arrays import as_tensor, back
from .haar import bihaar, haar_basis
from .paraproduct import check_order, paraproduct
from .trees import balanced_tree

__all__ = ["FAMILIES", "HaarDecay", "haar_decay", "Corollary1", "corollary1", "ResidualSmoothness",
           "residual_smoothness", "THEOREM1_MEASURES", "theorem1_measures"]

# The coefficient families of the bi-Haar basis (docs/method.md §7.7): a row wavelet times the
# column constant, the row constant times a column wavelet, and a wavelet on each axis.
FAMILIES = ("rows", "cols", "mixed")
# Levels whose summary is below this fraction of the largest coefficient are rounding noise of
# an exactly vanishing level (a function constant on that level's rectangles): left out.
ZERO_LEVEL = 1e-12
# Residual degrees of freedom a fit must keep (groups - intercepts - slope): a slope through
# three points of one family, one left over, swings by more than 0.5 on masked heads.
MIN_DOF = 2


@dataclass(frozen=True, eq=False)
class HaarDecay:
    """Hölder-type exponent of an array from the decay of its bi-Haar coefficients (docs/method.md §7.7).

    For one (N, M) array the scalars are Python numbers and the per-group arrays have shape
    (G,); for a batch of shape (..., N, M) they have shape (...) and (..., G).

    alpha : the exponent, fitted slope - 1/2; NaN when too few groups are left to fit.
    r2 : share of the within-family variance of log2_magnitude explained by the common slope.
    rms : root mean square deviation of the fitted points from the fit, in log2 units.
    n_fitted : the number of (family, level) groups fitted.
    family : int (G,), index into `FAMILIES` of each group; level : int (G,), its total level
    (row level + column level of its basis functions, the constants at level 0).
    log2_size : mean log2 |R| of the counted coefficients of each group, |R| the fraction of
    entries of their rectangle (NaN where none is counted); log2_magnitude : log2 of the
    group's summary of |coefficient| (its maximum or `quantile`; -inf where it is 0, NaN where
    none is counted); count : the coefficients counted; fitted : whether the group was fitted.
    quantile : the summary used (1.0: the maximum).
    """

    alpha: float | np.ndarray
    r2: float | np.ndarray
    rms: float | np.ndarray
    n_fitted: int | np.ndarray
    family: np.ndarray
    level: np.ndarray
    log2_size: np.ndarray
    log2_magnitude: np.ndarray
    count: np.ndarray
    fitted: np.ndarray
    quantile: float


@dataclass(frozen=True, eq=False)
class Corollary1:
    """The approximation of softmax(organized head) with A' = A'' = 1 (docs/method.md §7.7).

    organized: f[row_order][:, col_order]; exact: its (masked) row softmax; approximation:
    the Corollary 1 approximation of the softmax, row-normalised by the exact row sums as the
    paraproduct's is; residual = exact - approximation; relative_residual =
    ||residual||_F / ||exact||_F; mean: the mean of f over all entries, the point where
    A' = A'' = exp(0) = 1 is taken; row_order, col_order: the permutations used.
    """

    organized: np.ndarray | torch.Tensor
    exact: np.ndarray | torch.Tensor
    approximation: np.ndarray | torch.Tensor
    residual: np.ndarray | torch.Tensor
    relative_residual: float
    mean: float
    row_order: np.ndarray
    col_order: np.ndarray


@dataclass(frozen=True, eq=False)
class ResidualSmoothness:
    """Theorem 1's smoothness claim on one head (docs/method.md §7.7).

    alpha_softmax, alpha_residual: `haar_decay` exponents of the exact softmax and of the
    paraproduct's residual, both in the organized order; residual: the paraproduct's relative
    residual; corollary1_residual: that of the Corollary 1 approximation; softmax_decay,
    residual_decay: the two `HaarDecay` results behind the exponents.
    """

    alpha_softmax: float
    alpha_residual: float
    residual: float
    corollary1_residual: float
    softmax_decay: HaarDecay
    residual_decay: HaarDecay


# -- validation -------------------------------------------------------------------------
def _mask(allowed, shapes: tuple[tuple[int, ...], ...], device) -> torch.Tensor | None:
    if allowed is None:
        return None
    a = allowed if isinstance(allowed, torch.Tensor) else torch.from_numpy(np.array(allowed))  # a writable copy
    if a.dtype != torch.bool:
        raise ValueError(f"allowed: expected a boolean mask, got dtype {a.dtype}")
    if tuple(a.shape) not in shapes:
        want = " or ".join(str(s) for s in dict.fromkeys(shapes))
        raise ValueError(f"allowed: expected shape {want}, got {tuple(a.shape)}")
    return a.to(device)


def _organize(x: torch.Tensor, r: np.ndarray, c: np.ndarray) -> torch.Tensor:
    rows, cols = torch.as_tensor(r, device=x.device), torch.as_tensor(c, device=x.device)
    return x.index_select(-2, rows).index_select(-1, cols)


def _norm(t: torch.Tensor) -> float:
    """Frobenius norm without overflow in the squares."""
    big = float(t.abs().max())
    if big == 0.0 or not np.isfinite(big):
        return big
    return big * float(torch.linalg.norm(t / big))


# -- the bi-Haar coefficients, grouped by family and scale --------------------------------
@lru_cache(maxsize=16)
def _axis(n: int):
    """Balanced tree of 0..n-1, its Haar supports and levels, and the interval [start, stop)
    each basis vector lives on (the folders of a balanced tree over 0..n-1 are intervals)."""
    tree = balanced_tree(np.arange(n))
    basis, support, level = haar_basis(tree)
    nonzero = basis != 0
    start, stop = nonzero.argmax(0), n - nonzero[::-1].argmax(0)
    return tree, support, level, start, stop


class _Groups:
    """The bi-Haar coefficients of an N x M array sorted by (family, total level), the average
    left out: `order` indexes the flattened (N, M) coefficients, group g is order[lo[g]:hi[g]]."""

    def __init__(self, n: int, m: int):
        self.tree_r, sr, lr, r0, r1 = _axis(n)
        self.tree_c, sc, lc, c0, c1 = _axis(m)
        fam = np.full((n, m), FAMILIES.index("mixed"))
        fam[:, 0] = FAMILIES.index("rows")
        fam[0, :] = FAMILIES.index("cols")
        level = lr[:, None] + lc[None, :]
        span = int(level.max()) + 1
        gid = (fam * span + level).ravel()
        gid[0] = -1                                        # the average: not a wavelet coefficient
        order = np.argsort(gid, kind="stable")[1:]
        keys, lo, counts = np.unique(gid[order], return_index=True, return_counts=True)
        self.order, self.lo, self.hi = order, lo, lo + counts
        self.family, self.level = (keys // span).astype(np.int64), (keys % span).astype(np.int64)
        log2_area = np.log2(np.outer(sr, sc).astype(np.float64)) - np.log2(float(n) * m)
        self.log2_area = log2_area.ravel()[order]
        a, b = order // m, order % m
        self.rect = (r0[a], r1[a], c0[b], c1[b])


@lru_cache(maxsize=16)
def _groups(n: int, m: int) -> _Groups:
    return _Groups(n, m)


def _inside(mask: torch.Tensor, groups: _Groups) -> torch.Tensor:
    """Per sorted coefficient, whether its rectangle lies in the allowed entries: (B', K) bool."""
    b, n, m = mask.shape
    cum = mask.new_zeros((b, n + 1, m + 1), dtype=torch.int64)
    cum[:, 1:, 1:] = mask.to(torch.int64).cumsum(1).cumsum(2)
    rs, re, cs, ce = (torch.as_tensor(v, device=mask.device) for v in groups.rect)
    count = cum[:, re, ce] - cum[:, rs, ce] - cum[:, re, cs] + cum[:, rs, cs]
    return count == ((re - rs) * (ce - cs))[None, :]


def _summary(vals: torch.Tensor, valid: torch.Tensor | None, q: float):
    """Per row of vals (B, k): the q-quantile of its valid entries (linear interpolation, as
    numpy's default; q = 1: the maximum) and their number; -inf where none is valid."""
    k = vals.shape[1]
    count = torch.full((vals.shape[0],), k, device=vals.device) if valid is None else valid.sum(1)
    if q == 1.0:
        v = vals if valid is None else vals.masked_fill(~valid, float("-inf"))
        return v.amax(1), count
    v = vals if valid is None else vals.masked_fill(~valid, float("inf"))
    v = v.sort(1).values                                 # invalid entries last
    pos = q * (count - 1).clamp(min=0).to(vals.dtype)
    lo = pos.floor().long().clamp(max=k - 1)
    hi = pos.ceil().long().clamp(max=k - 1)
    frac = pos - lo.to(vals.dtype)
    a, b = v.gather(1, lo[:, None])[:, 0], v.gather(1, hi[:, None])[:, 0]
    out = a + frac * (b - a)
    return torch.where(count > 0, out, torch.full_like(out, float("-inf"))), count


def _fit(x: np.ndarray, y: np.ndarray, w: np.ndarray, family: np.ndarray):
    """Least squares of y on x with a common slope and one intercept per family, over the
    groups where w; per row of (B, G) arrays. Returns (slope, r2, rms, n_fitted)."""
    xc, yc = np.zeros_like(x), np.zeros_like(y)
    n_families = np.zeros(x.shape[0], dtype=np.int64)
    for f in range(len(FAMILIES)):
        sel = w & (family == f)[None, :]
        k = sel.sum(1)
        n_families += k > 0
        safe = np.maximum(k, 1)
        xm = np.where(sel, x, 0.0).sum(1) / safe
        ym = np.where(sel, y, 0.0).sum(1) / safe
        xc = np.where(sel, x - xm[:, None], xc)
        yc = np.where(sel, y - ym[:, None], yc)
    n_fitted = w.sum(1)
    sxx, sxy, syy = (xc * xc).sum(1), (xc * yc).sum(1), (yc * yc).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = sxy / sxx
        ssr = np.where(w, (yc - slope[:, None] * xc) ** 2, 0.0).sum(1)
        r2 = np.where(syy > 0, 1.0 - ssr / syy, np.nan)
        rms = np.sqrt(ssr / n_fitted)
    ok = (n_fitted - n_families - 1 >= MIN_DOF) & (sxx > 0)
    nan = np.full_like(slope, np.nan)
    return np.where(ok, slope, nan), np.where(ok, r2, nan), np.where(ok, rms, nan), n_fitted


def haar_decay(x, row_order=None, col_order=None, allowed=None, quantile: float = 1.0,
               min_count: int = 4) -> HaarDecay:
    """Hölder-type exponent of an array from the decay of its bi-Haar coefficients across
    scales (docs/method.md §7.7).

    The array, its rows taken in `row_order` and its columns in `col_order` (None: as given),
    is expanded in the bi-Haar basis of the balanced binary trees (docs/method.md §2.5, §3) of
    its two axes; N and M need not be powers of two and nothing is cropped. The coefficients
    other than the average fall into three families (`FAMILIES`: a row wavelet times the
    column constant, the row constant times a column wavelet, a wavelet on each axis) and, in
    each, into total levels (row level + column level). Each (family, level) group with at
    least `min_count` counted coefficients is summarised by the maximum of their absolute
    values (the sup of the Hölder characterisation; `quantile` < 1 uses that quantile
    instead, robust to isolated outliers but blind to an isolated singularity), and
    log2(summary) is fitted against the mean log2 |R| of the group by least squares with one
    slope common to the families and one intercept per family. alpha = slope - 1/2, from
    |c_R| <= C |R|^{alpha + 1/2} in the orthonormal normalisation (module docstring). Groups
    whose summary is below ZERO_LEVEL times the largest coefficient (levels where the array
    is constant on every rectangle) are left out; alpha is NaN when fewer fitted groups
    remain than the families fitted plus 1 + MIN_DOF. The Haar wavelet has one vanishing
    moment, so a smooth array saturates at alpha = 1; white noise gives about -1/2 (a little
    below with the maximum, which grows with the number of coefficients).

    x : float array or tensor of shape (N, M) or a batch (..., N, M), computed in float64 on
    its device, every array of the batch at once. row_order : int (N,), col_order : int (M,)
    permutations. allowed : bool (N, M) or the shape of x, in x's own order, or None: only
    the coefficients whose rectangle lies inside the allowed entries are counted (masked
    heads, docs/method.md §7.7). quantile : in (0, 1]. min_count : a positive integer.
    Returns a `HaarDecay`.
    """
    t, _ = as_tensor(x, "x", dtype=torch.float64)
    if t.ndim < 2:
        raise ValueError(f"x: expected 2 or more dimensions (..., N, M), got shape {tuple(t.shape)}")
    if isinstance(quantile, bool) or not isinstance(quantile, (int, float, np.floating)) \
            or not 0.0 < float(quantile) <= 1.0:
        raise ValueError(f"quantile: expected a number in (0, 1], got {quantile!r}")
    if isinstance(min_count, bool) or not isinstance(min_count, (int, np.integer)) or min_count < 1:
        raise ValueError(f"min_count: expected a positive integer, got {min_count!r}")
    *lead, n, m = t.shape
    r, c = check_order(row_order, n, "row_order"), check_order(col_order, m, "col_order")
    mask = _mask(allowed, ((n, m), tuple(t.shape)), t.device)
    batch = int(np.prod(lead)) if lead else 1
    t = _organize(t, r, c).reshape(batch, n, m)
    t = t - t.mean((1, 2), keepdim=True)    # the average is not fitted; this keeps rounding off the rest
    groups = _groups(n, m)
    coef = bihaar(t.permute(1, 2, 0).contiguous(), groups.tree_r, groups.tree_c)
    order = torch.as_tensor(groups.order, device=t.device)
    mag = coef.abs().permute(2, 0, 1).reshape(batch, n * m)[:, order]
    valid = None
    if mask is not None:
        mask = _organize(mask, r, c).reshape(-1, n, m)
        valid = _inside(mask, groups).expand(batch, -1)
    log2_area = torch.as_tensor(groups.log2_area, device=t.device)
    summaries, counts, sizes = [], [], []
    for lo, hi in zip(groups.lo.tolist(), groups.hi.tolist()):
        part = None if valid is None else valid[:, lo:hi]
        s, k = _summary(mag[:, lo:hi], part, float(quantile))
        area = log2_area[lo:hi].expand(batch, -1)
        total = area.sum(1) if part is None else torch.where(part, area, torch.zeros_like(area)).sum(1)
        summaries.append(s)
        counts.append(k)
        sizes.append(total / k.clamp(min=1))

    def columns(parts, dtype):                # (batch, G); G = 0 for a 1 x 1 array
        if not parts:
            return np.zeros((batch, 0), dtype=dtype)
        return torch.stack(parts, 1).cpu().numpy().astype(dtype)

    summary, count = columns(summaries, np.float64), columns(counts, np.int64)
    log2_size = np.where(count > 0, columns(sizes, np.float64), np.nan)
    floor = ZERO_LEVEL * (mag.amax(1).cpu().numpy() if mag.shape[1] else np.zeros(batch))
    fitted = (count >= min_count) & (summary > floor[:, None])
    with np.errstate(divide="ignore"):
        log2_mag = np.where(count > 0, np.log2(np.maximum(summary, 0.0)), np.nan)
    slope, r2, rms, n_fitted = _fit(np.where(fitted, log2_size, 0.0), np.where(fitted, log2_mag, 0.0),
                                    fitted, groups.family)
    shape = tuple(lead)

    def per_array(a):
        return a.reshape(shape).item() if not lead else a.reshape(shape)

    def per_group(a):
        return a.reshape(shape + (a.shape[-1],))

    return HaarDecay(alpha=per_array(slope - 0.5), r2=per_array(r2), rms=per_array(rms),
                     n_fitted=per_array(n_fitted), family=groups.family.copy(), level=groups.level.copy(),
                     log2_size=per_group(log2_size), log2_magnitude=per_group(log2_mag),
                     count=per_group(count), fitted=per_group(fitted), quantile=float(quantile))


# -- Corollary 1 ------------------------------------------------------------------------
@lru_cache(maxsize=32)
def _tree_axis(n: int):
    """Folder labels per level, parents per level and folder sizes per level of the balanced
    tree of 0..n-1 (numpy; moved to the device by the caller)."""
    lab = np.array(balanced_tree(np.arange(n)).labels)     # a writable copy, for torch
    parents = [np.zeros(0, dtype=np.int64)]
    for level in range(1, lab.shape[0]):
        par = np.empty(int(lab[level].max()) + 1, dtype=np.int64)
        par[lab[level]] = lab[level - 1]
        parents.append(par)
    return lab, parents, [np.bincount(row).astype(np.float64) for row in lab]


def _block_means(f: torch.Tensor):
    """E[a][b]: the means of f on the folders of level a of the row tree times level b of the
    column tree, one value per pair of folders (docs/method.md §7.1), from sums level by level."""
    dev = f.device
    (lr, pr, zr), (lc, pc, zc) = _tree_axis(f.shape[0]), _tree_axis(f.shape[1])
    jr, jc = lr.shape[0] - 1, lc.shape[0] - 1

    def t(a):
        return torch.as_tensor(a, device=dev)

    def sums(x, labels, parents, depth, dim):
        out = [None] * (depth + 1)
        shape = list(x.shape)
        shape[dim] = int(labels[depth].max()) + 1
        out[depth] = x.new_zeros(shape).index_add_(dim, t(labels[depth]), x)
        for level in range(depth - 1, -1, -1):
            shape[dim] = int(labels[level].max()) + 1
            out[level] = x.new_zeros(shape).index_add_(dim, t(parents[level + 1]), out[level + 1])
        return out

    col_sums = sums(f, lc, pc, jc, 1)
    means = [[None] * (jc + 1) for _ in range(jr + 1)]
    for b in range(jc + 1):
        for a, s in enumerate(sums(col_sums[b], lr, pr, jr, 0)):
            means[a][b] = s / (t(zr[a])[:, None] * t(zc[b])[None, :])
    return means, (lr, pr, jr), (lc, pc, jc)


def _cross_terms(f: torch.Tensor) -> torch.Tensor:
    """sum over (j, j') of Dx_{j,j'} f * Dy_{j,j'} f, N x M (docs/method.md §7.3, §7.7).

    The term of (j, j') is constant on the blocks of levels (j + 1, j' + 1), so it is computed
    once per pair of folders and the sum is expanded level by level, as the paraproduct does."""
    e, (lr, pr, jr), (lc, pc, jc) = _block_means(f)
    if jr == 0 or jc == 0:
        return torch.zeros_like(f)
    dev = f.device
    pr = [torch.as_tensor(p, device=dev) for p in pr]
    pc = [torch.as_tensor(p, device=dev) for p in pc]

    def term(a, b):                      # a = j + 1, b = j' + 1
        e00 = e[a - 1][b - 1][pr[a]][:, pc[b]]
        dx = e[a][b - 1][:, pc[b]] - e00
        dy = e[a - 1][b][pr[a]] - e00
        return dx * dy

    total = None
    for a in range(1, jr + 1):
        acc = term(a, 1)
        for b in range(2, jc + 1):
            acc = acc[:, pc[b]] + term(a, b)
        total = acc if total is None else total[pr[a]] + acc
    return total[torch.as_tensor(lr[jr], device=dev)][:, torch.as_tensor(lc[jc], device=dev)]


def corollary1(f, row_order=None, col_order=None, allowed=None) -> Corollary1:
    """The approximation of softmax(f) with A' = A'' = 1 (paper Corollary 1; docs/method.md §7.7).

    Softmax is unchanged by a constant added to f, so f is taken about its mean mu (over all
    entries), where the paper's A'(E f) = A''(E f) = exp(0) = 1. The paraproduct of
    docs/method.md §7.3 with these constants keeps g_{0,0} = exp(0) = 1, the one-dimensional
    differences E_{j+1,0} f - E_{j,0} f and E_{0,j'+1} f - E_{0,j'} f and the mixed terms
    D_{j,j'} f + Dx_{j,j'} f * Dy_{j,j'} f, all without their exp(E f) factors. The
    differences telescope to f - mu, so the approximation of exp(f - mu) is

        1 + (f - mu) + sum_{j,j'} Dx_{j,j'} f * Dy_{j,j'} f,

    the first-order Taylor polynomial of exp about the mean plus the paraproduct's cross
    terms; times exp(mu) it approximates exp(f). As the paraproduct's, it is row-normalised
    by the exact row sums Z_i of exp(f) (docs/method.md §7.5), not by its own. Its error is
    O(|f - mu|^2): good for heads of small amplitude, poor for large ones.

    f : float array or tensor of shape (N, M), rows = queries, computed in float64 on its
    device. row_order : int (N,), col_order : int (M,): the permutations organizing the axes
    (None: f is organized). allowed : bool (N, M) in f's own order, or None: masked heads as
    in docs/method.md §7.5 (the mean and the block averages see f at every entry, the
    reference is the masked softmax, the approximation is 0 at masked entries). Returns a
    `Corollary1`, arrays numpy or torch like f; raises ValueError naming f when the
    approximation is not representable in float64 (a row hundreds below the head's mean).
    """
    x, was_numpy = as_tensor(f, "f", ndim=2, dtype=torch.float64)
    n, m = x.shape
    r, c = check_order(row_order, n, "row_order"), check_order(col_order, m, "col_order")
    mask = _mask(allowed, ((n, m),), x.device)
    organized = _organize(x, r, c)
    mask = None if mask is None else _organize(mask, r, c)
    mu = organized.mean()
    centered = organized - mu
    approx_exp = 1.0 + centered + _cross_terms(centered)      # approximates exp(f - mu)
    visible = organized if mask is None else organized.masked_fill(~mask, float("-inf"))
    rowmax = visible.amax(1)
    rowmax = torch.where(torch.isfinite(rowmax), rowmax, torch.zeros_like(rowmax))  # rows with nothing allowed
    z = torch.exp(visible - rowmax[:, None]).sum(1)
    z = torch.where(z > 0, z, torch.ones_like(z))
    exact = torch.exp(visible - rowmax[:, None]) / z[:, None]
    # times exp(mu) / Z_i = exp(mu - m_i) / z_i; in log form where exp(mu - m_i) alone would overflow
    log_scale = (mu - rowmax - torch.log(z))[:, None]
    direct = approx_exp * (torch.exp((mu - rowmax).clamp(max=700.0)) / z)[:, None]
    via_log = torch.sign(approx_exp) * torch.exp(torch.log(approx_exp.abs()) + log_scale)
    approximation = torch.where((mu - rowmax)[:, None] <= 700.0, direct, via_log)
    if mask is not None:
        approximation = torch.where(mask, approximation, torch.zeros_like(approximation))
    residual = exact - approximation
    if not bool(torch.isfinite(residual).all()):
        row = int((~torch.isfinite(residual)).any(1).nonzero()[0, 0])
        raise ValueError(f"f: the Corollary 1 approximation of softmax(f) is not representable in float64 "
                         f"(row {row} lies {float(mu - rowmax[row]):.4g} below the head's mean): scale f down")
    rel = _norm(residual) / _norm(exact) if _norm(exact) > 0 else float("nan")
    return Corollary1(organized=back(organized, was_numpy), exact=back(exact, was_numpy),
                      approximation=back(approximation, was_numpy), residual=back(residual, was_numpy),
                      relative_residual=rel, mean=float(mu), row_order=r, col_order=c)


def residual_smoothness(f, row_order=None, col_order=None, allowed=None, quantile: float = 1.0,
                        min_count: int = 4) -> ResidualSmoothness:
    """Theorem 1's smoothness claim on one head: the `haar_decay` exponents of its exact
    softmax and of its paraproduct's residual in the organized order (docs/method.md §7.7).

    f : float (N, M) pre-softmax scores; row_order, col_order, allowed : as for
    `paraproduct.paraproduct`. Masked heads: the softmax and the residual are 0 at masked
    entries, which are not values of the head, so only the Haar coefficients on rectangles
    inside the allowed entries are fitted (`haar_decay`'s `allowed`). quantile, min_count :
    as for `haar_decay`. Also gives the paraproduct's relative residual and that of the
    Corollary 1 approximation. Raises the ValueErrors of `paraproduct` and `corollary1`.
    """
    pp = paraproduct(f, row_order, col_order, allowed=allowed)
    mask = None
    if allowed is not None:
        mask = _organize(_mask(allowed, (tuple(pp.organized.shape),), pp.organized.device
                               if isinstance(pp.organized, torch.Tensor) else "cpu"), pp.row_order, pp.col_order)
    cor = corollary1(pp.organized, allowed=mask)
    exact, residual = (p if isinstance(p, torch.Tensor) else torch.from_numpy(p) for p in (pp.exact, pp.residual))
    decay = haar_decay(torch.stack([exact, residual]), allowed=mask, quantile=quantile, min_count=min_count)

    def one(i):
        return HaarDecay(alpha=float(decay.alpha[i]), r2=float(decay.r2[i]), rms=float(decay.rms[i]),
                         n_fitted=int(decay.n_fitted[i]), family=decay.family, level=decay.level,
                         log2_size=decay.log2_size[i], log2_magnitude=decay.log2_magnitude[i],
                         count=decay.count[i], fitted=decay.fitted[i], quantile=decay.quantile)

    soft, res = one(0), one(1)
    return ResidualSmoothness(alpha_softmax=soft.alpha, alpha_residual=res.alpha, residual=pp.relative_residual,
                              corollary1_residual=cor.relative_residual, softmax_decay=soft, residual_decay=res)


THEOREM1_MEASURES = ("residual", "corollary1_residual", "alpha_softmax", "alpha_residual")
"""What `theorem1_measures` gives of a head, in its order."""


def theorem1_measures(f, row_order=None, col_order=None, allowed=None) -> tuple[np.ndarray, str]:
    """THEOREM1_MEASURES of one head (`residual_smoothness`'s arguments) as a float64 array, and ""; a
    paraproduct beyond float64 (docs/method.md §7.4) gives residuals inf and exponents NaN, and the
    reason."""
    try:
        m = residual_smoothness(f, row_order, col_order, allowed)
    except ValueError as exc:
        return np.array([np.inf, np.inf, np.nan, np.nan]), str(exc)
    return np.array([m.residual, m.corollary1_residual, m.alpha_softmax, m.alpha_residual], dtype=np.float64), ""
