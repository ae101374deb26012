"""Figures of the paper (Fasina et al., Figures 1-6), of the head-ablation study (Figure 7)
and of where Theorem 1 holds (the paraproduct residual against logit temperature).

Every figure function takes plain arrays in (query, key, head) order and returns a
matplotlib `Figure`; nothing here reads or writes files except `save`, which writes one
PNG atomically. Figures are built without pyplot, with one shared look (`styled`),
constrained layout, and titles and axis labels in the domain's words: queries and keys,
heads named "layer.head", Haar coefficients indexed by support. A wrong input shape
raises `ValueError` naming the argument and the shape it got; constant inputs render
with a valid (widened) colour scale and raise no warnings.

Modules: `style` (the look, input validation, colour limits, `save`), `intrinsic`
(Figures 1-2 and the temperature figure: one head and its paraproduct), `geometry` (Figure 3, the heads' tree and
diffusion map), `sparsity` (Figures 4-6, Haar coefficients and entropies), `pruning`
(Figure 7), `softmax_free` (Figure 8, the softmax-free experiment). The figures and `save`, `new_figure`, `styled`, `DPI` and the colour maps are
importable from `oattn_lib.plots`; the input checks and colour limits from `plots.style`.
"""
from .geometry import fig3_head_geometry
from .intrinsic import fig1_organized_head, fig2_paraproduct, fig_not_run, fig_temperature
from .pruning import fig7_ablation
from .softmax_free import fig8_softmax_free
from .sparsity import fig4_bihaar, fig5_entropy_heatmaps, fig6_top_trihaar
from .style import DIVERGING, DPI, SEQUENTIAL, new_figure, save, styled

__all__ = ["DIVERGING", "DPI", "SEQUENTIAL", "fig1_organized_head", "fig2_paraproduct",
           "fig3_head_geometry", "fig4_bihaar", "fig5_entropy_heatmaps", "fig6_top_trihaar",
           "fig7_ablation", "fig8_softmax_free", "fig_not_run", "fig_temperature", "new_figure", "save", "styled"]
