"""Where Theorem 1 holds: the paraproduct's relative residual against logit temperature (docs/method.md §7.6).

Theorem 1 says the softmax of an organized head is approximately the paraproduct, a sum
of terms linear in the block differences of the head. The approximation is first order
in those differences, so it is good when the logits vary little within the blocks and
fails as they grow: scaling the logits f by a temperature tau (softmax(tau f)) moves a
head along that range, tau = 1 being the model as trained. `residual_curve` gives the
relative residual ||softmax - approximation|| / ||softmax|| at each tau, for any order
of the head's rows and columns, and `crossover` finds where the organized order stops
beating a baseline order (the original one, random ones).

Masked (causal) heads. The reference is the model's own masked softmax, never a softmax
over positions the model may not see. The paraproduct decomposes exp(tau f) pointwise
over the whole N x M grid, on the model's pre-mask scores (defined at every position:
docs/method.md §9.5); the masked softmax is the linear map "zero the masked entries, divide row i by
its masked sum Z_i" applied to exp(tau f), so applying it to every term of the
decomposition decomposes the masked softmax itself, term by term (`paraproduct`'s
`allowed`), exactly as it does for the unmasked row sums. So the block averages see the pre-mask
scores, and the residual is the exp residual on the allowed entries divided by the
masked row sums. `attention_mask` reads the mask from the model's stored probabilities.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


__all__ = ["Crossover", "attention_mask", "crossover", "crossover_counts", "geometric_mean", "relative_residual",
           "residual_curve", "temperature_grid"]


def temperature_grid(n: int, low: float = 0.1, high: float = 10.0) -> np.ndarray:
    """n logit temperatures log-spaced over [low, high], with tau = 1 (the model) always among them.

    An odd n on the default range puts 1 in the middle; otherwise 1 is added (n + 1 values).

    Parameters
    ----------
    n : int
        The number of log-spaced temperatures, at least 2.
    low, high : float, default 0.1 and 10.0
        The range, 0 < low <= 1 <= high.

    Returns
    -------
    ndarray of shape (n,) or (n + 1,)
        float64, increasing, one of them exactly 1.

    Raises
    ------
    ValueError
        If `n` is not an integer >= 2, or the range does not hold 1.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n: expected an integer >= 2, got {n!r}")
    if not 0 < low <= 1 <= high:
        raise ValueError(f"low, high: expected 0 < low <= 1 <= high, got {low!r}, {high!r}")
    taus = np.logspace(np.log10(low), np.log10(high), int(n))
    if not np.any(taus == 1.0):
        taus = np.sort(np.append(taus, 1.0))
    return taus


def attention_mask(probs) -> np.ndarray:
    """The model's mask, read from its own output: True where attention is forbidden.

    A position is masked where every head of the layer gives it probability 0: a causal or
    padding mask is shared by the heads of a layer, and an allowed position whose probability
    underflows to 0 in every head at once would need logits about 100 below each head's row
    maximum.

    Parameters
    ----------
    probs : array_like of shape (n_head, n_query, n_key)
        The post-softmax probabilities of every head of one layer, as the model computed them
        (masked entries exactly 0).

    Returns
    -------
    ndarray of shape (n_query, n_key)
        bool, True where attention is forbidden.

    Raises
    ------
    ValueError
        If `probs` is not 3-D.
    """
    p = np.asarray(probs)
    if p.ndim != 3:
        raise ValueError(f"probs: expected (head, query, key), got shape {p.shape}")
    return (p == 0).all(axis=0)


def relative_residual(logits, row_order=None, col_order=None, allowed=None) -> float:
    """||softmax - paraproduct approximation||_F / ||softmax||_F of one head (docs/method.md §7.6).

    With a mask, the reference is the masked softmax (module docstring); rows with no allowed
    entry are left out.

    Parameters
    ----------
    logits : array_like of shape (N, M)
        The head's pre-softmax scores in the model's order (rows = queries), taken in float64.
    row_order, col_order : array_like of int, shape (N,) and (M,), optional
        The orders the paraproduct organizes the rows and columns by (None: as given).
    allowed : array_like of bool, shape (N, M), optional
        False where the model masks attention (None: no mask).

    Returns
    -------
    float
        The relative residual.

    Raises
    ------
    ValueError
        When the result is not finite (`paraproduct` cannot represent it), or an argument is
        not valid.
    """
    from .paraproduct import paraproduct  # torch: not for the readers of curves (crossover, the claims)

    f = np.asarray(logits, dtype=np.float64)
    return float(paraproduct(f, row_order=row_order, col_order=col_order, allowed=allowed).relative_residual)


