"""Figures of the paper (Fasina et al., Figures 1-6) and of the head-ablation study.

Every function takes plain arrays in (query, key, head) order and returns a matplotlib
`Figure`; nothing here reads or writes files except `save`, which writes one PNG
atomically. Figures are built without pyplot (no global figure registry), with one
shared look (`styled`), constrained layout, and titles and axis labels in the domain's
words: queries and keys, heads named "layer.head", Haar coefficients indexed by support.

Inputs are validated at the boundary: a wrong shape raises `ValueError` naming the
argument and the shape it got. Constant inputs render with a valid (widened) colour
scale and raise no warnings.
"""
from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import matplotlib as mpl
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import BoundaryNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator, PercentFormatter

from . import store

__all__ = ["DPI", "save", "new_figure", "styled", "fig1_organized_head", "fig2_paraproduct", "fig3_head_geometry",
           "fig4_bihaar", "fig5_entropy_heatmaps", "fig6_top_trihaar", "fig7_ablation"]

_LOG_FLOOR = 1e-7  # relative round-off level below which bi-Haar coefficients count as 0

DPI = 120
"""Resolution of saved PNGs: a figure of w x h inches is 120 w x 120 h pixels."""

SEQUENTIAL = "viridis"
DIVERGING = "RdBu_r"

_RC = {
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.labelsize": 10,
    "xtick.labelsize": 9,
    "ytick.labelsize": 9,
    "legend.fontsize": 9,
    "legend.framealpha": 0.85,
    "figure.titlesize": 13,
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "image.interpolation": "nearest",
    "image.origin": "upper",
    "axes.grid": False,
    "grid.alpha": 0.3,
    "lines.linewidth": 1.4,
}


# -- style and small helpers -----------------------------------------------------------
def styled(fn):
    """Build the figure under the project's one style (font sizes, white background)."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with mpl.rc_context(_RC):
            return fn(*args, **kwargs)
    return wrapper


def new_figure(width: float, height: float) -> Figure:
    """A pyplot-free figure with an Agg canvas and constrained layout."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _array(x, name: str, ndim: int | tuple[int, ...], finite: bool = True) -> np.ndarray:
    """`x` as float64 numpy (torch tensors accepted), validated like scikit-learn does."""
    if hasattr(x, "detach"):  # torch tensor, on any device; avoids importing torch here
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x, dtype=float)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: expected a numeric array ({exc})") from exc
    allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
    if a.ndim not in allowed:
        want = " or ".join(str(d) for d in allowed)
        raise ValueError(f"{name}: expected {want} dimensions, got shape {a.shape}")
    if a.size == 0:
        raise ValueError(f"{name}: has an axis of length 0 (shape {a.shape})")
    if finite and not np.isfinite(a).all():
        bad = tuple(int(i) for i in np.argwhere(~np.isfinite(a))[0])
        raise ValueError(f"{name}: contains NaN or inf (first at index {bad})")
    return a


def _same_shape(ref: np.ndarray, ref_name: str, **others: np.ndarray) -> None:
    for name, a in others.items():
        if a.shape != ref.shape:
            raise ValueError(f"{name}: expected the shape of {ref_name} {ref.shape}, got {a.shape}")


def _names(names, n: int, what: str) -> list[str]:
    names = [str(s) for s in names]
    if len(names) != n:
        raise ValueError(f"{what}: expected {n} names, got {len(names)}")
    return names


def _seq_clim(*arrays: np.ndarray, robust: bool = False) -> tuple[float, float]:
    """Shared colour limits; a constant input gets a widened, still valid, range.

    With `robust`, the upper limit is the 99.5th percentile of the pooled values, so a
    few dominant entries (a CLS or sink column) do not flatten the rest of the image.
    """
    lo = float(min(np.min(a) for a in arrays))
    hi = float(max(np.max(a) for a in arrays))
    if robust:
        q = float(np.percentile(np.concatenate([np.ravel(a) for a in arrays]), 99.5))
        hi = q if q > lo else hi
    if not hi - lo > 1e-12 * max(1.0, abs(lo), abs(hi)):
        pad = 0.5 * max(abs(lo), 1.0)
        lo, hi = lo - pad, hi + pad
    return lo, hi


def _sym_clim(*arrays: np.ndarray) -> tuple[float, float]:
    """Colour limits symmetric about 0 (diverging maps centred at zero)."""
    m = float(max(np.max(np.abs(a)) for a in arrays))
    if not m > 0:
        m = 1.0
    return -m, m


