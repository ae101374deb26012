"""What the explorer shows of one sample, read from the workflow's stores (the 2-D
organizations of the heads it shows in 2-D are `heads2d`'s).

Heads are indexed by unit u = layer * n_head + head (docs/method.md §1.1), whatever order a
store keeps them in: every array read here is mapped through the store's own `layer`,
`head` (attention) or `unit_layer`, `unit_head` (organized, decomposed) coordinates.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np
import xarray as xr

from .. import store
from ..models import KINDS
from ..stages.common import allowed_mask, head_array, load_organization, model_mask, read_network
from ..trees import PartitionTree

log = logging.getLogger("oattn")

__all__ = ["Sample", "read_sample", "token_labels", "unit_grid", "kv_groups", "layer_masks"]


@dataclass(frozen=True, eq=False)
class Sample:
    """One sample of a model, heads by unit: x (unit, query, key) the analysed quantity,
    logits {unit: (query, key)} the pre-softmax scores of the units asked for (`masks_of`), the network's 3-D organization, the
    diffusion coordinates of the heads (unit, component), the token labels, `allowed`:
    {unit: the model's own mask of the head (None: nothing masked)} for the units asked for, and
    `layer_allowed` (layer, query, key): every stored layer's mask (None: nothing masked; unit u
    has its layer's, u // n_head). `info` holds the model's indices of the stored layers and
    heads (`layers`, `heads`): unit u is layer layers[u // n_head], head heads[u % n_head]."""

    index: int
    x: np.ndarray
    logits: dict
    tree_q: PartitionTree
    tree_k: PartitionTree
    tree_h: PartitionTree
    diffusion: np.ndarray
    tokens: list[str]
    key_tokens: list[str]
    info: dict
    allowed: dict
    layer_allowed: np.ndarray | None = None


def unit_grid(layers, heads, n_head: int, stored_layers=None, stored_heads=None) -> np.ndarray:
    """Unit index (position in the stored layer x head grid) of every (layer, head) pair of a
    store's unit axis. `stored_layers` / `stored_heads`: the model's indices a store holds
    (extract.layers / extract.heads); None = 0, 1, ... (every one)."""
    lay, hd = np.asarray(layers, dtype=np.int64), np.asarray(heads, dtype=np.int64)
    if stored_layers is not None:
        lay = np.searchsorted(np.asarray(stored_layers), lay)
    if stored_heads is not None:
        hd = np.searchsorted(np.asarray(stored_heads), hd)
    return lay * n_head + hd


def _by_unit(values: np.ndarray, units: np.ndarray, n_units: int, what: str) -> np.ndarray:
    """`values` (unit, ...) reordered so that row u holds unit u: `values` itself where it is in
    that order already."""
    if np.unique(units).size != n_units or units.min() < 0 or units.max() >= n_units:
        raise ValueError(f"{what}: its (layer, head) coordinates do not cover the {n_units} heads once each")
    if np.array_equal(units, np.arange(n_units)):
        return values
    out = np.empty_like(values)
    out[units] = values
    return out


def token_labels(ds: xr.Dataset, n: int) -> list[str]:
    """Hover labels of a sample's tokens: their text where the store has it, image patch positions
    (row, column) for a ViT, token ids otherwise."""
    if "token_text" in ds.attrs:
        text = json.loads(ds.attrs["token_text"])
        if len(text) >= n:
            return [str(t) for t in text[:n]]
    tok = ds["token"].values[:n] if "token" in ds.coords else np.arange(n)
    kind = KINDS.get(ds.attrs.get("kind"))
    if kind is not None and kind.image_patches:
        side = int(round(np.sqrt(max(n - 1, 1))))
        return ["[CLS]" if t < 0 else (f"patch {t} (row {t // side}, col {t % side})" if side * side == n - 1
                                       else f"patch {t}") for t in tok]
    return [f"token {t}" for t in tok]


def kv_groups(ds: xr.Dataset, n_layer: int, n_head: int) -> np.ndarray | None:
    """(layer, head) KV-group index of a GQA model's heads, None where the store has none."""
    if "kv_group" not in ds.coords:
        return None
    g = ds["kv_group"]
    g = g.broadcast_like(xr.DataArray(np.zeros((n_layer, n_head)), dims=("layer", "head"),
                                      coords={"layer": ds["layer"], "head": ds["head"]}))
    return g.transpose("layer", "head").values.astype(np.int64)


def layer_masks(ds: xr.Dataset, crop=None) -> np.ndarray | None:
    """The model's own mask of every stored layer, (layer, query, key) bool in the store's layer
    order, True where the heads may attend (`stages.common.allowed_mask`); None where nothing is
    masked, or for a store with neither `allowed` nor probabilities."""
    if "allowed" not in ds.variables and "probs" not in ds.variables:
        return None
    ok = allowed_mask(ds, None, crop)
    return None if ok.all() else ok


def read_sample(index: int, attention_store, organized_store, decomposed_store, quantity: str,
                crop=None, masks_of=()) -> Sample:
    """The explorer's view of one sample (docs/method.md §9, §5.2, §8), heads by unit index; the model's mask of
    the units `masks_of` (stages.common.model_mask: causal heads are compared with their masked
    softmax, docs/method.md §7.5)."""
    # the analysed quantity of every head; the scores (pre-softmax logits) only of the heads
    # `masks_of`, a head at a time: at 270 heads x 1024 tokens each variable is 1.1 GB
    ds = store.read_store(attention_store, require=(quantity, "scores") if len(masks_of) else (quantity,), lazy=True)
    n_layer, n_head = ds.sizes["layer"], ds.sizes["head"]
    n_units = n_layer * n_head
    # read unit-first, the store's own order: one copy of the heads (1.1 GB at 270 x 1024²), not
    # the network tensor and its transposition beside it
    net = read_network(attention_store, quantity, crop, units_first=True)
    stored = (ds["layer"].values, ds["head"].values)  # the model's indices of the stored layers and heads
    units = unit_grid(net.unit_layer, net.unit_head, n_head, *stored)
    xv = _by_unit(net.array, units, n_units, f"{attention_store}: {quantity}")
    del net
    layer_head = {int(u): (int(stored[0][u // n_head]), int(stored[1][u % n_head])) for u in masks_of}
    lv = {u: (xv[u] if quantity == "scores" else
              head_array(ds, "scores", *lh, crop, where=str(attention_store)).astype(np.float32))
          for u, lh in layer_head.items()}
    org, ods = load_organization(organized_store)
    # the head tree labels heads in the organized store's unit order; relabel them by unit
    ounits = unit_grid(ods["unit_layer"].values, ods["unit_head"].values, n_head, *stored)
    tree_h = PartitionTree(_by_unit(org.tree_h.labels.T, ounits, n_units, f"{organized_store}: tree_h").T)
    dec = store.read_store(decomposed_store, require=("diffusion_coords",), variables=("diffusion_coords",))
    dunits = unit_grid(dec["unit_layer"].values, dec["unit_head"].values, n_head, *stored)
    diff = _by_unit(dec["diffusion_coords"].transpose("unit", "component").values.astype(np.float64), dunits,
                    n_units, f"{decomposed_store}: diffusion_coords")
    if org.tree_q.n != xv.shape[1] or org.tree_k.n != xv.shape[2]:
        raise ValueError(f"{organized_store}: trees of {org.tree_q.n} x {org.tree_k.n} tokens, the attention "
                         f"store {attention_store} has {xv.shape[1]} x {xv.shape[2]} (crop {crop})")
    start = int(crop[0]) if crop is not None else 0
    labels = token_labels(ds, ds.sizes["query"])
    tokens = labels[start:start + xv.shape[1]]
    info = {k: ds.attrs[k] for k in ("label", "source_index") if k in ds.attrs}
    info["kv_group"] = kv_groups(ds, n_layer, n_head)
    info["n_layer"], info["n_head"] = n_layer, n_head
    info["layers"], info["heads"] = [int(v) for v in stored[0]], [int(v) for v in stored[1]]
    for k in ("model_layers", "model_heads"):
        info[k] = int(ds.attrs[k]) if k in ds.attrs else None
    allowed = {u: model_mask(ds, *lh, lv[u], crop) for u, lh in layer_head.items()}
    masks = layer_masks(ds, crop)
    if masks is not None and masks.shape[1:] != xv.shape[1:]:
        raise ValueError(f"{attention_store}: allowed is {masks.shape[1:]} (crop {crop}), {quantity} "
                         f"{xv.shape[1:]}")
    # the tokens label the queries; the keys of a cross-attention head by their own tokens
    # (`key_token_text`), or by position where the store has none and they are not the queries
    key_text = json.loads(ds.attrs["key_token_text"]) if "key_token_text" in ds.attrs else []
    if len(key_text) >= start + xv.shape[2]:
        keys = [str(t) for t in key_text[start:start + xv.shape[2]]]
    elif ds.sizes["key"] == ds.sizes["query"] and not key_text:
        keys = labels[start:start + xv.shape[2]]
    else:
        keys = [f"key {j}" for j in range(start, start + xv.shape[2])]
    return Sample(index, xv, lv, org.tree_q, org.tree_k, tree_h, diff, tokens, keys, info, allowed, masks)


