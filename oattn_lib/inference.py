"""Inference for the claims table (docs/method.md §13.1): one unit, one vote.

Every test of the table has an independent unit (a head, a sample, a random head order, a set of
heads) and an effect oriented so that a positive value favours the claim. The unit's repeated
measurements (a head's samples) are averaged first, so a head measured on 48 samples is one
vote, not 48. The effect is the mean of the units' values; its 95% interval comes from a
cluster bootstrap (whole units resampled with replacement); its one-sided p-value tests that the
effect exceeds the row's margin (the method's noise floor), and Holm's step-down procedure
corrects every p-value of the table together. A verdict then follows from the interval and the
adjusted p-value (`verdict`). Nothing here knows what a claim is: `claims` builds the rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

__all__ = ["ALPHA", "CLIP", "MIN_UNITS", "POWER", "Test", "bootstrap_interval", "exact_or_mc_test", "holm",
           "holm_multipliers", "one_sample_test", "permutation_p", "two_sample_test", "unit_values",
           "with_mde"]

ALPHA = 0.05
"""The level of every test, family-wise over the table after Holm's correction."""
POWER = 0.8
"""The power at which a row's smallest detectable effect is stated."""
MIN_UNITS = 5
"""Fewer units than this decide nothing: a bootstrap interval of 1 to 4 units is not an interval."""
CLIP = 20.0
"""Per-measurement effects are clipped to [-CLIP, CLIP] before they are averaged: a log ratio with an
infinite residual (an approximation beyond float64, or undefined) counts as e^20 times worse, not as
an infinity that would make every mean infinite."""


@dataclass(frozen=True)
class Test:
    """One test of the claims table.

    effect : the effect (mean over units of each unit's value), positive favours the claim.
    ci_low, ci_high : its 95% interval (cluster bootstrap over units, or the null's own spread where
    the row says so); NaN where there is no interval.
    p : one-sided p-value of "the effect is at most `margin`" (NaN: no test).
    margin : the margin the effect must clear (the noise floor; negative for an "at least" claim).
    n_units : the independent units; unit : what a unit is, in words.
    mde : the smallest effect detectable with power POWER at the level ALPHA / m (Bonferroni over the
    table's m tests, set by `holm`), inf where no effect could reach it (too few units or permutations);
    NaN before `holm` has run.
    p_min : the smallest p-value the design can give (exact and Monte Carlo tests), 0 for a t-test.
    se : the effect's standard error (the bootstrap's, or the t-test's); used for the mde.
    """

    effect: float
    ci_low: float
    ci_high: float
    p: float
    margin: float
    n_units: int
    unit: str
    p_min: float = 0.0
    se: float = float("nan")
    df: float = float("nan")
    null_quantiles: tuple = ()
    """Monte Carlo and exact tests: the null's effect at the levels 1 - ALPHA / m for m = 1, 2, ...
    is read from these (quantile level, value) pairs by `holm` for the mde."""
    mde: float = float("nan")


def unit_values(frame: pd.DataFrame, unit_columns, value: str) -> pd.Series:
    """Each unit's mean of `value` over its rows (one head, one vote), the values clipped to ±CLIP.

    frame : one row per measurement (a head-sample), with the `unit_columns` (e.g. layer, head) and
    `value`. Rows whose value is NaN are left out, and so is a unit with no such row. Returns a
    Series indexed by the unit columns."""
    cols = list(unit_columns)
    v = frame[cols].assign(_v=frame[value].to_numpy(dtype=float).clip(-CLIP, CLIP)).dropna(subset=["_v"])
    return v.groupby(cols)["_v"].mean()


def bootstrap_interval(values, n_boot: int, rng, level: float = 0.95) -> tuple[float, float, float]:
    """Percentile interval of the mean of `values` (one per unit) over `n_boot` resamplings of the
    units with replacement (a cluster bootstrap when each value is a unit's mean), and the
    bootstrap standard error. (NaN, NaN, NaN) for fewer than 2 values."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(rng)
    means = x[rng.integers(0, x.size, size=(n_boot, x.size))].mean(1)
    lo, hi = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi), float(means.std(ddof=1))


def one_sample_test(values, margin: float, unit: str, n_boot: int, rng) -> Test:
    """The mean of the units' `values` against `margin`: one-sided t-test (H0: mean <= margin),
    cluster-bootstrap 95% interval. With fewer than 2 units p = 1 (no test is possible)."""
    from scipy.stats import t as student

    x = np.asarray(values, dtype=float).clip(-CLIP, CLIP)
    x = x[~np.isnan(x)]
    n = x.size
    if n == 0:
        return Test(float("nan"), float("nan"), float("nan"), float("nan"), margin, 0, unit)
    effect = float(x.mean())
    lo, hi, _ = bootstrap_interval(x, n_boot, rng)
    if n < 2:
        return Test(effect, lo, hi, 1.0, margin, n, unit)
    sd = float(x.std(ddof=1))
    se = sd / np.sqrt(n)
    if se == 0.0:
        p = 0.0 if effect > margin else 1.0
    else:
        p = float(student.sf((effect - margin) / se, n - 1))
    return Test(effect, lo, hi, p, margin, n, unit, se=se, df=n - 1)


def two_sample_test(a, b, margin: float, unit: str, n_boot: int, rng) -> Test:
    """mean(a) - mean(b) against `margin` for two independent groups of units: Welch's one-sided
    t-test and a bootstrap interval resampling each group's units."""
    from scipy.stats import t as student

    a, b = (np.asarray(v, dtype=float) for v in (a, b))
    a, b = a[~np.isnan(a)], b[~np.isnan(b)]
    n = a.size + b.size
    if a.size == 0 or b.size == 0:
        return Test(float("nan"), float("nan"), float("nan"), float("nan"), margin, n, unit)
    effect = float(a.mean() - b.mean())
    rng = np.random.default_rng(rng)
    boot = (a[rng.integers(0, a.size, size=(n_boot, a.size))].mean(1)
            - b[rng.integers(0, b.size, size=(n_boot, b.size))].mean(1))
    lo, hi = (float(q) for q in np.quantile(boot, [0.025, 0.975]))
    if a.size < 2 or b.size < 2:
        return Test(effect, lo, hi, 1.0, margin, n, unit)
    va, vb = a.var(ddof=1) / a.size, b.var(ddof=1) / b.size
    se = float(np.sqrt(va + vb))
    if se == 0.0:
        return Test(effect, lo, hi, 0.0 if effect > margin else 1.0, margin, n, unit, se=0.0, df=n - 2)
    df = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    return Test(effect, lo, hi, float(student.sf((effect - margin) / se, df)), margin, n, unit, se=se, df=float(df))


