"""Figures of sparsity in the Haar bases (docs/method.md §3, §6): bi-Haar coefficients of heads (Figure 4),
per-head l1 entropy (Figure 5) and the network's top tri-Haar coefficients (Figure 6)."""
from __future__ import annotations

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from .style import (
    SEQUENTIAL,
    as_array,
    name_list,
    new_figure,
    same_shape,
    seq_clim,
    styled,
)

__all__ = ["fig4_bihaar", "fig5_entropy_heatmaps", "fig6_top_trihaar"]

_LOG_FLOOR = 1e-7  # relative round-off level below which bi-Haar coefficients count as 0


# -- Figure 4 --------------------------------------------------------------------------
def _support_axis(ax, support: np.ndarray) -> None:
    """Top axis naming the support size where it changes (a few ticks only)."""
    starts = np.flatnonzero(np.r_[True, support[1:] != support[:-1]])
    gap = support.size / 7  # at least this many indices between labelled ticks
    keep = [starts[0]]
    for st in starts[1:]:
        if st - keep[-1] >= gap:
            keep.append(st)
    keep = np.array(keep)
    top = ax.secondary_xaxis("top")
    top.set_xticks(keep, [f"{int(s)}" if float(s).is_integer() else f"{s:.3g}"
                          for s in support[keep]], fontsize=7)
    top.set_xlabel("support size", fontsize=8)


@styled
def fig4_bihaar(coeffs, supports, head_names, haar_vectors, title: str = "", *,
                n_vectors: int | None = None) -> Figure:
    """Paper Figure 4: bi-Haar expansion coefficients of heads and head-tree Haar vectors (docs/method.md §3).

    `coeffs[i]` are the bi-Haar coefficients of head `head_names[i]` (paper: two heads,
    the 400 of largest support), already sorted by support descending, with `supports[i]`
    their support sizes |Q-folder| x |K-folder|. Each gets a panel of |coefficient|
    against its index on a log scale. The scale stops at 1e-7 of the largest magnitude
    (float32 round-off): smaller coefficients, exact zeros included, are marked by grey
    triangles on the bottom edge instead of stretching the axis over 10 empty decades. The last panel draws the
    columns of `haar_vectors` (H, n_show) -- head-tree Haar vectors in the organized head
    order -- as stacked step plots (`n_vectors` of them; default all, at most 8).
    """
    coeffs = [as_array(c, f"coeffs[{i}]", 1) for i, c in enumerate(coeffs)]
    if not coeffs:
        raise ValueError("coeffs: expected at least one array of coefficients")
    supports = [as_array(s, f"supports[{i}]", 1) for i, s in enumerate(supports)]
    if len(supports) != len(coeffs):
        raise ValueError(f"supports: expected {len(coeffs)} arrays, got {len(supports)}")
    for i, (c, s) in enumerate(zip(coeffs, supports)):
        same_shape(c, f"coeffs[{i}]", **{f"supports[{i}]": s})
        if np.any(np.diff(s) > 0):
            raise ValueError(f"supports[{i}]: must be sorted by support descending")
    head_names = name_list(head_names, len(coeffs), "head_names")
    hv = as_array(haar_vectors, "haar_vectors", (1, 2))
    if hv.ndim == 1:
        hv = hv[:, None]
    n_show = min(hv.shape[1], 8) if n_vectors is None else int(n_vectors)
    if not 1 <= n_show <= hv.shape[1]:
        raise ValueError(f"n_vectors: expected 1..{hv.shape[1]}, got {n_vectors}")
    hv = hv[:, :n_show]

    k = len(coeffs)
    fig = new_figure(5.5 * (k + 1), 4.8)
    axes = fig.subplots(1, k + 1)
    for i, (ax, c, s, name) in enumerate(zip(axes, coeffs, supports, head_names)):
        mag = np.abs(c)
        x = np.arange(c.size)
        ax.plot(x, mag, ls="none", marker="o", ms=3, color=f"C{i}", gid="coefficients")
        top = float(mag.max())
        if top > 0:
            floor = top * _LOG_FLOOR
            ax.set_yscale("log", nonpositive="mask")
            shown = mag[mag >= floor]
            bottom = max(float(shown.min()) / 2, floor / 2)
            ax.set_ylim(bottom, top * 2)
            low = mag < floor
            if low.any():
                ax.plot(x[low], np.full(low.sum(), bottom), ls="none", marker="v", ms=4,
                        color="0.55", clip_on=False, gid="below-floor",
                        label=f"{low.sum()} below {_LOG_FLOOR:.0e}·max")
                ax.legend(loc="upper right", fontsize=8)
        else:
            ax.text(0.5, 0.5, "all coefficients are 0", transform=ax.transAxes, ha="center")
        ax.set_xlim(-0.5 - 0.01 * c.size, c.size - 0.5 + 0.01 * c.size)
        ax.grid(True, which="major")
        ax.set_xlabel("coefficient index (sorted by support, largest first)")
        ax.set_ylabel("|bi-Haar coefficient|")
        ax.set_title(f"({chr(97 + i)}) head {name}")
        _support_axis(ax, s)

    ax = axes[-1]
    h = hv.shape[0]
    x = np.arange(h)
    spacing = 2.2 * max(float(np.max(np.abs(hv))), 1e-12)
    for j in range(n_show):
        off = -j * spacing
        ax.axhline(off, color="0.8", lw=0.6, zorder=1)
        ax.plot(x, hv[:, j] + off, drawstyle="steps-mid", color=f"C{j % 10}", lw=1.3,
                marker="o" if h <= 40 else None, ms=2.5, gid="haar-vector")
    ax.set_yticks([-j * spacing for j in range(n_show)], [rf"$\psi_{{{j}}}$" for j in range(n_show)])
    ax.set_ylim(-(n_show - 0.45) * spacing, 0.55 * spacing)
    ax.set_xlim(-0.5 - 0.02 * h, h - 0.5 + 0.02 * h)
    ax.set_xlabel("head position (organized order)")
    ax.set_ylabel("Haar vector (stacked)")
    ax.set_title(f"({chr(97 + k)}) head-tree Haar vectors")
    if title:
        fig.suptitle(title)
    return fig


