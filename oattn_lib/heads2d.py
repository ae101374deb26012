"""The 2-D organizations of a few heads of a sample: which heads, how each is organized, and
where they are kept (docs/method.md §5.3, §7, §12.1).

The explorer shows `explorer.heads_2d` heads per sample in their own 2-D organization, with the
paraproduct residual of their softmax: the figure heads, then the extremes of the mean Haar
entropy over samples, lowest and highest in turn (`heads_for_2d`). The figure heads' are the
decompose stage's (its store keeps their trees); the others are made by `organize_head`, in
the organize2d stage (its stores: `read_organizations_2d`) or, without stores, where the page
is built (`sample_organizations`, the same code).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from . import store
from .network import head_array, model_mask, on_device
from .trees import PartitionTree, from_padded

__all__ = ["HeadOrganization", "organize_head", "figure_units", "heads_for_2d", "units_2d", "sample_organizations",
           "read_organizations_2d"]


@dataclass(frozen=True, eq=False)
class HeadOrganization:
    """A head's own 2-D organization and its paraproduct residual (exact softmax minus the
    approximation, in the organized order), with the relative residual norms of the
    organized and the unorganized head (docs/method.md §7)."""

    tree_r: PartitionTree
    tree_c: PartitionTree
    residual: np.ndarray
    relative_residual: float
    relative_residual_unorganized: float


def organize_head(logits: np.ndarray, n_iters: int, allowed=None, device="cpu") -> HeadOrganization:
    """A head's 2-D organization from its pre-softmax scores (docs/method.md §5.3) and the paraproduct
    residual of the organized and the unorganized head against the model's own (masked)
    softmax (docs/method.md §7), as the decompose stage computes them for the figure heads. The
    questionnaire runs on the device `device` resolves to (`runtime.resolve_device`)."""
    # torch: not for the explorer's page, which reads the organize2d stage's stores
    from .paraproduct import paraproduct
    from .questionnaire import questionnaire2d

    g = np.asarray(logits, dtype=np.float64)
    tree_r, tree_c = questionnaire2d(on_device(g, device), n_iters=n_iters)
    pp = paraproduct(g, row_order=tree_r.order, col_order=tree_c.order, allowed=allowed)
    pu = paraproduct(g, allowed=allowed)
    return HeadOrganization(tree_r, tree_c, np.asarray(pp.residual, dtype=np.float64),
                            float(pp.relative_residual), float(pu.relative_residual))


def figure_units(figure_heads, n_layer: int, n_head: int) -> list[int]:
    """Units of the config's figure heads ((layer, head) pairs: positions among the stored layers
    and heads, negative counting from the end, as oattn_lib.units.resolve_unit reads them)."""
    out = []
    for layer, head in figure_heads:
        lay, hd = int(layer) % n_layer, int(head) % n_head
        if not (-n_layer <= int(layer) < n_layer and -n_head <= int(head) < n_head):
            raise ValueError(f"figure_heads: ({layer}, {head}) is outside the stored {n_layer} layers x "
                             f"{n_head} heads")
        out.append(lay * n_head + hd)
    return out


def heads_for_2d(figure_units: list[int], mean_entropy: np.ndarray, n: int) -> list[int]:
    """The units given a 2-D organization when only `n` are: the figure heads first, then the
    extremes of the mean Haar entropy over samples, lowest and highest in turn (the heads
    Table 1 is about)."""
    n_units = mean_entropy.size
    order = np.argsort(mean_entropy, kind="stable")
    extremes = [int(u) for pair in zip(order, order[::-1]) for u in pair]
    out = []
    for u in [*figure_units, *extremes]:
        if u not in out:
            out.append(int(u))
    return out[:min(n, n_units)]


def units_2d(entropy_store, figure_heads, heads_2d: int) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The units (positions in the stored layer x head grid) organized in 2-D, and the model's
    layer and head indices of the grid (the entropy store's coordinates)."""
    ent = store.read_store(entropy_store, require=("head_entropy",), variables=("head_entropy",))
    n_layer, n_head = ent.sizes["layer"], ent.sizes["head"]
    entropy = ent["head_entropy"].transpose("sample", "layer", "head").values.reshape(ent.sizes["sample"], -1)
    units = heads_for_2d(figure_units(figure_heads, n_layer, n_head), np.nanmean(entropy, axis=0), heads_2d)
    return units, ent["layer"].values, ent["head"].values


def sample_organizations(attention_store, decomposed_store, units: list[int], layers, heads, *, quantity: str,
                         crop=None, questionnaire2d_iters: int,
                         device="cpu") -> tuple[dict[int, HeadOrganization], int, str | None]:
    """{unit: its 2-D organization} of one sample, the number computed here (the others are the
    decompose stage's figure heads, read from `decomposed_store` where it holds their trees), and
    why none were made (a store without pre-softmax scores) or None."""
    att = store.read_store(attention_store, require=(quantity,), lazy=True)
    if "scores" not in att.variables:
        return {}, 0, f"{store.store_path(attention_store)} holds no pre-softmax scores"
    dec = store.read_store(decomposed_store, lazy=True)
    figs, fig = {}, {}
    if "fig_row_tree" in dec.variables and "paraproduct_not_run" not in dec.attrs:
        figs = {(int(la), int(h)): j for j, (la, h) in enumerate(zip(dec["fig_layer"].values,
                                                                       dec["fig_head_index"].values))}
        # read once: the figure heads' residuals are 4 MB each at 1024 tokens
        fig = {v: store.load_variable(dec, v, decomposed_store) for v in
               ("fig_row_tree", "fig_col_tree", "fig_residual", "fig_rel_residual", "fig_rel_residual_unorganized")}
    n_head, orgs, computed = len(heads), {}, 0
    for u in units:
        layer, head = int(layers[u // n_head]), int(heads[u % n_head])
        j = figs.get((layer, head))
        if j is not None:  # the decompose stage's organization of a figure head, the same computation
            orgs[u] = HeadOrganization(from_padded(fig["fig_row_tree"][j]), from_padded(fig["fig_col_tree"][j]),
                                       fig["fig_residual"][j].astype(np.float64), float(fig["fig_rel_residual"][j]),
                                       float(fig["fig_rel_residual_unorganized"][j]))
            continue
        g = head_array(att, "scores", layer, head, crop, where=str(attention_store)).astype(np.float32)
        o = organize_head(g, questionnaire2d_iters, model_mask(att, layer, head, g, crop), device=device)
        # the residual as the stores keep it (float32, like the decompose stage's), so that a
        # page built from the stores and one built in a notebook show the same numbers
        orgs[u] = dataclasses.replace(o, residual=o.residual.astype(np.float32).astype(np.float64))
        computed += 1
    return orgs, computed, None


def read_organizations_2d(path) -> tuple[dict[int, HeadOrganization], str | None]:
    """{unit: HeadOrganization} of an organize2d store in its order, and its `not_run` reason
    (None where it ran)."""
    ds = store.read_store(path, require=("row_tree", "col_tree", "residual", "rel_residual",
                                         "rel_residual_unorganized"))
    orgs = {int(u): HeadOrganization(from_padded(ds["row_tree"].values[j]), from_padded(ds["col_tree"].values[j]),
                                     ds["residual"].values[j].astype(np.float64), float(ds["rel_residual"].values[j]),
                                     float(ds["rel_residual_unorganized"].values[j]))
            for j, u in enumerate(ds["unit2d"].values)}
    return orgs, ds.attrs.get("not_run")