def permutation_p(observed: float, null, exact: bool = False) -> float:
    """One-sided p-value of `observed` against draws of its null (larger is more extreme).

    exact: `null` is the statistic of every equally likely outcome, the observed one among them:
    the share at least as large. Otherwise `null` are Monte Carlo draws: (1 + at least as large) /
    (1 + draws), which never underestimates the p-value. Values within 1e-12 (relative) of the
    observed count as ties, so rounding does not decide."""
    z = np.asarray(null, dtype=float)
    tol = 1e-12 * max(1.0, abs(float(observed)))
    ge = int(np.sum(z >= observed - tol))
    if exact:
        return ge / z.size
    return (1 + ge) / (1 + z.size)


def exact_or_mc_test(observed: float, null, margin: float, unit: str, exact: bool, n_boot: int, rng) -> Test:
    """An effect measured against the draws of its null (a permutation or an enumerated null).

    effect = observed - mean(null); p = `permutation_p`, the probability of an effect at least as
    large under the null itself (no t approximation); the interval: a Monte Carlo null's mean is
    uncertain, so it is observed - mean over bootstrap resamplings of the null draws; an exact
    null's mean is exact and the interval is the point. `margin` is what the interval must clear
    (the claim's magnitude), stated with the test."""
    z = np.asarray(null, dtype=float)
    z = z[np.isfinite(z)]
    if z.size == 0 or not np.isfinite(observed):
        return Test(float("nan"), float("nan"), float("nan"), float("nan"), margin, int(z.size), unit)
    effect = float(observed - z.mean())
    if exact:
        lo = hi = effect
    else:
        rng = np.random.default_rng(rng)
        means = z[rng.integers(0, z.size, size=(n_boot, z.size))].mean(1)
        lo, hi = (float(observed - q) for q in np.quantile(means, [0.975, 0.025]))
    # the p-value is the null's own (no effect at all); the margin is for the interval
    p_min = 1.0 / z.size if exact else 1.0 / (1 + z.size)
    # an exact null holds the observed outcome itself: never below one outcome in all of them
    p = max(permutation_p(float(observed), z, exact=exact), p_min)
    levels = np.array([0.5, 0.8, 0.9, 0.95, 0.99, 0.995, 0.999, 0.9995, 0.9999, 0.99999])
    quantiles = tuple(zip(levels.tolist(), (np.quantile(z, levels) - z.mean()).tolist()))
    return Test(effect, lo, hi, p, margin, int(z.size), unit, p_min=p_min, null_quantiles=quantiles)


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error rate), NaN left out of the family and
    kept NaN: the i-th smallest of m p-values is multiplied by m - i + 1, then made
    non-decreasing in that order and capped at 1."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    m = idx.size
    if m == 0:
        return out
    order = idx[np.argsort(p[idx], kind="stable")]
    adj = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out[order] = adj
    return out


def holm_multipliers(pvalues) -> np.ndarray:
    """Each test's Holm multiplier m - i + 1 (i its rank among the m finite p-values), NaN for the
    rest: what a replicate's or half's p-value of that row is multiplied by (docs/method.md §13.1)."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    idx = np.flatnonzero(~np.isnan(p))
    order = idx[np.argsort(p[idx], kind="stable")]
    out[order] = idx.size - np.arange(idx.size)
    return out


def with_mde(test: Test, m: int) -> Test:
    """`test` with its smallest detectable effect at the level ALPHA / m and power POWER.

    t-tests: (t_{1-ALPHA/m} + t_{POWER}) times the standard error, on the t distribution of the
    test's degrees of freedom (plus the margin: the effect must clear it). Exact and Monte Carlo
    tests: inf where their smallest p-value exceeds ALPHA / m (no effect can be detected), else the
    larger of the margin and the null's effect at its 1 - ALPHA / m quantile (power is not
    modelled there: an effect at that quantile is detected about half the time)."""
    from scipy.stats import t as student

    level = ALPHA / max(m, 1)
    if np.isnan(test.p):
        return test
    if test.null_quantiles:
        if test.p_min > level:
            return replace(test, mde=float("inf"))
        lv = np.array([q[0] for q in test.null_quantiles])
        qv = np.array([q[1] for q in test.null_quantiles])
        return replace(test, mde=max(float(np.interp(1 - level, lv, qv)), test.margin))
    if test.n_units < 2 or not np.isfinite(test.se):
        return replace(test, mde=float("inf"))
    df = test.df if np.isfinite(test.df) else test.n_units - 1
    return replace(test, mde=float(test.margin + (student.ppf(1 - level, df) + student.ppf(POWER, df)) * test.se))