def residual_curve(logits, taus, row_order=None, col_order=None, allowed=None) -> np.ndarray:
    """`relative_residual` of tau * logits for every tau; NaN where it is not finite.

    The organized head and its block averages are computed once for all temperatures
    (`paraproduct.relative_residuals`). NaN marks a residual float64 cannot represent;
    a bad argument, such as a wrong order, is raised.

    Parameters
    ----------
    logits : array_like of shape (N, M)
        The head's pre-softmax scores in the model's order, taken in float64.
    taus : array_like of float, shape (T,)
        The temperatures, positive and finite (`temperature_grid`).
    row_order, col_order : array_like of int, shape (N,) and (M,), optional
        As `relative_residual`'s.
    allowed : array_like of bool, shape (N, M), optional
        As `relative_residual`'s.

    Returns
    -------
    ndarray of shape (T,)
        float64, the relative residual at each temperature.

    Raises
    ------
    ValueError
        If an argument is not valid.
    """
    from .paraproduct import relative_residuals

    return relative_residuals(np.asarray(logits, dtype=np.float64), taus, row_order, col_order, allowed=allowed)


@dataclass(frozen=True)
class Crossover:
    """Where a curve stops lying below a baseline curve, on a grid of temperatures.

    What `crossover` returns.

    Attributes
    ----------
    tau : float or None
        The first temperature at which `organized` stops beating (being below) the baseline,
        interpolated linearly in (log tau, log residual) between the two grid points that
        bracket it; None if it never stops. For "starts beating", where the curve goes below.
    status : {"beats throughout", "never beats", "stops beating", "starts beating"}
        "starts beating": below only from some tau on, never stopping.
    n_changes : int
        How many times the comparison changes along the grid.
    """

    tau: float | None
    status: str
    n_changes: int

    def where(self, low: float, high: float) -> str:
        """Where the curve lies below the baseline, in a few words: "τ < 2.4", "no τ in [0.1, 10]".

        Parameters
        ----------
        low, high : float
            The range of the grid.

        Returns
        -------
        str
            The temperatures where the curve lies below.
        """
        rng = f"[{low:.3g}, {high:.3g}]"
        if self.status in ("beats throughout", "never beats"):
            return f"all of {rng}" if self.status == "beats throughout" else f"no τ in {rng}"
        return f"τ {'>' if self.status == 'starts beating' else '<'} {self.tau:.3g}"

    def describe(self, baseline: str, low: float, high: float) -> str:
        """One clause in words, e.g. 'below the original order's for τ < 2.4 (crossover)'.

        Parameters
        ----------
        baseline : str
            What the curve is compared with, e.g. "original order's".
        low, high : float
            The range of the grid.

        Returns
        -------
        str
            The clause.
        """
        rng = f"[{low:.3g}, {high:.3g}]"
        if self.status == "beats throughout":
            return f"below the {baseline} over the whole range {rng} (no crossover)"
        if self.status == "never beats":
            return f"never below the {baseline} in {rng} (no crossover)"
        if self.status == "starts beating":
            return f"below the {baseline} only for τ > {self.tau:.3g} (no crossover back in {rng})"
        more = f"; the comparison changes {self.n_changes} times" if self.n_changes > 1 else ""
        return f"below the {baseline} for τ < {self.tau:.3g} (crossover){more}"


def crossover(taus, organized, baseline) -> Crossover:
    """Where `organized` (residuals on the grid `taus`) stops being below `baseline`.

    A residual that is not finite (NaN) counts as +inf: a finite residual beats it, and
    two non-finite ones do not beat each other.

    Parameters
    ----------
    taus : array_like of shape (T,)
        The temperatures, positive and increasing, at least two.
    organized : array_like of shape (T,)
        The organized order's residual at each temperature (`residual_curve`).
    baseline : array_like of shape (T,)
        The baseline's.

    Returns
    -------
    Crossover
        Where, and how, the comparison changes.

    Raises
    ------
    ValueError
        If the three are not 1-D of one length, or `taus` is not increasing and positive.
    """
    t = np.asarray(taus, dtype=np.float64)
    o = np.asarray(organized, dtype=np.float64)
    b = np.asarray(baseline, dtype=np.float64)
    if not (t.ndim == 1 and o.shape == t.shape == b.shape):
        raise ValueError(f"taus, organized, baseline: expected three 1-D arrays of one length, "
                         f"got shapes {t.shape}, {o.shape}, {b.shape}")
    if t.size < 2 or np.any(np.diff(t) <= 0) or np.any(t <= 0):
        raise ValueError("taus: expected at least two positive temperatures, increasing")
    o_inf = np.where(np.isfinite(o), o, np.inf)
    b_inf = np.where(np.isfinite(b), b, np.inf)
    beats = o_inf < b_inf
    changes = np.flatnonzero(beats[1:] != beats[:-1])
    if beats.all():
        return Crossover(None, "beats throughout", 0)
    if not beats.any():
        return Crossover(None, "never beats", 0)
    stops = [k for k in changes if beats[k]]
    k = int(stops[0]) if stops else int(changes[0])
    status = "stops beating" if stops else "starts beating"
    lt = np.log(t[k:k + 2])
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.log(o_inf[k:k + 2]) - np.log(b_inf[k:k + 2])
    if np.all(np.isfinite(d)) and d[0] != d[1]:
        tau = float(np.exp(lt[0] + (lt[1] - lt[0]) * (0 - d[0]) / (d[1] - d[0])))
    else:  # a non-finite side: the change happens somewhere in the bracket; take its upper end
        tau = float(t[k + 1])
    return Crossover(tau, status, int(changes.size))


