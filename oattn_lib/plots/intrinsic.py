"""Figures of one head (docs/method.md §5.3, §7): its 2-D organization (Figure 1), the paraproduct
decomposition of its softmax (Figure 2), and where that decomposition holds (the relative
residual against logit temperature)."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .style import (
    DIVERGING,
    SEQUENTIAL,
    as_array,
    heatmap,
    name_list,
    new_figure,
    same_shape,
    seq_clim,
    styled,
    sym_clim,
)

__all__ = ["fig1_organized_head", "fig2_paraproduct", "fig_temperature", "fig_not_run", "head_view",
           "folder_boundaries"]


def _fmt(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"


# -- Figure 1 --------------------------------------------------------------------------
@styled
def fig1_organized_head(original, organized, title: str = "", *,
                        value_label: str = "attention", robust: bool = False) -> Figure:
    """Paper Figure 1: one attention head before and after its 2-D organization (docs/method.md §5.3).

    `original` and `organized` are (N queries, M keys); the organized head is the original
    with rows and columns permuted by the 2-D questionnaire's leaf orders. Both panels use
    one colour scale, so the permutation is the only difference the eye sees. With
    `robust`, the scale tops out at the 99.5th percentile (the colorbar says so).
    """
    original = as_array(original, "original", 2)
    organized = as_array(organized, "organized", 2)
    same_shape(original, "original", organized=organized)
    clim = seq_clim(original, organized, robust=robust)
    fig = new_figure(11, 5)
    axes = fig.subplots(1, 2)
    im = heatmap(axes[0], original, clim, SEQUENTIAL, "original head", "key", "query")
    heatmap(axes[1], organized, clim, SEQUENTIAL, "organized head (mixed Hölder)",
             "key (organized order)", "query (organized order)")
    fig.colorbar(im, ax=axes, shrink=0.85, label=value_label,
                 extend="max" if clim[1] < max(original.max(), organized.max()) else "neither")
    if title:
        fig.suptitle(title)
    return fig


# -- one head in a notebook ---------------------------------------------------------
def folder_boundaries(labels: np.ndarray, order: np.ndarray, levels: int = 3) -> list[np.ndarray]:
    """Where the folders of a partition tree's coarsest levels meet, in its leaf order.

    Parameters
    ----------
    labels : ndarray of int, shape (n_levels, n)
        The tree's folder labels per level, the root first (docs/method.md §2.1).
    order : ndarray of int, shape (n,)
        The tree's leaf order: order[p] is the item at position p.
    levels : int
        How many levels with more than one folder are given, the coarsest first.

    Returns
    -------
    list of ndarray of int
        Per level, the positions p (1..n-1) where a new folder starts.
    """
    out = []
    for row in np.asarray(labels)[:, np.asarray(order)]:
        cut = np.flatnonzero(row[1:] != row[:-1]) + 1
        if cut.size and (not out or not np.array_equal(cut, out[-1])):
            out.append(cut)
        if len(out) == levels:
            break
    return out


def _token_ticks(ax, axis: str, labels: list[str], max_labels: int) -> None:
    n = len(labels)
    step = max(1, -(-n // max_labels))
    at = np.arange(0, n, step)
    getattr(ax, f"set_{axis}ticks")(at)
    getattr(ax, f"set_{axis}ticklabels")([labels[i] for i in at], fontsize=7 if n > 24 else 8,
                                          rotation=90 if axis == "x" else 0)


@styled
def head_view(head, tree_q, tree_k, tokens, *, residual=None, note: str = "", title: str = "",
              value_label: str = "attention", max_labels: int = 48) -> Figure:
    """One head as the model computed it, the same head in the network's organized order with
    the coarse folders of its query and key trees drawn, and its paraproduct residual
    (docs/method.md §5, §7), with the tokens as labels.

    Parameters
    ----------
    head : ndarray of shape (n_query, n_key)
    tree_q, tree_k : ndarray of int, shape (n_levels, n_query) and (n_levels, n_key)
        The network's query and key trees (folder labels per level, the root first).
    tokens : list of str
        Each position's token as shown.
    residual : tuple, optional
        (residual (n_query, n_key) in its own organized order, the row order, the column
        order, the relative residual organized, in the original order); None draws `note`.
    note : str
        Why there is no residual panel.
    max_labels : int
        Up to this many tokens are written per axis; more are thinned.
    """
    from ..trees import PartitionTree

    head = as_array(head, "head", 2)
    tq, tk = np.asarray(tree_q), np.asarray(tree_k)
    if tq.shape[-1] != head.shape[0] or tk.shape[-1] != head.shape[1]:
        raise ValueError(f"tree_q, tree_k: order {tq.shape[-1]} x {tk.shape[-1]} items, the head is {head.shape}")
    if len(tokens) < max(head.shape):
        raise ValueError(f"tokens: {len(tokens)} labels for a head of {head.shape}")
    oq, ok = PartitionTree(tq).order, PartitionTree(tk).order
    organized = head[np.ix_(oq, ok)]
    clim = seq_clim(head, organized, robust=True)
    fig = new_figure(18, 6.4)
    axes = fig.subplots(1, 3)
    im = heatmap(axes[0], head, clim, SEQUENTIAL, "as computed", "key", "query")
    heatmap(axes[1], organized, clim, SEQUENTIAL, "organized (network's trees)", "key", "query")
    for ax, rows, cols in ((axes[0], np.arange(head.shape[0]), np.arange(head.shape[1])), (axes[1], oq, ok)):
        _token_ticks(ax, "y", [tokens[i] for i in rows], max_labels)
        _token_ticks(ax, "x", [tokens[i] for i in cols], max_labels)
    for width, (bq, bk) in zip((1.6, 0.9, 0.5), zip(folder_boundaries(tq, oq), folder_boundaries(tk, ok))):
        for b in bq:
            axes[1].axhline(b - 0.5, color="white", lw=width)
        for b in bk:
            axes[1].axvline(b - 0.5, color="white", lw=width)
    fig.colorbar(im, ax=axes[:2], shrink=0.8, label=value_label,
                 extend="max" if clim[1] < max(head.max(), organized.max()) else "neither")
    if residual is None:
        axes[2].axis("off")
        axes[2].text(0.5, 0.5, note, ha="center", va="center", wrap=True, transform=axes[2].transAxes)
    else:
        res, rows, cols, rel, rel_u = residual
        im_r = heatmap(axes[2], np.asarray(res), sym_clim(np.asarray(res)), DIVERGING,
                       f"paraproduct residual (own 2-D organization)\nrelative {_fmt(rel)}; "
                       f"in the original order {_fmt(rel_u)}", "key", "query")
        _token_ticks(axes[2], "y", [tokens[int(i)] for i in rows], max_labels)
        _token_ticks(axes[2], "x", [tokens[int(i)] for i in cols], max_labels)
        fig.colorbar(im_r, ax=axes[2], shrink=0.8, label="softmax − approximation")
    if title:
        fig.suptitle(title)
    return fig


# -- Figure 2 --------------------------------------------------------------------------
@styled
def fig2_paraproduct(exact, approximation, residual, rel_residual: float,
                     rel_residual_unorganized: float, title: str = "", *,
                     robust: bool = False) -> Figure:
    """Paper Figure 2: paraproduct decomposition of the softmax of an organized head (docs/method.md §7).

    Panels: the exact A(f) of the organized head, its paraproduct approximation (one
    shared colour scale), and the residual A(f) - approximation on a diverging scale
    centred at 0. The relative residual norms of the organized and of the unorganized
    head are written in the residual panel's title, since the paper's claim is that
    organization makes the approximation good. `robust` as in `fig1_organized_head`.
    """
    exact = as_array(exact, "exact", 2)
    approximation = as_array(approximation, "approximation", 2)
    residual = as_array(residual, "residual", 2)
    same_shape(exact, "exact", approximation=approximation, residual=residual)
    rel, rel_u = float(rel_residual), float(rel_residual_unorganized)
    clim = seq_clim(exact, approximation, robust=robust)
    fig = new_figure(16, 5.4)
    axes = fig.subplots(1, 3)
    xl, yl = "key (organized order)", "query (organized order)"
    im = heatmap(axes[0], exact, clim, SEQUENTIAL, "softmax of organized head", xl, yl)
    heatmap(axes[1], approximation, clim, SEQUENTIAL, "paraproduct approximation", xl, yl)
    fig.colorbar(im, ax=axes[:2], shrink=0.85, label="attention",
                 extend="max" if clim[1] < max(exact.max(), approximation.max()) else "neither")
    im_r = heatmap(axes[2], residual, sym_clim(residual), DIVERGING,
                    "residual = softmax − approximation\n"
                    rf"$\|res\|/\|A(f)\|$ = {_fmt(rel)} (unorganized: {_fmt(rel_u)})", xl, yl)
    fig.colorbar(im_r, ax=axes[2], shrink=0.85, label="residual")
    sup = f"{title}\n" if title else ""
    fig.suptitle(f"{sup}paraproduct relative residual: organized {_fmt(rel)}, "
                 f"unorganized {_fmt(rel_u)}")
    return fig


@styled
def fig_not_run(title: str, reason: str) -> Figure:
    """A figure that could not be computed for a model: its `title` and the `reason`, as text
    (Figure 2 and the temperature figure of attention files without pre-softmax scores)."""
    fig = new_figure(8, 3)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{title}\nnot run: {reason}", ha="center", va="center", wrap=True)
    return fig


# -- Where Theorem 1 holds ---------------------------------------------------------------
@styled
def fig_temperature(taus, curves: dict, head_names, title: str = "", *, marks=None,
                    model_tau: float = 1.0) -> Figure:
    """The paraproduct's relative residual against logit temperature, one panel per head (docs/method.md §7.6).

    `taus` (T,) increasing; `curves` maps an order's name (e.g. "2-D organized",
    "original", "random") to residuals (n_heads, n_curves, T), NaN where not finite. Each
    order is drawn as the geometric mean of its curves (as `temperature.geometric_mean`)
    with a min-max band when it has several; temperatures where a curve is not finite are
    marked by crosses on the panel's top edge. Both axes are logarithmic; the model's own
    temperature `model_tau` is a vertical line. `marks[i]` optionally maps a baseline order
    (a key of `curves`) to the temperature where the first order stops beating it on
    head i (None: nowhere), drawn as a dotted line in the baseline's colour.
    """
    t = as_array(taus, "taus", 1)
    if np.any(t <= 0) or np.any(np.diff(t) <= 0):
        raise ValueError("taus: expected positive temperatures, increasing")
    if not curves:
        raise ValueError("curves: expected at least one order")
    arrays = {}
    for name, c in curves.items():
        a = as_array(c, f"curves[{name!r}]", 3, finite=False)
        if a.shape[-1] != t.size:
            raise ValueError(f"curves[{name!r}]: expected last axis of length {t.size} (one value "
                             f"per tau), got shape {a.shape}")
        arrays[name] = a
    n_heads = next(iter(arrays.values())).shape[0]
    for name, a in arrays.items():
        if a.shape[0] != n_heads:
            raise ValueError(f"curves[{name!r}]: expected {n_heads} heads, got shape {a.shape}")
    head_names = name_list(head_names, n_heads, "head_names")
    marks = [{} for _ in range(n_heads)] if marks is None else list(marks)
    if len(marks) != n_heads:
        raise ValueError(f"marks: expected {n_heads} mappings (one per head), got {len(marks)}")
    first = next(iter(arrays))
    fig = new_figure(5.2 * n_heads + 0.6, 4.6)
    axes = np.atleast_1d(fig.subplots(1, n_heads, squeeze=False).ravel())
    for i, ax in enumerate(axes):
        for j, (name, a) in enumerate(arrays.items()):
            col = f"C{j % 10}"
            c = a[i]
            with np.errstate(divide="ignore"):  # temperature.geometric_mean, without importing torch
                mid = np.exp(np.log(c).mean(axis=0))
            n = c.shape[0]
            finite = np.isfinite(c)
            if n > 1:  # min-max over the finite curves at each tau
                some = finite.any(axis=0)
                lo = np.where(some, np.where(finite, c, np.inf).min(axis=0), np.nan)
                hi = np.where(some, np.where(finite, c, -np.inf).max(axis=0), np.nan)
                ax.fill_between(t, lo, hi, color=col, alpha=0.18, lw=0, gid="band")
            label = f"{name} (geometric mean of {n}; band: min–max)" if n > 1 else name
            ax.plot(t, mid, color=col, marker="o", ms=3.5, gid="order", label=label)
            bad = ~finite.all(axis=0)
            if bad.any():
                ax.plot(t[bad], np.ones(bad.sum()), ls="none", marker="x", color=col, ms=7, mew=1.6,
                        clip_on=False, transform=ax.get_xaxis_transform(), gid="not-finite",
                        label=f"{name}: not finite")
        ax.axvline(model_tau, color="0.3", lw=1.0, ls="--", gid="model-tau", label=f"model (τ = {model_tau:g})")
        for name, tau in (marks[i] or {}).items():
            if name not in arrays:
                raise ValueError(f"marks[{i}]: {name!r} is not an order of curves ({list(arrays)})")
            if tau is not None and np.isfinite(tau):
                ax.axvline(tau, color=f"C{list(arrays).index(name) % 10}", lw=1.0, ls=":", gid="crossover",
                           label=f"{first} stops beating {name}: τ = {tau:.3g}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.grid(True, which="major")
        ax.set_xlabel("logit temperature τ (softmax of τ · logits)")
        ax.set_ylabel(r"relative residual $\|res\| / \|A(\tau f)\|$")
        ax.set_title(f"head {head_names[i]}")
        ax.legend(loc="upper left", fontsize=7)
    if title:
        fig.suptitle(title)
    return fig
