"""Figure 8 of the softmax-free experiment (`oattn_lib.softmax_free`, docs/method.md §10.5):
head entropy and sparsity per attention variant, and the paraproduct residuals of the softmax
heads."""
from __future__ import annotations

import numpy as np

from .style import new_figure, styled

__all__ = ["fig8_softmax_free"]


def fig8_softmax_free(dists: dict):
    """Figure 8: head entropy and sparsity distributions per attention variant, one row per
    model, and the paraproduct residuals of the softmax heads.

    dists: {(model, attention): {"entropy": (n,), "sparsity": (n,), "paraproduct": (n, 2) or None}}.
    """
    @styled
    def build():
        models = list(dict.fromkeys(m for m, _ in dists))
        has_pp = any(v["paraproduct"] is not None for v in dists.values())
        ncol = 3 if has_pp else 2
        fig = new_figure(4.2 * ncol, 3.4 * len(models))
        axes = np.atleast_2d(fig.subplots(len(models), ncol, squeeze=False))
        for i, model in enumerate(models):
            names = [a for (m, a) in dists if m == model]
            for j, (key, label) in enumerate((("entropy", "head l1 entropy (coarse Haar)"),
                                               ("sparsity", "head sparsity l1/l2 (lower = sparser)"))):
                ax = axes[i, j]
                data = [dists[(model, a)][key] for a in names]
                pos = [p for p, d in enumerate(data) if d.size]
                if pos:
                    ax.boxplot([data[p] for p in pos], positions=pos, widths=0.6, showfliers=True,
                               flierprops={"markersize": 2})
                ax.set_xticks(range(len(names)), names, rotation=35, ha="right")
                ax.set_xlim(-0.6, len(names) - 0.4)
                ax.set_ylabel(label)
                ax.set_title(f"{model}: {key}")
                ax.grid(True, axis="y")
                pooled = np.concatenate([d for d in data if d.size] or [np.ones(1)])
                if key == "entropy" and pooled.min() > 0 and pooled.max() / pooled.min() > 30:
                    ax.set_yscale("log")
            if has_pp:
                ax = axes[i, 2]
                pp = dists.get((model, "softmax"), {}).get("paraproduct")
                if pp is not None and pp.size:
                    ax.boxplot([pp[:, 0], pp[:, 1]], positions=[0, 1], widths=0.6)
                    if pp.min() > 0 and pp.max() / pp.min() > 30:
                        ax.set_yscale("log")
                ax.set_xticks([0, 1], ["organized", "unorganized"])
                ax.set_ylabel("relative residual")
                ax.set_title(f"{model}: paraproduct of softmax heads")
                ax.grid(True, axis="y")
        fig.suptitle("Softmax vs Tensor Attention: head entropy and sparsity (all heads, samples, seeds)")
        return fig

    return build()
