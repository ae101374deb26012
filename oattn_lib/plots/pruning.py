"""Figure 7 (beyond the paper): the head-ablation curves of the prune stage."""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from .style import as_array, new_figure, styled

__all__ = ["fig7_ablation"]


@styled
def fig7_ablation(fractions, curves: dict, metric_name: str, title: str = "") -> Figure:
    """Head-ablation study (beyond the paper): a metric against the fraction of heads masked.

    `curves` maps a ranking's name to its metric at each of `fractions` (n_k,); a 2-D
    (n_seeds, n_k) entry (a random ranking) is drawn as its mean with a min-max band.
    """
    f = as_array(fractions, "fractions", 1)
    if not curves:
        raise ValueError("curves: expected at least one ranking")
    fig = new_figure(8.5, 5.2)
    ax = fig.subplots()
    for i, (name, y) in enumerate(curves.items()):
        y = as_array(y, f"curves[{name!r}]", (1, 2))
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
