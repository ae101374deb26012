"""The figure of two analyses side by side (docs/method.md §15): the heads' scale-free entropies,
the networks' sparsity gain over random trees per sample, the heads' diffusion maps and, for one
model on two sets of prompts, each head's mean rank on both sides."""
from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from .style import SEQUENTIAL, new_figure, styled

__all__ = ["fig_comparison"]

A_COLOUR, B_COLOUR, CHANGED = "#1f77b4", "#ff7f0e", "#d62728"


@styled
def fig_comparison(names, head_entropy, gain, diffusion, diffusion_layers, ranks=None) -> Figure:
    """Two analyses side by side.

    Parameters
    ----------
    names : (str, str)
    head_entropy : (ndarray, ndarray)
        Each side's heads' mean scale-free Haar entropy (n_heads,), drawn as distributions.
    gain : (ndarray, ndarray)
        Each side's per-sample sparsity gain over random trees (n_samples,).
    diffusion : (ndarray, ndarray)
        Each side's heads' first two diffusion coordinates in its first sample (n_heads, 2).
    diffusion_layers : (ndarray, ndarray)
        Each head's layer, the diffusion maps' colours.
    ranks : tuple, optional
        (rank_a, rank_b, ci_low, ci_high, changed) per head, for one model on two sets of
        prompts: mean ranks, the change's interval and whether it changed.
    """
    n_panels = 4 + (ranks is not None)
    fig = new_figure(4.4 * n_panels, 4.4)
    axes = fig.subplots(1, n_panels)
    for values, name, colour in zip(head_entropy, names, (A_COLOUR, B_COLOUR)):
        v = np.sort(np.asarray(values, dtype=float))
        axes[0].step(v, np.arange(1, v.size + 1) / v.size, where="post", color=colour, label=name)
    axes[0].set_xlabel("head entropy / Frobenius norm (mean over samples)")
    axes[0].set_ylabel("fraction of heads")
    axes[0].set_title("heads' scale-free entropy")
    axes[0].legend(loc="lower right")
    rng = np.random.default_rng(0)  # jitter only: where the points sit sideways means nothing
    for i, (values, colour) in enumerate(zip(gain, (A_COLOUR, B_COLOUR))):
        v = np.asarray(values, dtype=float)
        axes[1].scatter(i + rng.uniform(-0.12, 0.12, v.size), v, s=14, color=colour, alpha=0.7)
        axes[1].hlines(v.mean(), i - 0.25, i + 0.25, color="black")
    axes[1].axhline(0, color="grey", lw=0.8, ls=":")
    axes[1].set_xticks([0, 1])
    axes[1].set_xticklabels(list(names))
    axes[1].set_ylabel("log(l1/l2 random trees / organized)")
    axes[1].set_title("network sparsity gain per sample")
    for ax, coords, layers, name in zip(axes[2:4], diffusion, diffusion_layers, names):
        c = np.asarray(coords, dtype=float)
        sc = ax.scatter(c[:, 0], c[:, 1], c=np.asarray(layers), cmap=SEQUENTIAL, s=16)
        ax.set_title(f"{name}: diffusion map of heads")
        ax.set_xlabel("coordinate 1")
        ax.set_ylabel("coordinate 2")
        fig.colorbar(sc, ax=ax, shrink=0.8, label="layer")
    if ranks is not None:
        ra, rb, lo, hi, changed = (np.asarray(x) for x in ranks)
        ax = axes[4]
        err = np.vstack([rb - (ra + lo), (ra + hi) - rb]).clip(min=0)
        colours = np.where(changed.astype(bool), CHANGED, "grey")
        ax.errorbar(ra, rb, yerr=err, fmt="none", ecolor="lightgrey", lw=0.8)
        ax.scatter(ra, rb, c=colours, s=14)
        top = max(ra.max(), rb.max()) + 1
        ax.plot([0, top], [0, top], color="black", lw=0.8)
        ax.set_xlabel(f"mean rank in {names[0]}")
        ax.set_ylabel(f"mean rank in {names[1]}")
        ax.set_title(f"heads' entropy rank ({int(changed.sum())} changed, red)")
    return fig
