"""Smoothness of the paraproduct's residual (Theorem 1) and Corollary 1's approximation (docs/method.md §7.7).

Theorem 1 says more than "the residual is small": for f mixed alpha-Hölder on the organized
trees, the residual A(f) - Ã(f) of the paraproduct lies in Lambda^{2 alpha}, a smoother class
than A(f). `haar_decay` measures a Hölder-type exponent of an array from the decay of its
bi-Haar coefficients across the scales of the balanced binary trees of its rows and columns;
`residual_smoothness` applies it to the scores of an organized head, to their exact softmax and
to the residual of its paraproduct, and gives every relative residual of `paraproduct.approximations`
beside uniform attention's (`THEOREM1_MEASURES`). `corollary1` is the paper's Corollary 1, the
approximation sum_{j,j'} (D + Dx Dy) with A' = A'' = 1, and `taylor_corollary1` its first-order
Taylor variant 1 + (f - mu) + sum Dx Dy, each with its residual.

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
from .paraproduct import APPROXIMATIONS, approximations, check_order
from .trees import balanced_tree

__all__ = ["FAMILIES", "HaarDecay", "haar_decay", "Corollary1", "corollary1", "taylor_corollary1",
           "ResidualSmoothness", "residual_smoothness", "THEOREM1_MEASURES", "theorem1_measures"]

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

    What `haar_decay` returns. For one (N, M) array the scalars are Python numbers and the
    per-group arrays have shape (G,), G the number of (family, level) groups; for a batch of
    shape (..., N, M) they have shape (...) and (..., G).

    Attributes
    ----------
    alpha : float or ndarray of shape (...)
        The exponent, fitted slope - 1/2; NaN when too few groups are left to fit.
    r2 : float or ndarray of shape (...)
        Share of the within-family variance of log2_magnitude explained by the common slope.
    rms : float or ndarray of shape (...)
        Root mean square deviation of the fitted points from the fit, in log2 units.
    n_fitted : int or ndarray of shape (...)
        The number of (family, level) groups fitted.
    family : ndarray of shape (G,)
        int, index into `FAMILIES` of each group.
    level : ndarray of shape (G,)
        int, each group's total level (row level + column level of its basis functions, the
        constants at level 0).
    log2_size : ndarray of shape (..., G)
        Mean log2 |R| of the counted coefficients of each group, |R| the fraction of entries of
        their rectangle (NaN where none is counted).
    log2_magnitude : ndarray of shape (..., G)
        log2 of the group's summary of |coefficient| (its maximum or `quantile`; -inf where it
        is 0, NaN where none is counted).
    count : ndarray of shape (..., G)
        int64, the coefficients counted.
    fitted : ndarray of shape (..., G)
        bool, whether the group was fitted.
    quantile : float
        The summary used (1.0: the maximum).
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
    """An approximation of softmax(organized head) with A' = A'' = 1 (docs/method.md §7.7).

    The paper's Corollary 1 (`corollary1`) or its Taylor variant (`taylor_corollary1`). Arrays
    numpy or torch like the head given.

    Attributes
    ----------
    organized : ndarray or torch.Tensor of shape (N, M)
        ``f[row_order][:, col_order]``.
    exact : ndarray or torch.Tensor of shape (N, M)
        Its (masked) row softmax.
    approximation : ndarray or torch.Tensor of shape (N, M)
        The approximation of the softmax, row-normalised by the exact row sums as the
        paraproduct's is.
    residual : ndarray or torch.Tensor of shape (N, M)
        exact - approximation.
    relative_residual : float
        ||residual||_F / ||exact||_F.
    mean : float
        The mean of f over all entries, the point where A' = A'' = exp(0) = 1 is taken.
    row_order, col_order : ndarray of int64, shape (N,) and (M,)
        The permutations used.
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
    """Theorem 1's measures of one head (docs/method.md §7.7).

    What `residual_smoothness` returns.

    Attributes
    ----------
    measures : dict
        Every `THEOREM1_MEASURES` name and its value (float).
    alpha_scores, alpha_softmax, alpha_residual : float
        `haar_decay` exponents of the scores, of the exact softmax and of the paraproduct's
        residual, all in the organized order (NaN for the residual where the paraproduct is
        beyond float64).
    residual : float
        The paraproduct's relative residual.
    corollary1_residual : float
        That of the paper's Corollary 1.
    uniform_residual : float
        That of uniform attention.
    scores_decay, softmax_decay, residual_decay : HaarDecay
        The `haar_decay` results behind the exponents.
    note : str
        "" or which approximations float64 cannot hold (their residuals +inf).
    """

    measures: dict
    alpha_scores: float
    alpha_softmax: float
    alpha_residual: float
    residual: float
    corollary1_residual: float
    uniform_residual: float
    scores_decay: HaarDecay
    softmax_decay: HaarDecay
    residual_decay: HaarDecay
    note: str


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
    """Hölder-type exponent of an array from the decay of its bi-Haar coefficients (docs/method.md §7.7).

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

    Parameters
    ----------
    x : ndarray or torch.Tensor of shape (N, M) or (..., N, M)
        One array or a batch, float, computed in float64 on its device, every array of the
        batch at once.
    row_order, col_order : array_like of int, shape (N,) and (M,), optional
        Permutations of the rows and the columns (None: as given).
    allowed : array_like of bool, shape (N, M) or the shape of x, optional
        In x's own order: only the coefficients whose rectangle lies inside the allowed entries
        are counted (masked heads, docs/method.md §7.7). None: every coefficient.
    quantile : float, default 1.0
        The summary of each group, in (0, 1]; 1.0 the maximum.
    min_count : int, default 4
        The fewest counted coefficients of a group fitted, positive.

    Returns
    -------
    HaarDecay
        The exponent and the groups behind it, of the array or of each array of the batch.

    Raises
    ------
    ValueError
        If x has fewer than 2 dimensions or an axis of length 0 or contains NaN or inf, or an
        argument is not valid.
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


# -- Corollary 1 and the measures of Theorem 1 ------------------------------------------------
_TRUE_Z = {"paraproduct": "residual", "paraproduct_nocross": "residual_nocross",
           "corollary1": "corollary1_residual", "corollary1_nocross": "corollary1_nocross",
           "taylor": "taylor_residual", "taylor_nocross": "taylor_nocross"}
_SELFNORM = {"paraproduct": "residual_selfnorm", "paraproduct_nocross": "residual_nocross_selfnorm",
             "corollary1": "corollary1_selfnorm", "corollary1_nocross": "corollary1_nocross_selfnorm",
             "taylor": "taylor_selfnorm", "taylor_nocross": "taylor_nocross_selfnorm"}

THEOREM1_MEASURES = ("residual", "residual_selfnorm", "residual_nocross", "residual_nocross_selfnorm",
                     "uniform_residual",
                     "corollary1_residual", "corollary1_selfnorm", "corollary1_nocross", "corollary1_nocross_selfnorm",
                     "taylor_residual", "taylor_selfnorm", "taylor_nocross", "taylor_nocross_selfnorm",
                     "alpha_scores", "alpha_softmax", "alpha_residual")
"""What `theorem1_measures` gives of a head, in its order (docs/method.md §7.5, §7.7). Relative
residuals ||softmax - approximation||_F / ||softmax||_F against the model's (masked) softmax:
`residual` the paraproduct's (§7.3), `residual_nocross` without its cross terms, `uniform_residual`
uniform attention's (the baseline), `corollary1_*` the paper's Corollary 1 (sum D + Dx Dy;
`_nocross`: sum D), `taylor_*` its Taylor variant (1 + (f - mu) + sum Dx Dy; `_nocross`:
1 + (f - mu)); each divided by the exact row sums, and with `_selfnorm` by its own (+inf where
that is undefined or float64 cannot hold an approximation). `alpha_scores`, `alpha_softmax`,
`alpha_residual`: the `haar_decay` exponents of the scores (Theorem 1's premise), of the softmax
and of the paraproduct's residual (NaN where that is beyond float64)."""


def _corollary(which: str, f, row_order, col_order, allowed) -> Corollary1:
    """`approximations(...)`'s approximation `which` as a `Corollary1`; ValueError naming f beyond
    float64."""
    ap = approximations(f, row_order, col_order, allowed)
    k = APPROXIMATIONS.index(which)
    organized, exact, approx = (torch.as_tensor(a) for a in (ap.organized, ap.exact, ap.true_z[k]))
    if not ap.representable[k]:
        row = int((~torch.isfinite(approx)).any(1).nonzero()[0, 0])
        visible = organized[row] if ap.allowed is None else organized[row][torch.as_tensor(ap.allowed)[row]]
        what = {"corollary1": "the Corollary 1 approximation", "taylor": "the Taylor variant of Corollary 1"}[which]
        raise ValueError(f"f: {what} of softmax(f) is not representable in float64 (row {row} lies "
                         f"{ap.mean - float(visible.max()):.4g} below the head's mean): scale f down")
    was_numpy = isinstance(ap.organized, np.ndarray)
    return Corollary1(organized=ap.organized, exact=ap.exact, approximation=ap.true_z[k],
                      residual=back(exact - approx, was_numpy), relative_residual=float(ap.residual[k]),
                      mean=ap.mean, row_order=ap.row_order, col_order=ap.col_order)


def corollary1(f, row_order=None, col_order=None, allowed=None) -> Corollary1:
    """The paper's Corollary 1 (eq. 18) as stated: softmax(f) with A' = A'' = 1 (docs/method.md §7.7).

    The proof takes A'(E f) = A''(E f) = e^0 = 1 as mu(f) -> 0. Softmax is unchanged by a constant
    added to f, so f is taken about its mean mu (over all entries) and

        exp(f - mu) ~ C(f) = sum_{j,j'} (D_{j,j'} f + Dx_{j,j'} f * Dy_{j,j'} f),

    the mixed terms of the paraproduct (docs/method.md §7.3) without their exp(E f) factors, and
    without g_{0,0} and the one-dimensional terms, which eq. 18 does not have. The sum of the D
    telescopes to the double-centred f (f - row means - column means + mu), whose unmasked rows
    sum to 0: C is a poor approximation, and that is what this measures. exp(mu) C approximates
    exp(f); as the paraproduct's, it is divided by the exact row sums Z_i (docs/method.md §7.5).

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        Rows = queries; computed in float64 on its device.
    row_order, col_order : int array of shape (N,) and (M,), optional
        The permutations organizing the axes (None: f is organized).
    allowed : bool array of shape (N, M), optional
        The mask in f's own order (docs/method.md §7.5): the mean and the block averages see f at
        every entry, the reference is the masked softmax, the approximation is 0 at masked entries.

    Returns
    -------
    Corollary1
        Arrays numpy or torch like f.

    Raises
    ------
    ValueError
        Naming f when the approximation is not representable in float64 (a row hundreds below the
        head's mean), or naming a bad argument.
    """
    return _corollary("corollary1", f, row_order, col_order, allowed)


def taylor_corollary1(f, row_order=None, col_order=None, allowed=None) -> Corollary1:
    """Corollary 1's Taylor variant, the first-order Taylor polynomial plus cross terms (docs/method.md §7.7).

    The paraproduct of docs/method.md §7.3 with every factor exp(E f) replaced by exp(0) = 1
    about the mean mu, g_{0,0} and the one-dimensional terms kept. The one-dimensional
    differences and the D terms then telescope to f - mu, so

        exp(f - mu) ~ 1 + (f - mu) + sum_{j,j'} Dx_{j,j'} f * Dy_{j,j'} f,

    the first-order Taylor polynomial of exp about the mean plus the paraproduct's cross terms;
    times exp(mu) it approximates exp(f), divided by the exact row sums Z_i (docs/method.md §7.5).
    Its error is O(|f - mu|^2): good for heads of small amplitude, poor for large ones. A named
    variant beside the paper's formula (`corollary1`).

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        Rows = queries; computed in float64 on its device.
    row_order, col_order : int array of shape (N,) and (M,), optional
        The permutations organizing the axes (None: f is organized).
    allowed : bool array of shape (N, M), optional
        The mask in f's own order, as `corollary1`'s.

    Returns
    -------
    Corollary1
        Arrays numpy or torch like f.

    Raises
    ------
    ValueError
        Naming f when the approximation is not representable in float64, or naming a bad
        argument.
    """
    return _corollary("taylor", f, row_order, col_order, allowed)


def residual_smoothness(f, row_order=None, col_order=None, allowed=None, quantile: float = 1.0,
                        min_count: int = 4) -> ResidualSmoothness:
    """Theorem 1's measures of one head (`THEOREM1_MEASURES`, docs/method.md §7.7).

    Every relative residual of `paraproduct.approximations` and uniform attention's, and the
    `haar_decay` exponents of its scores, its exact softmax and its paraproduct's residual in
    the organized order, the three in one batched call.

    Masked heads: the softmax and the residual are 0 at masked entries, which are not values of
    the head, so only the Haar coefficients on rectangles inside the allowed entries are fitted
    (`haar_decay`'s `allowed`); the scores, whose masked entries the model computes but does not
    use, are fitted by the same rule. Beyond float64 (docs/method.md §7.4) an approximation's
    residuals are +inf, `alpha_residual` is NaN where that is the paraproduct, and `note` says so.

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        Pre-softmax scores, rows = queries.
    row_order, col_order : int array of shape (N,) and (M,), optional
        As for `paraproduct.paraproduct`.
    allowed : bool array of shape (N, M), optional
        As for `paraproduct.paraproduct`.
    quantile : float, default 1.0
        As for `haar_decay`.
    min_count : int, default 4
        As for `haar_decay`.

    Returns
    -------
    ResidualSmoothness
        The measures, and the `HaarDecay` results behind the exponents.

    Raises
    ------
    ValueError
        Naming a bad argument.
    """
    ap = approximations(f, row_order, col_order, allowed)
    organized, exact = torch.as_tensor(ap.organized), torch.as_tensor(ap.exact)
    residual = exact - torch.as_tensor(ap.true_z)[0]
    if not bool(torch.isfinite(residual).all()):
        residual = torch.zeros_like(residual)    # no coefficient above 0 is fitted: alpha NaN
    mask = None if ap.allowed is None else torch.as_tensor(ap.allowed)
    decay = haar_decay(torch.stack([organized, exact, residual]), allowed=mask, quantile=quantile,
                       min_count=min_count)

    def one(i):
        return HaarDecay(alpha=float(decay.alpha[i]), r2=float(decay.r2[i]), rms=float(decay.rms[i]),
                         n_fitted=int(decay.n_fitted[i]), family=decay.family, level=decay.level,
                         log2_size=decay.log2_size[i], log2_magnitude=decay.log2_magnitude[i],
                         count=decay.count[i], fitted=decay.fitted[i], quantile=decay.quantile)

    scores, soft, res = one(0), one(1), one(2)
    measures = {}
    for k, name in enumerate(APPROXIMATIONS):
        measures[_TRUE_Z[name]] = float(ap.residual[k])
        measures[_SELFNORM[name]] = float(ap.selfnorm_residual[k])
    measures |= {"uniform_residual": ap.uniform_residual, "alpha_scores": scores.alpha,
                 "alpha_softmax": soft.alpha, "alpha_residual": res.alpha}
    bad = [_TRUE_Z[n] for n, ok in zip(APPROXIMATIONS, ap.representable) if not ok]
    note = ""
    if bad:
        tops = organized.amax(1)
        note = (f"f: beyond float64 (rows up to {float(tops.max() - tops.min()):.4g} apart in level): "
                f"{', '.join(bad)} recorded as +inf")
    return ResidualSmoothness(measures={k: measures[k] for k in THEOREM1_MEASURES}, alpha_scores=scores.alpha,
                              alpha_softmax=soft.alpha, alpha_residual=res.alpha,
                              residual=measures["residual"], corollary1_residual=measures["corollary1_residual"],
                              uniform_residual=ap.uniform_residual, scores_decay=scores, softmax_decay=soft,
                              residual_decay=res, note=note)


def theorem1_measures(f, row_order=None, col_order=None, allowed=None) -> tuple[np.ndarray, str]:
    """`THEOREM1_MEASURES` of one head, as an array, and the note on float64's range (docs/method.md §7.4).

    Parameters
    ----------
    f : array or Tensor of shape (N, M)
        Pre-softmax scores, rows = queries.
    row_order, col_order : int array of shape (N,) and (M,), optional
        As for `residual_smoothness`.
    allowed : bool array of shape (N, M), optional
        As for `residual_smoothness`.

    Returns
    -------
    measures : ndarray of shape (len(THEOREM1_MEASURES),)
        float64, in `THEOREM1_MEASURES` order.
    note : str
        "" or the note on the approximations beyond float64 (their residuals +inf,
        alpha_residual NaN with the paraproduct).
    """
    m = residual_smoothness(f, row_order, col_order, allowed)
    return np.array([m.measures[k] for k in THEOREM1_MEASURES], dtype=np.float64), m.note