def _aspect(shape: tuple[int, int]) -> str:
    """Square pixels unless the matrix is so elongated that it would become a sliver."""
    return "equal" if max(shape) <= 4 * min(shape) else "auto"


def _heatmap(ax, img, clim, cmap, title, xlabel, ylabel):
    im = ax.imshow(img, cmap=cmap, vmin=clim[0], vmax=clim[1], aspect=_aspect(img.shape),
                   interpolation="nearest")
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(6, integer=True))
    return im


def _fmt(x: float) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3g}"


def _layer_of(label: str) -> int:
    """The layer of a head named like "3.5", "3:5", "(3, 5)" or "L3H5": its first integer."""
    m = re.search(r"\d+", str(label))
    if m is None:
        raise ValueError(f"unit_labels: cannot read a layer from {label!r}; expected 'layer.head'")
    return int(m.group())


def _tick_step(n: int, max_ticks: int) -> int:
    return max(1, -(-n // max_ticks))


# -- saving ----------------------------------------------------------------------------
def save(fig: Figure, path) -> Path:
    """Write `fig` as a PNG at `DPI` to `path` atomically, then close the figure.

    The image is written to a temporary sibling and renamed over `path`
    (`store.atomic_output`), so a reader (or Snakemake) never sees a half-written file.
    Figure size is kept as is (no tight bounding box): the PNG is DPI * figsize pixels.
    """
    path = Path(path)
    try:
        with store.atomic_output(path) as tmp, open(tmp, "wb") as fh:
            fig.savefig(fh, format="png", dpi=DPI)
    finally:
        # Only figures made through pyplot are registered there; ours never are.
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(fig)
    return path


# -- Figure 1 --------------------------------------------------------------------------
@styled
def fig1_organized_head(original, organized, title: str = "", *,
                        value_label: str = "attention", robust: bool = False) -> Figure:
    """Paper Figure 1: one attention head before and after its 2-D organization (SPEC 3.3).

    `original` and `organized` are (N queries, M keys); the organized head is the original
    with rows and columns permuted by the 2-D questionnaire's leaf orders. Both panels use
    one colour scale, so the permutation is the only difference the eye sees. With
    `robust`, the scale tops out at the 99.5th percentile (the colorbar says so).
    """
    original = _array(original, "original", 2)
    organized = _array(organized, "organized", 2)
    _same_shape(original, "original", organized=organized)
    clim = _seq_clim(original, organized, robust=robust)
    fig = new_figure(11, 5)
    axes = fig.subplots(1, 2)
    im = _heatmap(axes[0], original, clim, SEQUENTIAL, "original head", "key", "query")
    _heatmap(axes[1], organized, clim, SEQUENTIAL, "organized head (mixed Hölder)",
             "key (organized order)", "query (organized order)")
    fig.colorbar(im, ax=axes, shrink=0.85, label=value_label,
                 extend="max" if clim[1] < max(original.max(), organized.max()) else "neither")
    if title:
        fig.suptitle(title)
    return fig


# -- Figure 2 --------------------------------------------------------------------------
@styled
def fig2_paraproduct(exact, approximation, residual, rel_residual: float,
                     rel_residual_unorganized: float, title: str = "", *,
                     robust: bool = False) -> Figure:
    """Paper Figure 2: paraproduct decomposition of the softmax of an organized head (SPEC 5).

    Panels: the exact A(f) of the organized head, its paraproduct approximation (one
    shared colour scale), and the residual A(f) - approximation on a diverging scale
    centred at 0. The relative residual norms of the organized and of the unorganized
    head are written in the residual panel's title, since the paper's claim is that
    organization makes the approximation good. `robust` as in `fig1_organized_head`.
    """
    exact = _array(exact, "exact", 2)
    approximation = _array(approximation, "approximation", 2)
    residual = _array(residual, "residual", 2)
    _same_shape(exact, "exact", approximation=approximation, residual=residual)
    rel, rel_u = float(rel_residual), float(rel_residual_unorganized)
    clim = _seq_clim(exact, approximation, robust=robust)
    fig = new_figure(16, 5.4)
    axes = fig.subplots(1, 3)
    xl, yl = "key (organized order)", "query (organized order)"
    im = _heatmap(axes[0], exact, clim, SEQUENTIAL, "softmax of organized head", xl, yl)
    _heatmap(axes[1], approximation, clim, SEQUENTIAL, "paraproduct approximation", xl, yl)
    fig.colorbar(im, ax=axes[:2], shrink=0.85, label="attention",
                 extend="max" if clim[1] < max(exact.max(), approximation.max()) else "neither")
    im_r = _heatmap(axes[2], residual, _sym_clim(residual), DIVERGING,
                    "residual = softmax − approximation\n"
                    rf"$\|res\|/\|A(f)\|$ = {_fmt(rel)} (unorganized: {_fmt(rel_u)})", xl, yl)
    fig.colorbar(im_r, ax=axes[2], shrink=0.85, label="residual")
    sup = f"{title}\n" if title else ""
    fig.suptitle(f"{sup}paraproduct relative residual: organized {_fmt(rel)}, "
                 f"unorganized {_fmt(rel_u)}")
    return fig


# -- Figure 3 --------------------------------------------------------------------------
def _layer_colours(layers: np.ndarray):
    lo, hi = int(layers.min()), int(layers.max())
    n = hi - lo + 1
    cmap = mpl.colormaps["tab10" if n <= 10 else "viridis"].resampled(n)
    norm = BoundaryNorm(np.arange(lo - 0.5, hi + 1.0), n)
    return cmap, norm


def _tree_folders(labels: np.ndarray, pos: np.ndarray):
    """Per folder (level by level): its level and the first and last leaf positions."""
    out = []
    for lev in range(labels.shape[0]):
        _, folder = np.unique(labels[lev], return_inverse=True)
        nf = int(folder.max()) + 1
        left = np.full(nf, np.inf)
        right = np.full(nf, -np.inf)
        np.minimum.at(left, folder, pos)
        np.maximum.at(right, folder, pos)
        srt = np.argsort(left, kind="stable")
        out.extend((lev, a, b) for a, b in zip(left[srt], right[srt]))
    return out


def _spread_points(z: np.ndarray, k: int) -> np.ndarray:
    """k points spread over the cloud: the outermost first, then farthest-point picks."""
    first = int(np.argmax(np.linalg.norm(z, axis=1)))
    chosen = [first]
    dist = np.linalg.norm(z - z[first], axis=1)
    for _ in range(min(k, len(z)) - 1):
        nxt = int(np.argmax(dist))
        if dist[nxt] == 0:
            break
        chosen.append(nxt)
        dist = np.minimum(dist, np.linalg.norm(z - z[nxt], axis=1))
    return np.array(chosen)


@styled
def fig3_head_geometry(coords, affinity, tree_labels, unit_labels, order, title: str = "") -> Figure:
    """Paper Figure 3: the network's heads as organized by the 3-D questionnaire (SPEC 3, 6).

    Panels: (a) diffusion map psi_1..psi_3 of the head affinity (`coords`, (H, 3); fewer
    columns are padded with 0), coloured by layer, with the most outlying heads named;
    (b) the head affinity in the organized order, ``affinity[order][:, order]``;
    (c) the head tree as nested partitions: level on the y axis (root at the top), heads
    in `order` on the x axis, each folder a horizontal bar spanning its heads (neighbours
    in alternating shades) and linked to its parent; a folder is one bar when `order` is
    the tree's depth-first order. `tree_labels` is ``PartitionTree.labels`` (n_levels, H); `unit_labels`
    names the heads "layer.head" in head-index order.
    """
    coords = _array(coords, "coords", (1, 2))
    if coords.ndim == 1:
        coords = coords[:, None]
    n = coords.shape[0]
    affinity = _array(affinity, "affinity", 2)
    if affinity.shape != (n, n):
        raise ValueError(f"affinity: expected shape {(n, n)} (heads x heads), got {affinity.shape}")
    tree_labels = np.asarray(tree_labels)
    if tree_labels.ndim != 2 or tree_labels.shape[1] != n:
        raise ValueError(f"tree_labels: expected shape (n_levels, {n}), got {tree_labels.shape}")
    order = np.asarray(order)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order: expected a permutation of range({n}), got shape {order.shape}")
    unit_labels = _names(unit_labels, n, "unit_labels")
    layers = np.array([_layer_of(s) for s in unit_labels])
    xyz = np.zeros((n, 3))
    xyz[:, :min(3, coords.shape[1])] = coords[:, :3]
    cmap, norm = _layer_colours(layers)

    fig = new_figure(18, 6)
    gs = fig.add_gridspec(1, 3, width_ratios=[1.1, 1, 1.25])

    # (a) diffusion map
    ax = fig.add_subplot(gs[0], projection="3d")
    sc = ax.scatter(xyz[:, 0], xyz[:, 1], xyz[:, 2], c=layers, cmap=cmap, norm=norm,
                    s=28, depthshade=False, edgecolors="k", linewidths=0.3)
    for i, lab in enumerate((r"$\psi_1$", r"$\psi_2$", r"$\psi_3$")):
        padded = i >= coords.shape[1]
        getattr(ax, f"set_{'xyz'[i]}label")(lab + (" (not given: 0)" if padded else ""))
        lo, hi = _seq_clim(xyz[:, i])
        if np.ptp(xyz[:, i]) == 0:  # constant coordinate: give the axis a valid range
            getattr(ax, f"set_{'xyz'[i]}lim")(lo, hi)
    ax.tick_params(labelsize=7)
    spread = xyz.std(axis=0)
    z = (xyz - np.median(xyz, axis=0)) / np.where(spread > 0, spread, 1.0)
    for i in _spread_points(z, 7):
        ax.text(*xyz[i], f" {unit_labels[i]}", fontsize=8)
    ax.set_title("(a) diffusion map of heads")
    cb = fig.colorbar(sc, ax=ax, shrink=0.6, pad=0.1, label="layer")
    lo, hi = int(layers.min()), int(layers.max())
    cb.set_ticks(np.arange(lo, hi + 1, _tick_step(hi - lo + 1, 8)))

    # (b) affinity, organized
    ax = fig.add_subplot(gs[1])
    a_org = affinity[order][:, order]
    im = _heatmap(ax, a_org, _seq_clim(a_org), SEQUENTIAL, "(b) head affinity, organized order",
                  "head (layer.head)", "head (layer.head)")
    step = _tick_step(n, 36)
    ticks = np.arange(0, n, step)
    names = [unit_labels[i] for i in order[ticks]]
    tick_fs = 6 if n > 48 else 8
    ax.set_xticks(ticks, names, rotation=90, fontsize=tick_fs)
    ax.set_yticks(ticks, names, fontsize=tick_fs)
    fig.colorbar(im, ax=ax, shrink=0.8, label="affinity")

    # (c) head tree
    ax = fig.add_subplot(gs[2])
    pos = np.empty(n)
    pos[order] = np.arange(n)
    folders = _tree_folders(tree_labels, pos)
    half = 0.2  # bar half-height, in levels
    rects = [[(a - 0.5, lev - half), (b + 0.5, lev - half), (b + 0.5, lev + half),
              (a - 0.5, lev + half)] for lev, a, b in folders]
    shade = [("0.25", "0.6")[j % 2] for j in range(len(folders))]  # neighbours alternate
    links = [[(0.5 * (a + b), lev - half), (0.5 * (a + b), lev - 1 + half)]
             for lev, a, b in folders if lev > 0]
    ax.add_collection(LineCollection(links, colors="0.55", linewidths=0.8, gid="links"))
    ax.add_collection(PolyCollection(rects, facecolors=shade, edgecolors="white",
                                     linewidths=0.5, gid="folders"))
    leaf = tree_labels.shape[0] - 1
    ax.scatter(np.arange(n), np.full(n, leaf + 0.6), c=layers[order], cmap=cmap, norm=norm,
               s=14, marker="s", clip_on=False, zorder=3, gid="leaf-layers")
    ax.set_xlim(-1, n)
    ax.set_ylim(leaf + 0.9, -0.5)  # root at the top
    ax.set_xticks(ticks, names, rotation=90, fontsize=tick_fs)
    ax.set_yticks(np.arange(0, leaf + 1, _tick_step(leaf + 1, 12)))
    ax.set_xlabel("head (layer.head), organized order; squares coloured by layer")
    ax.set_ylabel("tree level (0 = root)")
    ax.set_title("(c) head tree (folders as bars)")
    if title:
        fig.suptitle(title)
    return fig


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
    """Paper Figure 4: bi-Haar expansion coefficients of heads and head-tree Haar vectors (SPEC 2).

    `coeffs[i]` are the bi-Haar coefficients of head `head_names[i]` (paper: two heads,
    the 400 of largest support), already sorted by support descending, with `supports[i]`
    their support sizes |Q-folder| x |K-folder|. Each gets a panel of |coefficient|
    against its index on a log scale. The scale stops at 1e-7 of the largest magnitude
    (float32 round-off): smaller coefficients, exact zeros included, are marked by grey
    triangles on the bottom edge instead of stretching the axis over 10 empty decades. The last panel draws the
    columns of `haar_vectors` (H, n_show) -- head-tree Haar vectors in the organized head
    order -- as stacked step plots (`n_vectors` of them; default all, at most 8).
    """
    coeffs = [_array(c, f"coeffs[{i}]", 1) for i, c in enumerate(coeffs)]
    if not coeffs:
        raise ValueError("coeffs: expected at least one array of coefficients")
    supports = [_array(s, f"supports[{i}]", 1) for i, s in enumerate(supports)]
    if len(supports) != len(coeffs):
        raise ValueError(f"supports: expected {len(coeffs)} arrays, got {len(supports)}")
    for i, (c, s) in enumerate(zip(coeffs, supports)):
        _same_shape(c, f"coeffs[{i}]", **{f"supports[{i}]": s})
        if np.any(np.diff(s) > 0):
            raise ValueError(f"supports[{i}]: must be sorted by support descending")
    head_names = _names(head_names, len(coeffs), "head_names")
    hv = _array(haar_vectors, "haar_vectors", (1, 2))
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
                          value_label: str = "per-head ℓ1 entropy", annotate: bool | None = None) -> Figure:
    """Paper Figure 5: per-head l1 entropy (SPEC 4) as layer x head heatmaps, one per sample.

    `entropies` is (n_samples, n_layers, n_heads) (paper: 3 batches). All panels share
    one colour scale so batches compare directly; values are written in the cells when
    there are few enough of them (`annotate=None` decides: at most 256 cells, 16 heads).
    """
    e = _array(entropies, "entropies", (2, 3))
    if e.ndim == 2:
        e = e[None]
    s, n_layers, n_heads = e.shape
    sample_names = _names(sample_names, s, "sample_names")
    if annotate is None:
        annotate = n_layers * n_heads <= 256 and n_heads <= 16
    clim = _seq_clim(e)
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
        ax.xaxis.set_major_locator(MaxNLocator(min(n_heads, 12), integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(min(n_layers, 16), integer=True))
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
    The legend gives each sample's network l1 entropy, sum |values| (SPEC 4, Table 2).
    """
    v = _array(values, "values", (1, 2))
    if v.ndim == 1:
        v = v[None]
    s, k = v.shape
    sample_names = _names(sample_names, s, "sample_names")
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


# -- Figure 7 (head ablation; not in the paper) ----------------------------------------
@styled
def fig7_ablation(fractions, curves: dict, metric_name: str, title: str = "") -> Figure:
    """Head-ablation study (beyond the paper): a metric against the fraction of heads masked.

    `curves` maps a ranking's name to its metric at each of `fractions` (n_k,); a 2-D
    (n_seeds, n_k) entry (a random ranking) is drawn as its mean with a min-max band.
    """
    f = _array(fractions, "fractions", 1)
    if not curves:
        raise ValueError("curves: expected at least one ranking")
    fig = new_figure(8.5, 5.2)
    ax = fig.subplots()
    for i, (name, y) in enumerate(curves.items()):
        y = _array(y, f"curves[{name!r}]", (1, 2))
        if y.shape[-1] != f.size:
            raise ValueError(f"curves[{name!r}]: expected last axis of length {f.size} "
                             f"(one value per fraction), got shape {y.shape}")
        col = f"C{i % 10}"
        if y.ndim == 2:
            ax.fill_between(f, y.min(0), y.max(0), color=col, alpha=0.2, lw=0,
                            gid="band", label=f"{name}: min–max over {y.shape[0]} seeds")
            ax.plot(f, y.mean(0), color=col, marker="o", ms=4, gid="ranking",
                    label=f"{name} (mean)")
        else:
            ax.plot(f, y, color=col, marker="o", ms=4, gid="ranking", label=name)
    ax.xaxis.set_major_formatter(PercentFormatter(1.0))
    ax.grid(True)
    ax.set_xlabel("fraction of heads masked")
    ax.set_ylabel(metric_name)
    ax.legend(title="head ranking", loc="best")
    ax.set_title(title or f"{metric_name} vs. fraction of heads masked")
    return fig