def geometric_mean(curves, axis: int = -2) -> np.ndarray:
    """Geometric mean of residual curves along `axis`; NaN wherever one of them is NaN.

    Residuals span decades across heads and temperatures, so their typical value is a
    mean of logarithms; a non-finite member makes the mean not finite, never ignored.

    Parameters
    ----------
    curves : array_like of shape (..., n_curves, n_taus)
        The curves, positive.
    axis : int, default -2
        The axis averaged over (by default the curves of the stack).

    Returns
    -------
    ndarray
        float64, the shape of `curves` without `axis`: (..., n_taus) by default.
    """
    c = np.asarray(curves, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.exp(np.log(c).mean(axis=axis))


def crossover_counts(curves, baseline: str, organized: str = "2-D organized") -> dict:
    """Where each head-sample's organized curve stops beating its `baseline` curve, over a table.

    `crossover` on every head-sample at once: the organized curve on its own temperature grid, the
    baseline's at those temperatures; head-samples without both are left out. Random orders'
    curves are combined per head-sample by their geometric mean, NaN where one is NaN.

    Parameters
    ----------
    curves : pandas.DataFrame or mapping of columns
        The curves, one row per (sample, layer, head, order, seed, tau) with its `residual`: the
        theorem1 stage's table.
    baseline : str
        The `order` of the baseline curves ("original", "random", ...).
    organized : str, default "2-D organized"
        The `order` of the organized curves.

    Returns
    -------
    dict
        "n": the number of head-samples compared; "status": {status: count}
        (`Crossover.status`); "tau": the crossover temperatures of those that stop beating,
        sorted.
    """
    import pandas as pd

    df = pd.DataFrame(curves)
    key = ["sample", "layer", "head"]
    org = df[df["order"] == organized].pivot_table(index=key, columns="tau", values="residual", aggfunc="first",
                                                   dropna=False)
    base = df[df["order"] == baseline]
    with np.errstate(divide="ignore", invalid="ignore"):
        logs = base.assign(log=np.log(base["residual"].to_numpy(dtype=np.float64)))
    by = [logs[c] for c in key + ["tau"]]
    # the geometric mean over seeds, not finite where one seed is NaN (pandas' mean would skip it)
    gmean = np.exp(logs["log"].groupby(by).mean()).where(~logs["log"].isna().groupby(by).any())
    b = gmean.unstack("tau")
    both = org.index.intersection(b.index)
    if org.empty or both.empty:
        return {"n": 0, "status": {}, "tau": []}
    t = org.columns.to_numpy(dtype=np.float64)
    o = org.loc[both].to_numpy(dtype=np.float64)
    bb = b.loc[both].reindex(columns=org.columns).to_numpy(dtype=np.float64)
    o, bb = np.where(np.isfinite(o), o, np.inf), np.where(np.isfinite(bb), bb, np.inf)
    beats = o < bb
    stop = beats[:, :-1] & ~beats[:, 1:]                 # beating at k, not at k + 1
    k = stop.argmax(1)
    rows = np.arange(o.shape[0])
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d0 = np.log(o[rows, k]) - np.log(bb[rows, k])
        d1 = np.log(o[rows, k + 1]) - np.log(bb[rows, k + 1])
        lt0, lt1 = np.log(t[k]), np.log(t[k + 1])
        interp = np.exp(lt0 + (lt1 - lt0) * (0 - d0) / (d1 - d0))
    tau = np.where(np.isfinite(d0) & np.isfinite(d1) & (d0 != d1), interp, t[k + 1])
    status = np.where(beats.all(1), "beats throughout", np.where(~beats.any(1), "never beats",
                      np.where(stop.any(1), "stops beating", "starts beating")))
    names, counts = np.unique(status, return_counts=True)
    stops = status == "stops beating"
    return {"n": int(o.shape[0]), "status": {str(s): int(c) for s, c in zip(names, counts)},
            "tau": sorted(float(x) for x in tau[stops])}