# -- Figure 5 --------------------------------------------------------------------------
@styled
def fig5_entropy_heatmaps(entropies, sample_names, title: str = "", *,
                          value_label: str = "per-head ℓ1 entropy", annotate: bool | None = None,
                          layers=None, heads=None) -> Figure:
    """Paper Figure 5: per-head l1 entropy (docs/method.md §6.2) as layer x head heatmaps, one per sample.

    `entropies` is (n_samples, n_layers, n_heads) (paper: 3 batches). All panels share
    one colour scale so batches compare directly; values are written in the cells when
    there are few enough of them (`annotate=None` decides: at most 256 cells, 16 heads).
    `layers`, `heads`: the model's indices of the rows and columns, when a subset was
    stored (extract.layers / extract.heads); None: 0, 1, ...
    """
    e = as_array(entropies, "entropies", (2, 3))
    if e.ndim == 2:
        e = e[None]
    s, n_layers, n_heads = e.shape
    sample_names = name_list(sample_names, s, "sample_names")
    if annotate is None:
        annotate = n_layers * n_heads <= 256 and n_heads <= 16
    clim = seq_clim(e)
    norm = Normalize(*clim)
    big = float(np.max(np.abs(e)))
    # three significant digits for the largest value, never scientific notation
    decimals = int(np.clip(2 - np.floor(np.log10(big)), 0, 3)) if big > 0 else 1
    ncols = min(s, 3)
    nrows = -(-s // ncols)
    panel_w = float(np.clip(0.42 * n_heads + 1.2, 3.0, 6.5))
    panel_h = float(np.clip(0.30 * n_layers + 1.3, 2.8, 6.5))
    fig = new_figure(panel_w * ncols + 1.2, panel_h * nrows + (0.5 if title else 0.2))
    axes = np.atleast_1d(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[s:]:
        ax.remove()
    for i in range(s):
        ax = axes[i]
        im = ax.imshow(e[i], cmap=SEQUENTIAL, vmin=clim[0], vmax=clim[1], aspect="auto",
                       interpolation="nearest")
        ax.set_title(sample_names[i])
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        for axis, n, labels, most in ((ax.xaxis, n_heads, heads, 12), (ax.yaxis, n_layers, layers, 16)):
            if labels is None or np.array_equal(np.asarray(labels), np.arange(n)):
                axis.set_major_locator(MaxNLocator(min(n, most), integer=True))
            else:
                at = np.arange(0, n, -(-n // most))
                axis.set_ticks(at, [str(int(np.asarray(labels)[i])) for i in at])
        if annotate:
            fs = 7 if n_heads <= 8 else 6
            for (r, c), v in np.ndenumerate(e[i]):
                ax.text(c, r, f"{v:.{decimals}f}", ha="center", va="center", fontsize=fs,
                        color="black" if norm(v) > 0.55 else "white")
    fig.colorbar(im, ax=axes[:s].tolist(), shrink=0.9, label=value_label)
    if title:
        fig.suptitle(title)
    return fig


# -- Figure 6 --------------------------------------------------------------------------
@styled
def fig6_top_trihaar(values, sample_names, title: str = "", *,
                     value_label: str | None = None) -> Figure:
    """Paper Figure 6: the top-k tri-Haar coefficients of the network, one series per sample.

    `values` is (n_samples, k) (paper: 5 batches, k = 100): coefficients (signed, or their
    magnitudes) of the k tri-Haar basis functions of largest support, sorted by support.
    The legend gives each sample's network l1 entropy, sum |values| (docs/method.md §6.2, Table 2).
    """
    v = as_array(values, "values", (1, 2))
    if v.ndim == 1:
        v = v[None]
    s, k = v.shape
    sample_names = name_list(sample_names, s, "sample_names")
    signed = bool(np.any(v < 0))
    if value_label is None:
        value_label = "tri-Haar coefficient" if signed else "|tri-Haar coefficient|"
    fig = new_figure(10, 5.2)
    ax = fig.subplots()
    x = np.arange(1, k + 1)
    markers = "osD^v<>ph*"
    for i in range(s):
        ax.plot(x, v[i], lw=0.9, alpha=0.9, marker=markers[i % len(markers)], ms=3.5,
                color=f"C{i % 10}", label=f"{sample_names[i]} (ℓ1 = {np.abs(v[i]).sum():.3g})",
                gid="sample")
    if signed:
        ax.axhline(0, color="0.5", lw=0.8, zorder=0)
    ax.set_xlim(0.5 - 0.01 * k, k + 0.5 + 0.01 * k)
    ax.xaxis.set_major_locator(MaxNLocator(10, integer=True, steps=[1, 2, 5, 10]))
    ax.grid(True)
    ax.set_xlabel(f"tri-Haar basis function, rank by support (1 = largest; top {k})")
    ax.set_ylabel(value_label)
    ax.legend(title="sample (network ℓ1 entropy)", ncols=1 if s <= 6 else 2, loc="best")
    ax.set_title(title or f"top-{k} tri-Haar coefficients of the network")
    return fig
