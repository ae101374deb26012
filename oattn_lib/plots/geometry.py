"""Figure 3: the network's heads as organized by the 3-D questionnaire (docs/method.md §5, §8)."""
from __future__ import annotations

import re

import matplotlib as mpl
import numpy as np
from matplotlib.collections import LineCollection, PolyCollection
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure

from .style import (
    SEQUENTIAL,
    as_array,
    heatmap,
    name_list,
    new_figure,
    seq_clim,
    styled,
)

__all__ = ["fig3_head_geometry"]


def _layer_of(label: str) -> int:
    """The layer of a head named like "3.5", "3:5", "(3, 5)" or "L3H5": its first integer."""
    m = re.search(r"\d+", str(label))
    if m is None:
        raise ValueError(f"unit_labels: cannot read a layer from {label!r}; expected 'layer.head'")
    return int(m.group())


def _tick_step(n: int, max_ticks: int) -> int:
    return max(1, -(-n // max_ticks))



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
    """Paper Figure 3: the network's heads as organized by the 3-D questionnaire (docs/method.md §5, §8).

    Panels: (a) diffusion map psi_1..psi_3 of the head affinity (`coords`, (H, 3); fewer
    columns are padded with 0), coloured by layer, with the most outlying heads named;
    (b) the head affinity in the organized order, ``affinity[order][:, order]``;
    (c) the head tree as nested partitions: level on the y axis (root at the top), heads
    in `order` on the x axis, each folder a horizontal bar spanning its heads (neighbours
    in alternating shades) and linked to its parent; a folder is one bar when `order` is
    the tree's depth-first order. `tree_labels` is ``PartitionTree.labels`` (n_levels, H); `unit_labels`
    names the heads "layer.head" in head-index order.
    """
    coords = as_array(coords, "coords", (1, 2))
    if coords.ndim == 1:
        coords = coords[:, None]
    n = coords.shape[0]
    affinity = as_array(affinity, "affinity", 2)
    if affinity.shape != (n, n):
        raise ValueError(f"affinity: expected shape {(n, n)} (heads x heads), got {affinity.shape}")
    tree_labels = np.asarray(tree_labels)
    if tree_labels.ndim != 2 or tree_labels.shape[1] != n:
        raise ValueError(f"tree_labels: expected shape (n_levels, {n}), got {tree_labels.shape}")
    order = np.asarray(order)
    if order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        raise ValueError(f"order: expected a permutation of range({n}), got shape {order.shape}")
    unit_labels = name_list(unit_labels, n, "unit_labels")
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
        lo, hi = seq_clim(xyz[:, i])
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
    im = heatmap(ax, a_org, seq_clim(a_org), SEQUENTIAL, "(b) head affinity, organized order",
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
